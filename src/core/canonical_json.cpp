#include "core/canonical_json.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace idempotency {

namespace {

constexpr std::size_t kNone = static_cast<std::size_t>(-1);
// Larger exponents saturate here; any non-zero number with one is refused by the
// length limit, and zero stays "0" whatever its exponent.
constexpr std::int64_t kExponentCap = 1000000000000000;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The integer and fraction digits of a number, read as one digit string without
// copying them out of the input.
struct Digits {
  std::string_view integer;
  std::string_view fraction;

  std::size_t size() const { return integer.size() + fraction.size(); }
  char at(std::size_t i) const {
    return i < integer.size() ? integer[i] : fraction[i - integer.size()];
  }
  void append(std::string* out, std::size_t from, std::size_t to) const {
    if (from < integer.size()) {
      std::size_t end = std::min(to, integer.size());
      out->append(integer.substr(from, end - from));
      from = end;
    }
    if (from < to) out->append(fraction.substr(from - integer.size(), to - from));
  }
};

// Canonical text is written to text_ in input order. Object members are cut into a
// linked list of pieces of text_ at their boundaries, so that an object's `}` can
// put its members in order by relinking them, however large they are. Text without
// a reordered object is its own answer.
class Canonicalizer {
 public:
  explicit Canonicalizer(std::string_view input) : in_(input) {
    text_.reserve(input.size());
    pieces_.push_back(Piece{0, 0, kNone});
  }

  std::string run();

 private:
  struct Piece {
    std::size_t begin;
    std::size_t end;  // fixed when the next piece is cut
    std::size_t next;
  };
  struct Member {
    std::size_t key_offset;  // decoded key in keys_
    std::size_t key_size;
    std::size_t first_piece;  // starts with the ',' written before it, unless ordinal is 0
    std::size_t last_piece;
    std::size_t ordinal;  // position in the input
  };
  struct Frame {
    bool is_object;
    std::size_t members_base;  // this object's members are members_[members_base..]
    std::size_t keys_base;
    std::size_t open_piece;  // ends with this object's '{'
  };

  [[noreturn]] void invalid(const char* what) const {
    // 22023, as for any unusable argument: jsonb's own output only fails here on
    // numbers the canonical form cannot write.
    throw Error("22023", "invalid JSON at offset " + std::to_string(pos_) + ": " + what);
  }
  bool at_end() const { return pos_ >= in_.size(); }
  char peek() const { return at_end() ? '\0' : in_[pos_]; }
  void skip_space() {
    while (!at_end() &&
           (in_[pos_] == ' ' || in_[pos_] == '\t' || in_[pos_] == '\n' || in_[pos_] == '\r'))
      pos_++;
  }
  std::string_view key(const Member& member) const {
    return std::string_view(keys_).substr(member.key_offset, member.key_size);
  }

  std::size_t cut();
  void begin_member(bool first);
  void close_object(const Frame& frame);
  std::string finish();
  void read_string(std::string* decoded);
  std::size_t utf8_sequence_length() const;
  std::uint32_t hex4();
  void write_code_point(std::uint32_t code, std::string* decoded);
  void read_number();
  void read_literal();

