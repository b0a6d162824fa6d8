// runtime_probe: a CUDA-runtime program for the GPU check (scripts/
// gpu_check.sh), built by nvcc with the static runtime so that it reaches
// the driver the way most training programs do: through cudart's
// cuGetProcAddress, not through libcuda's exported symbols.
//   runtime_probe version     driver and runtime versions; exit 3 when the
//                             driver is older than the runtime
//   runtime_probe check       allocate, fill, add, copy back: prints
//                             "checksum <hex>" (same on every GPU)
// Exit status: 0 on success, 1 on a failed CUDA call, 2 on bad usage.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

bool Ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "runtime_probe: %s: %s (%d)\n", what, cudaGetErrorString(e),
               static_cast<int>(e));
  return false;
}
#define OK(call)                      \
  do {                                \
    if (!Ok((call), #call)) return 1; \
  } while (0)

__global__ void Fill(float* x, int n, float seed) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = seed + static_cast<float>(i % 1000) * 0.5f;
}

__global__ void Add(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += 2.0f * x[i];
}

int Version() {
  int driver = 0, runtime = 0;
  OK(cudaDriverGetVersion(&driver));
  OK(cudaRuntimeGetVersion(&runtime));
  std::printf("driver %d runtime %d\n", driver, runtime);
  if (driver == 0) {
    std::fprintf(stderr, "runtime_probe: no NVIDIA driver found (libcuda.so.1)\n");
    return 3;
  }
  if (driver < runtime) {
    std::fprintf(stderr,
                 "runtime_probe: the driver supports CUDA %d.%d, older than this build's "
                 "toolkit (%d.%d): install a newer NVIDIA driver\n",
                 driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
    return 3;
  }
  return 0;
}

int Check() {
  constexpr int kN = 1 << 20;  // 4 MiB per buffer
  float *x = nullptr, *y = nullptr;
  OK(cudaMalloc(&x, kN * sizeof(float)));
  OK(cudaMalloc(&y, kN * sizeof(float)));
  Fill<<<(kN + 255) / 256, 256>>>(x, kN, 1.0f);
  Fill<<<(kN + 255) / 256, 256>>>(y, kN, 3.0f);
  Add<<<(kN + 255) / 256, 256>>>(x, y, kN);
  OK(cudaGetLastError());
  std::vector<float> h(kN);
  OK(cudaMemcpy(h.data(), y, kN * sizeof(float), cudaMemcpyDeviceToHost));
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the bytes
  for (float v : h) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    for (int b = 0; b < 4; ++b) hash = (hash ^ ((bits >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  OK(cudaFree(x));
  OK(cudaFree(y));
  std::printf("checksum %016llx\n", static_cast<unsigned long long>(hash));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "version") == 0) return Version();
  if (argc == 2 && std::strcmp(argv[1], "check") == 0) return Check();
  std::fprintf(stderr, "usage: runtime_probe version|check\n");
  return 2;
}
