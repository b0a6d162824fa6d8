#include "core/swap/slab_pool.h"

#include <gtest/gtest.h>

namespace stensor {
namespace {

constexpr uint64_t kSlab = 2 << 20;
constexpr CUdeviceptr kBase = 0x10000000;

TEST(SlabPoolTest, PlacesBlocksAlignedInTheTightestFreeRange) {
  SlabPool pool;
  pool.AddSlab(7, 0, kBase, kSlab);
  auto a = pool.Take(0, 100);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->base, kBase);
  EXPECT_EQ(a->slab, 7u);
  auto b = pool.Take(0, 1000, SlabPool::Order{nullptr, 0});
  ASSERT_TRUE(b);
  EXPECT_EQ(b->base, kBase + SlabPool::kAlign);  // a's 100 bytes take one unit
  auto c = pool.Take(0, 4096);
  ASSERT_TRUE(c);
  // A hole of two units between a and c: the tightest fit for 600 bytes,
  // ahead of the slab's tail.
  ASSERT_TRUE(pool.Free(b->base));
  auto d = pool.Take(0, 600);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->base, kBase + SlabPool::kAlign);
  EXPECT_FALSE(pool.Take(1, 100)) << "no slab on device 1";
  EXPECT_FALSE(pool.Take(0, kSlab)) << "more than the free space";
}

TEST(SlabPoolTest, FindsTheLiveBlockHoldingAnAddressAndNothingInFreeSpace) {
  SlabPool pool;
  pool.AddSlab(7, 0, kBase, kSlab);
  auto a = pool.Take(0, 100);
  pool.Name(a->base, 42);
  auto in = pool.Containing(a->base + 99);
  ASSERT_TRUE(in);
  EXPECT_EQ(in->id, 42u);
  EXPECT_EQ(in->size, 100u);
  EXPECT_FALSE(pool.Containing(a->base + SlabPool::kAlign));
  EXPECT_FALSE(pool.Free(a->base + 8)) << "a free names the block's start";
  ASSERT_TRUE(pool.Free(a->base));
  EXPECT_FALSE(pool.Containing(a->base));
  EXPECT_FALSE(pool.Free(a->base)) << "freed twice";
}

TEST(SlabPoolTest, AFreedBlocksSpaceWaitsForItsUsesInTheOrderOfFrees) {
  SlabPool pool;
  pool.AddSlab(7, 0, kBase, 4 * SlabPool::kAlign);
  auto a = pool.Take(0, SlabPool::kAlign * 2);
  auto b = pool.Take(0, SlabPool::kAlign * 2);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(pool.Free(a->base, /*wait=*/1));
  ASSERT_TRUE(pool.Free(b->base, /*wait=*/2));
  EXPECT_FALSE(pool.Take(0, 1)) << "nothing placed before the work is done";
  // The first not done stops the walk; `all` asks every one.
  int asked = 0;
  pool.Reclaim(0, false, [&](uint64_t wait) {
    ++asked;
    return wait == 2;
  });
  EXPECT_EQ(asked, 1);
  EXPECT_FALSE(pool.Take(0, 1));
  pool.Reclaim(0, true, [&](uint64_t wait) { return wait == 2; });
  auto c = pool.Take(0, SlabPool::kAlign * 2);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->base, b->base);
  pool.Reclaim(0, false, [](uint64_t) { return true; });
  auto d = pool.Take(0, SlabPool::kAlign * 2);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->base, a->base);
}

TEST(SlabPoolTest, FreedRangesMergeSoAnEmptySlabIsOneRangeAgainAndGoesBeyondTheKept) {
  SlabPool pool;
  pool.AddSlab(7, 0, kBase, kSlab);
  pool.AddSlab(8, 0, kBase + kSlab, kSlab);
  std::vector<SlabPool::Block> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(*pool.Take(0, 300000));
  for (const auto& b : blocks) EXPECT_EQ(b.slab, 7u) << "one slab filled before the next";
  EXPECT_TRUE(pool.TakeEmpty(0, 0) == std::vector<uint64_t>{8});
  for (int i : {1, 3, 0, 5, 2, 4}) ASSERT_TRUE(pool.Free(blocks[i].base));
  EXPECT_TRUE(pool.empty());
  auto whole = pool.Take(0, kSlab);
  ASSERT_TRUE(whole) << "the freed ranges merged into the whole slab";
  ASSERT_TRUE(pool.Free(whole->base));
  EXPECT_TRUE(pool.TakeEmpty(0, 1).empty()) << "one empty slab kept";
  EXPECT_TRUE(pool.TakeEmpty(0, 0) == std::vector<uint64_t>{7});
  EXPECT_FALSE(pool.Take(0, 1));
}

TEST(SlabPoolTest, LiveRangesAreWhatACopyMustCarry) {
  SlabPool pool;
  pool.AddSlab(7, 0, kBase, kSlab);
  auto a = pool.Take(0, 100);
  auto b = pool.Take(0, 600);
  auto c = pool.Take(0, 512);
  ASSERT_TRUE(a && b && c);
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(pool.LiveRanges(7), (Ranges{{0, 2048}}));
  ASSERT_TRUE(pool.Free(b->base));
  EXPECT_EQ(pool.LiveRanges(7), (Ranges{{0, 512}, {1536, 512}}));
  EXPECT_TRUE(pool.LiveRanges(8).empty()) << "no such slab";
}

TEST(SlabPoolTest, SpaceFreedInStreamOrderIsFreeAtOnceForThatStreamOnly) {
  SlabPool pool;
  pool.AddSlab(7, 0, kBase, 4 * SlabPool::kAlign);
  const SlabPool::Order s1{reinterpret_cast<CUstream>(0x10), 0};
  const SlabPool::Order s2{reinterpret_cast<CUstream>(0x20), 0};
  auto a = pool.Take(0, 2 * SlabPool::kAlign, s1);
  auto b = pool.Take(0, 2 * SlabPool::kAlign, s1);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(pool.Free(a->base, /*wait=*/1, s1));
  EXPECT_FALSE(pool.Take(0, SlabPool::kAlign)) << "not for cuMemAlloc";
  EXPECT_FALSE(pool.Take(0, SlabPool::kAlign, s2)) << "not for another stream";
  auto c = pool.Take(0, SlabPool::kAlign, s1);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->base, a->base);
  EXPECT_TRUE(c->stream_ordered);
  EXPECT_EQ(c->ended_wait, 0u) << "half of the freed space still waits";
  auto d = pool.Take(0, SlabPool::kAlign, s1);  // the rest of a's space
  ASSERT_TRUE(d);
  EXPECT_EQ(d->base, a->base + SlabPool::kAlign);
  EXPECT_EQ(d->ended_wait, 1u) << "nothing waits on wait 1 any more";
  EXPECT_FALSE(pool.Take(0, 1, s1));
  pool.Reclaim(0, true, [](uint64_t) { return true; });
  EXPECT_FALSE(pool.Take(0, 1)) << "nothing was left waiting";
}

}  // namespace
}  // namespace stensor
