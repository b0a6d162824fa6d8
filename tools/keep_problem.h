// KeepProblem: the offline keep/evict problem of a Workload under a cap, with the
// manager's swap rules, in the form both optimum solvers read (the LP bound
// in optimum.cc, the exact one in exact_optimum.cc):
//
//   - time points are the workload's operations; a swappable buffer must be
//     resident at each operation that uses it (and at its allocation);
//   - between two consecutive uses (a gap) it is kept, occupying its charge
//     at every point of the gap, or evicted: then its next use swaps it in
//     (its bytes, unless that use overwrites it whole or nothing has
//     written it yet) and, once per written stretch (from a write to the
//     next), it is written back (its bytes);
//   - at each point, the kept charges fit in `room`: the cap less the plain
//     allocations and the buffers that point uses, in granules.
//
// Unknown launches are not taken to dirty anything (dirtier would only cost
// more), so an optimum of this problem is a lower bound for those too.
//
// With host-located VMM an operation may also reach a swapped-out buffer
// through its host copy mapped at its address (served): the problem then
// lists each buffer's uses and the links between consecutive ones as well
// (KeepUse, KeepLink), so that a use may be resident or served
// (tools/serving_optimum.h). Built for serving, an operation whose buffers
// exceed the cap is no error: only plain allocations past the cap are.
//
// Thread-safety: reentrant.
#ifndef STENSOR_TOOLS_KEEP_PROBLEM_H_
#define STENSOR_TOOLS_KEEP_PROBLEM_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/workload.h"

namespace stensor {

struct KeepGap {
  int first = 0, last = 0;  // points covered, inclusive
  int64_t units = 0;        // charge in granules
  uint64_t bytes = 0;       // the buffer's size
  int64_t swap_in = 0;      // bytes its eviction makes the next use copy in
  int stretch = -1;         // the written stretch it lies in, if any
};

// One use of a swappable buffer: its allocation or an operation reaching it.
struct KeepUse {
  int point = 0;
  int64_t units = 0;        // charge in granules
  uint64_t bytes = 0;       // the buffer's size
  int64_t swap_in = 0;      // copied in when resident here but not kept since its last use
  bool allocation = false;  // born here: served, it costs nothing
};

// From one use of a buffer to its next (or to its free, or the workload's end):
// kept resident throughout, or not.
struct KeepLink {
  int from = 0;      // use
  int to = -1;       // the next use; -1: none
  int gap = -1;      // the points between (KeepProblem::gaps), -1 when none
  int stretch = -1;  // the written stretch in force (KeepGap::stretch)
};

struct KeepProblem {
  int points = 0;
  std::vector<KeepGap> gaps;
  std::vector<int64_t> room;            // per point, granules
  std::vector<uint64_t> stretch_bytes;  // write-back cost of each stretch
  // Every use and link, in the order of the workload; the use whose write
  // starts each stretch; per point the cap less the plain allocations, in
  // granules (room is that less the units of the point's uses).
  std::vector<KeepUse> uses;
  std::vector<KeepLink> links;
  std::vector<int> stretch_writer;
  std::vector<int64_t> free_units;
};

// FailedPrecondition when some operation alone cannot fit under the cap
// (`serving`: when the plain allocations alone do not). Gaps come in the
// same order for the same workload and cap.
absl::StatusOr<KeepProblem> BuildKeepProblem(const Workload& workload, uint64_t cap,
                                             bool serving = false);

// What a schedule in whole buffers moves, counted exactly: `kept[i]` says
// whether gap i is kept; each evicted gap costs its swap-in, each written
// stretch with an evicted gap its write-back, once.
struct ScheduleBytes {
  uint64_t out = 0, in = 0;
  int64_t kept_gaps = 0;
  uint64_t moved() const { return out + in; }
};
ScheduleBytes CountSchedule(const KeepProblem& problem, const std::vector<bool>& kept);

// What a schedule with serving moves, counted exactly: `resident[u]` per use
// and `kept[l]` per link (kept only where both its uses are resident). A
// resident use not kept since its last one costs its swap-in; a served use
// its bytes over the link (none at allocation); a written stretch its
// write-back, once, when the buffer leaves the device after a resident
// write of it (a served write leaves the host copy the newest).
struct ServeScheduleBytes {
  uint64_t out = 0, in = 0, served = 0;
  int64_t served_uses = 0, kept_links = 0;
  uint64_t moved() const { return out + in + served; }
};
ServeScheduleBytes CountServeSchedule(const KeepProblem& problem, const std::vector<bool>& resident,
                                      const std::vector<bool>& kept);

}  // namespace stensor

#endif  // STENSOR_TOOLS_KEEP_PROBLEM_H_
