#include "tools/precedence_bound.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "policy/eviction_policy.h"
#include "tools/keep_problem.h"
#include "tools/replay.h"
#include "tools/schedule_time.h"
#include "tools/step_bound.h"
#include "tools/test_log.h"
#include "tools/workload.h"

namespace stensor {
namespace {

constexpr uint64_t kMiB = TestLog::kMiB;
constexpr double kUsPerByte = 1 / (16 * 1e3);  // 16 GB/s, the replay's default

// The replay's drained time of `workload` under `cap` with `lru`.
double LruDrainedUs(const Workload& workload, uint64_t cap, bool serving) {
  std::unique_ptr<EvictionPolicy> lru = MakeLruPolicy();
  ReplayOptions replay;
  replay.cap = cap;
  replay.policy = lru.get();
  replay.host_vmm = serving;
  absl::StatusOr<ReplayResult> r = Replay(workload, replay);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->drained_us : 0;
}

// Two written buffers read in turn under a cap of one granule: each read's
// buffer can come in only once the other one's read has ended (the granule
// is held until then), and the read cannot start before it is in. So every
// read after the first costs a copy and a compute one after the other,
// which no byte total sees: those let the copies overlap the compute.
TEST(PrecedenceBoundTest, ACopyWaitsForTheRoomTheOperationBeforeItHolds) {
  TestLog log;
  const uint64_t a = log.Alloc(2 * kMiB);
  log.Launch({}, {a});
  const uint64_t b = log.Alloc(2 * kMiB);
  log.Launch({}, {b});
  constexpr int kReads = 8;
  for (int i = 0; i < kReads; ++i) log.Launch({i % 2 ? b : a}, {});
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();

  StepBoundOptions options;
  options.cap = 2 * kMiB;
  options.serving = false;
  absl::StatusOr<StepBound> bound = ComputeStepBound(*workload, options);
  ASSERT_TRUE(bound.ok()) << bound.status();
  const double copy_us = 2 * kMiB * kUsPerByte;
  // Each read's copy, then its compute (the first read's buffer, b's write
  // before it, is counted too: a is out while b is written).
  EXPECT_GE(bound->precedence_us, kReads * (copy_us + 100) - 1e-6);
  EXPECT_GT(bound->precedence_us, 1.5 * std::max({bound->compute_us, bound->in_us, bound->out_us}));
  EXPECT_EQ(bound->us(), bound->precedence_us);

  // The replay does just that (and writes each buffer back once first).
  const double drained = LruDrainedUs(*workload, options.cap, /*serving=*/false);
  EXPECT_LE(bound->us(), drained * (1 + 1e-9));
  EXPECT_LE(drained, bound->us() + 2 * copy_us + 1e-6);  // the two write-backs
}

// Room enough for the next buffer beside the current one: the copies
// overlap the compute and the path is the compute (the third allocation's
// room, a write-back of the first buffer, hides under the second's write).
TEST(PrecedenceBoundTest, CopiesThatFitAheadCostNothing) {
  TestLog log;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(log.Alloc(2 * kMiB));
    log.Launch({}, {ids.back()}, /*compute_us=*/1000);
  }
  for (int i = 0; i < 9; ++i) log.Launch({ids[i % 3]}, {}, /*compute_us=*/1000);
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  StepBoundOptions options;
  options.cap = 4 * kMiB;
  options.serving = false;
  absl::StatusOr<StepBound> bound = ComputeStepBound(*workload, options);
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_DOUBLE_EQ(bound->precedence_us, bound->compute_us);
}

// The third allocation's room is one of the first two buffers, both
// written: it is free only once that buffer's copy out is done, and the
// second buffer's write hides only part of that copy. So the third write
// starts a copy's time after the first write ends, less nothing: the path
// is the compute plus the copy less the second write's compute. The replay
// waits as long. (With serving nothing is forced: the third buffer may be
// born in host memory and written there.)
TEST(PrecedenceBoundTest, AnAllocationWaitsForTheCopyOutThatMakesItsRoom) {
  TestLog log;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(log.Alloc(2 * kMiB));
    log.Launch({}, {ids.back()});
  }
  for (int i = 0; i < 9; ++i) log.Launch({ids[i % 3]}, {}, /*compute_us=*/1000);
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  const double copy_us = 2 * kMiB * kUsPerByte;
  for (bool serving : {false, true}) {
    StepBoundOptions options;
    options.cap = 4 * kMiB;
    options.serving = serving;
    absl::StatusOr<StepBound> bound = ComputeStepBound(*workload, options);
    ASSERT_TRUE(bound.ok()) << bound.status();
    if (!serving) EXPECT_NEAR(bound->precedence_us, bound->compute_us + copy_us - 100, 1e-6);
    EXPECT_LE(bound->us(), LruDrainedUs(*workload, options.cap, serving) * (1 + 1e-9))
        << "serving " << serving;
  }
}