  std::string_view in_;
  std::size_t pos_ = 0;
  std::string text_;
  std::vector<Piece> pieces_;
  std::size_t current_ = 0;  // the piece text_ is growing; its end is not yet fixed
  bool reordered_ = false;
  std::vector<Frame> frames_;
  std::vector<Member> members_;
  std::string keys_;
  std::size_t growth_ = 0;
};

std::size_t Canonicalizer::cut() {
  pieces_[current_].end = text_.size();
  pieces_.push_back(Piece{text_.size(), 0, kNone});
  pieces_[current_].next = pieces_.size() - 1;
  current_ = pieces_.size() - 1;
  return current_;
}

std::string Canonicalizer::run() {
  for (;;) {
    // A value is expected here.
    skip_space();
    char c = peek();
    if (c == '[' || c == '{') {
      pos_++;
      text_.push_back(c);
      char close = c == '[' ? ']' : '}';
      skip_space();
      if (peek() == close) {
        pos_++;
        text_.push_back(close);
      } else {
        frames_.push_back(Frame{c == '{', members_.size(), keys_.size(), current_});
        if (c == '{') begin_member(true);
        continue;
      }
    } else if (c == '"') {
      read_string(nullptr);
    } else if (c == '-' || is_digit(c)) {
      read_number();
    } else {
      read_literal();
    }

    // After a value: close containers until one continues with ','.
    for (;;) {
      skip_space();
      if (frames_.empty()) {
        if (!at_end()) invalid("unexpected text after the value");
        return finish();
      }
      if (at_end()) invalid("unterminated array or object");
      char next = in_[pos_++];
      Frame frame = frames_.back();
      if (frame.is_object) {
        if (next != ',' && next != '}') invalid("expected ',' or '}' after an object member");
        members_.back().last_piece = current_;
        if (next == ',') {
          begin_member(false);
          break;
        }
        close_object(frame);
        members_.resize(frame.members_base);
        keys_.resize(frame.keys_base);
      } else {
        if (next != ',' && next != ']') invalid("expected ',' or ']' after an array element");
        text_.push_back(next);
        if (next == ',') break;
      }
      frames_.pop_back();
    }
  }
}

// Reads `"key":` and starts a member whose text may later move.
void Canonicalizer::begin_member(bool first) {
  std::size_t first_piece = cut();
  if (!first) text_.push_back(',');
  skip_space();
  if (peek() != '"') invalid("expected a string as object key");
  std::size_t key_offset = keys_.size();
  read_string(&keys_);
  skip_space();
  if (peek() != ':') invalid("expected ':' after an object key");
  pos_++;
  text_.push_back(':');
  std::size_t ordinal = members_.size() - frames_.back().members_base;
  members_.push_back(Member{key_offset, keys_.size() - key_offset, first_piece, kNone, ordinal});
}

void Canonicalizer::close_object(const Frame& frame) {
  auto first = members_.begin() + static_cast<std::ptrdiff_t>(frame.members_base);
  auto last = members_.end();
  bool in_order = true;
  for (auto it = first; in_order && it + 1 < last; ++it) in_order = key(it[0]) < key(it[1]);
  if (in_order) {
    text_.push_back('}');
    return;
  }

  reordered_ = true;
  // The member that came first has no ',' of its own; this one serves it if it moves.
  std::size_t comma = cut();
  text_.push_back(',');
  std::size_t close = cut();
  text_.push_back('}');
  std::sort(first, last, [this](const Member& a, const Member& b) {
    int order = key(a).compare(key(b));
    return order != 0 ? order < 0 : a.ordinal < b.ordinal;
  });
  std::size_t previous = frame.open_piece;
  bool leading = true;
  for (auto it = first; it != last; ++it) {
    if (it + 1 != last && key(it[0]) == key(it[1])) continue;           // a later duplicate wins
    if (leading && it->ordinal != 0) pieces_[it->first_piece].begin++;  // drop its ','
    if (!leading && it->ordinal == 0) {
      pieces_[previous].next = comma;
      previous = comma;
    }
    pieces_[previous].next = it->first_piece;
    previous = it->last_piece;
    leading = false;
  }
  pieces_[previous].next = close;
}

std::string Canonicalizer::finish() {
  pieces_[current_].end = text_.size();
  if (!reordered_) return std::move(text_);
  std::string out;
  out.reserve(text_.size());
  for (std::size_t i = 0; i != kNone; i = pieces_[i].next)
    out.append(text_, pieces_[i].begin, pieces_[i].end - pieces_[i].begin);
  return out;
}

// Reads a string and writes it canonically; with `decoded`, also appends its bytes.
void Canonicalizer::read_string(std::string* decoded) {
  pos_++;  // the opening quote
  text_.push_back('"');
  for (;;) {
    std::size_t run = pos_;
    while (!at_end()) {
      auto c = static_cast<unsigned char>(in_[pos_]);
      if (c < 0x20 || c == '"' || c == '\\' || c >= 0x80) break;
      pos_++;
    }
    if (pos_ > run) {
      text_.append(in_, run, pos_ - run);
      if (decoded) decoded->append(in_, run, pos_ - run);
    }
    if (at_end()) invalid("unterminated string");
    auto c = static_cast<unsigned char>(in_[pos_]);
    if (c == '"') {
      pos_++;
      text_.push_back('"');
      return;
    }
    if (c < 0x20) invalid("control character in a string");
    if (c >= 0x80) {
      std::size_t length = utf8_sequence_length();
      text_.append(in_, pos_, length);
      if (decoded) decoded->append(in_, pos_, length);
      pos_ += length;
      continue;
    }
    pos_++;  // the backslash
    if (at_end()) invalid("unterminated escape");
    std::uint32_t code;
    switch (in_[pos_++]) {
      case '"': code = '"'; break;
      case '\\': code = '\\'; break;
      case '/': code = '/'; break;
      case 'b': code = '\b'; break;
      case 'f': code = '\f'; break;
      case 'n': code = '\n'; break;
      case 'r': code = '\r'; break;
      case 't': code = '\t'; break;
      case 'u':
        code = hex4();
        if (code >= 0xDC00 && code <= 0xDFFF) invalid("low surrogate without a high one");
        if (code >= 0xD800 && code <= 0xDBFF) {
          if (in_.substr(pos_, 2) != "\\u") invalid("high surrogate without a low one");
          pos_ += 2;
          std::uint32_t low = hex4();
          if (low < 0xDC00 || low > 0xDFFF) invalid("high surrogate without a low one");
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        break;
      default: invalid("unknown escape");
    }
    write_code_point(code, decoded);
  }
}

// The length of the well-formed UTF-8 sequence at pos_ (RFC 3629: no overlong forms,
// no surrogates, nothing past U+10FFFF).
std::size_t Canonicalizer::utf8_sequence_length() const {
  auto lead = static_cast<unsigned char>(in_[pos_]);
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    invalid("invalid UTF-8");
  }
  if (in_.size() - pos_ < length) invalid("truncated UTF-8");
  for (std::size_t i = 1; i < length; i++) {
    auto byte = static_cast<unsigned char>(in_[pos_ + i]);
    if (byte < (i == 1 ? low : 0x80) || byte > (i == 1 ? high : 0xBF)) invalid("invalid UTF-8");
  }
  return length;
}

std::uint32_t Canonicalizer::hex4() {
  if (in_.size() - pos_ < 4) invalid("truncated \\u escape");
  std::uint32_t code = 0;
  for (int i = 0; i < 4; i++) {
    char c = in_[pos_++];
    code <<= 4;
    if (c >= '0' && c <= '9')
      code |= static_cast<std::uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      code |= static_cast<std::uint32_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      code |= static_cast<std::uint32_t>(c - 'A' + 10);
    else
      invalid("bad hex digit in \\u escape");
  }
  return code;
}

void Canonicalizer::write_code_point(std::uint32_t code, std::string* decoded) {
  char utf8[4];
  std::size_t length;
  if (code < 0x80) {
    utf8[0] = static_cast<char>(code);
    length = 1;
    static const char kHex[] = "0123456789abcdef";
    switch (code) {
      case '"': text_ += "\\\""; break;
      case '\\': text_ += "\\\\"; break;
      case '\b': text_ += "\\b"; break;
      case '\t': text_ += "\\t"; break;
      case '\n': text_ += "\\n"; break;
      case '\f': text_ += "\\f"; break;
      case '\r': text_ += "\\r"; break;
      default:
        if (code < 0x20) {
          text_ += "\\u00";
          text_.push_back(kHex[code >> 4]);
          text_.push_back(kHex[code & 0x0F]);
        } else {
          text_.push_back(utf8[0]);
        }
    }
  } else {
    if (code < 0x800) {
      utf8[0] = static_cast<char>(0xC0 | (code >> 6));
      length = 2;
    } else if (code < 0x10000) {
      utf8[0] = static_cast<char>(0xE0 | (code >> 12));
      utf8[1] = static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      length = 3;
    } else {
      utf8[0] = static_cast<char>(0xF0 | (code >> 18));
      utf8[1] = static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      utf8[2] = static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      length = 4;
    }
    utf8[length - 1] = static_cast<char>(0x80 | (code & 0x3F));
    text_.append(utf8, length);
  }
  if (decoded) decoded->append(utf8, length);
}

// Reads a number and writes it in plain decimal.
void Canonicalizer::read_number() {
  std::size_t start = pos_;
  bool negative = peek() == '-';
  if (negative) pos_++;
  auto take_digits = [this] {
    std::size_t from = pos_;
    while (!at_end() && is_digit(in_[pos_])) pos_++;
    return in_.substr(from, pos_ - from);
  };
  if (!is_digit(peek())) invalid("expected a digit");
  Digits digits;
  if (peek() == '0') {
    digits.integer = in_.substr(pos_++, 1);
    if (is_digit(peek())) invalid("leading zero");
  } else {
    digits.integer = take_digits();
  }
  if (peek() == '.') {
    pos_++;
    if (!is_digit(peek())) invalid("expected a digit after '.'");
    digits.fraction = take_digits();
  }
  std::int64_t exponent = 0;
  if (peek() == 'e' || peek() == 'E') {
    pos_++;
    bool exponent_negative = peek() == '-';
    if (peek() == '+' || peek() == '-') pos_++;
    if (!is_digit(peek())) invalid("expected a digit in the exponent");
    for (char d : take_digits()) exponent = std::min(exponent * 10 + (d - '0'), kExponentCap);
    if (exponent_negative) exponent = -exponent;
  }

  std::size_t first = 0, last = digits.size();
  while (first < last && digits.at(first) == '0') first++;
  if (first == last) {
    text_.push_back('0');
    return;
  }
  while (digits.at(last - 1) == '0') last--;
  auto significant = static_cast<std::int64_t>(last - first);
  // How many significant digits precede the decimal point; zero or less: 0.000ddd.
  std::int64_t point = static_cast<std::int64_t>(digits.integer.size()) + exponent -
                       static_cast<std::int64_t>(first);
  std::int64_t length = negative ? 1 : 0;
  if (point <= 0)
    length += 2 - point + significant;  // 0.00ddd
  else if (point < significant)
    length += significant + 1;  // dd.ddd
  else
    length += point;  // ddd00
  if (length > static_cast<std::int64_t>(kMaxCanonicalNumberChars))
    invalid("number too long in plain decimal");
  auto read = static_cast<std::int64_t>(pos_ - start);
  if (length > read) {
    growth_ += static_cast<std::size_t>(length - read);
    if (growth_ > kMaxCanonicalGrowthBytes) invalid("numbers too long in plain decimal");
  }

  if (negative) text_.push_back('-');
  if (point <= 0) {
    text_ += "0.";
    text_.append(static_cast<std::size_t>(-point), '0');
    digits.append(&text_, first, last);
  } else if (point < significant) {
    auto split = first + static_cast<std::size_t>(point);
    digits.append(&text_, first, split);
    text_.push_back('.');
    digits.append(&text_, split, last);
  } else {
    digits.append(&text_, first, last);
    text_.append(static_cast<std::size_t>(point - significant), '0');
  }
}

void Canonicalizer::read_literal() {
  for (std::string_view word : {"true", "false", "null"}) {
    if (in_.substr(pos_, word.size()) == word) {
      text_.append(word);
      pos_ += word.size();
      return;
    }
  }
  invalid(at_end() ? "expected a value" : "unexpected character");
}

}  // namespace

std::string canonical_json(std::string_view json_text) { return Canonicalizer(json_text).run(); }

}  // namespace idempotency
