#include <gtest/gtest.h>

#include <string>

#include "core/sha256.hpp"

namespace {

std::string hex(const idempotency::Digest& digest) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char byte : digest) {
    out.push_back(kHex[byte >> 4]);
    out.push_back(kHex[byte & 0x0F]);
  }
  return out;
}

}  // namespace

// FIPS 180-2 test vectors.
TEST(Sha256, KnownVectors) {
  EXPECT_EQ(hex(idempotency::sha256("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(idempotency::sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// Expected values computed independently with coreutils:
//   printf 'order-123\0charge' | sha256sum | cut -c1-32
//   printf 'order-123\0email'  | sha256sum | cut -c1-32
//   printf '\0' | sha256sum | cut -c1-32
TEST(Derive, MatchesSha256OfRootNulStep) {
  EXPECT_EQ(idempotency::derive_key("order-123", "charge"), "75242136693925dd4ac6c8bfd386a9fb");
  EXPECT_EQ(idempotency::derive_key("order-123", "email"), "5ac6ec6167d3c9c08dc2ee6466ef8df8");
  EXPECT_EQ(idempotency::derive_key("", ""), "6e340b9cffb37a989ca544e6bb780a2c");
}

TEST(Derive, IsAValidLowercaseKeyOf32Characters) {
  std::string key = idempotency::derive_key("root", "step");
  ASSERT_EQ(key.size(), 32u);
  for (char c : key) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << key;
}

TEST(Derive, SeparatesRootFromStep) {
  // Without the NUL separator these two would collide.
  EXPECT_NE(idempotency::derive_key("ab", "c"), idempotency::derive_key("a", "bc"));
}
