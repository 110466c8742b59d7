// Validation of idem_key text and of scopes. Pure C++: the rules of docs/reference.md only.
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

// How a key is stored (an idem_key datum's bytes). A canonical UUID (36 characters:
// lowercase hex digits, hyphens at positions 9, 14, 19 and 24) is a zero byte and
// its 16 bytes; any other key is its characters. A key's characters never start with
// a zero byte and each key has one stored form, so equal keys store equal bytes.
constexpr std::size_t kUuidBytes = 16;
constexpr std::size_t kUuidTextBytes = 36;
constexpr std::size_t kStoredUuidBytes = 1 + kUuidBytes;

// Writes the stored form of a valid key to `out` (room for kMaxKeyBytes); returns its
// length.
std::size_t store_key(std::string_view key, char* out) noexcept;
// The stored form of a UUID's 16 bytes.
void store_uuid(const unsigned char* uuid, char* out) noexcept;
// Whether a stored key has the form of the ids idem_emit makes (a version-4, variant-10
// UUID): random, so no other event anywhere shares one by chance. An application's own
// ids (idem_derive's among them) may repeat.
bool is_stored_random_uuid(std::string_view stored) noexcept;
// Writes a key's characters from its stored form to `out` (room for kMaxKeyBytes);
// returns their length.
std::size_t load_key(std::string_view stored, char* out) noexcept;
// Orders stored keys as their characters order, bytewise.
int compare_stored_keys(std::string_view a, std::string_view b) noexcept;

// The problem in PostgreSQL's message style, e.g.
// "idem_key has byte 0x20 at position 4, only visible ASCII characters (0x21 to 0x7E) are allowed".
std::string describe(const KeyProblem& problem);

}  // namespace idempotency
