#include "core/swap/stream_ordered.h"

#include <cuda.h>

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/memory_manager_testing.h"

namespace stensor {
namespace {

using testing_support::kGranule;

class StreamOrderedTest : public testing_support::FakeDeviceTest {
 protected:
  void SetUp() override {
    FakeDeviceTest::SetUp();
    mm_ = MakeManager({{"STENSOR_MEMORY_LIMIT", "8MiB"}});
    ASSERT_NE(mm_, nullptr);
  }
  void TearDown() override {
    mm_.reset();
    FakeDeviceTest::TearDown();
  }
  // ServeStreamOrdered as the tracker calls it; the buffer gets id `id`.
  bool Serve(uint64_t bytes, CUstream stream, CUdeviceptr* p, CUresult* r, uint64_t id = 1) {
    return ServeStreamOrdered(
        driver_, *mm_, p, bytes, stream, [id](CUdeviceptr) { return id; }, r);
  }
  CUcontext Current() {
    CUcontext c = nullptr;
    EXPECT_CU(cuCtxGetCurrent(&c));
    return c;
  }

  std::unique_ptr<MemoryManager> mm_;
};

TEST_F(StreamOrderedTest, ServesFromHalfAGranuleAndLeavesSmallerOnesToTheDriver) {
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr p = 0;
  CUresult r = CUDA_ERROR_UNKNOWN;
  ASSERT_TRUE(Serve(kGranule / 2, s, &p, &r));
  ASSERT_CU(r);
  EXPECT_TRUE(mm_->Owns(p));
  ASSERT_TRUE(mm_->Find(p).has_value());
  EXPECT_EQ(mm_->Find(p)->size, kGranule / 2);
  EXPECT_EQ(mm_->Find(p)->device, 0);
  // Below half a granule, a null result pointer, 0 bytes, more than the cap:
  // the driver's (charged, or its error).
  CUdeviceptr q = 0;
  EXPECT_FALSE(Serve(kGranule / 2 - 1, s, &q, &r));
  EXPECT_FALSE(Serve(kGranule, s, nullptr, &r));
  EXPECT_FALSE(Serve(0, s, &q, &r));
  EXPECT_FALSE(Serve(uint64_t{9} << 20, s, &q, &r));
  EXPECT_EQ(q, 0u);
  // The legacy and per-thread streams: the current context's.
  CUdeviceptr l = 0, t = 0;
  ASSERT_TRUE(Serve(kGranule, CU_STREAM_LEGACY, &l, &r, 2));
  ASSERT_CU(r);
  ASSERT_TRUE(Serve(kGranule, CU_STREAM_PER_THREAD, &t, &r, 3));
  ASSERT_CU(r);
  EXPECT_CU(mm_->FreeAsync(p, s));
  EXPECT_CU(mm_->FreeAsync(l, CU_STREAM_LEGACY));
  EXPECT_CU(mm_->FreeAsync(t, CU_STREAM_PER_THREAD));
  EXPECT_EQ(mm_->FreeAsync(t, CU_STREAM_PER_THREAD), CUDA_ERROR_INVALID_VALUE);  // twice
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_CU(cuStreamDestroy_v2(s));
}

// A small one whose driver allocation found no room (the cap full of what
// stensor cannot swap) is stensor's then: with host-located VMM a buffer
// born in host memory, every byte readable and writable at its address,
// the device untouched; without, left to the driver's refusal.
TEST_F(StreamOrderedTest, ASmallOneFindingNoRoomIsServedFromHostMemory) {
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  constexpr uint64_t kSmall = 64 * 1024;
  ASSERT_CU(mm_->ReserveExternal(8 << 20));  // the whole cap, unswappable
  const size_t used = fakecuda_used_bytes(0);
  CUdeviceptr p = 0;
  CUresult r = CUDA_ERROR_UNKNOWN;
  EXPECT_FALSE(Serve(kSmall, s, &p, &r));  // room not yet asked for: the driver's
  const bool served = ServeStreamOrdered(
      driver_, *mm_, &p, kSmall, s, [](CUdeviceptr) { return uint64_t{5}; }, &r,
      /*no_room=*/true);
  int host_vmm = 0;
  ASSERT_CU(cuDeviceGetAttribute(&host_vmm,
                                 CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  if (!host_vmm) {
    EXPECT_FALSE(served);
  } else {
    ASSERT_TRUE(served);
    ASSERT_CU(r);
    EXPECT_TRUE(mm_->Owns(p));
    std::vector<uint8_t> in(kSmall), out(kSmall, 0);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + 1);
    ASSERT_CU(cuMemcpyHtoD_v2(p, in.data(), in.size()));
    ASSERT_CU(cuMemcpyDtoH_v2(out.data(), p, out.size()));
    EXPECT_EQ(out, in);
    EXPECT_EQ(fakecuda_used_bytes(0), used);  // no device memory taken
    EXPECT_CU(mm_->FreeAsync(p, s));
  }
  mm_->UnreserveExternal(8 << 20);
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_CU(cuStreamDestroy_v2(s));
}

TEST_F(StreamOrderedTest, NoCurrentContextAndALegacyStreamIsTheDriversError) {
  ASSERT_CU(cuCtxSetCurrent(nullptr));
  CUdeviceptr p = 0;
  CUresult r = CUDA_SUCCESS;
  EXPECT_FALSE(Serve(kGranule, nullptr, &p, &r));
  ASSERT_CU(cuCtxSetCurrent(ctx_));
}

TEST_F(StreamOrderedTest, AStreamOfAnotherDeviceIsServedInItsContext) {
  CUcontext other = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&other, 1));
  ASSERT_CU(cuCtxPushCurrent_v2(other));
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUcontext popped = nullptr;
  ASSERT_CU(cuCtxPopCurrent_v2(&popped));
  ASSERT_EQ(Current(), ctx_);
  CUdeviceptr p = 0;
  CUresult r = CUDA_ERROR_UNKNOWN;
  ASSERT_TRUE(Serve(kGranule, s, &p, &r));
  ASSERT_CU(r);
  EXPECT_EQ(Current(), ctx_) << "the program's context not restored";
  ASSERT_TRUE(mm_->Find(p).has_value());
  EXPECT_EQ(mm_->Find(p)->device, 1);
  EXPECT_EQ(mm_->Find(p)->context, other);
  EXPECT_CU(mm_->FreeAsync(p, s));
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_CU(cuStreamDestroy_v2(s));
  mm_.reset();
  ASSERT_CU(cuDevicePrimaryCtxRelease_v2(1));
}

TEST_F(StreamOrderedTest, ContextForDeviceKeepsTheCurrentOneOnThatDevice) {
  CUcontext c = nullptr;
  ASSERT_CU(ContextForDevice(driver_, 0, &c));
  EXPECT_EQ(c, ctx_);
  // Another device: its primary context, with the current one left alone.
  ASSERT_CU(ContextForDevice(driver_, 1, &c));
  CUcontext primary = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&primary, 1));
  EXPECT_EQ(c, primary);
  EXPECT_EQ(Current(), ctx_);
  ASSERT_CU(cuDevicePrimaryCtxRelease_v2(1));
  // No context current: the device's primary one.
  ASSERT_CU(cuCtxSetCurrent(nullptr));
  ASSERT_CU(ContextForDevice(driver_, 0, &c));
  EXPECT_EQ(c, ctx_);
  EXPECT_EQ(Current(), nullptr);
  ASSERT_CU(cuCtxSetCurrent(ctx_));
  EXPECT_EQ(ContextForDevice(driver_, 7, &c), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(ContextForDevice(driver_, -1, &c), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(StreamOrderedTest, ContextScopePushesOnlyWhatIsNotCurrentAndRestores) {
  CUcontext other = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&other, 1));
  {
    ContextScope same(driver_, ctx_);
    EXPECT_CU(same.result());
    EXPECT_EQ(Current(), ctx_);
  }
  {
    ContextScope scope(driver_, other);
    EXPECT_CU(scope.result());
    EXPECT_EQ(Current(), other);
  }
  EXPECT_EQ(Current(), ctx_);
  // A failed push leaves the program's context, and nothing to pop.
  fakecuda_fail_call("cuCtxPushCurrent_v2", 1, CUDA_ERROR_INVALID_CONTEXT);
  {
    ContextScope scope(driver_, other);
    EXPECT_EQ(scope.result(), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT_EQ(Current(), ctx_);
  }
  EXPECT_EQ(Current(), ctx_);
  fakecuda_clear_failures();
  ASSERT_CU(cuDevicePrimaryCtxRelease_v2(1));
}

// Pool queries the fake does not have, answered by the test.
CUmemoryPool g_current_pool = nullptr;
CUresult g_pool_result = CUDA_SUCCESS;
CUmemoryPool const kDefaultPool = reinterpret_cast<CUmemoryPool>(0x1000);
CUresult CurrentPool(CUmemoryPool* pool, CUdevice) {
  *pool = g_current_pool;
  return g_pool_result;
}
CUresult DefaultPool(CUmemoryPool* pool, CUdevice) {
  *pool = kDefaultPool;
  return CUDA_SUCCESS;
}

TEST_F(StreamOrderedTest, OnlyTheDefaultPoolIsServed) {
  Driver driver = driver_;
  driver.cuDeviceGetMemPool = &CurrentPool;
  driver.cuDeviceGetDefaultMemPool = &DefaultPool;
  g_current_pool = kDefaultPool;
  g_pool_result = CUDA_SUCCESS;
  EXPECT_TRUE(FromDefaultPool(driver));
  CUdeviceptr p = 0;
  CUresult r = CUDA_ERROR_UNKNOWN;
  ASSERT_TRUE(ServeStreamOrdered(
      driver, *mm_, &p, kGranule, nullptr, [](CUdeviceptr) { return uint64_t{1}; }, &r));
  ASSERT_CU(r);
  // Another pool made current (cuDeviceSetMemPool): the driver's.
  g_current_pool = reinterpret_cast<CUmemoryPool>(0x2000);
  EXPECT_FALSE(FromDefaultPool(driver));
  CUdeviceptr q = 0;
  EXPECT_FALSE(ServeStreamOrdered(
      driver, *mm_, &q, kGranule, nullptr, [](CUdeviceptr) { return uint64_t{2}; }, &r));
  // A query the driver refuses: the driver's too.
  g_current_pool = kDefaultPool;
  g_pool_result = CUDA_ERROR_NOT_SUPPORTED;
  EXPECT_FALSE(FromDefaultPool(driver));
  // No pool queries at all (the fake): served.
  driver.cuDeviceGetMemPool = nullptr;
  EXPECT_TRUE(FromDefaultPool(driver));
  EXPECT_CU(mm_->FreeAsync(p, nullptr));
}

TEST_F(StreamOrderedTest, TheFakesPoolMadeCurrentIsLeftToTheDriver) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemoryPool pool = nullptr, default_pool = nullptr;
  ASSERT_CU(cuMemPoolCreate(&pool, &props));
  ASSERT_CU(cuDeviceGetDefaultMemPool(&default_pool, 0));
  EXPECT_TRUE(FromDefaultPool(driver_));
  EXPECT_EQ(DefaultPoolDevice(driver_, default_pool), 0);
  EXPECT_EQ(DefaultPoolDevice(driver_, pool), -1);
  EXPECT_EQ(DefaultPoolDevice(driver_, nullptr), -1);
  ASSERT_CU(cuDeviceSetMemPool(0, pool));
  EXPECT_FALSE(FromDefaultPool(driver_));
  CUdeviceptr q = 0;
  CUresult r = CUDA_ERROR_UNKNOWN;
  EXPECT_FALSE(Serve(kGranule, nullptr, &q, &r));
  ASSERT_CU(cuMemPoolDestroy(pool));  // the default one is current again
  EXPECT_TRUE(FromDefaultPool(driver_));
}

