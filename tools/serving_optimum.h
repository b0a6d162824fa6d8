// ServingOptimum: the fewest bytes any policy can move (device->host,
// host->device, and over the link to operations reaching buffers through
// their host copies) to run a Workload under a cap where the device has
// host-located VMM, so that a swapped-out buffer may be served at its
// address instead of brought in (MemoryManager::Prepare). The KeepProblem
// built for serving (tools/keep_problem.h), solved as a 0-1 program by
// GLPK's branch and cut:
//
//   - a binary per use: resident, or served (its bytes over the link,
//     nothing at its allocation: born on the host);
//   - a keep per link between consecutive uses of a buffer, at most either
//     end's residency: binary where points lie between (it takes their
//     room), else continuous (it takes none, so it is whole at an optimum);
//   - a resident use not kept since its last one costs its swap-in;
//   - a written stretch costs its write-back once when the buffer leaves the
//     device (a resident use, its link not kept) after a resident write;
//   - at each point, the kept gaps' charges and the resident uses' charges
//     fit in the cap less the plain allocations.
//
// With every use resident this is ExactOptimum's program; serving can only
// lower it, and it has a schedule wherever the plain allocations fit (serve
// every use). The better of the Lagrangian bound (tools/serving_bound.h,
// a quarter of the time limit) and the root LP relaxation bounds every
// policy under these rules from below; the search starts from the cheapest
// of "serve everything", the Lagrangian prices' schedule made to fit and a
// whole-buffer schedule when one is given (and runs GLPK's feasibility
// pump), so a time limit still returns a schedule, marked not proven.
//
// Serving costs a use the buffer's bytes here: the library counts them so
// (SwapStats::bytes_served_from_host), while a kernel on a GPU pays only for
// what it touches.
//
// Thread-safety: reentrant (GLPK keeps its state per thread).
#ifndef STENSOR_TOOLS_SERVING_OPTIMUM_H_
#define STENSOR_TOOLS_SERVING_OPTIMUM_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/keep_problem.h"
#include "tools/workload.h"

namespace stensor {

struct ServingOptions {
  uint64_t cap = 0;  // unused when given the KeepProblem
  // For the root LP and the search together (the search gets a second at
  // least, so up to a second more in all).
  int time_limit_ms = 30000;
  // A whole-buffer schedule of the same workload and cap (a keep flag per
  // KeepProblem gap: ExactOptimum's or the LP bound's), to start from.
  const std::vector<bool>* whole_schedule = nullptr;
};

struct ServingOptimum {
  uint64_t bytes_out = 0, bytes_in = 0, bytes_served = 0;  // of the best schedule found
  uint64_t moved() const { return bytes_out + bytes_in + bytes_served; }
  // No schedule moves fewer than this (the LP relaxation, rounded up to a
  // byte); equal to moved() when proven.
  uint64_t lower_bound = 0;
  bool proven = false;  // else the time limit ended the search
  int64_t uses = 0, served_uses = 0, links = 0, kept_links = 0, rows = 0;
};

// FailedPrecondition when the plain allocations alone exceed the cap;
// Internal when the solver fails. `problem` must be built with `serving`.
absl::StatusOr<ServingOptimum> ComputeServingOptimum(const Workload& workload,
                                                     const ServingOptions& options);
absl::StatusOr<ServingOptimum> ComputeServingOptimum(const KeepProblem& problem,
                                                     const ServingOptions& options);

}  // namespace stensor

#endif  // STENSOR_TOOLS_SERVING_OPTIMUM_H_
