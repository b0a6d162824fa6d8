// MemoryManager: host copies, where a swapped-out buffer's data lives. Made
// (a kept one reused where it fits), mapped at the buffer's address, kept
// for reuse or released, and read from when the program copies a buffer to
// the host. Which buffer goes out, and when, is decided in
// memory_manager.cc; this is where its bytes are kept meanwhile.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "core/base/json.h"
#include "core/base/log.h"
#include "core/driver/context_scope.h"
#include "core/swap/memory_manager.h"
#include "core/swap/memory_manager_internal.h"

namespace stensor {

CUresult MemoryManager::EnsureHostCopy(Buffer& b, bool will_copy) {
  if (b.host.exists()) return CUDA_SUCCESS;
  Device& dev = DeviceState(b.device);
  // What a failed attempt could not undo goes first (or this one fails too).
  if (!ReleaseHostCopy(dev, b)) return CUDA_ERROR_UNKNOWN;
  // A kept copy holds an earlier buffer's bytes: one about to be copied
  // into takes it as it is; a never-written buffer's (`will_copy` false)
  // must hold what fresh memory holds, so it is zeroed first on the swap
  // stream, as a use of the buffer there (what reads the address while it
  // is swapped out is ordered after the swap stream).
  if (std::optional<HostCopy> spare =
          host_store_.TakeSpare(dev.ordinal, b.reserved, dev.host_vmm, /*vmm_only=*/!will_copy)) {
    bool zeroed = will_copy;
    if (!zeroed && EnsureSwapStream(dev) == CUDA_SUCCESS &&
        Failed(driver_->cuMemsetD8Async(spare->va(), 0, b.reserved, dev.swap_stream)) ==
            CUDA_SUCCESS) {
      NoteUse(b.uses, dev.swap_stream, dev.ordinal);
      zeroed = true;
    }
    if (zeroed) {
      b.host = *spare;  // still counted
      return CUDA_SUCCESS;
    }
    host_store_.PutBack(dev.ordinal, b.reserved, *spare);  // a fresh copy after all
  }
  static const size_t host_total =
      static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::optional<size_t> host_cap = config_.HostLimitBytes(host_total);
  if (host_cap && !host_store_.Fits(dev.ordinal, b.reserved, *host_cap)) {
    if (!warned_host_limit_) {
      warned_host_limit_ = true;
      Say(LogLevel::kWarn, "host-limit",
          absl::StrCat("out of memory: the device cap (STENSOR_MEMORY_LIMIT, ", dev.cap,
                       " bytes on device ", dev.ordinal,
                       ") and the host limit (STENSOR_HOST_LIMIT, ", *host_cap,
                       " bytes) are both exhausted"));
    }
    if (logging()) {
      Log(JsonLine()
              .Str("type", "oom")
              .Str("what", "host")
              .Uint("bytes", b.reserved)
              .Uint("host_used", host_store_.bytes(dev.ordinal))
              .Finish());
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (!dev.host_vmm && !warned_no_host_vmm_) {
    warned_no_host_vmm_ = true;
    SayOnce(LogLevel::kWarn, "no-host-vmm",
            "this driver has no host-located VMM: swapped-out buffers are unmapped, and a "
            "kernel that reaches one through a pointer stensor cannot see (one kept in device "
            "memory) faults (docs/limits.md)");
    if (logging()) {
      Log(JsonLine()
              .Str("type", "limitation")
              .Str("what",
                   "host-located VMM unsupported: swapped-out buffers are "
                   "unmapped; a kernel reaching one through a pointer "
                   "stensor cannot see would fault")
              .Finish());
    }
  }
  // Page-locked memory from cuMemHostAlloc is pinned for the context that
  // allocated it: the one whose streams copy it (host-located VMM memory
  // belongs to no context).
  ContextScope scope(*driver_, dev.host_vmm ? nullptr : dev.context, &stats_.driver_errors);
  return host_store_.Create(&b.host, dev.ordinal, dev.host_vmm, b.reserved, b.size);
}

CUresult MemoryManager::MapHostAtBase(Buffer& b) {
  bool mapped = false;
  CUresult r = vmm_.Map(b.base, {PhysicalChunk{b.host.handle(), b.reserved}}, b.device, &mapped);
  // A mapping without access after a second failure is still a mapping:
  // it has to be unmapped before device memory goes there.
  b.host_at_base = mapped;
  return r;
}

bool MemoryManager::ReleaseHostCopy(Device& dev, Buffer& b) {
  // Kept whole for the next buffer of its size and device where the store
  // keeps it (a step's temporaries swapped out and freed would otherwise
  // cost a cuMemCreate and a cuMemRelease each, every step).
  return host_store_.Release(&b.host, dev.ordinal, b.reserved, /*keep_up_to=*/dev.cap);
}

// --- Host reads of a buffer ------------------------------------------------------

void MemoryManager::ForEachPart(
    Buffer& b, uint64_t offset, uint64_t bytes,
    absl::FunctionRef<void(Buffer& piece, uint64_t offset, uint64_t bytes, uint64_t at)> f) {
  if (b.group == nullptr) {
    f(b, offset, bytes, 0);
    return;
  }
  const uint64_t end = offset + bytes;
  for (Buffer* p : b.group->pieces) {
    if (p == nullptr) continue;
    const uint64_t from = p->base - b.group->base;
    const uint64_t to = from + p->size;
    if (to <= offset || from >= end) continue;
    const uint64_t start = std::max(from, offset);
    f(*p, start - from, std::min(to, end) - start, start - offset);
  }
}

bool MemoryManager::ReadFromHostCopy(uint64_t id, uint64_t offset, void* dst, uint64_t bytes) {
  ManagerLock lock(this);
  Buffer* b = ById(id);
  if (b == nullptr || !b->vmm || !IntoSlab(id, &offset, bytes)) return false;
  const BufferView v = ViewOf(*b);
  if (offset > v.size || bytes > v.size - offset) return false;
  // Every piece the range reaches must be served from its host copy.
  struct Part {
    Buffer* piece;
    uint64_t offset, bytes, at;
  };
  absl::InlinedVector<Part, 4> parts;
  ForEachPart(*b, offset, bytes, [&](Buffer& p, uint64_t from, uint64_t n, uint64_t at) {
    parts.push_back(Part{&p, from, n, at});
  });
  for (const Part& part : parts) {
    if (!HostCopyCurrent(*part.piece)) return false;
  }
  for (const Part& part : parts) {
    const Buffer& p = *part.piece;
    char* to = static_cast<char*>(dst) + part.at;
    CUresult r = p.host.handle() != 0
                     ? Failed(driver_->cuMemcpyDtoH_v2(to, p.host.va() + part.offset, part.bytes))
                     : (std::memcpy(to, static_cast<char*>(p.host.ptr()) + part.offset, part.bytes),
                        CUDA_SUCCESS);
    if (r != CUDA_SUCCESS) return false;
  }
  ++stats_.reads_served_from_host;
  return true;
}

bool MemoryManager::HostCopyCurrent(Buffer& b) {
  if (b.resident() || !b.host.exists()) return false;
  Device& dev = DeviceState(b.device);
  for (Use& u : b.uses) {
    // Its swap-out copy is still in flight: not served from the host copy.
    if (dev.swap_stream != nullptr && u.stream == dev.swap_stream && !Observed(u)) return false;
  }
  return true;
}

CUresult MemoryManager::ReadBack(uint64_t id, uint64_t offset, void* dst, uint64_t bytes) {
  ManagerLock lock(this);
  Buffer* b = ById(id);
  if (b == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (!IntoSlab(id, &offset, bytes)) return CUDA_ERROR_INVALID_VALUE;
  const BufferView v = ViewOf(*b);
  if (offset > v.size || bytes > v.size - offset) return CUDA_ERROR_INVALID_VALUE;
  // Piece by piece, each looked up again by key: the lock is let go while
  // one copies.
  struct Part {
    uint64_t key, offset, bytes, at;
  };
  absl::InlinedVector<Part, 4> parts;
  ForEachPart(*b, offset, bytes, [&](Buffer& p, uint64_t from, uint64_t n, uint64_t at) {
    parts.push_back(Part{p.key, from, n, at});
  });
  for (const Part& part : parts) {
    Buffer* p = ById(part.key);
    if (p == nullptr) return CUDA_ERROR_NOT_FOUND;
    if (CUresult r = ReadBackLocked(*p, part.offset, static_cast<char*>(dst) + part.at, part.bytes);
        r != CUDA_SUCCESS) {
      return r;
    }
  }
  return CUDA_SUCCESS;
}

CUresult MemoryManager::ReadBackLocked(Buffer& piece, uint64_t offset, void* dst, uint64_t bytes) {
  Buffer* b = &piece;
  if (!b->resident() || b->stale_device) {
    // The host copy holds the data once the swap-out's copy into it is done.
    if (CUresult r = WaitSwapUse(DeviceState(b->device), *b, HostWait::kAllowed);
        r != CUDA_SUCCESS) {
      return r;
    }
  }
  if (!b->resident() || b->stale_device) {  // the host copy holds the data
    if (b->host.ptr() != nullptr) {
      std::memcpy(dst, static_cast<char*>(b->host.ptr()) + offset, bytes);
      return CUDA_SUCCESS;
    }
    if (!b->host.vmm()) {
      std::memset(dst, 0, bytes);  // dropped never written: fresh memory
      return CUDA_SUCCESS;
    }
    // A synchronous copy waits for the program's blocking streams: never
    // under the lock. The pin keeps the host copy where it is.
    const CUdeviceptr from = b->host.va() + offset;
    Pin(*b);
    mu_.Unlock();
    CUresult r = driver_->cuMemcpyDtoH_v2(dst, from, bytes);
    mu_.Lock();
    ApplyJournal();
    Unpin(*b);
    return r;
  }
  // Pinned, so it stays mapped while the copy runs without the lock; a
  // swap-in still copying its contents in is waited for first.
  const std::vector<Use> copies = PendingOwnUses(DeviceState(b->device), *b);
  Pin(*b);
  mu_.Unlock();
  CUresult r = CUDA_SUCCESS;
  for (const Use& u : copies) {
    if (r == CUDA_SUCCESS) r = WaitForUse(u, u.stream);
  }
  if (r == CUDA_SUCCESS) r = driver_->cuMemcpyDtoH_v2(dst, b->base + offset, bytes);
  mu_.Lock();
  ApplyJournal();
  Unpin(*b);
  return r;
}

}  // namespace stensor
