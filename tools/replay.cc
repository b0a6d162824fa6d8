#include "tools/replay.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/swap/slab_pool.h"
#include "policy/apply_plan.h"
#include "policy/eviction_order.h"
#include "policy/iteration_planner.h"
#include "policy/make_room.h"
#include "policy/reach.h"
#include "tools/room_clock.h"

namespace stensor {
namespace {

// The manager's per-buffer state: what its decisions read (EvictionState,
// the library's own), and what it knows of the buffer besides.
struct SimBuffer : EvictionState {
  const WorkloadBuffer* info = nullptr;
  // A small allocation made a buffer of one granule in host memory (no
  // room at its allocation): what `info` points to instead of the workload's.
  std::unique_ptr<WorkloadBuffer> own_info;
  bool live = false;
  bool resident = false;
  bool has_host_copy = false;
  // A slab (WorkloadBuffer::slab): its live allocations' bytes, which its
  // copies carry (as MemoryManager::CopyParts).
  uint64_t live_bytes = 0;
  // When the last operation that used it ends on the compute stream, and
  // when its latest copy out ends: what its memory and its host copy wait
  // for (the host runs ahead of the device).
  double last_end = 0;
  double out_done = 0;
};

// The bytes a swap of `b` copies.
uint64_t CopyBytes(const SimBuffer& b) { return b.info->slab ? b.live_bytes : b.info->bytes; }

// What a small allocation takes of its slab (SlabPool's alignment).
uint64_t SlabSpan(uint64_t bytes) {
  return (bytes + SlabPool::kAlign - 1) / SlabPool::kAlign * SlabPool::kAlign;
}

double D2hGbps(const ReplayOptions& options) {
  return options.d2h_bandwidth_gbps > 0 ? options.d2h_bandwidth_gbps : options.bandwidth_gbps;
}

class Simulator {
 public:
  Simulator(const Workload& workload, const ReplayOptions& options)
      : workload_(workload), options_(options), order_(options.policy, options.version_rules) {
    result_.cap = options.cap;
    // bytes / (GB/s) in microseconds.
    us_per_byte_ = 1.0 / (options.bandwidth_gbps * 1e3);
    d2h_us_per_byte_ = 1.0 / (D2hGbps(options) * 1e3);
  }

  absl::StatusOr<ReplayResult> Run() {
    if (options_.oracle) ReadFuture();
    // The library's own planner: detection, next uses, the profile, fetches.
    IterationPlanner::Options planning;
    planning.bandwidth = Bandwidth{options_.bandwidth_gbps * 1e9, D2hGbps(options_) * 1e9};
    planning.prefetch = options_.prefetch;
    absl::StatusOr<std::unique_ptr<IterationPlanner>> planner = IterationPlanner::Create(planning);
    if (!planner.ok()) return planner.status();
    planner_ = std::move(*planner);
    const std::vector<double> computes = ComputeTimes(workload_, options_.kernel_us);
    for (op_ = 0; op_ < workload_.ops.size(); ++op_) {
      const WorkloadOp& op = workload_.ops[op_];
      // A synchronize: the host waited for the work issued so far.
      if (op.host_waits_before) host_ = std::max(host_, now_);
      ready_ = now_;
      noted_ = false;
      const double compute = computes[op_];
      compute_us_ = compute;
      absl::Status s = absl::OkStatus();
      switch (op.kind) {
        case WorkloadOp::Kind::kAlloc:
          s = Alloc(op);
          break;
        case WorkloadOp::Kind::kFree:
          Free(op);
          break;
        case WorkloadOp::Kind::kHostRead:
          s = HostRead(op);
          break;
        case WorkloadOp::Kind::kAccess:
          s = Access(op);
          break;
        case WorkloadOp::Kind::kUnknown:
          s = Access(op);
          if (s.ok()) MarkAllWritten();
          break;
      }
      if (!s.ok()) return s;
      // The operation starts once what it waits for is there, and once the
      // host issued it.
      const double start = std::max({now_, ready_, host_});
      result_.stall_us += start - now_;
      result_.compute_us += compute;
      now_ = start + compute;
      if (served_bytes_ > 0) {
        // What it reads in host memory crosses the link while it runs, from
        // its start or once the swap-ins queued there are done; it ends
        // with the later of its compute and the link (as the fake driver
        // charges it, as a GPU streams zero-copy reads).
        const double link_start = std::max(start, h2d_free_);
        h2d_free_ = link_start + served_bytes_ * us_per_byte_;
        result_.serve_us += std::max(0.0, h2d_free_ - now_);
        now_ = std::max(now_, h2d_free_);
        served_bytes_ = 0;
      }
      for (uint64_t id : op.ids) {
        if (auto it = state_.find(id); it != state_.end()) it->second.last_end = now_;
      }
      if (options_.prefetch && noted_) Plan(op);
      // A copy to or from host memory that returns once done (host reads
      // among them).
      if (op.host_waits_after) host_ = std::max(host_, now_);
    }
    result_.drained_us = std::max({now_, h2d_free_, d2h_free_});
    const IterationPlanner::Stats planned = planner_->stats();
    result_.planned_evictions = planned.planner.planned_evictions + planned.planner.fetch_evictions;
    result_.fetches_wasted = planned.planner.fetches_wasted;
    result_.iteration_period = planned.main_period;
    return result_;
  }

