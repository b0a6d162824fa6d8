#include "core/tracker/table_reader.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/json.h"

namespace stensor {

namespace {

// Past this size a table whose contents are unknown is not read back: the
// launch's accesses count as unknown instead.
constexpr uint64_t kMaxTableReadBack = 16 << 20;

CUevent EventOf(const PointerTables::Mark& m) {
  return reinterpret_cast<CUevent>(const_cast<void*>(m.get()));
}

}  // namespace

TableReader::TableReader(const Driver* driver, MemoryManager* memory, const CaptureState* capture,
                         PointerTables* tables, const BufferRegistry* registry,
                         const PinnedHost* pinned, std::function<void(std::string)> log)
    : driver_(driver),
      memory_(memory),
      capture_(capture),
      tables_(tables),
      registry_(registry),
      pinned_(pinned),
      log_(std::move(log)) {}

bool TableReader::MarkDone(const PointerTables::Mark& m) const {
  // AnyWriter() (no event could be recorded) is no event: never done.
  // Asked while a capture may be in progress elsewhere: relaxed.
  if (driver_->cuEventQuery == nullptr || m == PointerTables::AnyWriter()) return false;
  RelaxedCaptureScope relaxed(*capture_);
  return driver_->cuEventQuery(EventOf(m)) == CUDA_SUCCESS;
}

bool TableReader::MayWait(CUstream stream) {
  // A stream being captured into a graph cannot be waited for (and a wait
  // would invalidate the capture): the table stays unknown. So it does while
  // any capture is in progress: a synchronisation would wait for, or be
  // refused by, the capturing stream.
  if (capture_->any()) return false;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  return driver_->cuStreamIsCapturing == nullptr ||
         (driver_->cuStreamIsCapturing(stream, &capture) == CUDA_SUCCESS &&
          capture == CU_STREAM_CAPTURE_STATUS_NONE);
}

bool TableReader::WaitForStream(CUstream stream) {
  return driver_->cuStreamSynchronize != nullptr && MayWait(stream) &&
         driver_->cuStreamSynchronize(stream) == CUDA_SUCCESS;
}

bool TableReader::WaitForTableWriters(CUstream stream) {
  // Whatever wrote the table, on any stream, is ordered before the launch
  // that reads it (work the program did not order so would race with the
  // kernel's read), so it has run once `stream` ran all it was given: not
  // the other streams' later work (a loader's copies).
  return WaitForStream(stream);
}

bool TableReader::WaitForRangeWriters(const Buffer& table,
                                      const std::vector<PointerTables::StaleRange>& stale,
                                      CUstream stream, const char** waited) {
  if (!MayWait(stream)) return false;
  bool any = driver_->cuEventSynchronize == nullptr;
  std::vector<const void*> seen;
  for (const PointerTables::StaleRange& r : stale) {
    any |= r.any;
    for (const PointerTables::Mark& m : r.marks) {
      if (any) break;
      if (std::find(seen.begin(), seen.end(), m.get()) != seen.end()) continue;
      seen.push_back(m.get());
      // A wait that fails tells nothing: the buffer's writers instead.
      any |= driver_->cuEventSynchronize(EventOf(m)) != CUDA_SUCCESS;
    }
  }
  *waited = "writers";
  return !any || WaitForBufferWriters(table.id, stream, waited);
}

bool TableReader::WaitForBufferWriters(uint64_t id, CUstream stream, const char** waited) {
  if (!MayWait(stream)) return false;
  // Every device write of a buffer the manager tracks is an operation it
  // prepared (a use on its stream) or one of unknown accesses.
  if (memory_ && memory_->WaitForWriters(id) == CUDA_SUCCESS) {
    *waited = "buffer";
    return true;
  }
  *waited = "stream";
  return WaitForTableWriters(stream);
}

PointerTables::Mark TableReader::MarkAfter(CUstream stream) {
  // Uncapped, nothing is read back: no wait needs an event.
  if (!memory_ || driver_->cuEventCreate == nullptr || driver_->cuEventRecord == nullptr ||
      driver_->cuEventDestroy_v2 == nullptr) {
    return PointerTables::AnyWriter();
  }
  RelaxedCaptureScope relaxed(*capture_);
  CUevent e = nullptr;
  if (driver_->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    return PointerTables::AnyWriter();
  }
  if (driver_->cuEventRecord(e, stream) != CUDA_SUCCESS) {
    driver_->cuEventDestroy_v2(e);
    return PointerTables::AnyWriter();
  }
  const Driver* driver = driver_;
  return PointerTables::Mark(static_cast<const void*>(e), [driver](const void* p) {
    driver->cuEventDestroy_v2(reinterpret_cast<CUevent>(const_cast<void*>(p)));
  });
}

bool TableReader::StreamIdle(CUstream stream) {
  const CUstream h = stream;
  // The legacy stream also waits for every blocking stream, which cannot
  // all be asked.
  if (h == nullptr || h == CU_STREAM_LEGACY || driver_->cuStreamQuery == nullptr) return false;
  RelaxedCaptureScope relaxed(*capture_);
  if (driver_->cuStreamQuery(h) != CUDA_SUCCESS) return false;
  // A blocking stream (the per-thread default stream is one) waits for the
  // legacy stream's work too.
  unsigned flags = 0;
  const bool non_blocking = h != CU_STREAM_PER_THREAD && driver_->cuStreamGetFlags != nullptr &&
                            driver_->cuStreamGetFlags(h, &flags) == CUDA_SUCCESS &&
                            (flags & CU_STREAM_NON_BLOCKING) != 0;
  return non_blocking || driver_->cuStreamQuery(CU_STREAM_LEGACY) == CUDA_SUCCESS;
}

bool TableReader::ReadBack(const Buffer& table, const std::vector<PointerTables::StaleRange>& stale,
                           uint64_t learn_from, uint64_t from, CUstream stream,
                           std::vector<uint64_t>* words) {
  if (!memory_) return false;
  const uint64_t end = table.base + table.size;
  // The stale ranges, and the bytes a pointer-to-pointer parameter reads
  // where no range is known (up to the end of the buffer).
  std::vector<PointerTables::Window> windows;
  for (const PointerTables::StaleRange& r : stale) {
    const uint64_t hi = learn_from != 0 ? std::min(r.end, learn_from) : r.end;
    if (r.start < hi) windows.push_back({r.start, hi, false});
  }
  if (learn_from != 0 && learn_from < end) windows.push_back({learn_from, end, true});
  uint64_t bytes = 0;
  for (const PointerTables::Window& w : windows) bytes += w.end - w.start;
  if (bytes > kMaxTableReadBack) return false;
  const uint64_t since = tables_->Changes();
  const char* waited = "writers";
  if (learn_from != 0) {
    // Bytes no range covers: written by whatever wrote the buffer.
    if (!WaitForBufferWriters(table.id, stream, &waited)) return false;
  } else if (!WaitForRangeWriters(table, stale, stream, &waited)) {
    return false;
  }
  std::vector<unsigned char> data(bytes);
  uint64_t at = 0;
  for (const PointerTables::Window& w : windows) {
    const uint64_t n = w.end - w.start;
    CUresult r = memory_->ReadBack(table.id, w.start - table.base, data.data() + at, n);
    if (r == CUDA_ERROR_NOT_FOUND) {  // not the manager's: never swapped
      r = driver_->cuMemcpyDtoH_v2(data.data() + at, w.start, n);
    }
    if (r != CUDA_SUCCESS) return false;
    at += n;
  }
  // Freed meanwhile (another thread): nothing to remember.
  std::optional<Buffer> live = registry_->Find(table.base);
  if (!live || live->id != table.id) return false;
  tables_->Rescan(table, windows, data.data(), since, *registry_);
  words->clear();
  std::vector<PointerTables::Found> found;
  const PointerTables::Reach reach{table.id, from};
  tables_->Collect(absl::MakeConstSpan(&reach, 1), &found);
  if (!found.empty()) *words = std::move(found[0].words);
  if (log_) {
    std::string ranges = "[";
    for (const PointerTables::Window& w : windows) {
      if (ranges.size() > 1) ranges.push_back(',');
      absl::StrAppend(&ranges, "[", w.start - table.base, ",", w.end - w.start, "]");
    }
    ranges.push_back(']');
    log_(JsonLine()
             .Str("type", "table_read_back")
             .Uint("id", table.id)
             .Uint("bytes", bytes)
             .Raw("ranges", ranges)
             .Str("waited", waited)
             .Uint("entries", words->size())
             .Finish());
  }
  return true;
}

bool TableReader::ReadUntracked(uint64_t addr, CUstream stream, std::vector<uint64_t>* words) {
  if (!memory_) return false;  // uncapped runs never wait on the program's behalf
  // The allocation holding the table, as stensor or else the driver knows it.
  uint64_t start = 0, bytes = 0;
  bool host = false;
  if (std::optional<std::pair<uint64_t, uint64_t>> pinned = pinned_->AllocationAt(addr)) {
    std::tie(start, bytes) = *pinned;
    host = true;
  }
  if (!host) {
    CUdeviceptr base = 0;
    size_t size = 0;
    unsigned type = 0;
    if (driver_->cuPointerGetAttribute == nullptr ||
        driver_->cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, addr) !=
            CUDA_SUCCESS ||
        driver_->cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, addr) !=
            CUDA_SUCCESS ||
        driver_->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr) !=
            CUDA_SUCCESS) {
      return false;  // memory nobody knows
    }
    start = base;
    bytes = size;
    host = type == CU_MEMORYTYPE_HOST;
  }
  // The kernel may index from the start of the allocation.
  if (bytes == 0 || bytes > kMaxTableReadBack) return false;
  if (!WaitForTableWriters(stream)) return false;
  std::vector<uint64_t> data(bytes / 8);
  if (host) {
    // Device-mapped host memory (unified addressing: the same address).
    std::memcpy(data.data(), reinterpret_cast<const void*>(start), data.size() * 8);
  } else if (driver_->cuMemcpyDtoH_v2(data.data(), start, data.size() * 8) != CUDA_SUCCESS) {
    return false;
  }
  // Only the words that hit a buffer become references (add_refs).
  words->insert(words->end(), data.begin(), data.end());
  return true;
}

}  // namespace stensor
