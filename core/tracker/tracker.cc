#include "core/tracker/tracker.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/base/json.h"
#include "core/base/log.h"
#include "core/driver/device_context.h"
#include "core/swap/external_allocations.h"
#include "core/swap/stream_ordered.h"
#include "core/tracker/operation_keys.h"

namespace stensor {
namespace {

constexpr int kLogFormatVersion = 1;

std::string StreamText(StreamRef s) {
  if (s.handle == nullptr) return s.per_thread ? "per_thread" : "legacy";
  if (s.handle == CU_STREAM_LEGACY) return "legacy";
  if (s.handle == CU_STREAM_PER_THREAD) return "per_thread";
  return absl::StrFormat("0x%x", reinterpret_cast<uintptr_t>(s.handle));
}

std::string Hex(uint64_t v) { return absl::StrFormat("0x%x", v); }

// The launch record's "tables": each table reached and the buffers it
// referred to.
std::string TablesJson(const Accesses& a) {
  std::string out = "[";
  for (const Accesses::TableUse& t : a.tables) {
    if (out.size() > 1) out.push_back(',');
    out += JsonLine().Uint("id", t.id).Uints("refs", t.refs).Bool("writes", t.writes).Finish();
  }
  out.push_back(']');
  return out;
}

}  // namespace

const char* OpTypeName(OpType type) {
  switch (type) {
    case OpType::kAlloc:
      return "alloc";
    case OpType::kFree:
      return "free";
    case OpType::kLaunch:
      return "launch";
    case OpType::kMemcpy:
      return "memcpy";
    case OpType::kMemset:
      return "memset";
    case OpType::kSync:
      return "sync";
    case OpType::kGraphLaunch:
      return "graph_launch";
    case OpType::kCount:
      break;
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Tracker>> Tracker::Create(const Config& config,
                                                         const Driver* driver) {
  std::unique_ptr<Tracker> t(new Tracker(config, driver));
  std::string path = config.AccessLogPath(static_cast<int>(getpid()));
  if (!path.empty()) {
    auto log = AccessLog::Open(path);
    if (!log.ok()) return log.status();
    t->log_ = std::move(*log);
  }
  if (config.stats || t->log_) t->leaks_ = std::make_unique<Leaks>();
  Tracker* raw = t.get();
  // Without an access log the manager builds no log line at all.
  t->memory_ = MemoryManager::Create(
      config, driver,
      t->log_ ? MemoryManager::LogSink([raw](std::string line) { raw->Log(std::move(line)); })
              : nullptr);
  t->exact_sizes_ = std::make_unique<ExactSizes>(driver, t->memory_.get());
  t->tables_ = std::make_unique<TableInference>(
      driver, t->memory_.get(), &t->capture_, &t->registry_, &t->pinned_,
      config.write_inference == WriteInference::kConservative,
      t->log_
          ? std::function<void(std::string)>([raw](std::string line) { raw->Log(std::move(line)); })
          : nullptr);
  t->graphs_ = std::make_unique<GraphLauncher>(driver, &t->kernels_, &t->capture_, &t->registry_,
                                               &t->pinned_, t->memory_.get(), t->tables_.get());
  return t;
}

Tracker::Tracker(const Config& config, const Driver* driver)
    : config_(config),
      driver_(driver),
      kernels_(driver, config.write_inference == WriteInference::kConservative),
      capture_(driver) {}

namespace {
// "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", as nvidia-smi -L prints it.
std::string UuidText(const CUuuid& uuid) {
  std::string text = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text.push_back('-');
    absl::StrAppendFormat(&text, "%02x", static_cast<unsigned char>(uuid.bytes[i]));
  }
  return text;
}
}  // namespace

std::string Tracker::Header() const {
  std::string devices = "[";
  int count = 0;
  if (driver_->cuDeviceGetCount != nullptr && driver_->cuDeviceGetCount(&count) == CUDA_SUCCESS) {
    for (int d = 0; d < count; ++d) {
      char name[256] = "";
      size_t total = 0;
      if (driver_->cuDeviceGetName != nullptr) {
        driver_->cuDeviceGetName(name, sizeof(name), d);
      }
      if (driver_->cuDeviceTotalMem_v2 != nullptr) {
        driver_->cuDeviceTotalMem_v2(&total, d);
      }
      // Which physical device the ordinal is (CUDA_VISIBLE_DEVICES
      // renumbers them): "" when the driver cannot say.
      CUuuid uuid;
      std::string uuid_text;
      if (driver_->cuDeviceGetUuid_v2 != nullptr &&
          driver_->cuDeviceGetUuid_v2(&uuid, d) == CUDA_SUCCESS) {
        uuid_text = UuidText(uuid);
      }
      char bus[32] = "";
      if (driver_->cuDeviceGetPCIBusId == nullptr ||
          driver_->cuDeviceGetPCIBusId(bus, sizeof(bus), d) != CUDA_SUCCESS) {
        bus[0] = '\0';
      }
      bus[sizeof(bus) - 1] = '\0';
      if (d > 0) devices.push_back(',');
      devices += JsonLine()
                     .Int("ordinal", d)
                     .Str("name", name)
                     .Uint("total_bytes", total)
                     .Str("uuid", uuid_text)
                     .Str("pci_bus_id", bus)
                     .Finish();
    }
  }
  devices.push_back(']');
  return JsonLine()
      .Str("type", "header")
      .Int("format", kLogFormatVersion)
      .Int("pid", getpid())
      .Raw("devices", devices)
      .Raw("config", config_.Describe())
      .Finish();
}

void Tracker::Log(std::string line) {
  // The header waits for the first record: by then the application has
  // called cuInit, so the devices can be listed.
  std::call_once(header_once_, [this] { log_->Append(Header()); });
  log_->Append(std::move(line));
}

uint64_t Tracker::IdAt(uint64_t addr) const {
  auto b = registry_.Find(addr);
  return b ? b->id : 0;
}

// --- Allocation calls ---------------------------------------------------------------

CUresult Tracker::DriverAllocation(const char* api, CUdeviceptr* dptr, size_t bytes,
                                   BufferKind kind, DriverCall call) {
  CUresult r = call();
  // No bytes asked, no buffer (a stream-ordered allocation of 0 bytes
  // succeeds on a GPU).
  if (r == CUDA_SUCCESS && dptr != nullptr && *dptr != 0 && bytes != 0) {
    OnAlloc(api, *dptr, bytes, kind);
  }
  return r;
}

CUresult Tracker::Allocate(const char* api, CUdeviceptr* dptr, size_t bytes, DriverCall call) {
  if (!capped()) return DriverAllocation(api, dptr, bytes, BufferKind::kDeviceAlloc, call);
  RelaxedCaptureScope relaxed(capture_);
  // Registered under the manager's lock: the buffer has its id from the start.
  return memory_->Allocate(bytes, dptr, [&](CUdeviceptr base) {
    return OnAlloc(api, base, bytes, BufferKind::kDeviceAlloc);
  });
}

CUresult Tracker::AllocatePitch(const char* api, CUdeviceptr* dptr, size_t* pitch, size_t width,
                                size_t height, DriverCall call) {
  CUresult r = ChargedPitchAllocation(memory_.get(), dptr, width, height, call);
  if (r == CUDA_SUCCESS && dptr != nullptr && pitch != nullptr) {
    OnAlloc(api, *dptr, uint64_t{*pitch} * height, BufferKind::kDeviceAlloc);
  }
  return r;
}

CUresult Tracker::Free(const char* api, CUdeviceptr dptr, DriverCall call) {
  if (capped() && memory_->Owns(dptr)) {
    RelaxedCaptureScope relaxed(capture_);
    // Forget the range before its address can be handed out again.
    if (registry_.Find(dptr)) OnFree(api, dptr);
    return memory_->Free(dptr);
  }
  CUresult r = call();
  if (r != CUDA_SUCCESS) return r;
  OnFree(api, dptr);
  if (capped()) memory_->ForgetExternal(dptr);
  return r;
}

CUresult Tracker::AllocateAsync(const char* api, CUdeviceptr* dptr, size_t bytes, StreamRef stream,
                                DriverCall call) {
  CUresult r;
  if (capped() && AllocateAsyncCapped(api, dptr, bytes, stream, &r)) return r;
  r = ChargedAllocation(
      memory_.get(), dptr, bytes,
      [&] { return DriverAllocation(api, dptr, bytes, BufferKind::kStreamOrdered, call); },
      capped() && FromDefaultPool(*driver_) ? MemoryManager::ExternalSource::kDefaultPool
                                            : MemoryManager::ExternalSource::kFresh);
  CUresult served;
  if (r == CUDA_ERROR_OUT_OF_MEMORY && capped() &&
      AllocateAsyncCapped(api, dptr, bytes, stream, &served, /*no_room=*/true)) {
    return served;
  }
  return r;
}

CUresult Tracker::AllocateFromPool(const char* api, CUdeviceptr* dptr, size_t bytes,
                                   DriverCall call) {
  return ChargedAllocation(memory_.get(), dptr, bytes, [&] {
    return DriverAllocation(api, dptr, bytes, BufferKind::kStreamOrdered, call);
  });
}

CUresult Tracker::FreeAsync(const char* api, CUdeviceptr dptr, StreamRef stream, DriverCall call) {
  if (capped() && memory_->Owns(dptr)) {
    if (capture_.Capturing(Handle(stream))) {
      // A free node for a buffer stensor serves: the free would happen at
      // each launch of the graph, behind nodes stensor does not order it
      // after. Refused rather than guessed (docs/usage.md, CUDA graphs).
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    RelaxedCaptureScope relaxed(capture_);
    // Forgotten only once the manager took the free (a stream the driver
    // refuses leaves the buffer as it was).
    return memory_->FreeAsync(dptr, Handle(stream), [&] {
      if (registry_.Find(dptr)) OnFree(api, dptr);
    });
  }
  CUresult r = call();
  if (r != CUDA_SUCCESS) return r;
  OnFree(api, dptr);
  // Charged until the stream reached the free, as the driver frees it
  // (inside a capture: until stensor knows no more, for good).
  if (capped() && !Capturing(stream)) memory_->ForgetExternalAsync(dptr, Handle(stream));
  return r;
}

CUresult Tracker::CreateMemory(CUmemGenericAllocationHandle* handle, size_t size,
                               const CUmemAllocationProp* prop, unsigned long long flags,
                               DriverCall call) {
  // stensor's own cuMemCreate calls do not come here: it calls the real
  // driver through its table.
  return capped() ? memory_->CreateAppMemory(handle, size, prop, flags) : call();
}

void Tracker::OnRelease(CUmemGenericAllocationHandle handle) {
  if (capped()) memory_->OnAppRelease(handle);
}

void Tracker::OnMap(const char* api, uint64_t base, uint64_t size,
                    CUmemGenericAllocationHandle handle) {
  OnAlloc(api, base, size, BufferKind::kAppVmm);
  if (capped()) memory_->OnAppMap(base, size, handle);
}

CUresult Tracker::GetIpcHandle(const char* api, CUipcMemHandle* handle, CUdeviceptr ptr,
                               DriverCall call) {
  CUresult r;
  // A null handle is the driver's error: nothing is handed out, nothing pinned.
  if (handle != nullptr && capped() && memory_->PinExported(ptr, api, &r) && r != CUDA_SUCCESS) {
    return r;
  }
  return call();
}

CUresult Tracker::RetainHandle(const char* api, CUmemGenericAllocationHandle* handle, void* addr,
                               DriverCall call) {
  CUresult r;
  if (handle != nullptr && capped() &&  // null: the driver's error, nothing pinned
      memory_->PinExported(reinterpret_cast<uintptr_t>(addr), api, &r)) {
    // Resident for good: the handle of its current physical memory, which
    // is never replaced.
    return r != CUDA_SUCCESS ? r : call();
  }
  r = call();
  if (r == CUDA_SUCCESS && handle != nullptr && capped()) {
    memory_->OnAppRetain(*handle);  // one more reference to release
  }
  return r;
}

CUresult Tracker::ExportHandle(const char* api, CUmemGenericAllocationHandle handle,
                               DriverCall call) {
  if (capped()) memory_->PinExportedHandle(handle, api);
  return call();
}

void Tracker::OnMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (capped()) CappedMemInfo(*memory_, *driver_, free_bytes, total_bytes);
}

void Tracker::OnDeviceTotalMem(CUdevice device, size_t* bytes) {
  if (capped()) memory_->MemInfo(device, nullptr, bytes);
}

void Tracker::OnPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  if (capped()) AddStreamOrderedShare(*memory_, *driver_, pool, attr, value);
}

void Tracker::OnPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr) {
  if (capped()) ResetStreamOrderedHigh(*memory_, *driver_, pool, attr);
}