 private:
  SimBuffer& State(uint64_t id) {
    SimBuffer& b = state_[id];
    if (b.info == nullptr) SetInfo(b, &workload_.buffers.at(id));
    return b;
  }
  static void SetInfo(SimBuffer& b, const WorkloadBuffer* info) {
    b.info = info;
    b.id = info->id;
    b.reserved = info->charge;
  }

  absl::Status OutOfMemory(uint64_t need) const {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory at log line ", workload_.ops[op_].line, ": ", need,
                     " bytes more do not fit under the cap of ", options_.cap, " bytes (", used_,
                     " in use, nothing left to evict)"));
  }

  bool Droppable(const SimBuffer& b) const { return order_.Droppable(b); }

  void Unindex(SimBuffer& b) { order_.Remove(b); }

  // After any change to what the order reads, as MemoryManager::Reindex.
  void Reindex(SimBuffer& b) {
    if (!b.resident) b.prefetched = false;
    order_.Update(b, b.live && b.info->swappable && b.resident);
  }

  // What a look in MakeRoom may take: fetched, unused buffers only when
  // nothing else can go.
  static EvictionOrder::Filter Look(bool spend_prefetched) {
    EvictionOrder::Filter filter;
    filter.spend_prefetched = spend_prefetched;
    return filter;
  }

  // SwapOut of the manager, with its counters.
  void SwapOut(SimBuffer& b, bool copy) {
    if (!copy && !Droppable(b)) copy = true;  // never drop what is dirty
    const bool never_written = !copy && !b.clean();
    if (copy || (never_written && options_.host_vmm)) b.has_host_copy = true;
    const uint64_t bytes = copy ? CopyBytes(b) : b.info->bytes;
    if (copy) {
      b.host_version = b.gpu_version;
      ++result_.swap_outs;
      result_.bytes_out += bytes;
      // Queued on the device-to-host engine, behind the buffer's last use;
      // its memory is free once done.
      const double start = std::max({d2h_free_, host_, b.last_end});
      d2h_free_ = start + bytes * d2h_us_per_byte_;
      b.out_done = d2h_free_;
      room_.Freed(d2h_free_, static_cast<int64_t>(b.info->charge));
    } else {
      InUseUntil(b);  // no copy: its memory is free once its last use is done
      if (never_written) {
        ++result_.never_written_drops;
        result_.bytes_never_written += bytes;
      } else {
        ++result_.clean_drops;
        result_.bytes_dropped += bytes;
      }
    }
    b.resident = false;
    b.location = Location::kCpuOnly;
    used_ -= b.info->charge;
    swapped_out_ = true;
    TellPlanner(b);
    fetched_.erase(b.info->id);  // evicted before its use
    Reindex(b);                  // no longer prefetched
  }

