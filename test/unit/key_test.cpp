#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>
#include <string_view>

#include "core/key.hpp"

namespace idempotency {
namespace {

using Kind = KeyProblem::Kind;

TEST(CheckKey, AcceptsEveryVisibleAsciiCharacter) {
  std::string all;
  for (int c = 0x21; c <= 0x7E; c++) all.push_back(static_cast<char>(c));
  EXPECT_FALSE(check_key(all));
  EXPECT_FALSE(check_key("order-1001"));
  EXPECT_FALSE(check_key("!"));
  EXPECT_FALSE(check_key("~"));
  KeyProblem none = check_key("k");
  EXPECT_EQ(none.kind, Kind::kNone);
  EXPECT_EQ(none.length, 1u);
  EXPECT_EQ(none.position, 0u);
}

TEST(CheckKey, RefusesEmpty) {
  KeyProblem problem = check_key("");
  EXPECT_TRUE(problem);
  EXPECT_EQ(problem.kind, Kind::kEmpty);
  EXPECT_EQ(problem.length, 0u);
  EXPECT_EQ(describe(problem), "idem_key must not be empty");
}

TEST(CheckKey, AllowsExactly255Bytes) {
  std::string key(kMaxKeyBytes, 'k');
  ASSERT_EQ(key.size(), 255u);
  EXPECT_FALSE(check_key(key));
  key.back() = ' ';  // the last byte is still checked
  KeyProblem problem = check_key(key);
  EXPECT_EQ(problem.kind, Kind::kBadByte);
  EXPECT_EQ(problem.position, 255u);
}

TEST(CheckKey, Refuses256BytesAndMore) {
  KeyProblem problem = check_key(std::string(256, 'k'));
  EXPECT_EQ(problem.kind, Kind::kTooLong);
  EXPECT_EQ(problem.length, 256u);
  EXPECT_EQ(describe(problem), "idem_key is 256 bytes long, at most 255 are allowed");
  EXPECT_EQ(describe(check_key(std::string(300, 'k'))),
            "idem_key is 300 bytes long, at most 255 are allowed");
}

TEST(CheckKey, ReportsLengthBeforeBadBytes) {
  KeyProblem problem = check_key(std::string(300, ' '));
  EXPECT_EQ(problem.kind, Kind::kTooLong);
  EXPECT_EQ(problem.position, 0u);
}

struct BadByteCase {
  std::string key;
  std::size_t position;
  unsigned char byte;
  const char* message;
};

TEST(CheckKey, NamesTheFirstBadByteAndItsPosition) {
  const BadByteCase cases[] = {
      {"abc def", 4, 0x20,
       "idem_key has byte 0x20 at position 4, only visible ASCII characters (0x21 to 0x7E) are "
       "allowed"},
      {" lead", 1, 0x20,
       "idem_key has byte 0x20 at position 1, only visible ASCII characters (0x21 to 0x7E) are "
       "allowed"},
      {"\x7f", 1, 0x7F,
       "idem_key has byte 0x7F at position 1, only visible ASCII characters (0x21 to 0x7E) are "
       "allowed"},
      {"ok\x80", 3, 0x80,
       "idem_key has byte 0x80 at position 3, only visible ASCII characters (0x21 to 0x7E) are "
       "allowed"},
      {"caf\xc3\xa9", 4, 0xC3,
       "idem_key has byte 0xC3 at position 4, only visible ASCII characters (0x21 to 0x7E) are "
       "allowed"},
      {"x\xff", 2, 0xFF,
       "idem_key has byte 0xFF at position 2, only visible ASCII characters (0x21 to 0x7E) are "
       "allowed"},
      {std::string("a\0b", 3), 2, 0x00,
       "idem_key has byte 0x00 at position 2, only visible ASCII characters (0x21 to 0x7E) are "
       "allowed"},
      {"tab\there", 4, 0x09,
       "idem_key has byte 0x09 at position 4, only visible ASCII characters (0x21 to 0x7E) are "
       "allowed"},
      {"two  spaces\x7f", 4, 0x20,  // only the first is reported
       "idem_key has byte 0x20 at position 4, only visible ASCII characters (0x21 to 0x7E) are "
       "allowed"},
  };
  for (const BadByteCase& c : cases) {
    KeyProblem problem = check_key(c.key);
    EXPECT_TRUE(problem) << c.message;
    EXPECT_EQ(problem.kind, Kind::kBadByte) << c.message;
    EXPECT_EQ(problem.length, c.key.size()) << c.message;
    EXPECT_EQ(problem.position, c.position) << c.message;
    EXPECT_EQ(problem.byte, c.byte) << c.message;
    EXPECT_EQ(describe(problem), c.message);
  }
}

TEST(CheckKey, NulIsABadByteNotTheEndOfTheKey) {
  // A string_view carries its length; a NUL inside must not end the check early.
  std::string_view key("abc\0", 4);
  KeyProblem problem = check_key(key);
  EXPECT_EQ(problem.kind, Kind::kBadByte);
  EXPECT_EQ(problem.length, 4u);
  EXPECT_EQ(problem.position, 4u);
  EXPECT_EQ(problem.byte, 0x00);
}

TEST(CheckKey, EveryByteOutsideTheRangeIsRefused) {
  for (int b = 0; b < 256; b++) {
    std::string key = "k";
    key.push_back(static_cast<char>(b));
    bool visible = b >= 0x21 && b <= 0x7E;
    KeyProblem problem = check_key(key);
    EXPECT_EQ(static_cast<bool>(problem), !visible) << b;
    if (!visible) {
      EXPECT_EQ(problem.position, 2u) << b;
      EXPECT_EQ(problem.byte, b) << b;
    }
  }
}

std::string stored(std::string_view key) {
  char out[kMaxKeyBytes];
  return std::string(out, store_key(key, out));
}

std::string loaded(std::string_view stored_key) {
  char out[kMaxKeyBytes];
  return std::string(out, load_key(stored_key, out));
}

TEST(StoreKey, ACanonicalUuidTakes17Bytes) {
  std::string key = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
  std::string s = stored(key);
  ASSERT_EQ(s.size(), kStoredUuidBytes);
  EXPECT_EQ(s[0], '\0');
  EXPECT_EQ(static_cast<unsigned char>(s[1]), 0x0a);
  EXPECT_EQ(static_cast<unsigned char>(s[16]), 0x89);
  EXPECT_EQ(loaded(s), key);
}

TEST(StoreKey, OtherKeysAreStoredAsTheyAre) {
  for (std::string key :
       std::vector<std::string>{"order-1001", "k",
                                "0A1B2C3D-4E5F-6789-ABCD-EF0123456789",   // uppercase
                                "0a1b2c3d4e5f6789abcdef0123456789",       // no hyphens
                                "0a1b2c3d-4e5f-6789-abcd-ef012345678g",   // not hex
                                "0a1b2c3d-4e5f-6789-abcd-ef01234567890",  // 37 characters
                                "0a1b2c3d-4e5f-6789-abcdef-0123456789",   // hyphen moved
                                std::string(kMaxKeyBytes, '~')}) {
    EXPECT_EQ(stored(key), key) << key;
    EXPECT_EQ(loaded(stored(key)), key) << key;
  }
}

TEST(StoreKey, StoreUuidMatchesStoreKey) {
  const unsigned char uuid[kUuidBytes] = {0xff, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 0xfe};
  char out[kStoredUuidBytes];
  store_uuid(uuid, out);
  std::string s(out, kStoredUuidBytes);
  EXPECT_EQ(loaded(s), "ff000102-0304-0506-0708-090a0b0c0dfe");
  EXPECT_EQ(stored(loaded(s)), s);
}

// The ids idem_emit makes (version 4, variant 10) are told from every other key: other
// versions and variants, a UUID's text in capitals, idem_derive's 32 hex digits.
TEST(StoreKey, RandomUuidsAreToldApart) {
  for (std::string id :
       {"0a1b2c3d-4e5f-4789-abcd-ef0123456789", "0a1b2c3d-4e5f-4789-8bcd-ef0123456789"})
    EXPECT_TRUE(is_stored_random_uuid(stored(id))) << id;
  for (std::string id :
       {"0a1b2c3d-4e5f-5789-abcd-ef0123456789", "0a1b2c3d-4e5f-4789-cbcd-ef0123456789",
        "0a1b2c3d-4e5f-4789-7bcd-ef0123456789", "0A1B2C3D-4E5F-4789-ABCD-EF0123456789",
        "0a1b2c3d4e5f4789abcdef0123456789", "order-1"})
    EXPECT_FALSE(is_stored_random_uuid(stored(id))) << id;
}

// Stored keys order exactly as their characters do, whichever forms meet.
TEST(CompareStoredKeys, FollowsTheCharacters) {
  std::vector<std::string> keys = {"0",
                                   "00000000-0000-0000-0000-000000000000",
                                   "00000000-0000-0000-0000-000000000001",
                                   "00000000-0000-0000-0000-00000000000",
                                   "00000000-0000-0000-0000-0000000000010",
                                   "0a1b2c3d-4e5f-6789-abcd-ef0123456789",
                                   "0a1b2c3d-4e5f-6789-abcd-ef012345678",
                                   "0a1b2c3d-4e5f-6789-abcd-ef0123456789x",
                                   "0a1b2c3d-4e5f-6789-ABCD-ef0123456789",
                                   "9fffffff-ffff-ffff-ffff-ffffffffffff",
                                   "a",
                                   "a0000000-0000-0000-0000-000000000000",
                                   "ffffffff-ffff-ffff-ffff-ffffffffffff",
                                   "g",
                                   "~",
                                   "-",
                                   "order-1"};
  std::mt19937 random(7);
  for (int i = 0; i < 200; i++) {
    std::string uuid = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    for (char& c : uuid)
      if (c == 'x') c = "0123456789abcdef"[random() % 16];
    keys.push_back(uuid);
    keys.push_back(uuid.substr(0, 35));
  }
  for (const std::string& a : keys)
    for (const std::string& b : keys) {
      int by_text = a.compare(b);
      int by_stored = compare_stored_keys(stored(a), stored(b));
      EXPECT_EQ((by_text > 0) - (by_text < 0), (by_stored > 0) - (by_stored < 0)) << a << " " << b;
    }
}

}  // namespace
}  // namespace idempotency
