#include "tools/optimum.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policy/eviction_policy.h"
#include "tools/exact_optimum.h"
#include "tools/replay.h"
#include "tools/step_bound.h"
#include "tools/test_log.h"
#include "tools/workload.h"
#include "tools/workload_lives_testing.h"

namespace stensor {
namespace {

constexpr uint64_t kMiB = TestLog::kMiB;

uint64_t Bound(const std::string& log, uint64_t cap) {
  absl::StatusOr<Workload> workload = ParseWorkload(log);
  EXPECT_TRUE(workload.ok()) << workload.status();
  OptimumOptions options;
  options.cap = cap;
  absl::StatusOr<OptimumBound> bound = ComputeOptimumBound(*workload, options);
  EXPECT_TRUE(bound.ok()) << bound.status();
  return bound.ok() ? bound->bytes_moved : 0;
}

// The replay test's three buffers under two granules, by hand: at the
// allocation of C one of A, B must be out; keeping B over its gap and
// evicting A once (write-back 2 MiB + swap-in 2 MiB; A is clean after, so
// dropping it again is free) costs 4 MiB, what `version` moves; evicting
// B instead costs 4 MiB too, plus C's write-back at the end.
TEST(OptimumTest, HandCheckedThreeBuffers) {
  TestLog log;
  uint64_t a = log.Alloc(2 * kMiB), b = log.Alloc(2 * kMiB);
  log.Launch({}, {a});
  log.Launch({}, {b});
  uint64_t c = log.Alloc(2 * kMiB);
  log.Launch({a}, {});
  log.Launch({}, {c});
  log.Launch({b}, {});
  EXPECT_EQ(Bound(log.Text(), 4 * kMiB), 4 * kMiB);
  EXPECT_EQ(Bound(log.Text(), 6 * kMiB), 0u);
}

// A buffer read again and again while another needs the room: the
// write-back is paid once, the swap-ins each time.
TEST(OptimumTest, WriteBackOncePerWrittenStretch) {
  TestLog log;
  uint64_t a = log.Alloc(2 * kMiB);
  log.Launch({}, {a});
  uint64_t b = log.Alloc(2 * kMiB);
  log.Launch({}, {b});
  for (int i = 0; i < 3; ++i) {
    log.Launch({a}, {});
    log.Launch({b}, {});
  }
  // Cap of one granule: each of the 6 alternating reads swaps its buffer in
  // (12 MiB); each buffer is written back once, at its first eviction after
  // its write (4 MiB); the later evictions are clean drops.
  EXPECT_EQ(Bound(log.Text(), 2 * kMiB), 2 * kMiB /*A out*/ + 2 * kMiB /*B out*/ + 6 * 2 * kMiB);
}

// A graph launch through a table one of its nodes wrote may have written
// whatever it reached: the buffers it names count as written, so each
// eviction of A after one copies it out again (3 x 2 MiB more than after
// plain reads). One whose nodes were not read names nothing, and is counted
// apart.
TEST(OptimumTest, GraphLaunchThroughATableItWroteWritesWhatItNames) {
  auto make = [](bool unknown_tables) {
    TestLog log;
    uint64_t a = log.Alloc(2 * kMiB);
    log.Launch({}, {a});
    uint64_t b = log.Alloc(2 * kMiB);
    log.Launch({}, {b});
    for (int i = 0; i < 3; ++i) {
      log.GraphLaunch({a}, {}, unknown_tables);
      log.Launch({b}, {});
    }
    log.BlindGraphLaunch();
    return log.Text();
  };
  absl::StatusOr<Workload> workload = ParseWorkload(make(true));
  ASSERT_TRUE(workload.ok()) << workload.status();
  EXPECT_EQ(workload->launches, 9u);
  EXPECT_EQ(workload->unknown_launches, 4u);
  EXPECT_EQ(workload->blind_launches, 1u);
  EXPECT_EQ(Bound(make(false), 2 * kMiB), 16 * kMiB);
  EXPECT_EQ(Bound(make(true), 2 * kMiB), 22 * kMiB);
}

TEST(OptimumTest, TooSmallACapIsAnError) {
  TestLog log;
  uint64_t a = log.Alloc(2 * kMiB), b = log.Alloc(2 * kMiB);
  log.Launch({a, b}, {});
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok());
  OptimumOptions options;
  options.cap = 3 * kMiB;
  EXPECT_EQ(ComputeOptimumBound(*workload, options).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ExactOptions exact;
  exact.cap = 3 * kMiB;
  EXPECT_EQ(ComputeExactOptimum(*workload, exact).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// --- Brute force over every keep/evict choice, by walking each buffer's
// timeline with the swap rules (independent of the flow's gap model).
struct BruteResult {
  bool feasible = false;
  uint64_t bytes = 0;
  // The fewest bytes copied in, and written back, by any schedule (not
  // necessarily the same one, nor the one moving `bytes`).
  uint64_t bytes_in = 0, bytes_out = 0;
  bool one_gap_per_stretch = true;  // then the LP is exact for unit charges
};

BruteResult BruteForce(const Workload& workload, uint64_t cap) {
  const int points = static_cast<int>(workload.ops.size());
  using Event = WorkloadLives::Use;
  const WorkloadLives read = ReadLives(workload);
  const std::vector<int64_t>& plain = read.plain;
  std::vector<WorkloadLives::Life> lives = read.lives;
  for (WorkloadLives::Life& l : lives) l.uses.insert(l.uses.begin(), {l.alloc, false, false});
  // Gaps with at least one point: (buffer, first, last).
  struct Gap {
    size_t life;
    int first, last;
  };
  std::vector<Gap> gaps;
  BruteResult result;
  for (size_t i = 0; i < lives.size(); ++i) {
    const WorkloadLives::Life& l = lives[i];
    int gaps_in_stretch = 0;
    for (size_t j = 0; j < l.uses.size(); ++j) {
      if (l.uses[j].write) gaps_in_stretch = 0;
      const int next = j + 1 < l.uses.size() ? l.uses[j + 1].t : l.end;
      if (l.uses[j].t + 1 <= next - 1) {
        gaps.push_back({i, l.uses[j].t + 1, next - 1});
        bool written = false;
        for (size_t k = 0; k <= j; ++k) written |= l.uses[k].write;
        if (written && ++gaps_in_stretch > 1) result.one_gap_per_stretch = false;
      }
    }
  }
  EXPECT_LE(gaps.size(), 16u);
  for (uint64_t mask = 0; mask < (uint64_t{1} << gaps.size()); ++mask) {
    // Residency of each buffer at each point.
    std::vector<std::vector<bool>> res(lives.size(), std::vector<bool>(points, false));
    for (size_t i = 0; i < lives.size(); ++i) {
      for (const Event& e : lives[i].uses) res[i][e.t] = true;
    }
    for (size_t k = 0; k < gaps.size(); ++k) {
      if (mask >> k & 1) {
        for (int t = gaps[k].first; t <= gaps[k].last; ++t) res[gaps[k].life][t] = true;
      }
    }
    bool fits = true;
    for (int t = 0; t < points && fits; ++t) {
      uint64_t used = plain[t];
      for (size_t i = 0; i < lives.size(); ++i) used += res[i][t] ? lives[i].b->charge : 0;
      fits = used <= cap;
    }
    if (!fits) continue;
    uint64_t in = 0, out = 0;
    for (size_t i = 0; i < lives.size(); ++i) {
      const WorkloadLives::Life& l = lives[i];
      bool prev = true, dirty = false, written = false;
      size_t next_use = 0;
      for (int t = l.alloc; t < l.end; ++t) {
        const bool r = res[i][t];
        const Event* use =
            next_use < l.uses.size() && l.uses[next_use].t == t ? &l.uses[next_use++] : nullptr;
        if (prev && !r && dirty) {  // evicted: a dirty copy is written back
          out += l.b->bytes;
          dirty = false;
        }
        if (!prev && r && written && !use->overwritten) in += l.b->bytes;  // swapped in
        if (use != nullptr && use->write) dirty = written = true;
        prev = r;
      }
    }
    if (!result.feasible || in + out < result.bytes) result.bytes = in + out;
    if (!result.feasible || in < result.bytes_in) result.bytes_in = in;
    if (!result.feasible || out < result.bytes_out) result.bytes_out = out;
    result.feasible = true;
  }
  return result;
}

// Three buffers written, then read in a cycle, two fitting. Before an
// iteration is detected nothing predicts, and belady falls back to least
// recently used: the one needed next goes every time. With the true future
// (ReplayOptions::oracle) the rule moves what the exact optimum moves.
TEST(OptimumTest, BeladyOnTheTrueFutureReachesTheOptimumWherePredictionCannot) {
  TestLog log;
  std::vector<uint64_t> ids = {log.Alloc(2 * kMiB), log.Alloc(2 * kMiB), log.Alloc(2 * kMiB)};
  for (uint64_t id : ids) log.Launch({}, {id});
  for (int round = 0; round < 2; ++round) {
    for (uint64_t id : ids) log.Launch({id}, {});
  }
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  ExactOptions exact_options;
  exact_options.cap = 4 * kMiB;
  absl::StatusOr<ExactOptimum> exact = ComputeExactOptimum(*workload, exact_options);
  ASSERT_TRUE(exact.ok()) << exact.status();
  ASSERT_TRUE(exact->proven);
  uint64_t moved[2];
  for (bool oracle : {false, true}) {
    std::unique_ptr<EvictionPolicy> belady = MakeBeladyPolicy();
    ReplayOptions replay;
    replay.cap = 4 * kMiB;
    replay.policy = belady.get();
    replay.oracle = oracle;
    replay.host_vmm = false;  // the optimum's rules: nothing served
    absl::StatusOr<ReplayResult> r = Replay(*workload, replay);
    ASSERT_TRUE(r.ok()) << r.status();
    moved[oracle] = r->bytes_moved();
  }
  EXPECT_EQ(moved[true], exact->bytes_moved);
  EXPECT_GT(moved[false], moved[true]);
}

TEST(OptimumTest, BoundsBruteForceAndEveryPolicyOnRandomWorkloads) {
  std::mt19937 rng(1201);
  int exact_checked = 0, checked = 0, bound_below_exact = 0, proven_by_bound = 0;
  int step_in_tight = 0, step_out_tight = 0;
  for (int trial = 0; trial < 400; ++trial) {
    TestLog log;
    const bool unit = trial % 2 == 0;  // every buffer one granule
    std::vector<uint64_t> live;
    const int buffers = 2 + rng() % 2;
    for (int i = 0; i < buffers; ++i) {
      uint64_t bytes = (unit ? 1 : 1 + rng() % 2) * 2 * kMiB - (rng() % 2) * 4096;
      live.push_back(log.Alloc(bytes));
    }
    if (rng() % 3 == 0) log.Alloc(4096 * (1 + rng() % 3));  // a plain one
    const int ops = 4 + rng() % 4;
    log.RandomOps(rng, live, ops);
    if (rng() % 2) log.Free(live[0]);
    absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
    ASSERT_TRUE(workload.ok()) << workload.status();
    uint64_t cap = 2 * kMiB * (1 + rng() % 4) + (rng() % 2) * 12288;
    BruteResult brute = BruteForce(*workload, cap);
    OptimumOptions options;
    options.cap = cap;
    absl::StatusOr<OptimumBound> bound = ComputeOptimumBound(*workload, options);
    if (!brute.feasible) {
      EXPECT_FALSE(bound.ok()) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(bound.ok()) << "trial " << trial << ": " << bound.status();
    ++checked;
    EXPECT_LE(bound->bytes_moved, brute.bytes) << "trial " << trial << "\n" << log.Text();
    // Each direction's bound is below what every schedule moves that way.
    StepBoundOptions step_options;
    step_options.cap = cap;
    step_options.serving = false;
    absl::StatusOr<StepBound> step = ComputeStepBound(*workload, step_options);
    ASSERT_TRUE(step.ok()) << "trial " << trial << ": " << step.status();
    EXPECT_LE(step->bytes_in, brute.bytes_in) << "trial " << trial << "\n" << log.Text();
    EXPECT_LE(step->bytes_out, brute.bytes_out) << "trial " << trial << "\n" << log.Text();
    EXPECT_LE(step->bytes_moved, brute.bytes) << "trial " << trial << "\n" << log.Text();
    // Given the LP bound computed already, the same bound.
    StepBoundOptions given = step_options;
    given.both_ways = &*bound;
    absl::StatusOr<StepBound> reused = ComputeStepBound(*workload, given);
    ASSERT_TRUE(reused.ok()) << "trial " << trial;
    EXPECT_EQ(reused->bytes_moved, step->bytes_moved) << "trial " << trial;
    step_in_tight += step->bytes_in == brute.bytes_in && brute.bytes_in > 0;
    step_out_tight += step->bytes_out == brute.bytes_out && brute.bytes_out > 0;
    // The exact optimum is the brute force's, always.
    ExactOptions exact_options;
    exact_options.cap = cap;
    absl::StatusOr<ExactOptimum> exact = ComputeExactOptimum(*workload, exact_options);
    ASSERT_TRUE(exact.ok()) << "trial " << trial << ": " << exact.status();
    EXPECT_TRUE(exact->proven) << "trial " << trial;
    EXPECT_EQ(exact->bytes_moved, brute.bytes) << "trial " << trial << "\n" << log.Text();
    if (exact->bytes_moved > bound->bytes_moved) ++bound_below_exact;
    // A whole schedule of the bound's is a schedule: it moves no less than
    // the optimum, and when it moves the bound, it is the optimum, which
    // the exact solver then returns without a search.
    if (bound->has_schedule) {
      EXPECT_GE(bound->schedule_bytes.moved(), brute.bytes) << "trial " << trial;
      ExactOptions by_bound = exact_options;
      by_bound.bound = &*bound;
      absl::StatusOr<ExactOptimum> shortcut = ComputeExactOptimum(*workload, by_bound);
      ASSERT_TRUE(shortcut.ok()) << "trial " << trial << ": " << shortcut.status();
      EXPECT_TRUE(shortcut->proven) << "trial " << trial;
      EXPECT_EQ(shortcut->bytes_moved, brute.bytes) << "trial " << trial;
      EXPECT_EQ(shortcut->by_bound, bound->proven()) << "trial " << trial;
      proven_by_bound += bound->proven();
    }
    if (unit && brute.one_gap_per_stretch) {
      ++exact_checked;
      EXPECT_EQ(bound->bytes_moved, brute.bytes) << "trial " << trial << "\n" << log.Text();
    }
    // No policy beats the optimum of its rules, even knowing the future.
    for (int which = 0; which < 7; ++which) {
      const bool lru = which % 3 == 0;
      std::unique_ptr<EvictionPolicy> policy = lru              ? MakeLruPolicy()
                                               : which % 3 == 1 ? MakeVersionPolicy()
                                                                : MakeBeladyPolicy();
      ReplayOptions replay;
      replay.cap = cap;
      replay.policy = policy.get();
      replay.version_rules = !lru;
      replay.prefetch = which >= 3 && which < 6;
      replay.oracle = which == 6;
      replay.host_vmm = false;                        // the optimum's rules: nothing served
      replay.d2h_bandwidth_gbps = which % 2 ? 4 : 0;  // a slower way back, or the same
      absl::StatusOr<ReplayResult> r = Replay(*workload, replay);
      ASSERT_TRUE(r.ok()) << "trial " << trial << ": " << r.status();
      EXPECT_GE(r->bytes_moved(), brute.bytes)
          << "trial " << trial << " policy " << policy->name() << " prefetch " << replay.prefetch;
      // Nor does its plan finish, copies drained, before the time bound.
      StepBoundOptions timed = step_options;
      timed.bandwidth_gbps = replay.bandwidth_gbps;
      timed.d2h_bandwidth_gbps = replay.d2h_bandwidth_gbps;
      timed.kernel_us = replay.kernel_us;
      absl::StatusOr<StepBound> time_bound = ComputeStepBound(*workload, timed);
      ASSERT_TRUE(time_bound.ok()) << "trial " << trial;
      EXPECT_LE(time_bound->us(), r->drained_us * (1 + 1e-9))
          << "trial " << trial << " policy " << policy->name() << "\n"
          << log.Text();
    }
  }
  EXPECT_GT(checked, 150);
  EXPECT_GT(exact_checked, 30);
  // Workloads where fractional keeps help exist, so the exact check is not the bound's.
  EXPECT_GT(bound_below_exact, 0);
  // And the bound's whole schedule proves the optimum on many.
  EXPECT_GT(proven_by_bound, 30);
  // The bounds of each direction reach what schedules must move, often.
  EXPECT_GT(step_in_tight, 10);
  EXPECT_GT(step_out_tight, 10);
}

}  // namespace
}  // namespace stensor
