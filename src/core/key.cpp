#include "core/key.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace idempotency {

KeyProblem check_key(std::string_view key) noexcept {
  KeyProblem problem;
  problem.length = key.size();
  if (key.empty()) {
    problem.kind = KeyProblem::Kind::kEmpty;
  } else if (key.size() > kMaxKeyBytes) {
    problem.kind = KeyProblem::Kind::kTooLong;
  } else {
    for (std::size_t i = 0; i < key.size(); i++) {
      auto byte = static_cast<unsigned char>(key[i]);
      if (byte < 0x21 || byte > 0x7E) {
        problem.kind = KeyProblem::Kind::kBadByte;
        problem.position = i + 1;
        problem.byte = byte;
        break;
      }
    }
  }
  return problem;
}

static int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

static bool is_hyphen_position(std::size_t i) noexcept {
  return i == 8 || i == 13 || i == 18 || i == 23;
}

std::size_t store_key(std::string_view key, char* out) noexcept {
  if (key.size() == kUuidTextBytes) {
    unsigned char uuid[kUuidBytes];
    std::size_t digits = 0;
    for (std::size_t i = 0; i < key.size(); i++) {
      if (is_hyphen_position(i)) {
        if (key[i] != '-') break;
        continue;
      }
      int value = hex_value(key[i]);
      if (value < 0) break;
      if (digits % 2 == 0)
        uuid[digits / 2] = static_cast<unsigned char>(value << 4);
      else
        uuid[digits / 2] |= static_cast<unsigned char>(value);
      digits++;
    }
    if (digits == 2 * kUuidBytes) {
      store_uuid(uuid, out);
      return kStoredUuidBytes;
    }
  }
  std::memcpy(out, key.data(), key.size());
  return key.size();
}

void store_uuid(const unsigned char* uuid, char* out) noexcept {
  out[0] = '\0';
  std::memcpy(out + 1, uuid, kUuidBytes);
}

static bool is_stored_uuid(std::string_view stored) noexcept {
  return stored.size() == kStoredUuidBytes && stored[0] == '\0';
}

bool is_stored_random_uuid(std::string_view stored) noexcept {
  if (!is_stored_uuid(stored)) return false;
  auto uuid = reinterpret_cast<const unsigned char*>(stored.data() + 1);
  return (uuid[6] >> 4) == 4 && (uuid[8] >> 6) == 2;
}

std::size_t load_key(std::string_view stored, char* out) noexcept {
  if (!is_stored_uuid(stored)) {
    std::memcpy(out, stored.data(), stored.size());
    return stored.size();
  }
  static const char digits[] = "0123456789abcdef";
  std::size_t n = 0;
  for (std::size_t i = 0; i < kUuidBytes; i++) {
    if (is_hyphen_position(n)) out[n++] = '-';
    auto byte = static_cast<unsigned char>(stored[1 + i]);
    out[n++] = digits[byte >> 4];
    out[n++] = digits[byte & 0xF];
  }
  return n;
}

static int compare_bytes(std::string_view a, std::string_view b) noexcept {
  int c = std::memcmp(a.data(), b.data(), std::min(a.size(), b.size()));
  if (c != 0) return c;
  return (a.size() > b.size()) - (a.size() < b.size());
}

// A stored UUID against a key stored as its text, as their texts compare (memcmp's
// order, then the shorter first): the UUID's characters are made only up to the first
// that differs, most often the first (an index descent meets many such pairs in a
// store of both kinds of keys).
static int compare_uuid_with_text(std::string_view uuid, std::string_view text) noexcept {
  static const char digits[] = "0123456789abcdef";
  std::size_t n = 0;
  for (std::size_t i = 0; i < kUuidBytes; i++) {
    auto byte = static_cast<unsigned char>(uuid[1 + i]);
    char next[3] = {'-', digits[byte >> 4], digits[byte & 0xF]};
    for (int k = is_hyphen_position(n) ? 0 : 1; k < 3; k++, n++) {
      if (n == text.size()) return 1;
      int c = static_cast<unsigned char>(next[k]) - static_cast<unsigned char>(text[n]);
      if (c != 0) return c;
    }
  }
  return text.size() > n ? -1 : 0;
}

// Two stored UUIDs order as their texts do (hex digits sort as their values, and the
// hyphens stand at the same places), so only a mixed pair needs a UUID's text.
int compare_stored_keys(std::string_view a, std::string_view b) noexcept {
  if (is_stored_uuid(a) == is_stored_uuid(b)) return compare_bytes(a, b);
  if (is_stored_uuid(a)) return compare_uuid_with_text(a, b);
  return -compare_uuid_with_text(b, a);
}

std::string describe(const KeyProblem& problem) {
  char text[160];
  switch (problem.kind) {
    case KeyProblem::Kind::kNone: return "idem_key is valid";
    case KeyProblem::Kind::kEmpty: return "idem_key must not be empty";
    case KeyProblem::Kind::kTooLong:
      std::snprintf(text, sizeof(text), "idem_key is %zu bytes long, at most %zu are allowed",
                    problem.length, kMaxKeyBytes);
      return text;
    case KeyProblem::Kind::kBadByte:
      std::snprintf(text, sizeof(text),
                    "idem_key has byte 0x%02X at position %zu, only visible ASCII characters "
                    "(0x21 to 0x7E) are allowed",
                    problem.byte, problem.position);
      return text;
  }
  return "idem_key is invalid";
}

}  // namespace idempotency
