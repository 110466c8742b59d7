#include <gtest/gtest.h>

#include <string>

#include "core/key.hpp"

using idempotency::check_key;
using idempotency::describe;
using Kind = idempotency::KeyProblem::Kind;

TEST(Key, AcceptsVisibleAscii) {
  EXPECT_FALSE(check_key("order-1001"));
  EXPECT_FALSE(check_key("!"));
  EXPECT_FALSE(check_key("~"));
  std::string all;
  for (int c = 0x21; c <= 0x7E; c++) all.push_back(static_cast<char>(c));
  EXPECT_FALSE(check_key(all));
  EXPECT_FALSE(check_key(std::string(255, 'k')));
}

TEST(Key, RefusesEmpty) {
  auto problem = check_key("");
  EXPECT_EQ(problem.kind, Kind::kEmpty);
  EXPECT_EQ(describe(problem), "idem_key must not be empty");
}

TEST(Key, RefusesTooLong) {
  auto problem = check_key(std::string(256, 'k'));
  EXPECT_EQ(problem.kind, Kind::kTooLong);
  EXPECT_EQ(problem.length, 256u);
  EXPECT_EQ(describe(problem), "idem_key is 256 bytes long, at most 255 are allowed");
}

TEST(Key, NamesTheFirstBadByteAndItsPosition) {
  struct Case {
    std::string key;
    std::size_t position;
    unsigned char byte;
  } cases[] = {
      {"abc def", 4, 0x20},    {"\x7f", 1, 0x7F},
      {"ok\xc3\xa9", 3, 0xC3}, {std::string("a\0b", 3), 2, 0x00},
      {"tab\there", 4, 0x09},
  };
  for (const Case& c : cases) {
    auto problem = check_key(c.key);
    EXPECT_EQ(problem.kind, Kind::kBadByte) << c.key;
    EXPECT_EQ(problem.position, c.position) << c.key;
    EXPECT_EQ(problem.byte, c.byte) << c.key;
  }
  EXPECT_EQ(describe(check_key("abc def")),
            "idem_key has byte 0x20 at position 4, only visible ASCII characters (0x21 to 0x7E) "
            "are allowed");
}

TEST(Key, LengthIsCheckedBeforeBytes) {
  EXPECT_EQ(check_key(std::string(300, ' ')).kind, Kind::kTooLong);
}