void Tracker::OnPoolTrimTo(CUmemoryPool pool, size_t keep) {
  if (capped()) TrimStreamOrdered(*memory_, *driver_, pool, keep);
}

CUresult Tracker::BeginLaunch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                              StreamRef stream, void** params, void** extra, Accesses* accesses) {
  const KernelInfo* kernel = kernels_.Get(f);
  accesses->kernel = kernel;
  InferLaunchAccesses(*kernel, params, extra, registry_, accesses);
  // Captured: runs later, as a graph node; its tables are read then.
  if (ABSL_PREDICT_FALSE(capture_.Capturing(Handle(stream)))) {
    accesses->captured = true;
    return CUDA_SUCCESS;
  }
  if (tracks_tables() && (kernel->has_tables || !tables_->empty())) {
    tables_->Expand(*kernel, params, extra, Handle(stream), accesses);
  }
  // Where the kernel's tensors start: for a segment made of pieces, and
  // for the log (`stensor sim` makes the same pieces).
  if (log_ || (memory_ && memory_->has_pieces())) {
    tables_->ForEachParamPointer(*kernel, params, extra, [&](uint64_t id, uint64_t word, bool) {
      accesses->pointers.push_back({id, word});
    });
    accesses->pointers_known = true;
  }
  if (!memory_) return CUDA_SUCCESS;
  tables_->NoteHostPointers(*kernel, params, extra);
  // Before the cap presses, known accesses: journaled, nothing more to build.
  MemoryManager::OpTicket ticket;
  if (kernel->layout_known && !accesses->unknown_tables &&
      memory_->Journal(accesses->reads, &ticket)) {
    accesses->op_journal = ticket.journal;
    return CUDA_SUCCESS;
  }
  return PrepareLaunch(f, grid, block, *kernel, stream, accesses);
}

