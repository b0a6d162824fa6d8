// SlabPool: where allocations too small to map on their own (below half a
// granule) are placed inside slabs, buffers of one granule each that the
// memory manager maps, swaps and serves like any other. Packed so, small
// tensors are swappable and cost their size rather than a granule; alone,
// each would be either never swappable (a driver allocation) or a granule.
//
// The pool only places: it keeps each slab's free space, its live blocks
// and the blocks freed whose space waits until the work queued before their
// free is done (a wait the caller names and observes). Which slab exists,
// its memory and its uses are the manager's; `stensor sim` packs the same
// way, every free done at once.
//
// Thread-safety: any thread. Its own lock, which may be taken while the
// manager's is held, never the other way round; it calls nothing outside.
#ifndef STENSOR_CORE_SWAP_SLAB_POOL_H_
#define STENSOR_CORE_SWAP_SLAB_POOL_H_

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "core/base/mutex.h"

namespace stensor {

class SlabPool {
 public:
  // Blocks start at multiples of this, as the driver's allocations do.
  static constexpr uint64_t kAlign = 512;

  struct Block {
    CUdeviceptr base = 0;
    uint64_t size = 0;  // as asked
    uint64_t id = 0;    // the registry's, 0 until named (or untracked)
    uint64_t slab = 0;  // its slab's key
    bool stream_ordered = false;
    // Take only: the wait of the freed space it was placed in whose last
    // part it took (0: none), which nothing waits on any more.
    uint64_t ended_wait = 0;
    uint64_t span() const { return (size + kAlign - 1) / kAlign * kAlign; }
  };

  // A stream, as the manager keys its uses (stream, thread tag).
  using Order = std::pair<CUstream, uint64_t>;

  // A new slab, all free: `size` bytes at `base` on `device`, known to the
  // manager by `slab`.
  void AddSlab(uint64_t slab, int device, CUdeviceptr base, uint64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // A place for `size` bytes on `device` (the tightest free range of its
  // slabs, lowest address first), or none. In stream order (`order`), space
  // freed in stream order on the same stream counts as free.
  std::optional<Block> Take(int device, uint64_t size, std::optional<Order> order = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The registry's id of the block at `base`.
  void Name(CUdeviceptr base, uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // The live block holding `addr`, if any.
  std::optional<Block> Containing(CUdeviceptr addr) const ABSL_LOCKS_EXCLUDED(mu_);
  // Frees the live block starting at `base` (none: nullopt). Its space is
  // placed again at once (`wait` 0), or once the caller's `wait` is done
  // (Reclaim); freed in stream order on `order`, at once for that stream's
  // allocations.
  std::optional<Block> Free(CUdeviceptr base, uint64_t wait = 0,
                            std::optional<Order> order = std::nullopt) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives back the space of `device`'s freed blocks whose wait `done` says
  // is over: in the order of their frees, stopping at the first not done,
  // or with `all` asking each one.
  void Reclaim(int device, bool all, absl::FunctionRef<bool(uint64_t wait)> done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Slabs of `device` with no live or freed-and-waiting block, beyond the
  // first `keep`: taken out of the pool, for the caller to free.
  std::vector<uint64_t> TakeEmpty(int device, size_t keep) ABSL_LOCKS_EXCLUDED(mu_);
  // The live blocks of `slab` as (offset, bytes) ranges, in address order,
  // touching ranges merged: what a copy of its contents must carry.
  std::vector<std::pair<uint64_t, uint64_t>> LiveRanges(uint64_t slab) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether any block is live or waiting anywhere.
  bool empty() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Slab {
    int device = 0;
    CUdeviceptr base = 0;
    uint64_t size = 0;
    std::map<uint64_t, uint64_t> free;  // offset -> bytes, never touching
    size_t live = 0;
    size_t pending = 0;
  };
  struct Pending {
    uint64_t slab = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint64_t wait = 0;
    std::optional<Order> order;
  };
  // (device, bytes, slab base, offset): the tightest range first.
  using SizeKey = std::tuple<int, uint64_t, CUdeviceptr, uint64_t>;

  void AddFree(Slab& slab, uint64_t offset, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseFree(Slab& slab, std::map<uint64_t, uint64_t>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  absl::flat_hash_map<uint64_t, Slab> slabs_ ABSL_GUARDED_BY(mu_);
  // Slab key by base, for by_size_'s order (stable across runs of one log).
  absl::flat_hash_map<CUdeviceptr, uint64_t> slab_at_ ABSL_GUARDED_BY(mu_);
  std::set<SizeKey> by_size_ ABSL_GUARDED_BY(mu_);
  std::map<CUdeviceptr, Block> live_ ABSL_GUARDED_BY(mu_);  // by base
  std::map<int, std::deque<Pending>> pending_ ABSL_GUARDED_BY(mu_);
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// STENSOR_SLABS=auto, for one device: whether its small allocations go to
// slabs. Outside a slab a small allocation costs its size under the cap but
// is never swapped; a slab is swappable but costs a granule, partly free.
// Slabs pay once the small allocations held outside them are a real share
// of the cap (a program with a few small buffers keeps them where they
// are); from then on, for good, every new one goes to a slab. The manager
// and `stensor sim` count the same allocations by the same rule.
class SlabOnset {
 public:
  // A device packs once the small allocations it holds outside slabs reach
  // this share of its cap.
  static constexpr uint64_t kShareOfCap = 8;

  // The charge a small allocation of `bytes` is counted at.
  static uint64_t Counted(uint64_t bytes) {
    return (bytes + SlabPool::kAlign - 1) / SlabPool::kAlign * SlabPool::kAlign;
  }
  bool packing() const { return packing_; }
  // A small allocation of `bytes` made outside a slab on a device capped at
  // `cap`, and freed.
  void Made(uint64_t bytes, uint64_t cap) {
    held_ += Counted(bytes);
    if (held_ >= cap / kShareOfCap) packing_ = true;
  }
  void Freed(uint64_t bytes) { held_ -= std::min(held_, Counted(bytes)); }
  uint64_t held() const { return held_; }

 private:
  uint64_t held_ = 0;
  bool packing_ = false;
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_SLAB_POOL_H_
