// The published fingerprint vectors (test/fingerprint_vectors.json, docs/fingerprint.md)
// against the core: canonical_json(input) must be the vector's canonical text, and
// SHA-256 of that text its digest. sql/fingerprint_vectors.sql checks the same vectors
// through jsonb on a server.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/canonical_json.hpp"
#include "core/error.hpp"
#include "core/sha256.hpp"

#ifndef IDEM_VECTORS_FILE
#error "IDEM_VECTORS_FILE must name test/fingerprint_vectors.json"
#endif

namespace idempotency {
namespace {

struct Vector {
  std::string name, input, canonical, sha256;
};

// Just enough JSON to read the file: an array of objects whose values are strings.
// Deliberately not canonical_json, which is what is under test.
class VectorReader {
 public:
  explicit VectorReader(std::string text) : text_(std::move(text)) {}

  std::vector<Vector> read() {
    std::vector<Vector> vectors;
    expect('[');
    if (!consume(']')) {
      do vectors.push_back(vector());
      while (consume(','));
      expect(']');
    }
    space();
    if (pos_ != text_.size()) fail("text after the array");
    return vectors;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("fingerprint_vectors.json, offset " + std::to_string(pos_) + ": " +
                             what);
  }
  void space() {
    while (pos_ < text_.size() &&
           std::string_view(" \t\n\r").find(text_[pos_]) != std::string::npos)
      pos_++;
  }
  bool consume(char c) {
    space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      pos_++;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(std::string("expected '") + c + "'");
  }

  Vector vector() {
    Vector v;
    std::set<std::string> seen;
    expect('{');
    do {
      std::string field = string();
      expect(':');
      std::string value = string();
      if (!seen.insert(field).second) fail("field " + field + " twice");
      if (field == "name")
        v.name = value;
      else if (field == "input")
        v.input = value;
      else if (field == "canonical")
        v.canonical = value;
      else if (field == "sha256")
        v.sha256 = value;
      else
        fail("unknown field " + field);
    } while (consume(','));
    expect('}');
    if (seen.size() != 4) fail("a vector without name, input, canonical or sha256");
    return v;
  }

  std::uint32_t hex4() {
    if (text_.size() - pos_ < 4) fail("truncated \\u escape");
    std::uint32_t code = 0;
    for (int i = 0; i < 4; i++) {
      char c = text_[pos_++];
      code <<= 4;
      if (c >= '0' && c <= '9')
        code |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        code |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        code |= static_cast<std::uint32_t>(c - 'A' + 10);
      else
        fail("bad hex digit");
    }
    return code;
  }

  static void append_utf8(std::uint32_t code, std::string* out) {
    if (code < 0x80) {
      out->push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (code >> 6)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (code >> 12)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (code >> 18)));
      out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }

  // A string's decoded bytes; raw bytes (UTF-8) are copied as they are.
  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) fail("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      switch (text_[pos_++]) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          std::uint32_t code = hex4();
          if (code >= 0xD800 && code <= 0xDBFF && text_.compare(pos_, 2, "\\u") == 0) {
            pos_ += 2;
            std::uint32_t low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("bad surrogate pair");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          } else if (code >= 0xD800 && code <= 0xDFFF) {
            fail("lone surrogate");
          }
          append_utf8(code, &out);
          break;
        }
        default: fail("unknown escape");
      }
    }
  }

  std::string text_;
  std::size_t pos_ = 0;
};

std::vector<Vector> load_vectors() {
  std::ifstream file(IDEM_VECTORS_FILE, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open " IDEM_VECTORS_FILE);
  std::ostringstream text;
  text << file.rdbuf();
  return VectorReader(text.str()).read();
}

// Long canonical numbers would flood a failure message.
std::string shown(const std::string& text) {
  return text.size() <= 200
             ? text
             : text.substr(0, 200) + "... (" + std::to_string(text.size()) + " bytes)";
}

class FingerprintVectors : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_THROW(vectors_ = load_vectors()); }
  std::vector<Vector> vectors_;
};

TEST_F(FingerprintVectors, FileIsWellFormed) {
  EXPECT_GE(vectors_.size(), 50u);
  std::set<std::string> names;
  for (const Vector& v : vectors_) {
    EXPECT_TRUE(names.insert(v.name).second) << "two vectors named " << v.name;
    EXPECT_EQ(v.sha256.size(), 64u) << v.name;
    EXPECT_EQ(v.sha256.find_first_not_of("0123456789abcdef"), std::string::npos) << v.name;
  }
}

TEST_F(FingerprintVectors, CanonicalFormOfEachInput) {
  for (const Vector& v : vectors_) {
    try {
      std::string canonical = canonical_json(v.input);
      EXPECT_EQ(canonical, v.canonical)
          << v.name << ": got " << shown(canonical) << ", digest " << hex(sha256(canonical));
    } catch (const Error& e) {
      ADD_FAILURE() << v.name << ": " << e.what();
    }
  }
}

TEST_F(FingerprintVectors, DigestOfEachCanonicalText) {
  for (const Vector& v : vectors_) EXPECT_EQ(hex(sha256(v.canonical)), v.sha256) << v.name;
}

TEST_F(FingerprintVectors, CanonicalTextIsItsOwnCanonicalForm) {
  for (const Vector& v : vectors_) {
    try {
      EXPECT_EQ(canonical_json(v.canonical), v.canonical) << v.name;
    } catch (const Error& e) {
      ADD_FAILURE() << v.name << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace idempotency
