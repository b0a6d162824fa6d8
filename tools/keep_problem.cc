#include "tools/keep_problem.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stensor {

absl::StatusOr<KeepProblem> BuildKeepProblem(const Workload& workload, uint64_t cap, bool serving) {
  const int points = static_cast<int>(workload.ops.size());
  const uint64_t g = workload.granularity;
  // Plain charges over time (difference array) and per-point uses.
  std::vector<int64_t> plain_delta(points + 1, 0);
  std::vector<int64_t> mandatory(points, 0);  // units of buffers used there
  struct Life {
    int last_use = -1;
    int last_use_index = -1;  // in `uses`
    int last_write = -1;      // stretch index of the latest write, -1 before any
    bool written = false;
  };
  absl::flat_hash_map<uint64_t, Life> lives;
  std::vector<KeepGap> gaps;
  std::vector<uint64_t> stretch_bytes;  // write-back cost of each stretch
  std::vector<KeepUse> uses;
  std::vector<KeepLink> links;
  std::vector<int> stretch_writer;

  // Ends the link from the buffer's last use at point `next`: at its next
  // use (`use`, about to be uses.size()), or at its free or the end.
  auto close_link = [&](const WorkloadBuffer& b, Life& life, int next, bool use, bool overwritten) {
    KeepLink link;
    link.from = life.last_use_index;
    link.to = use ? static_cast<int>(uses.size()) : -1;
    link.stretch = life.last_write;
    if (life.last_use + 1 <= next - 1) {
      KeepGap gap;
      gap.first = life.last_use + 1;
      gap.last = next - 1;
      gap.units = static_cast<int64_t>(b.charge / g);
      gap.bytes = b.bytes;
      gap.swap_in = use && life.written && !overwritten ? static_cast<int64_t>(b.bytes) : 0;
      gap.stretch = life.last_write;
      link.gap = static_cast<int>(gaps.size());
      gaps.push_back(gap);
    }
    links.push_back(link);
  };
  auto add_use = [&](const WorkloadBuffer& b, Life& life, int t, int64_t swap_in, bool allocation) {
    KeepUse u;
    u.point = t;
    u.units = static_cast<int64_t>(b.charge / g);
    u.bytes = b.bytes;
    u.swap_in = swap_in;
    u.allocation = allocation;
    life.last_use = t;
    life.last_use_index = static_cast<int>(uses.size());
    uses.push_back(u);
    mandatory[t] += u.units;
  };

  for (int t = 0; t < points; ++t) {
    const WorkloadOp& op = workload.ops[t];
    switch (op.kind) {
      case WorkloadOp::Kind::kAlloc: {
        const WorkloadBuffer& b = workload.buffers.at(op.buffer);
        if (!b.swappable) {
          plain_delta[t] += static_cast<int64_t>(b.charge);
          break;
        }
        add_use(b, lives[b.id], t, 0, /*allocation=*/true);
        break;
      }
      case WorkloadOp::Kind::kFree: {
        const WorkloadBuffer& b = workload.buffers.at(op.buffer);
        if (!b.swappable) {
          plain_delta[t] -= static_cast<int64_t>(b.charge);
          break;
        }
        auto it = lives.find(b.id);
        if (it != lives.end()) {
          close_link(b, it->second, t, /*use=*/false, false);
          lives.erase(it);
        }
        break;
      }
      case WorkloadOp::Kind::kHostRead:
        break;  // served from the host copy if evicted: no residency needed
      case WorkloadOp::Kind::kAccess:
      case WorkloadOp::Kind::kUnknown: {
        const WriteSet writes(op);
        for (uint64_t id : op.ids) {
          const WorkloadBuffer& b = workload.buffers.at(id);
          if (!b.swappable) continue;
          auto it = lives.find(id);
          if (it == lives.end()) continue;
          Life& life = it->second;
          const bool overwritten =
              std::find(op.overwritten.begin(), op.overwritten.end(), id) != op.overwritten.end();
          close_link(b, life, t, /*use=*/true, overwritten);
          add_use(b, life, t, life.written && !overwritten ? static_cast<int64_t>(b.bytes) : 0,
                  /*allocation=*/false);
          // Work of unknown accesses may have written what it made
          // resident (and more: buffers it does not name are left clean,
          // which can only make the optimum cheaper).
          if (writes.Contains(id) || op.kind == WorkloadOp::Kind::kUnknown) {
            life.written = true;
            life.last_write = static_cast<int>(stretch_bytes.size());
            stretch_bytes.push_back(b.bytes);
            stretch_writer.push_back(life.last_use_index);
          }
        }
        break;
      }
    }
  }
  // Still live at the end: the last gap runs to the end of the workload. By id,
  // so the gaps' order does not depend on the hash map's.
  std::vector<uint64_t> remaining;
  remaining.reserve(lives.size());
  for (const auto& [id, life] : lives) remaining.push_back(id);
  std::sort(remaining.begin(), remaining.end());
  for (uint64_t id : remaining)
    close_link(workload.buffers.at(id), lives[id], points, false, false);

  // Room for kept charges at each point, in granules.
  std::vector<int64_t> room(points, 0), free_units(points, 0);
  int64_t plain = 0;
  for (int t = 0; t < points; ++t) {
    plain += plain_delta[t];
    const int64_t free_bytes = static_cast<int64_t>(cap) - plain;
    free_units[t] = free_bytes < 0 ? -1 : free_bytes / static_cast<int64_t>(g);
    room[t] = free_units[t] - mandatory[t];
    if (free_bytes < 0 || (room[t] < 0 && !serving)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the cap of ", cap, " bytes is too small for the operation at log line ",
                       workload.ops[t].line, " alone (", mandatory[t] * static_cast<int64_t>(g),
                       " bytes of buffers it uses, ", plain, " of plain allocations)"));
    }
  }
  KeepProblem problem;
  problem.points = points;
  problem.gaps = std::move(gaps);
  problem.room = std::move(room);
  problem.stretch_bytes = std::move(stretch_bytes);
  problem.uses = std::move(uses);
  problem.links = std::move(links);
  problem.stretch_writer = std::move(stretch_writer);
  problem.free_units = std::move(free_units);
  return problem;
}

