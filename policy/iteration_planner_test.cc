#include "policy/iteration_planner.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "policy/eviction_policy.h"

namespace stensor {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kNever = EvictionCandidate::kNoNextUse;

IterationPlanner::Options Defaults() {
  IterationPlanner::Options o;
  o.bandwidth = Bandwidth{10e9, 10e9};
  o.compute_grace_ops = 8;
  return o;
}

std::unique_ptr<IterationPlanner> Make(IterationPlanner::Options o = Defaults()) {
  auto planner = IterationPlanner::Create(o);
  EXPECT_TRUE(planner.ok()) << planner.status();
  return planner.ok() ? std::move(*planner) : nullptr;
}

// One training step of four operations: forward over two weights (0, 1)
// reading the step's shard, backward, and an update. Shards are ids
// 100..103, read in a cycle of 4 steps; the activation is a temporary with
// a new id each step (1000 + step).
struct Step {
  uint64_t key;
  std::vector<BufferTouch> touches;
};
std::vector<Step> StepOps(int step) {
  const uint64_t shard = 100 + step % 4;
  const uint64_t act = 1000 + step;
  return {
      {11, {{0, 4 * kMiB, false}, {shard, 2 * kMiB, false}, {act, 2 * kMiB, true}}},
      {12, {{1, 4 * kMiB, false}, {act, 2 * kMiB, true}}},
      {13, {{1, 4 * kMiB, true}, {act, 2 * kMiB, false}}},
      {14, {{0, 4 * kMiB, true}, {act, 2 * kMiB, false}}},
  };
}

// Runs `steps` steps, reporting a compute time of 1 ms for every profiled
// operation at once; returns the predictions of every operation.
std::vector<std::vector<uint64_t>> RunSteps(IterationPlanner& p, int first, int steps,
                                            bool time_them = true) {
  std::vector<std::vector<uint64_t>> predictions;
  for (int s = first; s < first + steps; ++s) {
    for (const Step& op : StepOps(s)) {
      std::vector<uint64_t> next;
      uint64_t t = p.OnOperation(op.key, op.touches, &next);
      if (time_them && p.profiling()) p.OnComputeTime(t, 1e-3);
      predictions.push_back(next);
    }
  }
  return predictions;
}

// PredictUses, as the memory manager and `stensor sim` call it: the pieces
// of an allocation (neighbours among the uses) are one touch under its id,
// a write through any of them a write of it, and every use hears the next
// use its touch was predicted; the same steps told as merged touches
// through Predict get the same answers.
TEST(IterationPlannerTest, PredictUsesTellsAnAllocationsPiecesAsOneTouch) {
  std::unique_ptr<IterationPlanner> by_uses = Make();
  std::unique_ptr<IterationPlanner> by_touches = Make();
  ASSERT_NE(by_uses, nullptr);
  ASSERT_NE(by_touches, nullptr);
  IterationPlanner::Scratch scratch;
  for (int s = 0; s < 8; ++s) {
    for (const Step& op : StepOps(s)) {
      // Weight 0 held as two pieces of 2 MiB under its id; the second
      // piece is the one written.
      std::vector<IterationPlanner::Use> uses;
      for (const BufferTouch& t : op.touches) {
        if (t.id == 0) {
          uses.push_back({0, t.bytes, false, /*piece=*/true, false});
          uses.push_back({0, t.bytes, t.write, /*piece=*/true, false});
        } else {
          uses.push_back({t.id, t.bytes, t.write, false, /*pinned=*/t.id >= 100 && t.id < 1000});
        }
      }
      std::vector<uint64_t> heard(uses.size(), 0);
      const uint64_t time = by_uses->PredictUses(
          op.key, uses.size(), [&](size_t i) { return uses[i]; },
          [&](size_t i, uint64_t next) { heard[i] = next; }, &scratch);
      by_uses->Commit();
      std::vector<uint64_t> next;
      EXPECT_EQ(by_touches->Predict(op.key, op.touches, &next), time);
      by_touches->Commit();
      size_t u = 0;
      for (size_t t = 0; t < op.touches.size(); ++t) {
        const int pieces = op.touches[t].id == 0 ? 2 : 1;
        for (int k = 0; k < pieces; ++k, ++u) {
          EXPECT_EQ(heard[u], next[t]) << "step " << s << " key " << op.key << " use " << u;
        }
      }
      EXPECT_EQ(u, uses.size());
    }
  }
  // Both saw the pattern and profiled the same iteration: weight 0 one
  // buffer of its bytes, written where its second piece was.
  EXPECT_EQ(by_uses->NextUse(0), by_touches->NextUse(0));
  EXPECT_NE(by_uses->NextUse(0), kNever);
  ASSERT_TRUE(by_uses->has_profile());
  ASSERT_TRUE(by_touches->has_profile());
  const AccessProfile& got = *by_uses->profile();
  const AccessProfile& want = *by_touches->profile();
  ASSERT_EQ(got.period(), want.period());
  for (size_t phase = 0; phase < want.period(); ++phase) {
    EXPECT_EQ(got.bytes(phase), want.bytes(phase)) << "phase " << phase;
    const std::vector<BufferTouch>& g = got.op(phase).buffers;
    const std::vector<BufferTouch>& w = want.op(phase).buffers;
    ASSERT_EQ(g.size(), w.size()) << "phase " << phase;
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_EQ(g[i].id, w[i].id) << "phase " << phase;
      EXPECT_EQ(g[i].bytes, w[i].bytes) << "phase " << phase;
      EXPECT_EQ(g[i].write, w[i].write) << "phase " << phase;
    }
  }
}

