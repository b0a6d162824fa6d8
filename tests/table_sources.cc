// A pointer table whose host source is written in stream order, after the
// copy that uploads it was submitted: each step stores the address of the
// step's target buffer into pinned host memory from work queued on the
// stream, copies that memory into a device table asynchronously, and adds 1
// to the target through the table. What the source held when the copy was
// submitted is the previous step's target, so only what the copy actually
// copied names the buffer written.
//
//   table_sources MODULE.so
//                 --source hostfunc|kernel|escaped|dtoh|graph|hostgraph|host
//                 [--stream nonblocking|blocking|legacy] [--steps N]
//                 [--memory pinned|registered] [--copy htod|unified]
//
// hostfunc: cuLaunchHostFunc stores the address; kernel: a kernel stores it
// through device-mapped pinned memory; escaped: a kernel stores it there
// through the memory's address it reads from a device table (uploaded once
// from pageable memory), never given the address directly; dtoh: an asynchronous device-to-host
// copy brings it from a table of all targets; graph: a captured host node,
// copy and kernel, launched every step; hostgraph: a captured copy and
// kernel, the host storing the address after synchronising, then queueing
// the step's reads before the launch (a graph launched on a busy stream
// whose source nothing queued writes); host: the host stores each step's
// address into a fresh slot of the pinned memory and uploads it while the
// stream is busy (nothing queued writes the source, only a copy into it
// before the steps, long done: no wait is needed to know what lands). Between steps every buffer is
// read (pressure under a cap). Nothing synchronises until the end. The source is cuMemHostAlloc'd
// (pinned) or malloc'd and cuMemHostRegister'd; the upload is cuMemcpyHtoDAsync (htod) or
// cuMemcpyAsync (unified addressing). Prints `working_set <bytes>` first and `checksum <hex>`
// (FNV-1a over every buffer's final contents) last.
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
constexpr int kBuffers = 8;
constexpr int kAcc = 1024;  // floats summed per read

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// What a host function (or host node) needs: where to store, and which
// buffer comes next. Host functions run in stream order, so the counter
// follows the steps.
struct Store {
  uint64_t* slot = nullptr;
  CUdeviceptr targets[kBuffers] = {};
  int next = 0;
};

void CUDA_CB StoreNext(void* data) {
  auto* s = static_cast<Store*>(data);
  *s->slot = s->targets[s->next++ % kBuffers];
}

