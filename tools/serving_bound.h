// ServingBound: a lower bound on the fewest bytes any policy can move with
// serving (tools/serving_optimum.h) that stays cheap where the 0-1 program's
// root LP is out of reach: on access logs of programs whose allocations are
// made of pieces, hundreds of thousands of uses, GLPK does not finish the
// root LP in a minute, and without a bound the optimum's range starts at 0.
//
// Lagrangian relaxation of the capacity rows: a price per point where the
// cap may bind (bytes per granule held there) turns the program into one
// small problem per buffer, solved exactly by dynamic programming along its
// uses (resident or served at each, each link kept or not, a written
// stretch's write-back paid once when it leaves after a resident write).
// For any prices, the buffers' optima less the prices of the room at each
// point bound every schedule from below (weak duality); subgradient steps
// raise the prices where the buffers' choices overfill a point and lower
// them where room is left, and the best bound seen is returned.
//
// The buffers' choices at a price, made to fit (walking the points in
// order, an overfilled one lets go of the kept links over it whose next
// use is furthest, then serves its own uses, largest first: neither ever
// adds to another point), are a schedule too: the cheapest one seen is
// returned with the bound, so that the optimum lies in a range.
//
// Thread-safety: reentrant.
#ifndef STENSOR_TOOLS_SERVING_BOUND_H_
#define STENSOR_TOOLS_SERVING_BOUND_H_

#include <cstdint>
#include <vector>

#include "tools/keep_problem.h"

namespace stensor {

struct ServingBoundOptions {
  // The bytes of a schedule known to exist (for the step sizes; the bound
  // never exceeds it).
  uint64_t upper = 0;
  int max_iterations = 2000;
  int time_limit_ms = 10000;
  // Make schedules from the relaxed choices (every tenth step): the
  // cheapest is returned with the bound. Off, only the bound is computed,
  // with `upper` the steps' target throughout (making one takes a sort per
  // point, slow on logs of many buffers).
  bool schedules = true;
};

struct ServingBound {
  uint64_t bytes = 0;  // no schedule moves fewer
  int iterations = 0;
  // The cheapest schedule found (a flag per KeepProblem use and link, as
  // CountServeSchedule reads them) and its bytes; empty when none was
  // cheaper than `upper`.
  std::vector<bool> resident, kept;
  uint64_t schedule_bytes = 0;
};

// `problem` must be built with serving.
ServingBound ComputeServingBound(const KeepProblem& problem, const ServingBoundOptions& options);

}  // namespace stensor

#endif  // STENSOR_TOOLS_SERVING_BOUND_H_
