#include "policy/access_profile.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace stensor {

size_t AccessProfile::Builder::Add(uint64_t key, absl::Span<const BufferTouch> buffers) {
  ProfiledOp op;
  op.key = key;
  op.buffers.assign(buffers.begin(), buffers.end());
  ops_.push_back(std::move(op));
  return ops_.size() - 1;
}

absl::Status AccessProfile::Builder::SetComputeSeconds(size_t phase, double seconds) {
  if (phase >= ops_.size()) {
    return absl::OutOfRangeError(absl::StrCat("AccessProfile: phase ", phase, " not profiled (",
                                              ops_.size(), " operations)"));
  }
  if (!std::isfinite(seconds) || seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AccessProfile: compute time ", seconds,
                                                   " s of phase ", phase,
                                                   " is not a finite value >= 0"));
  }
  ops_[phase].compute_seconds = seconds;
  return absl::OkStatus();
}

absl::StatusOr<AccessProfile> AccessProfile::Builder::Build(Bandwidth bandwidth,
                                                            Options options) && {
  if (ops_.empty()) {
    return absl::FailedPreconditionError("AccessProfile: no operation was profiled");
  }
  const auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (!positive(bandwidth.h2d) || !positive(bandwidth.d2h)) {
    return absl::InvalidArgumentError(absl::StrCat("AccessProfile: bandwidth h2d=", bandwidth.h2d,
                                                   " d2h=", bandwidth.d2h,
                                                   " bytes/s; both must be finite and > 0"));
  }
  if (!std::isfinite(options.unknown_compute_seconds) || options.unknown_compute_seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AccessProfile: unknown_compute_seconds ",
                                                   options.unknown_compute_seconds,
                                                   " is not a finite value >= 0"));
  }
  AccessProfile p;
  p.bandwidth_ = bandwidth;
  p.ops_ = std::move(ops_);
  const size_t n = p.ops_.size();
  p.compute_.resize(n);
  p.bytes_.resize(n);
  p.prefix_.resize(n + 1);
  p.prefix_[0] = 0;
  absl::flat_hash_set<uint64_t> ids;
  for (size_t i = 0; i < n; ++i) {
    const ProfiledOp& op = p.ops_[i];
    if (op.compute_seconds < 0) {
      p.compute_[i] = options.unknown_compute_seconds;
      ++p.unknown_phases_;
    } else {
      p.compute_[i] = op.compute_seconds;
    }
    // A buffer passed twice (as input and output) moves once.
    ids.clear();
    uint64_t u = 0;
    for (const BufferTouch& b : op.buffers) {
      if (ids.insert(b.id).second) {
        u += b.bytes;
        p.uses_[b.id].push_back(static_cast<uint32_t>(i));
      }
    }
    p.bytes_[i] = u;
    p.prefix_[i + 1] = p.prefix_[i] + p.compute_[i];
  }
  return p;
}

double AccessProfile::ComputeBetweenPhases(size_t from, size_t to) const {
  const size_t n = period();
  from %= n;
  to %= n;
  if (from <= to) return prefix_[to] - prefix_[from];
  return prefix_[n] - prefix_[from] + prefix_[to];
}

uint64_t AccessProfile::GapAfter(uint64_t id, size_t phase) const {
  auto it = uses_.find(id);
  if (it == uses_.end()) return 0;
  const std::vector<uint32_t>& at = it->second;  // ascending
  auto use = std::lower_bound(at.begin(), at.end(), phase);
  if (use == at.end() || *use != phase) return 0;
  if (use + 1 != at.end()) return *(use + 1) - phase;
  return period() - phase + at.front();  // the next iteration's first
}

size_t AccessProfile::PhaseAt(uint64_t origin, uint64_t time) const {
  const uint64_t n = period();
  if (time >= origin) return static_cast<size_t>((time - origin) % n);
  const uint64_t back = (origin - time) % n;
  return static_cast<size_t>(back == 0 ? 0 : n - back);
}

double AccessProfile::ComputeBetweenTimes(uint64_t origin, uint64_t from, uint64_t to) const {
  if (to <= from) return 0;
  const uint64_t n = period();
  const uint64_t span = to - from;
  const double whole = static_cast<double>(span / n) * prefix_[n];
  const size_t start = PhaseAt(origin, from);
  return whole + ComputeBetweenPhases(start, start + span % n);
}

}  // namespace stensor
