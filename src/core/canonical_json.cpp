#include "core/canonical_json.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

namespace idempotency {

namespace {

constexpr std::size_t kMaxNumberText = 200000;

[[noreturn]] void invalid(const char* what) {
  throw std::invalid_argument(std::string("invalid JSON: ") + what);
}

// A parsed value. Scalars keep their canonical text (strings decoded, unescaped);
// containers keep their children as indexes into the node table.
struct Node {
  enum class Kind { kLiteral, kNumber, kString, kArray, kObject } kind;
  std::string text;
  std::vector<std::size_t> children;  // arrays: values; objects: key, value, key, value...
};

void append_utf8(std::string* out, std::uint32_t code) {
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

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  // Returns the root's index in nodes().
  std::size_t parse();
  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  struct Frame {
    std::size_t node;
    std::size_t key;  // objects: the key awaiting its value
  };

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }
  void skip_space() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r'))
      pos_++;
  }
  void expect(char c, const char* what) {
    skip_space();
    if (peek() != c) invalid(what);
    pos_++;
  }
  std::size_t add(Node::Kind kind, std::string text = {}) {
    nodes_.push_back(Node{kind, std::move(text), {}});
    return nodes_.size() - 1;
  }
  void attach(std::size_t node);
  std::size_t parse_member_key();
  std::string parse_string();
  std::uint32_t parse_hex4();
  void copy_utf8_sequence(std::string* out);
  std::string parse_number();
  void parse_literal();

  std::string_view text_;
  std::size_t pos_ = 0;
  std::vector<Node> nodes_;
  std::vector<Frame> stack_;
  std::size_t root_ = 0;
};

void Parser::attach(std::size_t node) {
  if (stack_.empty()) {
    root_ = node;
    return;
  }
  Frame& frame = stack_.back();
  std::vector<std::size_t>& children = nodes_[frame.node].children;
  if (nodes_[frame.node].kind == Node::Kind::kObject) children.push_back(frame.key);
  children.push_back(node);
}

std::size_t Parser::parse_member_key() {
  skip_space();
  if (peek() != '"') invalid("object key must be a string");
  std::size_t key = add(Node::Kind::kString, parse_string());
  expect(':', "expected ':' after an object key");
  return key;
}

std::size_t Parser::parse() {
  for (;;) {
    // A value is expected here.
    skip_space();
    char c = peek();
    if (c == '{' || c == '[') {
      pos_++;
      std::size_t node = add(c == '{' ? Node::Kind::kObject : Node::Kind::kArray);
      attach(node);
      stack_.push_back(Frame{node, 0});
      skip_space();
      if (peek() == (c == '{' ? '}' : ']')) {
        pos_++;
        stack_.pop_back();  // empty: go on as after any value
      } else if (c == '{') {
        stack_.back().key = parse_member_key();
        continue;
      } else {
        continue;
      }
    } else if (c == '"') {
      attach(add(Node::Kind::kString, parse_string()));
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      attach(add(Node::Kind::kNumber, parse_number()));
    } else {
      std::size_t start = pos_;
      parse_literal();
      attach(add(Node::Kind::kLiteral, std::string(text_.substr(start, pos_ - start))));
    }
    // After a value: close containers or move to the next element.
    for (;;) {
      if (stack_.empty()) {
        skip_space();
        if (!at_end()) invalid("unexpected text after the value");
        return root_;
      }
      skip_space();
      Frame& frame = stack_.back();
      bool is_object = nodes_[frame.node].kind == Node::Kind::kObject;
      char next = peek();
      if (at_end()) invalid("unterminated array or object");
      pos_++;
      if (next == ',') {
        if (is_object) frame.key = parse_member_key();
        break;
      }
      if (next != (is_object ? '}' : ']')) invalid("expected ',' or the end of an array or object");
      stack_.pop_back();
    }
  }
}

void Parser::parse_literal() {
  for (std::string_view literal : {"true", "false", "null"}) {
    if (text_.substr(pos_, literal.size()) == literal) {
      pos_ += literal.size();
      return;
    }
  }
  invalid("expected a value");
}

