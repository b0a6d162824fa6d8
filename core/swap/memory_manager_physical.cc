// MemoryManager: the device memory behind buffers' addresses. Creating and
// releasing physical memory (retrying what the driver refused), the pool
// of chunks, mapping chunks at a buffer's address and taking
// them off, the old mappings a swap-out in flight still reads, and the
// release of a freed buffer. The S401-S405 loop in memory_manager.cc
// decides what goes and when; these are the driver steps that carry it out.

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/json.h"
#include "core/base/log.h"
#include "core/swap/memory_manager.h"
#include "core/swap/memory_manager_internal.h"

namespace stensor {

// --- Physical memory -------------------------------------------------------------

void MemoryManager::TrimDriverPool(Device& dev) {
  dev.driver_pool.Trim(*driver_, dev.ordinal, &stats_.driver_errors);
}

CUresult MemoryManager::CreatePhysical(Device& dev, uint64_t bytes, HostWait host_wait,
                                       CUmemGenericAllocationHandle* handle) {
  TrimDriverPool(dev);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev.ordinal;
  CUresult r;
  // The device itself may be full below the cap: the same loop applies.
  // (Fresh physical memory is what a never-written buffer holds: zeros on
  // the fake, as cuMemAlloc's; undefined on a GPU, as cuMemAlloc's.)
  while ((r = driver_->cuMemCreate(handle, bytes, &prop, 0)) == CUDA_ERROR_OUT_OF_MEMORY) {
    if (ReleaseOneKept(dev)) continue;
    if (ReleaseOnePooled(dev)) continue;
    if (!EvictByPolicy(dev, bytes, host_wait)) return r;  // the device itself is full
  }
  if (Failed(r) != CUDA_SUCCESS) return r;
  ++stats_.physical_creates;
  Charge(dev, bytes);
  return CUDA_SUCCESS;
}

void MemoryManager::ReleasePhysical(Device& dev, CUmemGenericAllocationHandle handle,
                                    uint64_t bytes) {
  if (Failed(driver_->cuMemRelease(handle)) == CUDA_SUCCESS) {
    dev.used -= bytes;
    ++stats_.physical_releases;
  } else {
    unreleased_.push_back({dev.ordinal, handle, bytes});  // still held: still charged
  }
}

void MemoryManager::RetryReleases() {
  for (size_t i = 0; i < stuck_.size();) {
    StuckMapping& m = stuck_[i];
    if (m.mapped != 0 && vmm_.Unmap(m.va, m.mapped) != CUDA_SUCCESS) {
      ++i;
      continue;
    }
    m.mapped = 0;
    Device& dev = DeviceState(m.device);
    for (const PhysicalChunk& c : m.chunks) ReleasePhysical(dev, c.handle, c.bytes);
    if (m.reserved != 0) (void)Failed(driver_->cuMemAddressFree(m.va, m.reserved));
    stuck_.erase(stuck_.begin() + i);
  }
  for (size_t i = 0; i < unreleased_.size();) {
    if (Failed(driver_->cuMemRelease(unreleased_[i].handle)) == CUDA_SUCCESS) {
      DeviceState(unreleased_[i].device).used -= unreleased_[i].bytes;
      ++stats_.physical_releases;
      unreleased_.erase(unreleased_.begin() + i);
    } else {
      ++i;
    }
  }
}

// --- The physical pool ------------------------------------------------------------
//
// Chunks as large as the buffers that made them: on a GPU each handle
// mapped costs its own access setting and unmapping, so a buffer of one
// chunk swaps in and out at a fraction of the cost of one made of granules
// (docs/gpu.md). Sizes that recur are served whole; other sizes from chunks
// that add up to them, so memory freed by a buffer of one size still serves
// others. The pool is bounded by the cap itself: its chunks stay charged,
// the swap path takes them before making room (releasing those it cannot
// use), and everything else that needs room (small allocations, the
// program's own VMM memory) releases them first, so pooling never costs an
// eviction.

uint64_t MemoryManager::TakePooled(Device& dev, uint64_t need, std::vector<PhysicalChunk>* chunks,
                                   bool* shadowed) {
  const size_t had = chunks->size();
  // Shadowed chunks of freed buffers are handed on first.
  auto freed = [&dev](CUmemGenericAllocationHandle h) { return dev.OfFreedOwner(h); };
  std::vector<CUmemGenericAllocationHandle> handed;
  const uint64_t taken = dev.pool.Take(need, chunks, &handed, freed);
  for (CUmemGenericAllocationHandle h : handed) {
    *shadowed = true;
    // Its old owners can no longer take it back (its contents will change).
    auto it = dev.shadow_owners.find(h);
    if (it == dev.shadow_owners.end()) continue;
    for (Buffer* o : it->second) o->handed_on = true;
  }
  stats_.pooled_bytes -= taken;
  stats_.pool_hits += chunks->size() - had;
  return taken;
}

uint64_t MemoryManager::PoolFits(const Device& dev, uint64_t need) const {
  auto freed = [&dev](CUmemGenericAllocationHandle h) { return dev.OfFreedOwner(h); };
  return dev.pool.Fits(need, freed);
}

void MemoryManager::PoolChunks(Device& dev, std::vector<PhysicalChunk>* chunks) {
  stats_.pooled_bytes += ChunkBytes(*chunks);
  dev.pool.PutAll(chunks);
}

uint64_t MemoryManager::ReleasePooled(Device& dev, std::optional<PhysicalChunk> taken) {
  if (!taken) return 0;
  stats_.pooled_bytes -= taken->bytes;
  ReleasePhysical(dev, taken->handle, taken->bytes);  // a failure is retried, still charged
  return taken->bytes;
}

uint64_t MemoryManager::ReleaseOnePooled(Device& dev) {
  return ReleasePooled(dev, dev.pool.TakeIdle());
}

uint64_t MemoryManager::ReleaseOneUnfit(Device& dev, uint64_t need) {
  auto freed = [&dev](CUmemGenericAllocationHandle h) { return dev.OfFreedOwner(h); };
  return ReleasePooled(dev, dev.pool.TakeUnfit(need, freed));
}

CUresult MemoryManager::AcquireChunks(Device& dev, uint64_t bytes, bool reuse, HostWait host_wait,
                                      std::vector<PhysicalChunk>* chunks, bool* pooled,
                                      bool* shadowed) {
  chunks->clear();
  *pooled = false;
  *shadowed = false;
  uint64_t have = 0;
  if (reuse) have += TakePooled(dev, bytes, chunks, shadowed);
  // Memory of freed buffers whose work is still queued comes next, handed
  // on in stream order: a new chunk only when nothing freed can serve, so
  // a program that frees faster than its work completes does not grow.
  while (reuse && have < bytes && HandOnGarbage(dev)) {
    have += TakePooled(dev, bytes - have, chunks, shadowed);
  }
  if (have < bytes) {
    // Room for the rest; evictions meanwhile feed the pool, which counts.
    if (CUresult r = MakeRoom(dev, bytes - have, host_wait, reuse); r != CUDA_SUCCESS) {
      PoolChunks(dev, chunks);
      return r;
    }
    if (reuse) have += TakePooled(dev, bytes - have, chunks, shadowed);
  }
  *pooled = !chunks->empty();
  if (have < bytes) {
    // The rest as one chunk: one handle to map.
    PhysicalChunk fresh{0, bytes - have};
    if (CUresult r = CreatePhysical(dev, fresh.bytes, host_wait, &fresh.handle);
        r != CUDA_SUCCESS) {
      PoolChunks(dev, chunks);
      return r;
    }
    chunks->push_back(fresh);
  }
  return CUDA_SUCCESS;
}

void MemoryManager::ReleaseAllPooled() {
  for (auto& d : devices_) {
    if (!d) continue;
    while (ReleaseOnePooled(*d) > 0) {
    }
  }
}

uint64_t MemoryManager::ReleaseIdlePooled(int device, uint64_t keep) {
  ManagerLock lock(this);
  CollectGarbage();
  Device& dev = DeviceState(device);
  uint64_t released = 0;
  // Kept buffers are idle memory too: their chunks go to the pool, then out.
  while (!dev.kept.empty() && dev.pool.bytes() + dev.kept_bytes > keep && ReleaseOneKept(dev)) {
  }
  while (dev.pool.bytes() > keep) {
    const uint64_t bytes = ReleasePooled(dev, dev.pool.TakeIdle(dev.pool.bytes() - keep));
    if (bytes == 0) break;
    released += bytes;
  }
  return released;
}

// --- Device memory at a buffer's address -----------------------------------------

CUresult MemoryManager::ZeroReused(Device& dev, Buffer& b) {
  if (CUresult r = EnsureSwapStream(dev); r != CUDA_SUCCESS) return r;
  if (CUresult r = Failed(driver_->cuMemsetD8Async(b.base, 0, b.reserved, dev.swap_stream));
      r != CUDA_SUCCESS) {
    return r;
  }
  // Consumers wait for it (OrderAfterSwap), as for a swap-in's copy.
  NoteUse(b.uses, dev.swap_stream, dev.ordinal);
  // Journaled operations would not wait for it: the full path until it is done.
  if (journaling_) own_work_ = true;
  return CUDA_SUCCESS;
}

CUresult MemoryManager::MapDevice(Device& dev, Buffer& b) {
  // Pooled chunks first; fresh memory for the rest, or for all of it when
  // zeroing reused chunks failed.
  for (bool reuse = true;; reuse = false) {
    std::vector<PhysicalChunk> chunks;
    bool pooled = false, shadowed = false;
    if (CUresult r =
            AcquireChunks(dev, b.reserved, reuse, HostWait::kAllowed, &chunks, &pooled, &shadowed);
        r != CUDA_SUCCESS) {
      return r;
    }
    bool mapped = false;
    uint64_t left_mapped = 0;
    if (CUresult r = vmm_.Map(b.base, chunks, dev.ordinal, &mapped, &left_mapped);
        r != CUDA_SUCCESS) {
      if (mapped) {
        // The undo failed too: the chunks stay charged (what is mapped is
        // held) until a later retry unmaps them.
        stuck_.push_back({dev.ordinal, b.base, left_mapped, 0, std::move(chunks)});
      } else {
        PoolChunks(dev, &chunks);
      }
      return r;
    }
    b.device_chunks = std::move(chunks);
    // Fresh memory holds zeros on the fake (as cuMemAlloc's); reused chunks
    // are zeroed on the swap stream, after whatever their last owners
    // queued there, and the buffer's first user waits for that.
    if (!pooled) return CUDA_SUCCESS;
    CUresult r = ZeroReused(dev, b);
    if (r == CUDA_SUCCESS) return CUDA_SUCCESS;
    if (vmm_.Unmap(b.base, b.reserved) != CUDA_SUCCESS) {
      return r;  // mapped and holding old contents: the allocation fails
    }
    PoolChunks(dev, &b.device_chunks);
  }
}

CUresult MemoryManager::UnmapDevice(Device& dev, Buffer& b) {
  if (CUresult r = vmm_.Unmap(b.base, b.reserved); r != CUDA_SUCCESS) {
    return r;  // still mapped: still resident
  }
  // Never fault: the address reads the host copy while swapped out.
  if (CUresult r = b.host.vmm() ? MapHostAtBase(b) : CUDA_SUCCESS; r != CUDA_SUCCESS) {
    if (b.host_at_base && vmm_.Unmap(b.base, b.reserved) == CUDA_SUCCESS) {
      b.host_at_base = false;
    }
    bool mapped = false;
    if (!b.host_at_base &&
        vmm_.Map(b.base, b.device_chunks, dev.ordinal, &mapped) == CUDA_SUCCESS) {
      return r;  // back as it was: resident
    }
    // Neither: swapped out with the address unmapped, as without host VMM.
    LogHostUnmapped(b);
  }
  PoolChunks(dev, &b.device_chunks);
  return CUDA_SUCCESS;
}

void MemoryManager::DetachShadowed(Device& dev, Buffer& b) {
  b.old_chunks = b.device_chunks;
  b.old_mapped = true;
  b.handed_on = false;
  for (const PhysicalChunk& c : b.old_chunks) {
    dev.pool.Shadow(c.handle);
    dev.shadow_owners[c.handle].push_back(&b);
  }
  dev.old_mappings.push_back(&b);
  PoolChunks(dev, &b.device_chunks);
}

bool MemoryManager::TakeBack(Device& dev, Buffer& b) {
  if (!dev.pool.TakeBack(b.old_chunks)) return false;
  stats_.pooled_bytes -= b.reserved;
  std::vector<PhysicalChunk> back = b.old_chunks;
  EndShadow(dev, b);
  b.device_chunks = std::move(back);
  return true;
}

// --- Old mappings (swap-outs in flight) ------------------------------------------

void MemoryManager::EndShadow(Device& dev, Buffer& b) {
  if (!b.old_mapped) return;
  b.old_mapped = false;
  b.handed_on = false;
  for (const PhysicalChunk& c : b.old_chunks) {
    dev.pool.Unshadow(c.handle);
    auto owners = dev.shadow_owners.find(c.handle);
    if (owners == dev.shadow_owners.end()) continue;
    std::vector<Buffer*>& o = owners->second;
    o.erase(std::remove(o.begin(), o.end(), &b), o.end());
    if (o.empty()) dev.shadow_owners.erase(owners);
  }
  b.old_chunks.clear();
  // Mostly the oldest: reaped in order.
  auto it = std::find(dev.old_mappings.begin(), dev.old_mappings.end(), &b);
  if (it != dev.old_mappings.end()) dev.old_mappings.erase(it);
}

void MemoryManager::LogHostUnmapped(const Buffer& b) const {
  Say(LogLevel::kWarn, "host-unmapped",
      absl::StrCat("the host copy of buffer ", b.id,
                   " could not be mapped at its address while it is swapped out: a kernel "
                   "reaching it through a pointer stensor cannot see would fault"));
  if (logging()) {
    Log(Named(
            JsonLine()
                .Str("type", "limitation")
                .Str("what", "the host copy could not be mapped at a swapped-out buffer's address"),
            b)
            .Finish());
  }
}

bool MemoryManager::EndOldMapping(Device& dev, Buffer& b) {
  if (vmm_.Unmap(b.base, b.reserved) != CUDA_SUCCESS) return false;
  EndShadow(dev, b);
  // Never fault: the address reads the host copy from now on (a freed
  // buffer's address is read by nothing).
  if (!b.garbage && b.host.vmm() && MapHostAtBase(b) != CUDA_SUCCESS) {
    if (b.host_at_base && vmm_.Unmap(b.base, b.reserved) == CUDA_SUCCESS) {
      b.host_at_base = false;
    }
    LogHostUnmapped(b);
  }
  return true;
}

bool MemoryManager::ReapOldMappings(Device& dev, bool wait, double* waited) {
  if (dev.old_mappings.empty()) return false;
  if (wait && WaitSwapStream(dev, waited) != CUDA_SUCCESS) return false;
  bool any = false;
  // Oldest first: their copies complete in the swap stream's order, so
  // without a wait the first not seen done ends the look (the cost follows
  // what completed, not how many are in flight). One whose unmap failed
  // stays for a retry.
  for (size_t i = 0; i < dev.old_mappings.size();) {
    Buffer* b = dev.old_mappings[i];
    bool observed = false;
    for (Use& u : b->uses) {
      if (u.stream == dev.swap_stream) observed = Observed(u);
    }
    if (!observed) {
      if (!wait) break;
      ++i;
      continue;
    }
    if (!EndOldMapping(dev, *b)) {
      ++i;
      continue;
    }
    any = true;
    // A freed buffer whose memory was handed on: its address goes too (or,
    // not idle yet or refused by the driver, it waits as a pending free).
    if (!b->garbage) continue;
    if (b->pins == 0 && Idle(*b) && ReleaseBuffer(dev, *b)) {
      ++stats_.garbage_released;
    } else {
      EnqueueGarbage(dev, *b);
    }
  }
  return any;
}

void MemoryManager::SettleOldMappings(int device) {
  Device& dev = DeviceState(device);
  while (!dev.old_mappings.empty() &&
         ReapOldMappings(dev, /*wait=*/true, &stats_.wait_unknown_seconds)) {
  }
}

// --- Releasing a freed buffer ----------------------------------------------------

bool MemoryManager::ReleaseBuffer(Device& dev, Buffer& b) {
  // Out of the kept ones first: a step that fails leaves it garbage,
  // retried as any other (it is idle).
  Unkeep(dev, b);
  // Each step is recorded as it succeeds, so a retry goes on from there.
  if (!b.vmm) {
    if (Failed(driver_->cuMemFree_v2(b.base)) != CUDA_SUCCESS) return false;
    dev.used -= b.reserved;
  } else {
    if (!b.device_chunks.empty() || b.host_at_base || b.old_mapped) {
      if (vmm_.Unmap(b.base, b.reserved) != CUDA_SUCCESS) return false;
      b.host_at_base = false;
      if (b.exported) {
        // The program may still hold a retained handle to this memory:
        // never hand it to another buffer (the driver keeps it alive for
        // that handle; it is the program's now, and no longer charged).
        for (const PhysicalChunk& c : b.device_chunks) ReleasePhysical(dev, c.handle, c.bytes);
        b.device_chunks.clear();
      } else {
        PoolChunks(dev, &b.device_chunks);
      }
      RecountGarbage(dev, b);  // should a later step fail
      EndShadow(dev, b);       // released only once idle: its swap-out copy is done
    }
    if (b.va_reserved) {
      if (Failed(driver_->cuMemAddressFree(b.base, b.reserved)) != CUDA_SUCCESS) return false;
      b.va_reserved = false;
    }
    // A piece: the allocation's range goes with the last of them.
    if (PieceGroup* g = b.group.get(); g != nullptr && g->live == 1 && g->va_reserved) {
      if (Failed(driver_->cuMemAddressFree(g->base, g->reserved)) != CUDA_SUCCESS) return false;
      g->va_reserved = false;
    }
    if (!ReleaseHostCopy(dev, b)) return false;
  }
  // A failed destroy leaks one event; nothing depends on it any more.
  for (const Use& u : b.uses) {
    if (u.own != nullptr) (void)Failed(driver_->cuEventDestroy_v2(u.own));
  }
  Unindex(b);
  DequeueGarbage(dev, b);
  const uint64_t key = b.key;
  if (b.stream_ordered) dev.stream_ordered.reserved -= b.reserved;
  if (PieceGroup* g = b.group.get()) {
    std::replace(g->pieces.begin(), g->pieces.end(), &b, static_cast<Buffer*>(nullptr));
    if (g->live > 0 && --g->live == 0) {
      if (--groups_ == 0) has_pieces_.store(false, std::memory_order_relaxed);
      if (auto it = group_ids_.find(g->id); it != group_ids_.end() && it->second == g) {
        group_ids_.erase(it);
      }
    }
  }
  by_base_.erase(b.base);
  EraseBuffer(key);  // destroys b
  return true;
}

}  // namespace stensor
