// ExactOptimum: the fewest bytes any eviction policy can move (device->host
// plus host->device) to run a Workload under a cap with the manager's swap
// rules, in whole buffers: the KeepProblem (tools/keep_problem.h) solved as
// a 0-1 program by GLPK's branch and cut. One binary per gap (kept or
// evicted), one write-back variable per written stretch (paid when any of
// its gaps is evicted), one capacity row per point where the kept charges
// could exceed the room.
//
// The LP bound (tools/optimum.h) lets gaps be kept in part, so a policy's
// ratio to it overstates how far the policy is from what is reachable; this
// is the reachable figure. Where the bound's own solution keeps whole
// buffers and moves the bound (OptimumBound::proven), that is the optimum,
// and no search runs: on the training logs of examples/ the bound's flow
// is whole, and GLPK would spend most of a minute on 3,000 steps to prove
// what the flow already has. A time limit bounds the search: past it the
// best schedule found (or the bound's whole schedule, if the search found
// none) is returned, marked not proven.
//
// Thread-safety: reentrant (GLPK keeps its state per thread).
#ifndef STENSOR_TOOLS_EXACT_OPTIMUM_H_
#define STENSOR_TOOLS_EXACT_OPTIMUM_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/keep_problem.h"
#include "tools/optimum.h"
#include "tools/workload.h"

namespace stensor {

struct ExactOptions {
  uint64_t cap = 0;  // unused when given the KeepProblem
  int time_limit_ms = 30000;
  // The LP bound of the same problem, if computed (its schedule, gap for
  // gap): proven, it is the answer; else a fallback past the time limit.
  const OptimumBound* bound = nullptr;
};

struct ExactOptimum {
  uint64_t bytes_moved = 0;  // of the best schedule found
  uint64_t bytes_out = 0, bytes_in = 0;
  bool proven = false;    // no schedule moves fewer (else: the time limit ended the search)
  bool by_bound = false;  // the LP bound's whole schedule, proven by the bound: no search
  int64_t gaps = 0, rows = 0;
  int64_t kept_gaps = 0;
  std::vector<bool> schedule;  // its keep flag per KeepProblem gap
};

// FailedPrecondition when some operation alone cannot fit under the cap;
// Internal when the solver fails.
absl::StatusOr<ExactOptimum> ComputeExactOptimum(const Workload& workload,
                                                 const ExactOptions& options);
// The same over a problem built already.
absl::StatusOr<ExactOptimum> ComputeExactOptimum(const KeepProblem& problem,
                                                 const ExactOptions& options);

}  // namespace stensor

#endif  // STENSOR_TOOLS_EXACT_OPTIMUM_H_
