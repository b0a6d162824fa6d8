// StreamUse: the last use of a buffer (or, for work of unknown accesses, of
// a device) on one stream, as an event recorded after it, and what has been
// observed of it. A use on one stream says nothing about another, so a
// buffer keeps one per stream that used it; a swap's copy is a use on the
// swap stream. The functions below record, observe and wait for uses; what
// to wait for, and when, is the manager's decision.
//
// Thread-safety: none; the manager records and observes uses under its
// mutex, and waits (WaitForStreamUse) on a copy without it.
#ifndef STENSOR_CORE_SWAP_STREAM_USE_H_
#define STENSOR_CORE_SWAP_STREAM_USE_H_

#include <cstdint>
#include <vector>

#include "core/driver/driver.h"
#include "core/swap/vmm.h"

namespace stensor {

// An event recorded on one stream after an operation, shared by the uses
// of all the operation's buffers there (one record per operation rather
// than one per buffer). Recorded again for a later operation on the same
// stream once its record was seen complete, or, when its stream has
// MemoryManager::kMaxMarksPerStream records in flight, before: a use
// holding an older record (`StreamUse::mark_gen` behind `gen`) is then
// known done once a record at least as new completed (`completed_gen`),
// which on one stream happens after its own: later than needed, never
// earlier. A use may also be noted ahead of the record that covers it
// (`mark_gen` past `recorded_gen`, MemoryManager::MarkOperation): no event
// tells of it until that record is made.
struct StreamMark {
  CUevent event = nullptr;
  CUcontext context = nullptr;  // `event` was made in it and ends with it
  uint64_t gen = 0;             // records tried or noted ahead so far
  uint64_t recorded_gen = 0;    // the latest the driver took
  uint64_t completed_gen = 0;   // the latest seen complete
  bool in_flight() const { return completed_gen < recorded_gen; }
};

struct StreamUse {
  CUstream stream = nullptr;
  // For a per-thread stream (one handle, a stream of each thread's own):
  // the using thread's tag (ThreadTag), so that two threads' uses never
  // share an entry; 0 for every other stream.
  uint64_t thread = 0;
  int device = 0;  // whose context ran it
  // What marks the use: `own` (made for this entry, re-recorded at each
  // use) or `mark`'s event (record number `mark_gen`). Null when it could
  // not be created.
  CUevent event = nullptr;
  CUevent own = nullptr;  // destroyed with the entry
  StreamMark* mark = nullptr;
  uint64_t mark_gen = 0;
  // The context `event` was made in (null when unknown): the event ends
  // with it (MemoryManager::AfterContextEnds).
  CUcontext context = nullptr;
  // Whether `event` marks the latest use. False when recording failed: then
  // only a wait for the swap stream or for the whole context tells.
  bool recorded = false;
  bool done = false;  // observed complete: no need to ask again
  uint64_t seq = 0;   // bumped at each use, so a wait knows what it saw
  // The manager's pass over its journal that last set it (OperationJournal):
  // applied newest first, an older use on the same stream is not applied.
  uint64_t journal_pass = 0;
};

// The calling thread's tag for StreamUse::thread: unique in the process,
// never 0.
uint64_t ThreadTag();

// Whether `a` and `b` are the entries of one stream (of one thread).
inline bool SameStream(const StreamUse& a, const StreamUse& b) {
  return a.stream == b.stream && a.thread == b.thread;
}

// A use now on `stream` (in `device`'s context): the entry for that stream
// in `*uses` (added if none) gets a new sequence number and its event
// recorded there (created once and reused). A failed create or record,
// counted through `vmm`, leaves it unrecorded.
void RecordStreamUse(const Vmm& vmm, std::vector<StreamUse>* uses, CUstream stream, int device);

// Whether the use is known complete: a recorded event whose query says so
// (remembered). A query that fails is no observation.
bool ObservedComplete(const Driver& driver, StreamUse& use);

// A host wait for the use: its event; else the swap stream (nothing on it
// waits for the program's work, so waiting for all of it is finite) when it
// is a use there; else the whole context of its device, which must be
// current (a per-thread stream handle names another stream per thread).
CUresult WaitForStreamUse(const Driver& driver, const StreamUse& use, CUstream swap_stream);

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_STREAM_USE_H_
