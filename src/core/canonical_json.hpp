// The canonical JSON text that idem_fingerprint(jsonb) hashes, specified in
// docs/fingerprint.md: values equal under jsonb = get the same text, and a client in
// any language can produce it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace idempotency {

// A number's plain decimal form may have at most this many characters, so that an
// exponent such as 1e999999999 cannot make the output huge.
constexpr std::size_t kMaxCanonicalNumberChars = 200000;
// Expanding exponents may grow the whole text by at most this many bytes. Text that
// comes from jsonb never grows (its numbers are already plain); the limit keeps a
// document of many large exponents from exhausting memory.
constexpr std::size_t kMaxCanonicalGrowthBytes = 10000000;

// Parses JSON text (RFC 8259, UTF-8) and returns its canonical form: no whitespace;
// object members sorted by the bytes of their decoded keys (unsigned, a prefix
// first), the last of duplicate keys winning (as jsonb keeps it); strings with `"`
// `\` and characters below U+0020 escaped, everything else raw UTF-8; numbers in
// plain decimal without exponent, `+`, leading or trailing zeros, every zero `0`.
//
// Throws Error (22023) for text that is not JSON, for invalid UTF-8 (a lone
// surrogate escape included), and past the two limits above.
//
// Nesting depth is bounded by memory only: the parser keeps its own stack and never
// recurses, so 100,000 levels of `[` work. One pass writes the output as it parses;
// object members are reordered at their `}` by relinking pieces of that output, so
// no byte is copied more than twice however deep the reordered objects nest.
std::string canonical_json(std::string_view json_text);

}  // namespace idempotency
