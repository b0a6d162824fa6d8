#include "tools/serving_optimum.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policy/eviction_policy.h"
#include "tools/exact_optimum.h"
#include "tools/keep_problem.h"
#include "tools/replay.h"
#include "tools/step_bound.h"
#include "tools/test_log.h"
#include "tools/workload.h"
#include "tools/workload_lives_testing.h"

namespace stensor {
namespace {

constexpr uint64_t kMiB = TestLog::kMiB;

// Two buffers written, then one operation reading both under a cap of one
// granule: no whole-buffer schedule exists, and the cheapest with serving
// moves 4 MiB (B served at its write and its read, born on the host; or A
// written back and served at the read).
TEST(ServingOptimumTest, AnOperationLargerThanTheCapIsServedByHand) {
  TestLog log;
  const uint64_t a = log.Alloc(2 * kMiB), b = log.Alloc(2 * kMiB);
  log.Launch({}, {a});
  log.Launch({}, {b});
  log.Launch({a, b}, {});
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  ExactOptions whole;
  whole.cap = 2 * kMiB;
  EXPECT_EQ(ComputeExactOptimum(*workload, whole).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ServingOptions options;
  options.cap = 2 * kMiB;
  absl::StatusOr<ServingOptimum> served = ComputeServingOptimum(*workload, options);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_TRUE(served->proven);
  EXPECT_EQ(served->moved(), 4 * kMiB);
  EXPECT_EQ(served->lower_bound, 4 * kMiB);
  EXPECT_GE(served->served_uses, 1);
}

// A write served from host leaves the host copy the newest: brought in
// later, the buffer leaves again for free. One granule of room; A and B
// written by one operation, then B read 4 times, A 4 times, B 4 times. The
// optimum serves A's write (2 MiB), keeps B for its reads, writes B back and
// brings A in (4 MiB), then brings B back while A, clean, goes (2 MiB).
TEST(ServingOptimumTest, AServedWriteLeavesTheHostCopyCurrent) {
  TestLog log;
  const uint64_t a = log.Alloc(2 * kMiB), b = log.Alloc(2 * kMiB);
  log.Launch({}, {a, b});
  for (uint64_t id : {b, a, b}) {
    for (int i = 0; i < 4; ++i) log.Launch({id}, {});
  }
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  ServingOptions options;
  options.cap = 2 * kMiB;
  absl::StatusOr<ServingOptimum> served = ComputeServingOptimum(*workload, options);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_TRUE(served->proven);
  EXPECT_EQ(served->moved(), 8 * kMiB);
  EXPECT_EQ(served->bytes_served, 2 * kMiB);
  EXPECT_EQ(served->bytes_out, 2 * kMiB);
  EXPECT_EQ(served->bytes_in, 4 * kMiB);
}

TEST(ServingOptimumTest, PlainAllocationsPastTheCapAreAnError) {
  TestLog log;
  log.Alloc(3 * 4096);
  const uint64_t a = log.Alloc(2 * kMiB);
  log.Launch({a}, {a});
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  ServingOptions options;
  options.cap = 2 * 4096;
  EXPECT_EQ(ComputeServingOptimum(*workload, options).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// With every use resident the schedule counts what the whole-buffer one
// does: the two models agree where serving is not chosen.
TEST(ServingOptimumTest, AllResidentCountsAsTheWholeBufferSchedule) {
  TestLog log;
  std::vector<uint64_t> ids = {log.Alloc(2 * kMiB), log.Alloc(4 * kMiB), log.Alloc(2 * kMiB)};
  for (uint64_t id : ids) log.Launch({}, {id});
  for (int round = 0; round < 3; ++round) {
    for (uint64_t id : ids)
      log.Launch({id}, round == 1 ? std::vector<uint64_t>{id} : std::vector<uint64_t>{});
  }
  log.Free(ids[0]);
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  absl::StatusOr<KeepProblem> problem = BuildKeepProblem(*workload, 6 * kMiB, /*serving=*/true);
  ASSERT_TRUE(problem.ok()) << problem.status();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 64; ++trial) {
    std::vector<bool> kept_gaps(problem->gaps.size());
    for (size_t i = 0; i < kept_gaps.size(); ++i) kept_gaps[i] = rng() % 2;
    std::vector<bool> resident(problem->uses.size(), true), kept_links(problem->links.size());
    for (size_t l = 0; l < kept_links.size(); ++l) {
      const int gap = problem->links[l].gap;
      kept_links[l] = gap < 0 || kept_gaps[gap];
    }
    const ScheduleBytes whole = CountSchedule(*problem, kept_gaps);
    const ServeScheduleBytes with = CountServeSchedule(*problem, resident, kept_links);
    EXPECT_EQ(with.out, whole.out) << "trial " << trial;
    EXPECT_EQ(with.in, whole.in) << "trial " << trial;
    EXPECT_EQ(with.served, 0u);
  }
}

// --- Brute force over every residency of every buffer at every point of
// its life, walked with the swap rules (independent of the use/link model):
// leaving the device costs a write-back when the device copy is newer,
// coming back a swap-in once written (unless that use overwrites it whole),
// a use off the device its bytes (none at the allocation), and a served
// write leaves the host copy the newest.
struct BruteResult {
  bool feasible = false;
  uint64_t bytes = 0;
  uint64_t in_and_served = 0;  // the fewest bytes any schedule copies in and serves
};

BruteResult BruteForce(const Workload& workload, uint64_t cap) {
  const int points = static_cast<int>(workload.ops.size());
  const WorkloadLives read = ReadLives(workload);
  const std::vector<WorkloadLives::Life>& lives = read.lives;
  const std::vector<int64_t>& plain = read.plain;
  // One bit per buffer and point of its life.
  std::vector<int> offset(lives.size());
  int bits = 0;
  for (size_t i = 0; i < lives.size(); ++i) {
    offset[i] = bits;
    bits += lives[i].end - lives[i].alloc;
  }
  EXPECT_LE(bits, 24);
  BruteResult result;
  for (uint64_t mask = 0; mask < (uint64_t{1} << bits); ++mask) {
    auto resident = [&](size_t i, int t) {
      return t >= lives[i].alloc && t < lives[i].end &&
             (mask >> (offset[i] + t - lives[i].alloc) & 1);
    };
    bool fits = true;
    for (int t = 0; t < points && fits; ++t) {
      uint64_t used = plain[t];
      for (size_t i = 0; i < lives.size(); ++i) used += resident(i, t) ? lives[i].b->charge : 0;
      fits = used <= cap;
    }
    if (!fits) continue;
    uint64_t bytes = 0, to_device = 0;
    for (size_t i = 0; i < lives.size(); ++i) {
      const WorkloadLives::Life& l = lives[i];
      bool prev = resident(i, l.alloc), dirty = false, written = false;
      size_t next_use = 0;
      for (int t = l.alloc; t < l.end; ++t) {
        const bool r = resident(i, t);
        const WorkloadLives::Use* use =
            next_use < l.uses.size() && l.uses[next_use].t == t ? &l.uses[next_use++] : nullptr;
        if (t > l.alloc) {
          if (prev && !r && dirty) {
            bytes += l.b->bytes;  // written back
            dirty = false;
          }
          if (!prev && r && written && !(use != nullptr && use->overwritten)) {
            bytes += l.b->bytes;  // swapped in
            to_device += l.b->bytes;
          }
        }
        if (use != nullptr) {
          if (!r) {
            bytes += l.b->bytes;  // served over the link
            to_device += l.b->bytes;
          }
          if (use->write) {
            written = true;
            dirty = r;  // served: the host copy is the newest
          }
        }
        prev = r;
      }
    }
    if (!result.feasible || bytes < result.bytes) result.bytes = bytes;
    if (!result.feasible || to_device < result.in_and_served) result.in_and_served = to_device;
    result.feasible = true;
  }
  return result;
}

TEST(ServingOptimumTest, MatchesBruteForceOnRandomWorkloads) {
  std::mt19937 rng(2024);
  int checked = 0, served_cheaper = 0, whole_infeasible = 0, step_in_tight = 0;
  for (int trial = 0; trial < 160; ++trial) {
    TestLog log;
    std::vector<uint64_t> live;
    const int buffers = 2 + rng() % 2;
    for (int i = 0; i < buffers; ++i) {
      live.push_back(log.Alloc((1 + rng() % 2) * 2 * kMiB - (rng() % 2) * 4096));
    }
    if (rng() % 3 == 0) log.Alloc(4096 * (1 + rng() % 3));  // a plain one
    const int ops = buffers == 2 ? 4 + rng() % 4 : 3 + rng() % 2;
    log.RandomOps(rng, live, ops);
    if (rng() % 2) log.Free(live[0]);
    absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
    ASSERT_TRUE(workload.ok()) << workload.status();
    const uint64_t cap = 2 * kMiB * (rng() % 4) + (rng() % 2) * 12288;
    const BruteResult brute = BruteForce(*workload, cap);
    ServingOptions options;
    options.cap = cap;
    absl::StatusOr<ServingOptimum> served = ComputeServingOptimum(*workload, options);
    if (!brute.feasible) {
      EXPECT_EQ(served.status().code(), absl::StatusCode::kFailedPrecondition)
          << "trial " << trial << "\n"
          << log.Text();
      continue;
    }
    ASSERT_TRUE(served.ok()) << "trial " << trial << ": " << served.status();
    ++checked;
    EXPECT_TRUE(served->proven) << "trial " << trial;
    EXPECT_EQ(served->moved(), brute.bytes) << "trial " << trial << "\n" << log.Text();
    EXPECT_LE(served->lower_bound, brute.bytes) << "trial " << trial;
    // Serving only adds choices: never more than the whole-buffer optimum,
    // which, given as the start, is kept when nothing beats it.
    ExactOptions exact_options;
    exact_options.cap = cap;
    absl::StatusOr<ExactOptimum> exact = ComputeExactOptimum(*workload, exact_options);
    if (!exact.ok()) {
      ++whole_infeasible;
      continue;
    }
    EXPECT_LE(served->moved(), exact->bytes_moved) << "trial " << trial;
    served_cheaper += served->moved() < exact->bytes_moved;
    // No replay of the library's rules with serving moves less.
    std::unique_ptr<EvictionPolicy> belady = MakeBeladyPolicy();
    ReplayOptions replay;
    replay.cap = cap;
    replay.policy = belady.get();
    replay.oracle = true;
    absl::StatusOr<ReplayResult> r = Replay(*workload, replay);
    ASSERT_TRUE(r.ok()) << "trial " << trial << ": " << r.status();
    EXPECT_GE(r->bytes_moved() + r->bytes_served, brute.bytes) << "trial " << trial;
    // The time bound with serving: below what every schedule copies in and
    // serves, and below the replay's time with its copies drained.
    StepBoundOptions step_options;
    step_options.cap = cap;
    step_options.serving = true;
    step_options.bandwidth_gbps = replay.bandwidth_gbps;
    step_options.kernel_us = replay.kernel_us;
    absl::StatusOr<StepBound> step = ComputeStepBound(*workload, step_options);
    ASSERT_TRUE(step.ok()) << "trial " << trial << ": " << step.status();
    EXPECT_LE(step->bytes_in, brute.in_and_served) << "trial " << trial << "\n" << log.Text();
    EXPECT_LE(step->bytes_moved, brute.bytes) << "trial " << trial << "\n" << log.Text();
    EXPECT_LE(step->us(), r->drained_us * (1 + 1e-9)) << "trial " << trial;
    // Close to it, often (the Lagrangian bound rounds down by a few bytes).
    step_in_tight += brute.in_and_served > 0 && step->bytes_in >= brute.in_and_served * 0.99;
  }
  EXPECT_GT(step_in_tight, 1);
  EXPECT_GT(checked, 80);
  EXPECT_GT(served_cheaper, 0);
  EXPECT_GT(whole_infeasible, 0);
}

// Cut short, the search still returns a schedule no cheaper than its bound.
TEST(ServingOptimumTest, ATimeLimitStillGivesASchedule) {
  TestLog log;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 24; ++i) ids.push_back(log.Alloc((1 + i % 3) * 2 * kMiB));
  std::mt19937 rng(5);
  for (int step = 0; step < 40; ++step) {
    const uint64_t x = ids[rng() % ids.size()], y = ids[rng() % ids.size()];
    log.Launch({x, y}, {y});
  }
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  for (int limit_ms : {1, 20000}) {
    ServingOptions options;
    options.cap = 8 * kMiB;
    options.time_limit_ms = limit_ms;
    absl::StatusOr<ServingOptimum> served = ComputeServingOptimum(*workload, options);
    ASSERT_TRUE(served.ok()) << served.status();
    EXPECT_LE(served->lower_bound, served->moved());
    EXPECT_GT(served->moved(), 0u);
  }
}

}  // namespace
}  // namespace stensor
