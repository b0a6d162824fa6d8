#include "tools/serving_bound.h"

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tools/keep_problem.h"
#include "tools/serving_optimum.h"
#include "tools/test_log.h"
#include "tools/workload.h"

namespace stensor {
namespace {

constexpr uint64_t kMiB = TestLog::kMiB;

// Whether the schedule's kept links and resident uses fit at every point
// (a link counts as kept only where both its uses are resident).
bool Fits(const KeepProblem& p, const std::vector<bool>& resident, const std::vector<bool>& kept) {
  std::vector<int64_t> held(p.points + 1, 0);
  for (size_t l = 0; l < p.links.size(); ++l) {
    const KeepLink& link = p.links[l];
    if (link.gap < 0 || !kept[l] || !resident[link.from] || (link.to >= 0 && !resident[link.to])) {
      continue;
    }
    held[p.gaps[link.gap].first] += p.gaps[link.gap].units;
    held[p.gaps[link.gap].last + 1] -= p.gaps[link.gap].units;
  }
  for (int t = 1; t <= p.points; ++t) held[t] += held[t - 1];
  for (size_t u = 0; u < p.uses.size(); ++u)
    held[p.uses[u].point] += resident[u] ? p.uses[u].units : 0;
  for (int t = 0; t < p.points; ++t) {
    if (held[t] > p.free_units[t]) return false;
  }
  return true;
}

ServingBound BoundOf(const KeepProblem& problem, uint64_t upper) {
  ServingBoundOptions options;
  options.upper = upper;
  return ComputeServingBound(problem, options);
}

// Nothing binds: every buffer stays, nothing moves, and the bound says so
// without a step.
TEST(ServingBoundTest, RoomForEverythingBoundsAtZero) {
  TestLog log;
  const uint64_t a = log.Alloc(2 * kMiB), b = log.Alloc(2 * kMiB);
  log.Launch({a, b}, {b});
  log.Launch({a, b}, {a});
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  absl::StatusOr<KeepProblem> problem = BuildKeepProblem(*workload, 8 * kMiB, /*serving=*/true);
  ASSERT_TRUE(problem.ok()) << problem.status();
  const ServingBound bound = BoundOf(*problem, 0);
  EXPECT_EQ(bound.bytes, 0u);
  EXPECT_EQ(bound.iterations, 0);
}

// Three written buffers of a granule each, then an operation reading all
// three under a cap of two granules: one of them is served or was never
// brought back, and whichever it is moves its 2 MiB at least. The prices
// find that exactly.
TEST(ServingBoundTest, AnOperationPastTheCapCostsAtLeastWhatDoesNotFit) {
  TestLog log;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(log.Alloc(2 * kMiB));
  for (uint64_t id : ids) log.Launch({id}, {id});
  log.Launch(ids, {});
  absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
  ASSERT_TRUE(workload.ok()) << workload.status();
  ServingOptions options;
  options.cap = 4 * kMiB;
  absl::StatusOr<ServingOptimum> optimum = ComputeServingOptimum(*workload, options);
  ASSERT_TRUE(optimum.ok()) << optimum.status();
  ASSERT_TRUE(optimum->proven);
  absl::StatusOr<KeepProblem> problem = BuildKeepProblem(*workload, options.cap, /*serving=*/true);
  ASSERT_TRUE(problem.ok()) << problem.status();
  const ServingBound bound = BoundOf(*problem, optimum->moved() * 2);
  EXPECT_LE(bound.bytes, optimum->moved());
  EXPECT_GE(bound.bytes, optimum->moved() * 99 / 100);
  EXPECT_GT(bound.iterations, 0);
}

// On random logs, against the proven optimum: never above it (the bound is
// sound) and, taken together, most of it (the prices do their work); the
// schedule found fits, and is not far above it.
TEST(ServingBoundTest, NeverAboveTheOptimumOnRandomLogs) {
  std::mt19937 rng(7);
  uint64_t optimum_total = 0, bound_total = 0, schedule_total = 0;
  int checked = 0, positive = 0, schedules = 0;
  for (int trial = 0; trial < 120; ++trial) {
    TestLog log;
    std::vector<uint64_t> live;
    const int buffers = 3 + rng() % 4;
    for (int i = 0; i < buffers; ++i) {
      live.push_back(log.Alloc((1 + rng() % 2) * 2 * kMiB - (rng() % 2) * 4096));
    }
    log.RandomOps(rng, live, 6 + rng() % 10);
    if (rng() % 2) log.Free(live[0]);
    absl::StatusOr<Workload> workload = ParseWorkload(log.Text());
    ASSERT_TRUE(workload.ok()) << workload.status();
    ServingOptions options;
    options.cap = 2 * kMiB * (1 + rng() % 4);
    absl::StatusOr<ServingOptimum> optimum = ComputeServingOptimum(*workload, options);
    if (!optimum.ok()) continue;  // plain allocations past the cap
    ASSERT_TRUE(optimum->proven) << "trial " << trial;
    absl::StatusOr<KeepProblem> problem =
        BuildKeepProblem(*workload, options.cap, /*serving=*/true);
    ASSERT_TRUE(problem.ok()) << problem.status();
    // As ComputeServingOptimum gives it: the bytes of serving everything.
    const std::vector<bool> none_resident(problem->uses.size(), false);
    const uint64_t upper =
        CountServeSchedule(*problem, none_resident, std::vector<bool>(problem->links.size(), false))
            .moved();
    const ServingBound bound = BoundOf(*problem, std::max(upper, optimum->moved()));
    ++checked;
    EXPECT_LE(bound.bytes, optimum->moved()) << "trial " << trial << "\n" << log.Text();
    // The schedule found fits and costs what it says, no less than the optimum.
    if (!bound.resident.empty()) {
      ++schedules;
      EXPECT_EQ(CountServeSchedule(*problem, bound.resident, bound.kept).moved(),
                bound.schedule_bytes);
      EXPECT_GE(bound.schedule_bytes, optimum->moved()) << "trial " << trial;
      EXPECT_TRUE(Fits(*problem, bound.resident, bound.kept)) << "trial " << trial;
      schedule_total += bound.schedule_bytes;
    } else {
      schedule_total += upper;
    }
    optimum_total += optimum->moved();
    bound_total += bound.bytes;
    positive += bound.bytes > 0;
  }
  EXPECT_GT(checked, 80);
  EXPECT_GT(positive, 20);
  EXPECT_GE(bound_total, optimum_total * 8 / 10) << bound_total << " of " << optimum_total;
  EXPECT_GT(schedules, 20);
  EXPECT_LE(schedule_total, optimum_total * 13 / 10) << schedule_total << " for " << optimum_total;
}

}  // namespace
}  // namespace stensor
