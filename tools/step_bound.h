// StepBound: a lower bound on the time any schedule of a Workload takes
// under a cap in `stensor sim`'s time model (tools/replay.h): the compute
// stream runs every operation's compute, and each direction's copy engine
// carries what crosses the link in that direction, one copy after another.
// So no schedule obeying the swap rules (tools/keep_problem.h) finishes,
// its copies drained, before the largest of
//   - the compute of all operations (what the uncapped run takes),
//   - the fewest bytes any schedule copies in (with serving: copies in and
//     serves, which the operations read over the same engine), over the
//     bandwidth,
//   - the fewest bytes any schedule writes back, over the bandwidth;
//   - the fewest bytes any schedule moves both ways, over the two
//     bandwidths together (a schedule's time is at least each direction's
//     bytes over its bandwidth, so at least their weighted mean, which is
//     this; it binds where the schedule moving least one way moves much the
//     other).
// The byte counts are lower bounds of the keep problem with the other
// direction's bytes priced at zero (the LP bound of tools/optimum.h; with
// serving, the Lagrangian one of tools/serving_bound.h), so each is a bound
// for that direction alone, and the time is a bound for every schedule:
// the library's own plan included (ReplayResult::drained_us).
//
//   - the precedence the cap forces (tools/precedence_bound.h): a buffer
//     not on the device when an operation starts is copied in after that
//     start, so a window whose uses do not fit beside what the cap holds
//     at its start lasts at least its forced bytes over the link; a
//     written buffer whose memory an operation's start needs was written
//     back before it; and windows follow one another.
// What it leaves out: any coupling of the two directions inside a window.
// Where the bytes are small beside the compute it is the compute; where
// they dominate, the link.
//
// Thread-safety: reentrant.
#ifndef STENSOR_TOOLS_STEP_BOUND_H_
#define STENSOR_TOOLS_STEP_BOUND_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/statusor.h"
#include "tools/keep_problem.h"
#include "tools/optimum.h"
#include "tools/workload.h"

namespace stensor {

struct StepBoundOptions {
  uint64_t cap = 0;
  double bandwidth_gbps = 16;     // host->device (and back, unless:), as ReplayOptions
  double d2h_bandwidth_gbps = 0;  // device->host; 0: bandwidth_gbps
  double kernel_us = 100;         // a launch without compute_us, as ReplayOptions
  // Serving allowed (host-located VMM): an operation may read a swapped-out
  // buffer over the link instead of having it copied in.
  bool serving = true;
  int rounds = 8;            // OptimumOptions::rounds
  int time_limit_ms = 2000;  // each serving bound
  // Without serving: the LP bound of the same workload and cap, when the
  // caller has it (`stensor sim` prints it as the optimum), not solved again.
  const OptimumBound* both_ways = nullptr;
};

struct StepBound {
  double compute_us = 0;
  uint64_t bytes_in = 0;     // no schedule copies (and serves) fewer to the device
  uint64_t bytes_out = 0;    // no schedule writes fewer back to the host
  uint64_t bytes_moved = 0;  // no schedule moves fewer both ways (and serves)
  double in_us = 0, out_us = 0, moved_us = 0;
  // The longest path of tools/precedence_bound.h: compute and each
  // window's forced copies, one after the other.
  double precedence_us = 0;
  double us() const { return std::max({compute_us, in_us, out_us, moved_us, precedence_us}); }
};

// InvalidArgument for a bandwidth that is not positive or a negative kernel
// time; FailedPrecondition when no schedule exists (without serving: some
// operation alone does not fit under the cap; with it: the plain
// allocations alone do not).
absl::StatusOr<StepBound> ComputeStepBound(const Workload& workload,
                                           const StepBoundOptions& options);

}  // namespace stensor

#endif  // STENSOR_TOOLS_STEP_BOUND_H_