namespace {

struct LaunchShape {
  CUfunction f;
  const unsigned* grid;
  const unsigned* block;
};

uint64_t LaunchKeyOf(const void* shape) {
  const auto* s = static_cast<const LaunchShape*>(shape);
  return LaunchKey(s->f, s->grid, s->block);
}

}  // namespace

CUresult Tracker::PrepareLaunch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                                const KernelInfo& kernel, StreamRef stream, Accesses* accesses) {
  RelaxedCaptureScope relaxed(capture_);
  // Known accesses: an operation of the iteration (S01/S02), noted under
  // the lock that prepares it.
  const bool known = kernel.layout_known && !accesses->unknown_tables;
  MemoryManager::OpTicket ticket;
  const LaunchShape shape{f, grid, block};
  MemoryManager::Operation op{
      0, accesses->writes, known && !config_.iteration_marker.empty() && IsMarker(kernel), &ticket};
  op.make_key = LaunchKeyOf;
  op.key_arg = &shape;
  // Of a segment it names, a kernel likely touches only the tensors its
  // pointers start: the rest need not come in for it.
  MemoryManager::Keys far;
  if (known && accesses->pointers_known && memory_->has_pieces()) {
    FindFarPieces(*accesses, &far);
    op.far = far;
  }
  if (CUresult r = memory_->Prepare(accesses->reads, {}, Handle(stream), known ? &op : nullptr);
      r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_OUT_OF_MEMORY) SayRefusal(kernel, *accesses);
    return r;
  }
  if (!known) {
    // Accesses unknown: nothing is evicted from here until the launch's
    // completion is recorded (EndLaunch).
    accesses->unknown_device = memory_->BeginUnknown(Handle(stream));
  } else {
    accesses->op_timing = ticket.timing;
    accesses->op_time = ticket.time;
    accesses->op_finish = ticket.finish;
    accesses->op_journal = ticket.journal;
  }
  return CUDA_SUCCESS;
}

void Tracker::SayRefusal(const KernelInfo& kernel, const Accesses& accesses) const {
  const MemoryManager::Footprint f = memory_->FootprintOf(accesses.reads);
  SayOnce(
      LogLevel::kWarn, "launch-refused",
      absl::StrFormat("a launch of %s was refused (CUDA_ERROR_OUT_OF_MEMORY): its %zu "
                      "buffers take %.1f MiB on device %d together, the cap is %.1f MiB%s",
                      kernel.demangled, f.buffers, f.bytes / 1048576.0, f.device, f.cap / 1048576.0,
                      f.host_vmm ? ""
                                 : "; without host-located VMM what does not fit cannot be "
                                   "served from host memory (docs/limits.md)"));
}

