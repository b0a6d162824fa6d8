// PhysicalPool: one device's idle physical memory, kept (and charged against
// the cap by its owner) for the next buffer instead of released to the
// driver. Memory comes in chunks of any whole number of granules: a buffer
// is mapped from as many chunks as add up to its size, at consecutive
// offsets (the driver maps a handle whole, never a part of it).
//
// Chunks are as large as the buffers that made them, because on a GPU
// mapping, setting access and unmapping cost per handle, not per byte
// (docs/gpu.md: a 64 MiB range of 32 granule handles costs 20 times what
// one 64 MiB handle does). A buffer takes a chunk of its own size when there
// is one, else chunks no larger than what it still needs, largest first; a
// chunk larger than the need serves nothing and is released by the owner
// when room is needed (Unfit), so chunks only ever get smaller by churn and
// sizes that recur (a training step's) are served whole.
//
// A chunk may still be mapped at the old address of a buffer whose swap-out
// copy is in flight ("shadowed", counted per handle, pooled or not): whoever
// takes one must order its work after that copy, and its old owner can no
// longer take it back. Shadowed chunks are handed out last and never released.
//
// Pure bookkeeping: no driver calls. Thread-safety: none; the owner
// (MemoryManager) calls it under its own mutex.
#ifndef STENSOR_CORE_SWAP_PHYSICAL_POOL_H_
#define STENSOR_CORE_SWAP_PHYSICAL_POOL_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/types/span.h"

namespace stensor {

// One cuMemCreate's memory: its handle and size (whole granules).
struct PhysicalChunk {
  CUmemGenericAllocationHandle handle = 0;
  uint64_t bytes = 0;
  bool operator==(const PhysicalChunk& o) const { return handle == o.handle && bytes == o.bytes; }
};

// The bytes of `chunks` together.
uint64_t ChunkBytes(absl::Span<const PhysicalChunk> chunks);

class PhysicalPool {
 public:
  using Handle = CUmemGenericAllocationHandle;
  using Chunk = PhysicalChunk;
  // Shadowed chunks for which it holds (those whose old owners will never
  // take them back) go before the other shadowed ones.
  using First = absl::FunctionRef<bool(Handle)>;

  size_t chunks() const { return chunks_.size(); }
  uint64_t bytes() const { return bytes_; }

  // Pools one chunk; PutAll pools every chunk of `*chunks` and empties it.
  void Put(Chunk c);
  void PutAll(std::vector<Chunk>* chunks);

  // Appends to `*out` chunks adding up to at most `need` bytes and returns
  // their bytes: an unshadowed chunk of exactly `need` when there is one
  // (the most recently pooled); else unshadowed chunks that fit, largest
  // first (fewest handles), the most recently pooled first among equals;
  // then shadowed ones that fit, the `first` ones first, each group the
  // longest pooled first (their swap-out copies come first on the swap
  // stream, and their owners, evicted longest ago, are the least likely to
  // be needed back before those copies are done); when all those fall
  // short of the need, one shadowed chunk of exactly `need` instead, in the
  // same order. The shadowed ones taken are also appended to `*shadowed`
  // (when not null).
  uint64_t Take(
      uint64_t need, std::vector<Chunk>* out, std::vector<Handle>* shadowed = nullptr,
      First first = [](Handle) { return false; });
  // The bytes Take(need, ..., first) would take, taking nothing.
  uint64_t Fits(
      uint64_t need, First first = [](Handle) { return false; }) const;

  // Takes exactly `chunks` out of the pool if every one is there; false, and
  // nothing changed, when one is not (it was handed on).
  bool TakeBack(absl::Span<const Chunk> chunks);

  // Takes one chunk no old address maps and of at most `at_most` bytes,
  // for release, the longest pooled first; nullopt when none. TakeUnfit
  // likewise takes one that Take(need, ..., first) would leave in the
  // pool: releasing it makes room without costing the need a chunk.
  std::optional<Chunk> TakeIdle(uint64_t at_most = UINT64_MAX);
  std::optional<Chunk> TakeUnfit(
      uint64_t need, First first = [](Handle) { return false; });

  // A handle mapped at one more (Shadow) or one fewer (Unshadow) old
  // address of a buffer whose swap-out copy is in flight.
  void Shadow(Handle h) { ++shadows_[h]; }
  void Unshadow(Handle h);
  bool shadowed(Handle h) const { return shadows_.contains(h); }

 private:
  // The indices into chunks_ that Take would take, in its order.
  std::vector<size_t> Select(uint64_t need, First first) const;
  Chunk Remove(size_t i);

  std::vector<Chunk> chunks_;  // the most recently pooled last
  uint64_t bytes_ = 0;
  absl::flat_hash_map<Handle, int> shadows_;
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_PHYSICAL_POOL_H_