  // ReplayOptions::oracle: per operation, the next use of each of its
  // buffers (the index of the operation that uses it next; kNoNextUse when
  // none does before it is freed or the workload ends).
  void ReadFuture() {
    future_.resize(workload_.ops.size());
    absl::flat_hash_map<uint64_t, uint64_t> next;
    for (size_t i = workload_.ops.size(); i-- > 0;) {
      const WorkloadOp& op = workload_.ops[i];
      if (op.kind == WorkloadOp::Kind::kFree) {
        next.erase(op.buffer);
        continue;
      }
      for (uint64_t id : op.ids) {
        auto it = next.find(id);
        future_[i].push_back(it == next.end() ? EvictionCandidate::kNoNextUse : it->second);
        next[id] = i;
      }
    }
  }

  // S403: the least recently used droppable buffer goes without a copy.
  bool DropOneClean(bool spend_prefetched) {
    auto* pick = static_cast<SimBuffer*>(order_.DropVictim(Look(spend_prefetched)));
    if (pick == nullptr) return false;
    SwapOut(*pick, /*copy=*/false);
    return true;
  }

  // S405: the first in the policy's order goes (the caller looks again
  // after), or a smaller one covering the shortfall, copied as the policy
  // says, as MemoryManager::EvictByPolicy does.
  bool EvictByPolicy(bool spend_prefetched, uint64_t shortfall) {
    EvictionOrder::Filter look = Look(spend_prefetched);
    // As the library, where the planner is made once wanted.
    look.shortfall = options_.oracle || awake_ ? shortfall : 0;
    look.now = options_.oracle ? op_ : planner_->now();  // the time next uses are in
    auto* pick = static_cast<SimBuffer*>(order_.Victim(look));
    if (pick == nullptr) return false;
    SwapOut(*pick, order_.Copies(*pick));
    if (!options_.oracle && awake_) order_.NoteForcedOut(*pick, planner_->now());
    return true;
  }

  // MakeRoom's steps here: every free completes at once (no garbage, no
  // pool, no waits), so only evictions make room.
  class Room : public RoomSteps {
   public:
    Room(Simulator& sim, uint64_t need) : sim_(sim), need_(need) {}
    bool Fits() override { return sim_.used_ <= sim_.options_.cap - need_; }
    Outcome Reclaim() override {
      return sim_.ReleaseEmptySlab() ? Outcome::kProgress : Outcome::kNothing;
    }
    bool DropOneClean(bool spend_prefetched) override {
      return sim_.DropOneClean(spend_prefetched);
    }
    bool EvictByPolicy(bool spend_prefetched) override {
      return sim_.EvictByPolicy(spend_prefetched, sim_.used_ - (sim_.options_.cap - need_));
    }

   private:
    Simulator& sim_;
    const uint64_t need_;
  };

  // S401-S405, in the library's order (MakeRoomLoop).
  absl::Status MakeRoom(uint64_t need) {
    if (need > options_.cap) return OutOfMemory(need);
    Room room(*this, need);
    if (MakeRoomLoop(room, options_.version_rules) != RoomResult::kFits) return OutOfMemory(need);
    return absl::OkStatus();
  }

  // When the room just charged is free of copies out and of the work
  // still using it (RoomClock), asked at the host's time.
  double RoomReady() {
    const uint64_t left = used_ < options_.cap ? options_.cap - used_ : 0;
    return room_.ReadyFor(static_cast<int64_t>(left), host_);
  }

  // `b` leaves the charge now, its memory once its last use ended.
  void InUseUntil(const SimBuffer& b) {
    if (b.last_end > host_) room_.Freed(b.last_end, static_cast<int64_t>(b.info->charge));
  }

