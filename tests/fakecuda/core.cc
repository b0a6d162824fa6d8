// Fake driver: options, the call gate with fault injection, initialisation,
// devices, contexts and error strings.
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>

#include "tests/fakecuda/fakecuda.h"
#include "tests/fakecuda/internal.h"
#include "tests/fakecuda/physical_devices.h"
#include "tests/fakecuda/trace.h"

namespace fakecuda {
namespace {

[[noreturn]] void BadOption(const char* name, const char* value, const char* accepted) {
  std::fprintf(stderr, "fakecuda: invalid %s=\"%s\"; expected %s\n", name, value, accepted);
  std::exit(2);
}

std::vector<std::string> SplitCommas(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t end = text.find(',', start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

// A plain decimal number (digits with at most one '.'): no sign, exponent,
// hex, inf or nan, so what a value means is never in doubt. Parsed by hand:
// strtod would follow the program's locale.
bool ParseDecimal(const std::string& text, double* out) {
  bool digit = false, dot = false;
  double value = 0, scale = 1;
  for (char c : text) {
    if (c >= '0' && c <= '9') {
      digit = true;
      if (dot) {
        scale /= 10;
        value += (c - '0') * scale;
      } else {
        value = value * 10 + (c - '0');
      }
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      return false;
    }
  }
  if (!digit || !std::isfinite(value)) return false;
  *out = value;
  return true;
}

// A variable of 0 or 1; `*on` left as it is when unset.
void ParseSwitch(const char* name, bool* on) {
  const char* v = std::getenv(name);
  if (v == nullptr) return;
  if (std::strcmp(v, "0") == 0) {
    *on = false;
  } else if (std::strcmp(v, "1") == 0) {
    *on = true;
  } else {
    BadOption(name, v, "0 or 1");
  }
}

// FAKECUDA_LINK=H2D_GBps[,D2H_GBps]: one number sets both directions.
void ParseLink(const char* v, Options* o) {
  std::vector<std::string> parts = SplitCommas(v);
  double gbps[2] = {0, 0};
  bool ok = parts.size() <= 2;
  for (size_t i = 0; ok && i < parts.size(); ++i) {
    ok = ParseDecimal(parts[i], &gbps[i]);
  }
  if (!ok) {
    BadOption("FAKECUDA_LINK", v,
              "H2D_GBps or H2D_GBps,D2H_GBps: decimal GB/s (10^9 bytes/s), "
              "e.g. 12.5 or 25,12.5; 0 leaves a direction untimed");
  }
  if (parts.size() == 1) gbps[1] = gbps[0];
  o->h2d_bytes_per_s = gbps[0] * 1e9;
  o->d2h_bytes_per_s = gbps[1] * 1e9;
}

// FAKECUDA_VMM_LATENCY_US=create,map,unmap,release[,set_access] in
// microseconds (set_access and unmap per mapping covered), for memory on
// the device and on the host alike; or h200: the medians measured on an
// H200 with driver 580 (docs/gpu.md), device- and host-located.
void ParseVmmLatency(const char* v, Options* o) {
  using us = std::chrono::microseconds;
  // By VmmCall: create, map, set access, unmap, release; set access and
  // unmap per mapping covered (32 granule mappings: 626 and 423 us).
  constexpr long long kH200[2][5] = {{12, 1, 20, 13, 14}, {306, 4, 83, 46, 55}};
  if (std::string(v) == "h200") {
    for (int l = 0; l < 2; ++l) {
      for (int c = 0; c < 5; ++c) o->vmm_latency[l][c] = us(kH200[l][c]);
    }
    return;
  }
  constexpr unsigned long long kMaxUs = 10'000'000;  // 10 s
  std::vector<std::string> parts = SplitCommas(v);
  unsigned long long n[5] = {};
  bool ok = parts.size() == 4 || parts.size() == 5;
  for (size_t i = 0; ok && i < parts.size(); ++i) {
    const std::string& p = parts[i];
    ok = !p.empty() && p.size() <= 8 && p.find_first_not_of("0123456789") == std::string::npos;
    if (ok) n[i] = std::strtoull(p.c_str(), nullptr, 10);
    ok = ok && n[i] <= kMaxUs;
  }
  if (!ok) {
    BadOption("FAKECUDA_VMM_LATENCY_US", v,
              "create,map,unmap,release[,set_access]: four or five integers of "
              "microseconds from 0 to 10000000, e.g. 500,50,50,300, or h200 "
              "(the figures measured on an H200)");
  }
  for (int l = 0; l < 2; ++l) {
    o->vmm_latency[l][static_cast<int>(VmmCall::kCreate)] = us(n[0]);
    o->vmm_latency[l][static_cast<int>(VmmCall::kMap)] = us(n[1]);
    o->vmm_latency[l][static_cast<int>(VmmCall::kUnmap)] = us(n[2]);
    o->vmm_latency[l][static_cast<int>(VmmCall::kRelease)] = us(n[3]);
    o->vmm_latency[l][static_cast<int>(VmmCall::kSetAccess)] = us(n[4]);
  }
}

// FAKECUDA_REPORT_CALLS=sym1,sym2: names this library exports.
void ParseReportCalls(const char* v, Options* o) {
  std::vector<std::string> names = SplitCommas(v);
  for (const std::string& name : names) {
    // Only cu* entry points pass the call gate that counts calls.
    if (name.rfind("cu", 0) != 0 || !IsExportedSymbol(name.c_str())) {
      BadOption("FAKECUDA_REPORT_CALLS", v,
                "a comma-separated list of entry points the driver exports, "
                "e.g. cuMemCreate,cuMemRelease");
    }
  }
  o->report_calls = names;
}

// FAKECUDA_TRACE=PATH and FAKECUDA_TRACE_EVENTS=N. The trace is a
// diagnostic: a bad value is said and the program runs on (StartTrace says
// what is wrong with the path once it tries to open it).
void ParseTrace(Options* o) {
  if (const char* v = std::getenv("FAKECUDA_TRACE")) {
    o->trace = true;
    o->trace_path = v;
  }
  if (const char* v = std::getenv("FAKECUDA_TRACE_EVENTS")) {
    constexpr unsigned long long kMax = 100'000'000;
    std::string text(v);
    bool ok = !text.empty() && text.size() <= 9 &&
              text.find_first_not_of("0123456789") == std::string::npos;
    unsigned long long n = ok ? std::strtoull(v, nullptr, 10) : 0;
    if (ok && n >= 1 && n <= kMax) {
      o->trace_max_events = static_cast<size_t>(n);
    } else {
      std::fprintf(stderr,
                   "fakecuda: invalid FAKECUDA_TRACE_EVENTS=\"%s\"; expected an "
                   "integer from 1 to %llu; the trace keeps at most %zu events\n",
                   v, kMax, o->trace_max_events);
    }
  }
}

std::string Trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\n\r\f\v");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\n\r\f\v") + 1 - first);
}

// The physical device an ordinal entry names, read as strtoul reads it
// (leading blanks, a sign, digits; the rest ignored: "1gpu" is 1), or -1.
int OrdinalEntry(const std::string& entry, int physical_count) {
  size_t i = 0;
  bool negative = false;
  if (i < entry.size() && (entry[i] == '+' || entry[i] == '-')) {
    negative = entry[i++] == '-';
  }
  long long value = 0;
  size_t digits = 0;
  for (; i < entry.size() && entry[i] >= '0' && entry[i] <= '9'; ++i, ++digits) {
    value = std::min<long long>(value * 10 + (entry[i] - '0'), physical_count);
  }
  if (digits == 0 || (negative && value != 0) || value >= physical_count) {
    return -1;
  }
  return static_cast<int>(value);
}

// The physical device a UUID entry names (a unique prefix of a device's
// "GPU-..." UUID, hex digits in any case), or -1 when none or several do.
int UuidEntry(const std::string& entry, int physical_count) {
  int found = -1;
  for (int p = 0; p < physical_count; ++p) {
    const std::string uuid = UuidText(p);
    if (entry.size() > uuid.size()) continue;
    bool match = true;
    for (size_t i = 0; i < entry.size() && match; ++i) {
      match = std::tolower(static_cast<unsigned char>(entry[i])) ==
              std::tolower(static_cast<unsigned char>(uuid[i]));
    }
    if (!match) continue;
    if (found >= 0) return -1;  // ambiguous
    found = p;
  }
  return found;
}

// CUDA_VISIBLE_DEVICES as the driver reads it (CUDA Programming Guide,
// "CUDA_VISIBLE_DEVICES"; the corner cases as PyTorch's
// torch.cuda._parse_visible_devices models the driver): a comma-separated
// list of ordinals or of GPU UUIDs (a unique prefix suffices), the kind set
// by the first entry; the devices are renumbered from 0 in the listed
// order. An entry that names no device (out of range, negative, not a
// number, an unknown or ambiguous UUID, one of the other kind, a MIG
// instance) ends the list there; a device listed twice leaves none. Unset:
// every device; empty: none.
std::vector<int> VisibleDevices(const char* value, int physical_count) {
  std::vector<int> visible;
  if (value == nullptr) {
    for (int p = 0; p < physical_count; ++p) visible.push_back(p);
    return visible;
  }
  std::vector<std::string> entries = SplitCommas(value);
  const bool uuids = Trim(entries[0]).rfind("GPU-", 0) == 0;
  for (const std::string& raw : entries) {
    const std::string entry = Trim(raw);
    int p = -1;
    if (uuids) {
      if (entry.rfind("GPU-", 0) == 0) p = UuidEntry(entry, physical_count);
    } else {
      p = OrdinalEntry(entry, physical_count);
    }
    if (p < 0) break;
    if (std::find(visible.begin(), visible.end(), p) != visible.end()) {
      return {};
    }
    visible.push_back(p);
  }
  return visible;
}

Options LoadOptions() {
  Options o;
  if (const char* v = std::getenv("FAKECUDA_DEVICE_MEMORY")) {
    if (!ParseSize(v, &o.device_memory)) {
      BadOption("FAKECUDA_DEVICE_MEMORY", v,
                "a positive byte count with an optional K|M|G or KiB|MiB|GiB "
                "suffix, e.g. 512MiB");
    }
  }
  if (const char* v = std::getenv("FAKECUDA_DEVICES")) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 1 || n > 16) {
      BadOption("FAKECUDA_DEVICES", v, "an integer from 1 to 16");
    }
    o.devices = static_cast<int>(n);
  }
  o.visible = VisibleDevices(std::getenv("CUDA_VISIBLE_DEVICES"), o.devices);
  ParseSwitch("FAKECUDA_HOST_VMM", &o.host_vmm);
  ParseSwitch("FAKECUDA_SYNC", &o.sync);
  if (const char* v = std::getenv("FAKECUDA_LINK")) ParseLink(v, &o);
  if (const char* v = std::getenv("FAKECUDA_VMM_LATENCY_US")) {
    ParseVmmLatency(v, &o);
  }
  if (const char* v = std::getenv("FAKECUDA_REPORT_CALLS")) {
    ParseReportCalls(v, &o);
  }
  ParseTrace(&o);
  return o;
}