TEST(IterationPlannerTest, RejectsABadBandwidth) {
  IterationPlanner::Options o = Defaults();
  o.bandwidth.d2h = 0;
  EXPECT_FALSE(IterationPlanner::Create(o).ok());
}

TEST(IterationPlannerTest, ProfilesOneIterationAfterThePatternIsFound) {
  auto p = Make();
  int profiled = 0;
  for (int s = 0; s < 6; ++s) {
    for (const Step& op : StepOps(s)) {
      uint64_t t = p->OnOperation(op.key, op.touches);
      if (p->profiling()) {
        ++profiled;
        p->OnComputeTime(t, 2e-3);
      }
    }
  }
  // Exactly one iteration was timed, and the profile holds it.
  EXPECT_EQ(profiled, 4);
  ASSERT_TRUE(p->has_profile());
  EXPECT_EQ(p->profile()->period(), 4u);
  EXPECT_EQ(p->profile()->unknown_phases(), 0u);
  EXPECT_DOUBLE_EQ(p->profile()->iteration_compute_seconds(), 8e-3);
  EXPECT_EQ(p->stats().profiles, 1u);
}

TEST(IterationPlannerTest, WaitsForLateComputeTimesThenBuildsWithoutThem) {
  auto p = Make();
  std::vector<uint64_t> timed;
  for (int s = 0; s < 4; ++s) {
    for (const Step& op : StepOps(s)) {
      uint64_t t = p->OnOperation(op.key, op.touches);
      if (p->profiling()) timed.push_back(t);
    }
  }
  ASSERT_EQ(timed.size(), 4u);
  EXPECT_FALSE(p->has_profile());  // its compute times are still in flight
  p->OnComputeTime(timed[0], 1e-3);
  p->OnComputeTime(timed[1], 1e-3);
  EXPECT_FALSE(p->has_profile());
  RunSteps(*p, 4, 3, /*time_them=*/false);  // past the grace of 8 operations
  ASSERT_TRUE(p->has_profile());
  EXPECT_EQ(p->profile()->unknown_phases(), 2u);
}

TEST(IterationPlannerTest, PredictsWeightsShardsAndTemporaries) {
  auto p = Make();
  auto predictions = RunSteps(*p, 0, 12);
  // Operations of step 10 start at time 40. Weight 0 (slot 0 of phase 0) is
  // next used at phase 3 of the same step; the shard four steps (16
  // operations) later; the new activation at phase 1, like last step's.
  const std::vector<uint64_t>& first = predictions[40];
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0], 43u);
  EXPECT_EQ(first[1], 56u);
  EXPECT_EQ(first[2], 41u);
  // The activation's last use (phase 3) is followed by its free: no next use.
  p->OnFreed(1000 + 11);
  auto later = RunSteps(*p, 12, 2);
  EXPECT_EQ(later[3][1], kNever);
}

// An argument the caller does not track in some steps (a buffer already
// freed, memory stensor does not manage) is left out of the touches; the
// others keep their argument's place as their slot, so a slot that sees its
// buffers freed does not pass "no next use" to the argument after it.
TEST(IterationPlannerTest, SlotsAreArgumentPlacesNotTouchIndices) {
  auto p = Make();
  for (int s = 0; s < 12; ++s) {
    const uint64_t tokens = 500 + s, grad = 900 + s;
    std::vector<BufferTouch> backward;
    if (s % 2 == 0) backward.push_back({tokens, kMiB, false, /*position=*/0});
    backward.push_back({grad, 4 * kMiB, true, /*position=*/1});
    std::vector<uint64_t> next;
    const uint64_t t = p->OnOperation(21, backward, &next);
    if (p->profiling()) p->OnComputeTime(t, 1e-3);
    const uint64_t grad_next = next.back();
    if (s % 2 == 0) p->OnFreed(tokens);  // read once
    const uint64_t u = p->OnOperation(22, {{grad, 4 * kMiB, false, /*position=*/0}}, &next);
    if (p->profiling()) p->OnComputeTime(u, 1e-3);
    p->OnFreed(grad);  // the update was its last use
    if (s >= 6) EXPECT_EQ(grad_next, u) << "step " << s;
  }
}

