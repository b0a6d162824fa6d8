// Asks NVML for every device's memory, as a scheduler or a monitor does,
// between CUDA steps given on the command line (tests/nvml_test.sh):
//
//   nvml_probe LOAD STEP...
//
// LOAD says how NVML's entry points are found: `linked` (this binary was
// linked to libnvidia-ml.so.1: the loader binds them), `handle:PATH`
// (dlopen(PATH, RTLD_LOCAL) and dlsym on its handle, as pynvml does) or
// `default:PATH` (dlopen(PATH, RTLD_GLOBAL) and dlsym(RTLD_DEFAULT)).
// The steps:
//   query            "query", then one line per NVML device:
//                    nvml I UUID v1 TOTAL USED FREE v2 TOTAL RESERVED USED FREE
//                    then, once CUDA is initialised, one per CUDA device:
//                    cuda ORDINAL UUID TOTAL FREE (cuMemGetInfo)
//   badversion       nvmlDeviceGetMemoryInfo_v2 of device 0 with a wrong
//                    version, and with none: "badversion RC RC"
//   loadcuda         dlopen("libcuda.so.1") without initialising it
//   cuda             loads the driver and cuInit(0)
//   alloc ORD BYTES  cuMemAlloc of BYTES on CUDA device ORD
// The driver is loaded with dlopen and its entry points found with dlsym, as
// the CUDA runtime finds them, so that a run without `loadcuda` or `cuda`
// never loads it.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "third_party/nvml/nvml_types.h"

extern "C" {
nvmlReturn_t nvmlInit_v2();
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device);
}

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "nvml_probe: %s\n", what.c_str());
  std::exit(1);
}

struct Nvml {
  decltype(&::nvmlInit_v2) init = nullptr;
  decltype(&::nvmlDeviceGetCount_v2) count = nullptr;
  decltype(&::nvmlDeviceGetHandleByIndex_v2) handle = nullptr;
  decltype(&::nvmlDeviceGetUUID) uuid = nullptr;
  decltype(&::nvmlDeviceGetMemoryInfo) memory = nullptr;
  decltype(&::nvmlDeviceGetMemoryInfo_v2) memory_v2 = nullptr;
};

template <typename Fn>
void Find(void* handle, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) Die(std::string("dlsym ") + name + ": " + dlerror());
}

Nvml LoadNvml(const std::string& how) {
  Nvml n;
#ifdef NVML_PROBE_LINKED
  if (how == "linked") {
    n.init = &nvmlInit_v2;
    n.count = &nvmlDeviceGetCount_v2;
    n.handle = &nvmlDeviceGetHandleByIndex_v2;
    n.uuid = &nvmlDeviceGetUUID;
    n.memory = &nvmlDeviceGetMemoryInfo;
    n.memory_v2 = &nvmlDeviceGetMemoryInfo_v2;
    return n;
  }
#endif
  const size_t colon = how.find(':');
  if (colon == std::string::npos) Die("unknown LOAD " + how);
  const std::string kind = how.substr(0, colon), path = how.substr(colon + 1);
  if (kind != "handle" && kind != "default") Die("unknown LOAD " + how);
  void* lib = dlopen(path.c_str(), RTLD_NOW | (kind == "default" ? RTLD_GLOBAL : RTLD_LOCAL));
  if (lib == nullptr) Die(std::string("dlopen: ") + dlerror());
  void* scope = kind == "default" ? RTLD_DEFAULT : lib;
  Find(scope, "nvmlInit_v2", &n.init);
  Find(scope, "nvmlDeviceGetCount_v2", &n.count);
  Find(scope, "nvmlDeviceGetHandleByIndex_v2", &n.handle);
  Find(scope, "nvmlDeviceGetUUID", &n.uuid);
  Find(scope, "nvmlDeviceGetMemoryInfo", &n.memory);
  Find(scope, "nvmlDeviceGetMemoryInfo_v2", &n.memory_v2);
  return n;
}

struct Cuda {
  void* lib = nullptr;
  bool initialised = false;
  std::vector<CUcontext> contexts;
  template <typename Fn>
  Fn Get(const char* name) {
    Fn fn = reinterpret_cast<Fn>(dlsym(lib, name));
    if (fn == nullptr) Die(std::string("no ") + name);
    return fn;
  }
};

void Check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) Die(std::string(what) + " failed: " + std::to_string(r));
}

void Load(Cuda& c) {
  if (c.lib == nullptr) c.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (c.lib == nullptr) Die(std::string("dlopen libcuda.so.1: ") + dlerror());
}

