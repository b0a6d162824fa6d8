#include "policy/reach.h"

#include <memory>

#include "gtest/gtest.h"

namespace stensor {
namespace {

class ReachTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The buffer a fetch would displace first: next needed at time 50.
    victim_.id = 1;
    victim_.serial = 1;
    victim_.reserved = 2 << 20;
    victim_.gpu_version = 1;
    victim_.written = true;
    victim_.next_use = 50;
    order_.Update(victim_, true);
  }
  // Swapped out, needed after this operation at `next_use`, no room.
  static ReachFacts Facts(uint64_t next_use) {
    ReachFacts f;
    f.servable = true;
    f.predicted = true;
    f.next_use = next_use;
    return f;
  }
  Reach Choose(const ReachFacts& f) { return ChooseReach(f, order_, {}); }

  std::unique_ptr<EvictionPolicy> belady_ = MakeBeladyPolicy();
  EvictionOrder order_{belady_.get(), /*version_rules=*/true};
  EvictionState victim_;
};

TEST_F(ReachTest, ServedWhereItsRoomWouldDisplaceOneNeededSooner) {
  EXPECT_EQ(Choose(Facts(80)), Reach::kServeByChoice);
  EXPECT_EQ(Choose(Facts(20)), Reach::kFetch);  // needed before the victim
}

TEST_F(ReachTest, FetchedWhereServingIsNoChoice) {
  ReachFacts f = Facts(80);
  f.fits = true;  // nothing displaced
  EXPECT_EQ(Choose(f), Reach::kFetch);
  f = Facts(80);
  f.overwritten = true;  // comes in without a copy
  EXPECT_EQ(Choose(f), Reach::kFetch);
  f = Facts(80);
  f.predicted = false;
  EXPECT_EQ(Choose(f), Reach::kFetch);
  f = Facts(80);
  f.servable = false;  // no host copy at its address, or serving not allowed now
  f.far = true;
  EXPECT_EQ(Choose(f), Reach::kFetch);
  victim_.pins = 1;  // nothing the order may take: nothing displaced
  EXPECT_EQ(Choose(Facts(80)), Reach::kFetch);
}

TEST_F(ReachTest, ServedWhereItsRoomWouldCopyOutMoreThanItsOwnBytes) {
  // The one to go is never used again, but dirty: 24 MiB copied out to
  // bring in 2 MiB, which serving moves once.
  victim_.reserved = 24 << 20;
  victim_.next_use = EvictionCandidate::kNoNextUse;
  order_.Update(victim_, true);
  ReachFacts f = Facts(80);
  f.bytes = 2 << 20;
  EXPECT_EQ(Choose(f), Reach::kServeByChoice);
  f.bytes = 32 << 20;  // the copy out moves less
  EXPECT_EQ(Choose(f), Reach::kFetch);
  f.bytes = 2 << 20;
  f.next_use = EvictionCandidate::kNoNextUse;  // nothing predicted for it either
  EXPECT_EQ(Choose(f), Reach::kFetch);
  victim_.location = Location::kCpuGpu;  // clean: it goes without a copy
  victim_.host_version = victim_.gpu_version;
  order_.Update(victim_, true);
  EXPECT_EQ(Choose(Facts(80)), Reach::kFetch);
}

TEST_F(ReachTest, APieceNoPointerReachesIsServed) {
  ReachFacts f = Facts(20);
  f.far = true;
  EXPECT_EQ(Choose(f), Reach::kServeFar);
  f.fits = true;
  EXPECT_EQ(Choose(f), Reach::kServeFar);
}

// The cap forced out, within the last iteration, a buffer needed again no
// farther off than this one: brought in, this one would be forced out before
// its next use too, so it is served, even where it fits now (an optimizer's
// moments, read and written once a step).
TEST_F(ReachTest, ServedWhereTheCapForcedOutOneNeededNoFartherOffWithinAnIteration) {
  EvictionState forced;
  forced.next_use = 1300;
  order_.NoteForcedOut(forced, /*now=*/1000);  // needed again 300 later
  ReachFacts f = Facts(1400);
  f.fits = true;
  f.now = 1100;
  f.period = 420;
  EXPECT_EQ(Choose(f), Reach::kServeByChoice);  // needed 300 later: no sooner
  f.next_use = 1350;                            // 250 later: it would stay
  EXPECT_EQ(Choose(f), Reach::kFetch);
  f.now = 1500;  // the eviction is more than an iteration old
  f.next_use = 1900;
  EXPECT_EQ(Choose(f), Reach::kFetch);
  f.now = 1100;
  f.next_use = 1400;
  f.period = 0;  // no iteration known
  EXPECT_EQ(Choose(f), Reach::kFetch);
  f.period = 420;
  f.overwritten = true;  // comes in without a copy
  EXPECT_EQ(Choose(f), Reach::kFetch);
  f.overwritten = false;
  f.servable = false;
  EXPECT_EQ(Choose(f), Reach::kFetch);
  f.servable = true;
  // Under a policy that predicts nothing, no such evidence counts.
  std::unique_ptr<EvictionPolicy> version = MakeVersionPolicy();
  EvictionOrder by_version(version.get(), /*version_rules=*/true);
  by_version.NoteForcedOut(forced, 1000);
  EXPECT_EQ(ChooseReach(f, by_version, {}), Reach::kFetch);
}

// Only forced evictions with a predicted next use still ahead are evidence.
TEST_F(ReachTest, EvictionsWithoutAPredictedNextUseAreNoEvidence) {
  EvictionState unknown;
  unknown.next_use = EvictionCandidate::kNoNextUse;
  order_.NoteForcedOut(unknown, 1000);
  EvictionState in_sequence;
  in_sequence.next_use = EvictionCandidate::kInSequence + 5;
  order_.NoteForcedOut(in_sequence, 1000);
  EvictionState overdue;
  overdue.next_use = 900;
  order_.NoteForcedOut(overdue, 1000);
  EXPECT_FALSE(order_.ForcedOutWithin(1'000'000, 0));
  EvictionState known;
  known.next_use = 1010;
  order_.NoteForcedOut(known, 1000);
  EXPECT_TRUE(order_.ForcedOutWithin(10, 1000));
  EXPECT_FALSE(order_.ForcedOutWithin(9, 1000));
  EXPECT_FALSE(order_.ForcedOutWithin(10, 1001));
}

}  // namespace
}  // namespace stensor
