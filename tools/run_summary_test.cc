#include "tools/run_summary.h"

#include <cstdint>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/report.h"

namespace stensor {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;

std::string Header(const std::string& limit = "") {
  return absl::StrCat(
      R"({"type":"header","format":1,"pid":7,"devices":[{"ordinal":0,"name":"d0","total_bytes":1073741824}],)",
      R"("config":{"STENSOR_MEMORY_LIMIT":")", limit, R"("}})", "\n");
}

std::string Alloc(uint64_t id, uint64_t bytes, int device = 0) {
  return absl::StrCat(R"({"type":"alloc","api":"cuMemAlloc_v2","id":)", id, R"(,"addr":"0x)", id,
                      R"(000","bytes":)", bytes, R"(,"device":)", device, R"(,"kind":"device"})",
                      "\n");
}

std::string Free(uint64_t id) { return absl::StrCat(R"({"type":"free","id":)", id, "}\n"); }

std::string Swap(const std::string& type, uint64_t id, uint64_t bytes, bool copy = true) {
  return absl::StrCat(R"({"type":")", type, R"(","id":)", id, R"(,"bytes":)", bytes,
                      type == "swap_in" ? (copy ? R"(,"copy":true)" : R"(,"copy":false)") : "",
                      R"(,"device":0})", "\n");
}

std::string Launch(const std::string& name, uint64_t reads) {
  return absl::StrCat(R"({"type":"launch","kernel":"k","demangled":")", name, R"(","reads":[)",
                      reads, "]}\n");
}

std::string Wait(double seconds) {
  return absl::StrCat(R"({"type":"swap_wait","what":"buffer","id":1,"seconds":)", seconds, "}\n");
}

constexpr char kEnd[] = R"({"type":"end","counts":{},"live_buffers":0,"dropped":0})"
                        "\n";

absl::StatusOr<RunSummary> Summarize(const std::string& log, SummaryOptions options = {}) {
  std::istringstream in(log);
  return SummarizeLog(in, "test.jsonl", options);
}

TEST(RunSummaryTest, ResidentBytesAreChargesMovedBySwapRecords) {
  // 3 MiB is charged as two granules (4 MiB), 100 bytes as a page.
  const std::string log = Header("0=50%") + Alloc(1, 3 * kMiB) + Alloc(2, 100) +
                          Swap("swap_out", 1, 3 * kMiB) + Launch("k()", 2) +
                          Swap("swap_in", 1, 3 * kMiB) + Swap("drop_clean", 1, 3 * kMiB) +
                          Swap("swap_in", 1, 3 * kMiB, false) + Free(1) + Free(2) + kEnd;
  absl::StatusOr<RunSummary> s = Summarize(log);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->devices.size(), 1u);
  EXPECT_EQ(s->devices[0].peak, 4 * kMiB + 4096);
  EXPECT_EQ(s->devices[0].peak_op, 1u);  // after the second alloc
  EXPECT_EQ(s->devices[0].resident, 0u);
  EXPECT_EQ(s->devices[0].cap, 512 * kMiB);
  EXPECT_EQ(s->operations, 5u);
  EXPECT_EQ(s->swap_out.records, 1u);
  EXPECT_EQ(s->swap_out.bytes, 3 * kMiB);
  EXPECT_EQ(s->swap_in_copy.records, 1u);
  EXPECT_EQ(s->swap_in_no_copy.records, 1u);
  EXPECT_EQ(s->drop_clean.records, 1u);
  EXPECT_EQ(s->inconsistent, 0u);
  ASSERT_EQ(s->top_buffers.size(), 1u);
  EXPECT_EQ(s->top_buffers[0].id, 1u);
  EXPECT_EQ(s->top_buffers[0].moved(), 6 * kMiB);
  EXPECT_EQ(s->top_buffers[0].drops, 1u);
  EXPECT_EQ(s->top_buffers[0].swap_ins, 2u);
}