TEST_F(StreamOrderedTest, TheDefaultPoolAnswersIncludeStensorsShare) {
  CUmemoryPool pool = nullptr;
  ASSERT_CU(cuDeviceGetDefaultMemPool(&pool, 0));
  auto attr = [&](CUmemPool_attribute a) {
    cuuint64_t v = 0;
    EXPECT_CU(cuMemPoolGetAttribute(pool, a, &v));  // the fake's own answer
    AddStreamOrderedShare(*mm_, driver_, pool, a, &v);
    return v;
  };
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a = 0, b = 0, small = 0;
  CUresult r = CUDA_ERROR_UNKNOWN;
  ASSERT_TRUE(Serve(kGranule / 2, s, &a, &r, 1));
  ASSERT_CU(r);
  ASSERT_TRUE(Serve(kGranule + 1, s, &b, &r, 2));
  ASSERT_CU(r);
  ASSERT_CU(cuMemAllocAsync(&small, 4096, s));  // the driver's own, one page
  EXPECT_EQ(attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), kGranule / 2 + kGranule + 1 + 4096);
  EXPECT_EQ(attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 3 * kGranule + 4096);
  // Other attributes and other pools are the driver's alone.
  EXPECT_EQ(attr(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0u);
  EXPECT_CU(mm_->FreeAsync(b, s));
  ASSERT_CU(cuMemFreeAsync(small, s));
  ASSERT_CU(cuStreamSynchronize(s));
  EXPECT_EQ(attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), kGranule / 2);
  EXPECT_EQ(attr(CU_MEMPOOL_ATTR_USED_MEM_HIGH), kGranule / 2 + kGranule + 1 + 4096);
  // b's memory is released (to stensor's chunk pool) once its free ran.
  EXPECT_EQ(mm_->ReleaseIdlePooled(0, UINT64_MAX), 0u);
  EXPECT_EQ(attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), kGranule);
  EXPECT_EQ(attr(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 3 * kGranule + 4096);
  // A reset restarts both marks from the current values.
  cuuint64_t zero = 0;
  ASSERT_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
  ResetStreamOrderedHigh(*mm_, driver_, pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH);
  EXPECT_EQ(attr(CU_MEMPOOL_ATTR_USED_MEM_HIGH), kGranule / 2);
  EXPECT_EQ(attr(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 3 * kGranule + 4096);
  ASSERT_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero));
  ResetStreamOrderedHigh(*mm_, driver_, pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
  EXPECT_EQ(attr(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), kGranule);
  // Trim: b's memory idle in stensor's pool, one chunk of two granules.
  // Keeping what is reserved plus one granule releases nothing (a chunk
  // goes whole, and the pool keeps at least what was asked); keeping
  // nothing releases it.
  ASSERT_CU(cuMemPoolTrimTo(pool, kGranule + kGranule));
  EXPECT_EQ(TrimStreamOrdered(*mm_, driver_, pool, kGranule + kGranule), 0u);
  EXPECT_EQ(mm_->stats().pooled_bytes, 2 * kGranule);
  ASSERT_CU(cuMemPoolTrimTo(pool, 0));
  EXPECT_EQ(TrimStreamOrdered(*mm_, driver_, pool, 0), 2 * kGranule);
  EXPECT_EQ(mm_->stats().pooled_bytes, 0u);
  // An explicit pool: nothing of stensor's.
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemoryPool other = nullptr;
  ASSERT_CU(cuMemPoolCreate(&other, &props));
  cuuint64_t v = 0;
  AddStreamOrderedShare(*mm_, driver_, other, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v);
  EXPECT_EQ(v, 0u);
  EXPECT_EQ(TrimStreamOrdered(*mm_, driver_, other, 0), 0u);
  ASSERT_CU(cuMemPoolDestroy(other));
  EXPECT_CU(mm_->FreeAsync(a, s));
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_CU(cuStreamDestroy_v2(s));
}