void Launch(CUfunction f, CUstream s, std::vector<void*> params) {
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params.data(), nullptr));
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: table_sources MODULE.so --source hostfunc|kernel|escaped|dtoh|graph|hostgraph|host "
      "[--stream nonblocking|blocking|legacy] [--steps N] [--memory pinned|registered] "
      "[--copy htod|unified]\n";
  if (argc < 2) {
    std::fputs(usage, stderr);
    return 2;
  }
  std::string source, stream_kind = "nonblocking", memory = "pinned", copy = "htod";
  int steps = 24;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--source") == 0 && i + 1 < argc) {
      source = argv[++i];
    } else if (std::strcmp(argv[i], "--stream") == 0 && i + 1 < argc) {
      stream_kind = argv[++i];
    } else if (std::strcmp(argv[i], "--memory") == 0 && i + 1 < argc) {
      memory = argv[++i];
    } else if (std::strcmp(argv[i], "--copy") == 0 && i + 1 < argc) {
      copy = argv[++i];
    } else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      std::fputs(usage, stderr);
      return 2;
    }
  }
  const bool graphed = source == "graph" || source == "hostgraph";
  if ((source != "hostfunc" && source != "kernel" && source != "escaped" && source != "dtoh" &&
       source != "host" && !graphed) ||
      (stream_kind != "nonblocking" && stream_kind != "blocking" && stream_kind != "legacy") ||
      (memory != "pinned" && memory != "registered") || (copy != "htod" && copy != "unified") ||
      steps < 1 || (graphed && stream_kind == "legacy") || (source == "host" && steps > 64)) {
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
  CUfunction add_through, sum_into, store_ptr, store_through;
  CHECK(cuModuleGetFunction(&add_through, m, "_ZN7sources11add_throughEPKPfi"));
  CHECK(cuModuleGetFunction(&sum_into, m, "_ZN7sources8sum_intoEPKfPfi"));
  CHECK(cuModuleGetFunction(&store_ptr, m, "_ZN7sources9store_ptrEPmPKf"));
  CHECK(cuModuleGetFunction(&store_through, m, "_ZN7sources13store_throughEPKPmPKf"));

  CUstream s = nullptr;
  if (stream_kind != "legacy") {
    CHECK(
        cuStreamCreate(&s, stream_kind == "blocking" ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING));
  }

  // The targets, each filled with its index; a small accumulator; the
  // device table of one entry; a table of all targets (dtoh); the pinned
  // source, device-mapped.
  std::vector<CUdeviceptr> b(kBuffers);
  std::vector<float> host(kFloats);
  for (int i = 0; i < kBuffers; ++i) {
    CHECK(cuMemAlloc(&b[i], kBuf));
    for (float& v : host) v = static_cast<float>(i);
    CHECK(cuMemcpyHtoD(b[i], host.data(), kBuf));
  }
  CUdeviceptr acc, table, all;
  CHECK(cuMemAlloc(&acc, kAcc * sizeof(float)));
  CHECK(cuMemsetD32(acc, 0, kAcc));
  CHECK(cuMemAlloc(&table, 64));
  CHECK(cuMemAlloc(&all, kBuffers * sizeof(CUdeviceptr)));
  CHECK(cuMemcpyHtoD(all, b.data(), kBuffers * sizeof(CUdeviceptr)));
  uint64_t* pinned = nullptr;
  if (memory == "pinned") {
    CHECK(cuMemHostAlloc(reinterpret_cast<void**>(&pinned), 512, CU_MEMHOSTALLOC_DEVICEMAP));
  } else {
    pinned = static_cast<uint64_t*>(std::aligned_alloc(4096, 4096));
    CHECK(cuMemHostRegister(pinned, 4096, CU_MEMHOSTREGISTER_DEVICEMAP));
  }
  std::memset(pinned, 0, 512);
  // The source names the first target before anything runs: every step's
  // copy is submitted while it still names the previous step's.
  pinned[0] = b[0];
  // The device table naming the pinned memory (escaped).
  CUdeviceptr slots;
  CHECK(cuMemAlloc(&slots, 64));
  const uint64_t slot_address[8] = {source == "escaped" ? reinterpret_cast<uint64_t>(pinned) : 0};
  CHECK(cuMemcpyHtoD(slots, slot_address, sizeof(slot_address)));
  Store store;
  store.slot = pinned;
  for (int i = 0; i < kBuffers; ++i) store.targets[i] = b[i];
  std::printf("working_set %zu\n",
              kBuffers * kBuf + kAcc * sizeof(float) + 2 * 64 + kBuffers * sizeof(CUdeviceptr));

  int n = kFloats, acc_n = kAcc;
  auto read_all = [&] {
    for (int i = 0; i < kBuffers; ++i) Launch(sum_into, s, {&b[i], &acc, &acc_n});
  };
  // One step's store, upload and write-through, on stream `s`.
  auto step = [&](int k) {
    if (source == "hostfunc") {
      CHECK(cuLaunchHostFunc(s, StoreNext, &store));
    } else if (source == "kernel") {
      Launch(store_ptr, s, {&pinned, &b[k % kBuffers]});
    } else if (source == "escaped") {
      Launch(store_through, s, {&slots, &b[k % kBuffers]});
    } else if (source == "dtoh") {
      CHECK(cuMemcpyDtoHAsync(pinned, all + (k % kBuffers) * sizeof(CUdeviceptr),
                              sizeof(CUdeviceptr), s));
    } else if (source == "graph") {
      CHECK(cuLaunchHostFunc(s, StoreNext, &store));
    }
    uint64_t* from = pinned;
    if (source == "host") {  // a slot no earlier copy reads
      from = pinned + k;
      *from = b[k % kBuffers];
    }
    if (copy == "htod") {
      CHECK(cuMemcpyHtoDAsync(table, from, sizeof(CUdeviceptr), s));
    } else {
      CHECK(cuMemcpyAsync(table, reinterpret_cast<CUdeviceptr>(from), sizeof(CUdeviceptr), s));
    }
    Launch(add_through, s, {&table, &n});
  };

  if (source == "host") {
    // Work that wrote the source once, long done: it must not count as
    // pending at every later upload.
    CHECK(cuMemcpyDtoHAsync(pinned, b[0], 512, s));  // every slot
    CHECK(cuStreamSynchronize(s));
  }
  CUgraphExec exec = nullptr;
  if (graphed) {
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    step(0);
    CUgraph graph;
    CHECK(cuStreamEndCapture(s, &graph));
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    CHECK(cuGraphDestroy(graph));
  }
  for (int k = 0; k < steps; ++k) {
    if (source == "hostgraph") {
      CHECK(cuStreamSynchronize(s));  // the last launch's copy has read it
      *store.slot = store.targets[k % kBuffers];
    }
    read_all();
    if (exec != nullptr) {
      CHECK(cuGraphLaunch(exec, s));
    } else {
      step(k);
    }
  }
  read_all();
  CHECK(cuCtxSynchronize());

  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < kBuffers; ++i) {
    CHECK(cuMemcpyDtoH(host.data(), b[i], kBuf));
    h = Fnv(h, host.data(), kBuf);
  }
  std::vector<float> sums(kAcc);
  CHECK(cuMemcpyDtoH(sums.data(), acc, kAcc * sizeof(float)));
  h = Fnv(h, sums.data(), kAcc * sizeof(float));
  if (exec != nullptr) CHECK(cuGraphExecDestroy(exec));
  for (CUdeviceptr p : b) CHECK(cuMemFree(p));
  CHECK(cuMemFree(acc));
  CHECK(cuMemFree(table));
  CHECK(cuMemFree(all));
  CHECK(cuMemFree(slots));
  if (memory == "pinned") {
    CHECK(cuMemFreeHost(pinned));
  } else {
    CHECK(cuMemHostUnregister(pinned));
    std::free(pinned);
  }
  if (s != nullptr) CHECK(cuStreamDestroy(s));
  CHECK(cuDevicePrimaryCtxRelease(dev));
  std::printf("checksum %016" PRIx64 "\n", h);
  return 0;
}