// Serving from host memory: `serve_host` per buffer and operation (bytes
// over the link), `alloc_host` before the `alloc` of a buffer born in host
// memory, which is charged only once brought in.
TEST(RunSummaryTest, ServingFromHostIsCountedAndBornOnHostIsNotResident) {
  const std::string log =
      Header("0=8MiB") + Alloc(1, 6 * kMiB) +
      R"({"type":"alloc_host","bytes":10485760,"device":0,"cap":8388608})"
      "\n" +
      Alloc(2, 10 * kMiB) + Swap("serve_host", 2, 10 * kMiB) + Launch("k()", 2) +
      Swap("swap_out", 1, 6 * kMiB) + Swap("serve_host", 1, 6 * kMiB) +
      R"({"type":"serve_host","id":2,"bytes":10485760,"device":0,"by_choice":true})"
      "\n" +
      Launch("k()", 1) + Swap("swap_in", 1, 6 * kMiB) + Free(1) + Free(2) + kEnd;
  absl::StatusOr<RunSummary> s = Summarize(log);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->served_from_host.records, 3u);
  EXPECT_EQ(s->served_from_host.bytes, 26 * kMiB);
  EXPECT_EQ(s->buffers_served, 2u);
  EXPECT_EQ(s->served_by_choice, 1u);
  EXPECT_EQ(s->born_on_host.records, 1u);
  EXPECT_EQ(s->born_on_host.bytes, 10 * kMiB);
  EXPECT_EQ(s->devices[0].peak, 6 * kMiB);  // buffer 2 never resident
  EXPECT_EQ(s->devices[0].resident, 0u);
  EXPECT_EQ(s->inconsistent, 0u);
  const std::string html = ReportHtml(*s, 10);
  EXPECT_THAT(html,
              HasSubstr("2 buffers served from host memory (26.0 MiB reached over the link)"));
  EXPECT_THAT(html, HasSubstr("serve_host"));
  EXPECT_THAT(html, HasSubstr("served by choice"));
  EXPECT_THAT(html, HasSubstr("alloc_host"));
}

TEST(RunSummaryTest, NoCapWhenUnsetOrForAnotherDevice) {
  absl::StatusOr<RunSummary> s = Summarize(Header() + Alloc(1, kMiB) + kEnd);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->devices[0].cap);
  s = Summarize(Header("1=8GiB") + Alloc(1, kMiB) + kEnd);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->devices[0].cap);
  s = Summarize(Header("29968KiB") + Alloc(1, kMiB) + kEnd);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices[0].cap, 30687232u);
}

TEST(RunSummaryTest, WaitsAreChargedToTheNextLaunch) {
  const std::string log = Header() + Alloc(1, kMiB) + Wait(0.5) + Wait(0.25) +
                          Launch("f<int&>()", 1) + Launch("g()", 1) + Wait(1) + Launch("g()", 1) +
                          Wait(2) + kEnd;
  absl::StatusOr<RunSummary> s = Summarize(log);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->kernels.size(), 3u);
  EXPECT_EQ(s->kernels[0].name, "f<int&>()");
  EXPECT_EQ(s->kernels[0].waits, 2u);
  EXPECT_DOUBLE_EQ(s->kernels[0].wait_seconds, 0.75);
  EXPECT_EQ(s->kernels[1].name, "g()");
  EXPECT_EQ(s->kernels[1].launches, 2u);
  EXPECT_DOUBLE_EQ(s->kernels[1].wait_seconds, 1);
  EXPECT_EQ(s->kernels[2].name, "(no launch after the wait)");
  EXPECT_DOUBLE_EQ(s->kernels[2].wait_seconds, 2);
  EXPECT_EQ(s->swap_waits.at("buffer").first, 4u);
  EXPECT_DOUBLE_EQ(s->swap_waits.at("buffer").second, 3.75);
}

TEST(RunSummaryTest, TopBuffersKeepTheLargestMoversAmongManyFreed) {
  SummaryOptions options;
  options.top = 3;
  std::string log = Header();
  // Buffer i moves i swap-outs of 2 MiB; all but the last are freed.
  for (uint64_t id = 1; id <= 200; ++id) {
    log += Alloc(id, 2 * kMiB);
    for (uint64_t k = 0; k < id % 50 + 1; ++k) {
      log += Swap("swap_out", id, 2 * kMiB) + Swap("swap_in", id, 2 * kMiB, false);
    }
    if (id != 200) log += Free(id);
  }
  absl::StatusOr<RunSummary> s = Summarize(log + kEnd, options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->top_buffers.size(), 3u);
  // 49, 99, 149 and 199 moved 50 each: the lower ids first.
  EXPECT_EQ(s->top_buffers[0].id, 49u);
  EXPECT_EQ(s->top_buffers[1].id, 99u);
  EXPECT_EQ(s->top_buffers[2].id, 149u);
  EXPECT_EQ(s->top_buffers[0].moved(), 100 * kMiB);
}

