// Programs unlike graph_train, each aimed at one way graphs and captures
// could fool stensor (found in review):
//   graph_adversary KERNELS_SO table-in-graph
//     a graph copies a pointer table from pinned memory, then a kernel reads
//     through it; between launches the host points the table at other
//     buffers, which are swapped out: the launch must bring those in.
//   graph_adversary KERNELS_SO table-captured
//     a captured (never launched) copy would put other pointers in the
//     table: the table on the device, read by a direct launch, still holds
//     the old ones.
//   graph_adversary KERNELS_SO per-thread
//     two threads capture their own per-thread streams (the same handle);
//     one ends its capture while the other still captures.
// Prints "checksum HEX" over the buffers the kernels wrote.
#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/driver_check.h"

namespace {

constexpr size_t kWords = 512 * 1024;
constexpr size_t kBytes = kWords * 4;
CUfunction g_mix, g_gather;

CUdeviceptr NewBuffer(uint32_t seed) {
  CUdeviceptr p;
  CHECK(cuMemAlloc(&p, kBytes));
  std::vector<uint32_t> init(kWords);
  for (size_t i = 0; i < kWords; ++i) init[i] = seed * 2654435761u + static_cast<uint32_t>(i);
  CHECK(cuMemcpyHtoD(p, init.data(), kBytes));
  return p;
}

void Mix(CUdeviceptr x, CUdeviceptr y, CUstream s) {
  uint32_t a = 3;
  int64_t n = kWords;
  void* args[] = {&x, &y, &a, &n};
  CHECK(cuLaunchKernel(g_mix, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
}

void Gather(CUdeviceptr table, CUdeviceptr y, CUstream s) {
  int count = 3;
  int64_t n = kWords;
  void* args[] = {&table, &y, &count, &n};
  CHECK(cuLaunchKernel(g_gather, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
}

// Eight more buffers used round and round: under a small cap everything
// else becomes the oldest and is swapped out.
void Churn(const CUdeviceptr (&f)[8], CUstream s) {
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 8; ++i) Mix(f[i], f[(i + 1) % 8], s);
  }
  CHECK(cuStreamSynchronize(s));
}

uint64_t Checksum(std::initializer_list<CUdeviceptr> buffers) {
  uint64_t h = 1469598103934665603ull;
  std::vector<uint32_t> v(kWords);
  for (CUdeviceptr p : buffers) {
    CHECK(cuMemcpyDtoH(v.data(), p, kBytes));
    for (uint32_t w : v) h = (h ^ w) * 1099511628211ull;
  }
  return h;
}

uint64_t Tables(bool in_graph, CUstream s) {
  uint32_t seed = 1;
  CUdeviceptr a[3], b[3], f[8];
  for (CUdeviceptr& p : a) p = NewBuffer(seed++);
  for (CUdeviceptr& p : b) p = NewBuffer(seed++);
  CUdeviceptr y = NewBuffer(seed++), table = NewBuffer(seed++);
  for (CUdeviceptr& p : f) p = NewBuffer(seed++);
  CUdeviceptr* pinned;
  CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&pinned), 64, 0));
  std::memcpy(pinned, a, sizeof(a));
  CHECK(cuMemcpyHtoD(table, a, sizeof(a)));
  CUgraph g;
  if (in_graph) {
    CUgraphExec e;
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemcpyHtoDAsync(table, pinned, sizeof(a), s));
    Gather(table, y, s);
    CHECK(cuStreamEndCapture(s, &g));
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    std::memcpy(pinned, b, sizeof(b));  // the next launch reads set b
    Churn(f, s);
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuGraphExecDestroy(e));
  } else {
    std::memcpy(pinned, b, sizeof(b));
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemcpyHtoDAsync(table, pinned, sizeof(b), s));  // recorded, never run
    CHECK(cuStreamEndCapture(s, &g));
    Churn(f, s);
    Gather(table, y, s);  // the device's table still holds set a
    CHECK(cuStreamSynchronize(s));
  }
  CHECK(cuGraphDestroy(g));
  return Checksum({y});
}

uint64_t PerThread(CUdevice dev, CUstream s) {
  uint32_t seed = 1;
  CUdeviceptr x[2], y[2], f[8];
  for (int i = 0; i < 2; ++i) {
    x[i] = NewBuffer(seed++);
    y[i] = NewBuffer(seed++);
  }
  for (CUdeviceptr& p : f) p = NewBuffer(seed++);
  Churn(f, s);  // x and y now the oldest: swapped out under a small cap
  std::atomic<int> phase{0};
  auto worker = [&](int id) {
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUstream own = CU_STREAM_PER_THREAD;
    if (id == 1) {
      while (phase.load() < 1) std::this_thread::yield();
    }
    CHECK(cuStreamBeginCapture_v2(own, CU_STREAM_CAPTURE_MODE_RELAXED));
    if (id == 0) {
      phase = 1;
      while (phase.load() < 2) std::this_thread::yield();
    } else {
      phase = 2;
      while (phase.load() < 3) std::this_thread::yield();
    }
    Mix(x[id], y[id], own);  // thread 1's after thread 0 ended its capture
    CUgraph g;
    CUgraphExec e;
    CHECK(cuStreamEndCapture(own, &g));
    if (id == 0) phase = 3;
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    for (int k = 0; k < 2; ++k) CHECK(cuGraphLaunch(e, own));
    CHECK(cuStreamSynchronize(own));
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  CHECK(cuCtxSynchronize());
  return Checksum({x[0], y[0], x[1], y[1]});
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[2] : "";
  if (mode != "table-in-graph" && mode != "table-captured" && mode != "per-thread") {
    std::fprintf(stderr,
                 "usage: graph_adversary KERNELS_SO table-in-graph|table-captured|per-thread\n");
    return 2;
  }
  CUdevice dev = stensor_tests::StartOnDevice0();
  CUmodule m;
  CHECK(cuModuleLoad(&m, argv[1]));
  CHECK(cuModuleGetFunction(&g_mix, m, "_ZN6stress3mixEPKjPjjl"));
  CHECK(cuModuleGetFunction(&g_gather, m, "_ZN6stress6gatherEPKPKjPjil"));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const uint64_t h = mode == "per-thread" ? PerThread(dev, s) : Tables(mode == "table-in-graph", s);
  std::printf("checksum %016llx\n", static_cast<unsigned long long>(h));
  return stensor_tests::failures == 0 ? 0 : 1;
}
