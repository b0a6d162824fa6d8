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

}  // namespace
}  // namespace stensor
