#include "tools/replay.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stensor {
namespace {

// The manager's per-buffer state that its decisions read (S03).
struct SimBuffer {
  const TraceBuffer* info = nullptr;
  bool live = false;
  bool resident = false;
  Location location = Location::kGpuOnly;
  uint64_t gpu_version = 0;
  uint64_t host_version = 0;
  uint64_t last_use = 0;
  bool written = false;
  bool has_host_copy = false;
  int pins = 0;
  bool clean() const { return location == Location::kCpuGpu && host_version == gpu_version; }
};

// Per buffer, the trace indices of the operations that touch it, for the
// next-use prediction `belady` reads.
class NextUses {
 public:
  explicit NextUses(const Trace& trace) {
    for (size_t i = 0; i < trace.ops.size(); ++i) {
      for (uint64_t id : trace.ops[i].ids) uses_[id].push_back(i);
    }
  }
  // Logical time (index + 1) of the first use of `id` after operation `now`.
  uint64_t After(uint64_t id, size_t now) const {
    auto it = uses_.find(id);
    if (it == uses_.end()) return EvictionCandidate::kNoNextUse;
    auto next = std::upper_bound(it->second.begin(), it->second.end(), now);
    return next == it->second.end() ? EvictionCandidate::kNoNextUse : *next + 1;
  }

 private:
  absl::flat_hash_map<uint64_t, std::vector<size_t>> uses_;
};

class Simulator {
 public:
  Simulator(const Trace& trace, const ReplayOptions& options)
      : trace_(trace), options_(options), next_uses_(trace) {
    result_.cap = options.cap;
    // bytes / (GB/s) in microseconds.
    us_per_byte_ = 1.0 / (options.bandwidth_gbps * 1e3);
  }

  absl::StatusOr<ReplayResult> Run() {
    for (op_ = 0; op_ < trace_.ops.size(); ++op_) {
      const TraceOp& op = trace_.ops[op_];
      ready_ = now_;
      room_ready_ = now_;
      if (options_.prefetcher != nullptr) {
        if (absl::Status s = Prefetch(); !s.ok()) return s;
      }
      absl::Status s = absl::OkStatus();
      switch (op.kind) {
        case TraceOp::Kind::kAlloc: s = Alloc(op); break;
        case TraceOp::Kind::kFree: Free(op); break;
        case TraceOp::Kind::kHostRead: s = HostRead(op); break;
        case TraceOp::Kind::kAccess: s = Access(op); break;
        case TraceOp::Kind::kUnknown:
          s = Access(op);
          if (s.ok()) MarkAllWritten();
          break;
      }
      if (!s.ok()) return s;
      // The operation starts once what it waits for is there.
      const double start = std::max(now_, ready_);
      result_.stall_us += start - now_;
      const double compute =
          op.launch ? op.compute_us.value_or(options_.kernel_us) : 0.0;
      result_.compute_us += compute;
      now_ = start + compute;
    }
    return result_;
  }

 private:
  SimBuffer& State(uint64_t id) {
    SimBuffer& b = state_[id];
    if (b.info == nullptr) b.info = &trace_.buffers.at(id);
    return b;
  }

