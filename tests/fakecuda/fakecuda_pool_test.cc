// Stream-ordered memory pools in the fake driver: default and current pools,
// explicit pools, cuMemAllocAsync from the current pool, the attributes
// (release threshold, reserved and used memory, their high-water marks),
// release at synchronisation and cuMemPoolTrimTo, freed memory kept mapped
// and reused while the pool holds it, and the errors the CUDA
// Driver API reference documents for bad arguments (see pool.cc).
#include <cuda.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace {

#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS) << #expr
#define EXPECT_CU(expr) EXPECT_EQ((expr), CUDA_SUCCESS) << #expr

constexpr uint64_t kPage = 4096;

class PoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDeviceGet(&dev_, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, dev_));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    ASSERT_CU(cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(cuDeviceGetDefaultMemPool(&default_, dev_));
  }
  void TearDown() override {
    cuStreamDestroy(s_);
    cuDevicePrimaryCtxRelease(dev_);
  }
  uint64_t Attr(CUmemoryPool pool, CUmemPool_attribute attr) {
    cuuint64_t v = ~cuuint64_t{0};
    EXPECT_CU(cuMemPoolGetAttribute(pool, attr, &v));
    return v;
  }
  uint64_t DeviceUsed() {
    size_t free_bytes = 0, total = 0;
    EXPECT_CU(cuMemGetInfo(&free_bytes, &total));
    return total - free_bytes;
  }
  CUmemoryPool NewPool() {
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CUmemoryPool pool = nullptr;
    EXPECT_CU(cuMemPoolCreate(&pool, &props));
    return pool;
  }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUstream s_ = nullptr;
  CUmemoryPool default_ = nullptr;
};

TEST_F(PoolTest, DefaultPoolIsCurrentAndCountsAllocAsync) {
  CUmemoryPool current = nullptr;
  ASSERT_CU(cuDeviceGetMemPool(&current, dev_));
  EXPECT_EQ(current, default_);
  uint64_t device_before = DeviceUsed();
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocAsync(&p, 5000, s_));  // two pages
  EXPECT_EQ(Attr(default_, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 2 * kPage);
  EXPECT_EQ(Attr(default_, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 2 * kPage);
  EXPECT_EQ(DeviceUsed() - device_before, 2 * kPage);
  ASSERT_CU(cuMemsetD8Async(p, 7, 5000, s_));
  ASSERT_CU(cuMemFreeAsync(p, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  // Released at the synchronisation: the default threshold is 0.
  EXPECT_EQ(Attr(default_, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0u);
  EXPECT_EQ(Attr(default_, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0u);
  EXPECT_EQ(Attr(default_, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 2 * kPage);
  EXPECT_EQ(DeviceUsed(), device_before);
}

// Whether [p, p+n) is mapped at all (mincore fails with ENOMEM where not).
bool Mapped(CUdeviceptr p, size_t n) {
  std::vector<unsigned char> pages(n / kPage + 1);
  return mincore(reinterpret_cast<void*>(p), n, pages.data()) == 0 || errno != ENOMEM;
}

// As on a GPU, memory freed to a pool that keeps it stays mapped, contents
// and all, and the pool's next allocation of that size gets it back, at
// its address, without clearing it; what the pool releases (a trim, a
// synchronisation under the threshold, memory another allocation's
// reservation took over) is unmapped.
TEST_F(PoolTest, FreedMemoryThePoolKeepsStaysMappedUntilReleased) {
  CUmemoryPool pool = NewPool();
  cuuint64_t threshold = ~cuuint64_t{0};
  ASSERT_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  CUdeviceptr a = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&a, 4 * kPage, pool, s_));
  ASSERT_CU(cuMemsetD8Async(a, 0x5a, 4 * kPage, s_));
  ASSERT_CU(cuMemFreeAsync(a, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  ASSERT_TRUE(Mapped(a, 4 * kPage));
  EXPECT_EQ(*reinterpret_cast<volatile unsigned char*>(a + 5), 0x5a);  // no fault
  // A freed pointer is no allocation: a copy from it is refused.
  unsigned char byte = 0;
  EXPECT_EQ(cuMemcpyDtoH(&byte, a, 1), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr again = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&again, 4 * kPage, pool, s_));
  EXPECT_EQ(again, a);
  ASSERT_CU(cuMemcpyDtoH(&byte, again + 4 * kPage - 1, 1));
  EXPECT_EQ(byte, 0x5a);
  ASSERT_CU(cuMemFreeAsync(again, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  // Trimmed: released and unmapped.
  ASSERT_CU(cuMemPoolTrimTo(pool, 0));
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0u);
  EXPECT_FALSE(Mapped(a, 4 * kPage));

  // Kept memory of another size goes once a new allocation's reservation
  // covers its bytes: the pool holds no more than it reserved.
  CUdeviceptr big = 0, small = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&big, 4 * kPage, pool, s_));
  ASSERT_CU(cuMemFreeAsync(big, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  ASSERT_TRUE(Mapped(big, 4 * kPage));
  ASSERT_CU(cuMemAllocFromPoolAsync(&small, 2 * kPage, pool, s_));
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 4 * kPage);
  EXPECT_FALSE(Mapped(big, 4 * kPage));
  ASSERT_CU(cuMemFreeAsync(small, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  // Destroyed: what it kept goes with it.
  ASSERT_CU(cuMemPoolDestroy(pool));
  EXPECT_FALSE(Mapped(small, 2 * kPage));

  // Threshold 0, the default: released, so unmapped, at the next
  // synchronisation. (A pool of its own: the default pool's high-water
  // marks outlive the test.)
  CUmemoryPool fresh = NewPool();
  CUdeviceptr d = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&d, 4 * kPage, fresh, s_));
  ASSERT_CU(cuMemFreeAsync(d, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_FALSE(Mapped(d, 4 * kPage));
  ASSERT_CU(cuMemPoolDestroy(fresh));
}

TEST_F(PoolTest, ThresholdKeepsFreedMemoryAndTrimReleasesIt) {
  CUmemoryPool pool = NewPool();
  cuuint64_t threshold = ~cuuint64_t{0};
  ASSERT_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), threshold);
  uint64_t device_before = DeviceUsed();
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&a, 4 * kPage, pool, s_));
  ASSERT_CU(cuMemAllocFromPoolAsync(&b, 4 * kPage, pool, s_));
  ASSERT_CU(cuMemFreeAsync(a, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 4 * kPage);
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 8 * kPage);
  EXPECT_EQ(DeviceUsed() - device_before, 8 * kPage);
  // A new allocation takes the unused reservation first.
  CUdeviceptr c = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&c, 2 * kPage, pool, s_));
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 8 * kPage);
  ASSERT_CU(cuMemFreeAsync(c, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  // Trim keeps at least minBytesToKeep, never below what is in use.
  ASSERT_CU(cuMemPoolTrimTo(pool, 6 * kPage));
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 6 * kPage);
  ASSERT_CU(cuMemPoolTrimTo(pool, 0));
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 4 * kPage);
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 8 * kPage);
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 8 * kPage);
  // The marks reset only to 0, and restart from the current values.
  cuuint64_t zero = 0, one = 1;
  EXPECT_EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &one),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
  ASSERT_CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero));
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 4 * kPage);
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 4 * kPage);
  // The current values are read-only.
  EXPECT_EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemFreeAsync(b, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  ASSERT_CU(cuMemPoolTrimTo(pool, 0));
  EXPECT_EQ(DeviceUsed(), device_before);
  ASSERT_CU(cuMemPoolDestroy(pool));
}