std::uint32_t Parser::parse_hex4() {
  if (text_.size() - pos_ < 4) invalid("truncated \\u escape");
  std::uint32_t code = 0;
  for (int i = 0; i < 4; i++) {
    char c = text_[pos_++];
    code <<= 4;
    if (c >= '0' && c <= '9')
      code |= c - '0';
    else if (c >= 'a' && c <= 'f')
      code |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      code |= c - 'A' + 10;
    else
      invalid("bad hex digit in \\u escape");
  }
  return code;
}

// Copies one multi-byte UTF-8 character, refusing overlong forms, surrogates and
// code points past U+10FFFF.
void Parser::copy_utf8_sequence(std::string* out) {
  auto lead = static_cast<unsigned char>(text_[pos_]);
  int length;
  std::uint32_t code;
  if (lead >= 0xC2 && lead <= 0xDF)
    length = 2, code = lead & 0x1F;
  else if (lead >= 0xE0 && lead <= 0xEF)
    length = 3, code = lead & 0x0F;
  else if (lead >= 0xF0 && lead <= 0xF4)
    length = 4, code = lead & 0x07;
  else
    invalid("invalid UTF-8");
  if (text_.size() - pos_ < static_cast<std::size_t>(length)) invalid("truncated UTF-8");
  for (int i = 1; i < length; i++) {
    auto byte = static_cast<unsigned char>(text_[pos_ + i]);
    if ((byte & 0xC0) != 0x80) invalid("invalid UTF-8");
    code = (code << 6) | (byte & 0x3F);
  }
  if ((length == 3 && code < 0x800) || (length == 4 && code < 0x10000) || code > 0x10FFFF ||
      (code >= 0xD800 && code <= 0xDFFF))
    invalid("invalid UTF-8");
  out->append(text_.substr(pos_, length));
  pos_ += length;
}

std::string Parser::parse_string() {
  pos_++;  // the opening quote
  std::string out;
  for (;;) {
    if (at_end()) invalid("unterminated string");
    auto c = static_cast<unsigned char>(text_[pos_]);
    if (c == '"') {
      pos_++;
      return out;
    }
    if (c < 0x20) invalid("control character in a string");
    if (c >= 0x80) {
      copy_utf8_sequence(&out);
      continue;
    }
    pos_++;
    if (c != '\\') {
      out.push_back(static_cast<char>(c));
      continue;
    }
    if (at_end()) invalid("unterminated escape");
    char escape = text_[pos_++];
    switch (escape) {
      case '"': out.push_back('"'); break;
      case '\\': out.push_back('\\'); break;
      case '/': out.push_back('/'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'u': {
        std::uint32_t code = parse_hex4();
        if (code >= 0xDC00 && code <= 0xDFFF) invalid("lone low surrogate");
        if (code >= 0xD800 && code <= 0xDBFF) {
          if (text_.substr(pos_, 2) != "\\u") invalid("high surrogate without a low one");
          pos_ += 2;
          std::uint32_t low = parse_hex4();
          if (low < 0xDC00 || low > 0xDFFF) invalid("high surrogate without a low one");
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        append_utf8(&out, code);
        break;
      }
      default: invalid("unknown escape");
    }
  }
}

// Reads a number and returns it in plain decimal, as the SPEC writes it.
std::string Parser::parse_number() {
  bool negative = false;
  if (peek() == '-') negative = true, pos_++;
  auto digit = [&] { return !at_end() && peek() >= '0' && peek() <= '9'; };
  if (!digit()) invalid("expected a digit");
  std::string digits;  // integer and fraction digits together
  if (peek() == '0') {
    pos_++;
    digits.push_back('0');
    if (digit()) invalid("leading zero");
  } else {
    while (digit()) digits.push_back(text_[pos_++]);
  }
  // Position of the decimal point within `digits`, moved by the exponent.
  std::int64_t point = static_cast<std::int64_t>(digits.size());
  if (peek() == '.') {
    pos_++;
    if (!digit()) invalid("expected a digit after '.'");
    while (digit()) digits.push_back(text_[pos_++]);
  }
  if (peek() == 'e' || peek() == 'E') {
    pos_++;
    bool exponent_negative = false;
    if (peek() == '+' || peek() == '-') exponent_negative = peek() == '-', pos_++;
    if (!digit()) invalid("expected a digit in the exponent");
    std::int64_t exponent = 0;
    while (digit()) {
      exponent = exponent * 10 + (text_[pos_++] - '0');
      if (exponent > static_cast<std::int64_t>(kMaxNumberText)) invalid("number too large");
    }
    point += exponent_negative ? -exponent : exponent;
  }
  // Drop leading zeros (moving the point) and trailing zeros (of the digits only).
  std::size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) return "0";
  digits.erase(0, first);
  point -= static_cast<std::int64_t>(first);
  digits.erase(digits.find_last_not_of('0') + 1);

  auto size = static_cast<std::int64_t>(digits.size());
  std::int64_t plain = size + (point <= 0 ? 2 - point : (point > size ? point - size : 1));
  if (plain > static_cast<std::int64_t>(kMaxNumberText)) invalid("number too large");
  std::string out = negative ? "-" : "";
  if (point <= 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-point), '0');
    out += digits;
  } else if (point >= size) {
    out += digits;
    out.append(static_cast<std::size_t>(point - size), '0');
  } else {
    out += digits.substr(0, static_cast<std::size_t>(point));
    out += '.';
    out += digits.substr(static_cast<std::size_t>(point));
  }
  return out;
}