bool Tracker::IsMarker(const KernelInfo& kernel) const {
  const std::string& marker = config_.iteration_marker;
  if (marker.empty()) return false;
  if (kernel.name == marker) return true;
  // The demangled name without its parameters, e.g. "mlp::update".
  const std::string& d = kernel.demangled;
  return d.size() > marker.size() && d.compare(0, marker.size(), marker) == 0 &&
         d[marker.size()] == '(';
}

void Tracker::EndLaunch(const char* api, CUfunction f, const unsigned grid[3],
                        const unsigned block[3], StreamRef stream, const Accesses& accesses,
                        bool submitted) {
  // Set by BeginLaunch; looked up only for a caller that skipped it.
  const KernelInfo* kernel = accesses.kernel != nullptr ? accesses.kernel : kernels_.Get(f);
  if (memory_ && !accesses.captured) FinishLaunch(*kernel, stream, accesses, submitted);
  if (!submitted) return;
  if (ABSL_PREDICT_FALSE(accesses.captured)) {  // runs later, as a graph node
    Count(OpType::kLaunch);
    if (log_) LogLaunch(api, *kernel, grid, block, stream, accesses);
    return;
  }
  if (tracks_tables()) tables_->OnKernel(*kernel, accesses, Handle(stream));
  // Descriptions outlive the tracker, so their names may be kept.
  if (leaks_) leaks_->OnLaunch(kernel->demangled.c_str(), accesses.reads, accesses.writes);
  Count(OpType::kLaunch);
  if (log_) LogLaunch(api, *kernel, grid, block, stream, accesses);
}

void Tracker::FinishLaunch(const KernelInfo& kernel, StreamRef stream, const Accesses& accesses,
                           bool submitted) {
  RelaxedCaptureScope relaxed(capture_);
  // Journaled (known accesses, before the cap presses): nothing else to end.
  if (accesses.op_journal != 0) {
    memory_->Finish(accesses.reads, accesses.writes, Handle(stream), submitted,
                    accesses.op_journal);
    return;
  }
  if (accesses.op_finish) {
    memory_->Finish(accesses.reads, accesses.writes, Handle(stream), submitted,
                    accesses.op_journal);
  }
  // Nothing known about what it wrote: no host copy can be trusted.
  if (submitted && (!kernel.layout_known || accesses.unknown_tables)) {
    memory_->MarkAllWritten(Handle(stream));
  }
  // Each asked here: a launch that needs neither pays no call.
  if (accesses.unknown_device >= 0) memory_->EndUnknown(accesses.unknown_device);
  if (accesses.op_timing >= 0) {
    memory_->EndOperation({accesses.op_timing, accesses.op_time}, Handle(stream), submitted);
  }
  // Descriptions outlive the manager, so their names may be kept.
  if (submitted && memory_->verifying()) {
    memory_->NoteKernel(accesses.reads, accesses.writes, kernel.demangled.c_str());
  }
}

void Tracker::LogLaunch(const char* api, const KernelInfo& kernel, const unsigned grid[3],
                        const unsigned block[3], StreamRef stream, const Accesses& accesses) {
  Accesses unique = accesses;
  unique.Dedupe();
  uint64_t g[3] = {grid[0], grid[1], grid[2]};
  uint64_t b[3] = {block[0], block[1], block[2]};
  JsonLine line;
  line.Str("type", "launch")
      .Str("api", api)
      .Str("kernel", kernel.name)
      .Str("demangled", kernel.demangled)
      .Str("stream", StreamText(stream))
      .Uints("grid", g)
      .Uints("block", b)
      .Uints("reads", unique.reads)
      .Uints("writes", unique.writes)
      .Bool("inferred", kernel.layout_known)
      .Raw("tables", TablesJson(accesses))
      .Bool("unknown_tables", accesses.unknown_tables);
  if (accesses.pointers_known) {
    std::string pointers = PointersJson(accesses);
    if (pointers != "[]") line.Raw("pointers", pointers);
  }
  if (accesses.captured) line.Bool("captured", true);
  Log(line.Finish());
}

namespace {
// Whether a table the launch reached points into buffer `id`.
bool ThroughTable(const Accesses& a, uint64_t id) {
  return std::any_of(a.tables.begin(), a.tables.end(), [&](const Accesses::TableUse& t) {
    return std::find(t.refs.begin(), t.refs.end(), id) != t.refs.end();
  });
}

// Accesses::pointers grouped by buffer (stable: each buffer's words in
// parameter order).
absl::InlinedVector<Accesses::PointerWord, 8> ByBuffer(const Accesses& a) {
  absl::InlinedVector<Accesses::PointerWord, 8> named(a.pointers.begin(), a.pointers.end());
  std::stable_sort(named.begin(), named.end(),
                   [](const auto& x, const auto& y) { return x.id < y.id; });
  return named;
}
}  // namespace

void Tracker::FindFarPieces(const Accesses& accesses, MemoryManager::Keys* far) {
  const absl::InlinedVector<Accesses::PointerWord, 8> named = ByBuffer(accesses);
  absl::InlinedVector<uint64_t, 16> words;
  for (size_t i = 0; i < named.size();) {
    const uint64_t id = named[i].id;
    words.clear();
    for (; i < named.size() && named[i].id == id; ++i) words.push_back(named[i].word);
    // A table's entries are not among the words: whole.
    if (!ThroughTable(accesses, id)) memory_->FarPieces(id, words, far);
  }
  std::sort(far->begin(), far->end());
}

