// HostStore on the fake driver: copies counted per device, whole copies
// kept for the next one of their size and device (VMM ones up to the given
// bound), kept ones freed when a limit needs the room, failed frees kept
// counted for a retry.
#include "core/swap/host_store.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "tests/fakecuda/fakecuda.h"
#include "tests/support/memory_manager_testing.h"

namespace stensor {
namespace {

// The fake device set up as for the manager's tests (its driver table in
// driver_).
using HostStoreTest = testing_support::FakeDeviceTest;
using testing_support::kGranule;

TEST_F(HostStoreTest, ReleasedVmmCopiesAreKeptUpToTheBoundAndTakenByTheirSize) {
  HostStore store(&driver_);
  std::vector<HostCopy> copies(3);
  for (HostCopy& c : copies) {
    ASSERT_CU(store.Create(&c, 0, /*host_vmm=*/true, kGranule, kGranule - 100));
    ASSERT_TRUE(c.vmm());
  }
  EXPECT_EQ(store.bytes(0), 3 * kGranule);
  EXPECT_EQ(store.bytes(1), 0u);
  const CUdeviceptr first = copies[0].va();
  for (HostCopy& c : copies) ASSERT_TRUE(store.Release(&c, 0, kGranule, 2 * kGranule));
  for (const HostCopy& c : copies) EXPECT_FALSE(c.exists());
  EXPECT_EQ(store.bytes(0), 2 * kGranule);  // two kept (counted), the third released

  EXPECT_EQ(store.TakeSpare(0, 2 * kGranule, true, false), std::nullopt);  // no such size
  EXPECT_EQ(store.TakeSpare(1, kGranule, true, false), std::nullopt);      // nor device
  EXPECT_EQ(store.TakeSpare(0, kGranule, false, false), std::nullopt);     // not pinned memory
  std::optional<HostCopy> spare = store.TakeSpare(0, kGranule, true, /*vmm_only=*/true);
  ASSERT_TRUE(spare.has_value());
  EXPECT_EQ(spare->va(), first);
  store.PutBack(0, kGranule, *spare);  // where it was: taken first again
  spare = store.TakeSpare(0, kGranule, true, true);
  ASSERT_TRUE(spare.has_value());
  EXPECT_EQ(spare->va(), first);
  // A taken copy no longer counts among the kept ones' bound.
  HostCopy c = *spare;
  ASSERT_TRUE(store.Release(&c, 0, kGranule, 2 * kGranule));
  EXPECT_TRUE(store.FreeSpares());
  EXPECT_EQ(store.bytes(0), 0u);
  EXPECT_FALSE(store.FreeSpares());  // nothing left
  EXPECT_EQ(store.driver_errors(), 0u);
}

TEST_F(HostStoreTest, PinnedCopiesAreAlwaysKeptAndNeverTakenForZeroing) {
  HostStore store(&driver_);
  HostCopy c;
  ASSERT_CU(store.Create(&c, 0, /*host_vmm=*/false, kGranule, kGranule));
  ASSERT_NE(c.ptr(), nullptr);
  ASSERT_TRUE(store.Release(&c, 0, kGranule, /*keep_up_to=*/0));
  EXPECT_EQ(store.bytes(0), kGranule);
  // Unmapped memory cannot be zeroed on the device (vmm_only).
  EXPECT_EQ(store.TakeSpare(0, kGranule, false, /*vmm_only=*/true), std::nullopt);
  std::optional<HostCopy> spare = store.TakeSpare(0, kGranule, false, false);
  ASSERT_TRUE(spare.has_value());
  HostCopy again = *spare;
  ASSERT_TRUE(store.Release(&again, 0, kGranule, 0));
  EXPECT_TRUE(store.FreeSpares());
  EXPECT_EQ(store.bytes(0), 0u);
}

// A limit frees the kept copies of every device before it refuses, and
// counts what is left, never what was kept.
TEST_F(HostStoreTest, ALimitFreesKeptCopiesBeforeItRefuses) {
  HostStore store(&driver_);
  HostCopy live, kept;
  ASSERT_CU(store.Create(&live, 0, true, kGranule, kGranule));
  ASSERT_CU(store.Create(&kept, 0, true, kGranule, kGranule));
  ASSERT_TRUE(store.Release(&kept, 0, kGranule, kGranule));
  EXPECT_EQ(store.bytes(0), 2 * kGranule);
  EXPECT_TRUE(store.Fits(0, kGranule, 3 * kGranule));  // room without freeing
  EXPECT_EQ(store.bytes(0), 2 * kGranule);
  EXPECT_TRUE(store.Fits(0, kGranule, 2 * kGranule));  // the kept one goes
  EXPECT_EQ(store.bytes(0), kGranule);
  EXPECT_FALSE(store.Fits(0, 2 * kGranule, 2 * kGranule));
  EXPECT_FALSE(store.Fits(0, ~uint64_t{0}, 2 * kGranule));  // no wrap
  ASSERT_TRUE(store.Release(&live, 0, kGranule, 0));        // over the bound: released
  EXPECT_EQ(store.bytes(0), 0u);
}

// A kept copy the driver will not free stays kept and counted, the failure
// counted; the next attempt frees it.
TEST_F(HostStoreTest, AFailedFreeKeepsTheCopyForARetry) {
  HostStore store(&driver_);
  HostCopy c;
  ASSERT_CU(store.Create(&c, 0, true, kGranule, kGranule));
  ASSERT_TRUE(store.Release(&c, 0, kGranule, kGranule));
  fakecuda_fail_call("cuMemRelease", 1, CUDA_ERROR_UNKNOWN);
  EXPECT_FALSE(store.FreeSpares());
  EXPECT_EQ(store.bytes(0), kGranule);
  EXPECT_EQ(store.driver_errors(), 1u);
  fakecuda_clear_failures();
  EXPECT_TRUE(store.FreeSpares());
  EXPECT_EQ(store.bytes(0), 0u);
}

}  // namespace
}  // namespace stensor