TEST_F(StreamOrderedTest, TheDriversKeptPoolMemoryIsTrimmedBeforeStensorTakesMemory) {
  CUmemoryPool pool = nullptr;
  ASSERT_CU(cuDeviceGetDefaultMemPool(&pool, 0));
  cuuint64_t keep_all = ~cuuint64_t{0}, reserved = 0;
  ASSERT_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr small = 0, p = 0;
  ASSERT_CU(cuMemAllocAsync(&small, 3 * 4096, s));
  ASSERT_CU(cuMemFreeAsync(small, s));
  ASSERT_CU(cuStreamSynchronize(s));
  // Kept by the pool (threshold), no longer in use: slack the cap cannot see.
  ASSERT_CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
  EXPECT_EQ(reserved, 3 * 4096u);
  CUresult r = CUDA_ERROR_UNKNOWN;
  ASSERT_TRUE(Serve(kGranule, s, &p, &r));  // a chunk created
  ASSERT_CU(r);
  ASSERT_CU(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved));
  EXPECT_EQ(reserved, 0u);
  cuuint64_t zero = 0;
  ASSERT_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero));
  EXPECT_CU(mm_->FreeAsync(p, s));
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_CU(cuStreamDestroy_v2(s));
}

}  // namespace
}  // namespace stensor