std::string Tracker::PointersJson(const Accesses& accesses) const {
  const absl::InlinedVector<Accesses::PointerWord, 8> named = ByBuffer(accesses);
  std::string out = "[";
  for (size_t i = 0; i < named.size();) {
    size_t end = i;
    bool interior = false;
    for (; end < named.size() && named[end].id == named[i].id; ++end) {
      const std::optional<Buffer> b = registry_.Find(named[end].word);
      interior |= b && b->id == named[i].id && named[end].word != b->base;
    }
    for (; interior && i < end; ++i) {
      if (out.size() > 1) out.push_back(',');
      absl::StrAppend(&out, "[", named[i].id, ",\"0x", absl::Hex(named[i].word), "\"]");
    }
    i = end;
  }
  out.push_back(']');
  return out;
}

bool Tracker::HostSourceSettled(CopyKind kind, const TransferScope& scope, uint64_t src,
                                uint64_t bytes, StreamRef stream, bool async) {
  // Uncapped, nothing is read back on the program's behalf: the log keeps
  // what the source held at submission.
  if (!memory_ || !async || scope.served || scope.captured) return true;
  if (kind != CopyKind::kHostToDevice && kind != CopyKind::kDefault) return true;
  // BeginTransfer looked both sides up: into no tracked buffer, or a
  // device copy.
  if (scope.dst_id == 0 || scope.src_id != 0) return true;
  return tables_->SourceSettled(src, bytes, Handle(stream));
}

void Tracker::OnHostWrite(const TransferScope& scope, uint64_t dst, uint64_t bytes,
                          StreamRef stream) {
  if (!memory_ || scope.dst_id != 0 || dst == 0 || bytes == 0 ||
      capture_.Capturing(Handle(stream))) {
    return;
  }
  tables_->OnHostWrite(dst, bytes, Handle(stream));
}

void Tracker::OnHostFunction(StreamRef stream) {
  // Captured, it becomes a host node of the graph (GraphLaunchScope::writes_host).
  if (!memory_ || capture_.Capturing(Handle(stream))) return;
  tables_->OnHostWrite(0, HostWrites::kEverywhere, Handle(stream));
}

size_t Tracker::OnCopyTables(CopyKind kind, uint64_t dst, uint64_t src, uint64_t bytes, bool linear,
                             HostCopy* host) {
  return tables_->OnCopy(kind, dst, src, bytes, linear, host);
}

void Tracker::OnMemsetTables(uint64_t dst, uint64_t bytes, bool linear) {
  tables_->OnMemset(dst, bytes, linear);
}

// --- Copies and memsets -----------------------------------------------------------

CUresult Tracker::Copy(const char* api, const CopyRanges& c, StreamRef stream, bool async,
                       bool linear, DriverCall call) {
  if (CUresult r = exact_sizes_->CheckExtents(c.dst.start, c.dst.extent, c.src.start, c.src.extent);
      r != CUDA_SUCCESS) {
    return r;
  }
  TransferScope scope;
  const bool to_host = !async && c.kind == CopyKind::kDeviceToHost;
  if (CUresult r =
          BeginTransfer(c.dst.start, c.src.start, c.bytes, stream, linear, to_host, &scope);
      r != CUDA_SUCCESS) {
    return r;
  }
  // Asked before the copy joins its stream: work queued ahead of it may
  // still write a host source, which is then scanned as a guess only.
  const bool settled = HostSourceSettled(c.kind, scope, c.src.start, c.src.extent, stream, async);
  CUresult r = scope.served ? CUDA_SUCCESS : call();
  EndTransfer(scope, stream, r == CUDA_SUCCESS);
  if (r != CUDA_SUCCESS) return r;
  // Host memory it writes may be a later upload's source.
  if (async && !scope.captured) OnHostWrite(scope, c.dst.start, c.dst.extent, stream);
  // A copy's pointers are learnt when it is submitted (the program may not
  // change its source until it ran). A captured copy runs at its graph's
  // launch, which accounts for it.
  HostCopy host{settled, /*waitable=*/true, Handle(stream)};
  size_t entries = tracks_tables() && !scope.captured
                       ? OnCopyTables(c.kind, c.dst.start, c.src.start, c.bytes, linear, &host)
                       : 0;
  OnCopy(api, c.kind, c.dst.start, c.src.start, c.bytes, stream, async, entries, scope.captured);
  return r;
}

CUresult Tracker::Memset(const char* api, uint64_t dst, const MemsetRange& range, StreamRef stream,
                         bool async, DriverCall call) {
  if (CUresult r = exact_sizes_->CheckExtents(dst, range.extent, 0, 0); r != CUDA_SUCCESS) {
    return r;
  }
  TransferScope scope;
  const bool linear = range.linear();
  if (CUresult r = BeginTransfer(dst, 0, range.bytes, stream, linear, false, &scope);
      r != CUDA_SUCCESS) {
    return r;
  }
  CUresult r = call();
  EndTransfer(scope, stream, r == CUDA_SUCCESS);
  if (r != CUDA_SUCCESS) return r;
  if (!scope.captured) {
    OnMemsetTables(dst, range.bytes, linear);
    // Memsets of device-mapped host memory run in stream order too.
    OnHostWrite(scope, dst, range.extent, stream);
  }
  OnMemset(api, dst, range.bytes, stream, async, scope.captured);
  return r;
}