// --- Fault injection ---------------------------------------------------------
struct FailRule {
  std::string name;
  unsigned long long at;  // fail when the call count reaches this
  CUresult result;
};

struct Calls {
  std::mutex mu;
  std::unordered_map<std::string, unsigned long long> counts;  // guarded by mu
  std::vector<FailRule> rules;                                 // guarded by mu
  std::atomic<bool> counting{false};
};

Calls& GetCalls() {
  static Calls* calls = new Calls;  // leaked: used by exit-time calls
  return *calls;
}

void ArmFromEnvironment() {
  const char* spec = std::getenv("FAKECUDA_FAIL");
  if (spec == nullptr || *spec == '\0') return;
  std::string all(spec);
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string::npos) end = all.size();
    std::string item = all.substr(start, end - start);
    size_t c1 = item.find(':');
    size_t c2 = c1 == std::string::npos ? c1 : item.find(':', c1 + 1);
    char* stop = nullptr;
    long nth = c1 == std::string::npos ? 0 : std::strtol(item.c_str() + c1 + 1, &stop, 10);
    long code = CUDA_ERROR_UNKNOWN;
    bool ok = c1 != std::string::npos && c1 > 0 && nth >= 1 && (*stop == '\0' || *stop == ':');
    if (ok && c2 != std::string::npos) {
      code = std::strtol(item.c_str() + c2 + 1, &stop, 10);
      ok = *stop == '\0' && code > 0;
    }
    if (!ok) {
      BadOption("FAKECUDA_FAIL", spec,
                "a comma-separated list of symbol:nth[:cuda-error-number], "
                "e.g. cuMemCreate:3:2");
    }
    fakecuda_fail_call(item.substr(0, c1).c_str(), static_cast<int>(nth),
                       static_cast<CUresult>(code));
    start = end + 1;
  }
}

