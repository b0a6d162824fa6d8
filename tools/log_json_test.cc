#include "tools/log_json.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace stensor {
namespace {

using Json = nlohmann::ordered_json;

TEST(LogJsonTest, ReadsALogRecord) {
  LogLine<Json> v = ParseLogLine<Json>(
      R"({"type":"alloc","id":18446744073709551615,"addr":"0x7f\u00e9\n","ok":true,)"
      R"("x":-1.5e2,"list":[1,[2],{}],"none":null})");
  ASSERT_TRUE(v.ok()) << v.error->ToStatus();
  const Json& r = v.record;
  EXPECT_EQ(r["type"], "alloc");
  ASSERT_TRUE(r["id"].is_number_unsigned());
  EXPECT_EQ(r["id"].get<uint64_t>(), 18446744073709551615ull);  // exact, not via double
  EXPECT_EQ(r["addr"], "0x7f\xc3\xa9\n");
  EXPECT_EQ(r["ok"], true);
  EXPECT_EQ(r["x"].get<double>(), -150.0);
  EXPECT_FALSE(r["x"].is_number_unsigned());
  EXPECT_EQ(r["list"].dump(), "[1,[2],{}]");
  EXPECT_TRUE(r["none"].is_null());
  EXPECT_TRUE(v.left_out.empty());
}

TEST(LogJsonTest, RejectsBrokenText) {
  for (const char* bad : {"", "{", R"({"a":})", R"({"a":1,})", R"({"a":1} x)", R"(["a)",
                          R"({"a":tru})", R"({"a":"\q"})", "[1 2]", R"({"a":01e})", "-",
                          R"({"a":1e999})", "[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]"}) {
    LogLine<Json> v = ParseLogLine<Json>(bad);
    ASSERT_FALSE(v.ok()) << "accepted: " << bad;
    EXPECT_LE(v.error->offset, std::string(bad).size()) << bad;
    EXPECT_NE(std::string(v.error->ToStatus().message()).find("offset"), std::string::npos);
  }
  // Nesting is bounded rather than recursing without limit.
  LogLine<Json> deep = ParseLogLine<Json>(std::string(100000, '['));
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.error->kind, LogJsonError::Kind::kTooDeep);
  EXPECT_EQ(deep.error->offset, 16u);
  EXPECT_EQ(ParseLogLine<Json>(R"({"a":1e999})").error->ToStatus().message(),
            "JSON: number overflow parsing '1e999' at offset 5");
  EXPECT_EQ(ParseLogLine<Json>(R"({"a":1} x)").error->kind, LogJsonError::Kind::kSyntax);
  EXPECT_EQ(ParseLogLine<Json>(R"({"a":1} x)").error->offset, 8u);
}

// Members keep their order in the text; unsigned integers past 2^53 stay
// exact; negative and fractional numbers have no unsigned value.
TEST(LogJsonTest, KeepsOrderAndExactIntegers) {
  LogLine<Json> v = ParseLogLine<Json>(R"({"z":1,"a":9007199254740993,"m":-1,"f":2.5})");
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v.record.size(), 4u);
  EXPECT_EQ(v.record.begin().key(), "z");
  EXPECT_EQ(v.record["a"].get<uint64_t>(), 9007199254740993ull);
  EXPECT_FALSE(v.record["m"].is_number_unsigned());
  EXPECT_FALSE(v.record["f"].is_number_unsigned());
  EXPECT_EQ(v.record["f"].get<double>(), 2.5);
}