  absl::Status OutOfMemory(uint64_t need) const {
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of memory at log line ", trace_.ops[op_].line, ": ", need,
        " bytes more do not fit under the cap of ", options_.cap, " bytes (", used_,
        " in use, nothing left to evict)"));
  }

  bool Droppable(const SimBuffer& b) const {
    return b.clean() || (options_.version_rules && !b.written);
  }
  bool Evictable(const SimBuffer& b) const {
    return b.live && b.info->swappable && b.resident && b.pins == 0;
  }

  // SwapOut of the manager, with its counters.
  void SwapOut(SimBuffer& b, bool copy) {
    if (!copy && !Droppable(b)) copy = true;  // never drop what is dirty
    const bool never_written = !copy && !b.clean();
    if (copy || (never_written && options_.host_vmm)) b.has_host_copy = true;
    const uint64_t bytes = b.info->bytes;
    if (copy) {
      b.host_version = b.gpu_version;
      ++result_.swap_outs;
      result_.bytes_out += bytes;
      // Queued on the device-to-host engine; its memory is free once done.
      const double start = std::max(d2h_free_, now_);
      d2h_free_ = start + bytes * us_per_byte_;
      room_ready_ = std::max(room_ready_, d2h_free_);
    } else if (never_written) {
      ++result_.never_written_drops;
      result_.bytes_never_written += bytes;
    } else {
      ++result_.clean_drops;
      result_.bytes_dropped += bytes;
    }
    b.resident = false;
    b.location = Location::kCpuOnly;
    used_ -= b.info->charge;
  }

  // S403: the least recently used droppable buffer goes without a copy.
  bool DropOneClean() {
    SimBuffer* pick = nullptr;
    for (auto& [id, b] : state_) {
      if (!Evictable(b) || !Droppable(b)) continue;
      if (pick == nullptr || b.last_use < pick->last_use) pick = &b;
    }
    if (pick == nullptr) return false;
    SwapOut(*pick, /*copy=*/false);
    return true;
  }

  // S405: the policy's first choice goes (the caller looks again after).
  bool EvictByPolicy(uint64_t needed) {
    std::vector<EvictionCandidate> candidates;
    for (auto& [id, b] : state_) {
      if (!Evictable(b)) continue;
      // What may go without a copy is shown as clean, as the manager does.
      const bool free = Droppable(b);
      EvictionCandidate c;
      c.id = id;
      c.bytes = b.info->charge;
      c.location = free ? Location::kCpuGpu : b.location;
      c.gpu_version = b.gpu_version;
      c.host_version = free ? b.gpu_version : b.host_version;
      c.last_use = b.last_use;
      c.next_use = next_uses_.After(id, op_);
      candidates.push_back(c);
    }
    if (candidates.empty()) return false;
    std::vector<Eviction> chosen =
        options_.policy->Choose(candidates, std::max<uint64_t>(needed, 1));
    if (chosen.empty()) return false;
    SimBuffer& b = state_.at(chosen.front().id);
    SwapOut(b, chosen.front().copy || !Droppable(b));
    return true;
  }

  // S401-S405 (no garbage: every free completes at once here).
  absl::Status MakeRoom(uint64_t need) {
    if (need > options_.cap) return OutOfMemory(need);
    for (;;) {
      if (used_ <= options_.cap - need) return absl::OkStatus();
      if (options_.version_rules && DropOneClean()) continue;
      if (EvictByPolicy(used_ - (options_.cap - need))) continue;
      return OutOfMemory(need);
    }
  }

  void Charge(uint64_t bytes) {
    used_ += bytes;
    result_.peak_resident = std::max(result_.peak_resident, used_);
  }

  absl::Status Alloc(const TraceOp& op) {
    SimBuffer& b = State(op.buffer);
    b.live = true;
    b.gpu_version = ++version_;
    b.last_use = ++clock_;
    if (absl::Status s = MakeRoom(b.info->charge); !s.ok()) return s;
    Charge(b.info->charge);
    b.resident = true;
    ready_ = std::max(ready_, room_ready_);  // its memory comes from the evictions
    return absl::OkStatus();
  }

  void Free(const TraceOp& op) {
    SimBuffer& b = State(op.buffer);
    if (b.resident) used_ -= b.info->charge;
    state_.erase(op.buffer);
  }

  // SwapIn of the manager: room first, then the copy unless nothing needs one.
  absl::Status SwapIn(SimBuffer& b, bool copy, bool prefetch) {
    if (absl::Status s = MakeRoom(b.info->charge); !s.ok()) return s;
    Charge(b.info->charge);
    b.resident = true;
    const bool never_written = (options_.version_rules && !b.written) || !b.has_host_copy;
    const bool copying = copy && !never_written;
    double done = room_ready_;
    if (copying) {
      ++result_.swap_ins;
      result_.bytes_in += b.info->bytes;
      const double start = std::max({h2d_free_, now_, room_ready_});
      h2d_free_ = start + b.info->bytes * us_per_byte_;
      done = h2d_free_;
    } else if (copy) {
      ++result_.swap_ins_never_written;
    } else {
      ++result_.swap_ins_without_copy;
    }
    if (prefetch) {
      ++result_.prefetches;
      fetched_[b.info->id] = done;  // its user waits for this copy
    } else {
      ready_ = std::max(ready_, done);
    }
    b.location = Location::kCpuGpu;
    return absl::OkStatus();
  }

  absl::Status Prefetch() {
    std::vector<uint64_t> out;
    for (auto& [id, b] : state_) {
      if (b.live && b.info->swappable && !b.resident) out.push_back(id);
    }
    std::sort(out.begin(), out.end());
    for (uint64_t id : options_.prefetcher->Before(op_, out)) {
      auto it = state_.find(id);
      if (it == state_.end() || it->second.resident || !it->second.info->swappable) continue;
      if (absl::Status s = SwapIn(it->second, /*copy=*/true, /*prefetch=*/true); !s.ok()) {
        return s;
      }
    }
    room_ready_ = now_;  // the operation itself waits only for its own room
    return absl::OkStatus();
  }

  // Prepare + Finish of the manager for one operation.
  absl::Status Access(const TraceOp& op) {
    for (uint64_t id : op.ids) ++State(id).pins;
    for (uint64_t id : op.ids) {
      SimBuffer& b = State(id);
      if (!b.info->swappable) continue;
      if (b.resident) {
        // Brought in early: the operation waits for that copy.
        if (auto f = fetched_.find(id); f != fetched_.end()) {
          ready_ = std::max(ready_, f->second);
          fetched_.erase(f);
        }
        continue;
      }
      const bool whole =
          std::find(op.overwritten.begin(), op.overwritten.end(), id) != op.overwritten.end();
      if (absl::Status s = SwapIn(b, !whole, /*prefetch=*/false); !s.ok()) return s;
    }
    for (uint64_t id : op.ids) {
      SimBuffer& b = State(id);
      --b.pins;
      b.last_use = ++clock_;
    }
    for (uint64_t id : op.writes) {
      SimBuffer& b = State(id);
      b.gpu_version = ++version_;
      b.written = true;
    }
    return absl::OkStatus();
  }

  absl::Status HostRead(const TraceOp& op) {
    SimBuffer& b = State(op.buffer);
    if (!b.resident && b.has_host_copy) {
      ++result_.reads_served_from_host;
      return absl::OkStatus();
    }
    return Access(op);
  }

  // An operation of unknown accesses may have written anything.
  void MarkAllWritten() {
    for (auto& [id, b] : state_) {
      if (b.resident) b.gpu_version = ++version_;
      if (b.resident || (b.has_host_copy && options_.host_vmm)) b.written = true;
    }
  }

  const Trace& trace_;
  const ReplayOptions& options_;
  const NextUses next_uses_;
  absl::flat_hash_map<uint64_t, SimBuffer> state_;
  absl::flat_hash_map<uint64_t, double> fetched_;  // prefetched: copy done at
  ReplayResult result_;
  size_t op_ = 0;
  uint64_t used_ = 0;
  uint64_t clock_ = 0;
  uint64_t version_ = 0;
  double us_per_byte_ = 0;
  double now_ = 0;         // the compute stream
  double ready_ = 0;       // when the current operation's inputs are there
  double room_ready_ = 0;  // when the memory freed for it is free
  double h2d_free_ = 0, d2h_free_ = 0;  // the copy engines
};

}  // namespace

absl::StatusOr<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options) {
  if (options.policy == nullptr) return absl::InvalidArgumentError("replay needs a policy");
  if (!(options.bandwidth_gbps > 0)) {
    return absl::InvalidArgumentError("bandwidth must be positive");
  }
  if (!(options.kernel_us >= 0)) return absl::InvalidArgumentError("kernel time must be >= 0");
  return Simulator(trace, options).Run();
}

}  // namespace stensor
