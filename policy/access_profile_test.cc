#include "policy/access_profile.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace stensor {
namespace {

constexpr double kGB = 1e9;

// Three ops: 1 ms, 2 ms, unknown; the second passes one buffer twice.
AccessProfile::Builder ThreeOps() {
  AccessProfile::Builder b;
  b.Add(10, {{1, 100, false}, {2, 300, true}});
  b.Add(11, {{2, 300, false}, {2, 300, true}, {3, 1000, true}});
  b.Add(12, {});
  EXPECT_TRUE(b.SetComputeSeconds(0, 1e-3).ok());
  EXPECT_TRUE(b.SetComputeSeconds(1, 2e-3).ok());
  return b;
}

TEST(AccessProfileTest, PerOperationBytesAndTransferTimes) {
  auto p = ThreeOps().Build({.h2d = 1 * kGB, .d2h = 2 * kGB});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->period(), 3u);
  EXPECT_EQ(p->op(1).key, 11u);
  EXPECT_EQ(p->bytes(0), 400u);
  EXPECT_EQ(p->bytes(1), 1300u);  // buffer 2 counted once
  EXPECT_EQ(p->bytes(2), 0u);
  EXPECT_DOUBLE_EQ(p->h2d_seconds(1), 1300 / (1 * kGB));
  EXPECT_DOUBLE_EQ(p->d2h_seconds(1), 1300 / (2 * kGB));
  EXPECT_DOUBLE_EQ(p->H2dSeconds(5000), 5000 / kGB);
}

TEST(AccessProfileTest, UnknownComputeUsesTheDocumentedDefault) {
  auto zero = ThreeOps().Build({kGB, kGB});
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->unknown_phases(), 1u);
  EXPECT_DOUBLE_EQ(zero->compute_seconds(2), 0.0);
  auto set = ThreeOps().Build({kGB, kGB}, {.unknown_compute_seconds = 5e-3});
  ASSERT_TRUE(set.ok());
  EXPECT_DOUBLE_EQ(set->compute_seconds(2), 5e-3);
  EXPECT_DOUBLE_EQ(set->iteration_compute_seconds(), 8e-3);
}

TEST(AccessProfileTest, ComputeBetweenPhasesWraps) {
  auto p = ThreeOps().Build({kGB, kGB}, {.unknown_compute_seconds = 4e-3});
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ(p->ComputeBetweenPhases(0, 0), 0.0);
  EXPECT_DOUBLE_EQ(p->ComputeBetweenPhases(0, 2), 3e-3);
  EXPECT_DOUBLE_EQ(p->ComputeBetweenPhases(1, 3), 6e-3);  // 3 == phase 0
  EXPECT_DOUBLE_EQ(p->ComputeBetweenPhases(2, 1), 5e-3);  // 2, then 0
}

TEST(AccessProfileTest, ComputeBetweenTimesCountsWholeIterations) {
  auto p = ThreeOps().Build({kGB, kGB}, {.unknown_compute_seconds = 4e-3});
  ASSERT_TRUE(p.ok());
  // Phase 0 at time 100: times 101..108 are phases 1,2,0,1,2,0,1,2.
  EXPECT_EQ(p->PhaseAt(100, 101), 1u);
  EXPECT_EQ(p->PhaseAt(100, 99), 2u);
  EXPECT_EQ(p->PhaseAt(100, 97), 0u);
  EXPECT_DOUBLE_EQ(p->ComputeBetweenTimes(100, 101, 109), 2e-3 + 4e-3 + 7e-3 + 7e-3);
  EXPECT_DOUBLE_EQ(p->ComputeBetweenTimes(100, 100, 100 + 3000), 1000 * 7e-3);
  EXPECT_DOUBLE_EQ(p->ComputeBetweenTimes(100, 105, 104), 0.0);
  // Before the origin the phases continue backwards.
  EXPECT_DOUBLE_EQ(p->ComputeBetweenTimes(100, 98, 100), 2e-3 + 4e-3);
}

// From a phase touching a buffer to its next touch, wrapping into the next
// iteration; nothing for a phase that does not touch it or a buffer never
// touched.
TEST(AccessProfileTest, GapAfterATouchToTheNext) {
  AccessProfile::Builder b;
  b.Add(10, {{1, 100, false}, {2, 300, true}});  // phase 0
  b.Add(11, {{3, 100, false}});                  // 1
  b.Add(12, {{1, 100, false}, {1, 100, true}});  // 2: twice, one touch
  b.Add(13, {});                                 // 3
  absl::StatusOr<AccessProfile> p = std::move(b).Build({1e9, 1e9});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->GapAfter(1, 0), 2u);
  EXPECT_EQ(p->GapAfter(1, 2), 2u);  // to phase 0 of the next iteration
  EXPECT_EQ(p->GapAfter(2, 0), 4u);  // once an iteration: the period
  EXPECT_EQ(p->GapAfter(3, 1), 4u);
  EXPECT_EQ(p->GapAfter(1, 1), 0u);
  EXPECT_EQ(p->GapAfter(9, 0), 0u);
}

TEST(AccessProfileTest, RejectsBadInput) {
  AccessProfile::Builder empty;
  EXPECT_FALSE(std::move(empty).Build({kGB, kGB}).ok());
  EXPECT_FALSE(ThreeOps().Build({0, kGB}).ok());
  EXPECT_FALSE(ThreeOps().Build({kGB, -1}).ok());
  EXPECT_FALSE(ThreeOps().Build({kGB, std::numeric_limits<double>::infinity()}).ok());
  EXPECT_FALSE(ThreeOps().Build({kGB, kGB}, {.unknown_compute_seconds = -1}).ok());
  AccessProfile::Builder b = ThreeOps();
  EXPECT_FALSE(b.SetComputeSeconds(3, 1.0).ok());
  EXPECT_FALSE(b.SetComputeSeconds(0, -1.0).ok());
  EXPECT_FALSE(b.SetComputeSeconds(0, std::nan("")).ok());
}

}  // namespace
}  // namespace stensor
