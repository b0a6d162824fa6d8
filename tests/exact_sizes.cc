// A driver-API program that checks what a program sees of its buffers, run
// with and without stensor (and a cap): the same answers as from the driver
// for cuMemAlloc memory, whatever stensor does behind them.
//
//   exact_sizes bounds   overruns of copies and memsets (1D, 2D, async) are
//                        CUDA_ERROR_INVALID_VALUE, in-range ones work; address
//                        range and pointer attributes give the requested size,
//                        resident and swapped out; SIZE_MAX is out of memory;
//                        cuMemFreeAsync frees in stream order.
//   exact_sizes vmm      maps up to 32 MiB of its own VMM memory: prints
//                        `created N` (how many 2 MiB handles it got before
//                        CUDA_ERROR_OUT_OF_MEMORY) and checks its buffers' data.
//   exact_sizes pin      hands buffers out through cuIpcGetMemHandle and
//                        cuMemRetainAllocationHandle (+ export), prints
//                        `pinned ipc 0x.. retain 0x..`, then churns the others
//                        through the cap and checks every byte.
// Under a cap (STENSOR_MEMORY_LIMIT set) the answers stensor cannot make the
// driver's (IPC on VMM memory) are checked as documented in docs/limits.md.
// On the fake driver, fakecuda_used_bytes tells where buffers are. Exits 0
// when every check held, else prints each failure.
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/driver_check.h"

namespace {

using stensor_tests::failures;

#define EXPECT_RC(call, want)                                                             \
  do {                                                                                    \
    CUresult r_ = (call);                                                                 \
    if (r_ != (want)) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s returned %d, want %d\n", __FILE__, __LINE__, #call, \
                   static_cast<int>(r_), static_cast<int>(want));                         \
      ++failures;                                                                         \
    }                                                                                     \
  } while (0)

constexpr size_t kGranule = 2u << 20;
const bool kCapped = std::getenv("STENSOR_MEMORY_LIMIT") != nullptr;
// Host-located VMM (the fake's default): an allocation of two granules is
// two pieces, swapped out one at a time.
const bool kPieces = std::getenv("FAKECUDA_HOST_VMM") == nullptr ||
                     std::string(std::getenv("FAKECUDA_HOST_VMM")) != "0";

// The fake's device memory in use (0 on a real driver, which has no such call).
// The fake's device memory in use. Asked what is free first, stensor hands
// its idle pooled chunks back to the driver, so what is left is the memory
// buffers hold (chunks freed by one buffer otherwise wait in the pool for
// the next, whatever its size).
size_t DeviceUsed() {
  size_t free_bytes = 0, total = 0;
  CHECK(cuMemGetInfo(&free_bytes, &total));
  using Fn = size_t (*)(int);
  static Fn fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "fakecuda_used_bytes"));
  return fn != nullptr ? fn(0) : 0;
}
bool OnFake() { return dlsym(RTLD_DEFAULT, "fakecuda_used_bytes") != nullptr; }

void Fill(CUdeviceptr p, size_t n, uint8_t seed) {
  std::vector<uint8_t> data(n);
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<uint8_t>(seed + i * 7);
  CHECK(cuMemcpyHtoD(p, data.data(), n));
}
bool Holds(CUdeviceptr p, size_t n, uint8_t seed) {
  std::vector<uint8_t> data(n);
  CHECK(cuMemcpyDtoH(data.data(), p, n));
  for (size_t i = 0; i < n; ++i) {
    if (data[i] != static_cast<uint8_t>(seed + i * 7)) {
      std::fprintf(stderr, "byte %zu of 0x%llx: %u, want %u\n", i,
                   static_cast<unsigned long long>(p), data[i], static_cast<uint8_t>(seed + i * 7));
      return false;
    }
  }
  return true;
}

// A host function holding its stream until Open().
struct Gate {
  std::atomic<bool> open{false};
  static void CUDA_CB Wait(void* self) {
    while (!static_cast<Gate*>(self)->open.load()) std::this_thread::yield();
  }
};

