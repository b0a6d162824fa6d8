// Reaches the driver the way the CUDA runtime does, for the preload tests:
// dlopen("libcuda.so.1"), dlsym of cuGetProcAddress_v2, then cuInit and
// cuGetProcAddress itself through it (at 11030 and 12000), then every other
// entry point through the 4-argument cuGetProcAddress, with and without the
// per-thread-default-stream flag. It checks that each hooked entry point
// comes back as the hook of exactly the requested ABI (by the symbol name of
// the returned address) when `--expect-hooks LIB` names the interposer, or as
// the driver's own entry point otherwise, and then uses them.
//
// Exit status 0 when every check passes; each failure is printed.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>

namespace {

int g_failures = 0;

void Fail(const std::string& what) {
  std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  ++g_failures;
}

std::string Describe(void* p) {
  Dl_info info{};
  if (p == nullptr) return "(null)";
  if (dladdr(p, &info) == 0 || info.dli_sname == nullptr) return "(unknown)";
  std::string file = info.dli_fname ? info.dli_fname : "?";
  return std::string(info.dli_sname) + " in " + file.substr(file.rfind('/') + 1);
}

using GetProc4 = CUresult (*)(const char*, void**, int, cuuint64_t);
using GetProc5 = decltype(&cuGetProcAddress_v2);

std::string g_hook_lib;  // file name of the interposer, or "" for none

// Checks that `p` is `symbol`, provided by the interposer when `hooked` and
// one is expected, else by the driver.
void Expect(void* p, const char* symbol, bool hooked, const std::string& what) {
  std::string got = Describe(p);
  std::string lib = hooked && !g_hook_lib.empty() ? g_hook_lib : "libcuda.so.1";
  std::string want = std::string(symbol) + " in " + lib;
  if (got != want) Fail(what + ": got " + got + ", want " + want);
}

struct Gate {
  static void CUDA_CB Wait(void* self) {
    while (!static_cast<Gate*>(self)->open.load()) std::this_thread::yield();
  }
  std::atomic<bool> open{false};
};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--expect-hooks") == 0) g_hook_lib = argv[2];
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (cuda == nullptr) {
    std::fprintf(stderr, "cannot load libcuda.so.1: %s\n", dlerror());
    return 1;
  }
  auto get5 = reinterpret_cast<GetProc5>(dlsym(cuda, "cuGetProcAddress_v2"));
  Expect(reinterpret_cast<void*>(get5), "cuGetProcAddress_v2", true, "dlsym(cuGetProcAddress_v2)");
  if (get5 == nullptr) return 1;

  void* p = nullptr;
  CUdriverProcAddressQueryResult status;
  get5("cuInit", &p, 11030, 0, &status);
  Expect(p, "cuInit", false, "cuInit@11030");
  auto init = reinterpret_cast<decltype(&cuInit)>(p);
  void* get4_ptr = nullptr;
  get5("cuGetProcAddress", &get4_ptr, 11030, 0, &status);
  Expect(get4_ptr, "cuGetProcAddress", true, "cuGetProcAddress@11030");
  get5("cuGetProcAddress", &p, 12000, 0, &status);
  Expect(p, "cuGetProcAddress_v2", true, "cuGetProcAddress@12000");
  auto get4 = reinterpret_cast<GetProc4>(get4_ptr);
  if (get4 == nullptr || init(0) != CUDA_SUCCESS) return 1;

