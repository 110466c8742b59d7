#include "core/sha256.hpp"

#include <openssl/evp.h>

#include <initializer_list>
#include <memory>
#include <stdexcept>

namespace idempotency {

namespace {

struct ContextDeleter {
  void operator()(EVP_MD_CTX* context) const { EVP_MD_CTX_free(context); }
};
using Context = std::unique_ptr<EVP_MD_CTX, ContextDeleter>;

// SHA-256 as OpenSSL 3 provides it, fetched once: EVP_sha256() in a digest's
// initialisation fetches it from the provider again each time (about 2,300
// instructions, as much as hashing a short message).
const EVP_MD* sha256_method() {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  static const EVP_MD* const fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  if (fetched != nullptr) return fetched;
#endif
  return EVP_sha256();
}

// One SHA-256 digest, fed piece by piece.
class Sha256 {
 public:
  Sha256() : context_(EVP_MD_CTX_new()) {
    if (!context_ || EVP_DigestInit_ex(context_.get(), sha256_method(), nullptr) != 1)
      throw std::runtime_error("OpenSSL could not start a SHA-256 digest");
  }
  Sha256& update(std::string_view part) {
    if (EVP_DigestUpdate(context_.get(), part.data(), part.size()) != 1)
      throw std::runtime_error("OpenSSL could not update a SHA-256 digest");
    return *this;
  }
  Digest finish() {
    Digest digest;
    unsigned int length = 0;
    if (EVP_DigestFinal_ex(context_.get(), digest.data(), &length) != 1 || length != digest.size())
      throw std::runtime_error("OpenSSL could not finish a SHA-256 digest");
    return digest;
  }

 private:
  Context context_;
};

Digest digest_of(std::initializer_list<std::string_view> parts) {
  Sha256 sha;
  for (std::string_view part : parts) sha.update(part);
  return sha.finish();
}

}  // namespace

Digest sha256(std::string_view bytes) { return digest_of({bytes}); }

void HmacSha256::Deleter::operator()(evp_md_ctx_st* context) const { EVP_MD_CTX_free(context); }

static void check(int ok, const char* what) {
  if (ok != 1) throw std::runtime_error(what);
}

HmacSha256::HmacSha256(std::string_view key)
    : inner_(EVP_MD_CTX_new()), outer_(EVP_MD_CTX_new()), work_(EVP_MD_CTX_new()) {
  constexpr std::size_t kBlock = 64;
  if (key.size() > kBlock) throw std::length_error("HMAC key longer than a SHA-256 block");
  if (!inner_ || !outer_ || !work_) throw std::bad_alloc();
  std::array<char, kBlock> inner{}, outer{};
  for (std::size_t i = 0; i < kBlock; i++) {
    unsigned char k = i < key.size() ? static_cast<unsigned char>(key[i]) : 0;
    inner[i] = static_cast<char>(k ^ 0x36);
    outer[i] = static_cast<char>(k ^ 0x5c);
  }
  check(EVP_DigestInit_ex(inner_.get(), EVP_sha256(), nullptr), "OpenSSL could not start SHA-256");
  check(EVP_DigestUpdate(inner_.get(), inner.data(), kBlock), "OpenSSL could not update SHA-256");
  check(EVP_DigestInit_ex(outer_.get(), EVP_sha256(), nullptr), "OpenSSL could not start SHA-256");
  check(EVP_DigestUpdate(outer_.get(), outer.data(), kBlock), "OpenSSL could not update SHA-256");
}

HmacSha256::~HmacSha256() = default;

Digest HmacSha256::operator()(std::initializer_list<std::string_view> parts) const {
  EVP_MD_CTX* work = work_.get();
  Digest digest;
  unsigned int length = 0;
  check(EVP_MD_CTX_copy_ex(work, inner_.get()), "OpenSSL could not copy a SHA-256 state");
  for (std::string_view part : parts)
    check(EVP_DigestUpdate(work, part.data(), part.size()), "OpenSSL could not update SHA-256");
  check(EVP_DigestFinal_ex(work, digest.data(), &length), "OpenSSL could not finish SHA-256");
  check(EVP_MD_CTX_copy_ex(work, outer_.get()), "OpenSSL could not copy a SHA-256 state");
  check(EVP_DigestUpdate(work, digest.data(), digest.size()), "OpenSSL could not update SHA-256");
  check(EVP_DigestFinal_ex(work, digest.data(), &length), "OpenSSL could not finish SHA-256");
  return digest;
}

Digest hmac_sha256(std::string_view key, std::initializer_list<std::string_view> parts) {
  return HmacSha256(key)(parts);
}

std::string hex(const Digest& digest) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * digest.size());
  for (unsigned char byte : digest) {
    out.push_back(kHex[byte >> 4]);
    out.push_back(kHex[byte & 0x0F]);
  }
  return out;
}

std::string derive_key(std::string_view root, std::string_view step) {
  // The NUL keeps ("ab", "c") and ("a", "bc") apart; a key never contains one.
  return hex(digest_of({root, std::string_view("\0", 1), step})).substr(0, 32);
}

}  // namespace idempotency