// The answers for a cuMemAlloc allocation of `size` bytes at `base`.
void CheckDescribes(CUdeviceptr base, size_t size, CUcontext ctx, const char* when) {
  std::fprintf(stderr, "checking the description of 0x%llx (%s)\n",
               static_cast<unsigned long long>(base), when);
  CUdeviceptr got_base = 0;
  size_t got_size = 0;
  CHECK(cuMemGetAddressRange(&got_base, &got_size, base + size - 1));
  EXPECT_TRUE(got_base == base);
  EXPECT_TRUE(got_size == size);
  EXPECT_RC(cuMemGetAddressRange(&got_base, &got_size, base + size), CUDA_ERROR_NOT_FOUND);

  unsigned int type = 0, mapped = 0, managed = 1;
  int ordinal = -1;
  CUcontext got_ctx = nullptr;
  CUdeviceptr start = 0, dptr = 0;
  size_t range = 0;
  void* host = nullptr;
  EXPECT_RC(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, base + 17),
            CUDA_SUCCESS);
  EXPECT_TRUE(type == CU_MEMORYTYPE_DEVICE);
  EXPECT_RC(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, base),
            CUDA_SUCCESS);
  EXPECT_TRUE(ordinal == 0);
  EXPECT_RC(cuPointerGetAttribute(&got_ctx, CU_POINTER_ATTRIBUTE_CONTEXT, base), CUDA_SUCCESS);
  EXPECT_TRUE(got_ctx == ctx);
  EXPECT_RC(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, base + size - 1),
            CUDA_SUCCESS);
  EXPECT_TRUE(start == base);
  EXPECT_RC(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, base + 1), CUDA_SUCCESS);
  EXPECT_TRUE(range == size);
  EXPECT_RC(cuPointerGetAttribute(&dptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, base + 5),
            CUDA_SUCCESS);
  EXPECT_TRUE(dptr == base + 5);
  EXPECT_RC(cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, base), CUDA_SUCCESS);
  EXPECT_TRUE(mapped == 1);
  EXPECT_RC(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, base), CUDA_SUCCESS);
  EXPECT_TRUE(managed == 0);
  EXPECT_RC(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, base),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_RC(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, base + size),
            CUDA_ERROR_INVALID_VALUE);  // past the end: no allocation

  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_CONTEXT};
  start = 0, range = 0, type = 0, ordinal = -1, got_ctx = nullptr;
  void* data[] = {&start, &range, &type, &ordinal, &got_ctx};
  EXPECT_RC(cuPointerGetAttributes(5, attrs, data, base + 3), CUDA_SUCCESS);
  EXPECT_TRUE(start == base && range == size && type == CU_MEMORYTYPE_DEVICE && ordinal == 0 &&
              got_ctx == ctx);
  // Past the end the plural form assigns zeros and succeeds.
  start = 1, range = 1, type = 1;
  EXPECT_RC(cuPointerGetAttributes(3, attrs, data, base + size), CUDA_SUCCESS);
  EXPECT_TRUE(start == 0 && range == 0 && type == 0);
}

