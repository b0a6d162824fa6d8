#include "tools/keep_problem.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stensor {

absl::StatusOr<KeepProblem> BuildKeepProblem(const Trace& trace, uint64_t cap) {
  const int points = static_cast<int>(trace.ops.size());
  const uint64_t g = trace.granularity;
  // Plain charges over time (difference array) and per-point uses.
  std::vector<int64_t> plain_delta(points + 1, 0);
  std::vector<int64_t> mandatory(points, 0);  // units of buffers used there
  struct Life {
    int last_use = -1;
    int last_write = -1;  // stretch index of the latest write, -1 before any
    bool written = false;
  };
  absl::flat_hash_map<uint64_t, Life> lives;
  std::vector<KeepGap> gaps;
  std::vector<uint64_t> stretch_bytes;  // write-back cost of each stretch

  auto close_gap = [&](const TraceBuffer& b, Life& life, int next, bool use, bool overwritten) {
    if (life.last_use + 1 <= next - 1) {
      KeepGap gap;
      gap.first = life.last_use + 1;
      gap.last = next - 1;
      gap.units = static_cast<int64_t>(b.charge / g);
      gap.bytes = b.bytes;
      gap.swap_in = use && life.written && !overwritten ? static_cast<int64_t>(b.bytes) : 0;
      gap.stretch = life.last_write;
      gaps.push_back(gap);
    }
  };

  for (int t = 0; t < points; ++t) {
    const TraceOp& op = trace.ops[t];
    switch (op.kind) {
      case TraceOp::Kind::kAlloc: {
        const TraceBuffer& b = trace.buffers.at(op.buffer);
        if (!b.swappable) {
          plain_delta[t] += static_cast<int64_t>(b.charge);
          break;
        }
        lives[b.id].last_use = t;
        mandatory[t] += static_cast<int64_t>(b.charge / g);
        break;
      }
      case TraceOp::Kind::kFree: {
        const TraceBuffer& b = trace.buffers.at(op.buffer);
        if (!b.swappable) {
          plain_delta[t] -= static_cast<int64_t>(b.charge);
          break;
        }
        auto it = lives.find(b.id);
        if (it != lives.end()) {
          close_gap(b, it->second, t, /*use=*/false, false);
          lives.erase(it);
        }
        break;
      }
      case TraceOp::Kind::kHostRead:
        break;  // served from the host copy if evicted: no residency needed
      case TraceOp::Kind::kAccess:
      case TraceOp::Kind::kUnknown: {
        const WriteSet writes(op);
        for (uint64_t id : op.ids) {
          const TraceBuffer& b = trace.buffers.at(id);
          if (!b.swappable) continue;
          auto it = lives.find(id);
          if (it == lives.end()) continue;
          Life& life = it->second;
          const bool overwritten =
              std::find(op.overwritten.begin(), op.overwritten.end(), id) != op.overwritten.end();
          close_gap(b, life, t, /*use=*/true, overwritten);
          life.last_use = t;
          mandatory[t] += static_cast<int64_t>(b.charge / g);
          if (writes.Contains(id)) {
            life.written = true;
            life.last_write = static_cast<int>(stretch_bytes.size());
            stretch_bytes.push_back(b.bytes);
          }
        }
        break;
      }
    }
  }
  // Still live at the end: the last gap runs to the end of the trace. By id,
  // so the gaps' order does not depend on the hash map's.
  std::vector<uint64_t> remaining;
  remaining.reserve(lives.size());
  for (const auto& [id, life] : lives) remaining.push_back(id);
  std::sort(remaining.begin(), remaining.end());
  for (uint64_t id : remaining) close_gap(trace.buffers.at(id), lives[id], points, false, false);

  // Room for kept charges at each point, in granules.
  std::vector<int64_t> room(points, 0);
  int64_t plain = 0;
  for (int t = 0; t < points; ++t) {
    plain += plain_delta[t];
    const int64_t free_bytes = static_cast<int64_t>(cap) - plain;
    room[t] = (free_bytes < 0 ? -1 : free_bytes / static_cast<int64_t>(g)) - mandatory[t];
    if (free_bytes < 0 || room[t] < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the cap of ", cap, " bytes is too small for the operation at log line ",
          trace.ops[t].line, " alone (", mandatory[t] * static_cast<int64_t>(g),
          " bytes of buffers it uses, ", plain, " of plain allocations)"));
    }
  }
  KeepProblem problem;
  problem.points = points;
  problem.gaps = std::move(gaps);
  problem.room = std::move(room);
  problem.stretch_bytes = std::move(stretch_bytes);
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

}  // namespace stensor
