// PyTorch's pluggable allocator on libstensor.so, for
// tests/torch_allocator_test.sh: stensor_torch_malloc and stensor_torch_free
// resolved with dlsym and called as torch/csrc/cuda/CUDAPluggableAllocator.cpp
// calls them: malloc(size, current device, that device's current stream)
// with the device current; free(ptr, size, device, stream of the malloc)
// from the tensor's deleter, with work still queued on the tensor, on any
// thread and with any device current. Every tensor is written by kernels
// (slow_fill), memsets and copies, and read back into pinned memory before
// its free; every byte is compared with a host model.
//
//   torch_allocator MODULE.so   (MODULE: tests/fakecuda/test_kernels.so)
//
// Phases: sizes PyTorch may ask for (0: null and no free; more than the
// device: null, and the program goes on); churn over the legacy stream and
// two non-blocking streams, tensors freed with work queued and their memory
// reused on other streams; many small tensors; a free from a thread with no
// context current; with two devices, a tensor of device 1 freed while device
// 0 is current. Prints `working_set N` (the most bytes live at once, in the
// units a cap charges: granules from half a granule up, else 4 KiB pages),
// `checksum HEX` over all data read back, and `ok` when every check held.
#include <cuda.h>
#include <dlfcn.h>
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tests/driver_check.h"

namespace {

using stensor_tests::failures;

using MallocFn = void* (*)(ssize_t, int, CUstream);
using FreeFn = void (*)(void*, ssize_t, int, CUstream);
MallocFn g_malloc = nullptr;
FreeFn g_free = nullptr;

constexpr uint64_t kGranule = 2u << 20;
CUfunction g_fill = nullptr;
CUstream g_streams[3] = {nullptr, nullptr, nullptr};  // legacy, two non-blocking
uint64_t g_hash = 1469598103934665603ull;
uint64_t g_live = 0, g_peak = 0;

uint64_t Charge(uint64_t size) {
  return size >= kGranule / 2 ? (size + kGranule - 1) / kGranule * kGranule
                              : (size + 4095) / 4096 * 4096;
}

struct Tensor {
  CUdeviceptr p = 0;
  ssize_t size = 0;
  int device = 0;
  CUstream stream = nullptr;
  std::vector<int32_t> model;  // size / 4 words
};

// A read-back waiting for its stream: the pinned copy and what it must hold.
struct Pending {
  int32_t* host = nullptr;
  std::vector<int32_t> want;
  uintptr_t where = 0;
};
std::vector<Pending> g_pending;

Tensor Alloc(ssize_t size, CUstream s, int device = 0) {
  Tensor t;
  t.size = size;
  t.device = device;
  t.stream = s;
  t.p = reinterpret_cast<uintptr_t>(g_malloc(size, device, s));
  EXPECT_TRUE(t.p != 0);
  if (t.p == 0) std::exit(1);
  t.model.assign(static_cast<size_t>(size) / 4, 0);
  g_live += Charge(size);
  if (g_live > g_peak) g_peak = g_live;
  return t;
}

// slow_fill of words [from, from + n) on the tensor's stream.
void Fill(Tensor& t, size_t from, size_t n, int value, int delay_ms) {
  CUdeviceptr out = t.p + from * 4;
  int count = static_cast<int>(n);
  void* params[] = {&out, &value, &count, &delay_ms};
  CHECK(cuLaunchKernel(g_fill, 1, 1, 1, 1, 1, 1, 0, t.stream, params, nullptr));
  for (size_t i = from; i < from + n; ++i) t.model[i] = value;
}

void Memset(Tensor& t, size_t from, size_t n, uint32_t value) {
  CHECK(cuMemsetD32Async(t.p + from * 4, value, n, t.stream));
  for (size_t i = from; i < from + n; ++i) t.model[i] = static_cast<int32_t>(value);
}

// `s` waits for the work queued so far on `on`.
void After(CUstream s, CUstream on) {
  if (s == on) return;
  CUevent e;
  CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventRecord(e, on));
  CHECK(cuStreamWaitEvent(s, e, 0));
  CHECK(cuEventDestroy(e));
}

// Words [from, +n) of `src` into `dst` at `to`, on dst's stream after src's.
void CopyInto(Tensor& dst, size_t to, const Tensor& src, size_t from, size_t n) {
  After(dst.stream, src.stream);
  CHECK(cuMemcpyDtoDAsync(dst.p + to * 4, src.p + from * 4, n * 4, dst.stream));
  std::memcpy(dst.model.data() + to, src.model.data() + from, n * 4);
  After(src.stream, dst.stream);  // src's own stream then orders its free after
}