TEST(IterationPlannerTest, AChangedPatternDropsTheProfileAndProfilesAgain) {
  auto p = Make();
  RunSteps(*p, 0, 6);
  ASSERT_TRUE(p->has_profile());
  // An evaluation phase: other kernels for a while.
  for (int i = 0; i < 40; ++i) {
    BufferTouch t{0, 4 * kMiB, false};
    p->OnOperation(50 + i % 3, absl::MakeConstSpan(&t, 1));
  }
  EXPECT_GE(p->stats().pattern_changes, 1u);
  RunSteps(*p, 6, 8);
  EXPECT_TRUE(p->has_profile());
  EXPECT_EQ(p->profile()->period(), 4u);
  EXPECT_GE(p->stats().profiles, 2u);
}

TEST(IterationPlannerTest, PlansNothingWithPrefetchOffOrWithoutAProfile) {
  IterationPlanner::Options off = Defaults();
  off.prefetch = false;
  auto p = Make(off);
  EXPECT_TRUE(p->Plan(64 * kMiB).empty());
  RunSteps(*p, 0, 8);
  ASSERT_TRUE(p->has_profile());
  p->OnEvicted(100);
  EXPECT_TRUE(p->Plan(64 * kMiB).empty());
  // Next uses are predicted all the same (belady needs them).
  EXPECT_NE(p->NextUse(0), kNever);
}

TEST(IterationPlannerTest, FetchesASwappedOutShardBeforeItsUse) {
  auto p = Make();
  RunSteps(*p, 0, 7);
  ASSERT_TRUE(p->has_profile());
  // Shard 100 is read again at step 8: swapped out now, it must be fetched
  // while step 7 runs.
  p->OnEvicted(100);
  bool fetched = false;
  for (const Step& op : StepOps(7)) {
    p->OnOperation(op.key, op.touches);
    for (const PlannedAction& a : p->Plan(64 * kMiB)) {
      if (a.kind == PlannedAction::Kind::kFetch && a.id == 100) fetched = true;
    }
  }
  EXPECT_TRUE(fetched);
}

// Predict, the swap-ins' OnResident, then Commit gives the predictions and
// the plans that OnResident then OnOperation gives (the prefetch planner
// hears of the uses after the swap-ins either way); a Predict left
// uncommitted (an operation that failed, another thread's) is committed by
// the next one. Shards are evicted and brought back on demand so that both
// orders have swap-ins to place and the planner fetches to propose.
TEST(IterationPlannerTest, PredictThenCommitPlansAsOnOperationAfterTheSwapIns) {
  auto whole = Make();
  auto split = Make();
  std::vector<std::string> plans[2];
  auto plan_of = [](IterationPlanner& p) {
    std::string text;
    for (const PlannedAction& a : p.Plan(12 * kMiB)) {
      absl::StrAppend(&text, a.kind == PlannedAction::Kind::kFetch ? "F" : "E", a.id, " ");
      if (a.kind == PlannedAction::Kind::kFetch) p.CancelFetch(a.id);
    }
    return text;
  };
  int op_index = 0;
  for (int s = 0; s < 12; ++s) {
    for (const Step& op : StepOps(s)) {
      // From step 6, the shard read two steps later goes once step s's
      // forward started, and comes back on demand (its fetches cancelled).
      const bool reads_shard = op.key == 11 && s >= 6;
      const uint64_t shard = 100 + s % 4;
      if (op.key == 12 && s >= 4) {
        whole->OnEvicted(100 + (s + 2) % 4);
        split->OnEvicted(100 + (s + 2) % 4);
      }
      std::vector<uint64_t> a, b;
      if (reads_shard) whole->OnResident(shard);
      const uint64_t ta = whole->OnOperation(op.key, op.touches, &a);
      uint64_t tb = 0;
      if (op_index % 5 == 3) {
        // Left uncommitted, as a failed Prepare leaves it: the next
        // operation's Predict commits it first.
        tb = split->Predict(op.key, op.touches, &b);
        if (reads_shard) split->OnResident(shard);
      } else {
        tb = split->Predict(op.key, op.touches, &b);
        if (reads_shard) split->OnResident(shard);
        split->Commit();
      }
      EXPECT_EQ(ta, tb);
      EXPECT_EQ(a, b) << "operation " << op_index;
      if (whole->profiling()) whole->OnComputeTime(ta, 1e-3);
      if (split->profiling()) split->OnComputeTime(tb, 1e-3);
      if (op_index % 5 != 3) {
        plans[0].push_back(plan_of(*whole));
        plans[1].push_back(plan_of(*split));
      }
      ++op_index;
    }
  }
  EXPECT_TRUE(split->has_profile());
  EXPECT_EQ(plans[0], plans[1]);
  // The prefetch planner counted the same swap-ins, fetches and bytes.
  const PrefetchPlanner::Stats w = whole->stats().planner, p = split->stats().planner;
  EXPECT_EQ(w.on_demand, p.on_demand);
  EXPECT_EQ(w.bytes_moved, p.bytes_moved);
  EXPECT_EQ(w.fetches, p.fetches);
  // Not empty: the planner fetched the evicted shards.
  EXPECT_TRUE(std::any_of(plans[1].begin(), plans[1].end(),
                          [](const std::string& p) { return !p.empty(); }));
}

