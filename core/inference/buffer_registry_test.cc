#include "core/inference/buffer_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace stensor {
namespace {

TEST(BufferRegistryTest, FindsInteriorPointersAndNothingOutside) {
  BufferRegistry r;
  auto a = r.Add(0x1000, 0x100, 0, BufferKind::kDeviceAlloc);
  auto b = r.Add(0x2000, 0x10, 1, BufferKind::kAppVmm);
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(r.Find(0x1000)->id, *a);
  EXPECT_EQ(r.Find(0x10ff)->id, *a);
  EXPECT_FALSE(r.Find(0x1100));
  EXPECT_FALSE(r.Find(0xfff));
  EXPECT_EQ(r.Find(0x200f)->device, 1);
  EXPECT_EQ(r.Find(0x200f)->kind, BufferKind::kAppVmm);
  EXPECT_FALSE(r.Find(0x2010));
  EXPECT_FALSE(r.Find(0));
}

TEST(BufferRegistryTest, RejectsOverlapsAndEmptyRanges) {
  BufferRegistry r;
  ASSERT_TRUE(r.Add(0x1000, 0x100, 0, BufferKind::kDeviceAlloc));
  EXPECT_FALSE(r.Add(0x10f0, 0x100, 0, BufferKind::kDeviceAlloc));
  EXPECT_FALSE(r.Add(0xf80, 0x100, 0, BufferKind::kDeviceAlloc));
  EXPECT_FALSE(r.Add(0x1000, 0x10, 0, BufferKind::kDeviceAlloc));
  EXPECT_FALSE(r.Add(0x3000, 0, 0, BufferKind::kDeviceAlloc));
  EXPECT_FALSE(r.Add(UINT64_MAX - 4, 16, 0, BufferKind::kDeviceAlloc));
  EXPECT_TRUE(r.Add(0x1100, 0x100, 0, BufferKind::kDeviceAlloc));  // adjacent
  EXPECT_EQ(r.size(), 2u);
}

TEST(BufferRegistryTest, RemoveNeedsTheBaseAndIdsAreNeverReused) {
  BufferRegistry r;
  auto a = r.Add(0x1000, 0x100, 0, BufferKind::kDeviceAlloc);
  EXPECT_FALSE(r.Remove(0x1008));
  auto removed = r.Remove(0x1000);
  ASSERT_TRUE(removed);
  EXPECT_EQ(removed->id, *a);
  EXPECT_FALSE(r.Find(0x1008));
  auto again = r.Add(0x1000, 0x100, 0, BufferKind::kDeviceAlloc);
  EXPECT_GT(*again, *a);
}

TEST(BufferRegistryTest, RemoveRangeTakesEveryBufferStartingInIt) {
  BufferRegistry r;
  auto a = r.Add(0x1000, 0x1000, 0, BufferKind::kAppVmm);
  auto b = r.Add(0x2000, 0x1000, 0, BufferKind::kAppVmm);
  auto c = r.Add(0x3000, 0x1000, 0, BufferKind::kAppVmm);
  std::vector<Buffer> gone = r.RemoveRange(0x2000, 0x2000);
  ASSERT_EQ(gone.size(), 2u);
  EXPECT_EQ(gone[0].id, *b);
  EXPECT_EQ(gone[1].id, *c);
  EXPECT_EQ(r.Find(0x1800)->id, *a);
  EXPECT_FALSE(r.Find(0x2800));
  EXPECT_FALSE(r.Find(0x3800));
  EXPECT_TRUE(r.RemoveRange(0x5000, 0x1000).empty());
}

TEST(BufferRegistryTest, FindAllReportsEveryHitWithItsIndex) {
  BufferRegistry r;
  auto a = r.Add(0x10000, 0x1000, 0, BufferKind::kDeviceAlloc);
  auto b = r.Add(0x20000, 0x1000, 0, BufferKind::kDeviceAlloc);
  uint64_t words[] = {0x10010, 42, 0x20fff, 0x21000, 0x10000};
  std::vector<std::pair<size_t, uint64_t>> hits;
  r.FindAll(words, 5, [&](size_t i, uint64_t id) { hits.push_back({i, id}); });
  std::vector<std::pair<size_t, uint64_t>> want = {{0, *a}, {2, *b}, {4, *a}};
  std::sort(hits.begin(), hits.end());  // cached hits may come first
  EXPECT_EQ(hits, want);
  hits.clear();
  r.FindAll(words, 5, [&](size_t i, uint64_t id) { hits.push_back({i, id}); });
  std::sort(hits.begin(), hits.end());
  EXPECT_EQ(hits, want);  // the same from the cache
}

// Against a naive model under random adds, removes and lookups.
TEST(BufferRegistryTest, MatchesANaiveModel) {
  BufferRegistry r;
  std::map<uint64_t, uint64_t> model;  // base -> size
  std::mt19937_64 rng(7);
  for (int step = 0; step < 20000; ++step) {
    uint64_t base = (rng() % 4096) * 64;
    uint64_t size = 1 + rng() % 512;
    switch (rng() % 3) {
      case 0: {
        bool overlaps = false;
        for (auto& [b, s] : model) overlaps |= b < base + size && base < b + s;
        EXPECT_EQ(r.Add(base, size, 0, BufferKind::kDeviceAlloc).has_value(), !overlaps);
        if (!overlaps) model[base] = size;
        break;
      }
      case 1:
        EXPECT_EQ(r.Remove(base).has_value(), model.erase(base) == 1);
        break;
      default: {
        uint64_t addr = rng() % (4096 * 64 + 512);
        bool want = false;
        for (auto& [b, s] : model) want |= addr >= b && addr < b + s;
        EXPECT_EQ(r.Find(addr).has_value(), want) << addr;
      }
    }
  }
  EXPECT_EQ(r.size(), model.size());
}

// The per-thread cache must never answer with a buffer that is gone.
TEST(BufferRegistryTest, CachedHitsDieWithTheirBuffer) {
  BufferRegistry r;
  auto a = r.Add(0x10000, 0x1000, 0, BufferKind::kDeviceAlloc);
  uint64_t word = 0x10010;
  uint64_t seen = 0;
  auto look = [&] {
    seen = 0;
    r.FindAll(&word, 1, [&](size_t, uint64_t id) { seen = id; });
  };
  look();
  look();  // now from the cache
  EXPECT_EQ(seen, *a);
  r.Remove(0x10000);
  look();
  EXPECT_EQ(seen, 0u);
  auto again = r.Add(0x10000, 0x1000, 0, BufferKind::kDeviceAlloc);
  look();
  EXPECT_EQ(seen, *again);
}

// A removed buffer's liveness cell goes to the next buffer added: the old
// buffer's cached entries must not come back with it, wherever it lies.
TEST(BufferRegistryTest, ReusedCellsDoNotReviveCachedHits) {
  BufferRegistry r;
  auto a = r.Add(0x10000, 0x1000, 0, BufferKind::kDeviceAlloc);
  uint64_t words[] = {0x10010, 0x10020};
  std::vector<uint64_t> seen;
  auto look = [&] {
    seen.clear();
    r.FindAll(words, 2, [&](size_t, uint64_t id) { seen.push_back(id); });
  };
  look();
  look();  // cached
  EXPECT_EQ(seen, (std::vector<uint64_t>{*a, *a}));
  r.Remove(0x10000);
  auto b = r.Add(0x80000, 0x1000, 0, BufferKind::kDeviceAlloc);  // takes a's cell
  look();
  EXPECT_TRUE(seen.empty());
  // A smaller buffer at a's old place: only the word inside it hits.
  auto c = r.Add(0x10000, 0x18, 0, BufferKind::kDeviceAlloc);
  look();
  EXPECT_EQ(seen, (std::vector<uint64_t>{*c}));
  uint64_t inside_b = 0x80010;
  seen.clear();
  r.FindAll(&inside_b, 1, [&](size_t, uint64_t id) { seen.push_back(id); });
  EXPECT_EQ(seen, (std::vector<uint64_t>{*b}));
}

// Caches are per thread and per registry: another registry at the same
// address (this one destroyed) sees none of this one's entries.
TEST(BufferRegistryTest, CachedHitsBelongToTheirRegistry) {
  uint64_t word = 0x10010;
  uint64_t first_id = 0;
  {
    BufferRegistry r;
    first_id = *r.Add(0x10000, 0x1000, 0, BufferKind::kDeviceAlloc);
    r.FindAll(&word, 1, [](size_t, uint64_t) {});  // cached now
  }
  BufferRegistry other;
  ASSERT_TRUE(other.Add(0x90000, 0x1000, 0, BufferKind::kDeviceAlloc));
  size_t hits = 0;
  other.FindAll(&word, 1, [&](size_t, uint64_t) { ++hits; });
  EXPECT_EQ(hits, 0u);
  EXPECT_GT(first_id, 0u);
}

// Cached lookups on a thread while another thread frees and allocates: a
// stable buffer is always found, a buffer freed before the lookup began is
// never reported, and hits at a churned address only ever name a buffer that
// was live there (ids there grow, so a reader never sees one go back).
TEST(BufferRegistryTest, CachedLookupsDuringConcurrentAllocAndFree) {
  for (int round = 0; round < 20; ++round) {
    BufferRegistry r;
    constexpr uint64_t kStable = 0x100000, kChurned = 0x200000;
    auto stable = r.Add(kStable, 0x1000, 0, BufferKind::kDeviceAlloc);
    ASSERT_TRUE(stable);
    std::atomic<uint64_t> last_removed{0};  // id of the last churned buffer freed
    std::atomic<bool> done{false};
    std::thread writer([&] {
      for (int i = 0; i < 3000; ++i) {
        r.Add(kChurned, 0x1000, 0, BufferKind::kDeviceAlloc);
        // Others come and go too, moving the arrays around.
        r.Add(0x300000 + (i % 64) * 0x1000, 0x800, 0, BufferKind::kDeviceAlloc);
        if (auto b = r.Remove(kChurned)) last_removed.store(b->id);
        if (i % 3 == 0) r.Remove(0x300000 + ((i + 32) % 64) * 0x1000);
      }
      done.store(true);
    });
    uint64_t words[] = {kStable + 8, kChurned + 16, 42};
    uint64_t newest_churned = 0;
    while (!done.load()) {
      const uint64_t removed_before = last_removed.load();
      uint64_t stable_hits = 0, churned = 0;
      r.FindAll(words, 3, [&](size_t i, uint64_t id) {
        if (i == 0) stable_hits += id == *stable;
        if (i == 1) churned = id;
        EXPECT_NE(i, 2u);
      });
      ASSERT_EQ(stable_hits, 1u);
      if (churned != 0) {
        EXPECT_GT(churned, removed_before) << "a buffer freed before the lookup";
        EXPECT_GE(churned, newest_churned);
        newest_churned = churned;
      }
    }
    writer.join();
    // Everything at the churned address is gone now, cached or not.
    size_t hits = 0;
    r.FindAll(words + 1, 1, [&](size_t, uint64_t) { ++hits; });
    EXPECT_EQ(hits, 0u);
  }
}

TEST(BufferRegistryTest, ConcurrentLookupsAndUpdates) {
  BufferRegistry r;
  for (uint64_t i = 0; i < 1000; ++i)
    r.Add(0x100000 + i * 0x1000, 0x800, 0, BufferKind::kDeviceAlloc);
  std::thread writer([&] {
    for (uint64_t i = 0; i < 2000; ++i) {
      uint64_t base = 0x10000000 + (i % 100) * 0x1000;
      if (!r.Add(base, 0x800, 0, BufferKind::kDeviceAlloc)) r.Remove(base);
    }
  });
  size_t found = 0;
  for (int rep = 0; rep < 200; ++rep) {
    for (uint64_t i = 0; i < 1000; i += 7) found += r.Find(0x100000 + i * 0x1000 + 5).has_value();
  }
  writer.join();
  EXPECT_EQ(found, 200u * ((1000 + 6) / 7));
}

// The launch memo keeps an answer while the generation stands still: it
// must move with every change and only then.
TEST(BufferRegistryTest, GenerationMovesWithEveryChangeAndOnlyThen) {
  BufferRegistry r;
  BufferRegistry other;
  EXPECT_NE(r.instance(), 0u);
  EXPECT_NE(r.instance(), other.instance());
  uint64_t g = r.generation();
  ASSERT_TRUE(r.Add(0x1000, 0x100, 0, BufferKind::kDeviceAlloc));
  EXPECT_GT(r.generation(), g);
  g = r.generation();
  EXPECT_FALSE(r.Add(0x1080, 0x100, 0, BufferKind::kDeviceAlloc));  // overlaps
  EXPECT_FALSE(r.Remove(0x1080));                                   // not a base
  EXPECT_TRUE(r.RemoveRange(0x9000, 0x100).empty());
  EXPECT_TRUE(r.Find(0x1010));
  EXPECT_EQ(r.generation(), g);
  ASSERT_TRUE(r.Remove(0x1000));
  EXPECT_GT(r.generation(), g);
  g = r.generation();
  ASSERT_TRUE(r.Add(0x2000, 0x100, 0, BufferKind::kDeviceAlloc));
  ASSERT_EQ(r.RemoveRange(0x2000, 0x100).size(), 1u);
  EXPECT_GT(r.generation(), g + 1);
}

// What lets the launch memo keep an answer across a change: a hit's cell
// (from the miss path and from the cache alike) holds its id until that
// buffer is removed, even when the cell is reused; OutsideBounds holds for
// an address no live buffer can contain, and stops when one is added there.
TEST(BufferRegistryTest, LivenessCellsAndBoundsTellWhatAChangeTouched) {
  BufferRegistry r;
  const uint64_t a = *r.Add(0x10000, 0x1000, 0, BufferKind::kDeviceAlloc);
  const BufferRegistry::LivenessCell* missed = nullptr;
  const BufferRegistry::LivenessCell* cached = nullptr;
  {
    const BufferRegistry::Reader reader(r);
    EXPECT_EQ(reader.Lookup(0x10010, &missed), a);  // the lookup under the lock
    EXPECT_EQ(reader.Lookup(0x10020, &cached), a);  // this thread's cache
    const BufferRegistry::LivenessCell* untouched = nullptr;
    EXPECT_EQ(reader.Lookup(0x20000, &untouched), 0u);
    EXPECT_EQ(untouched, nullptr);
  }
  ASSERT_NE(missed, nullptr);
  EXPECT_EQ(cached, missed);
  EXPECT_TRUE(BufferRegistry::StillLive(missed, a));
  EXPECT_TRUE(r.OutsideBounds(0x8000));
  EXPECT_TRUE(r.OutsideBounds(0x11000));
  EXPECT_FALSE(r.OutsideBounds(0x10800));
  const uint64_t b = *r.Add(0x40000, 0x1000, 0, BufferKind::kDeviceAlloc);
  EXPECT_TRUE(BufferRegistry::StillLive(missed, a));
  EXPECT_FALSE(r.OutsideBounds(0x20000));  // between the buffers now
  ASSERT_TRUE(r.Remove(0x10000));
  EXPECT_FALSE(BufferRegistry::StillLive(missed, a));
  EXPECT_TRUE(r.OutsideBounds(0x10010));  // below the lowest buffer now
  // A later buffer may take the cell; a's id never comes back.
  const uint64_t c = *r.Add(0x10000, 0x1000, 0, BufferKind::kDeviceAlloc);
  EXPECT_FALSE(BufferRegistry::StillLive(missed, a));
  EXPECT_NE(c, a);
  ASSERT_TRUE(r.Remove(0x40000));
  ASSERT_TRUE(r.Remove(0x10000));
  EXPECT_TRUE(r.OutsideBounds(0x10010));  // empty
  EXPECT_NE(b, c);
}

}  // namespace
}  // namespace stensor
