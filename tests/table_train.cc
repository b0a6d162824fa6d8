// A driver-API program whose kernels reach most of their buffers through
// pointer tables in device memory, unlike mlp_train: tables built on the host
// and copied in every way a copy can be made (sync, async from pageable and
// from pinned memory, unified cuMemcpy), tables rewritten and reused between
// steps, entries pointing into the middle of buffers, a table inside a
// swappable buffer, a table copied device to device, a table written by a
// kernel and then read and written through, a table in pinned host memory,
// a table of tables, and in the last step (--last-table) a table in host
// memory stensor does not track: registered with the driver, or pageable
// (which nobody knows). Two streams, ordered by events.
//
//   table_train MODULE.so [--steps N] [--last-table pinned|pageable|registered]
// Prints `working_set <bytes>` first and `checksum <hex>` (FNV-1a over every
// buffer's final contents) last.
#include <cuda.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/driver_check.h"

namespace {

constexpr size_t kBuf = 2u << 20;  // one VMM granule
constexpr int kFloats = kBuf / sizeof(float);
constexpr int kBuffers = 12;
constexpr int kN = kFloats / 2;  // elements per table entry
constexpr int kCount = 3;        // entries per table

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

struct Kernels {
  CUfunction axpy, sum, build, scale, touch, host_add, nested_add;
};

Kernels Load(const char* path) {
  CUmodule m;
  CHECK(cuModuleLoad(&m, path));
  Kernels k;
  CHECK(cuModuleGetFunction(&k.axpy, m, "_ZN6tables4axpyEPKPfPKPKffii"));
  CHECK(cuModuleGetFunction(&k.sum, m, "_ZN6tables3sumEPKPKfPfii"));
  CHECK(cuModuleGetFunction(&k.build, m, "_ZN6tables5buildEPPfS0_li"));
  CHECK(cuModuleGetFunction(&k.scale, m, "_ZN6tables5scaleEPPffii"));
  CHECK(cuModuleGetFunction(&k.touch, m, "_ZN6tables5touchEPffi"));
  CHECK(cuModuleGetFunction(&k.host_add, m, "_ZN6tables14host_table_addEPKPffii"));
  CHECK(cuModuleGetFunction(&k.nested_add, m, "_ZN6tables10nested_addEPKPKPfii"));
  return k;
}

void Launch(CUfunction f, CUstream s, std::vector<void*> params) {
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params.data(), nullptr));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr,
        "usage: table_train MODULE.so [--steps N] [--last-table pinned|pageable|registered]\n");
    return 2;
  }
  int steps = 6;
  std::string last_table = "pinned";
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--last-table") == 0 && i + 1 < argc) {
      last_table = argv[++i];
      if (last_table != "pinned" && last_table != "pageable" && last_table != "registered") {
        std::fprintf(stderr, "--last-table: pinned, pageable or registered\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  stensor_tests::StartOnDevice0();
  const Kernels k = Load(argv[1]);
  CUstream a, b;
  CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CUevent a_done, b_done;
  CHECK(cuEventCreate(&a_done, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&b_done, CU_EVENT_DISABLE_TIMING));

  // Data buffers, a 4 MiB one that a kernel-built table points into, a
  // swappable buffer with a table in its middle, a kernel-built table, and
  // small tables (below the granularity: never swapped).
  uint64_t working_set = 0;
  auto alloc = [&](size_t bytes) {
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, bytes));
    working_set += bytes;
    return p;
  };
  std::vector<CUdeviceptr> buf(kBuffers);
  std::vector<float> init(kFloats);
  for (int i = 0; i < kBuffers; ++i) {
    buf[i] = alloc(kBuf);
    for (int j = 0; j < kFloats; ++j) init[j] = static_cast<float>((i * 7 + j) % 97) / 16.0f;
    CHECK(cuMemcpyHtoD(buf[i], init.data(), kBuf));
  }
  const CUdeviceptr big = alloc(2 * kBuf);
  CHECK(cuMemsetD32(big, 0x3f800000, 2 * kFloats));  // 1.0f
  const CUdeviceptr table_in_buffer = alloc(kBuf);
  CHECK(cuMemsetD8(table_in_buffer, 0, kBuf));
  CUdeviceptr built = alloc(kBuf);
  CHECK(cuMemsetD8(built, 0, kBuf));
  CUdeviceptr tx = alloc(256), ty = alloc(256), tcopy = alloc(256);
  CUdeviceptr inner0 = alloc(64), inner1 = alloc(64), outer = alloc(64);
  std::printf("working_set %" PRIu64 "\n", working_set);

  CUdeviceptr* pinned = nullptr;  // host staging for async pinned copies
  CHECK(cuMemAllocHost(reinterpret_cast<void**>(&pinned), 4096));
  CUdeviceptr* host_table = nullptr;  // read by the device directly
  CHECK(cuMemAllocHost(reinterpret_cast<void**>(&host_table), 4096));
  // Pageable host memory, which the driver does not know (a device with
  // HMM reads it): a table there has contents stensor cannot know. And host
  // memory registered with the driver, which stensor does not track.
  std::vector<CUdeviceptr> pageable(4096 / sizeof(CUdeviceptr));
  std::vector<CUdeviceptr> registered(4096 / sizeof(CUdeviceptr));
  CHECK(cuMemHostRegister(registered.data(), 4096, 0));

  // Copies a table to the device in the way `how` picks.
  auto upload = [&](CUdeviceptr dst, const std::vector<CUdeviceptr>& entries, int how, CUstream s) {
    const size_t bytes = entries.size() * sizeof(CUdeviceptr);
    switch (how % 4) {
      case 0:
        CHECK(cuMemcpyHtoD(dst, entries.data(), bytes));
        break;
      case 1:  // pageable: the driver reads it before returning
        CHECK(cuMemcpyHtoDAsync(dst, entries.data(), bytes, s));
        break;
      case 2:  // pinned: must stay unchanged until the copy ran
        CHECK(cuStreamSynchronize(s));
        std::memcpy(pinned, entries.data(), bytes);
        CHECK(cuMemcpyHtoDAsync(dst, pinned, bytes, s));
        break;
      case 3:
        CHECK(cuMemcpy(dst, reinterpret_cast<CUdeviceptr>(entries.data()), bytes));
        break;
    }
  };
  auto at = [&](int i, int element) {
    return buf[i % kBuffers] + static_cast<CUdeviceptr>(element) * sizeof(float);
  };

  for (int step = 0; step < steps; ++step) {
    CHECK(cuStreamWaitEvent(a, b_done, 0));
    // Tables rewritten every step, entries into the middle of buffers.
    std::vector<CUdeviceptr> xs = {at(step, 1024 * step), at(step + 3, 0), at(step + 6, kN)};
    std::vector<CUdeviceptr> ys = {at(step + 1, 0), at(step + 4, 512), at(step + 7, kN - 8)};
    upload(tx, xs, step, a);
    upload(ty, ys, step + 1, a);
    float alpha = 0.25f + 0.125f * step;
    int n = kN, count = kCount;
    Launch(k.axpy, a, {&ty, &tx, &alpha, &n, &count});

    // A table in the middle of a swappable buffer.
    std::vector<CUdeviceptr> zs = {at(step + 2, 64), at(step + 5, 0), at(step + 8, 4096)};
    upload(table_in_buffer + 4096, zs, step + 2, a);
    CUdeviceptr tmid = table_in_buffer + 4096;
    CUdeviceptr out = at(step + 9, 0);
    Launch(k.sum, a, {&tmid, &out, &n, &count});

    // A table written by a kernel, rebuilt every other step, then written
    // through (which also may rewrite it).
    if (step % 2 == 0) {
      CUdeviceptr base = big + 1024 * sizeof(float);
      int64_t stride = kFloats / 2;
      int entries = 3;
      Launch(k.build, a, {&built, &base, &stride, &entries});
    }
    float factor = 0.75f;
    int scaled = kFloats / 4, entries = 3;
    Launch(k.scale, a, {&built, &factor, &scaled, &entries});

    // The x table copied on the device, then read through.
    CHECK(cuMemcpyDtoDAsync(tcopy, tx, kCount * sizeof(CUdeviceptr), a));
    CUdeviceptr out2 = at(step + 10, 0);
    Launch(k.sum, a, {&tcopy, &out2, &n, &count});

    // A table of tables, both levels built on the host.
    upload(inner0, {at(step + 1, 16), at(step + 3, 0), at(step + 5, 0)}, step, a);
    upload(inner1, {at(step + 7, 0), at(step + 9, 32), at(step + 11, 0)}, step + 1, a);
    upload(outer, {inner0, inner1}, step + 2, a);
    Launch(k.nested_add, a, {&outer, &n, &count});
    CHECK(cuEventRecord(a_done, a));

    // Pressure from the other stream: plain kernels on the other buffers.
    CHECK(cuStreamWaitEvent(b, a_done, 0));
    for (int i = 0; i < kBuffers; i += 2) {
      CUdeviceptr x = at(step + 11 + i, 0);
      float c = 0.5f * i;
      int all = kFloats;
      Launch(k.touch, b, {&x, &c, &all});
    }
    // A table in pinned host memory, read by the device itself.
    CHECK(cuStreamSynchronize(b));
    // The last step's table is where --last-table says.
    CUdeviceptr* table = host_table;
    if (step + 1 == steps && last_table == "pageable") table = pageable.data();
    if (step + 1 == steps && last_table == "registered") table = registered.data();
    table[0] = at(step + 2, 0);
    table[1] = at(step + 5, 0);
    table[2] = at(step + 11, 0);
    CUdeviceptr ht = reinterpret_cast<CUdeviceptr>(table);
    float v = 1.0f;
    Launch(k.host_add, b, {&ht, &v, &n, &count});
    CHECK(cuEventRecord(b_done, b));
  }
  CHECK(cuCtxSynchronize());

  uint64_t h = 0xcbf29ce484222325ull;
  std::vector<unsigned char> host(2 * kBuf);
  for (CUdeviceptr p : buf) {
    CHECK(cuMemcpyDtoH(host.data(), p, kBuf));
    h = Fnv(h, host.data(), kBuf);
  }
  CHECK(cuMemcpyDtoH(host.data(), big, 2 * kBuf));
  h = Fnv(h, host.data(), 2 * kBuf);
  std::printf("checksum %016" PRIx64 "\n", h);
  CHECK(cuMemHostUnregister(registered.data()));
  return 0;
}
