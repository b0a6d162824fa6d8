#include "tools/optimum.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tools/min_cost_flow.h"

namespace stensor {
namespace {

// Lagrangian weights are integers summing to kScale per stretch, so costs
// stay exact integers (bytes * kScale).
constexpr int64_t kScale = 1024;

struct Gap {
  int first = 0, last = 0;  // points covered, inclusive
  int64_t units = 0;        // charge in granules
  uint64_t bytes = 0;       // the buffer's size
  int64_t swap_in = 0;      // bytes its eviction makes the next use copy in
  int stretch = -1;         // the written stretch it lies in, if any
};

}  // namespace

absl::StatusOr<OptimumBound> ComputeOptimumBound(const Trace& trace,
                                                 const OptimumOptions& options) {
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
  std::vector<Gap> gaps;
  std::vector<uint64_t> stretch_bytes;  // write-back cost of each stretch

  auto close_gap = [&](const TraceBuffer& b, Life& life, int next, bool use, bool overwritten) {
    if (life.last_use + 1 <= next - 1) {
      Gap gap;
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
      case TraceOp::Kind::kUnknown:
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
          if (std::find(op.writes.begin(), op.writes.end(), id) != op.writes.end()) {
            life.written = true;
            life.last_write = static_cast<int>(stretch_bytes.size());
            stretch_bytes.push_back(b.bytes);
          }
        }
        break;
    }
  }
  // Still live at the end: the last gap runs to the end of the trace.
  for (auto& [id, life] : lives) close_gap(trace.buffers.at(id), life, points, false, false);

  // Room for kept charges at each point, in granules.
  std::vector<int64_t> room(points, 0);
  int64_t plain = 0;
  for (int t = 0; t < points; ++t) {
    plain += plain_delta[t];
    const int64_t free_bytes = static_cast<int64_t>(options.cap) - plain;
    room[t] = (free_bytes < 0 ? -1 : free_bytes / static_cast<int64_t>(g)) - mandatory[t];
    if (free_bytes < 0 || room[t] < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the cap of ", options.cap, " bytes is too small for the operation at log line ",
          trace.ops[t].line, " alone (", mandatory[t] * static_cast<int64_t>(g),
          " bytes of buffers it uses, ", plain, " of plain allocations)"));
    }
  }

  // Gaps of each stretch, and the initial Lagrangian weights: all on the
  // stretch's longest gap (where an optimum evicts first).
  std::vector<std::vector<int>> stretch_gaps(stretch_bytes.size());
  for (int i = 0; i < static_cast<int>(gaps.size()); ++i) {
    if (gaps[i].stretch >= 0) stretch_gaps[gaps[i].stretch].push_back(i);
  }
  std::vector<double> weight(gaps.size(), 0.0);
  for (const std::vector<int>& members : stretch_gaps) {
    if (members.empty()) continue;
    int longest = members[0];
    for (int i : members) {
      if (gaps[i].last - gaps[i].first > gaps[longest].last - gaps[longest].first) longest = i;
    }
    for (int i : members) weight[i] = 0.5 / members.size();
    weight[longest] += 0.5;
  }

  OptimumBound best;
  best.gaps = static_cast<int64_t>(gaps.size());
  best.points = points;
  bool have_best = false;
  std::vector<double> kept(gaps.size(), 0.0);
  const int rounds = std::max(1, options.rounds);
  for (int round = 0; round < rounds; ++round) {
    // Integer weights per stretch summing to kScale.
    std::vector<int64_t> alpha(gaps.size(), 0);
    for (const std::vector<int>& members : stretch_gaps) {
      if (members.empty()) continue;
      double sum = 0;
      for (int i : members) sum += weight[i];
      int64_t given = 0;
      int top = members[0];
      for (int i : members) {
        alpha[i] = static_cast<int64_t>(std::floor(weight[i] / sum * kScale));
        given += alpha[i];
        if (weight[i] > weight[top]) top = i;
      }
      alpha[top] += kScale - given;  // rounding remainder
    }
    MinCostFlow flow(points + 1);
    for (int t = 0; t < points; ++t) {
      flow.AddArc(t, t + 1, room[t], 0);
      flow.AddSupply(t, room[t] - (t > 0 ? room[t - 1] : 0));
    }
    flow.AddSupply(points, points > 0 ? -room[points - 1] : 0);
    int64_t total_cost = 0;  // every gap evicted, scaled
    std::vector<int> arc(gaps.size());
    std::vector<int64_t> cost(gaps.size());
    for (size_t i = 0; i < gaps.size(); ++i) {
      const Gap& gap = gaps[i];
      cost[i] = gap.swap_in * kScale + alpha[i] * static_cast<int64_t>(gap.bytes);
      total_cost += cost[i];
      // Savings per granule kept, rounded up: the bound only loosens.
      const int64_t saving = (cost[i] + gap.units - 1) / gap.units;
      arc[i] = flow.AddArc(gap.first, gap.last + 1, gap.units, -saving);
    }
    absl::StatusOr<int64_t> min_cost = flow.Solve();
    if (!min_cost.ok()) return min_cost.status();
    const int64_t scaled = std::max<int64_t>(0, total_cost + *min_cost);
    const uint64_t bound = static_cast<uint64_t>(scaled / kScale);
    double out = 0, in = 0;
    for (size_t i = 0; i < gaps.size(); ++i) {
      kept[i] = static_cast<double>(flow.Flow(arc[i])) / gaps[i].units;
      in += gaps[i].swap_in * (1 - kept[i]);
      out += static_cast<double>(alpha[i]) / kScale * gaps[i].bytes * (1 - kept[i]);
    }
    if (!have_best || bound > best.bytes_moved) {
      have_best = true;
      best.bytes_moved = bound;
      best.bytes_out = out;
      best.bytes_in = in;
      best.augmentations = flow.augmentations();
    }
    best.rounds = round + 1;
    // Multiplicative update: weight moves to the gaps the flow evicts, where
    // the stretch's write-back is really paid.
    bool moved = false;
    for (const std::vector<int>& members : stretch_gaps) {
      if (members.size() < 2) continue;
      for (int i : members) {
        weight[i] *= std::exp(2.0 * (1 - kept[i]));
        moved = true;
      }
    }
    if (!moved) break;  // nothing to reweigh: the bound is the LP's
  }
  return best;
}

}  // namespace stensor
