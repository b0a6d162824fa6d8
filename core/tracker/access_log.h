// AccessLog: the JSON Lines access log (STENSOR_ACCESS_LOG; the schema is in
// docs/access-log.md). Hooks hand it finished lines; a background thread
// writes them, so the hot path only appends to a queue. Nothing is dropped
// silently: a line that cannot be written is counted, and the final record
// reports the count.
//
// What is written reaches the file within kFlushInterval, so a process that
// ends abruptly loses at most its last fraction of a second. The queue holds
// at most kMaxQueued lines: past that, Append waits for the writer (back-
// pressure: a program that logs faster than the disk takes it slows down
// rather than growing without bound or losing records).
//
// Thread-safety: Append may be called from any thread; Close once, after
// which further lines are counted as dropped.
#ifndef STENSOR_CORE_TRACKER_ACCESS_LOG_H_
#define STENSOR_CORE_TRACKER_ACCESS_LOG_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/base/mutex.h"

namespace stensor {

class AccessLog {
 public:
  static constexpr size_t kMaxQueued = size_t{1} << 16;
  static constexpr int kFlushIntervalMs = 100;

  // Opens (truncates) `path` and starts the writer. A regular file is
  // locked (flock) for the life of the log: AlreadyExists, and the file left
  // as it is, when another process holds it.
  static absl::StatusOr<std::unique_ptr<AccessLog>> Open(const std::string& path);
  ~AccessLog();  // closes if still open

  // Queues one record: a JSON object without the newline.
  void Append(std::string line) ABSL_LOCKS_EXCLUDED(mu_);

  // Writes everything queued, then `final_line` built by `make_final` from
  // the number of lines dropped so far, flushes and stops the writer.
  template <typename MakeFinal>
  void Close(MakeFinal&& make_final) ABSL_LOCKS_EXCLUDED(mu_) {
    StopWriter();
    WriteFinal(make_final(dropped()));
  }

  uint64_t dropped() const ABSL_LOCKS_EXCLUDED(mu_);

  // After Close: one line for the user when records were lost (a full disk,
  // a write error, the file deleted while written), naming the path, how
  // many of how many records and why; "" when the log is whole.
  std::string LossReport() const ABSL_LOCKS_EXCLUDED(mu_);

  // fork(): BeforeFork flushes what the writer wrote and keeps it from
  // writing until AfterFork, so the child inherits no buffered lines (its exit would
  // write them into the parent's log a second time). In the child the log
  // is the parent's: the child never touches it again (no writer thread
  // exists there).
  void BeforeFork();
  void AfterFork();

  // Lines queued and not yet taken by the writer (at most kMaxQueued).
  size_t queued() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  AccessLog(std::FILE* file, std::string path);
  // A write or flush failed with `error` (errno): the first one is kept for
  // LossReport.
  void NoteError(int error) ABSL_LOCKS_EXCLUDED(mu_);
  void Run();
  void StopWriter() ABSL_LOCKS_EXCLUDED(mu_);
  void WriteFinal(const std::string& line);
  // These three: with write_mu_ held.
  void WriteLine(const std::string& line);
  // fflush; the lines written since the last one count as dropped if it fails.
  void Flush();
  void FinishFile();

  std::FILE* file_;
  mutable Mutex mu_;
  std::vector<std::string> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Lines that failed to write or came after Close.
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t appended_ ABSL_GUARDED_BY(mu_) = 0;  // every line offered, the final one too
  int first_error_ ABSL_GUARDED_BY(mu_) = 0;    // errno of the first failed write
  // The file had no name left when it was closed (deleted while written):
  // every line written went with it.
  bool unlinked_ ABSL_GUARDED_BY(mu_) = false;
  const std::string path_;
  // Held while writing to or flushing the FILE, and across fork() (so the
  // child inherits an empty buffer); guards file_.
  std::mutex write_mu_;
  // Written to the FILE but not yet flushed.
  std::atomic<uint64_t> unflushed_{0};
  std::thread writer_;
};

}  // namespace stensor

#endif  // STENSOR_CORE_TRACKER_ACCESS_LOG_H_