// --- Brute force: every residency of every gap at every point (a buffer
// may leave and come back inside a gap), checked against the room of each
// point. For each, the bytes it copies in after a point ends for the
// buffers that point covers and whose next use comes by a later one, and
// the bytes it writes back for writes at or after a point.
struct Brute {
  bool feasible = false;
  std::vector<std::vector<double>> in;  // [from][to]: fewest bytes in
  std::vector<double> out;              // [writer]: fewest bytes written back
};

Brute BruteForce(const KeepProblem& p) {
  struct Cell {
    int gap, point;
  };
  std::vector<Cell> cells;
  for (size_t g = 0; g < p.gaps.size(); ++g) {
    for (int t = p.gaps[g].first; t <= p.gaps[g].last; ++t)
      cells.push_back({static_cast<int>(g), t});
  }
  EXPECT_LE(cells.size(), 16u);
  Brute brute;
  const double inf = 1e300;
  brute.in.assign(p.points, std::vector<double>(p.points, inf));
  brute.out.assign(p.points, inf);
  std::vector<std::vector<char>> resident(p.gaps.size(), std::vector<char>(p.points, 0));
  for (uint64_t mask = 0; mask < (uint64_t{1} << cells.size()); ++mask) {
    std::vector<int64_t> held(p.points, 0);
    for (size_t c = 0; c < cells.size(); ++c) {
      const bool r = mask >> c & 1;
      resident[cells[c].gap][cells[c].point] = r;
      if (r) held[cells[c].point] += p.gaps[cells[c].gap].units;
    }
    bool fits = true;
    for (int t = 0; t < p.points; ++t) fits &= held[t] <= p.room[t];
    if (!fits) continue;
    brute.feasible = true;
    // A copy in comes after the last point a gap is out (its bytes cross
    // between that point's end and the next use): count it at that point.
    std::vector<std::vector<double>> copied(p.points, std::vector<double>(p.points, 0));
    std::vector<char> written_back(p.stretch_bytes.size(), 0);
    for (size_t g = 0; g < p.gaps.size(); ++g) {
      const KeepGap& gap = p.gaps[g];
      for (int t = gap.first; t <= gap.last; ++t) {
        if (resident[g][t]) continue;
        if (gap.stretch >= 0) written_back[gap.stretch] = 1;
        const bool back_in = t == gap.last || resident[g][t + 1];
        if (back_in && gap.swap_in > 0) copied[t][gap.last + 1] += gap.swap_in;
      }
    }
    // by_to[t]: copies after t ends for uses up to `to`, as `to` grows.
    std::vector<double> by_to(p.points, 0);
    for (int to = 1; to < p.points; ++to) {
      double bytes = 0;  // copies after `from` ends for uses by `to`
      for (int from = to - 1; from >= 0; --from) {
        by_to[from] += copied[from][to];
        bytes += by_to[from];
        brute.in[from][to] = std::min(brute.in[from][to], bytes);
      }
    }
    for (int w = 0; w < p.points; ++w) {
      double bytes = 0;
      for (size_t s = 0; s < p.stretch_bytes.size(); ++s) {
        if (written_back[s] && p.uses[p.stretch_writer[s]].point >= w) bytes += p.stretch_bytes[s];
      }
      brute.out[w] = std::min(brute.out[w], bytes);
    }
  }
  return brute;
}

