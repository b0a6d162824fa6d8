#include "core/swap/physical_pool.h"

#include <gtest/gtest.h>

#include <vector>

#include "absl/container/flat_hash_set.h"

namespace stensor {
namespace {

using Handle = PhysicalPool::Handle;
using Chunk = PhysicalChunk;
using Chunks = std::vector<Chunk>;
using Handles = std::vector<Handle>;

constexpr uint64_t kGranule = 2u << 20;

// Handle h of g granules.
Chunk C(Handle h, uint64_t g = 1) { return Chunk{h, g * kGranule}; }

Handles HandlesOf(const Chunks& chunks) {
  Handles out;
  for (const Chunk& c : chunks) out.push_back(c.handle);
  return out;
}

TEST(PhysicalPoolTest, CountsChunksAndBytes) {
  PhysicalPool pool;
  EXPECT_EQ(pool.bytes(), 0u);
  pool.Put(C(1));
  Chunks more = {C(2, 3), C(3)};
  pool.PutAll(&more);
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(pool.chunks(), 3u);
  EXPECT_EQ(pool.bytes(), 5 * kGranule);
  EXPECT_EQ(ChunkBytes({C(1, 2), C(2, 5)}), 7 * kGranule);
}

// Granule chunks serve any size; what is asked beyond the pool is left to
// the caller.
TEST(PhysicalPoolTest, TakesUpToWhatIsAskedMostRecentFirst) {
  PhysicalPool pool;
  for (Handle h : {1, 2, 3}) pool.Put(C(h));
  Chunks out;
  EXPECT_EQ(pool.Take(2 * kGranule, &out), 2 * kGranule);
  EXPECT_EQ(HandlesOf(out), (Handles{3, 2}));
  EXPECT_EQ(pool.Take(5 * kGranule, &out), kGranule);
  EXPECT_EQ(HandlesOf(out), (Handles{3, 2, 1}));
  EXPECT_EQ(pool.Take(kGranule, &out), 0u);
  EXPECT_EQ(pool.bytes(), 0u);
}

// One chunk of the size asked is taken whole, before chunks that would add
// up to it; else the largest that fit first, and a chunk larger than what
// is left is never taken (a handle maps whole).
TEST(PhysicalPoolTest, ExactSizeFirstThenLargestThatFit) {
  PhysicalPool pool;
  for (Chunk c : {C(1), C(2, 4), C(3), C(4, 2), C(5, 8)}) pool.Put(c);
  Chunks out;
  EXPECT_EQ(pool.Fits(2 * kGranule), 2 * kGranule);
  EXPECT_EQ(pool.Take(2 * kGranule, &out), 2 * kGranule);
  EXPECT_EQ(HandlesOf(out), (Handles{4}));
  out.clear();
  // 7 granules: 4, then 1 and 1; the 8-granule chunk does not fit.
  EXPECT_EQ(pool.Fits(7 * kGranule), 6 * kGranule);
  EXPECT_EQ(pool.Take(7 * kGranule, &out), 6 * kGranule);
  EXPECT_EQ(HandlesOf(out), (Handles{2, 3, 1}));
  EXPECT_EQ(pool.chunks(), 1u);
  EXPECT_EQ(pool.Fits(7 * kGranule), 0u);
}

// Chunks still mapped at an old address go last, the longest pooled first,
// and are reported; idle ones go first.
TEST(PhysicalPoolTest, ShadowedChunksGoLastLongestPooledFirst) {
  PhysicalPool pool;
  for (Handle h : {1, 2, 3, 4}) pool.Put(C(h));
  pool.Shadow(1);
  pool.Shadow(2);
  pool.Shadow(4);
  Chunks out;
  Handles shadowed;
  EXPECT_EQ(pool.Take(3 * kGranule, &out, &shadowed), 3 * kGranule);
  EXPECT_EQ(HandlesOf(out), (Handles{3, 1, 2}));
  EXPECT_EQ(shadowed, (Handles{1, 2}));
  EXPECT_TRUE(pool.shadowed(4));
}

// A shadowed chunk of the exact size serves a need the idle ones fall
// short of, rather than a part of it.
TEST(PhysicalPoolTest, ShadowedExactSizeWhenIdleOnesFallShort) {
  PhysicalPool pool;
  pool.Put(C(1));
  pool.Put(C(2, 3));
  pool.Shadow(2);
  Chunks out;
  Handles shadowed;
  EXPECT_EQ(pool.Take(3 * kGranule, &out, &shadowed), 3 * kGranule);
  EXPECT_EQ(HandlesOf(out), (Handles{2}));
  EXPECT_EQ(shadowed, (Handles{2}));
}

// Among shadowed chunks, those whose owner never takes them back (a freed
// buffer's) go first.
TEST(PhysicalPoolTest, ShadowedChunksOfFreedBuffersGoFirst) {
  PhysicalPool pool;
  for (Handle h : {1, 2, 3}) {
    pool.Put(C(h));
    pool.Shadow(h);
  }
  absl::flat_hash_set<Handle> freed = {3};
  Chunks out;
  Handles shadowed;
  EXPECT_EQ(pool.Take(2 * kGranule, &out, &shadowed, [&](Handle h) { return freed.contains(h); }),
            2 * kGranule);
  EXPECT_EQ(HandlesOf(out), (Handles{3, 1}));
  EXPECT_EQ(shadowed, (Handles{3, 1}));
}

// Release takes only chunks no old address maps; a chunk mapped at two old
// addresses stays shadowed until both are gone.
TEST(PhysicalPoolTest, TakeIdleSkipsShadowedChunks) {
  PhysicalPool pool;
  pool.Put(C(7));
  pool.Put(C(8));
  pool.Shadow(7);
  pool.Shadow(7);
  EXPECT_EQ(pool.TakeIdle(), std::optional<Chunk>(C(8)));
  EXPECT_EQ(pool.TakeIdle(), std::nullopt);
  pool.Unshadow(7);
  EXPECT_EQ(pool.TakeIdle(), std::nullopt);
  pool.Unshadow(7);
  EXPECT_FALSE(pool.shadowed(7));
  EXPECT_EQ(pool.TakeIdle(), std::optional<Chunk>(C(7)));
  pool.Unshadow(7);  // not shadowed: nothing to undo
  EXPECT_FALSE(pool.shadowed(7));
}

// What a need cannot use goes to release: chunks larger than it, and
// chunks left over; never one it would take, nor a shadowed one.
TEST(PhysicalPoolTest, TakeUnfitLeavesWhatTheNeedTakes) {
  PhysicalPool pool;
  for (Chunk c : {C(1, 4), C(2), C(3, 8), C(4, 2)}) pool.Put(c);
  pool.Shadow(3);
  // 3 granules take 2 and 1: the 4-granule chunk is unfit, the shadowed
  // 8-granule one is not released.
  EXPECT_EQ(pool.TakeUnfit(3 * kGranule), std::optional<Chunk>(C(1, 4)));
  EXPECT_EQ(pool.TakeUnfit(3 * kGranule), std::nullopt);
  EXPECT_EQ(pool.bytes(), 11 * kGranule);
  // 2 granules take the exact one: the single granule is left over.
  EXPECT_EQ(pool.TakeUnfit(2 * kGranule), std::optional<Chunk>(C(2)));
}

// A buffer takes its own chunks back only when none was handed on.
TEST(PhysicalPoolTest, TakeBackNeedsEveryChunk) {
  PhysicalPool pool;
  for (Chunk c : {C(1), C(2, 2), C(3), C(4)}) pool.Put(c);
  EXPECT_FALSE(pool.TakeBack(Chunks{C(2, 2), C(9)}));
  EXPECT_EQ(pool.chunks(), 4u);  // unchanged
  EXPECT_TRUE(pool.TakeBack(Chunks{C(4), C(2, 2)}));
  Chunks out;
  EXPECT_EQ(pool.Take(4 * kGranule, &out), 2 * kGranule);
  EXPECT_EQ(HandlesOf(out), (Handles{3, 1}));
}

}  // namespace
}  // namespace stensor