namespace stensor {
namespace {

// A stream-ordered buffer freed, its free run, is kept mapped: the next
// allocation of its size takes its address and device memory whole (no
// cuMemMap, no cuMemSetAccess: on a GPU they cost by granule), zeroed as
// fresh memory is. When room is needed, kept memory goes before any live
// buffer is evicted; a trim of the default pool releases it.
TEST_F(StreamOrderedTest, AFreedBufferIsKeptMappedForTheNextOfItsSize) {
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr a = 0, b = 0;
  CUresult r = CUDA_ERROR_UNKNOWN;
  ASSERT_TRUE(Serve(2 * kGranule, s, &a, &r, 1));
  ASSERT_CU(r);
  ASSERT_CU(cuMemsetD8Async(a, 0xab, 2 * kGranule, s));
  EXPECT_CU(mm_->FreeAsync(a, s));
  ASSERT_CU(cuStreamSynchronize(s));
  // A query collects what completed: the free is kept, counted free.
  size_t free_bytes = 0, total = 0;
  mm_->MemInfo(0, &free_bytes, &total);
  EXPECT_EQ(free_bytes, total);
  const unsigned long long maps = fakecuda_call_count("cuMemMap");
  const unsigned long long access = fakecuda_call_count("cuMemSetAccess");
  ASSERT_TRUE(Serve(2 * kGranule, s, &b, &r, 2));
  ASSERT_CU(r);
  EXPECT_EQ(b, a);
  EXPECT_EQ(fakecuda_call_count("cuMemMap"), maps);
  EXPECT_EQ(fakecuda_call_count("cuMemSetAccess"), access);
  EXPECT_EQ(mm_->stats().kept_reused, 1u);
  ASSERT_CU(cuCtxSynchronize());
  std::vector<unsigned char> bytes(2 * kGranule, 1);
  ASSERT_CU(cuMemcpyDtoH_v2(bytes.data(), b, bytes.size()));
  EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0), static_cast<long>(bytes.size()));