  void Charge(uint64_t bytes) {
    used_ += bytes;
    result_.peak_resident = std::max(result_.peak_resident, used_);
  }

  // Serving from host memory: where the device maps host memory (host_vmm),
  // what does not fit is not refused (MemoryManager::Servable holds for
  // every swapped-out buffer there: its host copy is mapped at its address).
  bool Servable(const SimBuffer& b) const {
    return options_.host_vmm && b.info->swappable && !b.resident && b.has_host_copy;
  }

  // MemoryManager::Serve: the operation reaches `b` in host memory (its
  // host copy mapped at its address once a copy out in flight is done:
  // the host waits for it, as for a swap-in).
  void Serve(SimBuffer& b) {
    host_ = std::max(host_, b.out_done);
    ++result_.served_from_host;
    result_.bytes_served += b.info->bytes;
    served_bytes_ += b.info->bytes;
  }

  // MemoryManager::AllocateOnHost: no room for a swappable buffer, so it is
  // born swapped out, its (zeroed) host copy at its address.
  void AllocateOnHost(SimBuffer& b) {
    b.resident = false;
    b.location = Location::kCpuOnly;
    b.has_host_copy = true;
    b.host_version = b.gpu_version;
    ++result_.born_on_host;
    result_.bytes_born_on_host += b.info->bytes;
    swapped_out_ = true;
  }

  // The slab kept empty for the next small allocation, released when room
  // is needed (MemoryManager's Reclaim step, ReleaseEmptySlabs): its memory
  // goes with no copy, and a small allocation placed there later finds a
  // fresh slab, never written and new to the planner (the library frees the
  // slab and makes a new one).
  bool ReleaseEmptySlab() {
    for (uint64_t id : empty_slabs_) {
      SimBuffer& slab = State(id);
      if (!slab.resident) continue;
      used_ -= slab.info->charge;
      InUseUntil(slab);
      slab.resident = false;
      slab.location = Location::kCpuOnly;
      slab.written = false;
      slab.has_host_copy = false;
      slab.host_version = slab.gpu_version = ++version_;
      planner_->OnFreed(id);  // the library frees it: a new buffer when made again
      fetched_.erase(id);
      Reindex(slab);
      return true;
    }
    return false;
  }

  absl::Status Alloc(const WorkloadOp& op) {
    SimBuffer& b = State(op.buffer);
    if (b.info->in_slab != 0) {
      State(b.info->in_slab).live_bytes += SlabSpan(b.info->bytes);
      empty_slabs_.erase(b.info->in_slab);
    }
    b.live = true;
    b.serial = ++serial_;
    b.gpu_version = ++version_;
    b.last_use = ++clock_;
    if (absl::Status s = MakeRoom(b.info->charge); !s.ok()) {
      if (!options_.host_vmm || !(b.info->swappable || b.info->small)) return s;
      if (!b.info->swappable) {
        // MemoryManager::Allocate: a small one finding no room becomes a
        // swappable buffer of one granule, born on the host.
        b.own_info = std::make_unique<WorkloadBuffer>(*b.info);
        b.own_info->charge = workload_.granularity;
        b.own_info->swappable = true;
        SetInfo(b, b.own_info.get());
      }
      AllocateOnHost(b);
      if (b.info->group != 0) TellPlanner(b);  // as the manager's Reindex at registration
      Registered(b);
      return absl::OkStatus();
    }
    Charge(b.info->charge);
    b.resident = true;
    Registered(b);
    ready_ = std::max(ready_, RoomReady());  // its memory may be what is being copied out
    return absl::OkStatus();
  }

  // As MemoryManager::AllocateLocked: an allocation's pieces enter the
  // eviction order together, once the last exists, so that room made for
  // one piece never takes another of the same allocation.
  void Registered(SimBuffer& b) {
    const uint64_t group = b.info->group;
    if (group == 0) {
      Reindex(b);
      return;
    }
    const std::vector<uint64_t>& pieces = workload_.groups.at(group);
    if (pieces.back() != b.info->id) return;
    for (uint64_t id : pieces) Reindex(State(id));
  }

