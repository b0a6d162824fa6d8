// Fake driver: modules of host kernels (see fake_kernel.h), function
// introspection and kernel launches.
#include <dlfcn.h>
#include <elf.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <unordered_set>

#include "tests/fakecuda/host_touch.h"
#include "tests/fakecuda/internal.h"
#include "tests/fakecuda/module_abi.h"
#include "tests/fakecuda/trace.h"

namespace fakecuda {
namespace {

constexpr int kDefaultSharedBytes = 48 * 1024;
constexpr int kOptInSharedBytes = 227 * 1024;  // per block, Hopper

struct Module;

struct Function {
  Module* module = nullptr;
  const fakecuda_kernel_desc* desc = nullptr;
  // Dynamic shared memory a launch may ask for: 48 KiB unless raised with
  // cuFuncSetAttribute, as on the real driver.
  std::atomic<int> max_dynamic_shared{kDefaultSharedBytes};
};

struct Module {
  void* dl = nullptr;
  // cuModuleLoadData: the memfd holding the image, open while the module is
  // loaded so that no other module's /proc/self/fd path names the same
  // number (the dynamic loader matches loaded objects by name).
  int image_fd = -1;
  std::map<std::string, Function*> functions;  // slots of Modules::free
};

// Function objects are slots that are never freed: an unloaded module's
// slots go on the `free` stack and the next module loaded takes the most
// recently freed first, so a CUfunction handle comes back for another
// kernel, as the real driver's allocator can make it. Until then the stale handle is not in
// `funcs` and reads as invalid.
struct Modules {
  std::mutex mu;
  std::unordered_set<Module*> live;     // guarded by mu
  std::unordered_set<Function*> funcs;  // guarded by mu
  std::vector<Function*> free;          // guarded by mu; a stack
};

// A fresh function slot: a recycled one when there is one. Needs `all.mu`.
Function* NewFunction(Modules& all, Module* mod, const fakecuda_kernel_desc* desc) {
  Function* fn;
  if (all.free.empty()) {
    fn = new Function;
  } else {
    fn = all.free.back();
    all.free.pop_back();
  }
  fn->module = mod;
  fn->desc = desc;
  fn->max_dynamic_shared.store(kDefaultSharedBytes);
  return fn;
}

Modules& GetModules() {
  static Modules* m = new Modules;
  return *m;
}

Function* LookupFunction(CUfunction f) {
  Modules& all = GetModules();
  std::lock_guard<std::mutex> lock(all.mu);
  auto* fn = reinterpret_cast<Function*>(f);
  return all.funcs.count(fn) ? fn : nullptr;
}

// Packs the parameters into one buffer laid out as the kernel expects,
// from either kernelParams or the `extra` buffer form. The copy is taken at
// launch time, as the real driver does.
// An `extra` that holds only CU_LAUNCH_PARAM_END is no `extra`: driver 580
// launched kernelParams given with one (on an H200, docs/gpu.md), and
// refuses it alone as it refuses no parameters at all. The packed buffer's
// size must be the kernel's parameter size exactly, without tail padding
// (sizeof of a struct of the parameters is often larger): any other is
// CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, as driver 580 answered for 32 bytes
// to a kernel whose parameters take 28 (LLVM's offload plugin met the same:
// llvm/llvm-project#156229); a smaller size is assumed to be refused alike.
CUresult PackParams(const fakecuda_kernel_desc* k, void** params, void** extra,
                    std::vector<unsigned char>* out) {
  if (extra != nullptr && extra[0] == CU_LAUNCH_PARAM_END) extra = nullptr;
  if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  out->assign(k->args_size, 0);
  if (k->num_params == 0) return CUDA_SUCCESS;
  if (params != nullptr) {
    for (unsigned i = 0; i < k->num_params; ++i) {
      if (params[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
      std::memcpy(out->data() + k->param_offsets[i], params[i], k->param_sizes[i]);
    }
    return CUDA_SUCCESS;
  }
  if (extra == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const void* buffer = nullptr;
  const size_t* size = nullptr;
  for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
      buffer = extra[i + 1];
    } else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) {
      size = static_cast<const size_t*>(extra[i + 1]);
    } else {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (buffer == nullptr || size == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (*size != k->args_size) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  std::memcpy(out->data(), buffer, k->args_size);
  return CUDA_SUCCESS;
}

// A launch's checks and its packed parameters, as a kernel node.
CUresult KernelNode(CUfunction f, fakecuda_dim3 grid, fakecuda_dim3 block, unsigned shared_mem,
                    void** params, void** extra, NodeSpec* out) {
  Function* fn = LookupFunction(f);
  if (fn == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const fakecuda_kernel_desc* k = fn->desc;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (block.x > 1024 || block.y > 1024 || block.z > 64 ||
      static_cast<unsigned long long>(block.x) * block.y * block.z > 1024 || grid.y > 65535 ||
      grid.z > 65535 || grid.x > 2147483647u) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (shared_mem > static_cast<unsigned>(fn->max_dynamic_shared.load())) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto packed = std::make_shared<std::vector<unsigned char>>();
  if (CUresult r = PackParams(k, params, extra, packed.get()); r != CUDA_SUCCESS) {
    return r;
  }
  out->type = CU_GRAPH_NODE_TYPE_KERNEL;
  out->func = f;
  out->grid[0] = grid.x;
  out->grid[1] = grid.y;
  out->grid[2] = grid.z;
  out->block[0] = block.x;
  out->block[1] = block.y;
  out->block[2] = block.z;
  out->shared_mem = shared_mem;
  out->param_offsets.assign(k->param_offsets, k->param_offsets + k->num_params);
  out->args = packed;
  out->run = [k, grid, block, packed](Stream* s) {
    auto invoke = [&] { k->invoke(k->fn, packed->data(), grid, block); };
    // Under FAKECUDA_LINK, a kernel whose pointer parameters reach
    // host-located VMM memory (a buffer served from host) reads it over the
    // link, as on a GPU (about 50 GB/s on an H200): the pages it touches
    // there (host_touch.h), on the host-to-device engine from its start, so
    // that it takes the longer of its own run (the counting's faults
    // included) and the link's time for those pages.
    if (!LinkTimed(Link::kHostToDevice) || s == nullptr) {
      invoke();
      return;
    }
    std::vector<uint64_t> words;
    for (unsigned i = 0; i < k->num_params; ++i) {
      if (k->param_sizes[i] != sizeof(uint64_t)) continue;
      uint64_t w;
      std::memcpy(&w, packed->data() + k->param_offsets[i], sizeof(w));
      words.push_back(w);
    }
    HostTouches touches;
    WatchHostMapped(words.data(), words.size(), &touches);
    if (touches.empty()) {
      invoke();
      return;
    }
    const auto began = std::chrono::steady_clock::now();
    invoke();
    const HostTouches::Result touched = touches.Finish();
    NoteHostBytesTouched(touched.bytes, touched.faults);  // the kernel's trace record
    RunOnCopyEngine(
        s->context()->device, Link::kHostToDevice, touched.bytes, [] {}, began);
  };
  out->label = OpLabel{OpKind::kKernel};
  out->label.name = k->name;
  return CUDA_SUCCESS;
}

CUresult Launch(CUfunction f, fakecuda_dim3 grid, fakecuda_dim3 block, unsigned shared_mem,
                CUstream h, void** params, void** extra, bool per_thread) {
  NodeSpec node;
  if (CUresult r = KernelNode(f, grid, block, shared_mem, params, extra, &node);
      r != CUDA_SUCCESS) {
    return r;
  }
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, per_thread, &s); r != CUDA_SUCCESS) return r;
  // A kernel runs in the current context: the programming guide's
  // multi-device rules say a launch on a stream of another device fails
  // (the runtime reports it as an invalid resource handle), while copies,
  // stream waits and event queries across devices succeed.
  Context* current = nullptr;
  if (CUresult r = RequireContext(&current); r != CUDA_SUCCESS) return r;
  if (s->context() != current) return CUDA_ERROR_INVALID_HANDLE;
  node.ctx = current;
  bool capturing = false;
  if (CUresult r = CaptureCheck(s, &capturing); r != CUDA_SUCCESS) return r;
  if (capturing) return CaptureAdd(s, std::move(node));
  Submit(
      s, [run = std::move(node.run), s] { run(s); }, {}, node.label);
  return CUDA_SUCCESS;
}

CUresult LaunchEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra,
                  bool per_thread) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (config->numAttrs > 0 && config->attrs == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return Launch(f, {config->gridDimX, config->gridDimY, config->gridDimZ},
                {config->blockDimX, config->blockDimY, config->blockDimZ}, config->sharedMemBytes,
                config->hStream, params, extra, per_thread);
}

// Opens the host-kernel module at `path` (for cuModuleLoadData, the memfd
// `image_fd` holds it) and registers its kernels.
CUresult OpenModule(const char* path, int image_fd, CUmodule* module) {
  // Only host-kernel modules run here: a cubin or any other file is an
  // image this "device" cannot execute.
  void* dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (dl == nullptr) return CUDA_ERROR_INVALID_IMAGE;
  auto list = reinterpret_cast<fakecuda_module_kernels_fn>(dlsym(dl, "fakecuda_module_kernels"));
  if (list == nullptr) {
    dlclose(dl);
    return CUDA_ERROR_INVALID_IMAGE;
  }
  const fakecuda_kernel_desc* kernels = nullptr;
  int n = list(&kernels);
  auto* mod = new Module;
  mod->dl = dl;
  mod->image_fd = image_fd;
  Modules& all = GetModules();
  std::lock_guard<std::mutex> lock(all.mu);
  for (int i = 0; i < n; ++i) {
    Function* fn = NewFunction(all, mod, &kernels[i]);
    all.funcs.insert(fn);
    mod->functions[kernels[i].name] = fn;
  }
  all.live.insert(mod);
  *module = reinterpret_cast<CUmodule>(mod);
  return CUDA_SUCCESS;
}

// Whether `image` starts like a shared object for this host: the only image
// kind the fake can run. A cubin is an ELF file too, for EM_CUDA.
bool IsHostSharedObject(const void* image) {
  // The magic byte by byte first: a PTX image is a string that may be
  // shorter than an ELF header.
  const auto* bytes = static_cast<const unsigned char*>(image);
  for (int i = 0; i < SELFMAG; ++i) {
    if (bytes[i] != static_cast<unsigned char>(ELFMAG[i])) return false;
  }
  Elf64_Ehdr header;
  std::memcpy(&header, image, sizeof(header));
  return std::memcmp(header.e_ident, ELFMAG, SELFMAG) == 0 &&
         header.e_ident[EI_CLASS] == ELFCLASS64 && header.e_type == ET_DYN &&
         header.e_machine == EM_X86_64;
}

}  // namespace

CUresult MakeKernelNode(CUfunction f, const unsigned grid[3], const unsigned block[3],
                        unsigned shared_mem, void** params, void** extra, NodeSpec* out) {
  return KernelNode(f, {grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]}, shared_mem,
                    params, extra, out);
}

}  // namespace fakecuda

