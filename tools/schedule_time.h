// ScheduleTime: how long a keep/evict schedule of a keep problem
// (tools/keep_problem.h: whole buffers, nothing served) takes in
// `stensor sim`'s time model (tools/replay.h), its copies timed as early
// as the schedule allows:
//   - a buffer evicted for a gap leaves at the decision before the gap's
//     first operation; the first gap evicted in a written stretch writes
//     the buffer back there (CountSchedule's bytes), on the device-to-host
//     engine;
//   - it comes back for its next use at the earliest decision from which
//     the room holds it through the rest of the gap, beside the kept gaps
//     and the buffers fetched before it (taken in order of next use), or on
//     demand before that use; the copy starts once the engine is free, the
//     memory still being copied out fits beside what the decision's point
//     holds (tools/room_clock.h, as in the replay) and its own write-back
//     is done;
//   - an operation starts once its buffers' copies are in (one that
//     allocates, or takes a buffer back without a copy, once that room is
//     free too), and computes.
// So it is the time of one schedule the time bound (tools/step_bound.h)
// must not exceed, and with the exact optimum's schedule it brackets the
// least time from above: the bytes-optimal schedule, fetched ahead.
//
// Thread-safety: reentrant.
#ifndef STENSOR_TOOLS_SCHEDULE_TIME_H_
#define STENSOR_TOOLS_SCHEDULE_TIME_H_

#include <cstdint>
#include <vector>

#include "tools/keep_problem.h"

namespace stensor {

struct ScheduleTimeOptions {
  double in_us_per_byte = 0;   // host -> device
  double out_us_per_byte = 0;  // device -> host
};

struct ScheduleTime {
  double drained_us = 0;  // the last operation done and every copy
  double stall_us = 0;    // operations waiting for their copies
  int64_t fetched_ahead = 0, on_demand = 0;
};

// `kept[g]` per gap (a schedule whose kept gaps fit the room at every
// point); `compute_us` per point.
ScheduleTime TimeSchedule(const KeepProblem& problem, const std::vector<bool>& kept,
                          const std::vector<double>& compute_us,
                          const ScheduleTimeOptions& options);

}  // namespace stensor

#endif  // STENSOR_TOOLS_SCHEDULE_TIME_H_
