// device_probe: answers, on a real GPU, what the fake driver cannot: which
// virtual-memory features the device has, what the VMM calls cost, the
// pinned-copy bandwidth each way and both ways at once, and a kernel's
// bandwidth through host-located mappings. Each prints one JSON object on
// stdout (scripts/gpu_check.sh puts them in its report):
//   device_probe attributes   compute capability, memory, copy engines, the
//                             VMM and host-VMM attributes, granularities
//   device_probe vmm          p50/p99 microseconds of cuMemCreate, cuMemMap,
//                             cuMemSetAccess, cuMemUnmap, cuMemRelease for
//                             one 2 MiB granule, device- and host-located;
//                             a 64 MiB range of 32 granules mapped, access
//                             set once and per granule, and one 64 MiB handle
//   device_probe bandwidth    pinned copies of 256 MiB: GB/s host to device,
//                             device to host, and each while the other runs
//   device_probe mapped       GB/s of a kernel reading and writing 256 MiB
//                             through a host-located VMM mapping, and
//                             through device memory for comparison
//   device_probe launch       host time per kernel launch (<<<>>>, through
//                             cudart's cuGetProcAddress as programs launch),
//                             one 1 MiB buffer argument: with stensor
//                             preloaded, the launch hook's cost
// Exit status: 0 on success, 1 on a failed call (named on stderr), 2 on bad
// usage. A feature the device lacks is reported, not a failure.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

