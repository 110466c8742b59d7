// SHA-256 (OpenSSL) and idem_derive.
#pragma once

#include <array>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

struct evp_md_ctx_st;

namespace idempotency {

using Digest = std::array<unsigned char, 32>;

// Both functions throw std::runtime_error if OpenSSL fails.
Digest sha256(std::string_view bytes);

// HMAC-SHA256 (RFC 2104) of the concatenated parts under a key of at most 64 bytes.
Digest hmac_sha256(std::string_view key, std::initializer_list<std::string_view> parts);

// The same under one key used for many messages: the key's two blocks are hashed
// once, and each message costs two copies of those states (about a fifth of
// hmac_sha256's time). Not for concurrent use.
class HmacSha256 {
 public:
  explicit HmacSha256(std::string_view key);
  ~HmacSha256();
  HmacSha256(const HmacSha256&) = delete;
  HmacSha256& operator=(const HmacSha256&) = delete;
  Digest operator()(std::initializer_list<std::string_view> parts) const;

 private:
  struct Deleter {
    void operator()(evp_md_ctx_st* context) const;
  };
  std::unique_ptr<evp_md_ctx_st, Deleter> inner_, outer_, work_;
};

// Lowercase hexadecimal, two characters a byte.
std::string hex(const Digest& digest);

// The key of a downstream step: lowercase hex of the first 16 bytes of
// SHA-256(root || 0x00 || step), 32 characters, the same in every service.
std::string derive_key(std::string_view root, std::string_view step);

}  // namespace idempotency
