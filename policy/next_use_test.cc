#include "policy/next_use.h"

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

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
  p.OnUse(1, 17, std::nullopt);
  EXPECT_EQ(p.OnUse(1, 30, std::nullopt), 43u);
  EXPECT_EQ(p.Predicted(1), 43u);
  // Same op, second slot: unchanged.
  EXPECT_EQ(p.OnUse(1, 30, std::nullopt), 43u);
}

// The first gap runs from the use after allocation (an initialisation) to
// the next: a shard written at start and read 45 operations later is not
// read again 45 operations after that.
TEST(NextUseTest, TheFirstGapPredictsNothing) {
  NextUsePredictor p;
  p.OnUse(1, 0, std::nullopt);
  EXPECT_EQ(p.OnUse(1, 45, std::nullopt), kNone);
}

// Once an iteration is known, a slot that has learnt nothing predicts
// nothing: the buffer's own last gap is one sample, not a period.
TEST(NextUseTest, WithAnIterationAnUnlearntSlotIsNotTheOwnGap) {
  NextUsePredictor p;
  p.OnUse(1, 0, std::nullopt);
  p.OnUse(1, 5, std::nullopt);
  EXPECT_EQ(p.OnUse(1, 9, std::nullopt), 13u);  // own gap, no iteration yet
  EXPECT_EQ(p.OnUse(1, 13, At(13, 0)), kNone);
}

// When a slot learns a gap, the buffers last used in it are predicted with
// it too, not only the next one used there: every shard of a cycle is known
// once the first comes round again.
TEST(NextUseTest, ALearntGapRepredictsEveryBufferLastUsedInTheSlot) {
  NextUsePredictor p;
  for (uint64_t it = 0; it < 4; ++it) p.OnUse(100 + it, it * 10 + 1, At(1, 0));
  EXPECT_TRUE(p.TakeChanged().empty());
  EXPECT_EQ(p.OnUse(100, 41, At(41, 0)), 81u);
  const auto changed = p.TakeChanged();
  ASSERT_EQ(changed.size(), 3u);
  for (const auto& [id, next] : changed) {
    EXPECT_EQ(next, (id - 100) * 10 + 1 + 40) << id;
    EXPECT_EQ(p.Predicted(id), next);
  }
  EXPECT_TRUE(p.TakeChanged().empty());
  // Learning the same gap again changes nothing.
  p.OnUse(101, 51, At(51, 0));
  EXPECT_TRUE(p.TakeChanged().empty());
}

// A rotating slot in its first cycle: shards written one after another at
// start (signature 7), then read one per iteration at phase 1 (signature
// 9). Two reads show the walk; the shard written after the one read now is
// predicted for the next iteration.
TEST(NextUseTest, ARotatingSlotNamesItsNextOccupant) {
  NextUsePredictor p;
  for (uint64_t s = 0; s < 6; ++s) p.OnUse(100 + s, s, std::nullopt, 7);
  EXPECT_EQ(p.OnUse(100, 11, At(11, 0), 9), kNone);
  EXPECT_TRUE(p.TakeChanged().empty());  // one occupant: no walk yet
  p.OnUse(101, 21, At(21, 0), 9);
  EXPECT_EQ(p.TakeChanged(), (std::vector<std::pair<uint64_t, uint64_t>>{{102, 31}}));
  p.OnUse(102, 31, At(31, 0), 9);
  EXPECT_EQ(p.TakeChanged(), (std::vector<std::pair<uint64_t, uint64_t>>{{103, 41}}));
  EXPECT_EQ(p.Predicted(103), 41u);
  // Unrelated uses of signature 7 break no walk: a weight used by its own
  // kernel in another slot keeps its own prediction.
  p.OnUse(1, 32, At(32, 1), 5);
  EXPECT_TRUE(p.TakeChanged().empty());
}

// Across the wrap: the cycle is read again in the order of its last reads.
TEST(NextUseTest, ARotatingSlotFollowsTheCycleReadAgain) {
  NextUsePredictor p;
  for (uint64_t s = 0; s < 3; ++s) p.OnUse(100 + s, s * 10 + 1, At(1, 0), 9);
  p.TakeChanged();
  // Shard 100 comes back to the same use: the one read after it last time
  // (101) is next.
  p.OnUse(100, 31, At(31, 0), 9);
  bool named = false;
  for (const auto& [id, next] : p.TakeChanged()) named |= id == 101 && next == 41;
  EXPECT_TRUE(named);
  EXPECT_EQ(p.Predicted(101), 41u);
}

// Two buffers used in turn in one slot (double buffering).
TEST(NextUseTest, BuffersUsedInTurn) {
  NextUsePredictor p;
  p.OnUse(1, 1, At(1, 0), 9);
  p.OnUse(2, 11, At(11, 0), 9);
  p.OnUse(1, 21, At(21, 0), 9);
  EXPECT_EQ(p.Predicted(2), 31u);
  EXPECT_EQ(p.OnUse(2, 31, At(31, 0), 9), 51u);
  EXPECT_EQ(p.Predicted(1), 41u);
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
  // Buffer 1 still has its own gap (its second; the first predicts nothing).
  EXPECT_EQ(p.OnUse(1, 40, std::nullopt), 68u);
}

TEST(NextUseTest, NoOverflowNearTheEndOfTime) {
  NextUsePredictor p;
  p.OnUse(1, 0, std::nullopt);
  p.OnUse(1, 1, std::nullopt);
  p.OnUse(1, kNone - 10, std::nullopt);
  EXPECT_EQ(p.Predicted(1), kNone);
}

}  // namespace
}  // namespace stensor
