#include "tools/chrome_trace.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace stensor {
namespace {

using json = nlohmann::json;

constexpr char kHeader[] =
    R"({"type":"header","format":1,"pid":77,"devices":[{"ordinal":0,"name":"fake",)"
    R"("total_bytes":1000}],"config":{"STENSOR_MEMORY_LIMIT":"50%","STENSOR_POLICY":"version"}})";

// Two buffers on device 0 (300 and 200 bytes), kernels on two streams, a
// swap-out, a swap-in, a clean drop, a copy, a captured launch, then frees.
std::string SmallLog() {
  return absl::StrCat(
      kHeader, "\n",
      R"j({"type":"alloc","api":"cuMemAlloc_v2","id":1,"addr":"0x1000","bytes":300,"device":0,"kind":"device"})j"
      "\n",
      R"j({"type":"alloc","api":"cuMemAlloc_v2","id":2,"addr":"0x2000","bytes":200,"device":0,"kind":"device"})j"
      "\n",
      R"j({"type":"launch","api":"cuLaunchKernel","kernel":"_Z4stepPf","demangled":"step(float*)","stream":"legacy","reads":[1],"writes":[1],"inferred":true})j"
      "\n",
      R"j({"type":"swap_out","id":1,"bytes":300,"device":0})j"
      "\n",
      R"j({"type":"launch","api":"cuLaunchKernel","kernel":"plain_c","demangled":"","stream":"0xabc","reads":[2],"writes":[2],"inferred":true,"compute_us":55.5})j"
      "\n",
      R"j({"type":"drop_clean","id":2,"bytes":200,"device":0})j"
      "\n",
      R"j({"type":"swap_in","id":1,"bytes":300,"copy":true,"device":0})j"
      "\n",
      R"j({"type":"memcpy","api":"cuMemcpyDtoH_v2","kind":"DtoH","bytes":4,"dst":"0x9","src":"0x1000","reads":[1],"writes":[],"stream":"legacy","async":false})j"
      "\n",
      R"j({"type":"launch","api":"cuLaunchKernel","kernel":"_Z4stepPf","demangled":"step(float*)","stream":"0xabc","reads":[1],"writes":[1],"inferred":true,"captured":true})j"
      "\n",
      R"j({"type":"swap_wait","what":"stream","seconds":0.25})j"
      "\n",
      R"j({"type":"free","api":"cuMemFree_v2","id":1,"addr":"0x1000","bytes":300})j"
      "\n",
      R"j({"type":"free","api":"cuMemFree_v2","id":2,"addr":"0x2000","bytes":200})j"
      "\n",
      R"j({"type":"end","counts":{},"live_buffers":0,"host_pinned_bytes":0,"dropped":0})j"
      "\n");
}

struct Converted {
  absl::StatusOr<ChromeTraceSummary> summary;
  std::string trace;
  std::string progress;
};

Converted Convert(const std::string& log, ChromeTraceOptions options = {}) {
  std::istringstream in(log);
  std::ostringstream out, progress;
  Converted c{WriteChromeTrace(in, "run.jsonl", options, out, progress), "", ""};
  c.trace = out.str();
  c.progress = progress.str();
  return c;
}

std::string ErrorOf(const std::string& log) {
  Converted c = Convert(log);
  return c.summary.ok() ? "ok" : std::string(c.summary.status().message());
}

// The counter's values in order.
std::vector<uint64_t> CounterValues(const json& events, const std::string& name) {
  std::vector<uint64_t> values;
  for (const json& e : events) {
    if (e["ph"] == "C" && e["name"] == name) values.push_back(e["args"]["bytes"]);
  }
  return values;
}

TEST(ChromeTraceTest, TracksSlicesAndCounters) {
  Converted c = Convert(SmallLog());
  ASSERT_TRUE(c.summary.ok()) << c.summary.status();
  EXPECT_TRUE(c.summary->ended);
  EXPECT_EQ(c.summary->lines, 14u);
  const json trace = json::parse(c.trace);
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  EXPECT_NE(trace["otherData"]["clock"].get<std::string>().find("logical"), std::string::npos);
  const json& events = trace["traceEvents"];

  std::map<int, std::string> threads;
  for (const json& e : events) {
    if (e["ph"] == "M" && e["name"] == "thread_name") threads[e["tid"]] = e["args"]["name"];
    if (e["ph"] == "M" && e["name"] == "process_name") {
      EXPECT_EQ(e["args"]["name"], "stensor access log, pid 77");
    }
  }
  int legacy = 0, other = 0, swap = 0;
  for (const auto& [tid, name] : threads) {
    if (name == "stream legacy (default)") legacy = tid;
    if (name == "stream 0xabc") other = tid;
    if (name == "swap (stensor)") swap = tid;
  }
  ASSERT_NE(legacy, 0);
  ASSERT_NE(other, 0);
  ASSERT_NE(swap, 0);

  // Slices in log order on the logical clock: 10 us each, 55.5 for the
  // launch that logged its compute time.
  std::vector<std::string> names;
  std::vector<int> tids;
  std::vector<double> ts, dur;
  for (const json& e : events) {
    if (e["ph"] != "X") continue;
    names.push_back(e["name"]);
    tids.push_back(e["tid"]);
    ts.push_back(e["ts"]);
    dur.push_back(e["dur"]);
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"step(float*)", "swap-out #1", "plain_c", "drop clean #2",
                                      "swap-in #1", "memcpy DtoH", "swap wait (stream)"}));
  EXPECT_EQ(tids, (std::vector<int>{legacy, swap, other, swap, swap, legacy, swap}));
  EXPECT_EQ(ts, (std::vector<double>{0, 10, 20, 75.5, 85.5, 95.5, 105.5}));
  EXPECT_EQ(dur, (std::vector<double>{10, 10, 55.5, 10, 10, 10, 10}));

  // The captured launch is an instant on its stream.
  bool captured = false;
  for (const json& e : events) {
    if (e["ph"] == "i" && e["name"] == "captured: step(float*)") {
      captured = true;
      EXPECT_EQ(e["tid"], other);
    }
  }
  EXPECT_TRUE(captured);

  // The cap is 50 % of the device's 1000 bytes.
  EXPECT_EQ(CounterValues(events, "device 0 cap"), (std::vector<uint64_t>{500, 500}));
  // Resident bytes as the library charges them: these small buffers take a
  // 4 KiB page each (tools/charge.h), so the curve matches STENSOR_STATS.
  EXPECT_EQ(CounterValues(events, "device 0 resident"),
            (std::vector<uint64_t>{0, 4096, 8192, 4096, 0, 4096, 0, 0}));
  EXPECT_EQ(CounterValues(events, "device 0 host copies"),
            (std::vector<uint64_t>{0, 300, 500, 200, 0}));
}