// Shards written one after another at start (key 20), then read one per
// step: once the step is known and two reads showed the walk, the planner
// names the shard of the next step before any shard was read twice, hands
// it to the caller among the re-predicted buffers, and fetches it, swapped
// out, within the step before its read.
TEST(IterationPlannerTest, FetchesTheNextShardInItsFirstCycle) {
  auto p = Make();
  constexpr int kShards = 12;
  for (int s = 0; s < kShards; ++s) {
    BufferTouch init{uint64_t{100} + s, 2 * kMiB, true};
    p->OnOperation(20, absl::MakeConstSpan(&init, 1));
  }
  // Steps as StepOps, but reading shard 100 + step of 12.
  const auto step_ops = [](int step) {
    std::vector<Step> ops = StepOps(step);
    ops[0].touches[1].id = 100 + step % kShards;
    return ops;
  };
  for (int s = 0; s < 6; ++s) {
    for (const Step& op : step_ops(s)) {
      uint64_t t = p->OnOperation(op.key, op.touches);
      if (p->profiling()) p->OnComputeTime(t, 1e-3);
    }
  }
  ASSERT_TRUE(p->has_profile());
  p->OnEvicted(107);  // never read yet; read at step 7
  bool named = false, fetched = false;
  const std::vector<Step> ops = step_ops(6);
  for (size_t i = 0; i < ops.size(); ++i) {
    std::vector<uint64_t> next;
    std::vector<std::pair<uint64_t, uint64_t>> repredicted;
    const uint64_t t = p->OnOperation(ops[i].key, ops[i].touches, &next, &repredicted);
    for (const auto& [id, use] : repredicted) {
      if (id == 107) {
        named = true;
        EXPECT_EQ(use, t + 4);  // phase 0 of the next step
      }
    }
    for (const PlannedAction& a : p->Plan(64 * kMiB)) {
      if (a.kind == PlannedAction::Kind::kFetch && a.id == 107) fetched = true;
    }
  }
  EXPECT_TRUE(named);
  EXPECT_TRUE(fetched);
  EXPECT_EQ(p->NextUse(107), 7u * 4 + kShards);
}

// A step whose loader copy (another thread's) lands a place or two off from
// one step to the next: the detector keeps the iteration, and the profile is
// built anyway, at the detector's phases (the copy where the first
// iteration had it; a phase skipped in the recorded one holds no buffers).
TEST(IterationPlannerTest, ProfilesAnIterationWhoseOperationsLandAFewPlacesOff) {
  auto p = Make();
  auto step_ops = [](int step) {
    std::mt19937_64 rng(7);  // the same launches every step, in no shorter order
    std::vector<Step> ops;
    for (int k = 0; k < 96; ++k) {
      ops.push_back({20 + rng() % 12, {{rng() % 5, kMiB, false}}});
    }
    const int at = 40 + (step * 3) % 4;
    ops.insert(ops.begin() + at, Step{99, {{50, kMiB, true}}});
    return ops;
  };
  for (int s = 0; s < 14; ++s) {
    for (const Step& op : step_ops(s)) {
      uint64_t t = p->OnOperation(op.key, op.touches);
      if (p->profiling()) p->OnComputeTime(t, 1e-3);
    }
  }
  ASSERT_TRUE(p->has_profile()) << "profiles abandoned: " << p->stats().abandoned_profiles;
  EXPECT_EQ(p->profile()->period(), 97u);
  EXPECT_EQ(p->stats().pattern_changes, 0u);
}

// The iteration reported is the one profiled for the most operations, not
// the last: a run that ends in a loop of identical read-backs profiles a
// pattern of one operation there.
TEST(IterationPlannerTest, ReportsTheIterationInUseLongestNotTheLastOne) {
  auto p = Make();
  RunSteps(*p, 0, 20);
  ASSERT_TRUE(p->has_profile());
  for (int i = 0; i < 40; ++i) p->OnOperation(77, {{500, kMiB, false}});
  EXPECT_EQ(p->stats().last_period, 1u);
  EXPECT_EQ(p->stats().main_period, 4u);
}

}  // namespace
}  // namespace stensor
