// TableReader: what a pointer table holds when device work may have changed
// it since its pointers were known, read when a launch is about to follow
// them. Only its stale ranges are read (and, for a pointer-to-pointer
// parameter into bytes no range covers, the rest of the buffer), after the
// work that could have written them and no more: the events the tables
// recorded for those writes, else the buffer's writers as the memory
// manager knows them, else everything the launch's stream was given. A
// table in memory stensor does not track (the program's pinned host memory,
// the driver's own allocations) is read whole. Also the waits and marks
// those reads rest on, which the tracker's record of pending host writes
// shares: whether a host wait is allowed now (never while a capture is in
// progress), a wait for a stream, an event after a stream's work so far.
// Under a cap only: uncapped, nothing is read back on the program's behalf.
//
// Thread-safety: any thread; no state of its own (the tables, the registry
// and the pinned memory it reads each have their own lock).
#ifndef STENSOR_CORE_TRACKER_TABLE_READER_H_
#define STENSOR_CORE_TRACKER_TABLE_READER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/driver/driver.h"
#include "core/inference/buffer_registry.h"
#include "core/inference/capture.h"
#include "core/inference/pointer_tables.h"
#include "core/swap/memory_manager.h"
#include "core/tracker/pinned_host.h"

namespace stensor {

class TableReader {
 public:
  // `memory`: the manager of the cap, or null without one. `log`: takes an
  // access-log record (a table_read_back), or empty without a log. The
  // others outlive the reader.
  TableReader(const Driver* driver, MemoryManager* memory, const CaptureState* capture,
              PointerTables* tables, const BufferRegistry* registry, const PinnedHost* pinned,
              std::function<void(std::string)> log);

  // The stale ranges `stale` of `table` (and a window from `learn_from` to
  // the end of the buffer, when not 0: a pointer-to-pointer parameter into
  // bytes no range covers) read back, after the work that could have written
  // them; the tables learn them, and `words` gets the table's entries at
  // and after `from`. False when that cannot be done (no cap, too large, a
  // wait not allowed or failed, the table freed meanwhile).
  bool ReadBack(const Buffer& table, const std::vector<PointerTables::StaleRange>& stale,
                uint64_t learn_from, uint64_t from, CUstream stream, std::vector<uint64_t>* words);
  // The words of the allocation at `addr` that a kernel reads as a table
  // though stensor does not track it (pinned or registered host memory,
  // untracked device memory), after the stream's earlier work. False when
  // nobody can say what memory that is.
  bool ReadUntracked(uint64_t addr, CUstream stream, std::vector<uint64_t>* words);

  // Whether a host wait on the program's behalf is allowed now: no capture
  // in progress anywhere, and `stream` not capturing (a failed query: no).
  bool MayWait(CUstream stream);
  // Waits for the work submitted to `stream` so far, where that is allowed.
  bool WaitForStream(CUstream stream);
  // A mark for the pointer tables and the pending host writes: an event
  // recorded on `stream` now (after what was submitted there), or
  // AnyWriter() when none can be recorded (or no cap needs one).
  PointerTables::Mark MarkAfter(CUstream stream);
  // Whether a mark's work is known complete (AnyWriter() never is).
  bool MarkDone(const PointerTables::Mark& mark) const;
  // True when nothing is queued on `stream` nor on what it waits for
  // implicitly (the legacy stream); false when that cannot be told.
  bool StreamIdle(CUstream stream);

 private:
  // Waits for the work that may have written a table read by an operation
  // about to be submitted on `stream`.
  bool WaitForTableWriters(CUstream stream);
  // Waits for what could have written `stale` (ranges of `table`) since it
  // was learnt: the events of its marks, or (writers unknown, or an event
  // wait failed) WaitForBufferWriters. Sets `waited` to what it waited for.
  bool WaitForRangeWriters(const Buffer& table, const std::vector<PointerTables::StaleRange>& stale,
                           CUstream stream, const char** waited);
  // Waits for every operation that may have written buffer `id`: the
  // streams that used it and the work of unknown accesses (the memory
  // manager's record), or where that record cannot tell, WaitForTableWriters.
  // Sets `waited` to "buffer" or "stream".
  bool WaitForBufferWriters(uint64_t id, CUstream stream, const char** waited);

  const Driver* const driver_;
  MemoryManager* const memory_;
  const CaptureState* const capture_;
  PointerTables* const tables_;
  const BufferRegistry* const registry_;
  const PinnedHost* const pinned_;
  const std::function<void(std::string)> log_;
};

}  // namespace stensor

#endif  // STENSOR_CORE_TRACKER_TABLE_READER_H_