// A list of millions of ids is no DOM of millions of values: the record keeps
// the first kMaxLogJsonElements, counts the rest, and the visitor sees all.
TEST(LogJsonTest, LongListsAreCutAndVisited) {
  constexpr uint64_t kIds = 100000;
  std::string text = R"({"type":"launch","reads":[)";
  for (uint64_t i = 0; i < kIds; ++i) absl::StrAppend(&text, i == 0 ? "" : ",", i);
  absl::StrAppend(&text, R"(],"writes":[7],"grid":[[1,2],{"a":3}],"config":{)");
  for (size_t i = 0; i < kMaxLogJsonElements + 5; ++i) {
    absl::StrAppend(&text, i == 0 ? "" : ",", "\"k", i, "\":", i);
  }
  absl::StrAppend(&text, "}}");
  std::vector<std::pair<std::string, std::string>> seen;
  uint64_t reads = 0, sum = 0;
  LogArrayVisitor<Json> visit = [&](absl::string_view member, const Json& element) {
    if (member == "reads") {
      ++reads;
      sum += element.get<uint64_t>();
      return;
    }
    seen.emplace_back(std::string(member), element.dump());
  };
  LogLine<Json> v = ParseLogLine<Json>(text, visit);
  ASSERT_TRUE(v.ok()) << v.error->ToStatus();
  EXPECT_EQ(reads, kIds);
  EXPECT_EQ(sum, kIds * (kIds - 1) / 2);
  // Elements of other array members too; a nested one comes empty.
  EXPECT_EQ(seen, (std::vector<std::pair<std::string, std::string>>{
                      {"writes", "7"}, {"grid", "[]"}, {"grid", "{}"}}));
  ASSERT_EQ(v.record["reads"].size(), kMaxLogJsonElements);
  EXPECT_EQ(v.record["reads"].back(), kMaxLogJsonElements - 1);
  EXPECT_EQ(v.record["grid"].dump(), R"([[1,2],{"a":3}])");  // nested: built, not visited
  EXPECT_EQ(v.record["config"].size(), kMaxLogJsonElements);
  EXPECT_EQ(v.left_out, (std::vector<std::pair<std::string, uint64_t>>{
                            {"reads", kIds - kMaxLogJsonElements}, {"config", 5}}));
}

// The record itself keeps every member, and what is cut below one is
// skipped whole.
TEST(LogJsonTest, CutsBelowTheRecordOnly) {
  std::string text = "{";
  for (size_t i = 0; i < kMaxLogJsonElements + 10; ++i) {
    absl::StrAppend(&text, i == 0 ? "" : ",", "\"m", i, "\":", i);
  }
  absl::StrAppend(&text, R"(,"type":"x","list":[)");
  for (size_t i = 0; i < kMaxLogJsonElements; ++i) absl::StrAppend(&text, i, ",");
  absl::StrAppend(&text, R"([1,[2,{"b":[3]}]],9]})");
  LogLine<nlohmann::json> v = ParseLogLine<nlohmann::json>(text);
  ASSERT_TRUE(v.ok()) << v.error->ToStatus();
  EXPECT_EQ(v.record.size(), kMaxLogJsonElements + 12);
  EXPECT_EQ(v.record["type"], "x");
  EXPECT_EQ(v.record["list"].size(), kMaxLogJsonElements);
  EXPECT_EQ(v.left_out, (std::vector<std::pair<std::string, uint64_t>>{{"list", 2}}));
  // A top-level array is cut like any other.
  std::string array = "[";
  for (size_t i = 0; i < 3 * kMaxLogJsonElements; ++i) absl::StrAppend(&array, i ? "," : "", i);
  LogLine<Json> a = ParseLogLine<Json>(array + "]");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.record.size(), kMaxLogJsonElements);
  EXPECT_EQ(a.left_out,
            (std::vector<std::pair<std::string, uint64_t>>{{"", 2 * kMaxLogJsonElements}}));
}

// A member named twice keeps its last value, as nlohmann's own parser does.
TEST(LogJsonTest, LastOfARepeatedMemberWins) {
  LogLine<Json> v = ParseLogLine<Json>(R"({"a":[1,2],"a":{"b":1},"a":"c"})");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v.record.dump(), R"({"a":"c"})");
}

}  // namespace
}  // namespace stensor
