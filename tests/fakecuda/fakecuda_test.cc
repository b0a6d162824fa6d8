// Semantics of the fake CUDA driver: the behaviour every stensor test relies
// on, checked against what the real driver documents.
#include "tests/fakecuda/fakecuda.h"

#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS) << #expr
#define EXPECT_CU(expr) EXPECT_EQ((expr), CUDA_SUCCESS) << #expr

constexpr size_t kGranule = 2u << 20;
constexpr char kModule[] = "tests/fakecuda/test_kernels.so";

// Entry points the public header does not declare under their exported
// names (per-thread twins, the 4-argument cuGetProcAddress), looked up the
// way the CUDA runtime finds them.
template <typename Fn>
Fn Sym(const char* name) {
  static void* self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return reinterpret_cast<Fn>(dlsym(self, name));
}
using GetProcAddress4 = CUresult (*)(const char*, void**, int, cuuint64_t);

// A host function that blocks its stream until Open(): lets a test hold a
// stream at a known point without relying on timing.
class Gate {
 public:
  static void CUDA_CB Wait(void* self) {
    auto* g = static_cast<Gate*>(self);
    while (!g->open_.load()) std::this_thread::yield();
  }
  void Open() { open_.store(true); }

 private:
  std::atomic<bool> open_{false};
};

class FakeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDeviceGet(&dev_, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, dev_));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
  }
  void TearDown() override {
    cuCtxSynchronize();
    cuDevicePrimaryCtxRelease(dev_);
  }

  CUfunction Function(const char* name) {
    if (module_ == nullptr) {
      EXPECT_CU(cuModuleLoad(&module_, kModule));
    }
    CUfunction f = nullptr;
    EXPECT_CU(cuModuleGetFunction(&f, module_, name));
    return f;
  }

  // Reserves `granules` granules of VA and maps fresh device memory there.
  CUdeviceptr MapNew(size_t granules, CUmemGenericAllocationHandle* handle,
                     CUmemLocationType where = CU_MEM_LOCATION_TYPE_DEVICE) {
    CUdeviceptr va = 0;
    EXPECT_CU(cuMemAddressReserve(&va, granules * kGranule, 0, 0, 0));
    MapAt(va, granules, handle, where);
    return va;
  }
  void MapAt(CUdeviceptr va, size_t granules, CUmemGenericAllocationHandle* handle,
             CUmemLocationType where = CU_MEM_LOCATION_TYPE_DEVICE) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = where;
    prop.location.id = 0;
    EXPECT_CU(cuMemCreate(handle, granules * kGranule, &prop, 0));
    EXPECT_CU(cuMemMap(va, granules * kGranule, 0, *handle, 0));
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    EXPECT_CU(cuMemSetAccess(va, granules * kGranule, &access, 1));
  }

  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
};

TEST_F(FakeCudaTest, RemapAtSameAddressKeepsAddressAndRestoredData) {
  CUmemGenericAllocationHandle h1, h2;
  CUdeviceptr va = MapNew(1, &h1);
  std::vector<unsigned char> data(kGranule), back(kGranule);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7);
  ASSERT_CU(cuMemcpyHtoD_v2(va, data.data(), data.size()));

  // Swap out: copy to host, unmap and release the physical memory.
  std::vector<unsigned char> saved(kGranule);
  ASSERT_CU(cuMemcpyDtoH_v2(saved.data(), va, saved.size()));
  ASSERT_CU(cuMemUnmap(va, kGranule));
  ASSERT_CU(cuMemRelease(h1));
  EXPECT_FALSE(cuMemcpyDtoH_v2(back.data(), va, 16) == CUDA_SUCCESS);

  // Swap in at the same VA.
  MapAt(va, 1, &h2);
  ASSERT_CU(cuMemcpyHtoD_v2(va, saved.data(), saved.size()));
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), va, back.size()));
  EXPECT_EQ(back, data);
  ASSERT_CU(cuMemUnmap(va, kGranule));
  ASSERT_CU(cuMemRelease(h2));
  ASSERT_CU(cuMemAddressFree(va, kGranule));
}

TEST_F(FakeCudaTest, PhysicalMemoryLivesUntilLastUnmap) {
  size_t before = fakecuda_used_bytes(0);
  CUmemGenericAllocationHandle h;
  CUdeviceptr va = MapNew(2, &h);
  EXPECT_EQ(fakecuda_used_bytes(0), before + 2 * kGranule);
  ASSERT_CU(cuMemRelease(h));
  EXPECT_EQ(fakecuda_used_bytes(0), before + 2 * kGranule);  // still mapped
  EXPECT_EQ(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
  CUmemGenericAllocationHandle again;
  ASSERT_CU(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(va + 5)));
  EXPECT_EQ(again, h);
  ASSERT_CU(cuMemRelease(again));
  ASSERT_CU(cuMemUnmap(va, 2 * kGranule));
  EXPECT_EQ(fakecuda_used_bytes(0), before);
  ASSERT_CU(cuMemAddressFree(va, 2 * kGranule));
}

TEST_F(FakeCudaTest, HostLocatedMemoryDoesNotUseDeviceCapacity) {
  int supported = 0;
  ASSERT_CU(cuDeviceGetAttribute(
      &supported, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev_));
  ASSERT_EQ(supported, 1);
  size_t before = fakecuda_used_bytes(0);
  CUmemGenericAllocationHandle h;
  CUdeviceptr va = MapNew(1, &h, CU_MEM_LOCATION_TYPE_HOST);
  EXPECT_EQ(fakecuda_used_bytes(0), before);
  ASSERT_CU(cuMemsetD32_v2(va, 0xdeadbeef, kGranule / 4));
  unsigned word = 0;
  ASSERT_CU(cuMemcpyDtoH_v2(&word, va + 64, 4));
  EXPECT_EQ(word, 0xdeadbeefu);
  ASSERT_CU(cuMemUnmap(va, kGranule));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, kGranule));
}