std::atomic<bool> g_initialized{false};
// A child of fork() whose parent had initialised the driver: the real driver
// answers CUDA_ERROR_NOT_INITIALIZED to everything there, cuInit included
// (its state, threads and device mappings are the parent's).
std::atomic<bool> g_forked_after_init{false};

}  // namespace

CUresult Enter(const char* name, bool needs_init);

const Options& GetOptions() {
  static const Options options = LoadOptions();
  return options;
}

namespace {
thread_local int t_call_depth = 0;
}  // namespace

CallScope::CallScope(const char* name, bool needs_init) : result_(CUDA_SUCCESS) {
  if (t_call_depth++ == 0) result_ = Enter(name, needs_init);
}

CallScope::~CallScope() { --t_call_depth; }

CUresult Enter(const char* name, bool needs_init) {
  Calls& calls = GetCalls();
  if (calls.counting.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(calls.mu);
    unsigned long long n = ++calls.counts[name];
    for (size_t i = 0; i < calls.rules.size(); ++i) {
      if (calls.rules[i].name == name && calls.rules[i].at == n) {
        CUresult r = calls.rules[i].result;
        calls.rules.erase(calls.rules.begin() + i);
        return r;
      }
    }
  }
  if (needs_init && !g_initialized.load(std::memory_order_acquire)) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  if ((needs_init || std::strcmp(name, "cuInit") == 0) &&
      g_forked_after_init.load(std::memory_order_relaxed)) {
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  return CUDA_SUCCESS;
}

// --- Devices -----------------------------------------------------------------
bool Device::Charge(size_t bytes) {
  size_t cur = used.load();
  do {
    if (bytes > GetOptions().device_memory - cur) return false;
  } while (!used.compare_exchange_weak(cur, cur + bytes));
  size_t now = cur + bytes;
  size_t p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
  return true;
}

void Device::Uncharge(size_t bytes) { used.fetch_sub(bytes); }

namespace {
Device* Devices() {
  static Device* devices = [] {
    const std::vector<int>& visible = GetOptions().visible;
    auto* d = new Device[visible.size()];
    for (size_t i = 0; i < visible.size(); ++i) {
      d[i].ordinal = static_cast<int>(i);
      d[i].physical = visible[i];
    }
    return d;
  }();
  return devices;
}
}  // namespace

int DeviceCount() { return static_cast<int>(GetOptions().visible.size()); }

Device* GetDevice(int ordinal) {
  if (ordinal < 0 || ordinal >= DeviceCount()) return nullptr;
  return &Devices()[ordinal];
}

// --- Contexts ----------------------------------------------------------------
namespace {

struct Contexts {
  std::mutex mu;
  std::vector<Context*> created;  // live cuCtxCreate contexts
  // One primary context per device, created on first retain and kept for
  // the life of the process: it keeps its identity across release and
  // reset, as on the real driver, and is usable only while retained.
  std::vector<Context*> primary;  // guarded by mu
  std::vector<int> primary_refs;  // guarded by mu
};

Contexts& GetContexts() {
  static Contexts* c = [] {
    auto* c = new Contexts;
    c->primary.assign(DeviceCount(), nullptr);
    c->primary_refs.assign(DeviceCount(), 0);
    return c;
  }();
  return *c;
}

thread_local std::vector<Context*> t_context_stack;

Context* NewContext(int device, unsigned flags, bool primary) {
  auto* ctx = new Context;  // never freed: stale handles must read as invalid
  ctx->device = device;
  ctx->flags.store(flags);
  ctx->primary = primary;
  ctx->legacy = new Stream(ctx, 0, 0, StreamKind::kLegacy);
  return ctx;
}

// A primary context's end (reset, last release): its work completed, its
// streams' and events' handles invalid. Device memory is process-wide in
// the fake, so nothing else is reclaimed.
void Deactivate(Context* ctx) {
  SynchronizeContext(ctx);
  EndContextHandles(ctx);
}

}  // namespace

bool IsLiveContext(Context* ctx) {
  if (ctx == nullptr) return false;
  Contexts& all = GetContexts();
  std::lock_guard<std::mutex> lock(all.mu);
  if (ctx->primary) return all.primary_refs[ctx->device] > 0;
  return std::find(all.created.begin(), all.created.end(), ctx) != all.created.end();
}

Context* CurrentContext() {
  if (t_context_stack.empty()) return nullptr;
  return t_context_stack.back();
}

CUresult RequireContext(Context** ctx) {
  Context* c = CurrentContext();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (!IsLiveContext(c)) {
    // A released primary context is invalid until retained again; a
    // destroyed created context stays destroyed.
    return c->primary ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_CONTEXT_IS_DESTROYED;
  }
  *ctx = c;
  return CUDA_SUCCESS;
}

void SynchronizeContext(Context* ctx) {
  std::vector<Stream*> streams;
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    streams = ctx->streams;
  }
  ctx->legacy->WaitIdle();
  for (Stream* s : streams) s->WaitIdle();
  ReleasePoolsAtSync();
}

