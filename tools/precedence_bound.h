// PrecedenceBound: a lower bound on the time any schedule of a keep problem
// (tools/keep_problem.h) takes in `stensor sim`'s time model, counting the
// precedence the cap forces. The byte totals of tools/step_bound.h let every
// copy overlap any compute; here a copy cannot start before the room it
// fills exists, so a stretch of operations whose forced copies outweigh its
// compute cannot borrow the idle link of another.
//
// The model's rules it rests on: decisions fall between operations, so the
// buffers on the device while operation v runs are those of point v; they
// fit in room(v) (without serving: the cap less the plain allocations and
// v's own buffers; with serving the cap less the plain allocations, v's own
// buffers among the candidates, since v may read them over the link); a
// copy in starts no earlier than the decision that issues it; an operation
// starts once its copies in are done, and reads what it serves while it
// computes, lasting the longer of the two.
//
// The windows. A buffer v does not use, not on the device while v runs,
// whose next use u needs its bytes (KeepGap::swap_in), has them cross the
// host-to-device engine after v ends: copied before u starts, or served
// while u runs. So the bytes crossing between the end of v and the end of
// j, where the bytes are at least the least cost of leaving out,
// fractionally, enough of the buffers next used by j or before to fit the
// rest in room(v) (a fractional knapsack: BytesInWindow), and j's compute
// bound end(j) - end(v): j computes after all of them but what it reads
// itself while it computes (at most its compute). With serving, a second
// edge starts at v's start: v's own buffers join the candidates at the
// cap less the plain allocations, and v and j each hide under their
// compute at most what they read themselves.
//
// The write-backs. A written buffer's memory holds its bytes until its copy
// out is done (tools/room_clock.h), and whatever k starts with must fit
// beside what is still being copied out. So a buffer k does not use whose
// memory is free when k starts, although its last write was by operation
// w < k, was written back after w ended and before k started. The least
// such bytes over the buffers k does not use, by the same knapsack at
// room(k) (BytesOutAfter), cross the device-to-host engine between w's end
// and k's start. With serving, the write may have gone to the host copy
// instead (nothing to write back), its bytes read over the other engine
// while the writer ran: the bytes split between the two engines as ends
// soonest.
//
// The bound is the longest path over operations' ends: end(j) >= end(j-1)
// + compute of j, and the window and write-back edges above. A window's
// bytes grow with j only where a next use passes (a write-back's, as the
// writer goes back, only where a write passes), and ends only grow, so a
// path needs an edge only there: the edges are the sum over operations of
// the buffers live across them, each an O(log n) knapsack query.
//
// What it leaves out: that room made by a write-back is what a copy in
// fills (the two directions' windows are bounded apart, not as one), and
// that room must hold at every point of a window, not only at its first.
//
// Thread-safety: reentrant.
#ifndef STENSOR_TOOLS_PRECEDENCE_BOUND_H_
#define STENSOR_TOOLS_PRECEDENCE_BOUND_H_

#include <vector>

#include "tools/keep_problem.h"

namespace stensor {

struct PrecedenceOptions {
  bool serving = false;        // as BuildKeepProblem was told
  double in_us_per_byte = 0;   // host -> device
  double out_us_per_byte = 0;  // device -> host
};

// The fewest bytes any schedule copies in or serves, as above, for buffers
// `from` does not use and next used from `from` + 1 to `to` (from < to),
// after `from` ends.
double BytesInWindow(const KeepProblem& problem, bool serving, int from, int to);

// Without serving: the fewest bytes any schedule writes back after the end
// of operation `writer` and before `at` starts, for buffers whose last write
// before `at` was at or after it, because `at` cannot hold them all
// (writer < at).
double BytesOutAfter(const KeepProblem& problem, int writer, int at);

// The longest path above, in microseconds; `compute_us` has one entry per
// point of `problem`.
double PrecedenceBoundUs(const KeepProblem& problem, const std::vector<double>& compute_us,
                         const PrecedenceOptions& options);

}  // namespace stensor

#endif  // STENSOR_TOOLS_PRECEDENCE_BOUND_H_