TEST_F(FakeCudaTest, VmmRejectsBadArguments) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  size_t gran = 0;
  ASSERT_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(gran, kGranule);
  CUmemGenericAllocationHandle h;
  EXPECT_EQ(cuMemCreate(&h, kGranule + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  prop.location.id = 99;
  EXPECT_EQ(cuMemCreate(&h, kGranule, &prop, 0), CUDA_ERROR_INVALID_DEVICE);
  CUdeviceptr va;
  EXPECT_EQ(cuMemAddressReserve(&va, 4097, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAddressReserve(&va, ~size_t{0} - kGranule + 1, 2 * kGranule, 0, 0),
            CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_CU(cuMemAddressReserve(&va, 2 * kGranule, 0, 0, 0));
  EXPECT_EQ(va % kGranule, 0u);
  prop.location.id = 0;
  ASSERT_CU(cuMemCreate(&h, kGranule, &prop, 0));
  // Not whole granules: CUDA_ERROR_NOT_SUPPORTED, before whether the range
  // is free (driver 580 on an H200); mapped already: CUDA_ERROR_INVALID_VALUE.
  EXPECT_EQ(cuMemMap(va + 4096, kGranule, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(cuMemMap(va, kGranule + 4096, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(cuMemMap(va, 0, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemMap(va, kGranule, 0, h, 0));
  EXPECT_EQ(cuMemMap(va, kGranule, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemMap(va + 4096, 4096, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);
  // Unmapping: nothing mapped in a reservation's range is CUDA_SUCCESS (as
  // on that GPU, even for 4 KiB) and leaves the mapping before it; a range
  // that cuts a mapping, or outside any reservation, is refused.
  EXPECT_CU(cuMemUnmap(va + kGranule, kGranule));
  EXPECT_CU(cuMemUnmap(va + kGranule, 4096));
  EXPECT_EQ(cuMemUnmap(va, 4096), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemUnmap(va + 4096, kGranule), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemUnmap(va, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAddressFree(va, 2 * kGranule), CUDA_ERROR_INVALID_VALUE);
  // The whole reservation: its one mapping goes.
  ASSERT_CU(cuMemUnmap(va, 2 * kGranule));
  EXPECT_CU(cuMemUnmap(va, kGranule));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, 2 * kGranule));
}

// Pages of [p, p+n) with a page-table entry now (/proc/self/pagemap bit 63),
// or -1 when pagemap cannot be read.
long PresentPages(uintptr_t p, size_t n) {
  FILE* f = std::fopen("/proc/self/pagemap", "rb");
  if (f == nullptr) return -1;
  const long page = sysconf(_SC_PAGESIZE);
  std::vector<uint64_t> entries(n / page);
  long present = -1;
  if (std::fseek(f, static_cast<long>(p / page * sizeof(uint64_t)), SEEK_SET) == 0 &&
      std::fread(entries.data(), sizeof(uint64_t), entries.size(), f) == entries.size()) {
    present = 0;
    for (uint64_t e : entries) present += (e >> 63) & 1;
  }
  std::fclose(f);
  return present;
}

// A GPU sets a mapping's page tables up at cuMemMap/cuMemSetAccess: its
// first touch costs nothing extra. The fake's memory keeps its page tables
// from one mapping to the next, at any address, so a remapped handle's
// touched pages are present before anything touches them again; its data
// and a second, simultaneous mapping stay right.
TEST_F(FakeCudaTest, RemappedMemoryKeepsItsPageTables) {
  CUmemGenericAllocationHandle h;
  CUdeviceptr va = MapNew(2, &h);
  const size_t n = 2 * kGranule;
  std::vector<unsigned char> data(n);
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<unsigned char>(i * 13 + 1);
  ASSERT_CU(cuMemcpyHtoD_v2(va, data.data(), n));  // touches every page
  ASSERT_CU(cuMemUnmap(va, n));
  CUdeviceptr other = 0;
  ASSERT_CU(cuMemAddressReserve(&other, n, 0, 0, 0));
  ASSERT_CU(cuMemMap(other, n, 0, h, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_CU(cuMemSetAccess(other, n, &access, 1));
  long present = PresentPages(other, n);
  if (present < 0) GTEST_SKIP() << "no /proc/self/pagemap";
  EXPECT_EQ(present, static_cast<long>(n / sysconf(_SC_PAGESIZE)));
  // A second mapping of the same memory at the same time sees it too.
  ASSERT_CU(cuMemMap(va, n, 0, h, 0));
  ASSERT_CU(cuMemSetAccess(va, n, &access, 1));
  std::vector<unsigned char> back(n);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), other, n));
  EXPECT_EQ(back, data);
  reinterpret_cast<volatile unsigned char*>(va)[5] = 99;
  EXPECT_EQ(reinterpret_cast<volatile unsigned char*>(other)[5], 99);
  // Back at the first address once the other is gone, with its page tables.
  ASSERT_CU(cuMemUnmap(other, n));
  ASSERT_CU(cuMemUnmap(va, n));
  ASSERT_CU(cuMemMap(va, n, 0, h, 0));
  ASSERT_CU(cuMemSetAccess(va, n, &access, 1));
  EXPECT_EQ(PresentPages(va, n), static_cast<long>(n / sysconf(_SC_PAGESIZE)));
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), va, n));
  data[5] = 99;
  EXPECT_EQ(back, data);
  ASSERT_CU(cuMemUnmap(va, n));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(other, n));
  ASSERT_CU(cuMemAddressFree(va, n));
}

// cuMemAlloc memory has its page tables from the start, as on a GPU: a
// program's per-step temporaries (freed, then allocated again at the same
// size) are not billed a fault per page at each step. The new allocation
// holds zeros, as fresh memory does, and the freed range is gone: a copy
// from it is refused and its pages are unmapped.
TEST_F(FakeCudaTest, ReallocatedMemoryHasItsPageTablesAndHoldsZeros) {
  const size_t n = 3 * kGranule + 4096;
  CUdeviceptr first = 0;
  ASSERT_CU(cuMemAlloc_v2(&first, n));
  ASSERT_CU(cuMemsetD8_v2(first, 0x7f, n));
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(cuMemFree_v2(first));
  CUdeviceptr again = 0;
  ASSERT_CU(cuMemAlloc_v2(&again, n));
  EXPECT_NE(again, first);
  long present = PresentPages(again, n);
  if (present < 0) GTEST_SKIP() << "no /proc/self/pagemap";
  EXPECT_EQ(present, static_cast<long>(n / sysconf(_SC_PAGESIZE)));
  // Before any large host allocation, which may be placed in the freed
  // range (AddressSanitizer's allocator does).
  EXPECT_EQ(PresentPages(first, n), 0);
  std::vector<unsigned char> back(n, 1);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), again, n));
  EXPECT_EQ(back, std::vector<unsigned char>(n, 0));
  unsigned char byte = 0;
  EXPECT_EQ(cuMemcpyDtoH_v2(&byte, first, 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemFree_v2(again));
}

// Memory handed on while its old address is still mapped (a swap-out's copy
// in flight) is mapped at two addresses at once, and is every step in a
// swapping program: once both mappings were touched, the next two
// mappings of it, anywhere, have their page tables at once too.
TEST_F(FakeCudaTest, TwoMappingsAtOnceBothKeepTheirPageTables) {
  CUmemGenericAllocationHandle h;
  CUdeviceptr first = MapNew(1, &h);
  const size_t n = kGranule;
  const long pages = static_cast<long>(n / sysconf(_SC_PAGESIZE));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUdeviceptr va[4] = {first, 0, 0, 0};
  for (int i = 1; i < 4; ++i) ASSERT_CU(cuMemAddressReserve(&va[i], n, 0, 0, 0));
  ASSERT_CU(cuMemMap(va[1], n, 0, h, 0));
  ASSERT_CU(cuMemSetAccess(va[1], n, &access, 1));
  ASSERT_CU(cuMemsetD8_v2(va[0], 0x11, n));  // touches both homes' pages
  ASSERT_CU(cuMemsetD8_v2(va[1], 0x22, n));  // asynchronous, as on a GPU
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(cuMemUnmap(va[0], n));
  ASSERT_CU(cuMemUnmap(va[1], n));
  for (int i : {2, 3}) {
    ASSERT_CU(cuMemMap(va[i], n, 0, h, 0));
    ASSERT_CU(cuMemSetAccess(va[i], n, &access, 1));
    long present = PresentPages(va[i], n);
    if (present < 0) GTEST_SKIP() << "no /proc/self/pagemap";
    EXPECT_EQ(present, pages) << "mapping " << i;
  }
  // One memory behind both; unmapped addresses fault as before.
  reinterpret_cast<volatile unsigned char*>(va[2])[9] = 0x33;
  unsigned char byte = 0;
  ASSERT_CU(cuMemcpyDtoH_v2(&byte, va[3] + 9, 1));
  EXPECT_EQ(byte, 0x33);
  ASSERT_CU(cuMemcpyDtoH_v2(&byte, va[3] + 10, 1));
  EXPECT_EQ(byte, 0x22);
  EXPECT_EQ(PresentPages(va[0], n), 0);
  EXPECT_EQ(cuMemcpyDtoH_v2(&byte, va[0], 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemUnmap(va[2], n));
  ASSERT_CU(cuMemUnmap(va[3], n));
  ASSERT_CU(cuMemRelease(h));
  for (CUdeviceptr p : va) ASSERT_CU(cuMemAddressFree(p, n));
}

// A mapping made read-only and then unmapped leaves the handle as it was:
// the next read-write mapping of it is writable. (The fake's page tables
// move from mapping to mapping, and would carry the protection along.)
TEST_F(FakeCudaTest, ReadOnlyMappingDoesNotLeaveItsHandleReadOnly) {
  CUmemGenericAllocationHandle h;
  CUdeviceptr va = MapNew(1, &h);  // read-write: borrows the page tables
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
  ASSERT_CU(cuMemSetAccess(va, kGranule, &access, 1));
  ASSERT_CU(cuMemUnmap(va, kGranule));
  CUdeviceptr other = 0;
  ASSERT_CU(cuMemAddressReserve(&other, kGranule, 0, 0, 0));
  ASSERT_CU(cuMemMap(other, kGranule, 0, h, 0));
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_CU(cuMemSetAccess(other, kGranule, &access, 1));
  ASSERT_CU(cuMemsetD8_v2(other, 0x5a, kGranule));  // faults if read-only
  ASSERT_CU(cuCtxSynchronize());
  reinterpret_cast<volatile unsigned char*>(other)[kGranule - 1] = 7;
  std::vector<unsigned char> back(kGranule);
  ASSERT_CU(cuMemcpyDtoH_v2(back.data(), other, kGranule));
  EXPECT_EQ(back[0], 0x5a);
  EXPECT_EQ(back[kGranule - 1], 7);
  ASSERT_CU(cuMemUnmap(other, kGranule));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(other, kGranule));
  ASSERT_CU(cuMemAddressFree(va, kGranule));
}

using FakeCudaDeathTest = FakeCudaTest;

// As the real driver: in a child of fork() whose parent initialised the
// driver, every call that needs it answers CUDA_ERROR_NOT_INITIALIZED, cuInit
// included; the version query still works.
TEST_F(FakeCudaTest, ForkedChildOfAnInitialisedParentIsNotInitialised) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int version = 0;
    CUdeviceptr p = 0;
    int code = 0;
    if (cuInit(0) != CUDA_ERROR_NOT_INITIALIZED) code |= 1;
    if (cuMemAlloc(&p, 4096) != CUDA_ERROR_NOT_INITIALIZED) code |= 2;
    if (cuDriverGetVersion(&version) != CUDA_SUCCESS || version == 0) code |= 4;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  CUdeviceptr p = 0;  // the parent is unaffected
  ASSERT_EQ(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(p), CUDA_SUCCESS);
}

TEST_F(FakeCudaDeathTest, TouchingAnUnmappedRangeFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CUmemGenericAllocationHandle h;
  CUdeviceptr va = MapNew(1, &h);
  auto* p = reinterpret_cast<volatile int*>(va);
  p[0] = 1;  // mapped with access: fine
  ASSERT_CU(cuMemUnmap(va, kGranule));
  EXPECT_EXIT(p[0] = 2, ::testing::KilledBySignal(SIGSEGV), "");
  ASSERT_CU(cuMemRelease(h));
}

TEST_F(FakeCudaDeathTest, MappedWithoutAccessFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CUdeviceptr va;
  ASSERT_CU(cuMemAddressReserve(&va, kGranule, 0, 0, 0));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle h;
  ASSERT_CU(cuMemCreate(&h, kGranule, &prop, 0));
  ASSERT_CU(cuMemMap(va, kGranule, 0, h, 0));
  EXPECT_EXIT(*reinterpret_cast<volatile int*>(va) = 2, ::testing::KilledBySignal(SIGSEGV), "");
  int v = 0;
  EXPECT_EQ(cuMemcpyDtoH_v2(&v, va, 4), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeCudaDeathTest, KernelReadingAnUnmappedBufferFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CUfunction axpy = Function("_ZN5testk4axpyEfPKfPfi");
  CUmemGenericAllocationHandle h;
  CUdeviceptr va = MapNew(1, &h);
  ASSERT_CU(cuMemUnmap(va, kGranule));
  CUdeviceptr y;
  ASSERT_CU(cuMemAlloc_v2(&y, 4096));
  float a = 1;
  int n = 16;
  void* params[] = {&a, &va, &y, &n};
  EXPECT_EXIT(
      {
        cuLaunchKernel(axpy, 1, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr);
        cuCtxSynchronize();
      },
      ::testing::KilledBySignal(SIGSEGV), "");
}

TEST_F(FakeCudaTest, AllocationPastCapacityIsOutOfMemory) {
  size_t free_bytes = 0, total = 0;
  ASSERT_CU(cuMemGetInfo_v2(&free_bytes, &total));
  EXPECT_EQ(total, size_t{256} << 20);  // FAKECUDA_DEVICE_MEMORY in BUILD
  size_t total_mem = 0;
  ASSERT_CU(cuDeviceTotalMem_v2(&total_mem, dev_));
  EXPECT_EQ(total_mem, total);
  CUdeviceptr big;
  EXPECT_EQ(cuMemAlloc_v2(&big, total + 1), CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr a;
  ASSERT_CU(cuMemAlloc_v2(&a, free_bytes - (64u << 20)));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle h;
  EXPECT_EQ(cuMemCreate(&h, 128u << 20, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_CU(cuMemCreate(&h, 32u << 20, &prop, 0));
  size_t now_free = 0;
  ASSERT_CU(cuMemGetInfo_v2(&now_free, &total));
  EXPECT_EQ(now_free, 32u << 20);
  EXPECT_GE(fakecuda_peak_bytes(0), total - now_free);
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemFree_v2(a));
  ASSERT_CU(cuMemGetInfo_v2(&now_free, &total));
  EXPECT_EQ(now_free, free_bytes);
}

TEST_F(FakeCudaTest, PeakIsAHighWaterMark) {
  fakecuda_reset_peak_bytes(0);
  size_t base = fakecuda_used_bytes(0);
  CUdeviceptr a, b;
  ASSERT_CU(cuMemAlloc_v2(&a, 10u << 20));
  ASSERT_CU(cuMemAlloc_v2(&b, 6u << 20));
  ASSERT_CU(cuMemFree_v2(a));
  ASSERT_CU(cuMemFree_v2(b));
  EXPECT_EQ(fakecuda_used_bytes(0), base);
  EXPECT_EQ(fakecuda_peak_bytes(0), base + (16u << 20));
}

TEST_F(FakeCudaTest, MemoryCallsReturnTheDriversErrors) {
  CUdeviceptr p;
  EXPECT_EQ(cuMemAlloc_v2(&p, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemAlloc_v2(nullptr, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemFree_v2(12345), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemAlloc_v2(&p, 1000));
  EXPECT_EQ(cuMemFree_v2(p + 8), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr base;
  size_t size;
  ASSERT_CU(cuMemGetAddressRange_v2(&base, &size, p + 100));
  EXPECT_EQ(base, p);
  EXPECT_EQ(size, 1000u);
  char host[64];
  EXPECT_EQ(cuMemcpyHtoD_v2(p + 4090, host, 64), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuMemsetD32_v2(p + 2, 0, 4), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemFree_v2(p));
  EXPECT_EQ(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
  size_t pitch = 0;
  EXPECT_EQ(cuMemAllocPitch_v2(&p, &pitch, 100, 10, 3), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemAllocPitch_v2(&p, &pitch, 100, 10, 4));
  EXPECT_EQ(pitch, 512u);
  ASSERT_CU(cuMemFree_v2(p));
  void* pinned = nullptr;
  ASSERT_CU(cuMemAllocHost_v2(&pinned, 100));
  EXPECT_EQ(cuMemFreeHost(static_cast<char*>(pinned) + 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemFreeHost(pinned));
}

TEST_F(FakeCudaTest, CallsBeforeInitOrWithoutContextFail) {
  ASSERT_CU(cuCtxSetCurrent(nullptr));
  CUdeviceptr p;
  EXPECT_EQ(cuMemAlloc_v2(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
  CUdevice d;
  EXPECT_EQ(cuDeviceGet(&d, 5), CUDA_ERROR_INVALID_DEVICE);
  int count = 0;
  ASSERT_CU(cuDeviceGetCount(&count));
  EXPECT_EQ(count, 2);  // FAKECUDA_DEVICES in BUILD
  EXPECT_EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuCtxSetCurrent(ctx_));
}

TEST_F(FakeCudaTest, CopiesAndMemsetsIn1DAnd2D) {
  CUdeviceptr d;
  size_t pitch;
  ASSERT_CU(cuMemAllocPitch_v2(&d, &pitch, 16, 4, 4));
  ASSERT_CU(cuMemsetD2D16_v2(d, pitch, 0xabcd, 8, 4));
  std::vector<unsigned short> rows(8 * 4);
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = d;
  c.srcPitch = pitch;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = rows.data();
  c.dstPitch = 16;
  c.WidthInBytes = 16;
  c.Height = 4;
  ASSERT_CU(cuMemcpy2D_v2(&c));
  for (unsigned short v : rows) EXPECT_EQ(v, 0xabcd);
  c.Height = 5;  // one row past the allocation's pitch * height
  EXPECT_EQ(cuMemcpy2D_v2(&c), CUDA_ERROR_INVALID_VALUE);

  CUdeviceptr e;
  ASSERT_CU(cuMemAlloc_v2(&e, 64));
  ASSERT_CU(cuMemsetD8_v2(e, 0, 64));
  ASSERT_CU(cuMemcpyDtoD_v2(e + 8, d + pitch, 16));
  ASSERT_CU(cuMemcpy(e + 32, e + 8, 4));  // unified addressing
  unsigned short out[20];
  ASSERT_CU(cuMemcpyDtoH_v2(out, e, 40));
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[4], 0xabcd);
  EXPECT_EQ(out[16], 0xabcd);
  ASSERT_CU(cuMemFree_v2(d));
  ASSERT_CU(cuMemFree_v2(e));
}

// One slice of a 3D copy at Z > 0 starts at (Z * srcHeight + Y) * pitch + X,
// with srcHeight as given, as the driver documents (once the fake used
// Height + srcY as the slice height when Depth was 1).
TEST_F(FakeCudaTest, OneSliceOfA3DCopyStartsAtItsSlice) {
  constexpr size_t kPitch = 16, kSliceRows = 4, kSlices = 3;
  std::vector<unsigned char> volume(kPitch * kSliceRows * kSlices);
  for (size_t i = 0; i < volume.size(); ++i) volume[i] = static_cast<unsigned char>(i);
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, volume.size()));
  ASSERT_CU(cuMemcpyHtoD_v2(d, volume.data(), volume.size()));
  unsigned char out[2 * 8] = {};
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = d;
  c.srcPitch = kPitch;
  c.srcHeight = kSliceRows;
  c.srcZ = 2;
  c.srcY = 1;
  c.srcXInBytes = 3;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = out;
  c.dstPitch = 8;
  c.WidthInBytes = 8;
  c.Height = 2;
  c.Depth = 1;
  ASSERT_CU(cuMemcpy3D_v2(&c));
  for (size_t y = 0; y < 2; ++y) {
    for (size_t x = 0; x < 8; ++x) {
      EXPECT_EQ(out[y * 8 + x], volume[(2 * kSliceRows + 1 + y) * kPitch + 3 + x]) << y << "," << x;
    }
  }
  ASSERT_CU(cuMemFree_v2(d));
}

TEST_F(FakeCudaTest, AsyncCopyFromPageableMemoryReadsItBeforeReturning) {
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, 4));
  int value = 5;
  ASSERT_CU(cuMemcpyHtoDAsync_v2(d, &value, 4, s));
  value = 6;  // the copy (staged or synchronous) must already have taken 5
  ASSERT_CU(cuStreamSynchronize(s));
  int out = 0;
  ASSERT_CU(cuMemcpyDtoH_v2(&out, d, 4));
  EXPECT_EQ(out, 5);
  ASSERT_CU(cuStreamDestroy_v2(s));
  ASSERT_CU(cuMemFree_v2(d));
}

// Blocking behaviour documented in "API synchronization behavior": a test
// that hangs here means the fake blocks where the real driver does not.
TEST_F(FakeCudaTest, DeviceToDeviceCopiesAndMemsetsDoNotBlockTheHost) {
  CUdeviceptr a, b;
  ASSERT_CU(cuMemAlloc_v2(&a, 64));
  ASSERT_CU(cuMemAlloc_v2(&b, 64));
  Gate held;
  ASSERT_CU(cuLaunchHostFunc(nullptr, &Gate::Wait, &held));
  ASSERT_CU(cuMemsetD8_v2(a, 7, 64));
  ASSERT_CU(cuMemcpyDtoD_v2(b, a, 64));
  EXPECT_EQ(cuStreamQuery(nullptr), CUDA_ERROR_NOT_READY);
  held.Open();
  unsigned char out[64];
  ASSERT_CU(cuMemcpyDtoH_v2(out, b, 64));  // ordered after both
  EXPECT_EQ(out[63], 7);
  // Freeing a stream-ordered allocation does not wait for unrelated work.
  CUstream s;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  Gate held2;
  ASSERT_CU(cuLaunchHostFunc(s, &Gate::Wait, &held2));
  CUdeviceptr c;
  ASSERT_CU(cuMemAllocAsync(&c, 64, nullptr));
  ASSERT_CU(cuMemFree_v2(c));
  EXPECT_EQ(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  held2.Open();
  ASSERT_CU(cuStreamDestroy_v2(s));
  ASSERT_CU(cuMemFree_v2(a));
  ASSERT_CU(cuMemFree_v2(b));
}

TEST_F(FakeCudaTest, SizeArithmeticThatOverflowsIsInvalid) {
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, 16));
  EXPECT_EQ(cuMemsetD32Async(d, 0, (size_t{1} << 62) + 1, nullptr), CUDA_ERROR_INVALID_VALUE);
  std::vector<char> host(64);
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = host.data();
  c.srcPitch = 16;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = d;
  c.dstPitch = size_t{1} << 63;
  c.WidthInBytes = 8;
  c.Height = 3;
  EXPECT_EQ(cuMemcpy2D_v2(&c), CUDA_ERROR_INVALID_VALUE);
  c.dstPitch = 8;
  c.dstXInBytes = 4;  // pitch below WidthInBytes + dstXInBytes
  EXPECT_EQ(cuMemcpy2D_v2(&c), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemFree_v2(d));
}

TEST_F(FakeCudaTest, PrimaryContextKeepsItsIdentityAcrossRelease) {
  CUcontext again = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&again, dev_));
  EXPECT_EQ(again, ctx_);
  ASSERT_CU(cuDevicePrimaryCtxRelease_v2(dev_));
  ASSERT_CU(cuDevicePrimaryCtxReset_v2(dev_));  // now inactive
  CUdeviceptr p;
  EXPECT_EQ(cuMemAlloc_v2(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
  unsigned flags;
  int active = 1;
  ASSERT_CU(cuDevicePrimaryCtxGetState(dev_, &flags, &active));
  EXPECT_EQ(active, 0);
  ASSERT_CU(cuDevicePrimaryCtxRetain(&again, dev_));  // TearDown releases
  EXPECT_EQ(again, ctx_);
  ASSERT_CU(cuMemAlloc_v2(&p, 16));  // current again, same handle
  ASSERT_CU(cuMemFree_v2(p));
}

// A context's streams and events end with it (cuCtxDestroy: "Destroys and
// cleans up all resources associated with the context"; a primary
// context's reset or last release ends it too): their handles are invalid
// from then on, also once the primary context is retained again, whose
// NULL stream works as before.
TEST_F(FakeCudaTest, StreamsAndEventsEndWithTheirContext) {
  auto expect_gone = [](CUstream s, CUevent e) {
    EXPECT_EQ(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
    CUcontext c;
    EXPECT_EQ(cuStreamGetCtx(s, &c), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(cuEventRecord(e, nullptr), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(cuStreamDestroy_v2(s), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(cuEventDestroy_v2(e), CUDA_ERROR_INVALID_HANDLE);
  };
  CUcontext created = nullptr;
  ASSERT_CU(cuCtxCreate_v4(&created, nullptr, 0, dev_));
  CUstream s;
  CUevent e;
  ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  ASSERT_CU(cuEventRecord(e, s));
  ASSERT_CU(cuCtxDestroy_v2(created));  // popped: the primary context is current
  expect_gone(s, e);
  // The primary context's, once it is reset, and once it is released for good.
  for (bool reset : {true, false}) {
    CUstream kept;
    ASSERT_CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    ASSERT_CU(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    ASSERT_CU(cuEventRecord(e, s));
    CUcontext again;
    ASSERT_CU(cuDevicePrimaryCtxRetain(&again, dev_));  // one more reference
    if (reset) {
      ASSERT_CU(cuDevicePrimaryCtxReset_v2(dev_));
    } else {
      ASSERT_CU(cuDevicePrimaryCtxRelease_v2(dev_));
      ASSERT_CU(cuStreamSynchronize(s));  // still alive: a reference is left
      ASSERT_CU(cuStreamCreate(&kept, 0));
      ASSERT_CU(cuStreamDestroy_v2(kept));
      ASSERT_CU(cuDevicePrimaryCtxRelease_v2(dev_));
    }
    ASSERT_CU(cuDevicePrimaryCtxRetain(&again, dev_));  // TearDown releases it
    ASSERT_EQ(again, ctx_);
    expect_gone(s, e);
    ASSERT_CU(cuStreamSynchronize(nullptr));
  }
}

TEST_F(FakeCudaTest, DynamicSharedMemoryAbove48KiBNeedsTheAttribute) {
  CUfunction f = Function("_ZN5testk9slow_fillEPiiii");
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, 4));
  int value = 1, n = 1, delay = 0;
  void* params[] = {&d, &value, &n, &delay};
  EXPECT_EQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 64 * 1024, nullptr, params, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 64 * 1024));
  ASSERT_CU(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 64 * 1024, nullptr, params, nullptr));
  ASSERT_CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 48 * 1024));
  ASSERT_CU(cuMemFree_v2(d));
}

TEST_F(FakeCudaTest, EventsOrderWorkAcrossTwoStreams) {
  CUfunction fill = Function("_ZN5testk9slow_fillEPiiii");
  CUstream producer, consumer;
  ASSERT_CU(cuStreamCreate(&producer, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuStreamCreate(&consumer, CU_STREAM_NON_BLOCKING));
  CUevent done;
  ASSERT_CU(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr src, dst;
  constexpr int kN = 1024;
  ASSERT_CU(cuMemAlloc_v2(&src, kN * 4));
  ASSERT_CU(cuMemAlloc_v2(&dst, kN * 4));
  ASSERT_CU(cuMemsetD32_v2(src, 0, kN));
  ASSERT_CU(cuMemsetD32_v2(dst, 0, kN));
  // Memsets do not block the host, and non-blocking streams do not wait for
  // the legacy stream: without this, the kernel below would race them.
  ASSERT_CU(cuStreamSynchronize(nullptr));

  Gate gate;
  ASSERT_CU(cuLaunchHostFunc(producer, &Gate::Wait, &gate));
  int value = 7, n = kN, delay = 1;
  void* params[] = {&src, &value, &n, &delay};
  ASSERT_CU(cuLaunchKernel(fill, 4, 1, 1, 256, 1, 1, 0, producer, params, nullptr));
  ASSERT_CU(cuEventRecord(done, producer));
  ASSERT_CU(cuStreamWaitEvent(consumer, done, 0));
  ASSERT_CU(cuMemcpyDtoDAsync_v2(dst, src, kN * 4, consumer));

  EXPECT_EQ(cuEventQuery(done), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cuStreamQuery(consumer), CUDA_ERROR_NOT_READY);
  gate.Open();
  ASSERT_CU(cuStreamSynchronize(consumer));
  EXPECT_CU(cuEventQuery(done));
  std::vector<int> out(kN);
  ASSERT_CU(cuMemcpyDtoH_v2(out.data(), dst, kN * 4));
  EXPECT_EQ(out, std::vector<int>(kN, 7));
  ASSERT_CU(cuEventDestroy_v2(done));
  ASSERT_CU(cuStreamDestroy_v2(producer));
  ASSERT_CU(cuStreamDestroy_v2(consumer));
  EXPECT_EQ(cuStreamDestroy_v2(consumer), CUDA_ERROR_INVALID_HANDLE);
}

// What the driver documents for streams and events of another context
// (here device 1's primary context while device 0's is current):
// cuEventRecord needs an event and a stream of one context
// (CUDA_ERROR_INVALID_HANDLE otherwise); cuStreamWaitEvent, event queries and
// synchronisation, and copies on another context's stream are allowed; a
// kernel launch on another device's stream fails.
TEST_F(FakeCudaTest, StreamsAndEventsBelongToTheirContext) {
  CUcontext other = nullptr;
  ASSERT_CU(cuDevicePrimaryCtxRetain(&other, 1));
  ASSERT_CU(cuCtxPushCurrent_v2(other));
  CUstream other_stream;
  CUevent other_event;
  ASSERT_CU(cuStreamCreate(&other_stream, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuEventCreate(&other_event, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr other_buf;
  ASSERT_CU(cuMemAlloc_v2(&other_buf, 64));
  CUcontext popped = nullptr;
  ASSERT_CU(cuCtxPopCurrent_v2(&popped));
  ASSERT_EQ(popped, other);

  CUstream stream;
  CUevent event;
  ASSERT_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  ASSERT_CU(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
  CUdeviceptr buf;
  ASSERT_CU(cuMemAlloc_v2(&buf, 64));

  // Record: same context only, the NULL stream being the current context's.
  EXPECT_EQ(cuEventRecord(other_event, stream), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventRecord(event, other_stream), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventRecord(other_event, nullptr), CUDA_ERROR_INVALID_HANDLE);
  using RecordPtsz = CUresult (*)(CUevent, CUstream);
  EXPECT_EQ(Sym<RecordPtsz>("cuEventRecord_ptsz")(other_event, nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventRecordWithFlags(other_event, stream, 0), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_CU(cuEventRecord(event, stream));
  EXPECT_CU(cuEventRecord(other_event, other_stream));

  // Waits across contexts (and devices) are allowed, as are queries.
  EXPECT_CU(cuStreamWaitEvent(stream, other_event, 0));
  EXPECT_CU(cuStreamWaitEvent(other_stream, event, 0));
  EXPECT_CU(cuEventSynchronize(other_event));
  EXPECT_CU(cuEventQuery(other_event));

  // A copy on another context's stream is allowed.
  const char text[] = "cross-context";
  ASSERT_CU(cuMemcpyHtoD_v2(buf, text, sizeof(text)));
  ASSERT_CU(cuMemcpyDtoDAsync_v2(other_buf, buf, sizeof(text), other_stream));
  ASSERT_CU(cuStreamSynchronize(other_stream));
  char back[sizeof(text)] = {};
  ASSERT_CU(cuMemcpyDtoH_v2(back, other_buf, sizeof(text)));
  EXPECT_STREQ(back, text);

  // A launch must be on a stream of the current context.
  CUfunction mixed = Function("_ZN5testk5mixedEcPds4Pair");
  CUdeviceptr out;
  ASSERT_CU(cuMemAlloc_v2(&out, 4 * sizeof(double)));
  char c = 1;
  short sh = 2;
  struct {
    int a;
    double b;
  } pair{3, 4};
  void* params[] = {&c, &out, &sh, &pair};
  EXPECT_EQ(cuLaunchKernel(mixed, 1, 1, 1, 1, 1, 1, 0, other_stream, params, nullptr),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_CU(cuLaunchKernel(mixed, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr));
  ASSERT_CU(cuStreamSynchronize(stream));

  ASSERT_CU(cuMemFree_v2(out));
  ASSERT_CU(cuMemFree_v2(buf));
  ASSERT_CU(cuMemFree_v2(other_buf));
  ASSERT_CU(cuEventDestroy_v2(event));
  ASSERT_CU(cuEventDestroy_v2(other_event));
  ASSERT_CU(cuStreamDestroy_v2(stream));
  ASSERT_CU(cuStreamDestroy_v2(other_stream));
  ASSERT_CU(cuDevicePrimaryCtxRelease(1));
}

TEST_F(FakeCudaTest, EventsMeasureElapsedTime) {
  CUfunction fill = Function("_ZN5testk9slow_fillEPiiii");
  CUevent start, stop, untimed;
  ASSERT_CU(cuEventCreate(&start, 0));
  ASSERT_CU(cuEventCreate(&stop, 0));
  ASSERT_CU(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
  float ms = 0;
  EXPECT_EQ(cuEventElapsedTime_v2(&ms, start, stop), CUDA_ERROR_INVALID_HANDLE);
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, 4));
  int value = 1, n = 1, delay = 20;
  void* params[] = {&d, &value, &n, &delay};
  ASSERT_CU(cuEventRecord(start, nullptr));
  ASSERT_CU(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  ASSERT_CU(cuEventRecord(stop, nullptr));
  ASSERT_CU(cuEventRecord(untimed, nullptr));
  ASSERT_CU(cuEventSynchronize(stop));
  ASSERT_CU(cuEventElapsedTime_v2(&ms, start, stop));
  EXPECT_GE(ms, 19.0f);  // at least the kernel's sleep
  EXPECT_EQ(cuEventElapsedTime_v2(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);
  ASSERT_CU(cuMemFree_v2(d));
}

TEST_F(FakeCudaTest, LegacyStreamWaitsForBlockingStreamsOnly) {
  CUstream blocking, nonblocking;
  ASSERT_CU(cuStreamCreate(&blocking, 0));
  ASSERT_CU(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, 4));
  void* pinned;
  ASSERT_CU(cuMemAllocHost_v2(&pinned, 4));

  Gate held_nb;
  ASSERT_CU(cuLaunchHostFunc(nonblocking, &Gate::Wait, &held_nb));
  // The legacy stream does not wait for a non-blocking stream.
  ASSERT_CU(cuMemsetD32_v2(d, 3, 1));

  Gate held_b;
  ASSERT_CU(cuLaunchHostFunc(blocking, &Gate::Wait, &held_b));
  ASSERT_CU(cuMemcpyDtoHAsync_v2(pinned, d, 4, nullptr));
  EXPECT_EQ(cuStreamQuery(nullptr), CUDA_ERROR_NOT_READY);  // behind `blocking`
  held_b.Open();
  ASSERT_CU(cuStreamSynchronize(nullptr));
  EXPECT_EQ(*static_cast<int*>(pinned), 3);
  held_nb.Open();
  ASSERT_CU(cuStreamDestroy_v2(blocking));
  ASSERT_CU(cuStreamDestroy_v2(nonblocking));
  ASSERT_CU(cuMemFreeHost(pinned));
  ASSERT_CU(cuMemFree_v2(d));
}

TEST_F(FakeCudaTest, PerThreadDefaultStreamsAreSeparatePerThread) {
  void* pinned;
  ASSERT_CU(cuMemAllocHost_v2(&pinned, 4));
  CUdeviceptr d;
  ASSERT_CU(cuMemAlloc_v2(&d, 4));
  // Hold this thread's per-thread stream (stream 0 through a _ptsz entry).
  Gate held;
  ASSERT_CU(Sym<decltype(&cuLaunchHostFunc)>("cuLaunchHostFunc_ptsz")(nullptr, &Gate::Wait, &held));
  EXPECT_EQ(cuStreamQuery(CU_STREAM_PER_THREAD), CUDA_ERROR_NOT_READY);
  // Another thread's per-thread stream is a different stream: its
  // synchronous work completes (this would hang if the stream were shared).
  int seen = 0;
  std::thread other([&] {
    cuCtxSetCurrent(ctx_);
    Sym<decltype(&cuMemsetD32_v2)>("cuMemsetD32_v2_ptds")(d, 9, 1);
    Sym<decltype(&cuMemcpyDtoH_v2)>("cuMemcpyDtoH_v2_ptds")(&seen, d, 4);
  });
  other.join();
  EXPECT_EQ(seen, 9);
  // A per-thread stream is blocking: the legacy stream waits for it.
  ASSERT_CU(cuMemcpyDtoHAsync_v2(pinned, d, 4, nullptr));
  EXPECT_EQ(cuStreamQuery(nullptr), CUDA_ERROR_NOT_READY);
  held.Open();
  ASSERT_CU(cuStreamSynchronize(nullptr));
  EXPECT_EQ(*static_cast<int*>(pinned), 9);
  ASSERT_CU(cuMemFreeHost(pinned));
  ASSERT_CU(cuMemFree_v2(d));
}

TEST_F(FakeCudaTest, ProcAddressMapsNameVersionAndFlagsToTheAbi) {
  void* self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(self, nullptr);
  struct Case {
    const char* name;
    int version;
    cuuint64_t flags;
    const char* symbol;
  } cases[] = {
      {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
      {"cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAlloc_v2"},
      {"cuLaunchKernel", 12000, 0, "cuLaunchKernel"},
      {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuLaunchKernel_ptsz"},
      {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuLaunchKernel"},
      {"cuMemcpy", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemcpy_ptds"},
      {"cuMemcpyHtoD", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuMemcpyHtoD_v2_ptds"},
      {"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"},
      {"cuCtxCreate", 13000, 0, "cuCtxCreate_v4"},
      {"cuEventElapsedTime", 12000, 0, "cuEventElapsedTime"},
      {"cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2"},
      {"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"},
      {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
      {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
      {"cuCtxSynchronize", 12000, 0, "cuCtxSynchronize"},
      {"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2"},
      {"cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2"},
      {"cuStreamGetCtx", 12050, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuStreamGetCtx_v2_ptsz"},
  };
  for (const Case& c : cases) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status;
    ASSERT_CU(cuGetProcAddress_v2(c.name, &fn, c.version, c.flags, &status))
        << c.name << " @" << c.version;
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    EXPECT_EQ(fn, dlsym(self, c.symbol)) << c.name << " @" << c.version;
    void* fn4 = nullptr;
    ASSERT_CU(Sym<GetProcAddress4>("cuGetProcAddress")(c.name, &fn4, c.version, c.flags));
    EXPECT_EQ(fn4, fn);
  }
  // The per-thread flag before an entry point had a per-thread variant: not
  // found, not the legacy-stream one. Not found is CUDA_SUCCESS with a null
  // pointer and the reason in the status for cuGetProcAddress_v2,
  // CUDA_ERROR_NOT_FOUND for the 4-argument form (driver 580 on an H200
  // answers so).
  auto get4 = Sym<GetProcAddress4>("cuGetProcAddress");
  for (auto [name, version] :
       {std::pair{"cuMemcpy", 4000}, {"cuMemsetD8", 3020}, {"cuStreamSynchronize", 2000}}) {
    void* fn = reinterpret_cast<void*>(1);
    CUdriverProcAddressQueryResult status;
    EXPECT_EQ(cuGetProcAddress_v2(name, &fn, version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                                  &status),
              CUDA_SUCCESS)
        << name;
    EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) << name;
    EXPECT_EQ(fn, nullptr) << name;
    fn = reinterpret_cast<void*>(1);
    EXPECT_EQ(get4(name, &fn, version, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
              CUDA_ERROR_NOT_FOUND)
        << name;
    EXPECT_EQ(fn, nullptr) << name;
  }
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status;
  EXPECT_EQ(cuGetProcAddress_v2("cuNoSuchEntryPoint", &fn, 13000, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(get4("cuNoSuchEntryPoint", &fn, 13000, 0), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(cuGetProcAddress_v2("cuMemAllocAsync", &fn, 10000, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(get4("cuMemAllocAsync", &fn, 10000, 0), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 4, &status), CUDA_ERROR_INVALID_VALUE);
  dlclose(self);
}

TEST_F(FakeCudaTest, ModulesReportNamesAndParameterLayouts) {
  CUmodule bad;
  EXPECT_EQ(cuModuleLoad(&bad, "/nonexistent/module.so"), CUDA_ERROR_FILE_NOT_FOUND);
  EXPECT_EQ(cuModuleLoad(&bad, "/etc/hostname"), CUDA_ERROR_INVALID_IMAGE);

  struct Expect {
    const char* name;
    std::vector<std::pair<size_t, size_t>> params;  // (offset, size)
  } kernels[] = {
      {"_ZN5testk4axpyEfPKfPfi", {{0, 4}, {8, 8}, {16, 8}, {24, 4}}},
      {"_ZN5testk5mixedEcPds4Pair", {{0, 1}, {8, 8}, {16, 2}, {24, 16}}},
      {"_ZN5testk5scaleIfEEvPT_S1_i", {{0, 8}, {8, 4}, {12, 4}}},
      {"_ZN5testk5scaleIdEEvPT_S1_i", {{0, 8}, {8, 8}, {16, 4}}},
      {"_ZN5testk13load_indirectEPKPKfPf", {{0, 8}, {8, 8}}},
      {"plain_c_kernel", {{0, 8}}},
  };
  for (const Expect& k : kernels) {
    CUfunction f = Function(k.name);
    ASSERT_NE(f, nullptr) << k.name;
    const char* name = nullptr;
    ASSERT_CU(cuFuncGetName(&name, f));
    EXPECT_STREQ(name, k.name);
    size_t i = 0;
    for (;; ++i) {
      size_t offset = 0, size = 0;
      CUresult r = cuFuncGetParamInfo(f, i, &offset, &size);
      if (r == CUDA_ERROR_INVALID_VALUE) break;
      ASSERT_CU(r);
      ASSERT_LT(i, k.params.size()) << k.name;
      EXPECT_EQ(offset, k.params[i].first) << k.name << " param " << i;
      EXPECT_EQ(size, k.params[i].second) << k.name << " param " << i;
    }
    EXPECT_EQ(i, k.params.size()) << k.name;
  }
  CUfunction missing;
  EXPECT_EQ(cuModuleGetFunction(&missing, module_, "_Z4nopev"), CUDA_ERROR_NOT_FOUND);
}

// After cuModuleUnload a function handle is invalid until the driver hands
// it out again: the next module loaded gets the unloaded one's handles (all
// eight kernels of test_kernels.so are listed).
TEST_F(FakeCudaTest, UnloadedFunctionHandlesAreInvalidThenReused) {
  const char* kNames[] = {"_ZN5testk4axpyEfPKfPfi",           "_ZN5testk5mixedEcPds4Pair",
                          "_ZN5testk5scaleIfEEvPT_S1_i",      "_ZN5testk5scaleIdEEvPT_S1_i",
                          "_ZN5testk13load_indirectEPKPKfPf", "plain_c_kernel",
                          "_ZN5testk9slow_fillEPiiii",        "_ZN5testk15record_geometryEPj"};
  auto handles = [&](CUmodule m) {
    std::set<CUfunction> all;
    for (const char* name : kNames) {
      CUfunction f = nullptr;
      EXPECT_CU(cuModuleGetFunction(&f, m, name));
      all.insert(f);
    }
    return all;
  };
  CUmodule first = nullptr;
  ASSERT_CU(cuModuleLoad(&first, kModule));
  std::set<CUfunction> before = handles(first);
  CUfunction stale = *before.begin();
  ASSERT_CU(cuModuleUnload(first));

  const char* name = nullptr;
  EXPECT_EQ(cuFuncGetName(&name, stale), CUDA_ERROR_INVALID_HANDLE);
  size_t offset = 0, size = 0;
  EXPECT_EQ(cuFuncGetParamInfo(stale, 0, &offset, &size), CUDA_ERROR_INVALID_HANDLE);
  CUmodule owner = nullptr;
  EXPECT_EQ(cuFuncGetModule(&owner, stale), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuLaunchKernel(stale, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr),
            CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuModuleUnload(first), CUDA_ERROR_INVALID_HANDLE);

  CUmodule second = nullptr;
  ASSERT_CU(cuModuleLoad(&second, kModule));
  EXPECT_EQ(handles(second), before);
  ASSERT_CU(cuFuncGetName(&name, stale));  // valid again, for some kernel
  ASSERT_CU(cuFuncGetModule(&owner, stale));
  EXPECT_EQ(owner, second);
  ASSERT_CU(cuModuleUnload(second));
}

// cuModuleLoadData takes a host-kernel module's bytes (what cuModuleLoad
// opens from a file); any other image, a cubin included, is invalid.
TEST_F(FakeCudaTest, ModuleLoadDataTakesAHostKernelModuleImage) {
  FILE* file = std::fopen(kModule, "rb");
  ASSERT_NE(file, nullptr);
  std::vector<char> image;
  char chunk[4096];
  for (size_t n; (n = std::fread(chunk, 1, sizeof(chunk), file)) > 0;) {
    image.insert(image.end(), chunk, chunk + n);
  }
  std::fclose(file);
  // Two loads of one image are two modules, as with the real driver.
  CUmodule a = nullptr, b = nullptr;
  ASSERT_CU(cuModuleLoadData(&a, image.data()));
  ASSERT_CU(cuModuleLoadData(&b, image.data()));
  EXPECT_NE(a, b);
  CUfunction fill = nullptr;
  ASSERT_CU(cuModuleGetFunction(&fill, a, "_ZN5testk9slow_fillEPiiii"));
  CUdeviceptr out;
  ASSERT_CU(cuMemAlloc_v2(&out, 4 * sizeof(int)));
  int value = 7, n = 4, delay = 0;
  void* params[] = {&out, &value, &n, &delay};
  ASSERT_CU(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  int got[4] = {};
  ASSERT_CU(cuMemcpyDtoH_v2(got, out, sizeof(got)));
  EXPECT_EQ(got[3], 7);
  ASSERT_CU(cuMemFree_v2(out));
  ASSERT_CU(cuModuleUnload(a));
  ASSERT_CU(cuModuleUnload(b));

  unsigned char cubin[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
  cubin[16] = 2;    // ET_EXEC
  cubin[18] = 190;  // EM_CUDA
  CUmodule m = nullptr;
  EXPECT_EQ(cuModuleLoadData(&m, cubin), CUDA_ERROR_INVALID_IMAGE);
  const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n";
  EXPECT_EQ(cuModuleLoadData(&m, ptx), CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(cuModuleLoadData(&m, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuModuleLoadData(nullptr, image.data()), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeCudaTest, LaunchesPassParametersBothWays) {
  CUfunction mixed = Function("_ZN5testk5mixedEcPds4Pair");
  CUdeviceptr out;
  ASSERT_CU(cuMemAlloc_v2(&out, 4 * sizeof(double)));
  char c = 3;
  short s = -4;
  struct {
    int a;
    double b;
  } pair{5, 6.5};
  void* params[] = {&c, &out, &s, &pair};
  ASSERT_CU(cuLaunchKernel(mixed, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  double got[4];
  ASSERT_CU(cuMemcpyDtoH_v2(got, out, sizeof(got)));
  EXPECT_EQ(got[0], 3);
  EXPECT_EQ(got[1], -4);
  EXPECT_EQ(got[2], 5);
  EXPECT_EQ(got[3], 6.5);

  // The `extra` form: one packed buffer in the kernel's layout.
  unsigned char buffer[40] = {};
  c = 1;
  std::memcpy(buffer + 0, &c, 1);
  std::memcpy(buffer + 8, &out, 8);
  std::memcpy(buffer + 16, &s, 2);
  pair.a = 8;
  std::memcpy(buffer + 24, &pair, 16);
  size_t size = sizeof(buffer);
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  ASSERT_CU(cuLaunchKernel(mixed, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra));
  ASSERT_CU(cuMemcpyDtoH_v2(got, out, sizeof(got)));
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[2], 8);

  EXPECT_EQ(cuLaunchKernel(mixed, 1, 1, 1, 1, 1, 1, 0, nullptr, params, extra),
            CUDA_ERROR_INVALID_VALUE);
  // The size must be the parameters' exactly (driver 580 on an H200 refused
  // a struct's tail padding with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES).
  for (size_t wrong : {sizeof(buffer) + 8, sizeof(buffer) - 8}) {
    size = wrong;
    EXPECT_EQ(cuLaunchKernel(mixed, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, extra),
              CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
        << wrong;
  }
  // An `extra` of only its end is none: with kernelParams the kernel runs
  // (as on that GPU), alone it is no parameters.
  void* end_only[] = {CU_LAUNCH_PARAM_END};
  c = 9;
  ASSERT_CU(cuLaunchKernel(mixed, 1, 1, 1, 1, 1, 1, 0, nullptr, params, end_only));
  ASSERT_CU(cuMemcpyDtoH_v2(got, out, sizeof(got)));
  EXPECT_EQ(got[0], 9);
  EXPECT_EQ(cuLaunchKernel(mixed, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, end_only),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(mixed, 0, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(mixed, 1, 1, 1, 1025, 1, 1, 0, nullptr, params, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(reinterpret_cast<CUfunction>(&got), 1, 1, 1, 1, 1, 1, 0, nullptr, params,
                           nullptr),
            CUDA_ERROR_INVALID_HANDLE);

  CUfunction geometry = Function("_ZN5testk15record_geometryEPj");
  CUlaunchConfig config{};
  config.gridDimX = 7;
  config.gridDimY = 2;
  config.gridDimZ = 1;
  config.blockDimX = 128;
  config.blockDimY = 1;
  config.blockDimZ = 4;
  void* gparams[] = {&out};
  ASSERT_CU(cuLaunchKernelEx(&config, geometry, gparams, nullptr));
  unsigned dims[4];
  ASSERT_CU(cuMemcpyDtoH_v2(dims, out, sizeof(dims)));
  EXPECT_EQ(dims[0], 7u);
  EXPECT_EQ(dims[1], 2u);
  EXPECT_EQ(dims[2], 128u);
  EXPECT_EQ(dims[3], 4u);
  ASSERT_CU(cuMemFree_v2(out));
}

TEST_F(FakeCudaTest, KernelsReadThroughPointersStoredInDeviceMemory) {
  CUfunction load = Function("_ZN5testk13load_indirectEPKPKfPf");
  CUdeviceptr value, table, out;
  ASSERT_CU(cuMemAlloc_v2(&value, 4));
  ASSERT_CU(cuMemAlloc_v2(&table, 8));
  ASSERT_CU(cuMemAlloc_v2(&out, 4));
  float v = 2.5f;
  ASSERT_CU(cuMemcpyHtoD_v2(value, &v, 4));
  ASSERT_CU(cuMemcpyHtoD_v2(table, &value, 8));
  void* params[] = {&table, &out};
  ASSERT_CU(cuLaunchKernel(load, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  float got = 0;
  ASSERT_CU(cuMemcpyDtoH_v2(&got, out, 4));
  EXPECT_EQ(got, 2.5f);
}

TEST_F(FakeCudaTest, FaultInjectionFailsTheNthCall) {
  fakecuda_fail_call("cuMemAlloc_v2", 2, CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr a, b, c;
  EXPECT_CU(cuMemAlloc_v2(&a, 64));
  EXPECT_EQ(cuMemAlloc_v2(&b, 64), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_CU(cuMemAlloc_v2(&c, 64));
  EXPECT_GE(fakecuda_call_count("cuMemAlloc_v2"), 3u);
  cuMemFree_v2(a);
  cuMemFree_v2(c);
  fakecuda_clear_failures();
}

TEST_F(FakeCudaTest, ErrorNamesAndStrings) {
  const char* s = nullptr;
  ASSERT_CU(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
  EXPECT_STREQ(s, "CUDA_ERROR_OUT_OF_MEMORY");
  ASSERT_CU(cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &s));
  EXPECT_STREQ(s, "invalid argument");
  EXPECT_EQ(cuGetErrorName(static_cast<CUresult>(123456), &s), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(s, nullptr);
}

TEST_F(FakeCudaTest, CreatedContextsStackAndSynchronise) {
  CUcontext created = nullptr, current = nullptr;
  ASSERT_CU(cuCtxCreate_v4(&created, nullptr, 0, 1));
  ASSERT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, created);
  CUdevice d = -1;
  ASSERT_CU(cuCtxGetDevice(&d));
  EXPECT_EQ(d, 1);
  CUdeviceptr p;
  ASSERT_CU(cuMemAlloc_v2(&p, 4096));
  EXPECT_EQ(fakecuda_used_bytes(1), 4096u);
  ASSERT_CU(cuMemFree_v2(p));
  CUcontext popped = nullptr;
  ASSERT_CU(cuCtxPopCurrent_v2(&popped));
  EXPECT_EQ(popped, created);
  ASSERT_CU(cuCtxGetCurrent(&current));
  EXPECT_EQ(current, ctx_);
  ASSERT_CU(cuCtxDestroy_v2(created));
  EXPECT_EQ(cuCtxPushCurrent_v2(created), CUDA_ERROR_INVALID_CONTEXT);
}

}  // namespace

namespace {

// cuPointerGetAttribute with the driver's answers for each kind of memory:
// cuMemAlloc (range as requested, IPC-capable), VMM (range of the
// reservation, not IPC-capable), page-locked host memory, and unknown
// pointers (CUDA_ERROR_INVALID_VALUE; the plural form fills in zeros).
TEST_F(FakeCudaTest, PointerAttributesDescribeEachKindOfMemory) {
  CUdeviceptr a = 0;
  ASSERT_CU(cuMemAlloc(&a, 5000));
  unsigned int type = 0, ipc = 0, mapped = 0, managed = 7;
  int ordinal = -1;
  CUdeviceptr start = 0, dptr = 0;
  size_t size = 0;
  CUcontext ctx = nullptr;
  unsigned long long id = 0, id2 = 0;
  void* host = nullptr;
  EXPECT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 10));
  EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
  EXPECT_CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, a + 4999));
  EXPECT_CU(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a + 10));
  EXPECT_EQ(start, a);
  EXPECT_EQ(size, 5000u);
  EXPECT_CU(cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, a));
  EXPECT_EQ(ctx, ctx_);
  EXPECT_CU(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a));
  EXPECT_EQ(ordinal, 0);
  EXPECT_CU(cuPointerGetAttribute(&dptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, a + 8));
  EXPECT_EQ(dptr, a + 8);
  EXPECT_CU(cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, a));
  EXPECT_EQ(ipc, 1u);
  EXPECT_CU(cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, a));
  EXPECT_EQ(mapped, 1u);
  EXPECT_CU(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, a));
  EXPECT_EQ(managed, 0u);
  EXPECT_CU(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, a));
  EXPECT_EQ(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, a),
            CUDA_ERROR_INVALID_VALUE);
  // Past the requested size (inside the page the fake rounded it to).
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 5000),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemFree(a));
  // Ids are never reused.
  ASSERT_CU(cuMemAlloc(&a, 5000));
  EXPECT_CU(cuPointerGetAttribute(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, a));
  EXPECT_NE(id, id2);
  ASSERT_CU(cuMemFree(a));

  // VMM: the range is the reservation; not IPC-capable.
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  ASSERT_CU(cuMemAddressReserve(&va, 2 * kGranule, 0, 0, 0));
  MapAt(va, 1, &h);
  EXPECT_CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + 100));
  EXPECT_CU(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, va + 100));
  EXPECT_EQ(start, va);
  EXPECT_EQ(size, 2 * kGranule);
  EXPECT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va));
  EXPECT_EQ(type, CU_MEMORYTYPE_DEVICE);
  EXPECT_CU(cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, va));
  EXPECT_EQ(ipc, 0u);
  EXPECT_CU(cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, va + kGranule));
  EXPECT_EQ(mapped, 0u);  // reserved, not mapped
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + kGranule),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemUnmap(va, kGranule));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, 2 * kGranule));

  // Page-locked host memory is its own host and device address.
  void* pinned = nullptr;
  ASSERT_CU(cuMemAllocHost(&pinned, 100));
  CUdeviceptr hp = reinterpret_cast<CUdeviceptr>(pinned);
  EXPECT_CU(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, hp));
  EXPECT_EQ(type, CU_MEMORYTYPE_HOST);
  EXPECT_CU(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, hp + 4));
  EXPECT_EQ(host, static_cast<char*>(pinned) + 4);
  EXPECT_CU(cuPointerGetAttribute(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, hp));
  EXPECT_EQ(ipc, 0u);

  // Unknown pointers: an error from the singular form; zeros and success
  // from the plural one.
  std::vector<char> plain(64);
  CUdeviceptr unknown = reinterpret_cast<CUdeviceptr>(plain.data());
  EXPECT_EQ(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, unknown),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, unknown),
            CUDA_ERROR_INVALID_VALUE);
  type = 5;
  start = 5;
  ctx = reinterpret_cast<CUcontext>(5);
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_CONTEXT};
  void* data[] = {&type, &start, &ctx};
  EXPECT_CU(cuPointerGetAttributes(3, attrs, data, unknown));
  EXPECT_EQ(type, 0u);
  EXPECT_EQ(start, 0u);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_CU(cuPointerGetAttributes(3, attrs, data, hp));
  EXPECT_EQ(type, CU_MEMORYTYPE_HOST);
  EXPECT_EQ(start, hp);
  EXPECT_EQ(ctx, ctx_);
  EXPECT_EQ(cuPointerGetAttribute(&type, static_cast<CUpointer_attribute>(99), hp),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemFreeHost(pinned));
}

// cuIpcGetMemHandle: cuMemAlloc memory, at its base or inside it (driver 580
// on an H200), the allocation's handle; VMM memory, stream-ordered memory
// and past the requested end are refused, as by the driver.
// cuMemExportToShareableHandle: only the types requested at cuMemCreate.
TEST_F(FakeCudaTest, InterprocessHandlesFollowTheDriversRules) {
  CUdeviceptr a = 0;
  ASSERT_CU(cuMemAlloc(&a, kGranule));
  CUipcMemHandle ipc{}, ipc2{};
  EXPECT_CU(cuIpcGetMemHandle(&ipc, a));
  CUipcMemHandle inside{};
  EXPECT_CU(cuIpcGetMemHandle(&inside, a + 64));
  EXPECT_EQ(std::memcmp(&ipc, &inside, sizeof(ipc)), 0);
  EXPECT_EQ(cuIpcGetMemHandle(nullptr, a), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemFree(a));
  ASSERT_CU(cuMemAlloc(&a, kGranule));
  EXPECT_CU(cuIpcGetMemHandle(&ipc2, a));
  // New memory at the same address gets a new handle.
  EXPECT_NE(std::memcmp(&ipc, &ipc2, sizeof(ipc)), 0);
  ASSERT_CU(cuMemFree(a));

  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = MapNew(1, &h);
  EXPECT_EQ(cuIpcGetMemHandle(&ipc, va), CUDA_ERROR_INVALID_VALUE);
  int fd = -1;
  EXPECT_EQ(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_INVALID_VALUE);  // not requested at creation
  ASSERT_CU(cuMemUnmap(va, kGranule));
  ASSERT_CU(cuMemRelease(h));
  ASSERT_CU(cuMemAddressFree(va, kGranule));

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  ASSERT_CU(cuMemCreate(&h, kGranule, &prop, 0));
  EXPECT_CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT_GE(fd, 0);
  if (fd >= 0) close(fd);
  EXPECT_EQ(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
            CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuMemRelease(h));
}

// A freed allocation's range stays unmapped when later frees move their
// pages away (each onto a placeholder the kernel places): a stale pointer
// into it must fault, never read another allocation's freed pages.
TEST_F(FakeCudaTest, FreedRangeStaysUnmappedWhenLaterPagesAreFreed) {
  const size_t n = 3 * kGranule + 4096;
  CUdeviceptr first = 0, second = 0, third = 0;
  ASSERT_CU(cuMemAlloc_v2(&first, n));
  ASSERT_CU(cuMemFree_v2(first));        // first's pages move to T1; first unmapped
  ASSERT_CU(cuMemAlloc_v2(&second, n));  // takes T1
  ASSERT_CU(cuMemAlloc_v2(&third, n));   // fresh
  ASSERT_CU(cuMemsetD8_v2(third, 0x5c, n));
  ASSERT_CU(cuCtxSynchronize());
  ASSERT_CU(cuMemFree_v2(third));  // its pages move to a placeholder: where?
  unsigned char vec = 0;
  // mincore fails with ENOMEM on an unmapped range.
  bool mapped = mincore(reinterpret_cast<void*>(first & ~uintptr_t{4095}), 4096, &vec) == 0;
  bool readable = false;
  if (FILE* maps = std::fopen("/proc/self/maps", "r")) {
    unsigned long lo, hi;
    char perms[8];
    while (std::fscanf(maps, "%lx-%lx %7s%*[^\n]", &lo, &hi, perms) == 3) {
      if (first >= lo && first < hi) readable = perms[0] == 'r';
    }
    std::fclose(maps);
  }
  bool holds_third = readable && reinterpret_cast<volatile unsigned char*>(first)[0] == 0x5c;
  EXPECT_FALSE(mapped) << "the freed range of `first` is mapped again"
                       << (holds_third ? " and holds the freed pages of `third`" : "");
  ASSERT_CU(cuMemFree_v2(second));
}

// Null and empty arguments that driver 580 on an H200 accepted
// (tests/gpu/driver_580_h200.answers), and the P2P-token attribute.
TEST_F(FakeCudaTest, NullAndEmptyArgumentsAsTheDriverAnswers) {
  EXPECT_CU(cuMemFree_v2(0));
  EXPECT_CU(cuMemFreeAsync(0, nullptr));
  EXPECT_CU(cuMemFreeHost(nullptr));
  CUdeviceptr p = 1;
  EXPECT_CU(cuMemAllocAsync(&p, 0, nullptr));
  EXPECT_EQ(p, 0u);
  EXPECT_EQ(cuMemAllocAsync(nullptr, 0, nullptr), CUDA_ERROR_INVALID_VALUE);
  void* h = &h;
  EXPECT_CU(cuMemHostAlloc(&h, 0, 0));
  EXPECT_EQ(h, nullptr);
  EXPECT_EQ(cuMemAlloc_v2(&p, 0), CUDA_ERROR_INVALID_VALUE);
  size_t free_bytes = 0, total = 0;
  EXPECT_CU(cuMemGetInfo_v2(nullptr, &total));
  EXPECT_GT(total, 0u);
  EXPECT_CU(cuMemGetInfo_v2(&free_bytes, nullptr));
  EXPECT_GT(free_bytes, 0u);
  EXPECT_CU(cuMemGetInfo_v2(nullptr, nullptr));

  // Peer copies with null contexts copy; 3D with an array type and no array
  // is refused as a bad value.
  CUdeviceptr a = 0, b = 0;
  ASSERT_CU(cuMemAlloc(&a, 4096));
  ASSERT_CU(cuMemAlloc(&b, 4096));
  EXPECT_EQ(cuMemUnmap(a, 4096), CUDA_ERROR_INVALID_VALUE);  // no reservation
  ASSERT_CU(cuMemsetD8_v2(b, 7, 4096));
  EXPECT_CU(cuMemcpyPeer(a, nullptr, b, nullptr, 16));
  unsigned char got[16] = {};
  ASSERT_CU(cuMemcpyDtoH_v2(got, a, sizeof(got)));
  EXPECT_EQ(got[15], 7);
  CUDA_MEMCPY3D q{};
  q.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  q.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  q.dstDevice = a;
  q.WidthInBytes = q.Height = q.Depth = 1;
  EXPECT_EQ(cuMemcpy3D_v2(&q), CUDA_ERROR_INVALID_VALUE);

  // P2P tokens: cuMemAlloc memory only (VMM memory refused, as on that GPU);
  // the plural form refuses the attribute, and no attributes, outright.
  CUDA_POINTER_ATTRIBUTE_P2P_TOKENS tokens{};
  EXPECT_CU(cuPointerGetAttribute(&tokens, CU_POINTER_ATTRIBUTE_P2P_TOKENS, a + 8));
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr va = MapNew(1, &handle);
  EXPECT_EQ(cuPointerGetAttribute(&tokens, CU_POINTER_ATTRIBUTE_P2P_TOKENS, va),
            CUDA_ERROR_INVALID_VALUE);
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_P2P_TOKENS, CU_POINTER_ATTRIBUTE_MAPPED};
  int mapped = -1;
  void* data[] = {&tokens, &mapped};
  EXPECT_EQ(cuPointerGetAttributes(2, attrs, data, a), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuPointerGetAttributes(2, attrs, data, 0x1000), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(mapped, -1);
  EXPECT_EQ(cuPointerGetAttributes(0, attrs + 1, data + 1, a), CUDA_ERROR_INVALID_VALUE);
  EXPECT_CU(cuPointerGetAttributes(1, attrs + 1, data + 1, a));
  EXPECT_EQ(mapped, 1);
  ASSERT_CU(cuMemUnmap(va, kGranule));
  ASSERT_CU(cuMemRelease(handle));
  ASSERT_CU(cuMemAddressFree(va, kGranule));
  ASSERT_CU(cuMemFree(a));
  ASSERT_CU(cuMemFree(b));
}

}  // namespace
