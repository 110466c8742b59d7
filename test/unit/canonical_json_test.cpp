#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "core/canonical_json.hpp"

using idempotency::canonical_json;

TEST(CanonicalJson, SpecExamples) {
  EXPECT_EQ(canonical_json(R"({"b":1,"a":[1.50,"x"]})"), R"({"a":[1.5,"x"],"b":1})");
  EXPECT_EQ(canonical_json("1e3"), "1000");
  EXPECT_EQ(canonical_json("-0"), "0");
  EXPECT_EQ(canonical_json("1.50"), "1.5");
}

TEST(CanonicalJson, Whitespace) {
  EXPECT_EQ(canonical_json(" \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" : { } } \n"),
            R"({"a":[1,2],"b":{}})");
}

TEST(CanonicalJson, Numbers) {
  struct {
    const char* in;
    const char* out;
  } cases[] = {
      {"0", "0"},           {"-0.0e5", "0"},          {"0.000", "0"},
      {"100", "100"},       {"-12.340", "-12.34"},    {"1.5e-3", "0.0015"},
      {"12e-1", "1.2"},     {"1E+2", "100"},          {"0.1", "0.1"},
      {"-0.001", "-0.001"}, {"123.456e1", "1234.56"}, {"5e0", "5"},
      {"10.0", "10"},       {"0.5e1", "5"},           {"-7", "-7"},
      {"1e-1", "0.1"},
  };
  for (const auto& c : cases) EXPECT_EQ(canonical_json(c.in), c.out) << c.in;
}

TEST(CanonicalJson, KeysSortByBytesAndTheLastDuplicateWins) {
  EXPECT_EQ(canonical_json(R"({"b":1,"aa":2,"a":3})"), R"({"a":3,"aa":2,"b":1})");
  EXPECT_EQ(canonical_json(R"({"é":1,"z":2,"A":3})"), R"({"A":3,"z":2,"é":1})");
  EXPECT_EQ(canonical_json(R"({"k":1,"k":2})"), R"({"k":2})");
  EXPECT_EQ(canonical_json(R"({"x":{"d":1,"c":[{"b":1,"a":2}]}})"),
            R"({"x":{"c":[{"a":2,"b":1}],"d":1}})");
}

TEST(CanonicalJson, StringEscapes) {
  EXPECT_EQ(canonical_json(R"("a\"b\\c")"), R"("a\"b\\c")");
  EXPECT_EQ(canonical_json(R"("\b\t\n\f\r")"), R"("\b\t\n\f\r")");
  EXPECT_EQ(canonical_json(R"("\u0001\u001F\u0000")"), R"("\u0001\u001f\u0000")");
  EXPECT_EQ(canonical_json(R"("\/ / \u007f")"), "\"/ / \x7f\"");
  EXPECT_EQ(canonical_json(R"("\u00e9\u20ac")"), "\"\xc3\xa9\xe2\x82\xac\"");
  EXPECT_EQ(canonical_json(R"("\ud83d\ude00")"), "\"\xf0\x9f\x98\x80\"");
  EXPECT_EQ(canonical_json("\"caf\xc3\xa9\""), "\"caf\xc3\xa9\"");
}

TEST(CanonicalJson, Literals) {
  EXPECT_EQ(canonical_json("[true,false,null]"), "[true,false,null]");
  EXPECT_EQ(canonical_json("[]"), "[]");
  EXPECT_EQ(canonical_json("{}"), "{}");
}

TEST(CanonicalJson, RefusesInvalidText) {
  const char* cases[] = {
      "",
      "[1,]",
      "{\"a\":1,}",
      "01",
      "+1",
      ".5",
      "1.",
      "1e",
      "\"abc",
      "[1 2]",
      "{\"a\" 1}",
      "{1:2}",
      "tru",
      "nul",
      "[1]]",
      "[1] x",
      "\"\\x\"",
      "\"\\ud800\"",
      "\"\\udc00\"",
      "\"\\ud800\\u0041\"",
      "\"\xff\"",
      "\"\xc0\xaf\"",
      "\"\xed\xa0\x80\"",
      "\"\xf4\x90\x80\x80\"",
      "\"\xe2\x82\"",
      "[",
      "{",
      "\"a\tb\"",
      "1e999999999",
  };
  for (const char* c : cases) EXPECT_THROW(canonical_json(c), std::invalid_argument) << c;
}

TEST(CanonicalJson, DeepNestingNeedsNoCallStack) {
  const std::size_t depth = 100000;
  std::string deep(depth, '[');
  deep.append(depth, ']');
  EXPECT_EQ(canonical_json(deep), deep);
  std::string objects;
  for (std::size_t i = 0; i < depth; i++) objects += "{\"a\":";
  objects += "1";
  objects.append(depth, '}');
  EXPECT_EQ(canonical_json(objects), objects);
}

TEST(CanonicalJson, OutputIsAFixedPoint) {
  const char* inputs[] = {R"({"b":[1.0,{"z":null,"y":"\u0002"}],"a":-0.50e2})",
                          R"(["x",{"":1,"\u0000":2}])"};
  for (const char* in : inputs) {
    std::string once = canonical_json(in);
    EXPECT_EQ(canonical_json(once), once) << in;
  }
}
