// Fuzz target for `stensor report`: tools/run_summary.h (SummarizeLog) and
// the page and plot of tools/report.h.
//
// Input: the bytes are a log. Checked on every input, for --top 1 and 10,
// whole and --partial:
// - SummarizeLog returns; an error is one printable line that starts with
//   the log's name and "line N: " with N from 1 to the input's line count
//   (plus one), or an I/O error;
// - a summary is consistent: each device's resident bytes at most its peak,
//   at most kMaxPlotBuckets buckets of a power-of-two width covering the
//   operations, no bucket above its device's peak, the top buffers at most
//   `top` and most moved first;
// - the page and the plot hold every string from the log escaped: as many
//   '<' as '>' (each one a tag of the report's own), no '&' that does not
//   start an entity.
// Built with STENSOR_FUZZ_SCALE, the input describes a log of scale instead
// (tools/log_generator.h, ScaleLogFromBytes: long, many buffers live, a
// launch of up to 263,164 reads), summarised on a 128 KiB stack.
// A broken check aborts, which libFuzzer and fuzz_main.cc report as a crash.
//
// Built by //tools:report_fuzz (and _scale) with tests/support/fuzz_main.cc as a
// bounded regression test, and by `scripts/fuzz.sh report` (report_scale)
// with libFuzzer.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tests/support/fuzz_target.h"
#include "tools/log_generator.h"
#include "tools/report.h"
#include "tools/run_summary.h"

namespace stensor {
namespace {

void Require(bool condition, absl::string_view what, absl::string_view detail) {
  if (condition) return;
  const size_t shown = std::min<size_t>(detail.size(), 800);
  std::fprintf(stderr, "report_fuzz: %.*s\n  %.*s\n", static_cast<int>(what.size()), what.data(),
               static_cast<int>(shown), detail.data());
  std::abort();
}

// Markup where no string from the log broke out: tags balance and every
// '&' starts an entity the escaper writes.
void CheckEscaped(const std::string& markup) {
  Require(std::count(markup.begin(), markup.end(), '<') ==
              std::count(markup.begin(), markup.end(), '>'),
          "unbalanced '<' and '>' (a string from the log unescaped)", markup);
  for (size_t at = markup.find('&'); at != std::string::npos; at = markup.find('&', at + 1)) {
    const absl::string_view rest = absl::string_view(markup).substr(at);
    Require(absl::StartsWith(rest, "&amp;") || absl::StartsWith(rest, "&lt;") ||
                absl::StartsWith(rest, "&gt;") || absl::StartsWith(rest, "&quot;") ||
                absl::StartsWith(rest, "&#39;"),
            "a bare '&'", rest.substr(0, 40));
  }
}

void CheckSummary(absl::string_view text, const SummaryOptions& options) {
  std::istringstream in{std::string(text)};
  absl::StatusOr<RunSummary> s = SummarizeLog(in, "fuzz.jsonl", options);
  if (!s.ok()) {
    const std::string message(s.status().message());
    Require(message.find('\n') == std::string::npos, "a multi-line error", message);
    Require(absl::StartsWith(message, "fuzz.jsonl: line "), "an error naming no line", message);
    const size_t lines = std::count(text.begin(), text.end(), '\n') + 1;
    const uint64_t line =
        std::strtoull(message.c_str() + std::strlen("fuzz.jsonl: line "), nullptr, 10);
    Require(line >= 1 && line <= lines + 1, "an error naming a line beyond the log", message);
    return;
  }
  const ResidentTimeline& t = s->timeline;
  Require(t.buckets() <= kMaxPlotBuckets, "too many buckets", absl::StrCat(t.buckets()));
  Require((t.width() & (t.width() - 1)) == 0, "a bucket width that is not a power of two",
          absl::StrCat(t.width()));
  if (s->operations > 0 && !s->devices.empty()) {
    Require(t.buckets() * t.width() >= s->operations, "buckets short of the operations",
            absl::StrCat(t.buckets(), " x ", t.width(), " < ", s->operations));
  }
  for (size_t slot = 0; slot < s->devices.size(); ++slot) {
    const DeviceSummary& d = s->devices[slot];
    Require(d.resident <= d.peak, "resident above the peak", absl::StrCat(d.resident, " ", d.peak));
    for (size_t b = 0; b < t.buckets(); ++b) {
      Require(t.Get(b, slot).max_resident <= d.peak, "a bucket above the peak",
              absl::StrCat(t.Get(b, slot).max_resident, " > ", d.peak));
    }
  }
  Require(s->top_buffers.size() <= static_cast<size_t>(options.top), "more top buffers than asked",
          absl::StrCat(s->top_buffers.size()));
  for (size_t i = 1; i < s->top_buffers.size(); ++i) {
    Require(s->top_buffers[i - 1].moved() >= s->top_buffers[i].moved(), "top buffers out of order",
            absl::StrCat(i));
  }
  CheckEscaped(ReportHtml(*s, options.top));
  CheckEscaped(ReportSvg(*s));
}

// A log of scale (STENSOR_FUZZ_SCALE, tools/log_generator.h): summarised
// as any other (a long log merges the plot's buckets); unspliced, every
// launch is counted, the wide one's millions of reads included.
void CheckScale(absl::string_view data) {
  const ScaleLog log = ScaleLogFromBytes(data);
  SummaryOptions options;
  CheckSummary(log.text, options);
  if (log.spliced) return;
  std::istringstream in(log.text);
  absl::StatusOr<RunSummary> s = SummarizeLog(in, "fuzz.jsonl", options);
  Require(s.ok(), "a generated log does not summarise", s.status().message());
  const uint64_t lines = std::count(log.text.begin(), log.text.end(), '\n');
  Require(s->launches > 0 && s->launches < lines && s->ended, "launches miscounted",
          absl::StrCat(s->launches));
  if (log.spec.shape == GeneratedLog::Shape::kWide) {
    Require(s->launches == 1 && s->kernels.size() == 1, "the wide launch miscounted",
            absl::StrCat(s->launches));
  }
}

constexpr char kHeader[] =
    R"({"type":"header","format":1,"pid":9,"devices":[{"ordinal":0,"name":"fake <0> & co","total_bytes":1073741824}],"config":{"STENSOR_MEMORY_LIMIT":"0=4MiB","STENSOR_POLICY":"belady","STENSOR_PREFETCH":true}})";

constexpr const char* kRecords[] = {
    R"({"type":"alloc","api":"cuMemAlloc_v2","id":1,"addr":"0x7f0000000000","bytes":4194304,"device":0,"kind":"device"})",
    R"({"type":"alloc","api":"cuMemAlloc_v2","id":2,"addr":"0x7f0000400000","bytes":4096,"device":0,"kind":"device"})",
    R"({"type":"alloc","api":"cuMemAlloc_v2","id":0,"addr":"0x7f0000800000","bytes":100,"device":1,"kind":"stream_ordered"})",
    R"({"type":"swap_wait","what":"buffer","id":1,"seconds":0.25})",
    R"j({"type":"launch","api":"cuLaunchKernel","kernel":"_Z1kPf","demangled":"k<float&, (1<2)>(float*)","stream":"legacy","grid":[1,1,1],"block":[1,1,1],"reads":[1,2],"writes":[1],"inferred":true})j",
    R"({"type":"swap_out","id":1,"bytes":4194304,"device":0})",
    R"({"type":"drop_clean","id":2,"bytes":4096,"device":0})",
    R"({"type":"swap_in","id":1,"bytes":4194304,"copy":true,"device":0})",
    R"({"type":"drop_unwritten","id":1,"bytes":4194304,"device":0})",
    R"({"type":"swap_in","id":1,"bytes":4194304,"copy":false,"device":0})",
    R"({"type":"evict_wait","id":1,"seconds":0.5})",
    R"({"type":"graph_launch","graph":"0x<&>","stream":"legacy","inferred":false})",
    R"({"type":"oom","device":0,"bytes":1,"used":2,"cap":3})",
    R"({"type":"free","id":1,"addr":"0x7f0000000000"})",
    R"({"type":"free","id":0,"addr":"0x7f0000800000"})",
    R"({"type":"end","counts":{},"live_buffers":1,"dropped":0})",
};

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  std::string log = std::string(kHeader) + "\n";
  for (const char* r : kRecords) absl::StrAppend(&log, r, "\n");
  seeds.push_back(log);
  seeds.push_back(log.substr(0, log.size() / 2));  // cut mid-record
  seeds.push_back(std::string(kHeader) + "\n" +
                  R"({"type":"alloc","id":18446744073709551615,"bytes":1152921504606846976})" +
                  "\n" + R"({"type":"swap_wait","what":"<&>","seconds":1e999})");
  seeds.push_back(R"({"type":"header","format":2})");
  seeds.push_back(std::string(200, '[') + std::string(200, ']'));
  return seeds;
}

}  // namespace

