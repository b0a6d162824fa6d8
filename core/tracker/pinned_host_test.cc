#include "core/tracker/pinned_host.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace stensor {
namespace {

// Bytes holding `words` as 8-byte words, from `skip` bytes in.
std::vector<unsigned char> Bytes(std::vector<uint64_t> words, size_t skip = 0) {
  std::vector<unsigned char> bytes(skip + words.size() * 8, 0xee);
  std::memcpy(bytes.data() + skip, words.data(), words.size() * 8);
  return bytes;
}

TEST(PinnedHostTest, AllocationsAndRegistrationsAreKnownUntilTheyEnd) {
  PinnedHost pinned;
  EXPECT_FALSE(pinned.Any());
  pinned.Allocated(0x10000, 0x1000);
  pinned.Registered(0x40000, 0x2000);
  EXPECT_TRUE(pinned.Any());
  EXPECT_TRUE(pinned.Contains(0x10000));
  EXPECT_TRUE(pinned.Contains(0x10fff));
  EXPECT_FALSE(pinned.Contains(0x11000));  // one past the end
  EXPECT_FALSE(pinned.Contains(0xffff));
  EXPECT_TRUE(pinned.Contains(0x41fff));
  EXPECT_EQ(pinned.allocated_bytes(), 0x1000u);  // registrations are not allocations
  EXPECT_EQ(pinned.AllocationAt(0x10800), (std::make_pair(uint64_t{0x10000}, uint64_t{0x1000})));
  EXPECT_EQ(pinned.AllocationAt(0x40000), std::nullopt);

  EXPECT_EQ(pinned.Freed(0x10800), 0u);  // not a base
  EXPECT_EQ(pinned.Freed(0x10000), 0x1000u);
  EXPECT_EQ(pinned.Freed(0x10000), 0u);
  EXPECT_EQ(pinned.allocated_bytes(), 0u);
  EXPECT_TRUE(pinned.Any());  // still registered
  pinned.Unregistered(0x40000);
  EXPECT_FALSE(pinned.Any());
  EXPECT_FALSE(pinned.Contains(0x40000));
}

TEST(PinnedHostTest, WordsThatPointIntoPinnedMemoryAreFound) {
  PinnedHost pinned;
  EXPECT_FALSE(pinned.AnyWordIn(Bytes({0x10000})));  // nothing pinned yet
  pinned.Allocated(0x10000, 0x1000);
  pinned.Registered(0x80000, 0x1000);
  EXPECT_TRUE(pinned.AnyWordIn(Bytes({1, 2, 0x10010})));
  EXPECT_TRUE(pinned.AnyWordIn(Bytes({0x80fff})));
  EXPECT_FALSE(pinned.AnyWordIn(Bytes({0x11000, 0x7ffff, 0})));
  // Words at 8-byte steps from the start: a pointer straddling two is none.
  EXPECT_FALSE(pinned.AnyWordIn(Bytes({0x10010}, /*skip=*/4)));
}

// An upload's words are read as a kernel reads them: aligned at the
// destination, so the source is scanned from the first byte that lands on
// an 8-byte boundary there.
TEST(PinnedHostTest, AnUploadHoldsAPointerOnlyInWordsAlignedAtItsDestination) {
  PinnedHost pinned;
  const std::vector<unsigned char> aligned = Bytes({7, 0x10020});
  EXPECT_FALSE(pinned.HoldsPointer(0x1000, aligned.data(), aligned.size()));  // nothing pinned
  pinned.Allocated(0x10000, 0x1000);
  EXPECT_TRUE(pinned.HoldsPointer(0x1000, aligned.data(), aligned.size()));
  // The same bytes landing 4 bytes past a boundary hold no aligned pointer.
  EXPECT_FALSE(pinned.HoldsPointer(0x1004, aligned.data(), aligned.size()));
  // Shifted by that much in the source, they do again.
  const std::vector<unsigned char> shifted = Bytes({7, 0x10020}, /*skip=*/4);
  EXPECT_TRUE(pinned.HoldsPointer(0x1004, shifted.data(), shifted.size()));
  // Too short for one aligned word.
  EXPECT_FALSE(pinned.HoldsPointer(0x1004, shifted.data(), 8));
}

TEST(PinnedHostTest, ThreadsPinAndUnpinConcurrently) {
  PinnedHost pinned;
  std::vector<std::thread> threads;
  for (uint64_t t = 1; t <= 4; ++t) {
    threads.emplace_back([&pinned, t] {
      for (uint64_t i = 0; i < 2000; ++i) {
        const uint64_t base = (t << 40) | (i << 16);
        pinned.Allocated(base, 4096);
        EXPECT_TRUE(pinned.Contains(base + 100));
        pinned.Registered(base + 8192, 4096);
        EXPECT_TRUE(pinned.Any());
        pinned.Unregistered(base + 8192);
        EXPECT_EQ(pinned.Freed(base), 4096u);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_FALSE(pinned.Any());
  EXPECT_EQ(pinned.allocated_bytes(), 0u);
}

}  // namespace
}  // namespace stensor
