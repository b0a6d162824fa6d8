// WriteGeneratedLog: access logs (docs/access-log.md) made to order, written
// with the library's own record writer (core/base/json.h), so the tools can be
// tested and measured on logs of any length and width without storing them:
//
//   - kMlp: the operations of examples/mlp's training loop (dataset shards
//     visited round robin, forward, backward, momentum SGD, the loss read
//     back each step), for `steps` steps; about 22 records a step with the
//     defaults, so 3,000 steps make a log as long as mlp_train --steps 3000;
//   - kLive: `buffers` cuMemAlloc buffers of one granule, all live at once,
//     then `steps` rounds of one launch per buffer (reading it and the one
//     before, writing it), then the frees;
//   - kWide: `buffers` buffers and one launch whose `reads` lists `reads`
//     ids, cycling over the buffers, streamed out (never held as a list).
//
// Thread-safety: reentrant (writes only to the given stream).
#ifndef STENSOR_TOOLS_LOG_GENERATOR_H_
#define STENSOR_TOOLS_LOG_GENERATOR_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stensor {

struct GeneratedLog {
  enum class Shape { kMlp, kLive, kWide };
  Shape shape = Shape::kMlp;
  uint64_t steps = 20;       // kMlp: training steps; kLive: rounds over the buffers
  uint64_t buffers = 16;     // kLive, kWide
  uint64_t reads = 1000000;  // kWide: ids in the launch's `reads`
  int layers = 2;            // kMlp: hidden layers
  int shards = 12;           // kMlp: dataset shards
};

// The shape by name: "mlp", "live" or "wide".
absl::StatusOr<GeneratedLog::Shape> ParseLogShape(absl::string_view name);

// Writes the log, header to `end` record; returns the lines written.
uint64_t WriteGeneratedLog(const GeneratedLog& spec, std::ostream& out);

// The same into a string (tests, fuzz targets).
std::string GeneratedLogText(const GeneratedLog& spec);

// A log of scale for the fuzz targets' scale builds (STENSOR_FUZZ_SCALE,
// scripts/fuzz.sh log_scale and the like), from the input's bytes: byte 0
// picks the shape, bytes 1-2 its size (kMlp: 100 to 355 steps, about
// 2,300 to 7,900 records; kLive: 300 to 1,323 buffers, one to three
// rounds; kWide: 1 to 64 buffers, 1,024 to 263,164 reads), byte 3 is
// left to the target (`knob`: a cap, say); what follows byte 5 goes in as
// one more line after the line that bytes 4-5 pick, so that errors deep in
// a long log are reached too.
struct ScaleLog {
  GeneratedLog spec;
  std::string text;
  bool spliced = false;  // a line from the input went in
  uint8_t knob = 0;
};
ScaleLog ScaleLogFromBytes(absl::string_view data);

// Seeds for those targets: each shape at both ends of its size range, and
// each of `lines` spliced into a long training log.
std::vector<std::string> ScaleLogSeeds(const std::vector<std::string>& lines);

}  // namespace stensor

#endif  // STENSOR_TOOLS_LOG_GENERATOR_H_
