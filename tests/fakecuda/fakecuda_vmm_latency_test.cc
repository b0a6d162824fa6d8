// FAKECUDA_VMM_LATENCY_US=h200 (set by the BUILD target): the medians
// measured on an H200 with driver 580, by call and by where the memory is.
// Lower bounds only: a loaded machine makes any call slower, never faster.
#include <cuda.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

namespace {

#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS) << #expr

using Clock = std::chrono::steady_clock;
constexpr size_t kGranule = 2u << 20;

double UsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

// cuInit and device 0's primary context made current.
CUdevice StartOnDevice0() {
  CUdevice dev = 0;
  CUcontext ctx;
  EXPECT_EQ(cuInit(0), CUDA_SUCCESS);
  EXPECT_EQ(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  return dev;
}

struct Figures {
  double create = 1e9, map = 1e9, set_access = 1e9, unmap = 1e9, release = 1e9;
};

// The fastest of 5 rounds of each call for one granule at `type`.
Figures Time(CUmemLocationType type) {
  Figures f;
  CUdeviceptr va = 0;
  EXPECT_EQ(cuMemAddressReserve(&va, kGranule, 0, 0, 0), CUDA_SUCCESS);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = type;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (int i = 0; i < 5; ++i) {
    CUmemGenericAllocationHandle h;
    Clock::time_point t = Clock::now();
    EXPECT_EQ(cuMemCreate(&h, kGranule, &prop, 0), CUDA_SUCCESS);
    f.create = std::min(f.create, UsSince(t));
    t = Clock::now();
    EXPECT_EQ(cuMemMap(va, kGranule, 0, h, 0), CUDA_SUCCESS);
    f.map = std::min(f.map, UsSince(t));
    t = Clock::now();
    EXPECT_EQ(cuMemSetAccess(va, kGranule, &access, 1), CUDA_SUCCESS);
    f.set_access = std::min(f.set_access, UsSince(t));
    t = Clock::now();
    EXPECT_EQ(cuMemUnmap(va, kGranule), CUDA_SUCCESS);
    f.unmap = std::min(f.unmap, UsSince(t));
    t = Clock::now();
    EXPECT_EQ(cuMemRelease(h), CUDA_SUCCESS);
    f.release = std::min(f.release, UsSince(t));
  }
  EXPECT_EQ(cuMemAddressFree(va, kGranule), CUDA_SUCCESS);
  return f;
}

TEST(FakeCudaVmmLatencyTest, H200FiguresByCallAndLocation) {
  const CUdevice dev = StartOnDevice0();
  const Figures d = Time(CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_GE(d.create, 12);
  EXPECT_GE(d.map, 1);
  EXPECT_GE(d.set_access, 20);
  EXPECT_GE(d.unmap, 13);
  EXPECT_GE(d.release, 14);
  const Figures h = Time(CU_MEM_LOCATION_TYPE_HOST);
  EXPECT_GE(h.create, 306);
  EXPECT_GE(h.map, 4);
  EXPECT_GE(h.set_access, 83);
  EXPECT_GE(h.unmap, 46);
  EXPECT_GE(h.release, 55);
  ASSERT_CU(cuDevicePrimaryCtxRelease(dev));
}

// Access set, and unmapped, over 8 granule mappings side by side: 8 times
// the cost of one, as on the GPU.
TEST(FakeCudaVmmLatencyTest, RangeCallsCostByMapping) {
  const CUdevice dev = StartOnDevice0();
  constexpr int kN = 8;
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, kN * kGranule, 0, 0, 0));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle h[kN];
  for (int i = 0; i < kN; ++i) {
    ASSERT_CU(cuMemCreate(&h[i], kGranule, &prop, 0));
    ASSERT_CU(cuMemMap(va + i * kGranule, kGranule, 0, h[i], 0));
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  Clock::time_point t = Clock::now();
  ASSERT_CU(cuMemSetAccess(va, kN * kGranule, &access, 1));
  EXPECT_GE(UsSince(t), kN * 20);
  t = Clock::now();
  ASSERT_CU(cuMemUnmap(va, kN * kGranule));
  EXPECT_GE(UsSince(t), kN * 13);
  for (int i = 0; i < kN; ++i) ASSERT_CU(cuMemRelease(h[i]));
  ASSERT_CU(cuMemAddressFree(va, kN * kGranule));
  ASSERT_CU(cuDevicePrimaryCtxRelease(dev));
}

}  // namespace