TEST_F(PoolTest, SetMemPoolRedirectsAllocAsyncAndDestroyRestoresDefault) {
  CUmemoryPool pool = NewPool();
  ASSERT_CU(cuDeviceSetMemPool(dev_, pool));
  CUmemoryPool current = nullptr;
  ASSERT_CU(cuDeviceGetMemPool(&current, dev_));
  EXPECT_EQ(current, pool);
  CUdeviceptr p = 0;
  ASSERT_CU(cuMemAllocAsync(&p, kPage, s_));
  EXPECT_EQ(Attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), kPage);
  EXPECT_EQ(Attr(default_, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0u);
  // Destroyed with an allocation outstanding: the handle goes at once, the
  // memory when the allocation is freed; the default pool is current again.
  uint64_t device_with = DeviceUsed();
  ASSERT_CU(cuMemPoolDestroy(pool));
  ASSERT_CU(cuDeviceGetMemPool(&current, dev_));
  EXPECT_EQ(current, default_);
  cuuint64_t v = 0;
  EXPECT_EQ(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemsetD8Async(p, 1, kPage, s_));
  ASSERT_CU(cuMemFreeAsync(p, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  EXPECT_EQ(DeviceUsed(), device_with - kPage);
}

TEST_F(PoolTest, BadArgumentsGetTheDriversErrors) {
  CUmemoryPool pool = nullptr;
  cuuint64_t v = 0;
  EXPECT_EQ(cuDeviceGetDefaultMemPool(nullptr, dev_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuDeviceGetDefaultMemPool(&pool, 99), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuDeviceGetMemPool(&pool, 99), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(cuDeviceSetMemPool(dev_, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemPoolGetAttribute(nullptr, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemPoolGetAttribute(default_, static_cast<CUmemPool_attribute>(99), &v),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemPoolGetAttribute(default_, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemPoolTrimTo(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemPoolDestroy(default_), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr p = 0;
  EXPECT_EQ(cuMemAllocFromPoolAsync(&p, kPage, nullptr, s_), CUDA_ERROR_INVALID_VALUE);
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 99};
  EXPECT_EQ(cuMemPoolCreate(&pool, &props), CUDA_ERROR_INVALID_DEVICE);
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  props.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
  EXPECT_EQ(cuMemPoolCreate(&pool, &props), CUDA_ERROR_INVALID_VALUE);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  EXPECT_EQ(cuMemPoolCreate(&pool, &props), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(cuMemPoolCreate(nullptr, &props), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(PoolTest, MaxSizeBoundsThePool) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  props.maxSize = 4 * kPage;
  CUmemoryPool pool = nullptr;
  ASSERT_CU(cuMemPoolCreate(&pool, &props));
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAllocFromPoolAsync(&a, 3 * kPage, pool, s_));
  EXPECT_EQ(cuMemAllocFromPoolAsync(&b, 2 * kPage, pool, s_), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_CU(cuMemFreeAsync(a, s_));
  ASSERT_CU(cuStreamSynchronize(s_));
  ASSERT_CU(cuMemPoolDestroy(pool));
}

}  // namespace