void Query(const Nvml& n, Cuda& c) {
  std::printf("query\n");
  unsigned count = 0;
  if (n.count(&count) != NVML_SUCCESS) Die("nvmlDeviceGetCount_v2");
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t d = nullptr;
    char uuid[NVML_DEVICE_UUID_BUFFER_SIZE];
    nvmlMemory_t m1{};
    nvmlMemory_v2_t m2{};
    m2.version = nvmlMemory_v2;
    if (n.handle(i, &d) != NVML_SUCCESS || n.uuid(d, uuid, sizeof(uuid)) != NVML_SUCCESS ||
        n.memory(d, &m1) != NVML_SUCCESS || n.memory_v2(d, &m2) != NVML_SUCCESS) {
      Die("NVML query of device " + std::to_string(i));
    }
    std::printf("nvml %u %s v1 %llu %llu %llu v2 %llu %llu %llu %llu\n", i, uuid, m1.total, m1.used,
                m1.free, m2.total, m2.reserved, m2.used, m2.free);
  }
  if (!c.initialised) return;
  int devices = 0;
  Check(c.Get<decltype(&cuDeviceGetCount)>("cuDeviceGetCount")(&devices), "cuDeviceGetCount");
  for (int ord = 0; ord < devices; ++ord) {
    CUuuid u{};
    Check(c.Get<decltype(&cuDeviceGetUuid_v2)>("cuDeviceGetUuid_v2")(&u, ord), "cuDeviceGetUuid");
    Check(c.Get<decltype(&cuCtxSetCurrent)>("cuCtxSetCurrent")(c.contexts[ord]), "cuCtxSetCurrent");
    size_t free_bytes = 0, total = 0;
    Check(c.Get<decltype(&cuMemGetInfo_v2)>("cuMemGetInfo_v2")(&free_bytes, &total),
          "cuMemGetInfo");
    const unsigned char* b = reinterpret_cast<const unsigned char*>(u.bytes);
    std::printf(
        "cuda %d GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x"
        " %zu %zu\n",
        ord, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
        b[14], b[15], total, free_bytes);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Die("usage: nvml_probe LOAD STEP...");
  Nvml n = LoadNvml(argv[1]);
  if (n.init() != NVML_SUCCESS) Die("nvmlInit_v2");
  Cuda c;
  for (int i = 2; i < argc; ++i) {
    const std::string step = argv[i];
    if (step == "query") {
      Query(n, c);
    } else if (step == "badversion") {
      nvmlDevice_t d = nullptr;
      if (n.handle(0, &d) != NVML_SUCCESS) Die("nvmlDeviceGetHandleByIndex_v2");
      nvmlMemory_v2_t m{};
      m.version = (1u << 24) | sizeof(nvmlMemory_v2_t);
      const int wrong = n.memory_v2(d, &m);
      m.version = 0;
      std::printf("badversion %d %d\n", wrong, static_cast<int>(n.memory_v2(d, &m)));
    } else if (step == "loadcuda") {
      Load(c);
    } else if (step == "cuda") {
      Load(c);
      Check(c.Get<decltype(&cuInit)>("cuInit")(0), "cuInit");
      int devices = 0;
      Check(c.Get<decltype(&cuDeviceGetCount)>("cuDeviceGetCount")(&devices), "cuDeviceGetCount");
      for (int ord = 0; ord < devices; ++ord) {
        CUcontext ctx = nullptr;
        Check(c.Get<decltype(&cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain")(&ctx, ord),
              "cuDevicePrimaryCtxRetain");
        c.contexts.push_back(ctx);
      }
      c.initialised = true;
    } else if (step == "alloc" && i + 2 < argc) {
      const int ord = std::atoi(argv[++i]);
      const size_t bytes = std::strtoull(argv[++i], nullptr, 10);
      if (!c.initialised || ord < 0 || ord >= static_cast<int>(c.contexts.size())) {
        Die("alloc before cuda, or no such device");
      }
      Check(c.Get<decltype(&cuCtxSetCurrent)>("cuCtxSetCurrent")(c.contexts[ord]),
            "cuCtxSetCurrent");
      CUdeviceptr p = 0;
      Check(c.Get<decltype(&cuMemAlloc_v2)>("cuMemAlloc_v2")(&p, bytes), "cuMemAlloc");
    } else {
      Die("unknown step " + step);
    }
  }
  std::printf("ok\n");
  return 0;
}
