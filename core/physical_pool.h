// PhysicalPool: one device's idle physical memory, kept (and charged against
// the cap by its owner) for the next buffer instead of released to the
// driver, in chunks of one size (the allocation granularity), so memory freed
// by a buffer of any size serves a buffer of any other: a buffer maps as many
// chunks as it reserves, at consecutive offsets.
//
// A chunk may still be mapped at the old address of a buffer whose swap-out
// copy is in flight ("shadowed", counted per handle, pooled or not): whoever
// takes one must order its work after that copy, and its old owner can no
// longer take it back. Shadowed chunks are handed out last and never released.
//
// Pure bookkeeping: no driver calls. Thread-safety: none; the owner
// (MemoryManager) calls it under its own mutex.
#ifndef STENSOR_CORE_PHYSICAL_POOL_H_
#define STENSOR_CORE_PHYSICAL_POOL_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/types/span.h"

namespace stensor {

class PhysicalPool {
 public:
  using Handle = CUmemGenericAllocationHandle;

  explicit PhysicalPool(uint64_t chunk_bytes = 0) : chunk_bytes_(chunk_bytes) {}

  uint64_t chunk_bytes() const { return chunk_bytes_; }
  size_t chunks() const { return chunks_.size(); }
  uint64_t bytes() const { return chunks_.size() * chunk_bytes_; }

  // Pools one chunk; PutAll pools every chunk of `*chunks` and empties it.
  void Put(Handle h) { chunks_.push_back(h); }
  void PutAll(std::vector<Handle>* chunks);

  // Appends up to `n` chunks to `*out` and returns how many: unshadowed ones
  // first, the most recently pooled first; then shadowed ones, the longest
  // pooled first (their swap-out copies come first on the swap stream, and
  // their owners, evicted longest ago, are the least likely to be needed back
  // before those copies are done). The shadowed ones taken are also appended
  // to `*shadowed` (when not null). Shadowed chunks for which `first` holds
  // (those whose old owners will never take them back) go before the other
  // shadowed ones; it is asked only once no unshadowed chunk is left.
  size_t Take(size_t n, std::vector<Handle>* out, std::vector<Handle>* shadowed = nullptr,
              absl::FunctionRef<bool(Handle)> first = [](Handle) { return false; });

  // Takes exactly `chunks` out of the pool if every one is there; false, and
  // nothing changed, when one is not (it was handed on).
  bool TakeBack(absl::Span<const Handle> chunks);

  // Takes one chunk no old address maps, for release; nullopt when none.
  std::optional<Handle> TakeIdle();

  // A handle mapped at one more (Shadow) or one fewer (Unshadow) old
  // address of a buffer whose swap-out copy is in flight.
  void Shadow(Handle h) { ++shadows_[h]; }
  void Unshadow(Handle h);
  bool shadowed(Handle h) const { return shadows_.contains(h); }

 private:
  uint64_t chunk_bytes_;
  std::vector<Handle> chunks_;  // a stack: the most recently pooled last
  absl::flat_hash_map<Handle, int> shadows_;
};

}  // namespace stensor

#endif  // STENSOR_CORE_PHYSICAL_POOL_H_