  constexpr cuuint64_t kPT = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  struct Case {
    const char* name;
    int version;
    cuuint64_t flags;
    const char* symbol;
    bool hooked;
  } cases[] = {
      {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2", true},
      {"cuMemFree", 3020, kPT, "cuMemFree_v2", true},
      {"cuLaunchKernel", 4000, 0, "cuLaunchKernel", true},
      {"cuLaunchKernel", 7000, 0, "cuLaunchKernel", true},
      {"cuLaunchKernel", 7000, kPT, "cuLaunchKernel_ptsz", true},
      {"cuMemcpy", 7000, kPT, "cuMemcpy_ptds", true},
      {"cuMemcpyHtoD", 3020, 0, "cuMemcpyHtoD_v2", true},
      {"cuMemcpyHtoD", 12000, kPT, "cuMemcpyHtoD_v2_ptds", true},
      {"cuMemcpyDtoH", 12000, kPT, "cuMemcpyDtoH_v2_ptds", true},
      {"cuMemsetD8Async", 12000, kPT, "cuMemsetD8Async_ptsz", true},
      {"cuStreamSynchronize", 12000, kPT, "cuStreamSynchronize_ptsz", true},
      {"cuCtxSynchronize", 12000, 0, "cuCtxSynchronize", true},
      {"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2", true},
      {"cuDeviceGet", 2000, 0, "cuDeviceGet", false},
      {"cuStreamQuery", 12000, kPT, "cuStreamQuery_ptsz", false},
  };
  for (const Case& c : cases) {
    void* fn = nullptr;
    CUresult r = get4(c.name, &fn, c.version, c.flags);
    std::string what =
        std::string(c.name) + "@" + std::to_string(c.version) + (c.flags ? "/per-thread" : "");
    if (r != CUDA_SUCCESS) {
      Fail(what + ": cuGetProcAddress returned " + std::to_string(r));
      continue;
    }
    Expect(fn, c.symbol, c.hooked, what);
    void* fn5 = nullptr;
    get5(c.name, &fn5, c.version, c.flags, &status);
    if (fn5 != fn) Fail(what + ": the two cuGetProcAddress forms disagree");
  }

  // The per-thread flag at a version before cuMemcpy had a per-thread
  // twin: not found, as the driver answers (not the legacy-stream one).
  {
    void* fn = nullptr;
    CUresult r = get4("cuMemcpy", &fn, 4000, kPT);
    if (r != CUDA_ERROR_NOT_FOUND || fn != nullptr) {
      Fail("cuMemcpy@4000/per-thread: returned " + std::to_string(r) + ", want not found");
    }
  }

  // Use them: the per-thread entry points must keep meaning this thread's
  // own stream. Another thread holds its per-thread stream; this thread's
  // synchronous per-thread copy must not wait for it (with the legacy
  // stream it would: the legacy stream waits for every blocking stream).
  auto resolve = [&](const char* name, int version, cuuint64_t flags) {
    void* fn = nullptr;
    get4(name, &fn, version, flags);
    return fn;
  };
  auto device_get = reinterpret_cast<decltype(&cuDeviceGet)>(resolve("cuDeviceGet", 2000, 0));
  auto retain = reinterpret_cast<decltype(&cuDevicePrimaryCtxRetain)>(
      resolve("cuDevicePrimaryCtxRetain", 7000, 0));
  auto set_current =
      reinterpret_cast<decltype(&cuCtxSetCurrent)>(resolve("cuCtxSetCurrent", 4000, 0));
  auto alloc = reinterpret_cast<decltype(&cuMemAlloc_v2)>(resolve("cuMemAlloc", 3020, 0));
  auto memset_pt =
      reinterpret_cast<decltype(&cuMemsetD8Async)>(resolve("cuMemsetD8Async", 12000, kPT));
  auto dtoh_pt = reinterpret_cast<decltype(&cuMemcpyDtoH_v2)>(resolve("cuMemcpyDtoH", 12000, kPT));
  auto host_fn_pt =
      reinterpret_cast<decltype(&cuLaunchHostFunc)>(resolve("cuLaunchHostFunc", 12000, kPT));
  auto sync_pt =
      reinterpret_cast<decltype(&cuStreamSynchronize)>(resolve("cuStreamSynchronize", 12000, kPT));
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr d;
  if (device_get(&dev, 0) || retain(&ctx, dev) || set_current(ctx) || alloc(&d, 64)) {
    Fail("set-up through the resolved entry points");
    return 1;
  }
  Gate gate;
  std::atomic<bool> held{false};
  std::thread other([&] {
    set_current(ctx);
    host_fn_pt(nullptr, &Gate::Wait, &gate);
    held.store(true);
    while (!gate.open.load()) std::this_thread::yield();
    sync_pt(nullptr);
  });
  while (!held.load()) std::this_thread::yield();
  unsigned char out[64] = {};
  if (memset_pt(d, 42, 64, nullptr) != CUDA_SUCCESS || dtoh_pt(out, d, 64) != CUDA_SUCCESS ||
      out[63] != 42) {
    Fail("per-thread memset and copy on this thread's stream");
  }
  gate.open.store(true);
  other.join();

  if (g_failures == 0) std::printf("runtime_path: all checks passed\n");
  return g_failures == 0 ? 0 : 1;
}