bool Ok(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::fprintf(stderr, "device_probe: %s: %s (%d)\n", what, name ? name : "?", static_cast<int>(r));
  return false;
}
#define OK(call)                      \
  do {                                \
    if (!Ok((call), #call)) return 1; \
  } while (0)

CUdevice g_dev;
CUcontext g_ctx;

int Init() {
  // The primary context, which the runtime's kernel launches use too.
  OK(cuInit(0));
  OK(cuDeviceGet(&g_dev, 0));
  OK(cuDevicePrimaryCtxRetain(&g_ctx, g_dev));
  OK(cuCtxSetCurrent(g_ctx));
  return 0;
}

int Attr(CUdevice_attribute a) {
  int v = -1;
  // An attribute the driver does not know reads as -1.
  if (cuDeviceGetAttribute(&v, a, g_dev) != CUDA_SUCCESS) return -1;
  return v;
}

CUmemAllocationProp Prop(CUmemLocationType type, int id) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = type;
  p.location.id = id;
  return p;
}

// Minimum granularity for a location, 0 when the driver refuses it.
size_t Granularity(CUmemLocationType type, int id, CUmemAllocationGranularity_flags flag) {
  CUmemAllocationProp p = Prop(type, id);
  size_t g = 0;
  if (cuMemGetAllocationGranularity(&g, &p, flag) != CUDA_SUCCESS) return 0;
  return g;
}

int Attributes() {
  char name[256] = {};
  cuDeviceGetName(name, sizeof name, g_dev);
  size_t total = 0;
  OK(cuDeviceTotalMem(&total, g_dev));
  size_t free_b = 0, total_b = 0;
  OK(cuMemGetInfo(&free_b, &total_b));
  int driver = 0;
  OK(cuDriverGetVersion(&driver));
  int numa = Attr(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID);
  std::printf(
      "{\"name\": \"%s\", \"driver_api\": %d, \"compute_capability\": \"%d.%d\", "
      "\"multiprocessors\": %d, \"total_bytes\": %zu, \"free_bytes\": %zu, "
      "\"async_engines\": %d, \"unified_addressing\": %d, \"pageable_memory_access\": %d, "
      "\"host_pointer_for_registered\": %d, \"vmm\": %d, \"host_vmm\": %d, "
      "\"host_numa_vmm\": %d, \"host_numa_pools\": %d, \"host_numa_id\": %d, "
      "\"memory_pools\": %d, \"gpu_direct_rdma\": %d, \"posix_fd_handles\": %d, "
      "\"granularity_device\": %zu, \"granularity_device_recommended\": %zu, "
      "\"granularity_host\": %zu, \"granularity_host_numa\": %zu}\n",
      name, driver, Attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
      Attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
      Attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), total, free_b,
      Attr(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT), Attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING),
      Attr(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS),
      Attr(CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM),
      Attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
      Attr(CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
      Attr(CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
      Attr(CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED), numa,
      Attr(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED),
      Attr(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED),
      Attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED),
      Granularity(CU_MEM_LOCATION_TYPE_DEVICE, g_dev, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
      Granularity(CU_MEM_LOCATION_TYPE_DEVICE, g_dev, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
      Granularity(CU_MEM_LOCATION_TYPE_HOST, 0, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
      Granularity(CU_MEM_LOCATION_TYPE_HOST_NUMA, numa < 0 ? 0 : numa,
                  CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return 0;
}

double Micros(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

struct Percentiles {
  double p50 = -1, p99 = -1;
};

Percentiles Of(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.p50 = v[v.size() / 2];
  p.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  return p;
}

// Times the VMM calls for one granule at a location; prints a JSON member,
// or "null" when the location cannot be created (cuMemCreate's error
// follows as "<name>_error").
int TimeVmm(const char* label, CUmemLocationType type, int id, bool comma) {
  size_t g = Granularity(type, id, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  std::printf("%s\"%s\": ", comma ? ", " : "", label);
  if (g == 0) {
    std::printf("null");
    return 0;
  }
  constexpr int kRounds = 200;
  std::vector<double> create, map, access, unmap, release;
  CUdeviceptr va = 0;
  OK(cuMemAddressReserve(&va, g, 0, 0, 0));
  CUmemAllocationProp prop = Prop(type, id);
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = g_dev;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (int i = 0; i < kRounds; ++i) {
    CUmemGenericAllocationHandle h;
    auto t0 = std::chrono::steady_clock::now();
    CUresult r = cuMemCreate(&h, g, &prop, 0);
    auto t1 = std::chrono::steady_clock::now();
    if (r != CUDA_SUCCESS) {
      const char* name = "?";
      cuGetErrorName(r, &name);
      std::printf("{\"error\": \"%s\"}", name);
      cuMemAddressFree(va, g);
      return 0;
    }
    OK(cuMemMap(va, g, 0, h, 0));
    auto t2 = std::chrono::steady_clock::now();
    OK(cuMemSetAccess(va, g, &desc, 1));
    auto t3 = std::chrono::steady_clock::now();
    OK(cuMemUnmap(va, g));
    auto t4 = std::chrono::steady_clock::now();
    OK(cuMemRelease(h));
    auto t5 = std::chrono::steady_clock::now();
    create.push_back(Micros(t0, t1));
    map.push_back(Micros(t1, t2));
    access.push_back(Micros(t2, t3));
    unmap.push_back(Micros(t3, t4));
    release.push_back(Micros(t4, t5));
  }
  OK(cuMemAddressFree(va, g));
  auto put = [](const char* n, const std::vector<double>& v, bool last) {
    Percentiles p = Of(v);
    std::printf("\"%s_us\": {\"p50\": %.1f, \"p99\": %.1f}%s", n, p.p50, p.p99, last ? "" : ", ");
  };
  std::printf("{\"bytes\": %zu, ", g);
  put("create", create, false);
  put("map", map, false);
  put("set_access", access, false);
  put("unmap", unmap, false);
  put("release", release, true);
  std::printf("}");
  return 0;
}

// Whether mapping cost goes by call or by granule: 32 granule handles mapped
// side by side into one 64 MiB range, then access set once over the range
// and once per granule, against one 64 MiB handle mapped whole. Median
// microseconds of 20 rounds, as a JSON member.
int TimeRanges() {
  size_t g = Granularity(CU_MEM_LOCATION_TYPE_DEVICE, g_dev, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  constexpr int kChunks = 32, kRounds = 20;
  const size_t bytes = g * kChunks;
  CUmemAllocationProp prop = Prop(CU_MEM_LOCATION_TYPE_DEVICE, g_dev);
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = g_dev;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUdeviceptr va = 0;
  OK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> h(kChunks);
  for (auto& x : h) OK(cuMemCreate(&x, g, &prop, 0));
  std::vector<double> map_each, access_once, access_each, unmap_once, whole_map, whole_access,
      whole_unmap;
  for (int r = 0; r < kRounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kChunks; ++i) OK(cuMemMap(va + i * g, g, 0, h[i], 0));
    auto t1 = std::chrono::steady_clock::now();
    OK(cuMemSetAccess(va, bytes, &desc, 1));
    auto t2 = std::chrono::steady_clock::now();
    OK(cuMemUnmap(va, bytes));
    auto t3 = std::chrono::steady_clock::now();
    for (int i = 0; i < kChunks; ++i) OK(cuMemMap(va + i * g, g, 0, h[i], 0));
    auto t4 = std::chrono::steady_clock::now();
    for (int i = 0; i < kChunks; ++i) OK(cuMemSetAccess(va + i * g, g, &desc, 1));
    auto t5 = std::chrono::steady_clock::now();
    OK(cuMemUnmap(va, bytes));
    map_each.push_back(Micros(t0, t1));
    access_once.push_back(Micros(t1, t2));
    unmap_once.push_back(Micros(t2, t3));
    access_each.push_back(Micros(t4, t5));
  }
  for (auto& x : h) OK(cuMemRelease(x));
  CUmemGenericAllocationHandle big;
  OK(cuMemCreate(&big, bytes, &prop, 0));
  for (int r = 0; r < kRounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    OK(cuMemMap(va, bytes, 0, big, 0));
    auto t1 = std::chrono::steady_clock::now();
    OK(cuMemSetAccess(va, bytes, &desc, 1));
    auto t2 = std::chrono::steady_clock::now();
    OK(cuMemUnmap(va, bytes));
    auto t3 = std::chrono::steady_clock::now();
    whole_map.push_back(Micros(t0, t1));
    whole_access.push_back(Micros(t1, t2));
    whole_unmap.push_back(Micros(t2, t3));
  }
  OK(cuMemRelease(big));
  // Creating and releasing one 64 MiB handle: what a pooled chunk of the
  // wrong size costs to replace.
  std::vector<double> whole_create, whole_release;
  for (int r = 0; r < kRounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    OK(cuMemCreate(&big, bytes, &prop, 0));
    auto t1 = std::chrono::steady_clock::now();
    OK(cuMemRelease(big));
    auto t2 = std::chrono::steady_clock::now();
    whole_create.push_back(Micros(t0, t1));
    whole_release.push_back(Micros(t1, t2));
  }
  OK(cuMemAddressFree(va, bytes));
  std::printf(
      ", \"range_64mib_us\": {\"map_32_granules\": %.1f, \"set_access_once\": %.1f, "
      "\"set_access_per_granule\": %.1f, \"unmap_once\": %.1f, \"one_handle_map\": %.1f, "
      "\"one_handle_set_access\": %.1f, \"one_handle_unmap\": %.1f, "
      "\"one_handle_create\": %.1f, \"one_handle_release\": %.1f}",
      Of(map_each).p50, Of(access_once).p50, Of(access_each).p50, Of(unmap_once).p50,
      Of(whole_map).p50, Of(whole_access).p50, Of(whole_unmap).p50, Of(whole_create).p50,
      Of(whole_release).p50);
  return 0;
}

int Vmm() {
  int numa = Attr(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID);
  std::printf("{");
  if (TimeVmm("device", CU_MEM_LOCATION_TYPE_DEVICE, g_dev, false)) return 1;
  if (TimeVmm("host", CU_MEM_LOCATION_TYPE_HOST, 0, true)) return 1;
  if (TimeVmm("host_numa", CU_MEM_LOCATION_TYPE_HOST_NUMA, numa < 0 ? 0 : numa, true)) return 1;
  if (TimeRanges()) return 1;
  std::printf("}\n");
  return 0;
}

// Best of `rounds` of `copy` on stream s, GB/s.
template <typename F>
double BestGbps(size_t bytes, int rounds, F copy) {
  double best = 0;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (!copy()) return -1;
    auto t1 = std::chrono::steady_clock::now();
    best = std::max(best, bytes / (Micros(t0, t1) * 1e3));
  }
  return best;
}

int Bandwidth() {
  constexpr size_t kBytes = size_t{256} << 20;
  void *h_in = nullptr, *h_out = nullptr;
  CUdeviceptr d_in = 0, d_out = 0;
  CUstream a = nullptr, b = nullptr;
  OK(cuMemHostAlloc(&h_in, kBytes, 0));
  OK(cuMemHostAlloc(&h_out, kBytes, 0));
  std::memset(h_in, 1, kBytes);
  std::memset(h_out, 2, kBytes);
  OK(cuMemAlloc(&d_in, kBytes));
  OK(cuMemAlloc(&d_out, kBytes));
  OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  auto h2d = [&] {
    return Ok(cuMemcpyHtoDAsync(d_in, h_in, kBytes, a), "h2d") &&
           Ok(cuStreamSynchronize(a), "sync");
  };
  auto d2h = [&] {
    return Ok(cuMemcpyDtoHAsync(h_out, d_out, kBytes, b), "d2h") &&
           Ok(cuStreamSynchronize(b), "sync");
  };
  // Both at once: the two directions' copies on two streams, timed
  // together; each direction's rate is its bytes over the common time.
  auto both = [&] {
    return Ok(cuMemcpyHtoDAsync(d_in, h_in, kBytes, a), "h2d") &&
           Ok(cuMemcpyDtoHAsync(h_out, d_out, kBytes, b), "d2h") &&
           Ok(cuStreamSynchronize(a), "sync") && Ok(cuStreamSynchronize(b), "sync");
  };
  double up = BestGbps(kBytes, 5, h2d);
  double down = BestGbps(kBytes, 5, d2h);
  double each = BestGbps(kBytes, 5, both);
  std::printf(
      "{\"bytes\": %zu, \"h2d_gbps\": %.2f, \"d2h_gbps\": %.2f, "
      "\"both_each_gbps\": %.2f, \"both_total_gbps\": %.2f}\n",
      kBytes, up, down, each, 2 * each);
  cuStreamDestroy(a);
  cuStreamDestroy(b);
  cuMemFree(d_in);
  cuMemFree(d_out);
  cuMemFreeHost(h_in);
  cuMemFreeHost(h_out);
  return up < 0 || down < 0 || each < 0;
}

__global__ void Sum(const uint4* x, size_t n, unsigned* out) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint4 v = x[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *out = acc;  // keeps the loads
}

__global__ void Store(uint4* x, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    x[i] = make_uint4(unsigned(i), 1, 2, 3);
  }
}

// Kernel read and write GB/s over [p, p + bytes).
int KernelGbps(CUdeviceptr p, size_t bytes, double* read, double* write) {
  unsigned* sink = nullptr;
  if (cudaMalloc(&sink, sizeof(unsigned)) != cudaSuccess) return 1;
  size_t n = bytes / sizeof(uint4);
  auto* x = reinterpret_cast<uint4*>(p);
  *read = *write = 0;
  for (int i = 0; i < 4; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Store<<<1024, 256>>>(x, n);
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    auto t1 = std::chrono::steady_clock::now();
    Sum<<<1024, 256>>>(x, n, sink);
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    auto t2 = std::chrono::steady_clock::now();
    *write = std::max(*write, bytes / (Micros(t0, t1) * 1e3));
    *read = std::max(*read, bytes / (Micros(t1, t2) * 1e3));
  }
  cudaFree(sink);
  return 0;
}

int Mapped() {
  constexpr size_t kBytes = size_t{256} << 20;
  CUdeviceptr dev = 0;
  OK(cuMemAlloc(&dev, kBytes));
  double dr = 0, dw = 0;
  if (KernelGbps(dev, kBytes, &dr, &dw)) {
    std::fprintf(stderr, "device_probe: the kernel on device memory failed\n");
    return 1;
  }
  OK(cuMemFree(dev));
  std::printf("{\"device_read_gbps\": %.1f, \"device_write_gbps\": %.1f, ", dr, dw);
  size_t g = Granularity(CU_MEM_LOCATION_TYPE_HOST, 0, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  CUmemAllocationProp prop = Prop(CU_MEM_LOCATION_TYPE_HOST, 0);
  CUmemGenericAllocationHandle h;
  CUresult r = g ? cuMemCreate(&h, kBytes, &prop, 0) : CUDA_ERROR_NOT_SUPPORTED;
  if (r != CUDA_SUCCESS) {
    const char* name = "?";
    cuGetErrorName(r, &name);
    std::printf("\"host_read_gbps\": null, \"host_write_gbps\": null, \"host_error\": \"%s\"}\n",
                name);
    return 0;
  }
  CUdeviceptr va = 0;
  OK(cuMemAddressReserve(&va, kBytes, 0, 0, 0));
  OK(cuMemMap(va, kBytes, 0, h, 0));
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = g_dev;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  OK(cuMemSetAccess(va, kBytes, &desc, 1));
  double hr = 0, hw = 0;
  if (KernelGbps(va, kBytes, &hr, &hw)) {
    std::fprintf(stderr, "device_probe: the kernel on the host-located mapping failed\n");
    return 1;
  }
  std::printf("\"host_read_gbps\": %.1f, \"host_write_gbps\": %.1f}\n", hr, hw);
  OK(cuMemUnmap(va, kBytes));
  OK(cuMemAddressFree(va, kBytes));
  OK(cuMemRelease(h));
  return 0;
}

__global__ void Bump(float* p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += 1.0f;
}

int Launch() {
  constexpr int kWarm = 2000, kLaunches = 50000;
  float* p = nullptr;
  if (cudaMalloc(&p, 1 << 20) != cudaSuccess || cudaMemset(p, 0, 1 << 20) != cudaSuccess) {
    std::fprintf(stderr, "device_probe: cudaMalloc/cudaMemset failed\n");
    return 1;
  }
  for (int i = 0; i < kWarm; ++i) Bump<<<1, 32>>>(p);
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kLaunches; ++i) Bump<<<1, 32>>>(p);
  auto t1 = std::chrono::steady_clock::now();
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  auto t2 = std::chrono::steady_clock::now();
  float v = 0;
  if (cudaMemcpy(&v, p, sizeof v, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
  // Every launch ran: the count is exact in a float up to 2^24.
  const bool all_ran = v == static_cast<float>(kWarm + kLaunches);
  std::printf(
      "{\"launches\": %d, \"submit_ns_per_launch\": %.0f, \"total_ns_per_launch\": %.0f, "
      "\"all_ran\": %s}\n",
      kLaunches, Micros(t0, t1) * 1e3 / kLaunches, Micros(t0, t2) * 1e3 / kLaunches,
      all_ran ? "true" : "false");
  cudaFree(p);
  return all_ran ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: device_probe attributes|vmm|bandwidth|mapped|launch\n");
    return 2;
  }
  std::string mode = argv[1];
  if (mode != "attributes" && mode != "vmm" && mode != "bandwidth" && mode != "mapped" &&
      mode != "launch") {
    std::fprintf(stderr, "device_probe: unknown mode '%s'\n", argv[1]);
    return 2;
  }
  if (Init()) return 1;
  if (mode == "attributes") return Attributes();
  if (mode == "vmm") return Vmm();
  if (mode == "bandwidth") return Bandwidth();
  if (mode == "mapped") return Mapped();
  return Launch();
}
