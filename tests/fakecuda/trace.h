// FAKECUDA_TRACE: a timeline of the fake device, written at exit as a Chrome
// trace-event JSON file (ui.perfetto.dev, chrome://tracing). Every stream
// operation is a slice on its stream's track (with the time it was submitted
// and the time it waited for other streams), every timed copy a slice on its
// copy engine's track (the window the engine reserved for it), so that where
// a transfer waited, and for what, can be read off the picture.
//
// Off unless FAKECUDA_TRACE names a file; then cuInit opens it and the exit
// handler writes it. When off, an operation costs a test of its stream's
// track when it is submitted and one of its own record when it runs.
// At most FAKECUDA_TRACE_EVENTS records are kept (later ones are counted and
// dropped, and the file says so), so memory stays bounded.
//
// Thread-safety: every function may be called from any thread (application
// threads, stream workers, exit handlers); the records are guarded by one
// mutex, held only to append. Once the trace is written, later records are
// dropped, so stream workers still running at exit() never touch the file.
#ifndef STENSOR_TESTS_FAKECUDA_TRACE_H_
#define STENSOR_TESTS_FAKECUDA_TRACE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "tests/fakecuda/internal.h"

namespace fakecuda {

namespace trace_internal {
// Set once by StartTrace, before any stream exists; read when a stream is
// made and when a timed copy ends.
inline std::atomic<bool> enabled{false};
}  // namespace trace_internal

inline bool TraceEnabled() { return trace_internal::enabled.load(std::memory_order_relaxed); }

// Nanoseconds on the steady clock, the time base of every record.
int64_t TraceNowNs();

// From cuInit, once: opens GetOptions().trace_path when FAKECUDA_TRACE is
// set. A value that cannot be used (empty, a file that cannot be created) is
// said in one line on stderr and leaves tracing off: the trace is a
// diagnostic and never stops the program.
void StartTrace();

// Writes the trace file and closes it; records after this are dropped. From
// the exit handler, once (later calls do nothing). Failures are said on
// stderr.
void WriteTrace();

// The track of a new stream, named from its handle and kind. Only while
// TraceEnabled().
uint32_t TraceStreamTrack(const void* handle, StreamKind kind, int device);

// The track of the stream whose operation the calling thread is running (a
// stream worker), or 0 elsewhere: copy engine records name the stream they
// served with it.
uint32_t CurrentStreamTrack();
void SetCurrentStreamTrack(uint32_t track);

// The kernel the calling thread runs touched `bytes` of host-located memory
// (host_touch.h), counted by `faults` page faults: its record says so. Read
// and reset by the stream worker once the operation has run
// (TakeHostBytesTouched); cheap when tracing is off.
void NoteHostBytesTouched(size_t bytes, size_t faults);
size_t TakeHostBytesTouched(size_t* faults);

// One operation of the stream whose track is `track`: submitted at
// `enqueued_ns`, at the head of its stream from `ready_ns`, held until
// `start_ns` by dependencies (the last of which was `held_by`'s, 0 if none
// held it), run until `end_ns`.
struct TracedOp {
  uint32_t track = 0;
  uint32_t held_by = 0;
  OpLabel label;
  int64_t enqueued_ns = 0;
  int64_t ready_ns = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};
void TraceStreamOp(const TracedOp& op);

// One copy of `bytes` on `device`'s `link` engine: it reached the engine at
// `reached_ns`, had the window [start_ns, end_ns) and was done at `done_ns`
// (later than end_ns when moving the data overran the window).
void TraceCopyEngine(int device, Link link, size_t bytes, int64_t reached_ns, int64_t start_ns,
                     int64_t end_ns, int64_t done_ns);

}  // namespace fakecuda

#endif  // STENSOR_TESTS_FAKECUDA_TRACE_H_