CUresult Tracker::CopyBatch(const char* api, absl::Span<const CopyRanges> ops, StreamRef stream,
                            DriverCall call) {
  for (const CopyRanges& c : ops) {
    if (CUresult r =
            exact_sizes_->CheckExtents(c.dst.start, c.dst.extent, c.src.start, c.src.extent);
        r != CUDA_SUCCESS) {
      return r;
    }
  }
  std::vector<TransferScope> scopes(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (CUresult r = BeginTransfer(ops[i].dst.start, ops[i].src.start, 0, stream,
                                   /*linear=*/false, /*to_host=*/false, &scopes[i]);
        r != CUDA_SUCCESS) {
      for (size_t j = 0; j < i; ++j) EndTransfer(scopes[j], stream, false);
      return r;
    }
  }
  const bool captured = !scopes.empty() && scopes[0].captured;
  std::vector<bool> settled(ops.size(), true);
  for (size_t i = 0; i < ops.size() && !captured; ++i) {
    settled[i] = HostSourceSettled(ops[i].kind, scopes[i], ops[i].src.start, ops[i].src.extent,
                                   stream, /*async=*/true);
  }
  CUresult r = call();
  for (const TransferScope& scope : scopes) EndTransfer(scope, stream, r == CUDA_SUCCESS);
  if (r != CUDA_SUCCESS) return r;
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyRanges& c = ops[i];
    // 1D operations are contiguous: their tables are scanned; the rows of a
    // 3D one are not.
    const bool linear = c.kind != CopyKind::kBatch3D;
    HostCopy host{settled[i], /*waitable=*/true, Handle(stream)};
    size_t entries = tracks_tables() && !captured
                         ? OnCopyTables(c.kind, c.dst.start, c.src.start, c.bytes, linear, &host)
                         : 0;
    OnCopy(api, c.kind, c.dst.start, c.src.start, c.bytes, stream, true, entries, captured);
    if (!captured) OnHostWrite(scopes[i], c.dst.start, c.dst.extent, stream);
  }
  return r;
}

CUresult Tracker::BeginTransfer(uint64_t dst, uint64_t src, uint64_t bytes, StreamRef stream,
                                bool linear, bool to_host, TransferScope* scope) {
  const bool captured = ABSL_PREDICT_FALSE(capture_.Capturing(Handle(stream)));
  if (!memory_) {
    scope->captured = captured;  // its tables are its graph's business
    return CUDA_SUCCESS;
  }
  RelaxedCaptureScope relaxed(capture_);
  std::optional<Buffer> d = registry_.Find(dst);
  std::optional<Buffer> s = src != 0 ? registry_.Find(src) : std::nullopt;
  scope->dst_id = d ? d->id : 0;
  scope->src_id = s ? s->id : 0;
  if (captured) {
    // It runs later, as a graph node (whose launch brings its buffers in).
    // But the driver checks a copy's or memset's addresses when it records
    // the node, unlike a kernel's arguments: a swapped-out buffer whose
    // address is unmapped would be refused. So they are made resident for
    // the call, on a stream of stensor's own, and kept until it returned.
    scope->captured = true;
    if (scope->dst_id == 0 && scope->src_id == 0) return CUDA_SUCCESS;
    scope->side = capture_.SideStream();
    if (scope->side == nullptr) return CUDA_SUCCESS;  // the driver will say
    uint64_t ids[2] = {scope->dst_id, scope->src_id};
    return memory_->Prepare(absl::MakeSpan(ids, 2), {}, scope->side);
  }
  if (linear && to_host && s && !d) {
    // A synchronous copy from a swapped-out buffer reads its host copy. It
    // waits for the stream first, as the driver's copy would.
    if (driver_->cuStreamSynchronize != nullptr &&
        driver_->cuStreamSynchronize(Handle(stream)) == CUDA_SUCCESS &&
        memory_->ReadFromHostCopy(s->id, src - s->base, reinterpret_cast<void*>(dst), bytes)) {
      scope->served = true;
      return CUDA_SUCCESS;
    }
  }
  // A linear copy or memset reaches exactly its ranges: of an allocation
  // made of pieces, only the pieces there are held and written, and those
  // it covers whole come back without a copy.
  MemoryManager::Keys overwritten;
  if (d && !(linear && memory_->Narrow(d->id, dst - d->base, bytes, &scope->ids, &overwritten))) {
    scope->ids.push_back(d->id);
    if (linear && dst == d->base && bytes == d->size) overwritten.push_back(d->id);
  }
  scope->written = scope->ids;
  const size_t sources = scope->ids.size();
  if (s && !(linear && memory_->Narrow(s->id, src - s->base, bytes, &scope->ids, nullptr))) {
    scope->ids.push_back(s->id);
  }
  // What it also reads is not overwritten whole.
  for (size_t i = sources; i < scope->ids.size(); ++i) {
    overwritten.erase(std::remove(overwritten.begin(), overwritten.end(), scope->ids[i]),
                      overwritten.end());
  }
  // Noted with its Prepare, as a launch is: the planner's next uses decide
  // whether a swapped-out buffer is brought in for it or served.
  MemoryManager::Operation op;
  op.key = TransferKey(bytes, to_host, src == 0);
  op.written = scope->written;
  op.ticket = &scope->op;
  return memory_->Prepare(scope->ids, overwritten, Handle(stream), &op);
}

void Tracker::EndTransfer(const TransferScope& scope, StreamRef stream, bool submitted) {
  if (!memory_ || scope.served) return;
  RelaxedCaptureScope relaxed(capture_);
  uint64_t ids[2] = {scope.dst_id, scope.src_id};
  if (scope.captured) {  // nothing ran: no use, no write
    if (scope.side != nullptr) memory_->Finish(absl::MakeSpan(ids, 2), {}, scope.side, false);
    return;
  }
  if (scope.op.finish) {
    memory_->Finish(scope.ids, scope.written, Handle(stream), submitted, scope.op.journal);
  }
  memory_->EndOperation(scope.op, Handle(stream), submitted);
}