TEST(RunSummaryTest, LongLogsAreBucketedKeepingPeaksAndTotals) {
  std::string log = Header();
  uint64_t out_bytes = 0;
  for (uint64_t id = 1; id <= 2500; ++id) {
    // One 64 MiB spike at id 1234, otherwise 2 MiB.
    const uint64_t bytes = id == 1234 ? 64 * kMiB : 2 * kMiB;
    log += Alloc(id, bytes) + Swap("swap_out", id, bytes) + Free(id);
    out_bytes += bytes;
  }
  absl::StatusOr<RunSummary> s = Summarize(log + kEnd);
  ASSERT_TRUE(s.ok()) << s.status();
  const ResidentTimeline& t = s->timeline;
  EXPECT_EQ(s->operations, 5000u);
  EXPECT_EQ(t.width(), 4u);
  EXPECT_EQ(t.buckets(), 1250u);
  uint64_t max = 0, out = 0;
  for (size_t b = 0; b < t.buckets(); ++b) {
    max = std::max(max, t.Get(b, 0).max_resident);
    out += t.Get(b, 0).bytes_out;
  }
  EXPECT_EQ(max, 64 * kMiB);
  EXPECT_EQ(t.Get((1233 * 2) / 4, 0).max_resident, 64 * kMiB);
  EXPECT_EQ(out, out_bytes);
  EXPECT_EQ(s->devices[0].peak, 64 * kMiB);
}

TEST(RunSummaryTest, ErrorsNameTheFileAndTheLine) {
  absl::StatusOr<RunSummary> s = Summarize(R"({"type":"alloc","id":1,"bytes":1})"
                                           "\n");
  EXPECT_THAT(s.status().message(), HasSubstr("test.jsonl: line 1: not a stensor access log"));
  s = Summarize("");
  EXPECT_THAT(s.status().message(), HasSubstr("test.jsonl: line 1: an empty file"));
  s = Summarize(Header() + Alloc(1, kMiB) + R"({"type":"free","id")");
  EXPECT_THAT(s.status().message(), HasSubstr("test.jsonl: line 3: not a JSON record"));
  s = Summarize(Header() + Alloc(1, kMiB) + Alloc(1, kMiB) + kEnd);
  EXPECT_THAT(s.status().message(), HasSubstr("line 3: buffer 1 allocated twice"));
  s = Summarize(Header() + Free(4) + kEnd);
  EXPECT_THAT(s.status().message(), HasSubstr("line 2: a `free` of buffer 4, never allocated"));
  s = Summarize(Header() + kEnd + Alloc(1, kMiB));
  EXPECT_THAT(s.status().message(), HasSubstr("line 3: a record after the `end` record"));
  s = Summarize(absl::StrCat(R"({"type":"header","format":2})", "\n", kEnd));
  EXPECT_THAT(s.status().message(), HasSubstr("line 1: access-log format 2"));
  s = Summarize(Header() + Alloc(1, kMiB, 64) + kEnd);
  EXPECT_THAT(s.status().message(), HasSubstr("line 2: device 64 is out of range 0..63"));
  s = Summarize(Header() + Alloc(1, uint64_t{1} << 61) + kEnd);
  EXPECT_THAT(s.status().message(), HasSubstr("line 2: `alloc` of more than 2^60 bytes"));
  s = Summarize(Header("lots") + kEnd);
  EXPECT_THAT(s.status().message(), HasSubstr("line 1: STENSOR_MEMORY_LIMIT 'lots'"));

  const std::string cut = Header() + Alloc(1, kMiB) + Launch("k()", 1);
  s = Summarize(cut);
  EXPECT_THAT(s.status().message(),
              HasSubstr("test.jsonl: line 3: the log ends without its `end`"));
  SummaryOptions partial;
  partial.partial = true;
  s = Summarize(cut, partial);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->ended);
  EXPECT_EQ(s->launches, 1u);
}

TEST(RunSummaryTest, OutOfOrderSwapRecordsAreCountedNotFatal) {
  const std::string log =
      Header() + Swap("swap_out", 9, kMiB) + Alloc(1, kMiB) + Swap("swap_in", 1, kMiB) + kEnd;
  absl::StatusOr<RunSummary> s = Summarize(log);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->inconsistent, 2u);
  EXPECT_EQ(s->swap_out.records, 1u);
  EXPECT_EQ(s->devices[0].resident, 2 * kMiB);  // half a granule: a whole one (tools/charge.h)
}

}  // namespace
}  // namespace stensor
