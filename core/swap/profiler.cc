#include "core/swap/profiler.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stensor {
namespace {

absl::Status DriverError(const char* call, CUresult r) {
  return absl::InternalError(absl::StrCat("bandwidth probe: ", call, " failed (", r, ")"));
}

}  // namespace

absl::StatusOr<Bandwidth> Profiler::MeasureBandwidth(const Config& config, const Driver* driver,
                                                     uint64_t probe_bytes) {
  if (!config.bandwidth.measured()) {
    return Bandwidth{config.bandwidth.h2d_mbps * 1e6, config.bandwidth.d2h_mbps * 1e6};
  }
  const Driver& d = *driver;
  if (d.cuMemAlloc_v2 == nullptr || d.cuMemFree_v2 == nullptr || d.cuMemAllocHost_v2 == nullptr ||
      d.cuMemFreeHost == nullptr || d.cuStreamCreate == nullptr ||
      d.cuStreamDestroy_v2 == nullptr || d.cuMemcpyHtoDAsync_v2 == nullptr ||
      d.cuMemcpyDtoHAsync_v2 == nullptr || d.cuStreamSynchronize == nullptr) {
    return absl::UnavailableError("bandwidth probe: the driver lacks a needed entry point");
  }
  CUdeviceptr device = 0;
  void* host = nullptr;
  CUstream stream = nullptr;
  absl::Status status;
  Bandwidth result;
  // One copy in each direction warms the pages and the engines; the best of
  // the timed ones is what the link can do.
  constexpr int kTimed = 3;
  if (CUresult r = d.cuMemAlloc_v2(&device, probe_bytes); r != CUDA_SUCCESS) {
    device = 0;
    status = DriverError("cuMemAlloc", r);
  } else if (CUresult r = d.cuMemAllocHost_v2(&host, probe_bytes); r != CUDA_SUCCESS) {
    host = nullptr;
    status = DriverError("cuMemAllocHost", r);
  } else if (CUresult r = d.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS) {
    stream = nullptr;
    status = DriverError("cuStreamCreate", r);
  } else {
    double best[2] = {0, 0};
    for (int i = 0; i <= kTimed && status.ok(); ++i) {
      for (int dir = 0; dir < 2 && status.ok(); ++dir) {
        auto start = std::chrono::steady_clock::now();
        CUresult r = dir == 0 ? d.cuMemcpyHtoDAsync_v2(device, host, probe_bytes, stream)
                              : d.cuMemcpyDtoHAsync_v2(host, device, probe_bytes, stream);
        if (r == CUDA_SUCCESS) r = d.cuStreamSynchronize(stream);
        if (r != CUDA_SUCCESS) {
          status = DriverError(dir == 0 ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync", r);
          break;
        }
        double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (i > 0 && seconds > 0) {
          best[dir] = std::max(best[dir], static_cast<double>(probe_bytes) / seconds);
        }
      }
    }
    result = Bandwidth{best[0], best[1]};
  }
  // Frees what was made whatever failed; a failure here is not the probe's.
  if (stream != nullptr) d.cuStreamDestroy_v2(stream);
  if (host != nullptr) d.cuMemFreeHost(host);
  if (device != 0) d.cuMemFree_v2(device);
  if (!status.ok()) return status;
  if (result.h2d <= 0 || result.d2h <= 0) {
    return absl::InternalError("bandwidth probe: copies took no measurable time");
  }
  return result;
}

Profiler::~Profiler() {
  MutexLock lock(&mu_);
  for (Timing& t : timings_) GivePair(&t);
  for (auto& [start, stop] : spare_) {
    driver_->cuEventDestroy_v2(start);
    driver_->cuEventDestroy_v2(stop);
  }
}

bool Profiler::TakePair(Timing* t) {
  if (!spare_.empty()) {
    std::tie(t->start, t->stop) = spare_.back();
    spare_.pop_back();
    return true;
  }
  if (driver_->cuEventCreate == nullptr || driver_->cuEventDestroy_v2 == nullptr) return false;
  // Timing events (no CU_EVENT_DISABLE_TIMING).
  if (driver_->cuEventCreate(&t->start, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
    t->start = nullptr;
    return false;
  }
  if (driver_->cuEventCreate(&t->stop, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
    driver_->cuEventDestroy_v2(t->start);
    t->start = t->stop = nullptr;
    return false;
  }
  return true;
}

void Profiler::DropPair(Timing* t) {
  // A destroy that fails leaks one event; nothing depends on it any more.
  if (t->start != nullptr) (void)driver_->cuEventDestroy_v2(t->start);
  if (t->stop != nullptr) (void)driver_->cuEventDestroy_v2(t->stop);
  *t = Timing{};
}

void Profiler::GivePair(Timing* t) {
  if (t->start != nullptr) spare_.emplace_back(t->start, t->stop);
  *t = Timing{};
}

int Profiler::BeginTiming(CUstream stream) {
  if (driver_->cuEventRecord == nullptr || driver_->cuEventQuery == nullptr ||
      driver_->cuEventElapsedTime_v2 == nullptr) {
    return -1;
  }
  MutexLock lock(&mu_);
  Timing t;
  if (!TakePair(&t)) return -1;
  if (driver_->cuEventRecord(t.start, stream) != CUDA_SUCCESS) {
    // Not kept for reuse: the driver may have lost them (their context
    // ended); the next timing creates a pair in the current one.
    DropPair(&t);
    return -1;
  }
  int token;
  if (!free_slots_.empty()) {
    token = free_slots_.back();
    free_slots_.pop_back();
    timings_[token] = t;
  } else {
    token = static_cast<int>(timings_.size());
    timings_.push_back(t);
  }
  order_.push_back(token);
  open_.store(order_.size(), std::memory_order_release);
  return token;
}

void Profiler::EndTiming(int token, CUstream stream, uint64_t op, bool submitted) {
  if (token < 0) return;
  MutexLock lock(&mu_);
  Timing& t = timings_[token];
  t.op = op;
  t.state = submitted && driver_->cuEventRecord(t.stop, stream) == CUDA_SUCCESS
                ? Timing::State::kRecorded
                : Timing::State::kAbandoned;
}

std::vector<std::pair<uint64_t, double>> Profiler::TakeCompleted() {
  std::vector<std::pair<uint64_t, double>> done;
  if (open_.load(std::memory_order_acquire) == 0) return done;
  MutexLock lock(&mu_);
  size_t kept = 0;
  for (size_t i = 0; i < order_.size(); ++i) {
    const int token = order_[i];
    Timing& t = timings_[token];
    bool finished = false;
    if (t.state == Timing::State::kAbandoned) {
      finished = true;  // nothing to wait for, nothing to report
    } else if (t.state == Timing::State::kRecorded) {
      CUresult r = driver_->cuEventQuery(t.stop);
      if (r == CUDA_SUCCESS) {
        float ms = 0;
        if (driver_->cuEventElapsedTime_v2(&ms, t.start, t.stop) == CUDA_SUCCESS && ms >= 0) {
          done.emplace_back(t.op, ms / 1e3);
        }
        finished = true;
      } else if (r != CUDA_ERROR_NOT_READY) {
        finished = true;  // an event the driver lost: drop the timing
        DropPair(&t);     // and the pair
      }
    }
    if (finished) {
      GivePair(&t);
      free_slots_.push_back(token);
    } else {
      order_[kept++] = token;
    }
  }
  order_.resize(kept);
  open_.store(kept, std::memory_order_release);
  return done;
}

size_t Profiler::pending() const {
  MutexLock lock(&mu_);
  return order_.size();
}

}  // namespace stensor
