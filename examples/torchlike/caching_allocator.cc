#include "examples/torchlike/caching_allocator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "examples/common/example_program.h"

namespace torchlike {
namespace {

constexpr size_t kMinBlockSize = 512;        // every request rounds to this
constexpr size_t kSmallSize = 1 << 20;       // largest small-pool request
constexpr size_t kSmallBuffer = 2 << 20;     // small-pool segment
constexpr size_t kLargeBuffer = 20 << 20;    // large-pool segment
constexpr size_t kMinLargeAlloc = 10 << 20;  // from here, a segment of its own
constexpr size_t kRoundLarge = 2 << 20;      // ... rounded up to this

size_t RoundSize(size_t size) {
  return size < kMinBlockSize ? kMinBlockSize
                              : (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t AllocationSize(size_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

bool ShouldSplit(size_t block_size, size_t size, bool small) {
  const size_t remaining = block_size - size;
  return small ? remaining >= kMinBlockSize : remaining > kSmallSize;
}

}  // namespace

bool CachingAllocator::BlockComparator::operator()(const Block* a, const Block* b) const {
  return std::make_tuple(reinterpret_cast<uintptr_t>(a->stream), a->size, a->ptr) <
         std::make_tuple(reinterpret_cast<uintptr_t>(b->stream), b->size, b->ptr);
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  for (CUevent e : spare_events_) cuEventDestroy(e);
}

CachingAllocator::Pools& CachingAllocator::PoolsFor(CUstream stream) {
  if (capture_pools_ != nullptr && stream == capture_stream_) {
    return *capture_pools_;
  }
  return general_;
}

CachingAllocator::Block* CachingAllocator::FindFree(BlockPool& pool, CUstream stream, size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  const auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::NewSegment(BlockPool& pool, CUstream stream,
                                                      size_t size) {
  CUdeviceptr ptr = 0;
  const bool capturing = capture_pools_ != nullptr;
  auto Alloc = [&] {
    if (!capturing) return cuMemAlloc(&ptr, size);
    // "It's ok to capture cudaMallocs, as long as we never cudaFree those
    // addresses before replay": PyTorch relaxes the thread's capture mode.
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CU_CHECK(cuThreadExchangeStreamCaptureMode, &mode);
    const CUresult r = cuMemAlloc(&ptr, size);
    CU_CHECK(cuThreadExchangeStreamCaptureMode, &mode);
    return r;
  };
  CUresult r = Alloc();
  if (r == CUDA_ERROR_OUT_OF_MEMORY && !capturing) {
    // release_cached_blocks, then one more try.
    ProcessEvents(/*wait=*/true);
    ReleaseFreeSegments(general_.small);
    ReleaseFreeSegments(general_.large);
    r = Alloc();
  }
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr,
                 "%s: caching allocator: a segment of %zu bytes (%zu "
                 "reserved)\n",
                 examples::ProgramName(), size, reserved_);
    examples::CheckCu(r, "cuMemAlloc");
  }
  ++segment_allocs_;
  reserved_ += size;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  Block* block = new Block;
  block->ptr = ptr;
  block->size = size;
  block->stream = stream;
  block->pool = &pool;
  return block;
}

CUdeviceptr CachingAllocator::Malloc(size_t request, CUstream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capture_pools_ == nullptr) ProcessEvents(/*wait=*/false);
  const size_t size = RoundSize(request);
  const bool small = size <= kSmallSize;
  Pools& pools = PoolsFor(stream);
  BlockPool& pool = small ? pools.small : pools.large;
  Block* block = FindFree(pool, stream, size);
  if (block == nullptr) block = NewSegment(pool, stream, AllocationSize(size));
  if (ShouldSplit(block->size, size, small)) {
    Block* rest = new Block;
    rest->ptr = block->ptr + size;
    rest->size = block->size - size;
    rest->stream = stream;
    rest->pool = &pool;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool.insert(rest);
  }
  block->allocated = true;
  active_[block->ptr] = block;
  allocated_ += block->size;
  return block->ptr;
}

void CachingAllocator::Free(CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = active_.find(ptr);
  if (it == active_.end()) {
    std::fprintf(stderr, "%s: caching allocator: free of unknown 0x%llx\n", examples::ProgramName(),
                 static_cast<unsigned long long>(ptr));
    std::exit(1);
  }
  Block* block = it->second;
  active_.erase(it);
  block->allocated = false;
  allocated_ -= block->size;
  if (block->stream_uses.empty()) {
    FreeBlock(block);
  } else if (capture_pools_ != nullptr) {
    // No events during a capture: recorded once it has ended. Until then the
    // block is neither in use nor free (a neighbour's free leaves it alone).
    block->event_count = 1;
    deferred_.push_back(block);
  } else {
    for (CUstream s : block->stream_uses) {
      CUevent event;
      if (spare_events_.empty()) {
        CU_CHECK(cuEventCreate, &event, CU_EVENT_DISABLE_TIMING);
      } else {
        event = spare_events_.back();
        spare_events_.pop_back();
      }
      CU_CHECK(cuEventRecord, event, s);
      ++block->event_count;
      pending_.push_back({event, block});
    }
    block->stream_uses.clear();
  }
}

void CachingAllocator::RecordStream(CUdeviceptr ptr, CUstream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Block* block = active_.at(ptr);
  if (stream == block->stream) return;
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) ==
      block->stream_uses.end()) {
    block->stream_uses.push_back(stream);
  }
}

