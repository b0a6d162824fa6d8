// A device memory allocator with the segment and split rules of PyTorch's
// CUDACachingAllocator (c10/cuda/CUDACachingAllocator.cpp), so that the
// torchlike example hands the driver the traffic PyTorch does:
//   - requests are rounded up to 512 bytes;
//   - requests of at most 1 MiB come from the small pool, whose segments are
//     2 MiB; larger ones from the large pool, whose segments are 20 MiB for
//     requests under 10 MiB, else the request rounded up to 2 MiB;
//   - the best-fitting free block of the same pool and stream is used and
//     split when the remainder is at least 512 bytes (small pool) or more
//     than 1 MiB (large pool); the remainder stays in the pool;
//   - a freed block is coalesced with free neighbours of its segment and
//     kept for later requests on the same stream; a block used on other
//     streams (RecordStream) returns only once events recorded on those
//     streams at its free have completed (queried at each Malloc);
//   - segments are cuMemAlloc'd and cuMemFree'd only by EmptyCache, or when
//     a cuMemAlloc runs out of memory (then every wholly free segment is
//     released and the allocation tried once more, as PyTorch does);
//   - during a graph capture, allocations on the capturing stream come from
//     a private pool whose blocks are reused within it and never return to
//     the general pools; new segments are cuMemAlloc'd with the thread's
//     capture mode relaxed, and no event is queried.
// Not modelled: max_split_size, expandable segments, garbage collection
// thresholds, per-device state (one device).
//
// Thread-safety: every public method may be called from any thread; one
// mutex guards all state. A failed driver call ends the program
// (examples::CheckCu).
#ifndef STENSOR_EXAMPLES_TORCHLIKE_CACHING_ALLOCATOR_H_
#define STENSOR_EXAMPLES_TORCHLIKE_CACHING_ALLOCATOR_H_

#include <cuda.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace torchlike {

class CachingAllocator {
 public:
  CachingAllocator() = default;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;
  ~CachingAllocator();

  // A block of at least `size` bytes for use on `stream`. Ends the program
  // with the driver's CUDA_ERROR_OUT_OF_MEMORY when no segment can be had.
  CUdeviceptr Malloc(size_t size, CUstream stream);
  // Returns the block of `ptr` (a Malloc result) to its pool.
  void Free(CUdeviceptr ptr);
  // The block of `ptr` is used on `stream` too (Tensor.record_stream).
  void RecordStream(CUdeviceptr ptr, CUstream stream);
  // Releases every wholly free segment of the general pools (after waiting
  // for the events of blocks freed with other streams' uses).
  void EmptyCache();

  // Until EndAllocateToPool, allocations on `stream` come from private pool
  // `pool` (created on first use) and no event is queried.
  void BeginAllocateToPool(int pool, CUstream stream);
  void EndAllocateToPool();
  // Frees the segments of private pool `pool`, whose blocks must all be
  // free (its graphs destroyed).
  void ReleasePool(int pool);

  // Bytes of segments held, now and at most; bytes of blocks handed out.
  size_t reserved_bytes() const;
  size_t peak_reserved_bytes() const;
  size_t allocated_bytes() const;
  // cuMemAlloc and cuMemFree calls made for segments.
  int segment_allocs() const;
  int segment_frees() const;

 private:
  struct Block;
  struct BlockComparator {
    bool operator()(const Block* a, const Block* b) const;
  };
  using BlockPool = std::set<Block*, BlockComparator>;
  struct Pools {
    BlockPool small, large;
  };
  struct Block {
    CUdeviceptr ptr = 0;
    size_t size = 0;
    CUstream stream = nullptr;
    BlockPool* pool = nullptr;
    bool allocated = false;
    int event_count = 0;  // events still pending for its free
    Block* prev = nullptr;
    Block* next = nullptr;
    std::vector<CUstream> stream_uses;
  };
  struct PendingEvent {
    CUevent event;
    Block* block;
  };

  Pools& PoolsFor(CUstream stream);
  Block* FindFree(BlockPool& pool, CUstream stream, size_t size);
  Block* NewSegment(BlockPool& pool, CUstream stream, size_t size);
  void FreeBlock(Block* block);
  void ProcessEvents(bool wait);
  void ReleaseFreeSegments(BlockPool& pool);

  mutable std::mutex mu_;
  Pools general_;
  std::map<int, std::unique_ptr<Pools>> private_;
  Pools* capture_pools_ = nullptr;  // while a capture allocates
  CUstream capture_stream_ = nullptr;
  std::map<CUdeviceptr, Block*> active_;
  std::vector<PendingEvent> pending_;
  std::vector<Block*> deferred_;  // freed with stream uses during a capture
  std::vector<CUevent> spare_events_;
  size_t reserved_ = 0, peak_reserved_ = 0, allocated_ = 0;
  int segment_allocs_ = 0, segment_frees_ = 0;
};

}  // namespace torchlike

#endif  // STENSOR_EXAMPLES_TORCHLIKE_CACHING_ALLOCATOR_H_
