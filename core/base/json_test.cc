// The access log's JSON writer: every string stensor logs (kernel names,
// paths, device names) must leave the line valid JSON, whatever its bytes.
#include "core/base/json.h"

#include <string>

#include "gtest/gtest.h"

namespace stensor {
namespace {

std::string Quoted(std::string_view value) {
  std::string out;
  AppendJsonString(&out, value);
  return out;
}

TEST(AppendJsonStringTest, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(Quoted(""), "\"\"");
  EXPECT_EQ(Quoted("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(Quoted("\n\t\r"), "\"\\u000a\\u0009\\u000d\"");
  EXPECT_EQ(Quoted(std::string("x\0y", 3)), "\"x\\u0000y\"");
  EXPECT_EQ(Quoted("\x1f\x7f"), "\"\\u001f\\u007f\"");
}

TEST(AppendJsonStringTest, KeepsValidUtf8) {
  EXPECT_EQ(Quoted("caf\xc3\xa9"), "\"caf\xc3\xa9\"");            // U+00E9
  EXPECT_EQ(Quoted("\xe2\x82\xac"), "\"\xe2\x82\xac\"");          // U+20AC
  EXPECT_EQ(Quoted("\xf0\x9f\x98\x80"), "\"\xf0\x9f\x98\x80\"");  // U+1F600
  EXPECT_EQ(Quoted("\xf4\x8f\xbf\xbf"), "\"\xf4\x8f\xbf\xbf\"");  // U+10FFFF
}

TEST(AppendJsonStringTest, ReplacesInvalidUtf8ByteByByte) {
  EXPECT_EQ(Quoted("\xff"), "\"\\ufffd\"");
  EXPECT_EQ(Quoted("\x80z"), "\"\\ufffdz\"");                      // a lone continuation
  EXPECT_EQ(Quoted("\xc3"), "\"\\ufffd\"");                        // cut short at the end
  EXPECT_EQ(Quoted("\xc0\xaf"), "\"\\ufffd\\ufffd\"");             // overlong '/'
  EXPECT_EQ(Quoted("\xe0\x80\xaf"), "\"\\ufffd\\ufffd\\ufffd\"");  // overlong
  EXPECT_EQ(Quoted("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // a surrogate
  EXPECT_EQ(Quoted("\xf4\x90\x80\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");  // > U+10FFFF
}

TEST(JsonLineTest, BuildsOneObject) {
  JsonLine line;
  line.Str("name", "k\xff").Int("i", -3).Uint("u", 7).Bool("b", true);
  EXPECT_EQ(line.Finish(), "{\"name\":\"k\\ufffd\",\"i\":-3,\"u\":7,\"b\":true}");
}

}  // namespace
}  // namespace stensor