uint64_t Tracker::OnAlloc(const char* api, uint64_t base, uint64_t size, BufferKind kind) {
  Count(OpType::kAlloc);
  CUdevice device = 0;
  if (driver_->cuCtxGetDevice != nullptr) driver_->cuCtxGetDevice(&device);
  std::optional<uint64_t> id = registry_.Add(base, size, device, kind);
  if (leaks_ && id && kind != BufferKind::kAppVmm) leaks_->OnAlloc(*id, api, size, device);
  if (!log_) return id.value_or(0);
  Log(JsonLine()
          .Str("type", "alloc")
          .Str("api", api)
          .Uint("id", id.value_or(0))
          .Str("addr", Hex(base))
          .Uint("bytes", size)
          .Int("device", device)
          .Str("kind", BufferKindName(kind))
          .Finish());
  return id.value_or(0);
}

void Tracker::OnFree(const char* api, uint64_t base) {
  if (base == 0) return;  // a free of null frees nothing (CUDA_SUCCESS on a GPU)
  Count(OpType::kFree);
  std::optional<Buffer> b = registry_.Remove(base);
  if (b) tables_->OnFree(b->id);
  if (b && leaks_) leaks_->OnFree(b->id);
  if (!log_) return;
  Log(JsonLine()
          .Str("type", "free")
          .Str("api", api)
          .Uint("id", b ? b->id : 0)
          .Str("addr", Hex(base))
          .Uint("bytes", b ? b->size : 0)
          .Finish());
}

void Tracker::OnHostAlloc(const char* api, const void* p, uint64_t size) {
  if (p == nullptr) return;  // 0 bytes asked: nothing allocated
  pinned_.Allocated(reinterpret_cast<uintptr_t>(p), size);
  if (!log_) return;
  Log(JsonLine()
          .Str("type", "host_alloc")
          .Str("api", api)
          .Str("addr", Hex(reinterpret_cast<uintptr_t>(p)))
          .Uint("bytes", size)
          .Finish());
}

void Tracker::OnHostRegister(const void* p, uint64_t size) {
  if (p == nullptr || size == 0) return;
  pinned_.Registered(reinterpret_cast<uintptr_t>(p), size);
}

void Tracker::OnHostUnregister(const void* p) {
  pinned_.Unregistered(reinterpret_cast<uintptr_t>(p));
}

void Tracker::OnHostFree(const char* api, const void* p) {
  if (p == nullptr) return;  // a free of null frees nothing (CUDA_SUCCESS on a GPU)
  const uint64_t size = pinned_.Freed(reinterpret_cast<uintptr_t>(p));
  if (!log_) return;
  Log(JsonLine()
          .Str("type", "host_free")
          .Str("api", api)
          .Str("addr", Hex(reinterpret_cast<uintptr_t>(p)))
          .Uint("bytes", size)
          .Finish());
}

uint64_t Tracker::host_pinned_bytes() const { return pinned_.allocated_bytes(); }

void Tracker::OnUnmap(const char* api, uint64_t base, uint64_t size) {
  for (const Buffer& b : registry_.RemoveRange(base, size)) {
    Count(OpType::kFree);
    tables_->OnFree(b.id);
    if (leaks_) leaks_->OnFree(b.id);
    if (!log_) continue;
    Log(JsonLine()
            .Str("type", "free")
            .Str("api", api)
            .Uint("id", b.id)
            .Str("addr", Hex(b.base))
            .Uint("bytes", b.size)
            .Finish());
  }
  if (capped()) memory_->OnAppUnmap(base, size);
}

void Tracker::OnCopy(const char* api, CopyKind kind, uint64_t dst, uint64_t src, uint64_t bytes,
                     StreamRef stream, bool async, size_t table_entries, bool captured) {
  Count(OpType::kMemcpy);
  if (!log_) return;
  uint64_t dst_id = IdAt(dst), src_id = IdAt(src);
  absl::InlinedVector<uint64_t, 1> reads, writes;
  if (src_id != 0) reads.push_back(src_id);
  if (dst_id != 0) writes.push_back(dst_id);
  JsonLine line;
  line.Str("type", "memcpy")
      .Str("api", api)
      .Str("kind", CopyKindName(kind))
      .Uint("bytes", bytes)
      .Str("dst", Hex(dst))
      .Str("src", Hex(src))
      .Uints("reads", reads)
      .Uints("writes", writes)
      .Str("stream", StreamText(stream))
      .Bool("async", async);
  if (table_entries > 0) line.Uint("table_entries", table_entries);
  if (captured) line.Bool("captured", true);
  Log(line.Finish());
}

void Tracker::OnMemset(const char* api, uint64_t dst, uint64_t bytes, StreamRef stream, bool async,
                       bool captured) {
  Count(OpType::kMemset);
  if (!log_) return;
  absl::InlinedVector<uint64_t, 1> writes;
  if (uint64_t id = IdAt(dst)) writes.push_back(id);
  JsonLine line;
  line.Str("type", "memset")
      .Str("api", api)
      .Uint("bytes", bytes)
      .Str("dst", Hex(dst))
      .Uints("writes", writes)
      .Str("stream", StreamText(stream))
      .Bool("async", async);
  if (captured) line.Bool("captured", true);
  Log(line.Finish());
}

void Tracker::OnSync(const char* api, StreamRef stream) {
  Count(OpType::kSync);
  if (!log_) return;
  JsonLine line;
  line.Str("type", "sync").Str("api", api);
  if (stream.handle != nullptr || stream.per_thread) {
    line.Str("stream", StreamText(stream));
  }
  Log(line.Finish());
}

// --- Graphs and stream capture ------------------------------------------------------

