// libFuzzer target: check_key never crashes and agrees with a plain reading of the
// reference's rule (1 to 255 bytes, each 0x21..0x7E), kind, length, position and byte;
// a valid key's stored form gives the key back and orders as the key does.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/key.hpp"

namespace {

using idempotency::KeyProblem;

// The rule as docs/reference.md states it, written without looking at check_key.
KeyProblem reference(const std::uint8_t* data, std::size_t size) {
  KeyProblem expected;
  expected.length = size;
  if (size == 0) {
    expected.kind = KeyProblem::Kind::kEmpty;
  } else if (size > 255) {
    expected.kind = KeyProblem::Kind::kTooLong;
  } else {
    for (std::size_t i = 0; i < size; i++) {
      if (data[i] < 0x21 || data[i] > 0x7E) {
        expected.kind = KeyProblem::Kind::kBadByte;
        expected.position = i + 1;
        expected.byte = data[i];
        break;
      }
    }
  }
  return expected;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view key(reinterpret_cast<const char*>(data), size);
  KeyProblem problem = idempotency::check_key(key);
  KeyProblem expected = reference(data, size);
  if (problem.kind != expected.kind || problem.length != expected.length ||
      problem.position != expected.position || problem.byte != expected.byte ||
      static_cast<bool>(problem) != (expected.kind != KeyProblem::Kind::kNone))
    std::abort();
  if (problem) {
    std::string message = idempotency::describe(problem);
    if (message.rfind("idem_key ", 0) != 0 || message.back() == '.') std::abort();
    return 0;
  }
  char stored[idempotency::kMaxKeyBytes], loaded[idempotency::kMaxKeyBytes];
  std::size_t stored_size = idempotency::store_key(key, stored);
  std::string_view stored_key(stored, stored_size);
  if (std::string_view(loaded, idempotency::load_key(stored_key, loaded)) != key) std::abort();
  // Against a fixed UUID-shaped key and its neighbour: the same order as the text.
  static const std::string uuid = "7f000000-0000-4000-8000-000000000000";
  char other[idempotency::kMaxKeyBytes];
  std::string_view other_key(other, idempotency::store_key(uuid, other));
  int by_text = key.compare(uuid);
  int by_stored = idempotency::compare_stored_keys(stored_key, other_key);
  if ((by_text > 0) - (by_text < 0) != (by_stored > 0) - (by_stored < 0)) std::abort();
  return 0;
}
