// `stensor trace`: an access log (docs/access-log.md) turned into a trace in
// the Chrome trace event format, which Perfetto (ui.perfetto.dev) and
// chrome://tracing open: a track per CUDA stream with its kernels, copies and
// memsets, a swap track with stensor's swap-ins, swap-outs and drops, and
// counters of resident device bytes, the cap and host copies. docs/trace.md
// describes what is shown.
//
// The log has no timestamps, so the trace runs on a logical clock: every
// operation takes `op_us` microseconds (a launch its `compute_us` where the
// record has one), one after another in log order. The trace says so in its
// metadata.
//
// The log is streamed: each line is parsed (nlohmann::json), turned into
// events and written out before the next is read; only the live buffers'
// sizes and places and the streams' names are kept.
//
// Thread-safety: everything here is reentrant (it writes only to the given
// streams).
#ifndef STENSOR_TOOLS_CHROME_TRACE_H_
#define STENSOR_TOOLS_CHROME_TRACE_H_

#include <cstdint>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stensor {

struct TraceFlags {
  std::string log;     // a path, or "-" for standard input
  std::string output;  // a path, or "-" for standard output
  double op_us = 10;   // one operation on the logical clock
};

// Parses the arguments after `trace`. Errors name the flag, the value and
// the accepted forms. `--help` is not a flag here (RunTrace answers it).
absl::StatusOr<TraceFlags> ParseTraceFlags(const std::vector<std::string>& args);

struct ChromeTraceOptions {
  double op_us = 10;
  // The input's size when known (0: unknown), for progress lines.
  uint64_t input_bytes = 0;
  // A progress line on `progress` every this many bytes read, when the
  // input is larger than this or of unknown size (0: never).
  uint64_t progress_every = 64ull << 20;
};

// What the conversion saw, for the caller's summary.
struct ChromeTraceSummary {
  uint64_t lines = 0;
  uint64_t events = 0;
  bool ended = false;    // the log's `end` record was read
  uint64_t dropped = 0;  // records the library could not write (`end`)
};

// Reads the access log from `in` (called `log_name` in messages) and writes
// the trace to `out`. A line that is not a JSON object, a first line that is
// not a `header` record with a `format`, or a record of a known type with
// fields of the wrong type fails with one line naming `log_name` and the
// line number; what was written to `out` by then is not a valid trace.
absl::StatusOr<ChromeTraceSummary> WriteChromeTrace(std::istream& in, absl::string_view log_name,
                                                    const ChromeTraceOptions& options,
                                                    std::ostream& out, std::ostream& progress);

// Runs the command; 0 on success, 1 on a failure (told on `err` in one
// line), 2 on bad arguments (with the usage). `out` is the trace's
// destination for `-o -`.
int RunTrace(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace stensor

#endif  // STENSOR_TOOLS_CHROME_TRACE_H_