// Every copy and memset form that runs past `size` bytes at `base` is
// refused and changes nothing; `other` is a 2 MiB buffer.
void CheckOverruns(CUdeviceptr base, size_t size, CUdeviceptr other, CUstream s) {
  std::vector<uint8_t> host(size + 4096, 0xEE);
  const CUresult kBad = CUDA_ERROR_INVALID_VALUE;
  EXPECT_RC(cuMemcpyHtoD(base, host.data(), size + 1), kBad);
  EXPECT_RC(cuMemcpyHtoD(base + size - 4, host.data(), 8), kBad);
  EXPECT_RC(cuMemcpyHtoD(base + size, host.data(), 1), kBad);  // starts past the end
  EXPECT_RC(cuMemcpyDtoH(host.data(), base, size + 1), kBad);
  EXPECT_RC(cuMemcpyDtoD(base + size - 8, other, 16), kBad);
  EXPECT_RC(cuMemcpyDtoD(other, base + size - 8, 16), kBad);
  EXPECT_RC(cuMemcpy(base, reinterpret_cast<CUdeviceptr>(host.data()), size + 1), kBad);
  EXPECT_RC(cuMemcpyHtoDAsync(base, host.data(), size + 1, s), kBad);
  EXPECT_RC(cuMemcpyDtoHAsync(host.data(), base + 1, size, s), kBad);
  EXPECT_RC(cuMemcpyDtoDAsync(other, base + size - 1, 2, s), kBad);
  CUcontext ctx = nullptr;
  CHECK(cuCtxGetCurrent(&ctx));
  EXPECT_RC(cuMemcpyPeer(base + 1, ctx, other, ctx, size), kBad);
  EXPECT_RC(cuMemcpyPeerAsync(other, ctx, base + size - 4, ctx, 8, s), kBad);
  EXPECT_RC(cuMemsetD8(base, 0, size + 1), kBad);
  EXPECT_RC(cuMemsetD8(base + size, 0, 1), kBad);
  EXPECT_RC(cuMemsetD32(base, 0, size / 4 + 1), kBad);
  EXPECT_RC(cuMemsetD16Async(base + size - 2, 0, 2, s), kBad);
  EXPECT_RC(cuMemsetD8Async(base, 0, size + 1, s), kBad);
  // 2D: rows of 1000 bytes, 1024 apart; 2049 rows end exactly at `size`
  // (2048 * 1024 + 1000 = 2 MiB + 1000), one byte wider does not.
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = host.data();
  c.srcPitch = 1024;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = base;
  c.dstPitch = 1024;
  c.WidthInBytes = 1001;
  c.Height = size / 1024 + 1;
  EXPECT_RC(cuMemcpy2D(&c), kBad);
  EXPECT_RC(cuMemcpy2DAsync(&c, s), kBad);
  c.WidthInBytes = 1000;
  c.dstY = 1;  // one row further down
  EXPECT_RC(cuMemcpy2D(&c), kBad);
  EXPECT_RC(cuMemsetD2D8(base, 1024, 0, 1001, size / 1024 + 1), kBad);
  EXPECT_RC(cuMemsetD2D32Async(base + 4, 1024, 0, 250, size / 1024 + 1, s), kBad);
  CUDA_MEMCPY3D d{};
  d.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  d.srcDevice = base;
  d.srcPitch = 1024;
  d.srcHeight = 1025;
  d.dstMemoryType = CU_MEMORYTYPE_HOST;
  d.dstHost = host.data();
  d.dstPitch = 1024;
  d.dstHeight = 1025;
  d.WidthInBytes = 1000;
  d.Height = 1025;
  d.Depth = 2;  // rows 0..2049 of 1024: two rows past the end
  EXPECT_RC(cuMemcpy3D(&d), kBad);
  CHECK(cuStreamSynchronize(s));
}

// The in-range counterparts of CheckOverruns' 2D forms work.
void CheckInRange(CUdeviceptr base, size_t size, CUstream s) {
  std::vector<uint8_t> host(size + 4096, 0x11);
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = host.data();
  c.srcPitch = 1024;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = base;
  c.dstPitch = 1024;
  c.WidthInBytes = 1000;
  c.Height = size / 1024 + 1;
  EXPECT_RC(cuMemcpy2D(&c), CUDA_SUCCESS);
  EXPECT_RC(cuMemcpy2DAsync(&c, s), CUDA_SUCCESS);
  EXPECT_RC(cuMemsetD2D8(base, 1024, 0, 1000, size / 1024 + 1), CUDA_SUCCESS);
  EXPECT_RC(cuMemsetD8Async(base, 3, size, s), CUDA_SUCCESS);
  EXPECT_RC(cuMemcpyHtoD(base + size - 8, host.data(), 8), CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(s));
}

