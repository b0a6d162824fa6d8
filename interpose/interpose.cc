// The interposition boundary: building the state, dlsym and
// cuGetProcAddress. The CUDA runtime, static or dynamic, reaches the driver
// through dlopen("libcuda.so.1") + dlsym + cuGetProcAddress, so all three
// must hand back stensor's hooks; everything else passes through untouched.
//
// The hook for a request is chosen by the real pointer: the real driver
// resolves the name, version and flags to one exact entry point, and that
// entry point's address maps to the hook written for that exact symbol.
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/base/config.h"
#include "core/base/log.h"
#include "interpose/nvml_hooks.h"
#include "interpose/raw_log.h"
#include "interpose/state.h"

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
#include "core/driver/driver_symbols.inc"
#undef STENSOR_HOOK
#undef STENSOR_CALL
};

struct Globals {
  InterposeState state;
  absl::flat_hash_map<void*, void*> hook_by_real;  // real entry -> hook
  absl::flat_hash_map<std::string, void*> hook_by_name;
};

std::atomic<Globals*> g_globals{nullptr};
// Held while the state is built, and across fork() so that a child never
// inherits a half-built state.
std::mutex g_build_mu;
bool g_exit_registered = false;  // under g_build_mu
// This process is a child of fork() (of a parent that had loaded stensor).
bool g_forked = false;

void Shutdown() {
  if (Globals* g = g_globals.load()) g->state.tracker->Shutdown();
}

// SIGTERM, SIGINT and SIGHUP, where the program left them at their default
// (ending the process): the access log's end record and the statistics are
// written first, then the signal takes effect as it would have. A handler
// may not take locks or allocate, and the thread it interrupted may hold
// the locks a shutdown needs, so the handler only wakes a thread started
// for this and returns; that thread shuts down and then ends the process
// with the same signal. If the shutdown is stuck, a deadline ends it anyway
// after 5 s (without the statistics, never a process that does not end). A
// second signal meanwhile ends the process at once.
constexpr int kEndingSignals[] = {SIGTERM, SIGINT, SIGHUP};
sem_t g_signal_sem;
std::atomic<bool> g_watching{false};  // the thread that shuts down runs
std::atomic<bool> g_signal_seen{false};
std::atomic<int> g_signal_number{0};

[[noreturn]] void EndWith(int sig) {
  signal(sig, SIG_DFL);
  kill(getpid(), sig);  // to the process: a thread not blocking it takes it
  for (;;) pause();
}

void OnEndingSignal(int sig) {
  if (g_watching.load() && !g_signal_seen.exchange(true)) {
    g_signal_number.store(sig);
    sem_post(&g_signal_sem);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);  // delivered once this handler returns (the signal is blocked in it)
}

void WatchEndingSignals() {
  if (sem_init(&g_signal_sem, 0, 0) != 0) return;
  std::thread([] {
    // Delivered to the program's threads, never to this one (it must be
    // free to shut down).
    sigset_t mask;
    sigemptyset(&mask);
    for (int sig : kEndingSignals) sigaddset(&mask, sig);
    pthread_sigmask(SIG_BLOCK, &mask, nullptr);
    while (sem_wait(&g_signal_sem) != 0) {
    }
    const int sig = g_signal_number.load();
    std::thread([sig] {
      std::this_thread::sleep_for(std::chrono::seconds(5));
      EndWith(sig);
    }).detach();
    Shutdown();
    EndWith(sig);
  }).detach();
  g_watching.store(true);
  for (int sig : kEndingSignals) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) != 0 ||
        old.sa_handler != SIG_DFL) {
      continue;  // the program's own handler (or SIG_IGN) stays
    }
    struct sigaction act {};
    act.sa_handler = OnEndingSignal;
    // The default action interrupts no call; the program's threads run on
    // while the shutdown runs, so their blocking calls are restarted.
    act.sa_flags = SA_RESTART;
    sigemptyset(&act.sa_mask);
    sigaction(sig, &act, nullptr);
  }
}