  void Free(const WorkloadOp& op) {
    SimBuffer& b = State(op.buffer);
    if (b.info->in_slab != 0) {
      SimBuffer& slab = State(b.info->in_slab);
      slab.live_bytes -= SlabSpan(b.info->bytes);
      if (slab.live_bytes == 0 && slab.live) empty_slabs_.insert(b.info->in_slab);
    }
    if (b.info->slab) empty_slabs_.erase(op.buffer);
    if (b.resident) {
      used_ -= b.info->charge;
      InUseUntil(b);
    }
    Unindex(b);
    const uint64_t group = b.info->group;
    state_.erase(op.buffer);
    fetched_.erase(op.buffer);
    if (group == 0) {
      planner_->OnFreed(op.buffer);
    } else if (workload_.groups.at(group).front() == op.buffer) {
      planner_->OnFreed(group);  // once, at its first piece's
      group_told_.erase(group);
    }
  }

  // As MemoryManager::Reindex tells the planner of a residency change: a
  // piece's allocation is resident while every piece of it is.
  void TellPlanner(const SimBuffer& b) {
    const uint64_t group = b.info->group;
    if (group == 0) {
      if (b.resident) {
        planner_->OnResident(b.info->id);
      } else {
        planner_->OnEvicted(b.info->id);
      }
      return;
    }
    bool resident = true;
    for (uint64_t id : workload_.groups.at(group)) {
      auto it = state_.find(id);
      if (it != state_.end() && it->second.live && !it->second.resident) resident = false;
    }
    auto [told, first] = group_told_.try_emplace(group, true);
    if (told->second == resident) return;
    told->second = resident;
    if (resident) {
      planner_->OnResident(group);
    } else {
      planner_->OnEvicted(group);
    }
  }

  // What the planner's `id` names: an allocation's live pieces, or the
  // buffer itself.
  std::vector<SimBuffer*> PlannedAs(uint64_t id) {
    std::vector<SimBuffer*> out;
    auto g = workload_.groups.find(id);
    if (g == workload_.groups.end()) {
      auto it = state_.find(id);
      if (it != state_.end()) out.push_back(&it->second);
      return out;
    }
    for (uint64_t piece : g->second) {
      auto it = state_.find(piece);
      if (it != state_.end()) out.push_back(&it->second);
    }
    return out;
  }

  // SwapIn of the manager: room first, then the copy unless nothing needs one.
  absl::Status SwapIn(SimBuffer& b, bool copy, bool prefetch) {
    if (b.out_done > host_) {
      // Its copy out is still in flight (its memory handed on): the library
      // maps memory at its address only once that copy is done, a prefetch
      // not at all ("not now"), an operation's swap-in after a host wait.
      if (prefetch) return absl::UnavailableError("copy out in flight");
      host_ = b.out_done;
    }
    if (absl::Status s = MakeRoom(b.info->charge); !s.ok()) return s;
    Charge(b.info->charge);
    b.resident = true;
    const bool never_written = (options_.version_rules && !b.written) || !b.has_host_copy;
    const bool copying = copy && !never_written;
    const double room = RoomReady();
    double done = room;
    if (copying) {
      ++result_.swap_ins;
      if (!prefetch) ++result_.on_demand_swap_ins;
      const uint64_t bytes = CopyBytes(b);
      result_.bytes_in += bytes;
      const double start = std::max({h2d_free_, host_, room});
      h2d_free_ = start + bytes * us_per_byte_;
      done = h2d_free_;
    } else if (copy) {
      ++result_.swap_ins_never_written;
    } else {
      ++result_.swap_ins_without_copy;
    }
    if (prefetch) {
      ++result_.prefetches;
      fetched_[b.info->id] = done;  // its user waits for this copy
      b.prefetched = true;
    } else {
      ready_ = std::max(ready_, done);
    }
    b.location = Location::kCpuGpu;
    TellPlanner(b);
    Reindex(b);
    return absl::OkStatus();
  }

