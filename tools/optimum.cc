#include "tools/optimum.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tools/keep_problem.h"
#include "tools/min_cost_flow.h"

namespace stensor {
namespace {

// Lagrangian weights are integers summing to kScale per stretch, so costs
// stay exact integers (bytes * kScale).
constexpr int64_t kScale = 1024;

}  // namespace

absl::StatusOr<OptimumBound> ComputeOptimumBound(const Workload& workload,
                                                 const OptimumOptions& options) {
  absl::StatusOr<KeepProblem> problem = BuildKeepProblem(workload, options.cap);
  if (!problem.ok()) return problem.status();
  return ComputeOptimumBound(*problem, options);
}

absl::StatusOr<OptimumBound> ComputeOptimumBound(const KeepProblem& problem,
                                                 const OptimumOptions& options) {
  const int points = problem.points;
  const std::vector<KeepGap>& gaps = problem.gaps;
  const std::vector<int64_t>& room = problem.room;
  const std::vector<uint64_t>& stretch_bytes = problem.stretch_bytes;

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
  // One graph for every round: free memory along the time line, kept
  // charge over each gap; rounds change the gaps' costs only.
  MinCostFlow flow(points + 1);
  for (int t = 0; t < points; ++t) {
    flow.AddArc(t, t + 1, room[t], 0);
    flow.AddSupply(t, room[t] - (t > 0 ? room[t - 1] : 0));
  }
  flow.AddSupply(points, points > 0 ? -room[points - 1] : 0);
  std::vector<int> arc(gaps.size());
  std::vector<int64_t> savings(gaps.size());
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
    int64_t total_cost = 0;  // every gap evicted, scaled
    for (size_t i = 0; i < gaps.size(); ++i) {
      const KeepGap& gap = gaps[i];
      const int64_t cost = gap.swap_in * kScale + alpha[i] * static_cast<int64_t>(gap.bytes);
      total_cost += cost;
      // Savings per granule kept, rounded up: the bound only loosens.
      const int64_t saving = (cost + gap.units - 1) / gap.units;
      if (round == 0) {
        arc[i] = flow.AddArc(gap.first, gap.last + 1, gap.units, -saving);
      } else if (saving != savings[i]) {
        flow.SetCost(arc[i], -saving);  // the next solve starts from this round's flow
      }
      savings[i] = saving;
    }
    absl::StatusOr<int64_t> min_cost = flow.Solve();
    if (!min_cost.ok()) return min_cost.status();
    const int64_t scaled = std::max<int64_t>(0, total_cost + *min_cost);
    const uint64_t bound = static_cast<uint64_t>(scaled / kScale);
    double out = 0, in = 0;
    bool whole = true;
    std::vector<bool> schedule(gaps.size());
    for (size_t i = 0; i < gaps.size(); ++i) {
      const int64_t units = flow.Flow(arc[i]);
      whole = whole && (units == 0 || units == gaps[i].units);
      schedule[i] = units == gaps[i].units;
      kept[i] = static_cast<double>(units) / gaps[i].units;
      in += gaps[i].swap_in * (1 - kept[i]);
      out += static_cast<double>(alpha[i]) / kScale * gaps[i].bytes * (1 - kept[i]);
    }
    if (!have_best || bound > best.bytes_moved) {
      have_best = true;
      best.bytes_moved = bound;
      best.bytes_out = out;
      best.bytes_in = in;
    }
    best.rounds = round + 1;
    best.phases = flow.phases();
    if (whole) {
      const ScheduleBytes bytes = CountSchedule(problem, schedule);
      if (!best.has_schedule || bytes.moved() < best.schedule_bytes.moved()) {
        best.has_schedule = true;
        best.schedule = std::move(schedule);
        best.schedule_bytes = bytes;
      }
    }
    // A schedule that moves the bound is an optimum: no round raises the
    // bound past it.
    if (best.proven()) break;
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
