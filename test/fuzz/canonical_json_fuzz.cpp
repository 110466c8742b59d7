// libFuzzer target: canonical_json either refuses its input with
// idempotency::Error or returns text that is valid and its own canonical form.
// Any other exception, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "core/canonical_json.hpp"
#include "core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string canonical;
  try {
    canonical = idempotency::canonical_json(text);
  } catch (const idempotency::Error&) {
    return 0;
  }
  // Only expanded exponents make the text longer.
  if (canonical.size() > size + idempotency::kMaxCanonicalGrowthBytes) std::abort();
  std::string again;
  try {
    again = idempotency::canonical_json(canonical);
  } catch (const idempotency::Error&) {
    std::abort();  // the output must parse
  }
  if (again != canonical) std::abort();
  // No whitespace outside strings, and none is needed inside them either.
  for (char c : canonical)
    if (c == '\t' || c == '\n' || c == '\r') std::abort();
  return 0;
}