// The configuration, parsed once. An invalid one stops the program: at
// start when the library is preloaded (the constructor asks first).
const Config& StartConfig() {
  static const Config* config = [] {
    absl::StatusOr<Config> parsed = Config::FromEnvironment();
    if (!parsed.ok()) {
      // The message already names the variable, value and accepted forms.
      RawLog("%s", std::string(parsed.status().message()).c_str());
      std::_Exit(1);
    }
    return new Config(*std::move(parsed));
  }();
  return *config;
}

// A log that could not be created would otherwise surface only at the first
// CUDA call, long after start.
void CheckAccessLogWritable(const Config& config) {
  std::string path = config.AccessLogPath(static_cast<int>(getpid()));
  if (path.empty()) return;
  // An existing file must be writable (a device such as /dev/full, or a
  // file in a directory the program may not write); a new one needs its
  // directory writable.
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/') + 1);
  const bool exists = access(path.c_str(), F_OK) == 0;
  if (access(exists ? path.c_str() : dir.c_str(), W_OK) != 0) {
    RawLog("cannot write the access log \"%s\" (STENSOR_ACCESS_LOG): %s", path.c_str(),
           std::strerror(errno));
    std::_Exit(1);
  }
}

// STENSOR_REAL_LIBCUDA was named on purpose; if it is wrong, every call
// would answer an error with nothing said. A driver exports cuInit and
// cuDriverGetVersion (every CUDA driver has both), and answers the latter
// without initialisation; the toolkit's stub libcuda.so (lib64/stubs,
// meant for linking only) exports everything and answers
// CUDA_ERROR_STUB_LIBRARY. Any other answer is the driver's own business.
void CheckNamedDriver(const std::string& path, void* handle, const Driver& driver) {
  auto version_fn = reinterpret_cast<decltype(&::cuDriverGetVersion)>(
      RealDlsymFn()(handle, "cuDriverGetVersion"));
  std::string lacks;
  if (driver.cuInit == nullptr) lacks = "cuInit";
  if (version_fn == nullptr) {
    lacks += lacks.empty() ? "cuDriverGetVersion" : ", cuDriverGetVersion";
  }
  if (!lacks.empty()) {
    RawLog("STENSOR_REAL_LIBCUDA=\"%s\" is not a CUDA driver (it has no %s)", path.c_str(),
           lacks.c_str());
    std::_Exit(1);
  }
  int version = 0;
  if (version_fn(&version) == CUDA_ERROR_STUB_LIBRARY) {
    RawLog(
        "STENSOR_REAL_LIBCUDA=\"%s\" is the CUDA toolkit's stub library, not a driver "
        "(cuDriverGetVersion answers CUDA_ERROR_STUB_LIBRARY)",
        path.c_str());
    std::_Exit(1);
  }
}

bool& BuildingOnThisThread() {
  static thread_local bool building = false;
  return building;
}

