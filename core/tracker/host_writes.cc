#include "core/tracker/host_writes.h"

#include <algorithm>
#include <utility>

namespace stensor {
namespace {

bool Overlaps(uint64_t a, uint64_t a_bytes, uint64_t b, uint64_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  if (a_bytes == HostWrites::kEverywhere || b_bytes == HostWrites::kEverywhere) return true;
  // Written so that no sum can wrap: each range's last byte against the
  // other's first.
  return a <= b + (b_bytes - 1) && b <= a + (a_bytes - 1);
}

}  // namespace

void HostWrites::Add(uint64_t start, uint64_t bytes, Mark done) {
  if (bytes == 0) return;
  MutexLock lock(&mu_);
  if (writes_.size() >= kMaxPending) {
    DropDone();
    if (writes_.size() >= kMaxPending) {
      // Too many in flight to follow one by one: anywhere, for good.
      writes_.clear();
      writes_.push_back({0, kEverywhere, nullptr});
      Publish();
      return;
    }
  }
  writes_.push_back({start, bytes, std::move(done)});
  Publish();
}

bool HostWrites::MayWrite(uint64_t start, uint64_t bytes) {
  if (escaped()) return true;
  if (empty() || bytes == 0) return false;
  MutexLock lock(&mu_);
  bool may = false;
  for (size_t i = 0; i < writes_.size();) {
    if (!Overlaps(writes_[i].start, writes_[i].bytes, start, bytes)) {
      ++i;
      continue;
    }
    if (!Done(writes_[i])) {
      may = true;
      break;
    }
    writes_[i] = std::move(writes_.back());
    writes_.pop_back();
  }
  Publish();
  return may;
}

size_t HostWrites::pending() const {
  MutexLock lock(&mu_);
  return writes_.size();
}

bool HostWrites::Done(const Write& w) const { return w.done != nullptr && done_ && done_(w.done); }

void HostWrites::DropDone() {
  writes_.erase(
      std::remove_if(writes_.begin(), writes_.end(),
                     [this](const Write& w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return Done(w); }),
      writes_.end());
}

void HostWrites::Publish() { count_.store(writes_.size(), std::memory_order_release); }

}  // namespace stensor
