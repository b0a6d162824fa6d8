// Pointer tables inside a caching allocator's segments: the program carves
// tensors out of 2 MiB segments (cuMemAlloc'd once, as PyTorch's caching
// allocator does) and uploads small host-built tables of pointers into
// blocks of those segments, next to data tensors that kernels write all the
// time. Each step:
//
//   s0: uploads table A (in the middle of segment 0) naming two tensors of
//       other segments, records `uploaded`; writes tensors of segment 1
//       (where table B sits at the start, so every write lies after it).
//   s1: waits for `uploaded`; writes tensors of segment 0 placed before
//       table A and after it, and tensors of the other segments (pressure
//       under a cap); every third step, a slow kernel rewrites table A's
//       second entry through a pointer into the tensor just before it (a
//       write that really reaches the table); records `written`.
//   s0: waits for `written`; a kernel reads and writes through table A, then
//       one through table B (its targets fixed); writes a tensor of segment
//       0 before table A again, then reads through A again.
//   s1: waits for s0's step before its next one.
//
//   table_segments MODULE.so [--steps N] [--source pageable|pinned]
//
// Nothing synchronises until the end. Prints `working_set <bytes>` first,
// `launches <n>`, `seconds <s>` (the steps, from the first upload to the
// end of the final synchronisation) and `checksum <hex>` (FNV-1a over every
// segment's final contents, the tables' entries left out) last.
#include <cuda.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/driver_check.h"

