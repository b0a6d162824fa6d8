// The interposition boundary: building the state, dlsym and
// cuGetProcAddress. The CUDA runtime, static or dynamic, reaches the driver
// through dlopen("libcuda.so.1") + dlsym + cuGetProcAddress, so all three
// must hand back stensor's hooks; everything else passes through untouched.
//
// The hook for a request is chosen by the real pointer: the real driver
// resolves the name, version and flags to one exact entry point, and that
// entry point's address maps to the hook written for that exact symbol.
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "core/config.h"
#include "interpose/raw_log.h"
#include "interpose/state.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

#define STENSOR_EXPORT extern "C" __attribute__((visibility("default")))

namespace stensor {
namespace {

using DlsymFn = void* (*)(void*, const char*);

DlsymFn RealDlsymFn() {
  // dlvsym is not interposed, so it reaches the C library's dlsym.
  static DlsymFn fn = [] {
    void* f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (f == nullptr) f = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return reinterpret_cast<DlsymFn>(f);
  }();
  return fn;
}

// Our own exported hook for each hooked symbol, by name.
struct HookEntry {
  const char* name;
  void* hook;
};
const HookEntry kHooks[] = {
#define STENSOR_HOOK(name) {#name, reinterpret_cast<void*>(&::name)},
#define STENSOR_CALL(name)
#include "core/driver_symbols.inc"
#undef STENSOR_HOOK
#undef STENSOR_CALL
};

struct Globals {
  InterposeState state;
  absl::flat_hash_map<void*, void*> hook_by_real;     // real entry -> hook
  absl::flat_hash_map<std::string, void*> hook_by_name;
  std::shared_ptr<spdlog::logger> logger;             // alive until exit
};

std::atomic<Globals*> g_globals{nullptr};

spdlog::level::level_enum SpdlogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kCritical: return spdlog::level::critical;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

void Shutdown() {
  if (Globals* g = g_globals.load()) g->state.tracker->Shutdown();
}

Globals* Build() {
  absl::StatusOr<Config> config = Config::FromEnvironment();
  if (!config.ok()) {
    // The message already names the variable, value and accepted forms.
    RawLog("%s", std::string(config.status().message()).c_str());
    std::_Exit(1);
  }
  auto* g = new Globals;  // leaked: hooks may run during exit
  g->logger = spdlog::stderr_logger_mt("stensor");
  g->logger->set_pattern("stensor [%l] %v");
  g->logger->set_level(SpdlogLevel(config->log_level));

  const std::string path =
      config->real_libcuda.empty() ? "libcuda.so.1" : config->real_libcuda;
  g->state.real_handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (g->state.real_handle == nullptr) {
    RawLog("cannot load the CUDA driver %s: %s", path.c_str(), dlerror());
    std::_Exit(1);
  }
  int found = LoadDriver(g->state.real_handle, RealDlsymFn(), &g->state.driver);
  for (const HookEntry& h : kHooks) {
    g->hook_by_name.emplace(h.name, h.hook);
    void* real = RealDlsymFn()(g->state.real_handle, h.name);
    if (real != nullptr) g->hook_by_real.emplace(real, h.hook);
  }
  auto tracker = Tracker::Create(*config, &g->state.driver);
  if (!tracker.ok()) {
    RawLog("%s", std::string(tracker.status().message()).c_str());
    std::_Exit(1);
  }
  g->state.tracker = tracker->release();
  g->logger->info("intercepting {} ({} of the driver's entry points found)",
                  path, found);
  return g;
}

}  // namespace

const InterposeState& State() {
  // Every hook comes here: after start-up this is one acquire load.
  if (Globals* g = g_globals.load(std::memory_order_acquire)) return g->state;
  static std::once_flag once;
  std::call_once(once, [] {
    g_globals.store(Build(), std::memory_order_release);
    std::atexit(Shutdown);
  });
  return g_globals.load(std::memory_order_acquire)->state;
}

bool StateReady() { return g_globals.load() != nullptr; }

void* RealDlsym(void* handle, const char* name) {
  return RealDlsymFn()(handle, name);
}

void* HookFor(void* real) {
  Globals* g = g_globals.load();
  if (g == nullptr || real == nullptr) return nullptr;
  auto it = g->hook_by_real.find(real);
  if (it != g->hook_by_real.end()) return it->second;
  // A driver may hand out an internal address for an exported entry point;
  // its symbol name still identifies the ABI.
  Dl_info info;
  if (dladdr(real, &info) != 0 && info.dli_sname != nullptr &&
      info.dli_saddr == real) {
    auto named = g->hook_by_name.find(info.dli_sname);
    if (named != g->hook_by_name.end()) return named->second;
  }
  return nullptr;
}

namespace {

// The library is preloaded: build the state before main, so a bad
// configuration stops the program at start.
__attribute__((constructor)) void Init() { State(); }

}  // namespace
}  // namespace stensor

using stensor::HookFor;
using stensor::State;

STENSOR_EXPORT void* dlsym(void* handle, const char* name) {
  void* real = stensor::RealDlsym(handle, name);
  if (real == nullptr || !stensor::StateReady()) return real;
  void* hook = HookFor(real);
  return hook != nullptr ? hook : real;
}

STENSOR_EXPORT CUresult cuGetProcAddress_v2(
    const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
    CUdriverProcAddressQueryResult* symbolStatus) {
  auto real = State().driver.cuGetProcAddress_v2;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (r == CUDA_SUCCESS && pfn != nullptr) {
    if (void* hook = HookFor(*pfn)) *pfn = hook;
  }
  return r;
}

STENSOR_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn,
                                         int cudaVersion, cuuint64_t flags) {
  auto real = State().driver.cuGetProcAddress;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(symbol, pfn, cudaVersion, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr) {
    if (void* hook = HookFor(*pfn)) *pfn = hook;
  }
  return r;
}
