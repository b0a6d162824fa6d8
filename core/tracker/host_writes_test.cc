#include "core/tracker/host_writes.h"

#include <set>

#include "gtest/gtest.h"

namespace stensor {
namespace {

// Marks are ints the test completes by hand.
class HostWritesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    writes_.SetMarkDone([this](const HostWrites::Mark& m) {
      return done_.count(*static_cast<const int*>(m.get())) > 0;
    });
  }
  HostWrites::Mark MarkOf(int n) { return std::make_shared<const int>(n); }

  HostWrites writes_;
  std::set<int> done_;
};

TEST_F(HostWritesTest, OnlyOverlappingWritesNotDoneCount) {
  EXPECT_FALSE(writes_.MayWrite(0x1000, 64));
  writes_.Add(0x1000, 0x100, MarkOf(1));  // a copy into [0x1000, 0x1100)
  EXPECT_TRUE(writes_.MayWrite(0x1000, 8));
  EXPECT_TRUE(writes_.MayWrite(0x10ff, 1));
  EXPECT_TRUE(writes_.MayWrite(0xf00, 0x101));   // its last byte is the write's first
  EXPECT_FALSE(writes_.MayWrite(0x1100, 64));    // right after it
  EXPECT_FALSE(writes_.MayWrite(0xf00, 0x100));  // right before it
  EXPECT_FALSE(writes_.MayWrite(0x1000, 0));
  done_.insert(1);
  EXPECT_FALSE(writes_.MayWrite(0x1000, 8));
  EXPECT_EQ(writes_.pending(), 0u);  // forgotten once seen done
  EXPECT_TRUE(writes_.empty());
}

TEST_F(HostWritesTest, AWriteAnywhereOverlapsEverything) {
  writes_.Add(0, HostWrites::kEverywhere, MarkOf(2));  // a host function
  EXPECT_TRUE(writes_.MayWrite(0x1234, 8));
  EXPECT_TRUE(writes_.MayWrite(~uint64_t{0} - 8, 8));
  done_.insert(2);
  EXPECT_FALSE(writes_.MayWrite(0x1234, 8));
}

TEST_F(HostWritesTest, RangesAtTheTopOfTheAddressSpaceDoNotWrap) {
  const uint64_t top = ~uint64_t{0} - 15;
  writes_.Add(top, 16, MarkOf(3));
  EXPECT_TRUE(writes_.MayWrite(~uint64_t{0}, 1));
  EXPECT_FALSE(writes_.MayWrite(0, 16));
  EXPECT_FALSE(writes_.MayWrite(top - 16, 16));
}

TEST_F(HostWritesTest, AWriteWithoutAMarkIsNeverDone) {
  writes_.Add(0x2000, 8, nullptr);
  done_.insert(0);
  EXPECT_TRUE(writes_.MayWrite(0x2000, 8));
}

TEST_F(HostWritesTest, AnEscapedPointerMakesEveryRangeWritableForGood) {
  writes_.Escaped();
  EXPECT_TRUE(writes_.MayWrite(0x1000, 8));
  EXPECT_TRUE(writes_.escaped());
}

TEST_F(HostWritesTest, TooManyPendingCollapseIntoAWriteAnywhere) {
  for (size_t i = 0; i < HostWrites::kMaxPending; ++i) writes_.Add(0x1000 * (i + 1), 8, MarkOf(10));
  EXPECT_FALSE(writes_.MayWrite(0x1000 * (HostWrites::kMaxPending + 5), 8));
  // The next one finds none done: everything counts as written, never done.
  writes_.Add(0x10, 8, MarkOf(11));
  EXPECT_EQ(writes_.pending(), 1u);
  done_.insert(10);
  done_.insert(11);
  EXPECT_TRUE(writes_.MayWrite(0x1000 * (HostWrites::kMaxPending + 5), 8));
}

TEST_F(HostWritesTest, DoneWritesMakeRoomBeforeCollapsing) {
  for (size_t i = 0; i < HostWrites::kMaxPending; ++i) writes_.Add(0x1000 * (i + 1), 8, MarkOf(20));
  done_.insert(20);
  writes_.Add(0x10, 8, MarkOf(21));
  EXPECT_EQ(writes_.pending(), 1u);
  EXPECT_TRUE(writes_.MayWrite(0x10, 8));
  EXPECT_FALSE(writes_.MayWrite(0x1000, 8));
}

}  // namespace
}  // namespace stensor