namespace fuzz {

const FuzzTarget& Target() {
#ifdef STENSOR_FUZZ_SCALE
  static const FuzzTarget* const target = new FuzzTarget{
      "report_fuzz_scale",
      ScaleLogSeeds({R"({"type":"swap_out","id":2,"bytes":4096})"}),
      {"\n", "{", "}", "\"reads\":[", "\"id\":"},
      512,
      128 << 10,
  };
  return *target;
#else
  static const FuzzTarget* const target = new FuzzTarget{
      "report_fuzz",
      Seeds(),
      {"\n",
       "{",
       "}",
       "[",
       "]",
       ",",
       ":",
       "\"",
       "<",
       ">",
       "&",
       "\\u0001",
       "1e999",
       "-0",
       "18446744073709551615",
       "\"type\":",
       "\"alloc\"",
       "\"free\"",
       "\"launch\"",
       "\"swap_out\"",
       "\"swap_in\"",
       "\"drop_clean\"",
       "\"swap_wait\"",
       "\"header\"",
       "\"end\"",
       "\"id\":",
       "\"bytes\":",
       "\"device\":",
       "\"reads\":[",
       "\"demangled\":\"",
       "\"copy\":false",
       "\"seconds\":",
       "\"STENSOR_MEMORY_LIMIT\":\"",
       "\"format\":1"},
      8192,
      0,
  };
  return *target;
#endif
}

}  // namespace fuzz
}  // namespace stensor

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
#ifdef STENSOR_FUZZ_SCALE
  stensor::CheckScale(text);
  return 0;
#endif
  for (int top : {1, 10}) {
    for (bool partial : {false, true}) {
      stensor::SummaryOptions options;
      options.top = top;
      options.partial = partial;
      stensor::CheckSummary(text, options);
    }
  }
  return 0;
}
