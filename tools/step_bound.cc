#include "tools/step_bound.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "tools/precedence_bound.h"
#include "tools/serving_bound.h"

namespace stensor {

absl::StatusOr<StepBound> ComputeStepBound(const Workload& workload,
                                           const StepBoundOptions& options) {
  if (!(options.bandwidth_gbps > 0) || !(options.d2h_bandwidth_gbps >= 0) ||
      !(options.kernel_us >= 0)) {
    return absl::InvalidArgumentError("bandwidths must be positive, kernel time at least 0");
  }
  StepBound bound;
  const std::vector<double> compute = ComputeTimes(workload, options.kernel_us);
  for (double us : compute) bound.compute_us += us;
  absl::StatusOr<KeepProblem> problem = BuildKeepProblem(workload, options.cap, options.serving);
  if (!problem.ok()) return problem.status();
  const double d2h_gbps =
      options.d2h_bandwidth_gbps > 0 ? options.d2h_bandwidth_gbps : options.bandwidth_gbps;
  PrecedenceOptions precedence;
  precedence.serving = options.serving;
  precedence.in_us_per_byte = 1 / (options.bandwidth_gbps * 1e3);
  precedence.out_us_per_byte = 1 / (d2h_gbps * 1e3);
  bound.precedence_us = PrecedenceBoundUs(*problem, compute, precedence);
  if (options.serving) {
    // Serving every use is a schedule (it needs no room, writes nothing
    // back), so its bytes bound the search; and no schedule is forced to
    // write back: the bound on the bytes out is 0. Both ways, then copies
    // in and served bytes alone, write-backs free.
    ServingBoundOptions serving;
    for (const KeepUse& use : problem->uses) {
      if (!use.allocation) serving.upper += use.bytes;
    }
    serving.time_limit_ms = options.time_limit_ms;
    serving.schedules = false;  // the bound alone
    bound.bytes_moved = ComputeServingBound(*problem, serving).bytes;
    std::fill(problem->stretch_bytes.begin(), problem->stretch_bytes.end(), 0);
    bound.bytes_in = ComputeServingBound(*problem, serving).bytes;
  } else {
    OptimumOptions flow;
    flow.cap = options.cap;
    flow.rounds = options.rounds;
    if (options.both_ways != nullptr) {
      bound.bytes_moved = options.both_ways->bytes_moved;
    } else {
      absl::StatusOr<OptimumBound> both = ComputeOptimumBound(*problem, flow);
      if (!both.ok()) return both.status();
      bound.bytes_moved = both->bytes_moved;
    }
    // Each direction alone: the other one's bytes priced at zero (the
    // flow prices a write-back through the gaps of its written stretch).
    KeepProblem in = *problem;
    for (KeepGap& gap : in.gaps) gap.stretch = -1;
    std::fill(in.stretch_bytes.begin(), in.stretch_bytes.end(), 0);
    absl::StatusOr<OptimumBound> in_bound = ComputeOptimumBound(in, flow);
    if (!in_bound.ok()) return in_bound.status();
    bound.bytes_in = in_bound->bytes_moved;
    KeepProblem out = *std::move(problem);
    for (KeepGap& gap : out.gaps) gap.swap_in = 0;
    for (KeepUse& use : out.uses) use.swap_in = 0;
    absl::StatusOr<OptimumBound> out_bound = ComputeOptimumBound(out, flow);
    if (!out_bound.ok()) return out_bound.status();
    bound.bytes_out = out_bound->bytes_moved;
  }
  bound.in_us = static_cast<double>(bound.bytes_in) / (options.bandwidth_gbps * 1e3);
  bound.out_us = static_cast<double>(bound.bytes_out) / (d2h_gbps * 1e3);
  bound.moved_us =
      static_cast<double>(bound.bytes_moved) / ((options.bandwidth_gbps + d2h_gbps) * 1e3);
  return bound;
}

}  // namespace stensor
