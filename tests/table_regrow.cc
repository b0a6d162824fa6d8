// A pointer table rebuilt on the device longer than what stensor knew of its
// memory: each step the program uploads a short table (two entries) into
// the table's buffer, then a kernel copies a longer one (all targets) over
// it from another table, and a kernel adds 1 to every target through it.
// What stensor learnt of the buffer (the upload's two entries) is shorter
// than what the kernel stored: unless the kernel's stores make the whole
// rest of the buffer a table to read back, the last targets are not known
// to be reached, and a cap evicts them while the kernel writes them (the
// fake unmaps an evicted buffer without host-located VMM: a crash; with it,
// the writes land in host memory behind stensor's back). A pressure buffer
// read between the two launches makes the cap evict the targets.
//
//   table_regrow MODULE.so [--graph] [--steps N]
//
// --graph: the copy is a node of a CUDA graph, captured once and launched
// each step; the other work stays eager.
//
// MODULE.so: tests/table_source_kernels.so. Prints `working_set <bytes>`
// first and `checksum <hex>` (FNV-1a over the targets) last.
#include <cuda.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <vector>

#include "tests/driver_check.h"

namespace {

constexpr size_t kBuf = 2u << 20;  // one VMM granule
constexpr int kFloats = kBuf / sizeof(float);
constexpr int kTargets = 4;

void Launch(CUfunction f, CUstream s, std::vector<void*> params) {
  CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params.data(), nullptr));
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 4;
  bool graph = false;
  bool usage = argc < 2;
  for (int i = 2; i < argc && !usage; ++i) {
    if (std::strcmp(argv[i], "--graph") == 0) {
      graph = true;
    } else if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      usage = true;
    }
  }
  if (usage || steps < 1) {
    std::fputs("usage: table_regrow MODULE.so [--graph] [--steps N]\n", stderr);
    return 2;
  }
  stensor_tests::StartOnDevice0();
  CUmodule m;
  CHECK(cuModuleLoad(&m, argv[1]));
  CUfunction copy_table, add_all, sum_into;
  CHECK(cuModuleGetFunction(&copy_table, m, "_ZN7sources10copy_tableEPKPKfPPfi"));
  CHECK(cuModuleGetFunction(&add_all, m, "_ZN7sources7add_allEPKPfii"));
  CHECK(cuModuleGetFunction(&sum_into, m, "_ZN7sources8sum_intoEPKfPfi"));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

  CUdeviceptr target[kTargets];
  std::vector<float> host(kFloats);
  for (int i = 0; i < kTargets; ++i) {
    CHECK(cuMemAlloc(&target[i], kBuf));
    for (float& v : host) v = static_cast<float>(10 * i);
    CHECK(cuMemcpyHtoD(target[i], host.data(), kBuf));
  }
  CUdeviceptr pressure, acc;
  CHECK(cuMemAlloc(&pressure, 2 * kBuf));
  CHECK(cuMemsetD8(pressure, 0, 2 * kBuf));
  CHECK(cuMemAlloc(&acc, 2 * kBuf));
  CHECK(cuMemsetD8(acc, 0, 2 * kBuf));
  // The full table, uploaded once; the rebuilt one, and the short upload.
  CUdeviceptr all, table;
  CHECK(cuMemAlloc(&all, sizeof(target)));
  CHECK(cuMemcpyHtoD(all, target, sizeof(target)));
  CHECK(cuMemAlloc(&table, sizeof(target)));
  std::printf("working_set %zu\n", (kTargets + 4) * kBuf + 2 * sizeof(target));

  int k = kTargets, n = kFloats, pn = 2 * kFloats;
  CUgraphExec copy = nullptr;
  if (graph) {
    CUgraph g;
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    Launch(copy_table, s, {&all, &table, &k});
    CHECK(cuStreamEndCapture(s, &g));
    CHECK(cuGraphInstantiateWithFlags(&copy, g, 0));
    CHECK(cuGraphDestroy(g));
  }
  for (int step = 0; step < steps; ++step) {
    CHECK(cuMemcpyHtoDAsync(table, target, 2 * sizeof(target[0]), s));
    if (graph) {
      CHECK(cuGraphLaunch(copy, s));
    } else {
      Launch(copy_table, s, {&all, &table, &k});
    }
    Launch(sum_into, s, {&pressure, &acc, &pn});  // the targets make room
    Launch(add_all, s, {&table, &k, &n});
    CHECK(cuStreamSynchronize(s));
  }

  uint64_t h = 0xcbf29ce484222325ull;
  for (CUdeviceptr p : target) {
    CHECK(cuMemcpyDtoH(host.data(), p, kBuf));
    h = stensor_tests::Fnv1a(h, host.data(), kBuf);
  }
  for (CUdeviceptr p : target) CHECK(cuMemFree(p));
  for (CUdeviceptr p : {pressure, acc, all, table}) CHECK(cuMemFree(p));
  if (copy != nullptr) CHECK(cuGraphExecDestroy(copy));
  CHECK(cuStreamDestroy(s));
  std::printf("checksum %016" PRIx64 "\n", h);
  return stensor_tests::failures == 0 ? 0 : 1;
}