using namespace fakecuda;  // NOLINT: the exported C API below

FAKECUDA_EXPORT CUresult cuModuleLoad(CUmodule* module, const char* fname) {
  FAKECUDA_ENTER("cuModuleLoad");
  if (module == nullptr || fname == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  struct stat st;
  if (stat(fname, &st) != 0) return CUDA_ERROR_FILE_NOT_FOUND;
  return OpenModule(fname, -1, module);
}

// The image is a host-kernel module in memory (a shared object, as
// cuModuleLoad opens from a file). Its size is not passed, as with the real
// driver, so the ELF header and section table give it.
FAKECUDA_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  FAKECUDA_ENTER("cuModuleLoadData");
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (!IsHostSharedObject(image)) return CUDA_ERROR_INVALID_IMAGE;
  Elf64_Ehdr header;
  std::memcpy(&header, image, sizeof(header));
  // The section header table comes last in a linked shared object.
  size_t size = header.e_shoff + size_t{header.e_shnum} * header.e_shentsize;
  if (header.e_shoff == 0 || size < sizeof(header)) return CUDA_ERROR_INVALID_IMAGE;
  int fd = memfd_create("fakecuda-module", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto* bytes = static_cast<const char*>(image);
  for (size_t done = 0; done < size;) {
    ssize_t n = write(fd, bytes + done, size - done);
    if (n <= 0) {
      close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    done += static_cast<size_t>(n);
  }
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  CUresult r = OpenModule(path.c_str(), fd, module);
  if (r != CUDA_SUCCESS) close(fd);
  return r;
}

FAKECUDA_EXPORT CUresult cuModuleUnload(CUmodule hmod) {
  FAKECUDA_ENTER("cuModuleUnload");
  auto* mod = reinterpret_cast<Module*>(hmod);
  {
    Modules& all = GetModules();
    std::lock_guard<std::mutex> lock(all.mu);
    if (all.live.erase(mod) == 0) return CUDA_ERROR_INVALID_HANDLE;
    for (auto& entry : mod->functions) all.funcs.erase(entry.second);
  }
  SynchronizeAllContexts();  // queued launches may still call its code
  dlclose(mod->dl);
  if (mod->image_fd >= 0) close(mod->image_fd);
  {
    Modules& all = GetModules();
    std::lock_guard<std::mutex> lock(all.mu);
    for (auto& entry : mod->functions) all.free.push_back(entry.second);
  }
  delete mod;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  FAKECUDA_ENTER("cuModuleGetFunction");
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Modules& all = GetModules();
  std::lock_guard<std::mutex> lock(all.mu);
  auto* mod = reinterpret_cast<Module*>(hmod);
  if (all.live.count(mod) == 0) return CUDA_ERROR_INVALID_HANDLE;
  auto it = mod->functions.find(name);
  if (it == mod->functions.end()) return CUDA_ERROR_NOT_FOUND;
  *hfunc = reinterpret_cast<CUfunction>(it->second);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes, CUmodule hmod,
                                              const char* name) {
  FAKECUDA_ENTER("cuModuleGetGlobal_v2");
  (void)dptr;
  (void)bytes;
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Modules& all = GetModules();
  std::lock_guard<std::mutex> lock(all.mu);
  if (all.live.count(reinterpret_cast<Module*>(hmod)) == 0) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  return CUDA_ERROR_NOT_FOUND;  // host-kernel modules have no __device__ globals
}

FAKECUDA_EXPORT CUresult cuFuncGetName(const char** name, CUfunction hfunc) {
  FAKECUDA_ENTER("cuFuncGetName");
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Function* fn = LookupFunction(hfunc);
  if (fn == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = fn->desc->name;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t index, size_t* offset,
                                            size_t* size) {
  FAKECUDA_ENTER("cuFuncGetParamInfo");
  Function* fn = LookupFunction(func);
  if (fn == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const fakecuda_kernel_desc* k = fn->desc;
  if (index >= k->num_params) return CUDA_ERROR_INVALID_VALUE;
  if (offset != nullptr) *offset = k->param_offsets[index];
  if (size != nullptr) *size = k->param_sizes[index];
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuFuncGetModule(CUmodule* hmod, CUfunction hfunc) {
  FAKECUDA_ENTER("cuFuncGetModule");
  if (hmod == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Modules& all = GetModules();
  std::lock_guard<std::mutex> lock(all.mu);
  auto* fn = reinterpret_cast<Function*>(hfunc);
  if (all.funcs.count(fn) == 0) return CUDA_ERROR_INVALID_HANDLE;
  *hmod = reinterpret_cast<CUmodule>(fn->module);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attrib,
                                            CUfunction hfunc) {
  FAKECUDA_ENTER("cuFuncGetAttribute");
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Function* fn = LookupFunction(hfunc);
  if (fn == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *value = 1024;
      break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
      *value = 32;
      break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
      *value = 90;
      break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      *value = fn->max_dynamic_shared.load();
      break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES:
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES:
      *value = 0;
      break;
    default:
      if (attrib < 0 || attrib >= CU_FUNC_ATTRIBUTE_MAX) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      *value = 0;
  }
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib,
                                            int value) {
  FAKECUDA_ENTER("cuFuncSetAttribute");
  Function* fn = LookupFunction(hfunc);
  if (fn == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      if (value < 0 || value > kOptInSharedBytes) return CUDA_ERROR_INVALID_VALUE;
      fn->max_dynamic_shared.store(value);
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      return value < -1 || value > 100 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

#define FAKECUDA_LAUNCH_PARAMS                                                       \
  (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, \
   unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void** params, void** extra)

FAKECUDA_EXPORT CUresult cuLaunchKernel FAKECUDA_LAUNCH_PARAMS {
  FAKECUDA_ENTER("cuLaunchKernel");
  return Launch(f, {gx, gy, gz}, {bx, by, bz}, shmem, s, params, extra, false);
}
FAKECUDA_EXPORT CUresult cuLaunchKernel_ptsz FAKECUDA_LAUNCH_PARAMS {
  FAKECUDA_ENTER("cuLaunchKernel_ptsz");
  return Launch(f, {gx, gy, gz}, {bx, by, bz}, shmem, s, params, extra, true);
}

FAKECUDA_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                                          void** extra) {
  FAKECUDA_ENTER("cuLaunchKernelEx");
  return LaunchEx(config, f, params, extra, false);
}
FAKECUDA_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                               void** params, void** extra) {
  FAKECUDA_ENTER("cuLaunchKernelEx_ptsz");
  return LaunchEx(config, f, params, extra, true);
}

FAKECUDA_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                                   unsigned int gz, unsigned int bx,
                                                   unsigned int by, unsigned int bz,
                                                   unsigned int shmem, CUstream s, void** params) {
  FAKECUDA_ENTER("cuLaunchCooperativeKernel");
  return Launch(f, {gx, gy, gz}, {bx, by, bz}, shmem, s, params, nullptr, false);
}
FAKECUDA_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx,
                                                        unsigned int gy, unsigned int gz,
                                                        unsigned int bx, unsigned int by,
                                                        unsigned int bz, unsigned int shmem,
                                                        CUstream s, void** params) {
  FAKECUDA_ENTER("cuLaunchCooperativeKernel_ptsz");
  return Launch(f, {gx, gy, gz}, {bx, by, bz}, shmem, s, params, nullptr, true);
}
