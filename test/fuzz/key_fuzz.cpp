// libFuzzer target: check_key agrees with the SPEC's rule, byte by byte.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/key.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view key(reinterpret_cast<const char*>(data), size);
  bool valid = size >= 1 && size <= idempotency::kMaxKeyBytes;
  for (std::size_t i = 0; valid && i < size; i++) valid = data[i] >= 0x21 && data[i] <= 0x7E;
  idempotency::KeyProblem problem = idempotency::check_key(key);
  if (static_cast<bool>(problem) == valid) std::abort();
  if (problem.kind == idempotency::KeyProblem::Kind::kBadByte &&
      (problem.position == 0 || problem.position > size ||
       data[problem.position - 1] != problem.byte))
    std::abort();
  (void)idempotency::describe(problem);
  return 0;
}