  // The operation, to the planner (as MemoryManager::PredictLocked does):
  // its buffers' predicted next uses after it (belady), kept in
  // next_after_ for the swap-in choices of a launch's Prepare, which sees
  // them first; buffers the planner repredicted follow at once.
  void Predict(const WorkloadOp& op) {
    predicted_ = true;
    next_after_.clear();
    if (op.key == 0) return;
    // Not before the planner is wanted (IterationPlanner::Wanted), as in
    // MemoryManager::Pressed.
    WakeIfWanted();
    noted_ = awake_;
    if (!noted_) return;
    // As MemoryManager::PredictLocked: an allocation's pieces are one
    // touch, under its id, and each piece takes its next use.
    const WriteSet writes(op);
    next_after_.resize(op.ids.size());
    noted_time_ = planner_->PredictUses(
        op.key, op.ids.size(),
        [&](size_t i) {
          const WorkloadBuffer& info = *State(op.ids[i]).info;
          const uint64_t bytes =
              info.group != 0 ? info.charge * workload_.groups.at(info.group).size() : info.charge;
          return IterationPlanner::Use{info.group != 0 ? info.group : op.ids[i],
                                       bytes,
                                       writes.Contains(op.ids[i]),
                                       /*piece=*/info.group != 0,
                                       /*pinned=*/!info.swappable,
                                       /*position=*/static_cast<uint32_t>(i)};
        },
        [&](size_t i, uint64_t next) {
          next_after_[i] = options_.oracle ? future_[op_][i] : next;
          SimBuffer& b = State(op.ids[i]);
          b.next_use = next_after_[i];
          Reindex(b);
        },
        &scratch_);
    noted_profiling_ = planner_->profiling();
    for (const auto& [id, next] : scratch_.repredicted) {
      if (options_.oracle) break;
      for (SimBuffer* b : PlannedAs(id)) {
        b->next_use = next;
        Reindex(*b);
      }
    }
  }

  // Whether the cap presses yet (IterationPlanner::Wanted), for good once
  // it does; the oracle's next uses come through the planner from the start.
  void WakeIfWanted() {
    if (!awake_) {
      awake_ = options_.oracle || IterationPlanner::Wanted(used_, options_.cap, swapped_out_);
    }
  }

  // Once prepared (as MemoryManager::ApplyNotedLocked): its compute time
  // while its iteration is profiled.
  void NoteUses(const WorkloadOp& op) {
    if (!predicted_) Predict(op);
    predicted_ = false;
    if (op.key == 0 || !noted_) return;
    planner_->Commit();  // after the swap-ins it made, as the manager does
    if (noted_profiling_) planner_->OnComputeTime(noted_time_, compute_us_ / 1e6);
  }

  // After the operation: the planner's evictions and fetches, their copies
  // queued behind it. The library plans in the operation's Prepare, its
  // buffers pinned: an eviction of one of them does not go (PlanCarrier).
  void Plan(const WorkloadOp& op) {
    const uint64_t free_bytes = used_ < options_.cap ? options_.cap - used_ : 0;
    // The planner models the link's queue itself, as in the library (not
    // this replay's copy engines), so both make the same choices.
    PlanCarrier carrier(*this);
    // As the library: what a use would serve is not fetched.
    const ForcedOutLog* forced = order_.policy().RanksByNextUse() ? &order_.forced_out() : nullptr;
    for (uint64_t id : op.ids) ++State(id).pins;
    ApplyPlan(planner_->Plan(free_bytes, forced), carrier);
    for (uint64_t id : op.ids) --State(id).pins;
  }

