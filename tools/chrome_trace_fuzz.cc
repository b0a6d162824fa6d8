// Fuzz target for `stensor trace` (tools/chrome_trace.h, WriteChromeTrace).
//
// Input: the bytes are a log. Checked on every input: WriteChromeTrace
// returns (no exception escapes, nothing aborts); an error is one printable
// line that names the log and a line of it ("fuzz.jsonl:N: ", N within the
// text, or "fuzz.jsonl: empty"); a trace is one JSON object whose
// traceEvents each have a phase and a pid, whose complete events have a
// numeric ts and dur, both at least 0, in clock order, and whose counters
// have a numeric `bytes`.
// Built with STENSOR_FUZZ_SCALE, the input describes a log of scale instead
// (tools/log_generator.h, ScaleLogFromBytes: long, many buffers live, a
// launch of up to 263,164 reads), converted on a 128 KiB stack; the
// wide launch's slice keeps kMaxLogJsonElements reads and counts the rest.
// A broken check aborts, which libFuzzer and fuzz_main.cc report as a crash.
//
// Built by //tools:chrome_trace_fuzz (and _scale) with tests/support/fuzz_main.cc as
// a bounded regression test, and by `scripts/fuzz.sh chrome_trace`
// (chrome_trace_scale) with libFuzzer.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tests/support/fuzz_target.h"
#include "tools/chrome_trace.h"
#include "tools/log_generator.h"
#include "tools/log_json.h"

