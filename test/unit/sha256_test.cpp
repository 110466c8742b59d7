#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "core/canonical_json.hpp"
#include "core/sha256.hpp"

namespace idempotency {
namespace {

// FIPS 180-2 test vectors.
TEST(Sha256, KnownVectors) {
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, HashesEveryByteIncludingNul) {
  EXPECT_NE(sha256(std::string_view("a\0b", 3)), sha256(std::string_view("a\0c", 3)));
  EXPECT_NE(sha256(std::string_view("\0", 1)), sha256(""));
}

// What a client in another language computes for idem_fingerprint(jsonb):
//   printf '{"a":[1.5,"x"],"b":1}' | sha256sum
TEST(Sha256, FingerprintOfCanonicalJson) {
  EXPECT_EQ(hex(sha256(canonical_json(R"({"b":1,"a":[1.50,"x"]})"))),
            "27edd5497e48a293750749399a10333aae187927cecaf38c5ac50f54bbaa13b7");
}

// Expected values computed independently with coreutils:
//   printf 'order-123\0charge' | sha256sum | cut -c1-32
//   printf 'order-123\0email' | sha256sum | cut -c1-32
//   printf '\0' | sha256sum | cut -c1-32
//   printf 'k\0caf\xc3\xa9' | sha256sum | cut -c1-32
// RFC 4231, test cases 1, 2 and 6 (a key longer than a block is refused instead).
TEST(HmacSha256, Rfc4231Vectors) {
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), {"Hi There"})),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(hex(hmac_sha256("Jefe", {"what do ya want ", "for nothing?"})),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_THROW(hmac_sha256(std::string(131, '\xaa'), {"x"}), std::length_error);
}

TEST(HmacSha256, APreparedKeyGivesTheSameDigestsMessageAfterMessage) {
  HmacSha256 jefe("Jefe");
  for (int round = 0; round < 3; round++)
    EXPECT_EQ(hex(jefe({"what do ya want ", "for nothing?"})),
              "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  HmacSha256 other(std::string(32, '\x07'));
  EXPECT_EQ(other({"role", "scope", "key"}),
            hmac_sha256(std::string(32, '\x07'), {"role", "scope", "key"}));
  EXPECT_NE(other({"role", "scope", "key"}), other({"role", "scope", "kez"}));
  EXPECT_THROW(HmacSha256(std::string(65, 'x')), std::length_error);
}

TEST(HmacSha256, DependsOnTheKey) {
  EXPECT_NE(hmac_sha256("secret one", {"role", "scope", "key"}),
            hmac_sha256("secret two", {"role", "scope", "key"}));
}

TEST(DeriveKey, FirstHalfOfSha256OfRootNulStepInLowercaseHex) {
  EXPECT_EQ(derive_key("order-123", "charge"), "75242136693925dd4ac6c8bfd386a9fb");
  EXPECT_EQ(derive_key("order-123", "email"), "5ac6ec6167d3c9c08dc2ee6466ef8df8");
  EXPECT_EQ(derive_key("", ""), "6e340b9cffb37a989ca544e6bb780a2c");
  EXPECT_EQ(derive_key("k", "caf\xc3\xa9"), "50a5e8c12a12284c6dd3ea36ce43a4c7");
}

TEST(DeriveKey, IsAValidKeyOf32LowercaseHexCharacters) {
  std::string key = derive_key("root", "step");
  ASSERT_EQ(key.size(), 32u);
  for (char c : key) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << key;
  EXPECT_EQ(derive_key("root", "step"), key);
}

TEST(DeriveKey, SeparatesRootFromStep) {
  // Without the NUL between them these would collide.
  EXPECT_NE(derive_key("ab", "c"), derive_key("a", "bc"));
}

}  // namespace
}  // namespace idempotency
