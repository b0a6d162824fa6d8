// A training loop replayed from CUDA graphs, as torch.compile's
// reduce-overhead mode and CUDA-graph trees run one: each of several blocks
// of the step is captured once from stream work (a host-to-device copy from
// pinned memory, kernels, a memset, a device-to-device copy, a kernel
// reading a pointer table, a fork onto a second stream joined back with
// events), instantiated, and launched every step, with direct launches
// between the graphs and host updates of the pinned input the captured copy
// reads at each launch.
//
//   graph_train KERNELS_SO [--steps N] [--side-thread] [--update]
//
// --side-thread: while the main thread captures (in the default, global
//   mode), another thread launches kernels on its own stream on buffers that
//   are swapped out under a cap: stensor's swap-ins for them must not
//   disturb the capture.
// --update: after the first step, one block's exec gets new kernel
//   arguments (cuGraphExecKernelNodeSetParams) pointing at another buffer.
//
// Prints "checksum HEX" over every buffer's final bytes: equal with and
// without stensor, under any cap that fits one graph's buffers.
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

constexpr size_t kWords = 512 * 1024;  // 2 MiB buffers: swappable
constexpr size_t kBytes = kWords * sizeof(uint32_t);
constexpr int kBlocks = 4;
constexpr int kLayers = 3;
constexpr int kEval = 4;
constexpr int kSide = 4;

struct Kernels {
  CUfunction mix, gather, scatter;
};

struct Block {
  CUdeviceptr a[kLayers], w[kLayers], g, table, y;
  CUgraphExec exec = nullptr;
};

CUdeviceptr NewBuffer(uint32_t seed) {
  CUdeviceptr p;
  CHECK(cuMemAlloc(&p, kBytes));
  std::vector<uint32_t> init(kWords);
  for (size_t i = 0; i < kWords; ++i) init[i] = seed * 2654435761u + static_cast<uint32_t>(i);
  CHECK(cuMemcpyHtoD(p, init.data(), kBytes));
  return p;
}