void write_string(std::string* out, const std::string& text) {
  static const char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\b': *out += "\\b"; break;
      case '\t': *out += "\\t"; break;
      case '\n': *out += "\\n"; break;
      case '\f': *out += "\\f"; break;
      case '\r': *out += "\\r"; break;
      default:
        if (c < 0x20) {
          *out += "\\u00";
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0x0F]);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

// Object members in canonical order: by key bytes, the last of equal keys kept.
std::vector<std::pair<std::size_t, std::size_t>> sorted_members(const std::vector<Node>& nodes,
                                                                const Node& object) {
  std::vector<std::pair<std::size_t, std::size_t>> members;
  for (std::size_t i = 0; i < object.children.size(); i += 2)
    members.emplace_back(object.children[i], object.children[i + 1]);
  auto key_of = [&](const std::pair<std::size_t, std::size_t>& m) -> const std::string& {
    return nodes[m.first].text;
  };
  std::stable_sort(members.begin(), members.end(),
                   [&](const auto& a, const auto& b) { return key_of(a) < key_of(b); });
  std::vector<std::pair<std::size_t, std::size_t>> unique;
  for (std::size_t i = 0; i < members.size(); i++)
    if (i + 1 == members.size() || key_of(members[i]) != key_of(members[i + 1]))
      unique.push_back(members[i]);
  return unique;
}

std::string write_canonical(const std::vector<Node>& nodes, std::size_t root) {
  struct Frame {
    std::size_t node;
    std::size_t next;                                          // next member or element to write
    std::vector<std::pair<std::size_t, std::size_t>> members;  // objects only
  };
  std::string out;
  std::vector<Frame> stack;
  std::size_t value = root;
  for (;;) {
    const Node& node = nodes[value];
    switch (node.kind) {
      case Node::Kind::kLiteral:
      case Node::Kind::kNumber: out += node.text; break;
      case Node::Kind::kString: write_string(&out, node.text); break;
      case Node::Kind::kArray:
        out.push_back('[');
        stack.push_back(Frame{value, 0, {}});
        break;
      case Node::Kind::kObject:
        out.push_back('{');
        stack.push_back(Frame{value, 0, sorted_members(nodes, node)});
        break;
    }
    // Find the next value to write, closing finished containers.
    for (;;) {
      if (stack.empty()) return out;
      Frame& frame = stack.back();
      const Node& container = nodes[frame.node];
      bool is_object = container.kind == Node::Kind::kObject;
      std::size_t count = is_object ? frame.members.size() : container.children.size();
      if (frame.next == count) {
        out.push_back(is_object ? '}' : ']');
        stack.pop_back();
        continue;
      }
      if (frame.next > 0) out.push_back(',');
      if (is_object) {
        write_string(&out, nodes[frame.members[frame.next].first].text);
        out.push_back(':');
        value = frame.members[frame.next].second;
      } else {
        value = container.children[frame.next];
      }
      frame.next++;
      break;
    }
  }
}

}  // namespace

std::string canonical_json(std::string_view json_text) {
  Parser parser(json_text);
  std::size_t root = parser.parse();
  return write_canonical(parser.nodes(), root);
}

}  // namespace idempotency
