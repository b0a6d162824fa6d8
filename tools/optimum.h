// OptimumBound: a lower bound on the bytes any eviction policy must move
// (device->host plus host->device) to run a Workload under a cap with the
// manager's swap rules (the KeepProblem of tools/keep_problem.h), from the
// min-cost-flow (LP) relaxation of that problem. ExactOptimum
// (tools/exact_optimum.h) solves it in whole buffers; this bound needs no
// solver and scales to any workload.
//
// The per-gap keep fractions form an interval LP, solved exactly as a flow
// over the time line (kept charge rides an arc over its gap, free memory the
// line). The once-per-stretch write-back is priced by Lagrangian weights
// spread over the stretch's gaps (each weighting is a valid bound; several
// rounds of multiplicative updates keep the best). The result is a lower
// bound: fractional keeps are allowed, and unknown launches are not taken to
// dirty anything (dirtier would only cost more).
//
// Thread-safety: reentrant.
#ifndef STENSOR_TOOLS_OPTIMUM_H_
#define STENSOR_TOOLS_OPTIMUM_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/keep_problem.h"
#include "tools/workload.h"

namespace stensor {

struct OptimumOptions {
  uint64_t cap = 0;  // unused when given the KeepProblem
  int rounds = 8;    // Lagrangian rounds (each one min-cost flow); more tighten slowly
};

struct OptimumBound {
  uint64_t bytes_moved = 0;  // the bound: no policy moves fewer
  // How the best round's solution splits it (fractional).
  double bytes_out = 0, bytes_in = 0;
  // What the flow solved: gaps (arcs besides the time line), time points,
  // shortest-path phases of all rounds, rounds run.
  int64_t gaps = 0, points = 0, phases = 0;
  int rounds = 0;
  // The cheapest of the rounds' solutions that keep every gap whole or not
  // at all, as a schedule (a keep flag per KeepProblem gap) and what it
  // moves, counted exactly: one any policy could follow. When it moves no
  // more than the bound it is an optimum (proven()), and the rounds stop.
  bool has_schedule = false;
  std::vector<bool> schedule;
  ScheduleBytes schedule_bytes;
  bool proven() const { return has_schedule && schedule_bytes.moved() <= bytes_moved; }
};

// FailedPrecondition when some operation alone cannot fit under the cap.
absl::StatusOr<OptimumBound> ComputeOptimumBound(const Workload& workload,
                                                 const OptimumOptions& options);
// The same over a problem built already.
absl::StatusOr<OptimumBound> ComputeOptimumBound(const KeepProblem& problem,
                                                 const OptimumOptions& options);

}  // namespace stensor

#endif  // STENSOR_TOOLS_OPTIMUM_H_
