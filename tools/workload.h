// Workload: an access log (docs/access-log.md) read into the operations the
// memory manager acts on, in log order, for replay (`stensor sim`) and the
// offline optimum. Each buffer is classified as the manager classifies it:
// swappable (cuMemAlloc of at least the VMM granularity, charged in whole
// granules) or plain (charged in 4 KiB pages, never swapped: smaller
// cuMemAlloc, cuMemAllocPitch, stream-ordered and the program's own VMM
// memory). The manager's own records (swap_out, drop_clean, ...) are kept
// apart as counts, for comparison.
//
// Thread-safety: plain data, built once by ReadWorkload.
#ifndef STENSOR_TOOLS_WORKLOAD_H_
#define STENSOR_TOOLS_WORKLOAD_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tools/charge.h"

namespace stensor {

struct WorkloadBuffer {
  uint64_t id = 0;
  uint64_t addr = 0;
  uint64_t bytes = 0;   // as the program asked
  uint64_t charge = 0;  // against the cap: granules, or pages when plain
  bool swappable = false;
  bool small = false;  // AllocationCharge::small (tools/charge.h)
  uint64_t group = 0;  // a piece's allocation (SplitIntoPieces); 0: none
  // PackIntoSlabs: a slab that holds small allocations (its copies carry
  // their bytes only), and a small allocation's slab (0: none).
  bool slab = false;
  uint64_t in_slab = 0;
};

struct WorkloadOp {
  enum class Kind {
    kAlloc,     // `buffer` allocated (charged)
    kFree,      // `buffer` released
    kAccess,    // a launch, copy or memset: `ids` made resident, `writes` written
    kUnknown,   // a launch of unknown accesses: `ids` made resident, then every
                // buffer counts as written (MarkAllWritten)
    kHostRead,  // a synchronous device-to-host copy from swappable `buffer`:
                // served from its host copy while swapped out, else an access
  };
  Kind kind = Kind::kAccess;
  uint64_t buffer = 0;
  // In the order the manager prepares them; duplicates removed.
  std::vector<uint64_t> ids;
  std::vector<uint64_t> writes;
  // Buffers the operation writes whole (a memset or linear copy of the
  // whole buffer): a swapped-out one comes back without a copy.
  std::vector<uint64_t> overwritten;
  // A linear copy's or memset's exact reach in the buffers it names, from
  // each buffer's start: of a buffer made of pieces (SplitIntoPieces), only
  // the pieces there are named, and those it covers whole are overwritten.
  struct Extent {
    uint64_t id = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  std::vector<Extent> extents;
  // A launch's pointer words as offsets into the buffers it names (the
  // log's `pointers`; a buffer it names only at its start, offset 0),
  // buffers also reached through a pointer table left out: where the
  // tensors it uses start.
  struct Pointer {
    uint64_t id = 0;
    uint64_t offset = 0;
  };
  std::vector<Pointer> pointers;
  // Of its pieces (SplitIntoPieces), those no pointer likely reaches
  // (MemoryManager::FarPieces), ascending: served from host when swapped
  // out, never fetched for it.
  std::vector<uint64_t> far;
  bool launch = false;  // a kernel (takes compute time)
  bool graph = false;   // of them, a graph launch (its nodes read)
  // The host waited for the device before it (a synchronize in the log
  // since the operation before), or waits for it to complete (a copy to or
  // from host memory that is not asynchronous): the points up to which the
  // program's host runs ahead of the device.
  bool host_waits_before = false;
  bool host_waits_after = false;
  // What the iteration detector sees of the operation: the kernel and its
  // launch shape (or the copy's or memset's kind and size), never buffer
  // ids, which change for per-step temporaries. 0 for allocations and frees.
  uint64_t key = 0;
  std::optional<double> compute_us;  // the record's own compute time, if any
  size_t line = 0;                   // in the log, for messages
};

// Which buffers an operation writes, asked id by id: a scan of `writes` when
// it is short, a set when it is long, so a launch writing thousands of
// buffers costs no more a question than one writing two.
class WriteSet {
 public:
  explicit WriteSet(const WorkloadOp& op);
  bool Contains(uint64_t id) const;

