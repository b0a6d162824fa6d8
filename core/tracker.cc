#include "core/tracker.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/json.h"

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

}  // namespace

const char* OpTypeName(OpType type) {
  switch (type) {
    case OpType::kAlloc: return "alloc";
    case OpType::kFree: return "free";
    case OpType::kLaunch: return "launch";
    case OpType::kMemcpy: return "memcpy";
    case OpType::kMemset: return "memset";
    case OpType::kSync: return "sync";
    case OpType::kGraphLaunch: return "graph_launch";
    case OpType::kCount: break;
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
  Tracker* raw = t.get();
  t->memory_ = MemoryManager::Create(config, driver, [raw](std::string line) {
    if (raw->log_) raw->Log(std::move(line));
  });
  return t;
}

Tracker::Tracker(const Config& config, const Driver* driver)
    : config_(config),
      driver_(driver),
      kernels_(driver, config.write_inference == WriteInference::kConservative) {}

std::string Tracker::Header() const {
  std::string devices = "[";
  int count = 0;
  if (driver_->cuDeviceGetCount != nullptr &&
      driver_->cuDeviceGetCount(&count) == CUDA_SUCCESS) {
    for (int d = 0; d < count; ++d) {
      char name[256] = "";
      size_t total = 0;
      if (driver_->cuDeviceGetName != nullptr) {
        driver_->cuDeviceGetName(name, sizeof(name), d);
      }
      if (driver_->cuDeviceTotalMem_v2 != nullptr) {
        driver_->cuDeviceTotalMem_v2(&total, d);
      }
      if (d > 0) devices.push_back(',');
      devices += JsonLine().Int("ordinal", d).Str("name", name).Uint("total_bytes", total).Finish();
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

namespace {
// The stream handle the driver understands for a StreamRef: handle 0 of a
// per-thread entry point is the per-thread stream.
CUstream Handle(StreamRef s) {
  return s.handle == nullptr && s.per_thread ? CU_STREAM_PER_THREAD : s.handle;
}
}  // namespace

CUresult Tracker::AllocateCapped(const char* api, CUdeviceptr* dptr,
                                 uint64_t bytes) {
  CUresult r = memory_->Allocate(bytes, dptr);
  if (r != CUDA_SUCCESS) return r;
  uint64_t id = OnAlloc(api, *dptr, bytes, BufferKind::kDeviceAlloc);
  memory_->Bind(*dptr, id);
  return CUDA_SUCCESS;
}

bool Tracker::FreeCapped(const char* api, CUdeviceptr dptr, CUresult* result) {
  if (!memory_->Owns(dptr)) return false;
  // Forget the range before its address can be handed out again.
  if (registry_.Find(dptr)) OnFree(api, dptr);
  *result = memory_->Free(dptr);
  return true;
}

void Tracker::MemInfo(int device, size_t* free_bytes, size_t* total_bytes) {
  memory_->MemInfo(device, free_bytes, total_bytes);
}

CUresult Tracker::BeginLaunch(CUfunction f, StreamRef stream, void** params,
                              void** extra, Accesses* accesses) {
  const KernelInfo* kernel = kernels_.Get(f);
  InferLaunchAccesses(*kernel, params, extra, registry_, accesses);
  if (!memory_) return CUDA_SUCCESS;
  return memory_->Prepare(accesses->reads, {}, Handle(stream));
}

void Tracker::EndLaunch(const char* api, CUfunction f, const unsigned grid[3],
                        const unsigned block[3], StreamRef stream,
                        const Accesses& accesses, bool submitted) {
  if (memory_) {
    memory_->Finish(accesses.reads, accesses.writes, Handle(stream), submitted);
    // Nothing known about what it wrote: no host copy can be trusted.
    if (submitted && !kernels_.Get(f)->layout_known) memory_->MarkAllWritten(Handle(stream));
    // Descriptions outlive the manager, so their names may be kept.
    if (submitted && memory_->verifying()) {
      memory_->NoteKernel(accesses.reads, accesses.writes, kernels_.Get(f)->demangled.c_str());
    }
  }
  if (!submitted) return;
  Count(OpType::kLaunch);
  if (!log_) return;
  const KernelInfo* kernel = kernels_.Get(f);
  Accesses unique = accesses;
  unique.Dedupe();
  uint64_t g[3] = {grid[0], grid[1], grid[2]};
  uint64_t b[3] = {block[0], block[1], block[2]};
  Log(JsonLine()
          .Str("type", "launch")
          .Str("api", api)
          .Str("kernel", kernel->name)
          .Str("demangled", kernel->demangled)
          .Str("stream", StreamText(stream))
          .Uints("grid", g)
          .Uints("block", b)
          .Uints("reads", unique.reads)
          .Uints("writes", unique.writes)
          .Bool("inferred", kernel->layout_known)
          .Finish());
}

CUresult Tracker::BeginTransfer(uint64_t dst, uint64_t src, uint64_t bytes,
                                StreamRef stream, bool linear, bool to_host,
                                TransferScope* scope) {
  if (!memory_) return CUDA_SUCCESS;
  std::optional<Buffer> d = registry_.Find(dst);
  std::optional<Buffer> s = src != 0 ? registry_.Find(src) : std::nullopt;
  scope->dst_id = d ? d->id : 0;
  scope->src_id = s ? s->id : 0;
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
  uint64_t ids[2] = {scope->dst_id, scope->src_id};
  bool whole = linear && d && dst == d->base && bytes == d->size &&
               scope->src_id != scope->dst_id;
  uint64_t overwritten[1] = {scope->dst_id};
  return memory_->Prepare(absl::MakeSpan(ids, 2),
                          absl::MakeSpan(overwritten, whole ? 1 : 0), Handle(stream));
}

void Tracker::EndTransfer(const TransferScope& scope, StreamRef stream,
                          bool submitted) {
  if (!memory_ || scope.served) return;
  uint64_t ids[2] = {scope.dst_id, scope.src_id};
  uint64_t written[1] = {scope.dst_id};
  memory_->Finish(absl::MakeSpan(ids, 2), absl::MakeSpan(written, 1), Handle(stream),
                  submitted);
}

uint64_t Tracker::OnAlloc(const char* api, uint64_t base, uint64_t size,
                          BufferKind kind) {
  Count(OpType::kAlloc);
  CUdevice device = 0;
  if (driver_->cuCtxGetDevice != nullptr) driver_->cuCtxGetDevice(&device);
  std::optional<uint64_t> id = registry_.Add(base, size, device, kind);
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
  Count(OpType::kFree);
  std::optional<Buffer> b = registry_.Remove(base);
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
  {
    absl::MutexLock lock(&host_mu_);
    host_allocs_[p] = size;
    host_pinned_bytes_ += size;
  }
  if (!log_) return;
  Log(JsonLine()
          .Str("type", "host_alloc")
          .Str("api", api)
          .Str("addr", Hex(reinterpret_cast<uintptr_t>(p)))
          .Uint("bytes", size)
          .Finish());
}

void Tracker::OnHostFree(const char* api, const void* p) {
  uint64_t size = 0;
  {
    absl::MutexLock lock(&host_mu_);
    auto it = host_allocs_.find(p);
    if (it != host_allocs_.end()) {
      size = it->second;
      host_pinned_bytes_ -= size;
      host_allocs_.erase(it);
    }
  }
  if (!log_) return;
  Log(JsonLine()
          .Str("type", "host_free")
          .Str("api", api)
          .Str("addr", Hex(reinterpret_cast<uintptr_t>(p)))
          .Uint("bytes", size)
          .Finish());
}

uint64_t Tracker::host_pinned_bytes() const {
  absl::MutexLock lock(&host_mu_);
  return host_pinned_bytes_;
}

void Tracker::OnUnmap(const char* api, uint64_t base, uint64_t size) {
  for (const Buffer& b : registry_.RemoveRange(base, size)) {
    Count(OpType::kFree);
    if (!log_) continue;
    Log(JsonLine()
            .Str("type", "free")
            .Str("api", api)
            .Uint("id", b.id)
            .Str("addr", Hex(b.base))
            .Uint("bytes", b.size)
            .Finish());
  }
}

void Tracker::OnLaunch(const char* api, CUfunction f, const unsigned grid[3],
                       const unsigned block[3], StreamRef stream,
                       void** params, void** extra) {
  Accesses accesses;
  CUresult r = BeginLaunch(f, stream, params, extra, &accesses);
  EndLaunch(api, f, grid, block, stream, accesses, r == CUDA_SUCCESS);
}

void Tracker::OnCopy(const char* api, const char* kind, uint64_t dst,
                     uint64_t src, uint64_t bytes, StreamRef stream,
                     bool async) {
  Count(OpType::kMemcpy);
  if (!log_) return;
  uint64_t dst_id = IdAt(dst), src_id = IdAt(src);
  absl::InlinedVector<uint64_t, 1> reads, writes;
  if (src_id != 0) reads.push_back(src_id);
  if (dst_id != 0) writes.push_back(dst_id);
  Log(JsonLine()
          .Str("type", "memcpy")
          .Str("api", api)
          .Str("kind", kind)
          .Uint("bytes", bytes)
          .Str("dst", Hex(dst))
          .Str("src", Hex(src))
          .Uints("reads", reads)
          .Uints("writes", writes)
          .Str("stream", StreamText(stream))
          .Bool("async", async)
          .Finish());
}

void Tracker::OnMemset(const char* api, uint64_t dst, uint64_t bytes,
                       StreamRef stream, bool async) {
  Count(OpType::kMemset);
  if (!log_) return;
  absl::InlinedVector<uint64_t, 1> writes;
  if (uint64_t id = IdAt(dst)) writes.push_back(id);
  Log(JsonLine()
          .Str("type", "memset")
          .Str("api", api)
          .Uint("bytes", bytes)
          .Str("dst", Hex(dst))
          .Uints("writes", writes)
          .Str("stream", StreamText(stream))
          .Bool("async", async)
          .Finish());
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

void Tracker::OnGraphLaunch(const char* api, CUgraphExec graph,
                            StreamRef stream) {
  Count(OpType::kGraphLaunch);
  if (memory_) memory_->MarkAllWritten(Handle(stream));  // kernels not inferred yet
  if (!log_) return;
  Log(JsonLine()
          .Str("type", "graph_launch")
          .Str("api", api)
          .Str("graph", Hex(reinterpret_cast<uintptr_t>(graph)))
          .Str("stream", StreamText(stream))
          .Finish());
}

void Tracker::Shutdown() {
  std::call_once(shutdown_once_, [this] {
    if (memory_ && config_.stats) {
      std::string text = memory_->StatsText();
      std::fwrite(text.data(), 1, text.size(), stderr);
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
  });
}

}  // namespace stensor
