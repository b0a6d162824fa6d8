#include "tools/json_reader.h"

#include <string>

#include "gtest/gtest.h"

namespace stensor {
namespace {

TEST(JsonReaderTest, ReadsALogRecord) {
  absl::StatusOr<JsonValue> v = ParseJson(
      R"({"type":"alloc","id":18446744073709551615,"addr":"0x7f\u00e9\n","ok":true,)"
      R"("x":-1.5e2,"list":[1,[2],{}],"none":null})");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->StringOr("type", ""), "alloc");
  EXPECT_EQ(v->Uint("id"), 18446744073709551615ull);  // exact, not via double
  EXPECT_EQ(v->StringOr("addr", ""), "0x7f\xc3\xa9\n");
  EXPECT_TRUE(v->BoolOr("ok", false));
  EXPECT_EQ(v->Number("x"), -150.0);
  EXPECT_FALSE(v->Uint("x").has_value());  // negative: no exact unsigned
  ASSERT_NE(v->Find("list"), nullptr);
  EXPECT_EQ(v->Find("list")->array.size(), 3u);
  EXPECT_EQ(v->Find("none")->kind, JsonValue::Kind::kNull);
  EXPECT_EQ(v->Find("missing"), nullptr);
  EXPECT_EQ(v->StringOr("missing", "fallback"), "fallback");
}

TEST(JsonReaderTest, RejectsBrokenText) {
  for (const char* bad : {"", "{", R"({"a":})", R"({"a":1,})", R"({"a":1} x)", R"(["a)",
                          R"({"a":tru})", R"({"a":"\q"})", "[1 2]", R"({"a":01e})", "-",
                          R"({"a":1e999})", "[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]"}) {
    absl::StatusOr<JsonValue> v = ParseJson(bad);
    EXPECT_FALSE(v.ok()) << "accepted: " << bad;
    if (!v.ok()) {
      EXPECT_NE(std::string(v.status().message()).find("offset"), std::string::npos);
    }
  }
  // Nesting is bounded rather than recursing without limit.
  EXPECT_FALSE(ParseJson(std::string(100000, '[')).ok());
  EXPECT_EQ(ParseJson(R"({"a":1e999})").status().message(),
            "JSON: number overflow parsing '1e999' at offset 5");
}

// Members keep their order in the text; unsigned integers past 2^53 stay
// exact; negative and fractional numbers have no unsigned value.
TEST(JsonReaderTest, KeepsOrderAndExactIntegers) {
  absl::StatusOr<JsonValue> v = ParseJson(R"({"z":1,"a":9007199254740993,"m":-1,"f":2.5})");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->object.size(), 4u);
  EXPECT_EQ(v->object[0].first, "z");
  EXPECT_EQ(v->object[3].first, "f");
  EXPECT_EQ(v->Uint("a"), 9007199254740993ull);
  EXPECT_FALSE(v->Uint("m").has_value());
  EXPECT_FALSE(v->Uint("f").has_value());
  EXPECT_EQ(v->Number("f"), 2.5);
}

}  // namespace
}  // namespace stensor