TEST(ChromeTraceTest, NoCapWithoutLimitAndByteCaps) {
  std::string log = SmallLog();
  log.replace(log.find("\"50%\""), 5, "\"\"");
  Converted c = Convert(log);
  ASSERT_TRUE(c.summary.ok());
  EXPECT_TRUE(CounterValues(json::parse(c.trace)["traceEvents"], "device 0 cap").empty());

  log.replace(log.find("\"STENSOR_MEMORY_LIMIT\":\"\""), 25, "\"STENSOR_MEMORY_LIMIT\":\"1KiB\"");
  c = Convert(log);
  ASSERT_TRUE(c.summary.ok());
  EXPECT_EQ(CounterValues(json::parse(c.trace)["traceEvents"], "device 0 cap"),
            (std::vector<uint64_t>{1024, 1024}));

  // A host limit in bytes is drawn; a share of host memory cannot be.
  std::string host = log;
  host.replace(host.find("\"STENSOR_POLICY\""), 0, "\"STENSOR_HOST_LIMIT\":\"2KiB\",");
  c = Convert(host);
  ASSERT_TRUE(c.summary.ok());
  EXPECT_EQ(CounterValues(json::parse(c.trace)["traceEvents"], "host limit"),
            (std::vector<uint64_t>{2048, 2048}));
  host.replace(host.find("2KiB"), 4, "50%");
  c = Convert(host);
  ASSERT_TRUE(c.summary.ok());
  const json trace = json::parse(c.trace);
  EXPECT_TRUE(CounterValues(trace["traceEvents"], "host limit").empty());
  EXPECT_NE(trace["otherData"]["notes"].dump().find("STENSOR_HOST_LIMIT=50%"), std::string::npos);
}

TEST(ChromeTraceTest, TruncatedLogNamesTheLine) {
  const std::string log = SmallLog();
  // Cut in the middle of line 5.
  size_t pos = 0;
  for (int i = 0; i < 4; ++i) pos = log.find('\n', pos) + 1;
  const std::string error = ErrorOf(log.substr(0, pos + 12));
  EXPECT_EQ(error.rfind("run.jsonl:5: not a complete JSON record (the log ends mid-line", 0), 0u)
      << error;
  // A log cut at a line boundary is read (the caller warns of the missing end).
  Converted c = Convert(log.substr(0, pos));
  ASSERT_TRUE(c.summary.ok());
  EXPECT_FALSE(c.summary->ended);
  EXPECT_NO_THROW(json::parse(c.trace));
}

TEST(ChromeTraceTest, ForeignFilesFailOnLineOne) {
  EXPECT_EQ(ErrorOf("").rfind("run.jsonl: empty", 0), 0u);
  EXPECT_EQ(
      ErrorOf("{\n \"traceEvents\": []\n}\n").rfind("run.jsonl:1: not a stensor access log", 0),
      0u);
  EXPECT_EQ(ErrorOf("[1,2]\n").rfind("run.jsonl:1: not a stensor access log", 0), 0u);
  EXPECT_EQ(
      ErrorOf("{\"type\":\"alloc\",\"id\":1}\n").rfind("run.jsonl:1: not a stensor access log", 0),
      0u);
  EXPECT_EQ(ErrorOf("{\"type\":\"header\"}\n").rfind("run.jsonl:1: not a stensor access log", 0),
            0u);
  EXPECT_EQ(ErrorOf("{\"type\":\"header\",\"format\":2}\n"),
            "run.jsonl:1: access log format 2; this stensor reads format 1");
}

