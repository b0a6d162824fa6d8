// Replay: runs a Workload under a device-memory cap with the decisions of the
// memory manager, made by the library's own code in policy/ (linked, not
// copied): the S401-S405 loop (MakeRoomLoop: the empty slab kept for the
// next small allocation released first, then under `version` clean buffers
// dropped least recently used first, then garbage, then evictions by the
// policy), the eviction orders over each buffer's S03 fields
// (EvictionOrder, O(log n) an eviction however many buffers are live), the
// planner and the application of its actions (ApplyPlan), the choice to
// serve or fetch (ChooseReach); the swap-in rules (no copy for an operation
// that overwrites the buffer whole, none for a buffer never written under
// `version`) and device-to-host reads served from the host copy. Every
// operation is taken to have completed before the next (the log's order),
// so nothing waits: the counts are those of the decisions alone.
//
// Serving from host memory (with host_vmm), as MemoryManager::PrepareOnce
// and Allocate do: a swapped-out buffer of an operation that finds no room
// (the eviction loop evicted all it could, the operation's own buffers
// pinned) is not refused but served from its host copy, mapped at its
// address; a swappable allocation that finds no room (or is larger than the
// cap) is born in host memory. Only buffers that cannot be swapped and do
// not fit are out of memory. In the time model a served buffer's bytes are
// read over the link by the operation, whole (the library does not know
// which pages a kernel touches), on the host-to-device engine from the
// operation's start (or once the engine is free), and the operation lasts
// the longer of its compute and that read, as the fake driver charges it
// (FAKECUDA_LINK).
//
// On top, a time model of the compute stream: each launch computes for
// `kernel_us` (or its record's `compute_us`). The host issues operations
// (and the decisions are made) ahead of the device, until it waits for it: a
// synchronize, a blocking copy to or from host memory, a swap-in or serve of
// a buffer whose copy out is still in flight (a prefetch of one is
// refused). Swaps use one copy engine per direction at `bandwidth`, queued
// behind each other, from when the host issues them (a swap-out from its
// buffer's last use's end); a buffer's memory is free when its copy out
// completes (dropped or freed: when its last use ends), and whatever takes
// room (an allocation, a swap-in) waits until the memory still held fits
// beside it (tools/room_clock.h); an operation starts once the host issued
// it and its swap-ins and allocations are done, and the difference is the
// stall.
//
// Next uses (for `belady`) are predicted as the library predicts them: the
// policy/ IterationDetector finds the iteration from the operations' keys,
// the NextUsePredictor is fed every use with its phase and argument slot.
// With prefetch, the S02 profile of the first detected iteration (compute
// times of the time model, the modelled bandwidth) drives the policy/
// PrefetchPlanner, asked after every operation; its fetches and planned
// evictions are swaps like the others (not of a buffer the operation holds:
// the library asks in its Prepare).
//
// Thread-safety: Replay is reentrant.
#ifndef STENSOR_TOOLS_REPLAY_H_
#define STENSOR_TOOLS_REPLAY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policy/eviction_policy.h"
#include "tools/workload.h"

namespace stensor {

struct ReplayOptions {
  uint64_t cap = 0;                        // bytes
  const EvictionPolicy* policy = nullptr;  // required
  // Version control (clean drops, never-written moves): every policy but lru.
  bool version_rules = true;
  // Host-located VMM (the default on the fake and current GPUs): swapped-out
  // buffers read their host copy, so unknown work counts as writing them.
  bool host_vmm = true;
  double bandwidth_gbps = 16;     // host->device, and device->host unless:
  double d2h_bandwidth_gbps = 0;  // device->host; 0: bandwidth_gbps
  double kernel_us = 100;
  bool prefetch = false;  // the policy/ prefetch planner
  // The policy sees each buffer's true next use, read from the workload's
  // future, instead of the predictor's: Belady's rule as no online policy
  // can run it, to tell a prediction's cost from the rule's.
  bool oracle = false;
  // Whether the planner's evictions are issued too (room for fetches,
  // write-backs after a last use), as the library does
  // (MemoryManager::NoteOperation); off: fetches only go into free memory.
  bool planned_evictions = true;
};

struct ReplayResult {
  uint64_t cap = 0;
  uint64_t peak_resident = 0;
  uint64_t swap_outs = 0, bytes_out = 0;  // device -> host copies
  uint64_t clean_drops = 0, bytes_dropped = 0;
  uint64_t never_written_drops = 0, bytes_never_written = 0;
  uint64_t swap_ins = 0, bytes_in = 0;  // host -> device copies
  uint64_t swap_ins_without_copy = 0;   // overwritten whole
  uint64_t swap_ins_never_written = 0;
  uint64_t on_demand_swap_ins = 0;  // copied in for the operation at hand
  uint64_t prefetches = 0;          // swap-ins issued by the planner
  uint64_t planned_evictions = 0;   // swap-outs the planner asked for
  uint64_t fetches_wasted = 0;      // prefetched, evicted before use
  uint64_t iteration_period = 0;    // operations per detected iteration (the
                                    // profile in use for the most of them)
  uint64_t reads_served_from_host = 0;
  // Served from host memory (host_vmm): one per buffer and operation that
  // reached it there (serve_host), with their bytes; buffers born in host
  // memory (alloc_host).
  uint64_t served_from_host = 0, bytes_served = 0;
  // Of them, served although room could have been made (belady with bypass:
  // EvictionPolicy::ServeRatherThanFetch).
  uint64_t served_by_choice = 0;
  // Of those, pieces a launch held but its pointers likely did not reach
  // (WorkloadOp::far).
  uint64_t served_far = 0;
  uint64_t born_on_host = 0, bytes_born_on_host = 0;
  // Time model, microseconds.
  double compute_us = 0;
  double stall_us = 0;
  double serve_us = 0;  // operations' reading of served bytes beyond their compute
  // When the last operation and every copy queued have finished: the
  // compute stream's end (compute, stall and serving) or a copy engine's,
  // if later (write-backs nothing waited for).
  double drained_us = 0;
  uint64_t bytes_moved() const { return bytes_out + bytes_in; }
};

// Errors: no policy, a cap that some operation cannot fit under (out of
// memory, naming the log line, as the library would return it): without
// host_vmm any, with it only buffers that cannot be swapped.
absl::StatusOr<ReplayResult> Replay(const Workload& workload, const ReplayOptions& options);

}  // namespace stensor

#endif  // STENSOR_TOOLS_REPLAY_H_