void CachingAllocator::FreeBlock(Block* block) {
  BlockPool& pool = *block->pool;
  for (Block* neighbour : {block->prev, block->next}) {
    if (neighbour == nullptr || neighbour->allocated || neighbour->event_count > 0) {
      continue;
    }
    pool.erase(neighbour);
    if (neighbour == block->prev) {
      block->ptr = neighbour->ptr;
      block->prev = neighbour->prev;
      if (block->prev != nullptr) block->prev->next = block;
    } else {
      block->next = neighbour->next;
      if (block->next != nullptr) block->next->prev = block;
    }
    block->size += neighbour->size;
    delete neighbour;
  }
  pool.insert(block);
}

void CachingAllocator::ProcessEvents(bool wait) {
  if (!deferred_.empty() && capture_pools_ == nullptr) {
    std::vector<Block*> deferred;
    deferred.swap(deferred_);
    for (Block* block : deferred) {
      block->event_count = 0;
      for (CUstream s : block->stream_uses) {
        CUevent event;
        CU_CHECK(cuEventCreate, &event, CU_EVENT_DISABLE_TIMING);
        CU_CHECK(cuEventRecord, event, s);
        ++block->event_count;
        pending_.push_back({event, block});
      }
      block->stream_uses.clear();
    }
  }
  std::vector<PendingEvent> still;
  for (const PendingEvent& p : pending_) {
    if (wait) {
      CU_CHECK(cuEventSynchronize, p.event);
    } else {
      const CUresult r = cuEventQuery(p.event);
      if (r == CUDA_ERROR_NOT_READY) {
        still.push_back(p);
        continue;
      }
      examples::CheckCu(r, "cuEventQuery");
    }
    spare_events_.push_back(p.event);
    if (--p.block->event_count == 0) FreeBlock(p.block);
  }
  pending_.swap(still);
}

void CachingAllocator::ReleaseFreeSegments(BlockPool& pool) {
  for (auto it = pool.begin(); it != pool.end();) {
    Block* block = *it;
    if (block->prev != nullptr || block->next != nullptr) {
      ++it;
      continue;
    }
    it = pool.erase(it);
    CU_CHECK(cuMemFree, block->ptr);
    ++segment_frees_;
    reserved_ -= block->size;
    delete block;
  }
}

void CachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  ProcessEvents(/*wait=*/true);
  ReleaseFreeSegments(general_.small);
  ReleaseFreeSegments(general_.large);
}

void CachingAllocator::BeginAllocateToPool(int pool, CUstream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Pools>& pools = private_[pool];
  if (pools == nullptr) pools = std::make_unique<Pools>();
  capture_pools_ = pools.get();
  capture_stream_ = stream;
}

void CachingAllocator::EndAllocateToPool() {
  std::lock_guard<std::mutex> lock(mu_);
  capture_pools_ = nullptr;
  capture_stream_ = nullptr;
}

void CachingAllocator::ReleasePool(int pool) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = private_.find(pool);
  if (it == private_.end()) return;
  for (BlockPool* p : {&it->second->small, &it->second->large}) {
    ReleaseFreeSegments(*p);
    if (!p->empty()) {
      std::fprintf(stderr, "%s: private pool %d still has blocks in use\n", examples::ProgramName(),
                   pool);
      std::exit(1);
    }
  }
  private_.erase(it);
}

size_t CachingAllocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}
size_t CachingAllocator::peak_reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_reserved_;
}
size_t CachingAllocator::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}
int CachingAllocator::segment_allocs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return segment_allocs_;
}
int CachingAllocator::segment_frees() const {
  std::lock_guard<std::mutex> lock(mu_);
  return segment_frees_;
}

}  // namespace torchlike