TEST(ChromeTraceTest, MalformedRecordsNameTheLine) {
  const std::string head = absl::StrCat(kHeader, "\n");
  EXPECT_EQ(ErrorOf(head + "{\"type\":\"alloc\",\"id\":1,\"bytes\":\"many\"}\n")
                .rfind("run.jsonl:2: a malformed \"alloc\" record: ", 0),
            0u);
  EXPECT_EQ(ErrorOf(head + "[]\n"), "run.jsonl:2: not an access-log record (no \"type\")");
  // Counts are unsigned integers, never converted from other numbers.
  EXPECT_EQ(ErrorOf(head + "{\"type\":\"alloc\",\"id\":1,\"bytes\":1e70}\n"),
            "run.jsonl:2: a malformed \"alloc\" record: \"bytes\" is not a count: 1e+70");
  EXPECT_EQ(ErrorOf(head + "{\"type\":\"swap_in\",\"id\":-1,\"bytes\":4}\n"),
            "run.jsonl:2: a malformed \"swap_in\" record: \"id\" is not a count: -1");
  EXPECT_EQ(ErrorOf(head + "{\"type\":\"x\",\"a\":" + std::string(40, '[') + std::string(40, ']') +
                    "}\n"),
            "run.jsonl:2: not an access-log record (nested over 16 levels deep)");
  EXPECT_EQ(ErrorOf(head + "{\"type\":\"x\",\"a\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\"\"}\n"),
            "ok");
  EXPECT_EQ(ErrorOf(head + head).rfind("run.jsonl:2: a second \"header\"", 0), 0u);
  // Types of a newer library are skipped.
  EXPECT_EQ(ErrorOf(head + "{\"type\":\"future_thing\",\"x\":1}\n"), "ok");
}

TEST(ChromeTraceTest, ReportsProgressOnLargeInputs) {
  const std::string log = SmallLog();
  ChromeTraceOptions options;
  options.input_bytes = log.size();
  options.progress_every = 256;
  Converted c = Convert(log, options);
  ASSERT_TRUE(c.summary.ok());
  EXPECT_NE(c.progress.find("stensor trace: run.jsonl: 0 of 0 MiB read"), std::string::npos);
  EXPECT_GE(std::count(c.progress.begin(), c.progress.end(), '\n'), 2);
  // Small inputs are quiet.
  options.progress_every = 64ull << 20;
  EXPECT_TRUE(Convert(log, options).progress.empty());
  // An input of unknown size is reported on without a total.
  options.input_bytes = 0;
  options.progress_every = 256;
  c = Convert(log, options);
  EXPECT_NE(c.progress.find("stensor trace: run.jsonl: 0 MiB read\n"), std::string::npos);
}

TEST(ChromeTraceTest, FlagErrors) {
  auto error = [](std::vector<std::string> args) {
    absl::StatusOr<TraceFlags> f = ParseTraceFlags(args);
    return f.ok() ? std::string("ok") : std::string(f.status().message());
  };
  EXPECT_EQ(error({"log", "-o", "t.json"}), "ok");
  EXPECT_EQ(error({"-", "--output=-", "--op-us", "2.5"}), "ok");
  EXPECT_EQ(ParseTraceFlags({"log", "-o", "t.json", "--op-us=2.5"})->op_us, 2.5);
  EXPECT_NE(error({"log"}).find("-o FILE is required"), std::string::npos);
  EXPECT_NE(error({"-o", "t.json"}).find("no access log"), std::string::npos);
  EXPECT_NE(error({"a", "b", "-o", "t"}).find("one log only"), std::string::npos);
  EXPECT_NE(error({"log", "-o"}).find("-o needs a value"), std::string::npos);
  EXPECT_NE(error({"log", "-o", "t", "--op-us", "-1"}).find("--op-us '-1'"), std::string::npos);
  EXPECT_NE(error({"log", "-o", "t", "--op-us", "nan"}).find("--op-us"), std::string::npos);
  EXPECT_NE(error({"log", "-o", "t", "--bogus"}).find("unknown flag --bogus"), std::string::npos);

  std::ostringstream out, err;
  EXPECT_EQ(RunTrace({"log"}, out, err), 2);
  EXPECT_NE(err.str().find("usage: stensor trace"), std::string::npos);
  std::ostringstream help_out, help_err;
  EXPECT_EQ(RunTrace({"--help"}, help_out, help_err), 0);
  EXPECT_NE(help_out.str().find("ui.perfetto.dev"), std::string::npos);
}

}  // namespace
}  // namespace stensor