  // ApplyPlan's steps here (MemoryManager::Plan in the library).
  class PlanCarrier : public PlanSteps {
   public:
    explicit PlanCarrier(Simulator& sim) : sim_(sim) {}
    std::vector<EvictionState*> Named(uint64_t id, bool* pieces) override {
      // A buffer, or an allocation's pieces (as the manager's PlannedAs).
      std::vector<SimBuffer*> planned = sim_.PlannedAs(id);
      if (planned.empty() || !planned.front()->live || !planned.front()->info->swappable) {
        return {};
      }
      *pieces = sim_.workload_.groups.count(id) != 0;
      return std::vector<EvictionState*>(planned.begin(), planned.end());
    }
    bool Resident(const EvictionState& b) override { return Of(b).resident; }
    bool Fits(uint64_t missing) override {
      return sim_.used_ <= sim_.options_.cap && missing <= sim_.options_.cap - sim_.used_;
    }
    // As MemoryManager::EvictAsyncLocked: copied as the policy says; not
    // while an operation holds it.
    void Evict(EvictionState& b) override {
      if (b.pins == 0) sim_.SwapOut(Of(b), sim_.order_.Copies(b));
    }
    // It fits: SwapIn's MakeRoom evicts nothing.
    bool Fetch(EvictionState& b) override {
      return sim_.SwapIn(Of(b), /*copy=*/true, /*prefetch=*/true).ok();
    }
    void Cancel(uint64_t id) override { sim_.planner_->CancelFetch(id); }
    // Off (--planned-evictions off): fetches only go into free memory.
    bool CarriesOutEvictions() override { return sim_.options_.planned_evictions; }

   private:
    static SimBuffer& Of(EvictionState& b) { return static_cast<SimBuffer&>(b); }
    static const SimBuffer& Of(const EvictionState& b) { return static_cast<const SimBuffer&>(b); }
    Simulator& sim_;
  };

  // Prepare + Finish of the manager for one operation.
  absl::Status Access(const WorkloadOp& op) {
    // A launch's, copy's or memset's Prepare sees the planner's predictions
    // (MemoryManager::Prepare with its Operation); a graph's nodes are
    // noted after, and work of unknown accesses not at all.
    const bool noted_first = !op.graph && op.kind == WorkloadOp::Kind::kAccess;
    // The library asks whether the cap presses at every Prepare, before
    // anything is brought in: here too (sticky), then where it feeds the
    // planner.
    WakeIfWanted();
    if (noted_first) Predict(op);
    for (uint64_t id : op.ids) ++State(id).pins;
    for (size_t i = 0; i < op.ids.size(); ++i) {
      const uint64_t id = op.ids[i];
      SimBuffer& b = State(id);
      if (!b.info->swappable) continue;
      if (b.resident) {
        // Brought in early: the operation waits for that copy.
        if (auto f = fetched_.find(id); f != fetched_.end()) {
          ready_ = std::max(ready_, f->second);
          fetched_.erase(f);
          b.prefetched = false;
        }
        continue;
      }
      const bool whole =
          std::find(op.overwritten.begin(), op.overwritten.end(), id) != op.overwritten.end();
      // As MemoryManager::PrepareOnce: served by choice where its room would
      // displace one the policy predicts is needed no later, or where no
      // pointer of the launch likely reaches it.
      ReachFacts facts;
      facts.servable = Servable(b);
      facts.overwritten = whole;
      facts.predicted = noted_first && noted_;
      if (facts.predicted) facts.next_use = next_after_[i];
      facts.bytes = b.info->charge;
      facts.fits = used_ <= options_.cap && b.info->charge <= options_.cap - used_;
      facts.far = noted_first && std::binary_search(op.far.begin(), op.far.end(), id);
      if (!options_.oracle && planner_->has_profile()) {
        facts.now = planner_->now();
        facts.period = planner_->profile()->period();
      }
      if (const Reach reach = ChooseReach(facts, order_, {}); reach != Reach::kFetch) {
        Serve(b);
        ++result_.served_by_choice;
        if (reach == Reach::kServeFar) ++result_.served_far;
        continue;
      }
      if (absl::Status s = SwapIn(b, !whole, /*prefetch=*/false); !s.ok()) {
        // No room with the operation's other buffers (all it could evict
        // went): served from host rather than refused.
        if (!Servable(b)) return s;
        Serve(b);
      }
    }
    for (uint64_t id : op.ids) {
      SimBuffer& b = State(id);
      --b.pins;
      b.last_use = ++clock_;
    }
    NoteUses(op);
    for (uint64_t id : op.writes) {
      SimBuffer& b = State(id);
      b.gpu_version = ++version_;
      b.written = true;
      // Served from host: written there, the host copy is the newest.
      if (b.info->swappable && !b.resident) b.host_version = b.gpu_version;
    }
    for (uint64_t id : op.ids) Reindex(State(id));
    return absl::OkStatus();
  }

