#include "core/swap/external_charges.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace stensor {
namespace {

using Charge = ExternalCharges::Charge;

constexpr uint64_t kGranule = 2u << 20;

TEST(ExternalChargesTest, AnAllocationsChargeEndsOnceAtItsFree) {
  ExternalCharges charges;
  charges.AddAllocation(0x1000, {1, 4096});
  charges.AddAllocation(0x9000, {0, 8192});
  EXPECT_EQ(charges.RemoveAllocation(0x2000), std::nullopt);  // inside, not a base
  EXPECT_EQ(charges.RemoveAllocation(0x1000), (Charge{1, 4096}));
  EXPECT_EQ(charges.RemoveAllocation(0x1000), std::nullopt);  // a second free ends nothing
  EXPECT_EQ(charges.RemoveAllocation(0x9000), (Charge{0, 8192}));
}

// A handle's memory lives while the program holds a reference or a mapping:
// its charge ends with the last of them, in either order.
TEST(ExternalChargesTest, AHandleIsChargedUntilItsLastReferenceAndMappingGo) {
  ExternalCharges charges;
  charges.AddHandle(7, {0, kGranule});
  charges.Map(0x200000, kGranule, 7);
  EXPECT_EQ(charges.Release(7), std::nullopt);  // still mapped
  EXPECT_EQ(charges.Unmap(0x200000, kGranule), (absl::InlinedVector<Charge, 1>{{0, kGranule}}));

  charges.AddHandle(8, {1, 2 * kGranule});
  charges.Retain(8);
  charges.Map(0x400000, kGranule, 8);
  charges.Map(0x800000, kGranule, 8);  // mapped twice
  EXPECT_TRUE(charges.Unmap(0x400000, kGranule).empty());
  EXPECT_EQ(charges.Release(8), std::nullopt);  // a retain left, a mapping
  EXPECT_EQ(charges.Release(8), std::nullopt);  // a mapping left
  EXPECT_EQ(charges.Unmap(0x800000, kGranule), (absl::InlinedVector<Charge, 1>{{1, 2 * kGranule}}));
  EXPECT_EQ(charges.Release(8), std::nullopt);  // gone: a later release ends nothing
}

TEST(ExternalChargesTest, HandlesItNeverChargedAreLeftAlone) {
  ExternalCharges charges;
  charges.Retain(3);
  charges.Map(0x200000, kGranule, 3);
  EXPECT_EQ(charges.Release(3), std::nullopt);
  EXPECT_TRUE(charges.Unmap(0x200000, kGranule).empty());
  EXPECT_EQ(charges.RemoveAllocation(0x200000), std::nullopt);
}

// One unmap of a range ends every mapping that starts in it, of any handle,
// and none that starts before it; a range ending at the top of the address
// space does not wrap.
TEST(ExternalChargesTest, AnUnmapEndsEveryMappingThatStartsInItsRange) {
  ExternalCharges charges;
  charges.AddHandle(1, {0, kGranule});
  charges.AddHandle(2, {0, kGranule});
  charges.AddHandle(3, {0, kGranule});
  charges.Map(0x000000, kGranule, 1);  // before the range
  charges.Map(0x200000, kGranule, 2);
  charges.Map(0x400000, kGranule, 3);
  for (uint64_t h : {1, 2, 3}) EXPECT_EQ(charges.Release(h), std::nullopt);
  EXPECT_EQ(charges.Unmap(0x200000, 2 * kGranule).size(), 2u);
  EXPECT_EQ(charges.Unmap(0, kGranule).size(), 1u);

  constexpr uint64_t kTop = ~uint64_t{0} - kGranule + 1;
  charges.AddHandle(4, {0, kGranule});
  charges.Map(kTop, kGranule, 4);
  EXPECT_EQ(charges.Release(4), std::nullopt);
  EXPECT_EQ(charges.Unmap(kTop, kGranule).size(), 1u);
}

// Its own lock: threads adding and ending charges at once each see every
// one of theirs end exactly once.
TEST(ExternalChargesTest, ThreadsChargeAndUnchargeConcurrently) {
  ExternalCharges charges;
  constexpr int kThreads = 4;
  constexpr int kEach = 2000;
  std::atomic<uint64_t> ended{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const uint64_t key = (static_cast<uint64_t>(t) << 32) | (static_cast<uint64_t>(i) << 21);
        charges.AddAllocation(key, {t, 1});
        charges.AddHandle(key, {t, 1});
        charges.Map(key, kGranule, key);
        if (auto c = charges.RemoveAllocation(key)) ended += c->bytes;
        if (auto c = charges.Release(key)) ended += c->bytes;
        for (Charge c : charges.Unmap(key, kGranule)) ended += c.bytes;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ended.load(), 2u * kThreads * kEach);
}

}  // namespace
}  // namespace stensor
