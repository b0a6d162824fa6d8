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

struct StreamUse {
  CUstream stream = nullptr;
  // For a per-thread stream (one handle, a stream of each thread's own):
  // the using thread's tag (ThreadTag), so that two threads' uses never
  // share an entry; 0 for every other stream.
  uint64_t thread = 0;
  int device = 0;           // whose context ran it
  CUevent event = nullptr;  // null when it could not be created
  // The context `event` was made in (null when unknown): the event ends
  // with it (MemoryManager::AfterContextEnds).
  CUcontext context = nullptr;
  // Whether `event` marks the latest use. False when recording failed: then
  // only a wait for the swap stream or for the whole context tells.
  bool recorded = false;
  bool done = false;  // observed complete: no need to ask again
  uint64_t seq = 0;   // bumped at each use, so a wait knows what it saw
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