void Tracker::OnGraphInstantiate(const char* api, CUgraphExec exec, CUgraph graph,
                                 unsigned long long flags) {
  if (!tracks_tables()) return;  // neither a cap nor a log reads plans
  std::shared_ptr<const GraphPlan> plan = graphs_->OnInstantiate(exec, graph, flags);
  if (!log_) return;
  JsonLine line;
  line.Str("type", "graph_instantiate")
      .Str("api", api)
      .Str("graph", Hex(reinterpret_cast<uintptr_t>(exec)))
      .Uint("nodes", plan->nodes.size())
      .Bool("inferred", !plan->unknown);
  if (plan->unknown) line.Str("why", plan->why);
  if (plan->alloc_nodes + plan->free_nodes > 0) {
    line.Uint("alloc_nodes", plan->alloc_nodes).Uint("free_nodes", plan->free_nodes);
  }
  Log(line.Finish());
}

CUresult Tracker::BeginGraphLaunch(CUgraphExec exec, StreamRef stream, GraphLaunchScope* scope) {
  if (!tracks_tables()) return CUDA_SUCCESS;
  return graphs_->Begin(exec, Handle(stream), scope);
}

void Tracker::EndGraphLaunch(const char* api, CUgraphExec exec, StreamRef stream,
                             const GraphLaunchScope& scope, bool submitted) {
  if (tracks_tables()) graphs_->End(Handle(stream), scope, submitted);
  if (!submitted) return;
  Count(OpType::kGraphLaunch);
  if (!log_) return;
  JsonLine line;
  line.Str("type", "graph_launch")
      .Str("api", api)
      .Str("graph", Hex(reinterpret_cast<uintptr_t>(exec)))
      .Str("stream", StreamText(stream));
  if (scope.captured) {
    line.Bool("captured", true);
  } else {
    // As a direct launch's: its nodes were read (what they name was made
    // resident, the `reads`), but a table an earlier node of the same launch
    // writes could point anywhere (`unknown_tables`: then every buffer
    // counts as written).
    const bool walked = scope.plan != nullptr && !scope.plan->unknown;
    line.Bool("inferred", walked);
    if (walked) {
      line.Uint("nodes", scope.nodes.size())
          .Uints("reads", scope.accesses.reads)
          .Uints("writes", scope.accesses.writes)
          .Raw("tables", TablesJson(scope.accesses))
          .Bool("unknown_tables", scope.unknown);
    }
  }
  Log(line.Finish());
}

bool Tracker::AllocateAsyncCapped(const char* api, CUdeviceptr* dptr, uint64_t bytes,
                                  StreamRef stream, CUresult* result, bool no_room) {
  return ServeStreamOrdered(
      *driver_, *memory_, dptr, bytes, Handle(stream),
      [&](CUdeviceptr base) { return OnAlloc(api, base, bytes, BufferKind::kStreamOrdered); },
      result, no_room);
}

// --- Contexts that end -------------------------------------------------------------

CUresult Tracker::EndContext(CUcontext ctx, absl::FunctionRef<CUresult()> call,
                             absl::FunctionRef<bool(CUresult)> ended) {
  if (memory_ && ctx != nullptr) {
    RelaxedCaptureScope relaxed(capture_);
    memory_->BeforeContextEnds(ctx);
  }
  // The program's call, in its own capture mode.
  const CUresult r = call();
  const bool gone = ctx != nullptr && ended(r);
  if (memory_ && ctx != nullptr) {
    RelaxedCaptureScope relaxed(capture_);
    memory_->AfterContextEnds(ctx, gone);
  }
  if (gone) {
    capture_.ForgetContext(ctx);
    ForgetRetainedContext(ctx);
  }
  return r;
}

CUresult Tracker::DestroyContext(CUcontext ctx, absl::FunctionRef<CUresult()> call) {
  return EndContext(ctx, call, [](CUresult r) { return r == CUDA_SUCCESS; });
}

CUresult Tracker::EndPrimaryContext(CUdevice device, bool reset,
                                    absl::FunctionRef<CUresult()> call) {
  // Null when inactive (nothing of stensor's is in it), or when the driver
  // will not say which context it is (then nothing is retired).
  CUcontext primary = ActivePrimaryContext(*driver_, device);
  return EndContext(primary, call, [&](CUresult r) {
    if (r != CUDA_SUCCESS) return false;
    if (reset) return true;
    // A release ends it only with the last reference; a state the driver
    // will not tell is taken as ended (its handles are then never used).
    unsigned flags = 0;
    int active = 0;
    return driver_->cuDevicePrimaryCtxGetState(device, &flags, &active) != CUDA_SUCCESS || !active;
  });
}

void Tracker::BeforeFork() {
  if (log_) log_->BeforeFork();
}

void Tracker::AfterFork() {
  if (log_) log_->AfterFork();
}

void Tracker::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    if (memory_ && config_.stats) {
      std::string text = memory_->StatsText();
      std::fwrite(text.data(), 1, text.size(), stderr);
    }
    // At most 9 lines: within the logger's 10 of a kind.
    if (leaks_) {
      for (const std::string& line : leaks_->Report(/*shown=*/7))
        Say(LogLevel::kWarn, "leak", line);
    }
    if (!log_) return;
    std::call_once(header_once_, [this] { log_->Append(Header()); });
    log_->Close([this](uint64_t dropped) {
      JsonLine counts;
      for (int i = 0; i < static_cast<int>(OpType::kCount); ++i) {
        counts.Uint(OpTypeName(static_cast<OpType>(i)), counts_[i].load());
      }
      return JsonLine()
          .Str("type", "end")
          .Raw("counts", counts.Finish())
          .Uint("live_buffers", registry_.size())
          .Uint("host_pinned_bytes", host_pinned_bytes())
          .Uint("dropped", dropped)
          .Finish();
    });
    // A log that lost records says so once, on stderr (a full disk or a
    // deleted file would otherwise pass unnoticed: the program exits 0).
    if (std::string loss = log_->LossReport(); !loss.empty()) {
      Say(LogLevel::kError, "access-log-loss", absl::StripPrefix(loss, "stensor: "));
    }
  });
}

}  // namespace stensor
