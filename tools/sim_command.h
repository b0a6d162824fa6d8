// `stensor sim`: replays an access log under a cap with the library's
// policies (tools/replay.h) and prints what moved, with the offline optimum
// as a lower bound (tools/optimum.h); `--compare` prints every policy with
// prefetch off and on in one table. docs/sim.md describes the output.
//
// Thread-safety: RunSim is reentrant (it writes only to the given streams).
#ifndef STENSOR_TOOLS_SIM_COMMAND_H_
#define STENSOR_TOOLS_SIM_COMMAND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/base/config.h"
#include "policy/eviction_policy.h"
#include "tools/replay.h"
#include "tools/workload.h"

namespace stensor {

struct SimFlags {
  std::string log;
  std::string limit;                 // BYTES (with an optional K/M/G[iB] suffix) or N%
  std::string policy = "belady";     // as the library's STENSOR_POLICY default
  bool prefetch = true;              // as the library's STENSOR_PREFETCH default
  bool planned_evictions = true;     // issue the planner's evictions (as the library does)
  bool host_vmm = true;              // --host-vmm: serve from host memory what does not fit
  bool pieces = true;                // --pieces: large allocations in one-granule pieces
  SlabMode slabs = SlabMode::kAuto;  // --slabs: small allocations packed into slabs
  double bandwidth_gbps = 16;        // --bandwidth, --link's first
  double d2h_bandwidth_gbps = 16;    // --bandwidth, --link's second (or its first)
  double kernel_us = 100;
  bool compare = false;
  uint64_t granularity = kDefaultGranularity;
  int rounds = 8;
  // Time limit of the exact optimum; 0: the LP bound only; -1: 30 s with
  // --compare, else 0.
  int exact_seconds = -1;
};

// Parses the arguments after `sim`. Errors name the flag, the value and
// the accepted forms.
absl::StatusOr<SimFlags> ParseSimFlags(const std::vector<std::string>& args);

// The cap in bytes for `limit` ("33554432", "32MiB", "40%" of `working_set`).
absl::StatusOr<uint64_t> ParseLimit(absl::string_view limit, uint64_t working_set);

// The library's policy by name: lru, version or belady.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeSimPolicy(absl::string_view name);

// Runs the command; 0 on success, 1 on a failure (told on `err`), 2 on
// bad arguments.
int RunSim(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace stensor

#endif  // STENSOR_TOOLS_SIM_COMMAND_H_