TEST(PrecedenceBoundTest, WindowsBoundBruteForceAndTheTimeBoundsEveryReplay) {
  std::mt19937 rng(77);
  int checked = 0, in_positive = 0, in_tight = 0, out_positive = 0, binds = 0, replays = 0;
  size_t split_total = 0;
  for (int trial = 0; trial < 300; ++trial) {
    TestLog log;
    std::vector<uint64_t> live;
    const int buffers = 2 + rng() % 2;
    for (int i = 0; i < buffers; ++i) live.push_back(log.Alloc((1 + rng() % 2) * 2 * kMiB));
    log.RandomOps(rng, live, 3 + rng() % 4);
    if (rng() % 2) log.Free(live[rng() % live.size()]);
    absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
    ASSERT_TRUE(workload.ok()) << workload.status();
    const uint64_t cap = 2 * kMiB * (1 + rng() % 4);
    absl::StatusOr<KeepProblem> problem = BuildKeepProblem(*workload, cap);
    if (!problem.ok()) continue;  // some operation alone does not fit
    size_t cells = 0;
    for (const KeepGap& gap : problem->gaps) cells += gap.last - gap.first + 1;
    if (cells > 14) continue;
    const Brute brute = BruteForce(*problem);
    if (!brute.feasible) continue;
    ++checked;
    for (int from = 0; from < problem->points; ++from) {
      for (int to = from + 1; to < problem->points; ++to) {
        const double bound = BytesInWindow(*problem, false, from, to);
        EXPECT_LE(bound, brute.in[from][to] + 1e-6)
            << "trial " << trial << " window " << from << ".." << to << "\n"
            << log.Text();
        in_positive += bound > 0;
        in_tight += bound > 0 && bound >= brute.in[from][to] - 1e-6;
      }
      for (int at = from + 1; at < problem->points; ++at) {
        const double bound = BytesOutAfter(*problem, from, at);
        EXPECT_LE(bound, brute.out[from] + 1e-6)
            << "trial " << trial << " writer " << from << " at " << at << "\n"
            << log.Text();
        out_positive += bound > 0;
      }
    }
    // The path bounds every policy's modelled time, copies drained, with and
    // without serving, whatever the link's speed against the compute.
    // With serving, as `stensor sim` replays it: allocations larger than a
    // granule held as pieces of one.
    size_t split = 0;
    const Workload pieces = SplitIntoPieces(*workload, cap, &split);
    split_total += split;
    for (bool serving : {false, true}) {
      const Workload& replayed = serving ? pieces : *workload;
      StepBoundOptions options;
      options.cap = cap;
      options.serving = serving;
      options.bandwidth_gbps = 2 + rng() % 30;
      options.d2h_bandwidth_gbps = rng() % 2 ? 4 : 0;
      options.kernel_us = rng() % 3 == 0 ? 20 : 150;
      absl::StatusOr<StepBound> bound = ComputeStepBound(replayed, options);
      ASSERT_TRUE(bound.ok()) << "trial " << trial << ": " << bound.status();
      binds += bound->precedence_us >
               1.0001 * std::max({bound->compute_us, bound->in_us, bound->out_us, bound->moved_us});
      for (int which = 0; which < 4; ++which) {
        std::unique_ptr<EvictionPolicy> policy = which == 0   ? MakeLruPolicy()
                                                 : which == 1 ? MakeVersionPolicy()
                                                              : MakeBeladyPolicy();
        ReplayOptions replay;
        replay.cap = cap;
        replay.policy = policy.get();
        replay.version_rules = which != 0;
        replay.prefetch = which == 3;
        replay.host_vmm = serving;
        replay.bandwidth_gbps = options.bandwidth_gbps;
        replay.d2h_bandwidth_gbps = options.d2h_bandwidth_gbps;
        replay.kernel_us = options.kernel_us;
        absl::StatusOr<ReplayResult> r = Replay(replayed, replay);
        ASSERT_TRUE(r.ok()) << "trial " << trial << ": " << r.status();
        ++replays;
        EXPECT_LE(bound->us(), r->drained_us * (1 + 1e-9))
            << "trial " << trial << " policy " << policy->name() << " serving " << serving
            << " prefetch " << replay.prefetch << "\n"
            << log.Text();
      }
    }
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(replays, 800);
  EXPECT_GT(split_total, 50u);  // pieces replayed and bounded
  // Not vacuous: windows force bytes, often exactly the brute force's, the
  // write-backs too, and the path exceeds every byte total in many runs.
  EXPECT_GT(in_positive, 50);
  EXPECT_GT(in_tight, 25);
  EXPECT_GT(out_positive, 25);
  EXPECT_GT(binds, 25);
}

// The time bound against every schedule of small random logs, each timed
// with its copies as early as it allows (tools/schedule_time.h): no keep/
// evict choice runs faster than the bound, and on many logs the fastest
// runs just as fast, so the bound is often exactly the least time.
TEST(PrecedenceBoundTest, NoScheduleOfSmallLogsRunsFasterThanTheBound) {
  std::mt19937 rng(2024);
  int checked = 0, tight = 0, precedence_tight = 0;
  for (int trial = 0; trial < 300; ++trial) {
    TestLog log;
    std::vector<uint64_t> live;
    const int buffers = 2 + rng() % 3;
    for (int i = 0; i < buffers; ++i) live.push_back(log.Alloc((1 + rng() % 2) * 2 * kMiB));
    log.RandomOps(rng, live, 3 + rng() % 6);
    absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
    ASSERT_TRUE(workload.ok()) << workload.status();
    StepBoundOptions options;
    options.cap = 2 * kMiB * (1 + rng() % 4);
    options.serving = false;
    options.bandwidth_gbps = 2 + rng() % 30;
    options.d2h_bandwidth_gbps = rng() % 2 ? 4 : 0;
    options.kernel_us = rng() % 3 == 0 ? 20 : 150;
    absl::StatusOr<KeepProblem> problem = BuildKeepProblem(*workload, options.cap);
    if (!problem.ok() || problem->gaps.size() > 12) continue;
    absl::StatusOr<StepBound> bound = ComputeStepBound(*workload, options);
    ASSERT_TRUE(bound.ok()) << bound.status();
    const std::vector<double> compute = ComputeTimes(*workload, options.kernel_us);
    ScheduleTimeOptions timing;
    timing.in_us_per_byte = 1 / (options.bandwidth_gbps * 1e3);
    timing.out_us_per_byte = 1 / ((options.d2h_bandwidth_gbps > 0 ? options.d2h_bandwidth_gbps
                                                                  : options.bandwidth_gbps) *
                                  1e3);
    double fastest = std::numeric_limits<double>::infinity();
    const size_t gaps = problem->gaps.size();
    for (uint64_t mask = 0; mask < (uint64_t{1} << gaps); ++mask) {
      std::vector<bool> kept(gaps);
      std::vector<int64_t> held(problem->points, 0);
      for (size_t g = 0; g < gaps; ++g) {
        kept[g] = mask >> g & 1;
        if (!kept[g]) continue;
        for (int t = problem->gaps[g].first; t <= problem->gaps[g].last; ++t) {
          held[t] += problem->gaps[g].units;
        }
      }
      bool fits = true;
      for (int t = 0; t < problem->points; ++t) fits &= held[t] <= problem->room[t];
      if (!fits) continue;
      const ScheduleTime timed = TimeSchedule(*problem, kept, compute, timing);
      EXPECT_LE(bound->us(), timed.drained_us * (1 + 1e-9))
          << "trial " << trial << " mask " << mask << "\n"
          << log.Text();
      fastest = std::min(fastest, timed.drained_us);
    }
    if (fastest == std::numeric_limits<double>::infinity()) continue;
    ++checked;
    tight += bound->us() >= fastest * (1 - 1e-9);
    precedence_tight += bound->us() >= fastest * (1 - 1e-9) &&
                        bound->precedence_us > 1.0001 * std::max({bound->compute_us, bound->in_us,
                                                                  bound->out_us, bound->moved_us});
  }
  EXPECT_GT(checked, 150);
  EXPECT_GT(tight, 40);
  // Of them, some only through the precedence term.
  EXPECT_GT(precedence_tight, 5);
}

}  // namespace
}  // namespace stensor