void SynchronizeAllContexts() {
  std::vector<Context*> live;
  {
    Contexts& all = GetContexts();
    std::lock_guard<std::mutex> lock(all.mu);
    live = all.created;
    for (int d = 0; d < DeviceCount(); ++d) {
      if (all.primary_refs[d] > 0) live.push_back(all.primary[d]);
    }
  }
  for (Context* ctx : live) SynchronizeContext(ctx);
}

}  // namespace fakecuda

using namespace fakecuda;  // NOLINT: the exported C API below

// --- Test controls -----------------------------------------------------------
FAKECUDA_EXPORT size_t fakecuda_used_bytes(int device) {
  Device* d = GetDevice(device);
  return d ? d->used.load() : 0;
}
FAKECUDA_EXPORT size_t fakecuda_peak_bytes(int device) {
  Device* d = GetDevice(device);
  return d ? d->peak.load() : 0;
}
FAKECUDA_EXPORT void fakecuda_reset_peak_bytes(int device) {
  if (Device* d = GetDevice(device)) d->peak.store(d->used.load());
}
FAKECUDA_EXPORT void fakecuda_fail_call(const char* name, int nth, CUresult result) {
  Calls& calls = GetCalls();
  std::lock_guard<std::mutex> lock(calls.mu);
  unsigned long long base = calls.counts[name];
  calls.rules.push_back(FailRule{name, base + static_cast<unsigned long long>(nth), result});
  calls.counting.store(true);
}
FAKECUDA_EXPORT void fakecuda_clear_failures(void) {
  Calls& calls = GetCalls();
  std::lock_guard<std::mutex> lock(calls.mu);
  calls.rules.clear();
}
FAKECUDA_EXPORT void fakecuda_count_calls(int enable) { GetCalls().counting.store(enable != 0); }
FAKECUDA_EXPORT unsigned long long fakecuda_call_count(const char* name) {
  Calls& calls = GetCalls();
  std::lock_guard<std::mutex> lock(calls.mu);
  auto it = calls.counts.find(name);
  return it == calls.counts.end() ? 0 : it->second;
}