// Loads the real driver and starts the tracker. Runs at the first hooked
// call, not at load: a preloaded library also lands in processes that never
// use CUDA (the shell that starts the job), which must run unaffected.
Globals* Build() {
  BuildingOnThisThread() = true;
  const Config& config = StartConfig();
  auto* g = new Globals;  // leaked: hooks may run during exit
  SetLogLevel(config.log_level);

  const std::string path = config.real_libcuda.empty() ? "libcuda.so.1" : config.real_libcuda;
  g->state.real_handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  int found = 0;
  if (g->state.real_handle == nullptr && !config.real_libcuda.empty()) {
    RawLog("cannot load STENSOR_REAL_LIBCUDA=\"%s\": %s", path.c_str(), dlerror());
    std::_Exit(1);
  }
  if (g->state.real_handle == nullptr) {
    // No driver installed: every hook then returns an error instead of
    // calling anything, as the program would see without stensor.
    Say(LogLevel::kError, "no-driver",
        absl::StrCat("cannot load the CUDA driver ", path, ": ", dlerror()));
  } else {
    found = LoadDriver(g->state.real_handle, RealDlsymFn(), &g->state.driver);
    if (!config.real_libcuda.empty()) {
      CheckNamedDriver(path, g->state.real_handle, g->state.driver);
    }
    for (const HookEntry& h : kHooks) {
      g->hook_by_name.emplace(h.name, h.hook);
      void* real = RealDlsymFn()(g->state.real_handle, h.name);
      if (real != nullptr) g->hook_by_real.emplace(real, h.hook);
    }
  }
  Config own = config;
  if (g_forked && !own.access_log.empty() &&
      own.AccessLogPath(static_cast<int>(getpid())) == own.AccessLogPath(0)) {
    // The parent's log (or a sibling's) has this path: opening it again
    // would truncate it. %p gives each process its own.
    Say(LogLevel::kWarn, "fork-log",
        absl::StrCat("a child of fork() writes no access log: STENSOR_ACCESS_LOG=\"",
                     own.access_log, "\" has no %p"));
    own.access_log.clear();
  }
  auto tracker = Tracker::Create(own, &g->state.driver);
  if (absl::IsAlreadyExists(tracker.status())) {
    // Another process writes that log (the same path, no %r or %p): this one
    // writes none rather than mixing its records into it.
    Say(LogLevel::kWarn, "shared-log",
        absl::StrCat(tracker.status().message(),
                     ": this process writes no access log (put %r or %p in STENSOR_ACCESS_LOG)"));
    own.access_log.clear();
    tracker = Tracker::Create(own, &g->state.driver);
  }
  if (!tracker.ok()) {
    RawLog("%s", std::string(tracker.status().message()).c_str());
    std::_Exit(1);
  }
  g->state.tracker = tracker->release();
  Say(LogLevel::kInfo, "start",
      absl::StrCat("intercepting ", path, " (", found, " of the driver's entry points found)"));
  BuildingOnThisThread() = false;
  return g;
}

// Whether `name` is one of the hooked symbols (needs no state).
bool IsHookedName(const char* name) {
  static const auto* names = [] {
    auto* set = new absl::flat_hash_set<std::string>;
    for (const HookEntry& h : kHooks) set->insert(h.name);
    return set;
  }();
  return name != nullptr && name[0] == 'c' && name[1] == 'u' && names->contains(name);
}

}  // namespace

const InterposeState& State() {
  // Every hook comes here: after start-up this is one acquire load.
  if (Globals* g = g_globals.load(std::memory_order_acquire)) return g->state;
  std::lock_guard<std::mutex> lock(g_build_mu);
  if (Globals* g = g_globals.load(std::memory_order_acquire)) return g->state;
  Globals* g = Build();
  g_globals.store(g, std::memory_order_release);
  if (!g_exit_registered) {
    std::atexit(Shutdown);  // inherited by a child of fork(): it shuts down its own
    g_exit_registered = true;
  }
  // Only when a shutdown has something to write; again in a child of
  // fork(): threads do not survive it.
  const Config& config = StartConfig();
  if (config.stats || !config.access_log.empty()) WatchEndingSignals();
  return g->state;
}

bool StateReady() { return g_globals.load() != nullptr; }

const InterposeState* StateIfCudaInUse() {
  if (!StateReady()) {
    const Config& config = StartConfig();
    const std::string path = config.real_libcuda.empty() ? "libcuda.so.1" : config.real_libcuda;
    void* loaded = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (loaded == nullptr) return nullptr;
    // Answers CUDA_ERROR_NOT_INITIALIZED before cuInit, and initialises
    // nothing.
    auto count_fn =
        reinterpret_cast<decltype(&::cuDeviceGetCount)>(RealDlsymFn()(loaded, "cuDeviceGetCount"));
    int count = 0;
    const bool initialised = count_fn != nullptr && count_fn(&count) == CUDA_SUCCESS;
    dlclose(loaded);
    if (!initialised) return nullptr;
  }
  return &State();
}

