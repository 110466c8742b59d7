// SHA-256 (OpenSSL) and idem_derive.
#pragma once

#include <array>
#include <initializer_list>
#include <string>
#include <string_view>

namespace idempotency {

using Digest = std::array<unsigned char, 32>;

// Both functions throw std::runtime_error if OpenSSL fails.
Digest sha256(std::string_view bytes);

// HMAC-SHA256 (RFC 2104) of the concatenated parts under a key of at most 64 bytes.
Digest hmac_sha256(std::string_view key, std::initializer_list<std::string_view> parts);

// The key of a downstream step: lowercase hex of the first 16 bytes of
// SHA-256(root || 0x00 || step), 32 characters, the same in every service.
std::string derive_key(std::string_view root, std::string_view step);

}  // namespace idempotency