  // The zeroing of a kept buffer failing: that try takes nothing (the kept
  // buffer stays as it was), the allocation still succeeds and holds zeros.
  EXPECT_CU(mm_->FreeAsync(b, s));
  ASSERT_CU(cuStreamSynchronize(s));
  mm_->MemInfo(0, &free_bytes, &total);
  fakecuda_fail_call("cuMemsetD8Async", 1, CUDA_ERROR_UNKNOWN);
  CUdeviceptr c = 0;
  ASSERT_TRUE(Serve(2 * kGranule, s, &c, &r, 9));  // ids are never reused
  fakecuda_clear_failures();
  ASSERT_CU(r);
  ASSERT_CU(cuCtxSynchronize());
  std::fill(bytes.begin(), bytes.end(), 1);
  ASSERT_CU(cuMemcpyDtoH_v2(bytes.data(), c, bytes.size()));
  EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0), static_cast<long>(bytes.size()));
  EXPECT_CU(mm_->FreeAsync(c, s));
  ASSERT_CU(cuStreamSynchronize(s));
  b = c;

  // Kept again once freed; four live one-granule buffers fill the 8 MiB cap
  // beside it: the kept ones are released for them, nothing is evicted.
  CUdeviceptr live[4] = {};
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(Serve(kGranule, s, &live[i], &r, 3 + i));
    ASSERT_CU(r);
    ASSERT_CU(cuMemsetD8Async(live[i], 1, kGranule, s));
  }
  EXPECT_EQ(mm_->stats().swap_outs_copied, 0u);
  EXPECT_EQ(mm_->stats().clean_drops + mm_->stats().never_written_drops, 0u);
  for (CUdeviceptr p : live) EXPECT_CU(mm_->FreeAsync(p, s));
  ASSERT_CU(cuStreamSynchronize(s));
  ASSERT_CU(cuStreamDestroy_v2(s));
}

}  // namespace
}  // namespace stensor