namespace {

constexpr size_t kSegment = 2u << 20;
constexpr int kSegments = 12;
constexpr size_t kTensor = 64u << 10;  // bytes
constexpr int kFloats = kTensor / sizeof(float);
constexpr int kTensors = kSegment / kTensor;  // per segment
// Table A: a 512-byte block right after tensor 7 of segment 0 (tensors 8..
// move up by one block); table B: the first block of segment 1.
constexpr size_t kTableBlock = 512;
constexpr int kTableAAfter = 7;

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

int launches = 0;

void Launch(CUfunction f, CUstream s, std::vector<void*> params) {
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params.data(), nullptr));
  ++launches;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: table_segments MODULE.so [--steps N] [--source pageable|pinned]\n";
  if (argc < 2) {
    std::fputs(usage, stderr);
    return 2;
  }
  int steps = 30;
  std::string source = "pageable";
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--source") == 0 && i + 1 < argc) {
      source = argv[++i];
    } else {
      std::fputs(usage, stderr);
      return 2;
    }
  }
  if (steps < 1 || (source != "pageable" && source != "pinned")) {
    std::fputs(usage, stderr);
    return 2;
  }

  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CUmodule m;
  CHECK(cuModuleLoad(&m, argv[1]));
  CUfunction scale, sum_into, through, retarget;
  CHECK(cuModuleGetFunction(&scale, m, "_ZN8segments5scaleEPfif"));
  CHECK(cuModuleGetFunction(&sum_into, m, "_ZN8segments8sum_intoEPKfPfi"));
  CHECK(cuModuleGetFunction(&through, m, "_ZN8segments7throughEPKPfiS0_i"));
  CHECK(cuModuleGetFunction(&retarget, m, "_ZN8segments8retargetEPyxPKf"));
  CUstream s0, s1;
  CHECK(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CUevent uploaded, written, stepped;
  CHECK(cuEventCreate(&uploaded, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&written, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&stepped, CU_EVENT_DISABLE_TIMING));

  std::printf("working_set %zu\n", kSegments * kSegment);
  std::vector<CUdeviceptr> seg(kSegments);
  std::vector<float> host(kSegment / sizeof(float));
  for (int i = 0; i < kSegments; ++i) {
    CHECK(cuMemAlloc(&seg[i], kSegment));
    for (size_t j = 0; j < host.size(); ++j) host[j] = static_cast<float>((i * 7 + j) % 13);
    CHECK(cuMemcpyHtoD(seg[i], host.data(), kSegment));
  }
  // Tensor k of segment i; in segment 0, tensors after table A's block sit
  // one block further (the last one is shorter: never used).
  auto tensor = [&](int i, int k) -> CUdeviceptr {
    CUdeviceptr at = seg[i] + k * kTensor;
    if (i == 0 && k > kTableAAfter) at += kTableBlock;
    if (i == 1) at += kTableBlock;
    return at;
  };
  const CUdeviceptr table_a = seg[0] + (kTableAAfter + 1) * kTensor;
  const CUdeviceptr table_b = seg[1];
  // Table B names two tensors of segments 10 and 11, once.
  uint64_t b_entries[2] = {tensor(10, 3), tensor(11, 5)};
  CHECK(cuMemcpyHtoD(table_b, b_entries, sizeof(b_entries)));

  // A pinned source is read when the copy runs: one per step.
  uint64_t* pinned = nullptr;
  std::vector<uint64_t> pageable(2);
  if (source == "pinned") {
    CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&pinned), 2 * sizeof(uint64_t) * steps, 0));
  }
  // Tensors after a table block end short of their slot by the block.
  int n = kFloats - static_cast<int>(kTableBlock / sizeof(float));
  int k2 = 2;
  float one = 1.0f, quarter = 0.25f;
  CUdeviceptr before_a = tensor(0, kTableAAfter);  // ends where table A starts
  long long slot = static_cast<long long>((table_a + 8 - before_a) / 8);
  const auto began = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    // s0: the step's table A and its own tensors of segment 1.
    uint64_t* src = pinned != nullptr ? pinned + 2 * step : pageable.data();
    src[0] = tensor(2 + step % 4, step % kTensors);
    src[1] = tensor(6 + step % 4, (step * 5) % kTensors);
    CHECK(cuMemcpyHtoDAsync(table_a, src, 2 * sizeof(uint64_t), s0));
    CHECK(cuEventRecord(uploaded, s0));
    for (int k = 0; k < 3; ++k) {
      CUdeviceptr x = tensor(1, 4 + (step + k) % 20);
      Launch(scale, s0, {&x, &n, &one});
    }
    // s1: after the upload, tensors before and after table A, pressure.
    CHECK(cuStreamWaitEvent(s1, uploaded, 0));
    if (step > 0) CHECK(cuStreamWaitEvent(s1, stepped, 0));
    for (int k = 0; k < 3; ++k) {
      CUdeviceptr before = tensor(0, (step + k) % (kTableAAfter + 1));
      CUdeviceptr after = tensor(0, kTableAAfter + 1 + (step + k) % 20);
      Launch(scale, s1, {&before, &n, &quarter});
      Launch(scale, s1, {&after, &n, &quarter});
    }
    for (int i = 2; i < kSegments; ++i) {
      CUdeviceptr x = tensor(i, (step + i) % kTensors);
      CUdeviceptr acc = tensor(i, (step + i + 1) % kTensors);
      Launch(sum_into, s1, {&x, &acc, &n});
    }
    if (step % 3 == 2) {
      // Really rewrites table A's second entry (through the tensor before it).
      CUdeviceptr target = tensor(5 + step % 5, (step * 3) % kTensors);
      Launch(retarget, s1, {&before_a, &slot, &target});
    }
    CHECK(cuEventRecord(written, s1));
    // s0: through the tables.
    CHECK(cuStreamWaitEvent(s0, written, 0));
    CUdeviceptr out = tensor(1, 1 + step % 3);
    CUdeviceptr ta = table_a, tb = table_b;
    Launch(through, s0, {&ta, &k2, &out, &n});
    Launch(through, s0, {&tb, &k2, &out, &n});
    CUdeviceptr before = tensor(0, step % (kTableAAfter + 1));
    Launch(scale, s0, {&before, &n, &one});
    Launch(through, s0, {&ta, &k2, &out, &n});
    CHECK(cuEventRecord(stepped, s0));
  }
  CHECK(cuCtxSynchronize());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < kSegments; ++i) {
    CHECK(cuMemcpyDtoH(host.data(), seg[i], kSegment));
    // The tables hold addresses, which differ from run to run.
    auto* bytes = reinterpret_cast<unsigned char*>(host.data());
    if (i == 0) std::memset(bytes + (table_a - seg[0]), 0, 2 * sizeof(uint64_t));
    if (i == 1) std::memset(bytes, 0, 2 * sizeof(uint64_t));
    h = Fnv(h, host.data(), kSegment);
  }
  std::printf("launches %d\n", launches);
  std::printf("seconds %.4f\n", seconds);
  std::printf("checksum %016" PRIx64 "\n", h);
  return 0;
}
