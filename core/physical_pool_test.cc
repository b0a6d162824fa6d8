#include "core/physical_pool.h"

#include <vector>

#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"

namespace stensor {
namespace {

using Handle = PhysicalPool::Handle;
using Handles = std::vector<Handle>;

constexpr uint64_t kChunk = 2u << 20;

TEST(PhysicalPoolTest, CountsChunksAndBytes) {
  PhysicalPool pool(kChunk);
  EXPECT_EQ(pool.bytes(), 0u);
  pool.Put(1);
  Handles more = {2, 3};
  pool.PutAll(&more);
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(pool.chunks(), 3u);
  EXPECT_EQ(pool.bytes(), 3 * kChunk);
}

// Any size is served from chunks of any earlier buffers; what is asked
// beyond the pool is left to the caller.
TEST(PhysicalPoolTest, TakesUpToWhatIsAskedMostRecentFirst) {
  PhysicalPool pool(kChunk);
  for (Handle h : {1, 2, 3}) pool.Put(h);
  Handles out;
  EXPECT_EQ(pool.Take(2, &out), 2u);
  EXPECT_EQ(out, (Handles{3, 2}));
  EXPECT_EQ(pool.Take(5, &out), 1u);
  EXPECT_EQ(out, (Handles{3, 2, 1}));
  EXPECT_EQ(pool.Take(1, &out), 0u);
  EXPECT_EQ(pool.bytes(), 0u);
}

// Chunks still mapped at an old address go last, the longest pooled first,
// and are reported; idle ones go first.
TEST(PhysicalPoolTest, ShadowedChunksGoLastLongestPooledFirst) {
  PhysicalPool pool(kChunk);
  for (Handle h : {1, 2, 3, 4}) pool.Put(h);
  pool.Shadow(1);
  pool.Shadow(2);
  pool.Shadow(4);
  Handles out, shadowed;
  EXPECT_EQ(pool.Take(3, &out, &shadowed), 3u);
  EXPECT_EQ(out, (Handles{3, 1, 2}));
  EXPECT_EQ(shadowed, (Handles{1, 2}));
  EXPECT_TRUE(pool.shadowed(4));
}

// Among shadowed chunks, those whose owner never takes them back (a freed
// buffer's) go first.
TEST(PhysicalPoolTest, ShadowedChunksOfFreedBuffersGoFirst) {
  PhysicalPool pool(kChunk);
  for (Handle h : {1, 2, 3}) {
    pool.Put(h);
    pool.Shadow(h);
  }
  absl::flat_hash_set<Handle> freed = {3};
  Handles out, shadowed;
  EXPECT_EQ(pool.Take(2, &out, &shadowed, [&](Handle h) { return freed.contains(h); }), 2u);
  EXPECT_EQ(out, (Handles{3, 1}));
  EXPECT_EQ(shadowed, (Handles{3, 1}));
}

// Release takes only chunks no old address maps; a chunk mapped at two old
// addresses stays shadowed until both are gone.
TEST(PhysicalPoolTest, TakeIdleSkipsShadowedChunks) {
  PhysicalPool pool(kChunk);
  pool.Put(7);
  pool.Put(8);
  pool.Shadow(7);
  pool.Shadow(7);
  EXPECT_EQ(pool.TakeIdle(), std::optional<Handle>(8));
  EXPECT_EQ(pool.TakeIdle(), std::nullopt);
  pool.Unshadow(7);
  EXPECT_EQ(pool.TakeIdle(), std::nullopt);
  pool.Unshadow(7);
  EXPECT_FALSE(pool.shadowed(7));
  EXPECT_EQ(pool.TakeIdle(), std::optional<Handle>(7));
  pool.Unshadow(7);  // not shadowed: nothing to undo
  EXPECT_FALSE(pool.shadowed(7));
}

// A buffer takes its own chunks back only when none was handed on.
TEST(PhysicalPoolTest, TakeBackNeedsEveryChunk) {
  PhysicalPool pool(kChunk);
  for (Handle h : {1, 2, 3, 4}) pool.Put(h);
  EXPECT_FALSE(pool.TakeBack(Handles{2, 9}));
  EXPECT_EQ(pool.chunks(), 4u);  // unchanged
  EXPECT_TRUE(pool.TakeBack(Handles{4, 2}));
  Handles out;
  EXPECT_EQ(pool.Take(4, &out), 2u);
  EXPECT_EQ(out, (Handles{3, 1}));
}

}  // namespace
}  // namespace stensor
