#include "core/access_log.h"

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stensor {

absl::StatusOr<std::unique_ptr<AccessLog>> AccessLog::Open(
    const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "we");
  if (file == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot open access log \"", path, "\": ", std::strerror(errno)));
  }
  return std::unique_ptr<AccessLog>(new AccessLog(file));
}

AccessLog::AccessLog(std::FILE* file) : file_(file) {
  writer_ = std::thread([this] { Run(); });
}

AccessLog::~AccessLog() {
  StopWriter();
  FinishFile();
}

void AccessLog::Append(std::string line) {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    ++dropped_;
    return;
  }
  queue_.push_back(std::move(line));
}

uint64_t AccessLog::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

void AccessLog::Run() {
  std::vector<std::string> batch;
  for (;;) {
    bool stop;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      batch.swap(queue_);
      stop = stopping_ && batch.empty();
    }
    if (stop) return;
    for (const std::string& line : batch) WriteLine(line);
    batch.clear();
  }
}

void AccessLog::StopWriter() {
  {
    absl::MutexLock lock(&mu_);
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
    absl::MutexLock lock(&mu_);
    ++dropped_;
  }
}

void AccessLog::FinishFile() {
  if (file_ == nullptr) return;
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace stensor
