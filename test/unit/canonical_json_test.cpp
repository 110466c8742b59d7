#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "core/canonical_json.hpp"
#include "core/error.hpp"

namespace idempotency {
namespace {

struct Case {
  std::string in;
  std::string out;
};

void expect_all(const Case* begin, const Case* end) {
  for (const Case* c = begin; c != end; ++c) {
    try {
      EXPECT_EQ(canonical_json(c->in), c->out) << "input: " << c->in;
    } catch (const Error& e) {
      ADD_FAILURE() << "input: " << c->in << " threw: " << e.what();
    }
  }
}

template <std::size_t N>
void expect_all(const Case (&cases)[N]) {
  expect_all(cases, cases + N);
}

TEST(CanonicalJson, TheIssueExample) {
  EXPECT_EQ(canonical_json(R"({"b":1,"a":[1.50,"x"]})"), R"({"a":[1.5,"x"],"b":1})");
}

TEST(CanonicalJson, SpecNumberExamples) {
  const Case cases[] = {
      {"1.50", "1.5"}, {"1e3", "1000"},       {"1.5e-3", "0.0015"}, {"12e-1", "1.2"}, {"-0", "0"},
      {"100", "100"},  {"-12.340", "-12.34"}, {"-0.0e5", "0"},      {"0.000", "0"},   {"0", "0"},
  };
  expect_all(cases);
}

TEST(CanonicalJson, NumbersInPlainDecimal) {
  const Case cases[] = {
      {"-0.0", "0"},
      {"0e-5", "0"},
      {"0E+7", "0"},
      {"0e999999999999999999999", "0"},  // zero stays zero whatever the exponent
      {"-0.000e-999999999", "0"},
      {"1E+2", "100"},
      {"1e+0", "1"},
      {"1e-0", "1"},
      {"5e0", "5"},
      {"1e-1", "0.1"},
      {"5e-1", "0.5"},
      {"2e-3", "0.002"},
      {"0.1", "0.1"},
      {"0.1e1", "1"},
      {"0.5e1", "5"},
      {"-0.001", "-0.001"},
      {"-0.00120e3", "-1.2"},
      {"10.0", "10"},
      {"100e-2", "1"},
      {"1000e-1", "100"},
      {"1234.5e-2", "12.345"},
      {"123.456e1", "1234.56"},
      {"-7", "-7"},
      {"1e00002", "100"},  // leading zeros are allowed in an exponent
      // No detour through double: every digit survives.
      {"9007199254740993", "9007199254740993"},
      {"123456789012345678901234567890.000000000000000000001",
       "123456789012345678901234567890.000000000000000000001"},
      {"1.0000000000000000000000001", "1.0000000000000000000000001"},
      {"-98765432109876543210e-25", "-0.000009876543210987654321"},
      {"-10203.0400e2", "-1020304"},
  };
  expect_all(cases);
}

// The error boundary reports a core error at its throw site (file, line, function), not
// at the boundary: the Error carries where it was made.
TEST(CanonicalJson, ErrorKnowsWhereItWasThrown) {
  try {
    canonical_json("[1,");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.sqlstate(), "22023");
    std::string file = e.site().file;
    EXPECT_EQ(file.substr(file.rfind('/') + 1), "canonical_json.cpp");
    EXPECT_GT(e.site().line, 0);
    EXPECT_STREQ(e.site().function, "invalid");
  }
}

TEST(CanonicalJson, NumberLengthLimit) {
  // 1e-k is "0." then k-1 zeros then "1": k + 2 characters.
  EXPECT_EQ(canonical_json("1e-199998").size(), kMaxCanonicalNumberChars);
  EXPECT_THROW(canonical_json("1e-199999"), Error);
  EXPECT_EQ(canonical_json("1e199999").size(), kMaxCanonicalNumberChars);
  EXPECT_THROW(canonical_json("1e200000"), Error);
  EXPECT_EQ(canonical_json("-1e199998").size(), kMaxCanonicalNumberChars);
  EXPECT_THROW(canonical_json("-1e199999"), Error);
  EXPECT_THROW(canonical_json("1e999999999999999999999999"), Error);
  EXPECT_THROW(canonical_json("1e-999999999999999999999999"), Error);
  // A long number that is short in plain decimal is fine.
  std::string long_zeros = "1" + std::string(300000, '0') + "e-300000";
  EXPECT_EQ(canonical_json(long_zeros), "1");
}

TEST(CanonicalJson, GrowthLimitAcrossNumbers) {
  // Each 1e199999 grows by 200000 - 8 bytes.
  const std::size_t fits = kMaxCanonicalGrowthBytes / (kMaxCanonicalNumberChars - 8);
  auto array_of = [](std::size_t count) {
    std::string text = "[";
    for (std::size_t i = 0; i < count; i++) text += i ? ",1e199999" : "1e199999";
    return text + "]";
  };
  EXPECT_NO_THROW(canonical_json(array_of(fits)));
  EXPECT_THROW(canonical_json(array_of(fits + 1)), Error);
}

TEST(CanonicalJson, Whitespace) {
  EXPECT_EQ(canonical_json(" \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" : { } , \"c\" : [ ] } \n"),
            R"({"a":[1,2],"b":{},"c":[]})");
  EXPECT_EQ(canonical_json("\n\n\"x y\"\t"), "\"x y\"");
}

TEST(CanonicalJson, Literals) {
  EXPECT_EQ(canonical_json("[true, false, null]"), "[true,false,null]");
  EXPECT_EQ(canonical_json("true"), "true");
  EXPECT_EQ(canonical_json("null"), "null");
}

TEST(CanonicalJson, KeysSortByTheirBytes) {
  const Case cases[] = {
      {R"({"b":1,"aa":2,"a":3})", R"({"a":3,"aa":2,"b":1})"},
      {R"({"ab":1,"a":2,"":3})", R"({"":3,"a":2,"ab":1})"},  // a prefix sorts first
      {R"({"a":1,"B":2,"_":3})", R"({"B":2,"_":3,"a":1})"},  // bytes, not case-folded
      {"{\"\xc3\xa9\":1,\"z\":2,\"A\":3}", "{\"A\":3,\"z\":2,\"\xc3\xa9\":1}"},
      // Unsigned bytes: U+007F (0x7F) before U+00E9 (0xC3 0xA9).
      {"{\"\xc3\xa9\":1,\"\\u007f\":2}", "{\"\x7f\":2,\"\xc3\xa9\":1}"},
      // UTF-8 order, not UTF-16: U+FFFF (EF BF BF) before U+10000 (F0 90 80 80).
      {R"({"\ud800\udc00":1,"\uffff":2})", "{\"\xef\xbf\xbf\":2,\"\xf0\x90\x80\x80\":1}"},
      // Decoded bytes, not escaped text: '"' (0x22) before '#' (0x23) before '\' (0x5C).
      {R"({"\\":1,"#":2,"\"":3})", R"({"\"":3,"#":2,"\\":1})"},
      {R"({"\n":1,"\u0001":2," ":3})", R"({"\u0001":2,"\n":1," ":3})"},
      {R"({"x":{"d":1,"c":[{"b":1,"a":2}]}})", R"({"x":{"c":[{"a":2,"b":1}],"d":1}})"},
      {R"({"c":1,"b":2,"a":3})", R"({"a":3,"b":2,"c":1})"},
      {R"({"a":1,"c":2,"b":3})", R"({"a":1,"b":3,"c":2})"},
  };
  expect_all(cases);
}

TEST(CanonicalJson, TheLastDuplicateKeyWins) {
  const Case cases[] = {
      {R"({"k":1,"k":2})", R"({"k":2})"},
      {R"({"a":1,"b":2,"a":3})", R"({"a":3,"b":2})"},
      {R"({"b":1,"a":2,"b":3})", R"({"a":2,"b":3})"},
      {R"({"b":[1],"a":{"y":1,"x":2},"b":{"d":1,"c":2},"a":0})", R"({"a":0,"b":{"c":2,"d":1}})"},
      {R"({"k":1,"k":2,"k":3,"j":0})", R"({"j":0,"k":3})"},
      // Keys are compared decoded: \u0041 is A.
      {R"({"A":1,"\u0041":2})", R"({"A":2})"},
      {R"({"x":{"k":1,"k":{"b":1,"a":2}}})", R"({"x":{"k":{"a":2,"b":1}}})"},
  };
  expect_all(cases);
}

TEST(CanonicalJson, StringEscapes) {
  const Case cases[] = {
      {R"("a\"b\\c")", R"("a\"b\\c")"},
      {R"("\b\t\n\f\r")", R"("\b\t\n\f\r")"},
      {R"("\u0008\u0009\u000a\u000C\u000D")", R"("\b\t\n\f\r")"},
      {R"("\u0022\u005c\u005C")", R"("\"\\\\")"},
      {R"("\u0000")", R"("\u0000")"},
      {R"("\u0001\u001F\u000b\u001e")", R"("\u0001\u001f\u000b\u001e")"},
      {R"("\u0020\u0041")", R"(" A")"},
      {R"("\/ /")", R"("/ /")"},
      {R"("\u007f")", "\"\x7f\""},
      {"\"\x7f\"", "\"\x7f\""},
      {R"("\u00e9\u20AC")", "\"\xc3\xa9\xe2\x82\xac\""},
      {R"("\ud83d\ude00")", "\"\xf0\x9f\x98\x80\""},
      {R"("\uD83D\uDE00")", "\"\xf0\x9f\x98\x80\""},
      {R"("\udbff\udfff")", "\"\xf4\x8f\xbf\xbf\""},
      {"\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"",
       "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""},
      {R"("\u0080\u07ff\u0800\uffff")", "\"\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf\""},
      {R"("")", R"("")"},
  };
  expect_all(cases);
}

TEST(CanonicalJson, EscapesInKeysAreWrittenCanonically) {
  EXPECT_EQ(canonical_json(R"({"\u0061\/\t":1})"), R"({"a/\t":1})");
}

TEST(CanonicalJson, RefusesInvalidText) {
  const std::string cases[] = {
      "",
      " ",
      "[1,]",
      "[,1]",
      "[1,,2]",
      "{\"a\":1,}",
      "{,}",
      "{\"a\" 1}",
      "{\"a\":}",
      "{\"a\"}",
      "{1:2}",
      "{a:1}",
      "{'a':1}",
      "[1 2]",
      "1 2",
      "[1]]",
      "[1] x",
      "{}}",
      "[",
      "{",
      "[[[]]",
      "{\"a\":[}",
      // numbers
      "01",
      "-01",
      "00",
      "+1",
      ".5",
      "1.",
      "1.e5",
      "-",
      "--1",
      "-a",
      "1e",
      "1e+",
      "1E-",
      "1e5.5",
      "0x10",
      "NaN",
      "Infinity",
      "-Infinity",
      // literals
      "tru",
      "nul",
      "True",
      "nulll",
      "truefalse",
      // strings
      "\"abc",
      "\"abc\\\"",
      "\"\\",
      "\"\\x\"",
      "\"\\U0041\"",
      "\"\\u12\"",
      "\"\\u12G4\"",
      "'a'",
      std::string("\"a\tb\""),
      std::string("\"a\nb\""),
      std::string("\"a\x1f\""),
      std::string("\"a\0b\"", 5),
      // surrogates
      "\"\\ud800\"",
      "\"\\udbff\"",
      "\"\\udc00\"",
      "\"\\udfff\\ud800\"",
      "\"\\ud800\\u0041\"",
      "\"\\ud800\\ud800\"",
      "\"\\ud800x\"",
      "\"\\ud800\\\"",
      // UTF-8
      "\"\xff\"",
      "\"\x80\"",
      "\"\xc0\xaf\"",
      "\"\xc1\xbf\"",
      "\"\xe0\x80\xaf\"",
      "\"\xe0\x9f\xbf\"",
      "\"\xed\xa0\x80\"",
      "\"\xf0\x8f\xbf\xbf\"",
      "\"\xf4\x90\x80\x80\"",
      "\"\xf5\x80\x80\x80\"",
      "\"\xe2\x82\"",
      "\"\xe2\x82",
      "\"\xc3\"",
      "\"\xc3\x28\"",
      // whitespace JSON does not allow, and text outside strings
      "\f1",
      "\v1",
      "\xef\xbb\xbf{}",
      "\xc3\xa9",
      "[\xc2\xa0]",
  };
  for (const std::string& c : cases) EXPECT_THROW(canonical_json(c), Error) << c;
}

TEST(CanonicalJson, ErrorsSayWhereTheTextWentWrong) {
  try {
    canonical_json("[1,,2]");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "invalid JSON at offset 3: unexpected character");
  }
}

std::string nested(std::size_t depth, const std::string& open, const std::string& inner,
                   const std::string& close) {
  std::string text;
  text.reserve(depth * (open.size() + close.size()) + inner.size());
  for (std::size_t i = 0; i < depth; i++) text += open;
  text += inner;
  for (std::size_t i = 0; i < depth; i++) text += close;
  return text;
}

TEST(CanonicalJson, DeepNestingNeedsNoCallStack) {
  const std::size_t depth = 100000;
  std::string arrays = nested(depth, "[", "", "]");
  EXPECT_EQ(canonical_json(arrays), arrays);
  std::string objects = nested(depth, "{\"a\":", "1", "}");
  EXPECT_EQ(canonical_json(objects), objects);
  // Every level reordered: the work stays linear.
  EXPECT_EQ(canonical_json(nested(depth, "{\"b\":", "1", ",\"a\":2}")),
            nested(depth, "{\"a\":2,\"b\":", "1", "}"));
  EXPECT_EQ(canonical_json(nested(1000000, "[ ", "0.0", " ]")), nested(1000000, "[", "0", "]"));
}

TEST(CanonicalJson, DeepButUnfinishedTextIsRefused) {
  EXPECT_THROW(canonical_json(std::string(100000, '[')), Error);
  EXPECT_THROW(canonical_json(nested(100000, "{\"a\":", "", "")), Error);
  EXPECT_THROW(canonical_json(nested(100000, "[", "1", "]") + "]"), Error);
}

TEST(CanonicalJson, OutputIsAFixedPoint) {
  const char* inputs[] = {
      R"({"b":[1.0,{"z":null,"y":"\u0002"}],"a":-0.50e2})",
      R"(["x",{"":1,"\u0000":2,"\\":3,"\"":4}])",
      R"({"\ud83d\ude00":"\u00e9\u007f\/","b":{"b":1,"a":2,"b":3}})",
  };
  for (const char* in : inputs) {
    std::string once = canonical_json(in);
    EXPECT_EQ(canonical_json(once), once) << in;
  }
}

}  // namespace
}  // namespace idempotency
