#include "policy/next_use.h"

#include <cstdint>
#include <optional>

#include "gtest/gtest.h"
#include "policy/eviction_policy.h"

namespace stensor {
namespace {

constexpr uint64_t kNone = EvictionCandidate::kNoNextUse;
using Slot = NextUsePredictor::Slot;

// A 10-op iteration starting at time 0; phase = time % 10.
std::optional<Slot> At(uint64_t time, uint32_t slot) {
  return Slot{static_cast<size_t>(time % 10), slot};
}

TEST(NextUseTest, UnknownUntilSomethingPredicts) {
  NextUsePredictor p;
  EXPECT_EQ(p.OnUse(1, 5, std::nullopt), kNone);
  EXPECT_EQ(p.OnUse(2, 5, At(5, 0)), kNone);
  EXPECT_EQ(p.Predicted(3), kNone);
}

TEST(NextUseTest, WithoutAnIterationTheBuffersOwnLastGap) {
  NextUsePredictor p;
  p.OnUse(1, 10, std::nullopt);
  EXPECT_EQ(p.OnUse(1, 17, std::nullopt), 24u);
  EXPECT_EQ(p.Predicted(1), 24u);
  // Same op, second slot: unchanged.
  EXPECT_EQ(p.OnUse(1, 17, std::nullopt), 24u);
}

// (a) A weight read in forward (phase 2) and backward (phase 7) every
// iteration: after one iteration both uses predict the other exactly.
TEST(NextUseTest, PersistentWeightAtFixedPhases) {
  NextUsePredictor p;
  for (uint64_t it = 0; it < 2; ++it) {
    p.OnUse(1, it * 10 + 2, At(2, 0));
    p.OnUse(1, it * 10 + 7, At(7, 1));
  }
  EXPECT_EQ(p.OnUse(1, 22, At(22, 0)), 27u);
  EXPECT_EQ(p.OnUse(1, 27, At(27, 1)), 32u);
}

// (b) 12 shards read in a cycle, one per iteration at phase 1: a shard's
// next use is 12 iterations away, which LRU gets wrong for every one.
TEST(NextUseTest, ShardsReadOnceEveryTwelveIterations) {
  NextUsePredictor p;
  for (uint64_t it = 0; it < 12; ++it) {
    // First cycle: nothing has been seen twice yet.
    EXPECT_EQ(p.OnUse(100 + it, it * 10 + 1, At(1, 0)), kNone) << it;
  }
  for (uint64_t it = 12; it < 30; ++it) {
    const uint64_t now = it * 10 + 1;
    EXPECT_EQ(p.OnUse(100 + it % 12, now, At(now, 0)), now + 120) << it;
  }
}

// (c) Per-step temporaries with new ids every iteration: an activation
// written at phase 3 and read at phase 8, then freed. The slot learns the
// gap from the previous step's buffer.
TEST(NextUseTest, TemporariesWithNewIdsEveryIteration) {
  NextUsePredictor p;
  uint64_t id = 1000;
  for (uint64_t it = 0; it < 4; ++it) {
    const uint64_t base = it * 10;
    const uint64_t predicted_write = p.OnUse(id, base + 3, At(3, 1));
    const uint64_t predicted_read = p.OnUse(id, base + 8, At(8, 0));
    p.OnFreed(id);
    if (it == 0) {
      EXPECT_EQ(predicted_write, kNone);
    } else {
      EXPECT_EQ(predicted_write, base + 8) << it;
      // Its last use: the slot has learnt that buffers there are freed.
      EXPECT_EQ(predicted_read, kNone) << it;
    }
    ++id;
  }
  EXPECT_EQ(p.buffers(), 0u);  // freed buffers are forgotten
}

TEST(NextUseTest, ResetForgetsSlotsAfterAPatternChange) {
  NextUsePredictor p;
  p.OnUse(1, 2, At(2, 0));
  p.OnUse(1, 12, At(12, 0));
  EXPECT_EQ(p.OnUse(2, 22, At(22, 0)), 32u);  // learnt from buffer 1
  p.Reset();
  EXPECT_EQ(p.slots(), 0u);
  EXPECT_EQ(p.OnUse(3, 32, At(32, 0)), kNone);
  // Buffer 1 still has its own gap.
  EXPECT_EQ(p.OnUse(1, 40, std::nullopt), 68u);
}

TEST(NextUseTest, NoOverflowNearTheEndOfTime) {
  NextUsePredictor p;
  p.OnUse(1, 0, std::nullopt);
  p.OnUse(1, kNone - 10, std::nullopt);
  EXPECT_EQ(p.Predicted(1), kNone);
}

}  // namespace
}  // namespace stensor