 private:
  static constexpr size_t kScanned = 16;
  const std::vector<uint64_t>& writes_;
  absl::flat_hash_set<uint64_t> set_;  // when writes_ is longer than kScanned
};

// What the library itself did, from its swap records (a log taken under a cap).
struct LoggedSwaps {
  uint64_t swap_outs = 0, bytes_out = 0;
  uint64_t clean_drops = 0, never_written_drops = 0;
  uint64_t swap_ins_copied = 0, bytes_in = 0;
  bool any() const { return swap_outs + clean_drops + never_written_drops + swap_ins_copied > 0; }
};

struct Workload {
  uint64_t granularity = kDefaultGranularity;
  absl::flat_hash_map<uint64_t, WorkloadBuffer> buffers;
  // Of an allocation split into pieces (SplitIntoPieces), its pieces in
  // address order, by the allocation's id.
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> groups;
  std::vector<WorkloadOp> ops;
  // Peak over the log of the charges of live allocations: what the
  // program needs uncapped; `N%` limits are of this.
  uint64_t working_set = 0;
  std::string logged_policy;  // STENSOR_POLICY in the header, if any
  std::string logged_limit;   // STENSOR_MEMORY_LIMIT in the header
  LoggedSwaps logged;
  size_t launches = 0;
  size_t unknown_launches = 0;
  // Of those, the ones that name none of their buffers (not inferred: a
  // kernel or graph nobody could read), whose buffers an optimum cannot count.
  size_t blind_launches = 0;
};

// The workload as the memory manager holds its buffers where the device maps
// host memory (MemoryManager::PieceGroup): each swappable allocation larger
// than a granule, and no larger than `cap`, made of pieces of one granule,
// each a buffer of its own, with ids from 2^61 + 2^62 up in allocation
// order (the manager's piece keys likewise); an operation
// naming the allocation names every piece, in address order, and a
// synchronous read of it is served from host memory only when no piece is
// resident. `*split` (if given) counts the allocations split.
Workload SplitIntoPieces(const Workload& workload, uint64_t cap, size_t* split = nullptr);

// The workload as the memory manager places small allocations with
// STENSOR_SLABS=on where the device maps host memory (core/swap/slab_pool.h,
// the library's own placement, every free done at once): each allocation
// below half a granule from cuMemAlloc or the default pool (WorkloadBuffer::
// small) is placed in a slab, a swappable buffer of one granule with an id
// from 2^62 + 2^60 up, made when none has room and freed when empty beyond
// the one kept; the allocation keeps its alloc and free (charged nothing,
// the slab's live bytes), and an operation naming it names its slab (once;
// an overwrite of it overwrites no slab). With `onset_cap`, as
// STENSOR_SLABS=auto does under that cap: none is placed until the small
// allocations held outside slabs reach the share SlabOnset names. `*packed`
// (if given) counts the allocations placed.
Workload PackIntoSlabs(const Workload& workload, std::optional<uint64_t> onset_cap = std::nullopt,
                       size_t* packed = nullptr);

// What each operation computes in `stensor sim`'s time model, microseconds:
// a launch its record's compute_us, else `kernel_us`; anything else none.
// The replay, the time bound and a timed schedule all take it from here.
std::vector<double> ComputeTimes(const Workload& workload, double kernel_us);

// Reads the log's text (one JSON object per line). Lines that do not parse
// are errors naming the line; record types it does not need are skipped.
absl::StatusOr<Workload> ParseWorkload(absl::string_view text,
                                       uint64_t granularity = kDefaultGranularity);
absl::StatusOr<Workload> ReadWorkload(const std::string& path,
                                      uint64_t granularity = kDefaultGranularity);

}  // namespace stensor

#endif  // STENSOR_TOOLS_WORKLOAD_H_