namespace stensor {
namespace {

using json = nlohmann::json;

void Require(bool condition, absl::string_view what, absl::string_view detail) {
  if (condition) return;
  const size_t shown = std::min<size_t>(detail.size(), 800);
  std::fprintf(stderr, "chrome_trace_fuzz: %.*s\n  %.*s\n", static_cast<int>(what.size()),
               what.data(), static_cast<int>(shown), detail.data());
  std::abort();
}

void CheckError(absl::string_view text, absl::string_view message) {
  Require(message.find('\n') == absl::string_view::npos, "error of more than one line", message);
  for (char c : message) {
    Require(static_cast<unsigned char>(c) >= 0x20, "unprintable byte in an error", message);
  }
  constexpr absl::string_view kName = "fuzz.jsonl";
  Require(message.substr(0, kName.size()) == kName, "error does not name the log", message);
  absl::string_view rest = message.substr(kName.size());
  if (rest == ": empty: not a stensor access log") {
    Require(text.empty(), "an input with bytes called empty", message);
    return;
  }
  Require(!rest.empty() && rest[0] == ':', "error without a line number", message);
  const size_t colon = rest.find(':', 1);
  Require(colon != absl::string_view::npos, "error without a line number", message);
  uint64_t line = 0;
  Require(absl::SimpleAtoi(rest.substr(1, colon - 1), &line), "line number not a number", message);
  const uint64_t lines = std::count(text.begin(), text.end(), '\n') + 1;
  Require(line >= 1 && line <= lines, "line number outside the text", message);
}

void CheckTrace(absl::string_view text, const std::string& trace) {
  json t;
  try {
    t = json::parse(trace);
  } catch (const json::exception& e) {
    Require(false, absl::StrCat("the trace is not JSON: ", e.what()), trace);
  }
  Require(t.is_object() && t.contains("traceEvents") && t["traceEvents"].is_array() &&
              t.contains("displayTimeUnit"),
          "no traceEvents or displayTimeUnit", trace);
  double last = 0;
  for (const json& e : t["traceEvents"]) {
    Require(e.is_object() && e.contains("ph") && e["ph"].is_string() && e.contains("pid"),
            "an event without ph or pid", e.dump());
    if (e["ph"] == "X") {
      Require(e["ts"].is_number() && e["dur"].is_number(), "ts or dur not a number", e.dump());
      const double ts = e["ts"], dur = e["dur"];
      Require(ts >= 0 && dur >= 0, "ts or dur below 0", e.dump());
      Require(ts >= last, "slices out of clock order", e.dump());
      last = ts;
    } else if (e["ph"] == "C") {
      Require(e["args"]["bytes"].is_number_unsigned(), "a counter without bytes", e.dump());
    }
  }
  (void)text;
}

// A log of scale (STENSOR_FUZZ_SCALE, tools/log_generator.h): the trace
// is checked as any other; unspliced, the wide launch's slice shows the
// first kMaxLogJsonElements reads and counts the rest as not shown.
void CheckScale(absl::string_view data) {
  const ScaleLog log = ScaleLogFromBytes(data);
  std::istringstream in(log.text);
  std::ostringstream out, progress;
  ChromeTraceOptions options;
  options.input_bytes = log.text.size();
  absl::StatusOr<ChromeTraceSummary> summary =
      WriteChromeTrace(in, "fuzz.jsonl", options, out, progress);
  if (!summary.ok()) {
    CheckError(log.text, summary.status().message());
    return;
  }
  CheckTrace(log.text, out.str());
  if (log.spliced || log.spec.shape != GeneratedLog::Shape::kWide) return;
  const json t = json::parse(out.str());
  bool seen = false;
  for (const json& e : t["traceEvents"]) {
    if (e.value("cat", "") != "kernel") continue;
    const json& args = e["args"];
    const uint64_t shown = std::min<uint64_t>(log.spec.reads, kMaxLogJsonElements);
    Require(args["reads"].size() == shown, "the wide launch shows other reads", args.dump());
    Require(log.spec.reads <= shown ? !args.contains("reads_not_shown")
                                    : args["reads_not_shown"] == log.spec.reads - shown,
            "the reads not shown are miscounted", args.dump());
    seen = true;
  }
  Require(seen, "no slice for the wide launch", "");
}

}  // namespace

namespace fuzz {
namespace {

const char kHeader[] =
    R"j({"type":"header","format":1,"pid":19719,"devices":[{"ordinal":0,"name":"fakecuda device 0","total_bytes":17179869184}],"config":{"STENSOR_MEMORY_LIMIT": "40%", "STENSOR_HOST_LIMIT": "1GiB", "STENSOR_POLICY": "version", "STENSOR_PREFETCH": true}})j";

// Records as the library writes them.
const char* const kRecords[] = {
    R"j({"type":"alloc","api":"cuMemAlloc_v2","id":1,"addr":"0x7f425f800000","bytes":4194304,"device":0,"kind":"device"})j",
    R"j({"type":"alloc","api":"cuMemAlloc_v2","id":0,"addr":"0x7f4261300000","bytes":4096,"device":1,"kind":"device"})j",
    R"j({"type":"host_alloc","api":"cuMemAllocHost_v2","addr":"0x7f0000000000","bytes":8192})j",
    R"j({"type":"launch","api":"cuLaunchKernel","kernel":"_ZN3mlp11synth_shardEPfPiiiiijf","demangled":"mlp::synth_shard(float*, int*, int, int, int, int, unsigned int, float)","stream":"legacy","grid":[4096,1,1],"block":[256,1,1],"reads":[1],"writes":[1],"inferred":true,"tables":[],"unknown_tables":false,"compute_us":12.5})j",
    R"j({"type":"launch","api":"cuLaunchKernel_ptsz","kernel":"k","demangled":"","stream":"per_thread","reads":[],"writes":[],"inferred":false,"captured":true})j",
    R"j({"type":"memcpy","api":"cuMemcpyDtoHAsync_v2","kind":"DtoH","bytes":4,"dst":"0x7ffc028a90f0","src":"0x7f4261300000","reads":[0],"writes":[],"stream":"0x555808da49d0","async":true})j",
    R"j({"type":"memset","api":"cuMemsetD32_v2","bytes":4096,"dst":"0x7f4261300000","writes":[0],"stream":"legacy","async":false})j",
    R"j({"type":"sync","api":"cuStreamSynchronize","stream":"0x555808da49d0"})j",
    R"j({"type":"sync","api":"cuCtxSynchronize"})j",
    R"j({"type":"graph_instantiate","graph":"0x1","nodes":3,"inferred":true})j",
    R"j({"type":"graph_launch","api":"cuGraphLaunch","graph":"0x1","stream":"legacy","inferred":false})j",
    R"j({"type":"swap_out","id":1,"bytes":4194304,"device":0})j",
    R"j({"type":"evict_wait","id":1,"seconds":0.001})j",
    R"j({"type":"swap_wait","what":"buffer","id":1,"seconds":0.5})j",
    R"j({"type":"swap_in","id":1,"bytes":4194304,"copy":true,"device":0})j",
    R"j({"type":"drop_clean","id":1,"bytes":4194304,"device":0})j",
    R"j({"type":"drop_unwritten","id":1,"bytes":4194304,"device":0})j",
    R"j({"type":"oom","device":0,"bytes":1,"used":2,"cap":3})j",
    R"j({"type":"pin","api":"cuIpcGetMemHandle","id":1,"bytes":4194304,"device":0})j",
    R"j({"type":"free","api":"cuMemFree_v2","id":0,"addr":"0x7f4261300000","bytes":0})j",
    R"j({"type":"free","api":"cuMemFree_v2","id":1,"addr":"0x7f425f800000","bytes":4194304})j",
    R"j({"type":"host_free","api":"cuMemFreeHost","addr":"0x7f0000000000","bytes":8192})j",
    R"j({"type":"end","counts":{"alloc":2,"free":2},"live_buffers":0,"host_pinned_bytes":0,"dropped":0})j",
};

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  std::string log = std::string(kHeader) + "\n";
  for (const char* r : kRecords) absl::StrAppend(&log, r, "\n");
  seeds.push_back(log);
  seeds.push_back(log.substr(0, log.size() / 2));  // cut mid-record
  seeds.push_back(std::string(kHeader) + "\n" +
                  R"({"type":"alloc","id":18446744073709551615,"bytes":18446744073709551615})" +
                  "\n" + R"({"type":"swap_in","id":18446744073709551615,"bytes":1})");
  seeds.push_back(std::string(kHeader) + "\n" +
                  R"({"type":"launch","stream":7,"compute_us":1e308,"demangled":null})");
  seeds.push_back(R"({"type":"header","format":2})");
  seeds.push_back(
      R"({"type":"header","format":1,"config":{"STENSOR_MEMORY_LIMIT":"0=1GiB,1=50%"}})");
  seeds.push_back(std::string(kHeader) + "\n" + std::string(40, '[') + std::string(40, ']'));
  seeds.push_back("{\n \"traceEvents\": []\n}\n");
  return seeds;
}

}  // namespace

const FuzzTarget& Target() {
#ifdef STENSOR_FUZZ_SCALE
  static const FuzzTarget* const target = new FuzzTarget{
      "chrome_trace_fuzz_scale",
      ScaleLogSeeds({R"({"type":"swap_in","id":3,"bytes":4194304})"}),
      {"\n", "{", "}", "\"reads\":[", "\"id\":"},
      512,
      128 << 10,
  };
  return *target;
#else
  static const FuzzTarget* const target = new FuzzTarget{
      "chrome_trace_fuzz",
      Seeds(),
      {"\n",
       "{",
       "}",
       "[",
       "]",
       ",",
       ":",
       "\"",
       "\\u",
       "1e999",
       "-0",
       "18446744073709551615",
       "\"type\":",
       "\"header\"",
       "\"format\":1",
       "\"alloc\"",
       "\"free\"",
       "\"launch\"",
       "\"memcpy\"",
       "\"memset\"",
       "\"swap_in\"",
       "\"swap_out\"",
       "\"drop_clean\"",
       "\"drop_unwritten\"",
       "\"end\"",
       "\"id\":",
       "\"bytes\":",
       "\"device\":",
       "\"stream\":",
       "\"captured\":true",
       "\"compute_us\":",
       "\"STENSOR_MEMORY_LIMIT\":",
       "\"addr\":\"0x"},
      8192,
      0,
  };
  return *target;
#endif
}

}  // namespace fuzz
}  // namespace stensor

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
#ifdef STENSOR_FUZZ_SCALE
  stensor::CheckScale(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
#endif
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::istringstream in(text);
  std::ostringstream out, progress;
  stensor::ChromeTraceOptions options;
  options.input_bytes = size;
  options.progress_every = 256;  // the progress lines run too
  absl::StatusOr<stensor::ChromeTraceSummary> summary =
      stensor::WriteChromeTrace(in, "fuzz.jsonl", options, out, progress);
  if (summary.ok()) {
    stensor::CheckTrace(text, out.str());
  } else {
    stensor::CheckError(text, summary.status().message());
  }
  return 0;
}
