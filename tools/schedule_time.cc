#include "tools/schedule_time.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "tools/room_clock.h"

namespace stensor {

ScheduleTime TimeSchedule(const KeepProblem& problem, const std::vector<bool>& kept,
                          const std::vector<double>& compute_us,
                          const ScheduleTimeOptions& options) {
  const int n = problem.points;
  const size_t gaps = problem.gaps.size();
  auto is_kept = [&](size_t g) { return g < kept.size() && kept[g]; };
  // Room left at each point once the kept gaps hold theirs.
  std::vector<int64_t> slack(problem.room.begin(), problem.room.end());
  for (size_t g = 0; g < gaps; ++g) {
    if (!is_kept(g)) continue;
    for (int t = problem.gaps[g].first; t <= problem.gaps[g].last; ++t) {
      slack[t] -= problem.gaps[g].units;
    }
  }
  // Which evicted gap of each written stretch writes it back: its first.
  std::vector<int> writer_gap(problem.stretch_bytes.size(), -1);
  for (size_t g = 0; g < gaps; ++g) {
    const int s = problem.gaps[g].stretch;
    if (is_kept(g) || s < 0) continue;
    if (writer_gap[s] < 0 || problem.gaps[g].first < problem.gaps[writer_gap[s]].first) {
      writer_gap[s] = static_cast<int>(g);
    }
  }
  // Fetches, in order of next use, each at the earliest decision from which
  // the room holds it to its use (at the use itself: on demand).
  std::vector<size_t> order;
  for (size_t g = 0; g < gaps; ++g) {
    const KeepGap& gap = problem.gaps[g];
    if (!is_kept(g) && gap.swap_in > 0 && gap.last + 1 < n) order.push_back(g);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return problem.gaps[a].last < problem.gaps[b].last; });
  std::vector<std::vector<size_t>> fetch_at(static_cast<size_t>(n)),
      evict_at(static_cast<size_t>(n));
  ScheduleTime result;
  for (size_t g : order) {
    const KeepGap& gap = problem.gaps[g];
    // Out at its first point at least; the latest start from which every
    // point to the gap's end has room.
    int from = gap.last + 1;
    while (from - 1 > gap.first && slack[from - 1] >= gap.units) --from;
    for (int t = from; t <= gap.last; ++t) slack[t] -= gap.units;
    fetch_at[from].push_back(g);
    ++(from <= gap.last ? result.fetched_ahead : result.on_demand);
  }
  for (size_t g = 0; g < gaps; ++g) {
    if (!is_kept(g) && problem.gaps[g].first < n) evict_at[problem.gaps[g].first].push_back(g);
  }

  std::vector<double> ready(static_cast<size_t>(n), 0.0);  // per point: its copies in
  // Points that take room: an allocation, or a buffer back at its use
  // (with a copy, which waits for the room already, or without one).
  std::vector<char> takes_room(static_cast<size_t>(n), 0);
  for (const KeepUse& use : problem.uses) {
    if (use.allocation && use.point >= 0 && use.point < n) takes_room[use.point] = 1;
  }
  for (size_t g = 0; g < gaps; ++g) {
    const int back = problem.gaps[g].last + 1;
    if (!is_kept(g) && back >= 0 && back < n) takes_room[back] = 1;
  }
  std::vector<double> written_back(problem.stretch_bytes.size(), 0.0);
  double now = 0, h2d_free = 0, d2h_free = 0;
  RoomClock room;
  for (int t = 0; t < n; ++t) {
    for (size_t g : evict_at[t]) {
      const int s = problem.gaps[g].stretch;
      if (s < 0 || writer_gap[s] != static_cast<int>(g)) continue;  // a drop: no copy
      const double start = std::max(d2h_free, now);
      d2h_free = start + static_cast<double>(problem.stretch_bytes[s]) * options.out_us_per_byte;
      written_back[s] = d2h_free;
      room.Freed(d2h_free, problem.gaps[g].units);
    }
    // What this decision brings in (fetches, allocations) takes room that
    // copies out may still hold: slack[t] is what point t leaves free.
    const double room_ready = room.ReadyFor(slack[t], now);
    for (size_t g : fetch_at[t]) {
      const KeepGap& gap = problem.gaps[g];
      double start = std::max({h2d_free, now, room_ready});
      if (gap.stretch >= 0) start = std::max(start, written_back[gap.stretch]);
      h2d_free = start + static_cast<double>(gap.swap_in) * options.in_us_per_byte;
      ready[gap.last + 1] = std::max(ready[gap.last + 1], h2d_free);
    }
    // What it takes may be memory still being copied out: it starts once
    // that is done, as in the replay.
    const double begin = std::max({now, ready[t], takes_room[t] ? room_ready : now});
    result.stall_us += begin - now;
    now = begin + compute_us[t];
  }
  result.drained_us = std::max({now, h2d_free, d2h_free});
  return result;
}

}  // namespace stensor
