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

// A buffer used again in the slot of its last use, which learns nothing new
// there (the steady state, where OnUse skips the slot's bookkeeping), is
// still that slot's member: a gap the slot learns later re-predicts it.
TEST(NextUseTest, ABufferUsedAgainInItsSlotStaysItsMember) {
  NextUsePredictor p;
  const Slot s{0, 0};
  // Two kinds of use (signatures), so that no rotation names anyone.
  constexpr uint64_t kOne = 9, kTwo = 5;
  p.OnUse(1, 0, s, kOne);
  EXPECT_EQ(p.OnUse(1, 10, s, kOne), 20u);  // the slot learns 10
  EXPECT_EQ(p.OnUse(1, 20, s, kOne), 30u);
  EXPECT_EQ(p.OnUse(2, 21, s, kTwo), 31u);
  EXPECT_TRUE(p.TakeChanged().empty());
  EXPECT_EQ(p.OnUse(1, 30, s, kOne), 40u);  // the same slot, the same gap
  EXPECT_TRUE(p.TakeChanged().empty());
  // Buffer 2 comes back 30 later, elsewhere: the slot learns 30, and buffer
  // 1, last used there at 30, is now expected at 60.
  p.OnUse(2, 51, Slot{5, 0}, kTwo);
  const std::vector<std::pair<uint64_t, uint64_t>> expected = {{1, 60}};
  EXPECT_EQ(p.TakeChanged(), expected);
  EXPECT_EQ(p.Predicted(1), 60u);
}

// A rotating slot in its first cycle: shards written one after another at
// start (signature 7), then read one per iteration at phase 1 (signature
// 9). Two reads show the walk; the shard written after the one read now is
// predicted for the next iteration.
TEST(NextUseTest, ARotatingSlotNamesItsNextOccupant) {
  NextUsePredictor p;
  for (uint64_t s = 0; s < 6; ++s) p.OnUse(100 + s, s, std::nullopt, 7);
  EXPECT_EQ(p.TakeChanged().size(), 3u);  // the burst's first three join it
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

constexpr uint64_t kSequence = EvictionCandidate::kInSequence;

// Twelve shards written one per operation at start, nothing read yet: from
// the fourth on, each is placed in the sequence by the time it was written,
// and the first three join when the fourth comes.
TEST(NextUseTest, ABurstOfFirstUsesIsASequence) {
  NextUsePredictor p;
  const uint64_t write = 77;  // the signature: one kernel, one argument
  for (uint64_t t = 0; t < 3; ++t) EXPECT_EQ(p.OnUse(100 + t, t, std::nullopt, write), kNone);
  EXPECT_TRUE(p.TakeChanged().empty());
  EXPECT_EQ(p.OnUse(103, 3, std::nullopt, write), kSequence + 3);
  EXPECT_EQ(p.TakeChanged(),
            (std::vector<std::pair<uint64_t, uint64_t>>{
                {100, kSequence + 0}, {101, kSequence + 1}, {102, kSequence + 2}}));
  for (uint64_t t = 4; t < 12; ++t)
    EXPECT_EQ(p.OnUse(100 + t, t, std::nullopt, write), kSequence + t);
  EXPECT_EQ(p.Predicted(100), kSequence);
  EXPECT_EQ(p.Predicted(111), kSequence + 11);
  // Read: out of the sequence, and its first gap predicts nothing.
  EXPECT_EQ(p.OnUse(100, 20, std::nullopt, /*signature=*/5), kNone);
  EXPECT_EQ(p.Predicted(101), kSequence + 1);
}

// Three in a row are no burst; another operation in between ends one; a
// buffer used before does not join one.
TEST(NextUseTest, OnlyFourOrMoreConsecutiveFirstUsesMakeABurst) {
  NextUsePredictor p;
  for (uint64_t t = 0; t < 3; ++t) EXPECT_EQ(p.OnUse(1 + t, t, std::nullopt, 7), kNone);
  p.OnUse(50, 3, std::nullopt, 8);  // another kind of operation
  EXPECT_EQ(p.OnUse(4, 4, std::nullopt, 7), kNone);
  EXPECT_EQ(p.OnUse(5, 5, std::nullopt, 7), kNone);
  EXPECT_EQ(p.OnUse(1, 6, std::nullopt, 7), kNone);  // used before
  EXPECT_EQ(p.OnUse(6, 7, std::nullopt, 7), kNone);  // not consecutive
  EXPECT_TRUE(p.TakeChanged().empty());
  EXPECT_EQ(p.OnUse(7, 8, std::nullopt, 7), kNone);
  EXPECT_EQ(p.OnUse(8, 9, std::nullopt, 7), kNone);
  EXPECT_EQ(p.OnUse(9, 10, std::nullopt, 7), kSequence + 10);
  // 6, 7 and 8 join; 1 (used twice) and 4, 5 (an earlier run) do not.
  EXPECT_EQ(p.TakeChanged(), (std::vector<std::pair<uint64_t, uint64_t>>{
                                 {6, kSequence + 7}, {7, kSequence + 8}, {8, kSequence + 9}}));
}

// Whatever predicts a time wins over the sequence: a per-step temporary
// whose slot learnt its gap keeps that gap even when it is written in a
// burst.
TEST(NextUseTest, APredictedTimeWinsOverABurst) {
  NextUsePredictor p;
  p.OnUse(1, 0, At(0, 0), 7);
  p.OnUse(1, 10, At(10, 0), 3);  // the slot learns 10
  for (uint64_t t = 20; t < 24; ++t) p.OnUse(100 + t, t, At(t, 0), 9);
  EXPECT_EQ(p.Predicted(120), 30u);             // phase 0, slot 0: learnt
  EXPECT_EQ(p.Predicted(121), kSequence + 21);  // phases 1-3: unlearnt
  EXPECT_EQ(p.Predicted(123), kSequence + 23);
}

// No prediction reaches the values that mean "in a sequence".
TEST(NextUseTest, TimesStayBelowTheSequenceRange) {
  NextUsePredictor p;
  p.OnUse(1, kSequence - 30, std::nullopt);
  p.OnUse(1, kSequence - 20, std::nullopt);
  EXPECT_EQ(p.OnUse(1, kSequence - 10, std::nullopt), kNone);
  p.OnUse(2, 0, std::nullopt);
  p.OnUse(2, 1, std::nullopt);
  EXPECT_EQ(p.OnUse(2, kSequence - 5, std::nullopt), kNone);  // would be 2^64 - 11
}

}  // namespace
}  // namespace stensor