// --- Initialisation and versions -------------------------------------------
FAKECUDA_EXPORT CUresult cuInit(unsigned int flags) {
  FAKECUDA_ENTER_NO_INIT("cuInit");
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  static std::once_flag once;
  std::call_once(once, [] {
    GetOptions();  // a bad FAKECUDA_* value stops the program here
    ArmFromEnvironment();
    // The call counts' lock is never inherited held.
    pthread_atfork([] { GetCalls().mu.lock(); }, [] { GetCalls().mu.unlock(); },
                   [] {
                     GetCalls().mu.unlock();
                     g_forked_after_init.store(true);
                   });
    // Tests of a whole program read the high-water mark from stderr.
    if (const char* v = std::getenv("FAKECUDA_REPORT_PEAK"); v && std::strcmp(v, "1") == 0) {
      std::atexit([] {
        if (g_forked_after_init.load()) return;  // the parent's figures
        for (int d = 0; d < DeviceCount(); ++d) {
          std::fprintf(stderr, "fakecuda: device %d peak %zu bytes\n", d,
                       GetDevice(d)->peak.load());
        }
      });
    }
    // Benchmarks read call counts (e.g. cuMemCreate per step) from stderr.
    if (!GetOptions().report_calls.empty()) {
      GetCalls().counting.store(true);
      std::atexit([] {
        if (g_forked_after_init.load()) return;
        for (const std::string& name : GetOptions().report_calls) {
          std::fprintf(stderr, "fakecuda: calls %s %llu\n", name.c_str(),
                       fakecuda_call_count(name.c_str()));
        }
      });
    }
    // The timeline of the device, written when the program ends. Stream
    // workers may still run then: records after the write are dropped.
    StartTrace();
    if (TraceEnabled()) {
      std::atexit([] {
        if (g_forked_after_init.load()) return;  // the parent's timeline
        WriteTrace();
      });
    }
    // Each VMM handle holds a memfd; a real driver has no such limit, so
    // take all the descriptors the hard limit allows.
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      setrlimit(RLIMIT_NOFILE, &files);
    }
  });
  // CUDA_VISIBLE_DEVICES left none: the driver stays uninitialised.
  if (DeviceCount() == 0) return CUDA_ERROR_NO_DEVICE;
  g_initialized.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDriverGetVersion(int* version) {
  FAKECUDA_ENTER_NO_INIT("cuDriverGetVersion");
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

// --- Devices -----------------------------------------------------------------
FAKECUDA_EXPORT CUresult cuDeviceGetCount(int* count) {
  FAKECUDA_ENTER("cuDeviceGetCount");
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = DeviceCount();
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  FAKECUDA_ENTER("cuDeviceGet");
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (GetDevice(ordinal) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  FAKECUDA_ENTER("cuDeviceGetName");
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "fakecuda device %d", dev);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  FAKECUDA_ENTER("cuDeviceGetUuid_v2");
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  unsigned char bytes[16];
  PhysicalUuid(GetDevice(dev)->physical, bytes);
  std::memcpy(uuid->bytes, bytes, sizeof(bytes));
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  FAKECUDA_ENTER("cuDeviceGetUuid");
  return cuDeviceGetUuid_v2(uuid, dev);
}

// Each physical device on a PCI bus of its own (PhysicalPciBus).
FAKECUDA_EXPORT CUresult cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  FAKECUDA_ENTER("cuDeviceGetPCIBusId");
  if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(pciBusId, static_cast<size_t>(len), "0000:%02x:00.0",
                PhysicalPciBus(GetDevice(dev)->physical));
  return CUDA_SUCCESS;
}

