#include "tools/charge.h"

#include "gtest/gtest.h"

namespace stensor {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// As core/swap/memory_manager.cc serves allocations under a cap.
TEST(ChargeTest, AsTheManagerCharges) {
  struct Case {
    const char* kind;
    const char* api;
    uint64_t bytes;
    uint64_t charge;
    bool swappable;
  };
  for (const Case& c : {
           Case{"device", "cuMemAlloc_v2", 3 * kMiB, 4 * kMiB, true},
           Case{"device", "cuMemAlloc_v2", kMiB, 2 * kMiB, true},   // half a granule
           Case{"device", "cuMemAlloc_v2", kMiB - 1, kMiB, false},  // pages
           Case{"", "cuMemAlloc_v2", kMiB, 2 * kMiB, true},         // kind absent: device
           Case{"device", "cuMemAllocPitch_v2", 3 * kMiB, 3 * kMiB, false},
           Case{"stream_ordered", "cuMemAllocAsync", kMiB, 2 * kMiB, true},
           Case{"stream_ordered", "cuMemAllocAsync_ptsz", 5 * kMiB, 6 * kMiB, true},
           Case{"stream_ordered", "cuMemAllocAsync", 1000, 4096, false},
           Case{"stream_ordered", "cuMemAllocFromPoolAsync", 3 * kMiB, 3 * kMiB, false},
           Case{"app_vmm", "cuMemMap", 2 * kMiB + 1, 2 * kMiB + 1, false},
       }) {
    const AllocationCharge got = ChargeOf(c.kind, c.api, c.bytes);
    EXPECT_EQ(got.bytes, c.charge) << c.kind << " " << c.api << " " << c.bytes;
    EXPECT_EQ(got.swappable, c.swappable) << c.kind << " " << c.api << " " << c.bytes;
  }
}

}  // namespace
}  // namespace stensor
