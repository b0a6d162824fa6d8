#include "core/tracker/access_log.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace stensor {

absl::StatusOr<std::unique_ptr<AccessLog>> AccessLog::Open(const std::string& path) {
  auto failure = [&path](int error) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open access log \"", path, "\": ", std::strerror(error)));
  };
  // Truncated only once this process holds the file's lock: another process
  // writing the same path (STENSOR_ACCESS_LOG without %r or %p) keeps its
  // log whole. A file system without flock leaves the file unlocked.
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return failure(errno);
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      close(fd);
      return absl::AlreadyExistsError(
          absl::StrCat("access log \"", path, "\" is being written by another process"));
    }
    if (ftruncate(fd, 0) != 0) {
      const int error = errno;
      close(fd);
      return failure(error);
    }
  }
  std::FILE* file = fdopen(fd, "w");
  if (file == nullptr) {
    const int error = errno;
    close(fd);
    return failure(error);
  }
  return std::unique_ptr<AccessLog>(new AccessLog(file, path));
}

AccessLog::AccessLog(std::FILE* file, std::string path) : file_(file), path_(std::move(path)) {
  writer_ = std::thread([this] { Run(); });
}

AccessLog::~AccessLog() {
  StopWriter();
  std::lock_guard<std::mutex> lock(write_mu_);
  FinishFile();
}

void AccessLog::WriteFinal(const std::string& line) {
  {
    MutexLock lock(&mu_);
    ++appended_;
  }
  std::lock_guard<std::mutex> lock(write_mu_);
  WriteLine(line);
  FinishFile();
}

void AccessLog::NoteError(int error) {
  MutexLock lock(&mu_);
  if (first_error_ == 0) first_error_ = error != 0 ? error : EIO;
}

std::string AccessLog::LossReport() const {
  MutexLock lock(&mu_);
  if (unlinked_) {
    return absl::StrCat("stensor: the access log \"", path_,
                        "\" (STENSOR_ACCESS_LOG) was deleted while it was written: its ", appended_,
                        " records are lost");
  }
  if (dropped_ == 0) return "";
  return absl::StrCat("stensor: the access log \"", path_, "\" (STENSOR_ACCESS_LOG) lost ",
                      dropped_, " of ", appended_, " records",
                      first_error_ != 0 ? absl::StrCat(": ", std::strerror(first_error_)) : "");
}

void AccessLog::Append(std::string line) {
  MutexLock lock(&mu_);
  auto room = [this]()
                  ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closed_ || queue_.size() < kMaxQueued; };
  mu_.Await(absl::Condition(&room));
  ++appended_;
  if (closed_) {
    ++dropped_;
    return;
  }
  queue_.push_back(std::move(line));
}

uint64_t AccessLog::dropped() const {
  MutexLock lock(&mu_);
  return dropped_;
}

void AccessLog::BeforeFork() {
  // Not the FILE's own lock: fork() takes the stdio list lock after this,
  // and an fflush(NULL) on another thread holds that while it waits for
  // each FILE's lock.
  write_mu_.lock();  // waits for a batch being written; released by AfterFork
  Flush();
}

void AccessLog::AfterFork() { write_mu_.unlock(); }

size_t AccessLog::queued() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

void AccessLog::Run() {
  std::vector<std::string> batch;
  auto last_flush = std::chrono::steady_clock::now();
  for (;;) {
    bool stop;
    {
      MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      // Unflushed lines reach the file within the interval even when
      // nothing more comes.
      if (unflushed_.load() > 0) {
        mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(kFlushIntervalMs));
      } else {
        mu_.Await(absl::Condition(&ready));
      }
      batch.swap(queue_);
      stop = stopping_ && batch.empty();
    }
    if (stop) return;
    std::lock_guard<std::mutex> lock(write_mu_);
    if (batch.empty()) {
      Flush();
      last_flush = std::chrono::steady_clock::now();
      continue;
    }
    for (const std::string& line : batch) WriteLine(line);
    batch.clear();
    const auto now = std::chrono::steady_clock::now();
    if (now - last_flush >= std::chrono::milliseconds(kFlushIntervalMs)) {
      Flush();
      last_flush = now;
    }
  }
}

void AccessLog::Flush() {
  if (file_ == nullptr || unflushed_.load() == 0) return;
  const uint64_t lines = unflushed_.exchange(0);
  if (std::fflush(file_) != 0) {
    NoteError(errno);
    MutexLock lock(&mu_);
    dropped_ += lines;
  }
}

void AccessLog::StopWriter() {
  {
    MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    stopping_ = true;
  }
  // The writer drains the queue before it sees stopping_ with nothing left.
  if (writer_.joinable()) writer_.join();
}

void AccessLog::WriteLine(const std::string& line) {
  if (file_ == nullptr) return;
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() ||
      std::fputc('\n', file_) == EOF) {
    NoteError(errno);
    MutexLock lock(&mu_);
    ++dropped_;
    return;
  }
  ++unflushed_;
}

void AccessLog::FinishFile() {
  if (file_ == nullptr) return;
  Flush();
  struct stat st;
  if (fstat(fileno(file_), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 0) {
    MutexLock lock(&mu_);
    unlinked_ = true;
  }
  if (std::fclose(file_) != 0) NoteError(errno);
  file_ = nullptr;
}

}  // namespace stensor