  absl::Status HostRead(const WorkloadOp& op) {
    // Served from host memory when every buffer (every piece) it reads is
    // there.
    const bool served = std::all_of(op.ids.begin(), op.ids.end(), [&](uint64_t id) {
      const SimBuffer& b = State(id);
      return !b.resident && b.has_host_copy;
    });
    if (served) {
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
      Reindex(b);
    }
  }

  const Workload& workload_;
  const ReplayOptions& options_;
  std::unique_ptr<IterationPlanner> planner_;
  double compute_us_ = 0;  // of the operation being replayed
  // Node-based: the order holds pointers to its buffers.
  absl::node_hash_map<uint64_t, SimBuffer> state_;
  absl::flat_hash_map<uint64_t, double> fetched_;  // prefetched: copy done at
  // Of allocations in pieces: resident as the planner was last told.
  absl::flat_hash_map<uint64_t, bool> group_told_;
  EvictionOrder order_;  // the library's own
  ReplayResult result_;
  size_t op_ = 0;
  std::vector<std::vector<uint64_t>> future_;  // ReplayOptions::oracle
  uint64_t used_ = 0;
  absl::btree_set<uint64_t> empty_slabs_;  // live slabs holding no allocation
  uint64_t clock_ = 0;
  uint64_t version_ = 0;
  uint64_t serial_ = 0;
  double us_per_byte_ = 0;  // host->device
  double d2h_us_per_byte_ = 0;
  uint64_t served_bytes_ = 0;  // of the operation being replayed
  // Predict's: the operation's buffers' next uses after it, its planner
  // time, whether it is profiled; set until NoteUses takes them.
  bool predicted_ = false;
  // Whether the planner is wanted yet, whether the operation was fed to it,
  // and whether anything was ever swapped out (IterationPlanner::Wanted).
  bool awake_ = false;
  bool noted_ = false;
  bool swapped_out_ = false;
  std::vector<uint64_t> next_after_;
  // Predict's touches and the planner's answers, kept between operations.
  IterationPlanner::Scratch scratch_;
  uint64_t noted_time_ = 0;
  bool noted_profiling_ = false;
  double now_ = 0;  // the compute stream
  // The host's time: it issues operations as fast as they come (the
  // library's decisions are made then), until it waits for the device.
  double host_ = 0;
  double ready_ = 0;                    // when the current operation's inputs are there
  RoomClock room_;                      // memory still being copied out
  double h2d_free_ = 0, d2h_free_ = 0;  // the copy engines
};

}  // namespace

absl::StatusOr<ReplayResult> Replay(const Workload& workload, const ReplayOptions& options) {
  if (options.policy == nullptr) return absl::InvalidArgumentError("replay needs a policy");
  if (!(options.bandwidth_gbps > 0) || !(options.d2h_bandwidth_gbps >= 0)) {
    return absl::InvalidArgumentError("bandwidth must be positive");
  }
  if (!(options.kernel_us >= 0)) return absl::InvalidArgumentError("kernel time must be >= 0");
  return Simulator(workload, options).Run();
}

}  // namespace stensor