void Mix(const Kernels& k, CUdeviceptr x, CUdeviceptr y, uint32_t a, CUstream s) {
  int64_t n = kWords;
  void* args[] = {&x, &y, &a, &n};
  CHECK(cuLaunchKernel(k.mix, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
}

void Gather(const Kernels& k, CUdeviceptr table, CUdeviceptr y, int count, CUstream s) {
  int64_t n = kWords;
  void* args[] = {&table, &y, &count, &n};
  CHECK(cuLaunchKernel(k.gather, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
}

// One block of the step, pushed into s0 (and s1 through a fork): the work
// a capture records.
void BlockWork(const Kernels& k, const Block& b, CUdeviceptr in, const uint32_t* pinned, bool first,
               CUstream s0, CUstream s1, CUevent fork, CUevent join) {
  if (first) CHECK(cuMemcpyHtoDAsync(in, pinned, kBytes, s0));
  CUdeviceptr prev = in;
  for (int l = 0; l < kLayers; ++l) {
    Mix(k, prev, b.a[l], 17u + l, s0);
    prev = b.a[l];
  }
  CHECK(cuEventRecord(fork, s0));
  CHECK(cuStreamWaitEvent(s1, fork, 0));
  // Weight updates split over both streams; the gradient cleared on s1.
  for (int l = 0; l < kLayers; ++l) Mix(k, b.a[kLayers - 1], b.w[l], 3u + l, l % 2 ? s1 : s0);
  CHECK(cuMemsetD32Async(b.g, 0x01010101u, kWords, s1));
  Mix(k, b.w[1], b.g, 5u, s1);  // w[1] is s1's own: no race with s0
  CHECK(cuEventRecord(join, s1));
  CHECK(cuStreamWaitEvent(s0, join, 0));
  Gather(k, b.table, b.y, kLayers, s0);  // reads a[] through the table
  CHECK(cuMemcpyDtoDAsync(b.a[0], b.g, kBytes / 2, s0));
}

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: graph_train KERNELS_SO [--steps N] [--side-thread] [--update]\n");
    return 2;
  }
  int steps = 6;
  bool side_thread = false, update = false;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (arg == "--side-thread") {
      side_thread = true;
    } else if (arg == "--update") {
      update = true;
    } else {
      std::fprintf(stderr, "graph_train: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  stensor_tests::StartOnDevice0();
  CUmodule module;
  CHECK(cuModuleLoad(&module, argv[1]));
  Kernels k;
  CHECK(cuModuleGetFunction(&k.mix, module, "_ZN6stress3mixEPKjPjjl"));
  CHECK(cuModuleGetFunction(&k.gather, module, "_ZN6stress6gatherEPKPKjPjil"));
  CHECK(cuModuleGetFunction(&k.scatter, module, "_ZN6stress7scatterEPKPjPKjjil"));
  CUstream s0, s1, s2;
  CHECK(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CUevent fork, join;
  CHECK(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING));

  uint32_t* pinned;
  CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&pinned), kBytes, 0));
  std::vector<CUdeviceptr> all;
  uint32_t seed = 1;
  CUdeviceptr x = NewBuffer(seed++);
  all.push_back(x);
  Block blocks[kBlocks];
  for (Block& b : blocks) {
    for (int l = 0; l < kLayers; ++l) all.push_back(b.a[l] = NewBuffer(seed++));
    for (int l = 0; l < kLayers; ++l) all.push_back(b.w[l] = NewBuffer(seed++));
    all.push_back(b.g = NewBuffer(seed++));
    all.push_back(b.y = NewBuffer(seed++));
    // The table: the block's activations, uploaded from the host.
    b.table = NewBuffer(seed++);  // not in `all`: its pointers differ from run to run
    CHECK(cuMemcpyHtoD(b.table, b.a, sizeof(b.a)));
  }
  CUdeviceptr eval[kEval], side[kSide];
  for (CUdeviceptr& e : eval) all.push_back(e = NewBuffer(seed++));
  for (CUdeviceptr& s : side) all.push_back(s = NewBuffer(seed++));
  CHECK(cuCtxSynchronize());

  // Capture each block once; the side thread works meanwhile.
  std::atomic<int> phase{0};
  std::thread helper;
  if (side_thread) {
    helper = std::thread([&] {
      CUcontext ctx;
      CUdevice dev;
      CHECK(cuDeviceGet(&dev, 0));
      CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
      CHECK(cuCtxSetCurrent(ctx));
      for (int b = 0; b < kBlocks; ++b) {
        while (phase.load() != 2 * b + 1) std::this_thread::yield();
        // Launches only: legal while another thread captures globally.
        for (int i = 0; i < kSide; ++i) Mix(k, side[(i + 1) % kSide], side[i], 7u + b, s2);
        phase.store(2 * b + 2);
      }
    });
  }
  for (int b = 0; b < kBlocks; ++b) {
    const CUdeviceptr in = b == 0 ? x : blocks[b - 1].y;
    CHECK(cuStreamBeginCapture_v2(s0, CU_STREAM_CAPTURE_MODE_GLOBAL));
    if (side_thread) phase.store(2 * b + 1);
    BlockWork(k, blocks[b], in, pinned, b == 0, s0, s1, fork, join);
    if (side_thread) {
      while (phase.load() != 2 * b + 2) std::this_thread::yield();
    }
    CUgraph graph;
    CHECK(cuStreamEndCapture(s0, &graph));
    CHECK(cuGraphInstantiateWithFlags(&blocks[b].exec, graph, 0));
    CHECK(cuGraphDestroy(graph));  // the exec is a snapshot
  }
  if (helper.joinable()) helper.join();

  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < kWords; ++i) pinned[i] = static_cast<uint32_t>(step * 7919 + i);
    for (int b = 0; b < kBlocks; ++b) CHECK(cuGraphLaunch(blocks[b].exec, s0));
    // The captured copy reads `pinned` when the graph runs: wait before
    // the host changes it.
    CHECK(cuStreamSynchronize(s0));
    if (step % 2 == 1) {
      for (int e = 0; e < kEval; ++e) Mix(k, blocks[e % kBlocks].w[0], eval[e], 11u + step, s0);
    }
    if (update && step == 0) {
      // Block 1's first layer now reads block 3's output instead.
      CUgraphNode nodes[64];
      size_t count = 64;
      CUgraph graph;
      CHECK(cuStreamBeginCapture_v2(s0, CU_STREAM_CAPTURE_MODE_GLOBAL));
      BlockWork(k, blocks[1], blocks[0].y, pinned, false, s0, s1, fork, join);
      CHECK(cuStreamEndCapture(s0, &graph));
      CHECK(cuGraphGetNodes(graph, nodes, &count));
      for (size_t i = 0; i < count; ++i) {
        CUgraphNodeType type;
        CHECK(cuGraphNodeGetType(nodes[i], &type));
        if (type != CU_GRAPH_NODE_TYPE_KERNEL) continue;
        CUDA_KERNEL_NODE_PARAMS p;
        CHECK(cuGraphKernelNodeGetParams_v2(nodes[i], &p));
        CUdeviceptr src;
        std::memcpy(&src, p.kernelParams[0], sizeof(src));
        if (p.func != k.mix || src != blocks[0].y) continue;
        CUdeviceptr other = blocks[3].y;
        CUdeviceptr dst;
        std::memcpy(&dst, p.kernelParams[1], sizeof(dst));
        uint32_t a;
        int64_t n;
        std::memcpy(&a, p.kernelParams[2], sizeof(a));
        std::memcpy(&n, p.kernelParams[3], sizeof(n));
        void* args[] = {&other, &dst, &a, &n};
        p.kernelParams = args;
        // The exec's node of the same position: instantiate this capture
        // and update the exec from it.
        CUgraphExec fresh;
        CHECK(cuGraphInstantiateWithFlags(&fresh, graph, 0));
        CHECK(cuGraphExecKernelNodeSetParams_v2(fresh, nodes[i], &p));
        CHECK(cuGraphExecDestroy(blocks[1].exec));
        blocks[1].exec = fresh;
        break;
      }
      CHECK(cuGraphDestroy(graph));
    }
  }
  CHECK(cuCtxSynchronize());

  uint64_t h = 1469598103934665603ull;
  std::vector<uint32_t> host(kWords);
  for (CUdeviceptr p : all) {
    CHECK(cuMemcpyDtoH(host.data(), p, kBytes));
    h = Fnv(h, host.data(), kBytes);
  }
  std::printf("checksum %016llx\n", static_cast<unsigned long long>(h));
  for (Block& b : blocks) CHECK(cuGraphExecDestroy(b.exec));
  for (CUdeviceptr p : all) CHECK(cuMemFree(p));
  for (Block& b : blocks) CHECK(cuMemFree(b.table));
  CHECK(cuMemFreeHost(pinned));
  return stensor_tests::failures == 0 ? 0 : 1;
}