ScheduleBytes CountSchedule(const KeepProblem& problem, const std::vector<bool>& kept) {
  ScheduleBytes bytes;
  std::vector<char> written_back(problem.stretch_bytes.size(), 0);
  for (size_t i = 0; i < problem.gaps.size(); ++i) {
    const KeepGap& gap = problem.gaps[i];
    if (i < kept.size() && kept[i]) {
      ++bytes.kept_gaps;
      continue;
    }
    bytes.in += static_cast<uint64_t>(gap.swap_in);
    if (gap.stretch >= 0 && !written_back[gap.stretch]) {
      written_back[gap.stretch] = 1;
      bytes.out += problem.stretch_bytes[gap.stretch];
    }
  }
  return bytes;
}

ServeScheduleBytes CountServeSchedule(const KeepProblem& problem, const std::vector<bool>& resident,
                                      const std::vector<bool>& kept) {
  ServeScheduleBytes bytes;
  auto is_resident = [&](int u) {
    return u < 0 || (static_cast<size_t>(u) < resident.size() && resident[u]);
  };
  std::vector<char> link_in_kept(problem.uses.size(), 0);
  std::vector<char> written_back(problem.stretch_bytes.size(), 0);
  for (size_t l = 0; l < problem.links.size(); ++l) {
    const KeepLink& link = problem.links[l];
    // Kept only where both ends are on the device.
    const bool k = l < kept.size() && kept[l] && is_resident(link.from) &&
                   (link.to < 0 || is_resident(link.to));
    if (k) {
      ++bytes.kept_links;
      if (link.to >= 0) link_in_kept[link.to] = 1;
      continue;
    }
    // Leaves the device here: a resident write of its stretch is written back.
    const int s = link.stretch;
    if (s >= 0 && is_resident(link.from) && is_resident(problem.stretch_writer[s]) &&
        !written_back[s]) {
      written_back[s] = 1;
      bytes.out += problem.stretch_bytes[s];
    }
  }
  for (size_t u = 0; u < problem.uses.size(); ++u) {
    const KeepUse& use = problem.uses[u];
    if (!is_resident(static_cast<int>(u))) {
      ++bytes.served_uses;
      if (!use.allocation) bytes.served += use.bytes;
    } else if (!link_in_kept[u]) {
      bytes.in += static_cast<uint64_t>(use.swap_in);
    }
  }
  return bytes;
}

}  // namespace stensor