int Bounds(CUcontext ctx) {
  const size_t size = kGranule + 1000;  // two granules reserved under a cap
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr x, y, z;
  CHECK(cuMemAlloc(&x, size));
  Fill(x, size, 1);
  CHECK(cuMemAlloc(&y, kGranule));
  Fill(y, kGranule, 2);
  CheckOverruns(x, size, y, s);
  EXPECT_TRUE(Holds(x, size, 1));
  EXPECT_TRUE(Holds(y, kGranule, 2));
  CheckDescribes(x, size, ctx, "resident");
  unsigned long long id = 0, id_later = 0;
  CHECK(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, x));

  // Under a cap of three granules, z pushes x (least recently used) out:
  // a granule of it where it is made of pieces, else both.
  size_t before = DeviceUsed();
  CHECK(cuMemAlloc(&z, kGranule));
  Fill(z, kGranule, 3);
  Fill(y, kGranule, 2);
  const size_t x_left = kPieces ? kGranule : 0;  // on the device
  if (kCapped && OnFake()) {
    EXPECT_TRUE(DeviceUsed() + kGranule == before + x_left);  // x's went, z's came
  }
  CheckDescribes(x, size, ctx, kCapped ? "swapped out" : "resident");
  CHECK(cuPointerGetAttribute(&id_later, CU_POINTER_ATTRIBUTE_BUFFER_ID, x + 100));
  EXPECT_TRUE(id == id_later);  // the same allocation, whatever its memory
  if (kCapped && OnFake()) {
    EXPECT_TRUE(DeviceUsed() + kGranule == before + x_left);  // still out
  }
  CheckOverruns(x, size, y, s);
  EXPECT_TRUE(Holds(x, size, 1));
  CheckInRange(x, size, s);

  // SIZE_MAX: out of memory, as the driver answers.
  CUdeviceptr huge = 0;
  EXPECT_RC(cuMemAlloc(&huge, SIZE_MAX), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_RC(cuMemAlloc(&huge, SIZE_MAX - kGranule + 2), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_RC(cuMemAllocAsync(&huge, SIZE_MAX, s), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_TRUE(huge == 0);

  // cuMemFreeAsync: released once the stream passed the free, not before.
  CHECK(cuMemFree(x));
  // x's memory settles first (its pooled chunk is handed back once seen
  // idle), so what changes below is f's alone.
  CHECK(cuCtxSynchronize());
  (void)DeviceUsed();
  CUdeviceptr f;
  CHECK(cuMemAlloc(&f, kGranule));
  Gate gate;
  CHECK(cuLaunchHostFunc(s, &Gate::Wait, &gate));
  CHECK(cuMemsetD8Async(f, 5, kGranule, s));
  size_t with_f = DeviceUsed();
  CHECK(cuMemFreeAsync(f, s));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  size_t free_bytes = 0, total = 0;
  CHECK(cuMemGetInfo(&free_bytes, &total));  // stensor collects garbage here
  if (OnFake()) EXPECT_TRUE(DeviceUsed() == with_f);
  gate.open.store(true);
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemGetInfo(&free_bytes, &total));
  if (OnFake()) EXPECT_TRUE(DeviceUsed() + kGranule == with_f);
  EXPECT_RC(cuMemFreeAsync(f, s), CUDA_ERROR_INVALID_VALUE);  // freed already
  EXPECT_TRUE(Holds(y, kGranule, 2));
  EXPECT_TRUE(Holds(z, kGranule, 3));
  CHECK(cuMemFree(y));
  CHECK(cuMemFree(z));
  CHECK(cuStreamDestroy(s));
  return failures == 0 ? 0 : 1;
}

int Vmm() {
  constexpr int kBuffers = 4, kHandles = 16;  // 8 MiB of buffers, up to 32 MiB mapped
  CUdeviceptr buffers[kBuffers];
  for (int i = 0; i < kBuffers; ++i) {
    CHECK(cuMemAlloc(&buffers[i], kGranule));
    Fill(buffers[i], kGranule, static_cast<uint8_t>(10 + i));
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUdeviceptr va;
  CHECK(cuMemAddressReserve(&va, kHandles * kGranule, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> handles;
  size_t free_before = 0, total = 0, free_now = 0;
  CHECK(cuMemGetInfo(&free_before, &total));
  CUresult last = CUDA_SUCCESS;
  for (int i = 0; i < kHandles; ++i) {
    CUmemGenericAllocationHandle h;
    last = cuMemCreate(&h, kGranule, &prop, 0);
    if (last != CUDA_SUCCESS) break;
    handles.push_back(h);
    CHECK(cuMemMap(va + i * kGranule, kGranule, 0, h, 0));
    CHECK(cuMemSetAccess(va + i * kGranule, kGranule, &access, 1));
    CHECK(cuMemsetD8(va + i * kGranule, static_cast<unsigned char>(i), kGranule));
    CHECK(cuMemGetInfo(&free_now, &total));
    // The program's own memory shows in cuMemGetInfo.
    EXPECT_TRUE(free_now + (i + 1) * kGranule <= total);
  }
  std::printf("created %zu\n", handles.size());
  if (handles.size() < kHandles) EXPECT_TRUE(last == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(cuCtxSynchronize());
  for (size_t i = 0; i < handles.size(); ++i) {
    unsigned char b = 0;
    CHECK(cuMemcpyDtoH(&b, va + i * kGranule + kGranule - 1, 1));
    EXPECT_TRUE(b == i);
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    CHECK(cuMemUnmap(va + i * kGranule, kGranule));
    CHECK(cuMemRelease(handles[i]));
  }
  CHECK(cuMemAddressFree(va, kHandles * kGranule));
  CHECK(cuMemGetInfo(&free_now, &total));
  std::printf("free after release %zu of %zu\n", free_now, total);
  for (int i = 0; i < kBuffers; ++i) {
    EXPECT_TRUE(Holds(buffers[i], kGranule, static_cast<uint8_t>(10 + i)));
    CHECK(cuMemFree(buffers[i]));
  }
  return failures == 0 ? 0 : 1;
}

int Pin() {
  CUdeviceptr p[3], q, r, t;
  for (int i = 0; i < 3; ++i) {
    CHECK(cuMemAlloc(&p[i], kGranule));
    Fill(p[i], kGranule, static_cast<uint8_t>(20 + i));
  }
  CHECK(cuMemAlloc(&q, kGranule));  // under a cap of three granules: p[0] goes out
  Fill(q, kGranule, 30);
  // Read the last two: whatever the policy, p[1] now goes first (the least
  // recently used, or under belady the one of the burst of writes still
  // unread), so that both pins below find their buffer swapped out.
  EXPECT_TRUE(Holds(p[2], kGranule, 22));
  EXPECT_TRUE(Holds(q, kGranule, 30));
  size_t before = DeviceUsed();

  CUipcMemHandle ipc;
  // stensor's buffers are VMM memory, which the driver refuses to export
  // this way; the buffer is pinned all the same (docs/limits.md).
  EXPECT_RC(cuIpcGetMemHandle(&ipc, p[0]), kCapped ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
  if (kCapped && OnFake()) EXPECT_TRUE(DeviceUsed() == before);  // p[0] in, another out
  CUmemGenericAllocationHandle h = 0;
  CUresult retained = cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(p[1] + 100));
  // cuMemAlloc memory has no allocation handle; stensor's has one.
  EXPECT_TRUE(retained == (kCapped ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE));
  if (retained == CUDA_SUCCESS) {
    CUmemAllocationProp prop{};
    CHECK(cuMemGetAllocationPropertiesFromHandle(&prop, h));
    EXPECT_TRUE(prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE);
    int fd = -1;
    // Created without shareable handle types: the driver's refusal.
    EXPECT_RC(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
              CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemRelease(h));
  }
  std::printf("pinned ipc 0x%llx retain 0x%llx\n", static_cast<unsigned long long>(p[0]),
              static_cast<unsigned long long>(p[1]));
  std::fflush(stdout);

  // Churn: with p[0] and p[1] pinned, one granule is left for the others.
  CHECK(cuMemAlloc(&r, kGranule));
  Fill(r, kGranule, 40);
  CHECK(cuMemAlloc(&t, kGranule));
  Fill(t, kGranule, 41);
  for (int round = 0; round < 3; ++round) {
    // Rewritten (each comes back, another goes), then read.
    Fill(p[2], kGranule, 22);
    Fill(q, kGranule, 30);
    Fill(r, kGranule, 40);
    Fill(t, kGranule, 41);
    EXPECT_TRUE(Holds(p[2], kGranule, 22));
    EXPECT_TRUE(Holds(q, kGranule, 30));
    EXPECT_TRUE(Holds(r, kGranule, 40));
    EXPECT_TRUE(Holds(t, kGranule, 41));
  }
  EXPECT_TRUE(Holds(p[0], kGranule, 20));
  EXPECT_TRUE(Holds(p[1], kGranule, 21));
  for (CUdeviceptr b : {p[0], p[1], p[2], q, r, t}) CHECK(cuMemFree(b));
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc == 2 ? argv[1] : "";
  if (mode != "bounds" && mode != "vmm" && mode != "pin") {
    std::fprintf(stderr, "usage: exact_sizes bounds|vmm|pin\n");
    return 2;
  }
  stensor_tests::StartOnDevice0();
  CUcontext ctx = nullptr;
  CHECK(cuCtxGetCurrent(&ctx));
  int rc = mode == "bounds" ? Bounds(ctx) : mode == "vmm" ? Vmm() : Pin();
  if (rc == 0) std::printf("ok\n");
  return rc;
}
