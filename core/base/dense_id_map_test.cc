#include "core/base/dense_id_map.h"

#include <cstdint>
#include <map>
#include <random>

#include "gtest/gtest.h"

namespace stensor {
namespace {

using Map = DenseIdMap<int>;

TEST(DenseIdMapTest, FindsWhatWasPutAndNothingElse) {
  Map map;
  int a = 1, b = 2;
  EXPECT_EQ(map.Find(0), nullptr);
  EXPECT_EQ(map.Find(12345), nullptr);
  ASSERT_TRUE(map.Put(7, &a));
  ASSERT_TRUE(map.Put(Map::kPage * 3 + 1, &b));
  EXPECT_EQ(map.Find(7), &a);
  EXPECT_EQ(map.Find(Map::kPage * 3 + 1), &b);
  EXPECT_EQ(map.Find(8), nullptr);
  EXPECT_EQ(map.Find(Map::kPage * 2), nullptr);    // a page never made
  EXPECT_EQ(map.Find(Map::kPage * 100), nullptr);  // past the directory
  EXPECT_EQ(map.size(), 2u);
  ASSERT_TRUE(map.Put(7, &b));  // replaced, not counted twice
  EXPECT_EQ(map.Find(7), &b);
  EXPECT_EQ(map.size(), 2u);
}

TEST(DenseIdMapTest, RefusesIdsItCannotHoldAndKeepsNothingForThem) {
  Map map;
  int a = 1;
  EXPECT_FALSE(map.Put(Map::kMaxId, &a));
  EXPECT_FALSE(map.Put(~uint64_t{0}, &a));
  EXPECT_EQ(map.Find(Map::kMaxId), nullptr);
  EXPECT_EQ(map.size(), 0u);
  EXPECT_EQ(map.pages(), 0u);
  EXPECT_TRUE(map.Put(Map::kMaxId - 1, &a));
  EXPECT_EQ(map.Find(Map::kMaxId - 1), &a);
}

TEST(DenseIdMapTest, AnEmptiedPageIsFreed) {
  Map map;
  int a = 1;
  for (uint64_t id = 0; id < 3 * Map::kPage; ++id) ASSERT_TRUE(map.Put(id, &a));
  EXPECT_EQ(map.pages(), 3u);
  for (uint64_t id = Map::kPage; id < 2 * Map::kPage; ++id) map.Erase(id);
  EXPECT_EQ(map.pages(), 2u);
  EXPECT_EQ(map.Find(Map::kPage), nullptr);
  EXPECT_EQ(map.Find(Map::kPage - 1), &a);
  EXPECT_EQ(map.Find(2 * Map::kPage), &a);
  map.Erase(Map::kPage);      // gone already: nothing
  map.Erase(Map::kPage * 9);  // never there: nothing
  EXPECT_EQ(map.size(), 2 * Map::kPage);
}

// Against std::map, ids made counting up and erased in random order, as a
// program's allocations are.
TEST(DenseIdMapTest, AgreesWithAnOrderedMap) {
  std::mt19937_64 rng(7);
  Map map;
  std::map<uint64_t, int*> want;
  int values[4] = {};
  uint64_t next = 1;
  for (int step = 0; step < 200000; ++step) {
    if (want.empty() || rng() % 3 != 0) {
      int* v = &values[rng() % 4];
      ASSERT_TRUE(map.Put(next, v));
      want[next++] = v;
    } else {
      auto it = want.lower_bound(1 + rng() % next);
      if (it == want.end()) it = want.begin();
      map.Erase(it->first);
      want.erase(it);
    }
    const uint64_t probe = rng() % (next + 10);
    auto it = want.find(probe);
    ASSERT_EQ(map.Find(probe), it == want.end() ? nullptr : it->second) << probe;
  }
  EXPECT_EQ(map.size(), want.size());
  // Pages only for the ids alive.
  size_t pages = 0;
  uint64_t last_page = ~uint64_t{0};
  for (const auto& [id, v] : want) {
    if (id >> Map::kPageBits != last_page) ++pages;
    last_page = id >> Map::kPageBits;
  }
  EXPECT_EQ(map.pages(), pages);
}

}  // namespace
}  // namespace stensor