// Accepts domain:bus:device.function, domain:bus:device and
// bus:device.function, in hex.
FAKECUDA_EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
  FAKECUDA_ENTER("cuDeviceGetByPCIBusId");
  if (dev == nullptr || pciBusId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  int end = 0;
  const std::string text(pciBusId);
  auto whole = [&](int fields, int want) {
    return fields == want && end == static_cast<int>(text.size());
  };
  if (!whole(std::sscanf(pciBusId, "%x:%x:%x.%x%n", &domain, &bus, &device, &function, &end), 4) &&
      !whole(std::sscanf(pciBusId, "%x:%x:%x%n", &domain, &bus, &device, &end), 3)) {
    domain = 0;
    if (!whole(std::sscanf(pciBusId, "%x:%x.%x%n", &bus, &device, &function, &end), 3)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (int d = 0; d < DeviceCount(); ++d) {
    if (domain == 0 && device == 0 && function == 0 &&
        bus == PhysicalPciBus(GetDevice(d)->physical)) {
      *dev = d;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

FAKECUDA_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  FAKECUDA_ENTER("cuDeviceTotalMem_v2");
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = GetOptions().device_memory;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  FAKECUDA_ENTER("cuDeviceGetAttribute");
  if (value == nullptr || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  // An H100-like device; every attribute not listed reads 0.
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *value = 1024;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
      *value = 1024;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
      *value = 1024;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
      *value = 64;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
      *value = 2147483647;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
      *value = 65535;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
      *value = 65535;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK:
      *value = 49152;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
      *value = 232448;
      break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
      *value = 2147483647;
      break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
      *value = 32;
      break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *value = 132;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = 9;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *value = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT:
      *value = 2;
      break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *value = static_cast<int>(PhysicalPciBus(GetDevice(dev)->physical));
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
      *value = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
      *value = 0;
      break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT:
      *value = 32;
      break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
      *value = GetOptions().host_vmm ? 1 : 0;
      break;
    default:
      *value = 0;
      break;
  }
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
  FAKECUDA_ENTER("cuDeviceComputeCapability");
  if (major == nullptr || minor == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *major = 9;
  *minor = 0;
  return CUDA_SUCCESS;
}

// --- Primary contexts --------------------------------------------------------
FAKECUDA_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  FAKECUDA_ENTER("cuDevicePrimaryCtxRetain");
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  Contexts& all = GetContexts();
  std::lock_guard<std::mutex> lock(all.mu);
  if (all.primary[dev] == nullptr) {
    all.primary[dev] = NewContext(dev, 0, /*primary=*/true);
  }
  ++all.primary_refs[dev];
  *pctx = reinterpret_cast<CUcontext>(all.primary[dev]);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FAKECUDA_ENTER("cuDevicePrimaryCtxRelease_v2");
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  Contexts& all = GetContexts();
  Context* released = nullptr;
  {
    std::lock_guard<std::mutex> lock(all.mu);
    if (all.primary_refs[dev] == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--all.primary_refs[dev] == 0) released = all.primary[dev];
  }
  if (released != nullptr) Deactivate(released);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  FAKECUDA_ENTER("cuDevicePrimaryCtxReset_v2");
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  Contexts& all = GetContexts();
  Context* reset = nullptr;
  {
    std::lock_guard<std::mutex> lock(all.mu);
    if (all.primary_refs[dev] > 0) reset = all.primary[dev];
    all.primary_refs[dev] = 0;
  }
  if (reset != nullptr) Deactivate(reset);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags,
                                                    int* active) {
  FAKECUDA_ENTER("cuDevicePrimaryCtxGetState");
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  Contexts& all = GetContexts();
  std::lock_guard<std::mutex> lock(all.mu);
  if (all.primary[dev] == nullptr) {
    all.primary[dev] = NewContext(dev, 0, /*primary=*/true);
  }
  *flags = all.primary[dev]->flags.load();
  *active = all.primary_refs[dev] > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  FAKECUDA_ENTER("cuDevicePrimaryCtxSetFlags_v2");
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (flags & ~0x1fu) return CUDA_ERROR_INVALID_VALUE;
  Contexts& all = GetContexts();
  std::lock_guard<std::mutex> lock(all.mu);
  if (all.primary[dev] == nullptr) {
    all.primary[dev] = NewContext(dev, 0, /*primary=*/true);
  }
  all.primary[dev]->flags.store(flags);
  return CUDA_SUCCESS;
}

// --- Created contexts and the context stack ----------------------------------
FAKECUDA_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params,
                                        unsigned int flags, CUdevice dev) {
  FAKECUDA_ENTER("cuCtxCreate_v4");
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (params != nullptr && (params->numExecAffinityParams != 0 || params->cigParams != nullptr)) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (GetDevice(dev) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  Context* ctx = NewContext(dev, flags, /*primary=*/false);
  {
    Contexts& all = GetContexts();
    std::lock_guard<std::mutex> lock(all.mu);
    all.created.push_back(ctx);
  }
  t_context_stack.push_back(ctx);
  *pctx = reinterpret_cast<CUcontext>(ctx);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  FAKECUDA_ENTER("cuCtxCreate_v2");
  return cuCtxCreate_v4(pctx, nullptr, flags, dev);
}

FAKECUDA_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  FAKECUDA_ENTER("cuCtxDestroy_v2");
  auto* c = reinterpret_cast<Context*>(ctx);
  if (c == nullptr || c->primary || !IsLiveContext(c)) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  {
    Contexts& all = GetContexts();
    std::lock_guard<std::mutex> lock(all.mu);
    all.created.erase(std::find(all.created.begin(), all.created.end(), c));
  }
  SynchronizeContext(c);
  EndContextHandles(c);
  std::vector<Stream*> streams;  // its per-thread streams
  {
    std::lock_guard<std::mutex> lock(c->mu);
    streams.swap(c->streams);
  }
  for (Stream* s : streams) s->Stop();
  c->legacy->Stop();
  // Popped from this thread's stack if current here, as the driver does.
  if (!t_context_stack.empty() && t_context_stack.back() == c) {
    t_context_stack.pop_back();
  }
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  FAKECUDA_ENTER("cuCtxSetCurrent");
  auto* c = reinterpret_cast<Context*>(ctx);
  if (c != nullptr && !IsLiveContext(c)) return CUDA_ERROR_INVALID_CONTEXT;
  if (c == nullptr) {
    if (!t_context_stack.empty()) t_context_stack.pop_back();
  } else if (t_context_stack.empty()) {
    t_context_stack.push_back(c);
  } else {
    t_context_stack.back() = c;
  }
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxGetCurrent(CUcontext* pctx) {
  FAKECUDA_ENTER("cuCtxGetCurrent");
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(CurrentContext());
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  FAKECUDA_ENTER("cuCtxPushCurrent_v2");
  auto* c = reinterpret_cast<Context*>(ctx);
  if (!IsLiveContext(c)) return CUDA_ERROR_INVALID_CONTEXT;
  t_context_stack.push_back(c);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  FAKECUDA_ENTER("cuCtxPopCurrent_v2");
  if (t_context_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) {
    *pctx = reinterpret_cast<CUcontext>(t_context_stack.back());
  }
  t_context_stack.pop_back();
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  FAKECUDA_ENTER("cuCtxGetDevice");
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  *device = ctx->device;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  FAKECUDA_ENTER("cuCtxGetDevice_v2");
  if (ctx == nullptr) return cuCtxGetDevice(device);
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* c = reinterpret_cast<Context*>(ctx);
  if (!IsLiveContext(c)) return CUDA_ERROR_INVALID_CONTEXT;
  *device = c->device;
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxGetFlags(unsigned int* flags) {
  FAKECUDA_ENTER("cuCtxGetFlags");
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  *flags = ctx->flags.load();
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  FAKECUDA_ENTER("cuCtxGetApiVersion");
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* c = ctx ? reinterpret_cast<Context*>(ctx) : CurrentContext();
  if (!IsLiveContext(c)) return CUDA_ERROR_INVALID_CONTEXT;
  *version = 3020;  // what real drivers report for every context
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxSynchronize(void) {
  FAKECUDA_ENTER("cuCtxSynchronize");
  Context* ctx = nullptr;
  if (CUresult r = RequireContext(&ctx); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckContextWait(ctx); r != CUDA_SUCCESS) return r;
  SynchronizeContext(ctx);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  FAKECUDA_ENTER("cuCtxSynchronize_v2");
  if (ctx == nullptr) return cuCtxSynchronize();
  auto* c = reinterpret_cast<Context*>(ctx);
  if (!IsLiveContext(c)) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = CheckContextWait(c); r != CUDA_SUCCESS) return r;
  SynchronizeContext(c);
  return CUDA_SUCCESS;
}

// --- Errors ------------------------------------------------------------------
namespace {
struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

// Names as in cuda.h; texts as the real driver's cuGetErrorString.
constexpr ErrorText kErrors[] = {
#define E(code, text) \
  { code, #code, text }
    E(CUDA_SUCCESS, "no error"),
    E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    E(CUDA_ERROR_PROFILER_DISABLED, "profiler disabled while using external profiling tool"),
    E(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    E(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable"),
    E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    E(CUDA_ERROR_DEVICE_NOT_LICENSED, "device doesn't have valid Grid license"),
    E(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    E(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current"),
    E(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
    E(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
    E(CUDA_ERROR_ARRAY_IS_MAPPED, "array is mapped"),
    E(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"),
    E(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device"),
    E(CUDA_ERROR_ALREADY_ACQUIRED, "resource already acquired"),
    E(CUDA_ERROR_NOT_MAPPED, "resource not mapped"),
    E(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "resource not mapped as array"),
    E(CUDA_ERROR_NOT_MAPPED_AS_POINTER, "resource not mapped as pointer"),
    E(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered"),
    E(CUDA_ERROR_UNSUPPORTED_LIMIT, "limit is not supported on this architecture"),
    E(CUDA_ERROR_CONTEXT_ALREADY_IN_USE,
      "exclusive-thread device already in use by a different thread"),
    E(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices"),
    E(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
    E(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "invalid OpenGL or DirectX context"),
    E(CUDA_ERROR_NVLINK_UNCORRECTABLE, "uncorrectable NVLink error detected during the execution"),
    E(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "PTX JIT compiler library not found"),
    E(CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
      "the provided PTX was compiled with an unsupported toolchain."),
    E(CUDA_ERROR_JIT_COMPILATION_DISABLED, "PTX JIT compilation was disabled"),
    E(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "the provided execution affinity is not supported"),
    E(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid"),
    E(CUDA_ERROR_FILE_NOT_FOUND, "file not found"),
    E(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "shared object symbol not found"),
    E(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed"),
    E(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
    E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    E(CUDA_ERROR_LOSSY_QUERY, "attempted introspection would be semantically lossy"),
    E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    E(CUDA_ERROR_NOT_READY, "device not ready"),
    E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    E(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    E(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated"),
    E(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "launch uses incompatible texturing mode"),
    E(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled"),
    E(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled"),
    E(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "cannot set while device is active in this process"),
    E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    E(CUDA_ERROR_ASSERT, "device-side assert triggered"),
    E(CUDA_ERROR_TOO_MANY_PEERS, "peer mapping resources exhausted"),
    E(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
      "part or all of the requested memory range is already mapped"),
    E(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
      "pointer does not correspond to a registered memory region"),
    E(CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error"),
    E(CUDA_ERROR_ILLEGAL_INSTRUCTION, "an illegal instruction was encountered"),
    E(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address"),
    E(CUDA_ERROR_INVALID_ADDRESS_SPACE, "operation not supported on global/shared address space"),
    E(CUDA_ERROR_INVALID_PC, "invalid program counter"),
    E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    E(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "too many blocks in cooperative launch"),
    E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    E(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized"),
    E(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
      "system has unsupported display driver / cuda driver combination"),
    E(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
      "forward compatibility was attempted on non supported HW"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
    E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
      "operation failed due to a previous error during capture"),
    E(CUDA_ERROR_STREAM_CAPTURE_MERGE,
      "operation would result in a merge of separate capture sequences"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not ended in the same stream as it began"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work"),
    E(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
      "dependency created on uncaptured work in another stream"),
    E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
      "operation would make the legacy stream depend on a capturing blocking stream"),
    E(CUDA_ERROR_CAPTURED_EVENT,
      "operation not permitted on an event last recorded in a capturing stream"),
    E(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
      "attempt to terminate a thread-local capture sequence from another thread"),
    E(CUDA_ERROR_TIMEOUT, "wait operation timed out"),
    E(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
      "the graph update was not performed because it included changes which violated constraints "
      "specific to instantiated graph update"),
    E(CUDA_ERROR_UNKNOWN, "unknown error"),
#undef E
};
}  // namespace

FAKECUDA_EXPORT CUresult cuGetErrorName(CUresult error, const char** str) {
  FAKECUDA_ENTER_NO_INIT("cuGetErrorName");
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorText& e : kErrors) {
    if (e.code == error) {
      *str = e.name;
      return CUDA_SUCCESS;
    }
  }
  *str = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

FAKECUDA_EXPORT CUresult cuGetErrorString(CUresult error, const char** str) {
  FAKECUDA_ENTER_NO_INIT("cuGetErrorString");
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const ErrorText& e : kErrors) {
    if (e.code == error) {
      *str = e.text;
      return CUDA_SUCCESS;
    }
  }
  *str = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}
