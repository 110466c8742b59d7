// The canonical JSON text that idem_fingerprint(jsonb) hashes (SPEC, "Reading,
// deriving, fingerprints"): values equal under jsonb = get the same text, and a
// client in any language can produce it.
#pragma once

#include <string>
#include <string_view>

namespace idempotency {

// Parses JSON text (RFC 8259, UTF-8) and writes it canonically: no whitespace;
// object members sorted by the bytes of their keys, the last of duplicate keys
// winning (as jsonb keeps it); strings with only `"`, `\` and characters below
// U+0020 escaped; numbers in plain decimal without exponent, `+`, leading or
// trailing zeros, and every zero written `0`.
//
// Throws std::invalid_argument for text that is not JSON, for invalid UTF-8, and for
// numbers whose plain form would exceed 200,000 characters. Parsing and writing use
// explicit stacks, so nesting depth is bounded by memory, not by the C stack.
std::string canonical_json(std::string_view json_text);

}  // namespace idempotency
