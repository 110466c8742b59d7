// Validation of idem_key text and of scopes. Pure C++: the SPEC's rules only.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace idempotency {

constexpr std::size_t kMaxKeyBytes = 255;
constexpr std::size_t kMaxScopeBytes = 255;

// What is wrong with a key, if anything.
struct KeyProblem {
  enum class Kind { kNone, kEmpty, kTooLong, kBadByte };
  Kind kind = Kind::kNone;
  std::size_t length = 0;    // bytes in the input
  std::size_t position = 0;  // 1-based position of the first bad byte (kBadByte)
  unsigned char byte = 0;    // that byte
  explicit operator bool() const { return kind != Kind::kNone; }
};

// A key is 1 to 255 bytes, each a visible ASCII character (0x21 to 0x7E).
// Allocates nothing, so the valid path costs one pass over the bytes.
KeyProblem check_key(std::string_view key) noexcept;

// The problem in PostgreSQL's message style, e.g.
// "idem_key has byte 0x20 at position 4, only visible ASCII characters (0x21 to 0x7E) are allowed".
std::string describe(const KeyProblem& problem);

}  // namespace idempotency