// Queues a read-back of the whole tensor on its stream.
void ReadBack(const Tensor& t) {
  Pending p;
  CHECK(cuMemAllocHost(reinterpret_cast<void**>(&p.host), t.model.size() * 4 + 4));
  CHECK(cuMemcpyDtoHAsync(p.host, t.p, t.model.size() * 4, t.stream));
  p.want = t.model;
  p.where = t.p;
  g_pending.push_back(std::move(p));
}

void CheckPending() {
  CHECK(cuCtxSynchronize());
  for (Pending& p : g_pending) {
    for (size_t i = 0; i < p.want.size(); ++i) {
      if (p.host[i] != p.want[i]) {
        std::fprintf(stderr, "tensor at 0x%lx word %zu: %d, want %d\n",
                     static_cast<unsigned long>(p.where), i, p.host[i], p.want[i]);
        ++failures;
        break;
      }
    }
    const auto* bytes = reinterpret_cast<const unsigned char*>(p.want.data());
    for (size_t i = 0; i < p.want.size() * 4; ++i) g_hash = (g_hash ^ bytes[i]) * 1099511628211ull;
    CHECK(cuMemFreeHost(p.host));
  }
  g_pending.clear();
}

// The tensor's deleter: read back (checked later), more work queued, freed
// at once with its size, device and stream.
void Release(Tensor& t, int delay_ms) {
  ReadBack(t);
  if (delay_ms > 0) Fill(t, 0, 1, 7, delay_ms);  // still running at the free
  g_free(reinterpret_cast<void*>(t.p), t.size, t.device, t.stream);
  g_live -= Charge(t.size);
  t.p = 0;
}

CUcontext Current() {
  CUcontext c = nullptr;
  CHECK(cuCtxGetCurrent(&c));
  return c;
}

void Sizes() {
  // 0 bytes: null, and PyTorch's deleter never frees a null pointer.
  EXPECT_TRUE(g_malloc(0, 0, nullptr) == nullptr);
  g_free(nullptr, 0, 0, nullptr);  // and a null free is nothing
  EXPECT_TRUE(g_malloc(-1, 0, nullptr) == nullptr);
  // More than the device: null, the program goes on.
  EXPECT_TRUE(g_malloc(ssize_t{1} << 50, 0, g_streams[1]) == nullptr);
  EXPECT_TRUE(g_malloc(ssize_t{1} << 50, 0, nullptr) == nullptr);
  // An invalid device: null.
  EXPECT_TRUE(g_malloc(4096, 99, nullptr) == nullptr);
  // Sizes that are no multiple of anything, both sides of half a granule.
  for (ssize_t size : {ssize_t{4}, ssize_t{kGranule / 2 - 4}, ssize_t{kGranule / 2},
                       ssize_t{kGranule + 4}, ssize_t{3 * kGranule - 12}}) {
    Tensor t = Alloc(size, g_streams[2]);
    Fill(t, 0, t.model.size(), static_cast<int>(size), 1);
    Release(t, 1);
  }
  CheckPending();
}

void Churn(std::mt19937& rng, int steps) {
  const ssize_t big[] = {1 << 20, 3 << 19, 2 << 20, 3 << 20, 4 << 20, (5 << 20) + 4};
  std::vector<Tensor> live;
  for (int step = 0; step < steps; ++step) {
    CUstream s = g_streams[rng() % 3];
    ssize_t size = rng() % 4 == 0 ? 4 * (1 + static_cast<ssize_t>(rng() % 16384)) : big[rng() % 6];
    Tensor t = Alloc(size, s);
    const size_t n = t.model.size();
    Fill(t, 0, n, step * 31 + 5, static_cast<int>(rng() % 2));
    if (rng() % 2) Memset(t, n / 3, n / 3, 0xA5000000u + step);
    if (!live.empty() && rng() % 2) {
      const Tensor& src = live[rng() % live.size()];
      const size_t m = std::min(src.model.size(), n) / 2;
      CopyInto(t, n - m, src, src.model.size() - m, m);
    }
    live.push_back(std::move(t));
    // Up to 16 live: free one (sometimes two) with work queued.
    while (live.size() > 16 || (live.size() > 4 && rng() % 3 == 0)) {
      const size_t i = rng() % live.size();
      Release(live[i], static_cast<int>(rng() % 3));
      live.erase(live.begin() + static_cast<long>(i));
    }
    if (step % 16 == 15) CheckPending();
  }
  for (Tensor& t : live) Release(t, 0);
  CheckPending();
}

