#include "policy/eviction_order.h"

#include <deque>
#include <memory>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace stensor {
namespace {

class EvictionOrderTest : public ::testing::Test {
 protected:
  EvictionState& Add(uint64_t id, uint64_t last_use, bool eligible = true) {
    EvictionState& b = buffers_.emplace_back();
    b.id = id;
    b.serial = id;
    b.reserved = 2 << 20;
    b.last_use = last_use;
    b.gpu_version = 1;
    b.written = true;
    order_.Update(b, eligible);
    return b;
  }
  EvictionState* Victim(EvictionOrder::Filter filter = {}) { return order_.Victim(filter); }

  std::unique_ptr<EvictionPolicy> lru_ = MakeLruPolicy();
  EvictionOrder order_{lru_.get(), /*version_rules=*/true};
  std::deque<EvictionState> buffers_;  // stable addresses
};

TEST_F(EvictionOrderTest, TakesTheLeastRecentlyUsedFirst) {
  Add(1, 30);
  Add(2, 10);
  Add(3, 20);
  ASSERT_NE(Victim(), nullptr);
  EXPECT_EQ(Victim()->id, 2u);
}

TEST_F(EvictionOrderTest, ReadsFieldsChangedSinceTheLastLookWhenItLooksAgain) {
  EvictionState& a = Add(1, 10);
  Add(2, 20);
  EXPECT_EQ(Victim()->id, 1u);
  a.last_use = 30;  // used again: only listed until the next look
  order_.Update(a, true);
  EXPECT_EQ(Victim()->id, 2u);
}

TEST_F(EvictionOrderTest, NeverTakesPinnedFailedOrPrefetchedBuffersUnlessAsked) {
  EvictionState& a = Add(1, 10);
  EvictionState& b = Add(2, 20);
  EvictionState& c = Add(3, 30);
  a.pins = 1;
  b.failed_round = 7;
  c.prefetched = true;
  EXPECT_EQ(Victim({7, false}), nullptr);
  EXPECT_EQ(Victim({7, true})->id, 3u);
  EXPECT_EQ(Victim({8, false})->id, 2u);  // a new round: tried again
  EXPECT_EQ(order_.Victim({8, true}, [](EvictionState& s) { return s.id != 2; })->id, 3u);
}

TEST_F(EvictionOrderTest, DroppableOnlyWhatLosesNothing) {
  EvictionState& dirty = Add(1, 10);
  EvictionState& clean = Add(2, 20);
  clean.location = Location::kCpuGpu;
  clean.host_version = clean.gpu_version;
  order_.Update(clean, true);
  EvictionState& fresh = Add(3, 5);
  fresh.written = false;  // never written: holds what fresh memory holds
  order_.Update(fresh, true);
  EXPECT_FALSE(order_.Droppable(dirty));
  EXPECT_TRUE(order_.Droppable(clean));
  EXPECT_TRUE(order_.Droppable(fresh));
  EXPECT_TRUE(order_.Copies(dirty));
  EXPECT_EQ(order_.droppable_size(), 2u);
  EXPECT_EQ(order_.DropVictim({})->id, 3u);
  // Written since its host copy was taken: no longer droppable.
  clean.gpu_version = 2;
  order_.Update(clean, true);
  fresh.written = true;
  order_.Update(fresh, true);
  EXPECT_EQ(order_.DropVictim({}), nullptr);
  EXPECT_TRUE(order_.Copies(clean));
  // The device copy is not the data: goes without a copy whatever else holds.
  dirty.stale_device = true;
  order_.Update(dirty, true);
  EXPECT_EQ(order_.DropVictim({})->id, 1u);
}

TEST_F(EvictionOrderTest, WithoutVersionRulesANeverWrittenBufferIsCopied) {
  EvictionOrder lru_only(lru_.get(), /*version_rules=*/false);
  EvictionState b;
  b.id = 1;
  b.gpu_version = 1;
  lru_only.Update(b, true);
  EXPECT_FALSE(lru_only.Droppable(b));
  EXPECT_TRUE(lru_only.Copies(b));
  EXPECT_EQ(lru_only.droppable_size(), 0u);
  lru_only.Remove(b);
}

TEST_F(EvictionOrderTest, IneligibleAndRemovedBuffersLeaveBothOrders) {
  EvictionState& a = Add(1, 10);
  EvictionState& b = Add(2, 20);
  a.location = Location::kCpuGpu;
  a.host_version = a.gpu_version;
  order_.Update(a, true);
  EXPECT_EQ(order_.evictable_size(), 2u);
  EXPECT_EQ(order_.droppable_size(), 1u);
  order_.Update(a, /*eligible=*/false);  // swapped out, say
  EXPECT_EQ(order_.evictable_size(), 1u);
  EXPECT_EQ(order_.droppable_size(), 0u);
  b.last_use = 40;
  order_.Update(b, true);
  order_.Remove(b);  // listed for re-keying, then destroyed
  EXPECT_EQ(order_.evictable_size(), 0u);
  EXPECT_EQ(Victim(), nullptr);
  Add(3, 50, /*eligible=*/false);
  EXPECT_EQ(order_.evictable_size(), 0u);
}

// Against a walk of every buffer: the same first choice after random
// changes, removals and looks, whatever the interleaving.
class SizedVictimTest : public ::testing::Test {
 protected:
  // A dirty buffer of `mib` MiB next used at `next_use`.
  EvictionState& Add(uint64_t id, uint64_t mib, uint64_t next_use) {
    EvictionState& b = buffers_.emplace_back();
    b.id = id;
    b.serial = id;
    b.reserved = mib << 20;
    b.last_use = 1;
    b.gpu_version = 1;
    b.written = true;
    b.next_use = next_use;
    order_.Update(b, true);
    return b;
  }
  EvictionState* Victim(uint64_t shortfall, uint64_t now = 100) {
    EvictionOrder::Filter filter;
    filter.shortfall = shortfall;
    filter.now = now;
    return order_.Victim(filter);
  }

