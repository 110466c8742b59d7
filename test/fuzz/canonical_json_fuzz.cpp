// libFuzzer target: canonical_json either refuses its input with
// std::invalid_argument or returns valid JSON that is its own canonical form.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "core/canonical_json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::string canonical;
  try {
    canonical = idempotency::canonical_json(text);
  } catch (const std::invalid_argument&) {
    return 0;
  }
  try {
    if (idempotency::canonical_json(canonical) != canonical) std::abort();
  } catch (const std::invalid_argument&) {
    std::abort();  // the output must parse
  }
  return 0;
}