void ManySmall(std::mt19937& rng) {
  std::vector<Tensor> small;
  for (int i = 0; i < 300; ++i) {
    Tensor t = Alloc(4 * (1 + static_cast<ssize_t>(rng() % 4096)), g_streams[i % 3]);
    Memset(t, 0, t.model.size(), 0x01010101u * static_cast<uint32_t>(i % 251 + 1));
    Fill(t, 0, 1, i, 0);
    small.push_back(std::move(t));
  }
  for (Tensor& t : small) Release(t, 0);
  CheckPending();
}

// PyTorch frees from whatever thread drops the last reference.
void FreeFromAnotherThread() {
  Tensor a = Alloc(kGranule, g_streams[1]);
  Tensor b = Alloc(8192, g_streams[1]);
  Fill(a, 0, a.model.size(), 11, 0);
  Fill(b, 0, b.model.size(), 12, 0);
  ReadBack(a);
  ReadBack(b);
  CHECK(cuStreamSynchronize(g_streams[1]));
  Fill(a, 0, 1, 13, 3);  // still running when the other thread frees it
  g_live -= Charge(a.size) + Charge(b.size);
  std::thread([&] {
    EXPECT_TRUE(Current() == nullptr);
    g_free(reinterpret_cast<void*>(a.p), a.size, 0, a.stream);
    g_free(reinterpret_cast<void*>(b.p), b.size, 0, b.stream);
    EXPECT_TRUE(Current() == nullptr);  // nothing left current
  }).join();
  CheckPending();
}

void OtherDevice(CUcontext home, CUmodule* module1) {
  int count = 0;
  CHECK(cuDeviceGetCount(&count));
  if (count < 2) return;
  CUcontext other;
  CHECK(cuDevicePrimaryCtxRetain(&other, 1));
  CHECK(cuCtxSetCurrent(other));
  CHECK(cuModuleLoad(module1, std::getenv("TORCH_ALLOCATOR_MODULE")));
  CUfunction fill0 = g_fill;
  CHECK(cuModuleGetFunction(&g_fill, *module1, "_ZN5testk9slow_fillEPiiii"));
  Tensor t = Alloc(3 * kGranule, nullptr, 1);
  Fill(t, 0, t.model.size(), 77, 1);
  ReadBack(t);
  CheckPending();
  Fill(t, 0, t.model.size(), 78, 2);
  ReadBack(t);
  // Device 0 current when the deleter runs.
  CHECK(cuCtxSetCurrent(home));
  g_free(reinterpret_cast<void*>(t.p), t.size, 1, nullptr);
  g_live -= Charge(t.size);
  EXPECT_TRUE(Current() == home);
  CHECK(cuCtxSetCurrent(other));
  CheckPending();
  CHECK(cuCtxSetCurrent(home));
  g_fill = fill0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: torch_allocator MODULE.so\n");
    return 2;
  }
  setenv("TORCH_ALLOCATOR_MODULE", argv[1], 1);
  g_malloc = reinterpret_cast<MallocFn>(dlsym(RTLD_DEFAULT, "stensor_torch_malloc"));
  g_free = reinterpret_cast<FreeFn>(dlsym(RTLD_DEFAULT, "stensor_torch_free"));
  if (g_malloc == nullptr || g_free == nullptr) {
    std::fprintf(stderr, "stensor_torch_malloc/free not found: preload libstensor.so\n");
    return 2;
  }
  CHECK(cuInit(0));
  CUcontext home;
  CHECK(cuDevicePrimaryCtxRetain(&home, 0));
  CHECK(cuCtxSetCurrent(home));
  CUmodule module;
  CHECK(cuModuleLoad(&module, argv[1]));
  CHECK(cuModuleGetFunction(&g_fill, module, "_ZN5testk9slow_fillEPiiii"));
  CHECK(cuStreamCreate(&g_streams[1], CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&g_streams[2], CU_STREAM_NON_BLOCKING));
  std::mt19937 rng(2024);
  Sizes();
  Churn(rng, 160);
  ManySmall(rng);
  FreeFromAnotherThread();
  CUmodule module1 = nullptr;
  OtherDevice(home, &module1);
  EXPECT_TRUE(g_live == 0);
  EXPECT_TRUE(Current() == home);
  std::printf("working_set %llu\n", static_cast<unsigned long long>(g_peak));
  std::printf("checksum %016llx\n", static_cast<unsigned long long>(g_hash));
  if (failures != 0) return 1;
  std::printf("ok\n");
  return 0;
}