  std::unique_ptr<EvictionPolicy> belady_ = MakeBeladyPolicy();
  EvictionOrder order_{belady_.get(), /*version_rules=*/true};
  std::deque<EvictionState> buffers_;
};

TEST_F(SizedVictimTest, ASmallShortfallTakesTheSmallBufferNeededAlmostAsLate) {
  Add(1, 24, 200);  // Belady's pick: needed last
  Add(2, 2, 180);
  Add(3, 4, 190);
  EXPECT_EQ(Victim(0)->id, 1u);        // no shortfall given: the policy's order
  EXPECT_EQ(Victim(1 << 20)->id, 2u);  // 2 MiB cover it: 4 moved, not 48
  EXPECT_EQ(Victim(3 << 20)->id, 3u);  // the 2 MiB one does not cover it
  EXPECT_EQ(Victim(5 << 20)->id, 1u);  // only the first does
}

// A forced eviction is noted with how far off its victim's next use was
// (ForcedOutLog), unless the look passed over a buffer fetched ahead of its
// use that the order ranked first: then the fetch, not the cap, pressed.
TEST_F(SizedVictimTest, AForcedEvictionPastAFetchedBufferIsNotNoted) {
  EvictionState& fetched = Add(1, 2, 150);
  EvictionState& next = Add(2, 2, 101);  // needed by the next operation
  fetched.prefetched = true;
  order_.Update(fetched, true);
  ASSERT_EQ(Victim(0)->id, 2u);
  order_.NoteForcedOut(next, 100);
  EXPECT_FALSE(order_.ForcedOutWithin(1000, 0));
  fetched.prefetched = false;  // used: an ordinary buffer again
  order_.Update(fetched, true);
  Add(3, 2, 120);
  order_.Remove(fetched);
  ASSERT_EQ(Victim(0)->id, 3u);
  order_.NoteForcedOut(buffers_.back(), 100);
  EXPECT_TRUE(order_.ForcedOutWithin(20, 0));
  EXPECT_FALSE(order_.ForcedOutWithin(19, 0));
}

TEST_F(SizedVictimTest, NeverOneNeededSoonNorOneWithoutAPredictedTime) {
  Add(1, 24, 200);
  Add(2, 2, 140);  // 40 ahead against the first's 100: it would be needed back first
  EXPECT_EQ(Victim(1 << 20)->id, 1u);
  Add(3, 2, EvictionCandidate::kInSequence + 5);  // a rank in a sequence, not a time
  EXPECT_EQ(Victim(1 << 20)->id, 3u);             // first in Belady's order, and taken so
}

TEST_F(SizedVictimTest, ADirtyBufferNeverUsedAgainCostsItsCopyOut) {
  // A gradient the optimizer has read: nothing predicts another use, so
  // Belady takes it first, and copies 24 MiB out.
  EvictionState& grad = Add(1, 24, EvictionCandidate::kNoNextUse);
  Add(2, 2, 190);  // 4 MiB: out and back in
  EXPECT_EQ(Victim(1 << 20)->id, 2u);
  EXPECT_EQ(Victim(3 << 20)->id, 1u);  // the 2 MiB one does not cover it
  grad.reserved = 3 << 20;             // 3 MiB out against 4 moved
  order_.Update(grad, true);
  EXPECT_EQ(Victim(1 << 20)->id, 1u);
  grad.location = Location::kCpuGpu;  // clean: it costs nothing
  grad.host_version = grad.gpu_version;
  grad.reserved = 24 << 20;
  order_.Update(grad, true);
  EXPECT_EQ(Victim(1 << 20)->id, 1u);
}

TEST_F(SizedVictimTest, AmongBuffersNothingPredictsTheOrderDecides) {
  // Nothing predicts either (no profile yet): the smaller one, used more
  // recently, may be the next operation's. The least recently used goes.
  EvictionState& old = Add(1, 4, EvictionCandidate::kNoNextUse);
  EvictionState& recent = Add(2, 2, EvictionCandidate::kNoNextUse);
  recent.last_use = 5;
  order_.Update(recent, true);
  EXPECT_EQ(Victim(1 << 20), &old);
}

TEST_F(SizedVictimTest, HalfTheFarthestPredictedUseAwayAtLeast) {
  Add(1, 24, EvictionCandidate::kNoNextUse);
  Add(2, 24, 200);  // the farthest predicted: 100 ahead
  Add(3, 2, 140);   // 40 ahead: too soon
  EXPECT_EQ(Victim(1 << 20)->id, 1u);
  Add(4, 2, 160);  // 60 ahead
  EXPECT_EQ(Victim(1 << 20)->id, 4u);
}

TEST_F(SizedVictimTest, ACleanBufferCostsItsBytesOnceAndPinnedOrPrefetchedOnesAreSkipped) {
  Add(1, 8, 200);                         // dirty: 16 MiB moved
  EvictionState& clean = Add(2, 6, 190);  // clean: 6 MiB moved (back in only)
  clean.location = Location::kCpuGpu;
  clean.host_version = clean.gpu_version;
  order_.Update(clean, true);
  EvictionState& dirty = Add(3, 5, 190);  // dirty: 10 MiB moved
  EXPECT_EQ(Victim(1 << 20)->id, 2u);
  clean.pins = 1;
  EXPECT_EQ(Victim(1 << 20)->id, 3u);
  dirty.prefetched = true;
  EXPECT_EQ(Victim(1 << 20)->id, 1u);
}

TEST_F(EvictionOrderTest, AgreesWithAFullWalk) {
  std::unique_ptr<EvictionPolicy> belady = MakeBeladyPolicy();
  EvictionOrder order(belady.get(), /*version_rules=*/true);
  std::mt19937_64 rng(7);
  std::deque<EvictionState> all(200);
  std::vector<bool> eligible(all.size(), false), removed(all.size(), false);
  for (size_t i = 0; i < all.size(); ++i) {
    all[i].id = i % 50;  // ids repeat: the serial breaks ties
    all[i].serial = i + 1;
    all[i].reserved = (1 + rng() % 4) << 20;
  }
  uint64_t clock = 0;
  for (int step = 0; step < 20000; ++step) {
    const size_t i = rng() % all.size();
    EvictionState& b = all[i];
    if (removed[i]) continue;
    switch (rng() % 8) {
      case 0:
        order.Remove(b);
        removed[i] = true;
        continue;
      case 1:
        b.pins = rng() % 2;
        break;
      case 2:
        b.location = b.location == Location::kCpuGpu ? Location::kGpuOnly : Location::kCpuGpu;
        b.host_version = rng() % 2 ? b.gpu_version : 0;
        break;
      case 3:
        b.gpu_version = ++clock;
        b.written = true;
        break;
      case 4:
        b.next_use = rng() % 3 ? clock + rng() % 1000 : EvictionCandidate::kNoNextUse;
        break;
      default:
        b.last_use = ++clock;
        break;
    }
    eligible[i] = rng() % 5 != 0;
    order.Update(b, eligible[i]);
    if (step % 7 != 0) continue;
    const EvictionState* want = nullptr;
    const EvictionState* want_drop = nullptr;
    for (size_t j = 0; j < all.size(); ++j) {
      const EvictionState& c = all[j];
      if (removed[j] || !eligible[j] || c.pins > 0) continue;
      auto key = [&](const EvictionState& x) {
        return std::make_tuple(belady->Key(order.CandidateOf(x)), x.id, x.serial);
      };
      if (want == nullptr || key(c) < key(*want)) want = &c;
      if (order.Droppable(c) &&
          (want_drop == nullptr || std::make_pair(c.last_use, c.serial) <
                                       std::make_pair(want_drop->last_use, want_drop->serial))) {
        want_drop = &c;
      }
    }
    ASSERT_EQ(order.Victim({}), want) << "step " << step;
    ASSERT_EQ(order.DropVictim({}), want_drop) << "step " << step;
  }
}

}  // namespace
}  // namespace stensor