void* RealDlsym(void* handle, const char* name) { return RealDlsymFn()(handle, name); }

void* HookFor(void* real) {
  Globals* g = g_globals.load();
  if (g == nullptr || real == nullptr) return nullptr;
  auto it = g->hook_by_real.find(real);
  if (it != g->hook_by_real.end()) return it->second;
  // A driver may hand out an internal address for an exported entry point;
  // its symbol name still identifies the ABI.
  Dl_info info;
  if (dladdr(real, &info) != 0 && info.dli_sname != nullptr && info.dli_saddr == real) {
    auto named = g->hook_by_name.find(info.dli_sname);
    if (named != g->hook_by_name.end()) return named->second;
  }
  return nullptr;
}

namespace {

// fork(): the child starts with no stensor state and builds its own at its
// first CUDA call (the real driver then answers as it does in a forked
// child), with its own log; the parent's log gets no line from the child
// and its statistics print once. The parent's state stays in the child's
// memory, unused: its threads did not survive the fork.
void BeforeFork() {
  g_build_mu.lock();
  if (Globals* g = g_globals.load()) g->state.tracker->BeforeFork();
}

void AfterForkInParent() {
  if (Globals* g = g_globals.load()) g->state.tracker->AfterFork();
  g_build_mu.unlock();
}

void AfterForkInChild() {
  if (Globals* g = g_globals.load()) {
    g->state.tracker->AfterFork();
    g_globals.store(nullptr);
  }
  g_forked = true;
  // Its thread did not survive: until this process builds its own state, an
  // ending signal ends it at once.
  g_watching.store(false);
  g_signal_seen.store(false);
  g_build_mu.unlock();
}

// The library is preloaded: check the configuration before main, so a bad
// setting stops the program at start.
__attribute__((constructor)) void Init() {
  CheckAccessLogWritable(StartConfig());
  // absl::Mutex's deadlock detection keeps a global lock graph, allocated
  // under an internal spin lock at nearly every lock operation: a fork()
  // while any thread holds that spin lock leaves it held in the child for
  // ever, and the child's first new thread that locks a mutex (its access
  // log's writer) blocks (tests/fork_test, about one run in a few hundred
  // under load). stensor's lock order is checked by clang's analysis and
  // TSan instead; off, it also costs every lock less.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (pthread_atfork(BeforeFork, AfterForkInParent, AfterForkInChild) != 0) {
    RawLog(
        "cannot register fork handlers: a child of fork() would write into "
        "this process's access log");
  }
}

}  // namespace
}  // namespace stensor

using stensor::HookFor;
using stensor::State;

// dlsym of a driver entry point's name or an NVML name, any handle but
// RTLD_NEXT (the exported dlsym, interpose/dlsym_entry.S, hands every other
// lookup to the C library directly, so that it sees the true caller).
extern "C" __attribute__((visibility("hidden"))) void* stensor_dlsym(void* handle,
                                                                     const char* name) {
  void* real = stensor::RealDlsym(handle, name);
  if (real == nullptr) return real;
  if (name[0] == 'n') return stensor::NvmlDlsym(name, real);  // "nvml..."
  if (!stensor::StateReady()) {
    // Build the state for the first hooked name asked for; anything else,
    // and anything asked while the state is being built, passes through.
    if (stensor::BuildingOnThisThread() || !stensor::IsHookedName(name)) {
      return real;
    }
    State();
  }
  void* hook = HookFor(real);
  return hook != nullptr ? hook : real;
}

STENSOR_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* symbolStatus) {
  auto real = State().driver.cuGetProcAddress_v2;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (r == CUDA_SUCCESS && pfn != nullptr) {
    if (void* hook = HookFor(*pfn)) *pfn = hook;
  }
  return r;
}

STENSOR_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                         cuuint64_t flags) {
  auto real = State().driver.cuGetProcAddress;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(symbol, pfn, cudaVersion, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr) {
    if (void* hook = HookFor(*pfn)) *pfn = hook;
  }
  return r;
}
