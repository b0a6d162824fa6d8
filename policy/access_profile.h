// AccessProfile: the S02 profile of one training iteration. Per operation
// (phase 0..period-1): its key, the buffers it touches, its compute time `c`
// (measured by the caller with events while profiling), the bytes `u` it
// touches and the transfer times `t = u / beta` per direction. Prefix sums make
// "compute seconds between two phases or two logical times" O(1); that is
// what the prefetch planner asks to decide how early a fetch must start.
//
// Built once with AccessProfile::Builder (the caller adds operations as the
// profiled iteration runs and fills in compute times when their events
// complete), then immutable.
//
// Thread-safety: a built AccessProfile is immutable and may be read from any
// thread; the Builder is not thread-safe.
#ifndef STENSOR_POLICY_ACCESS_PROFILE_H_
#define STENSOR_POLICY_ACCESS_PROFILE_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace stensor {

// Host<->device link bandwidth per direction, bytes per second (from the
// caller's pinned-copy probe or STENSOR_BANDWIDTH). Both must be > 0.
struct Bandwidth {
  double h2d = 0;
  double d2h = 0;
};

// One buffer an operation touches, in argument order (the index in the list
// is the "slot" the next-use predictor learns from).
struct BufferTouch {
  uint64_t id = 0;
  uint64_t bytes = 0;
  bool write = false;
  // Where the operation names it first (its argument order), or kAtIndex:
  // where it is among the operation's touches. What the next-use predictor
  // learns per slot: an argument's place, unlike a touch's index, does not
  // shift when another argument is not a buffer the caller tracks.
  uint32_t position = kAtIndex;
  static constexpr uint32_t kAtIndex = UINT32_MAX;
};

// Appends `touch` to an operation's `touches` and returns its index; with
// `shared` (a piece of an allocation, planned under the allocation's id)
// merges it into the touch of the same id instead, a write winning. An
// allocation's pieces are neighbours in an operation's ids, so the last
// touch is looked at first: a launch naming hundreds of pieces searches
// once per allocation, and one naming whole buffers never.
template <typename Touches>
size_t AddTouch(Touches* touches, const BufferTouch& touch, bool shared) {
  size_t t = touches->size();
  if (shared) {
    if (t > 0 && (*touches)[t - 1].id == touch.id) {
      --t;
    } else {
      t = 0;
      while (t < touches->size() && (*touches)[t].id != touch.id) ++t;
    }
  }
  if (t == touches->size()) {
    touches->push_back(touch);
  } else {
    (*touches)[t].write = (*touches)[t].write || touch.write;
  }
  return t;
}

struct ProfiledOp {
  uint64_t key = 0;
  std::vector<BufferTouch> buffers;
  // Seconds of device compute; kUnknownSeconds when no measurement arrived
  // (the profile then uses Options::unknown_compute_seconds).
  double compute_seconds = kUnknownSeconds;
  static constexpr double kUnknownSeconds = -1.0;
};

class AccessProfile {
 public:
  struct Options {
    // Compute time assumed for an operation without a measurement. 0 is the
    // safe default: the planner then assumes no compute hides a transfer
    // and fetches as early as memory allows, never too late.
    double unknown_compute_seconds = 0.0;
  };

  class Builder {
   public:
    // Appends the next operation of the profiled iteration; returns its
    // phase. Buffers are copied.
    size_t Add(uint64_t key, absl::Span<const BufferTouch> buffers);
    // Sets the compute time of phase `phase` (an event pair completed).
    // Rejects an unknown phase and negative or non-finite seconds.
    absl::Status SetComputeSeconds(size_t phase, double seconds);
    size_t size() const { return ops_.size(); }
    // Rejects an empty iteration and a bandwidth that is not > 0 and finite.
    absl::StatusOr<AccessProfile> Build(Bandwidth bandwidth, Options options) &&;
    absl::StatusOr<AccessProfile> Build(Bandwidth bandwidth) && {
      return std::move(*this).Build(bandwidth, Options{});
    }

   private:
    std::vector<ProfiledOp> ops_;
  };

  size_t period() const { return ops_.size(); }
  const Bandwidth& bandwidth() const { return bandwidth_; }
  const ProfiledOp& op(size_t phase) const { return ops_[phase]; }
  // `c` of a phase (the default applied where it was unknown).
  double compute_seconds(size_t phase) const { return compute_[phase]; }
  // `u`: bytes of the distinct buffers the phase touches.
  uint64_t bytes(size_t phase) const { return bytes_[phase]; }
  // `t = u / beta` of a phase, per direction.
  double h2d_seconds(size_t phase) const { return bytes_[phase] / bandwidth_.h2d; }
  double d2h_seconds(size_t phase) const { return bytes_[phase] / bandwidth_.d2h; }
  // Transfer time of any number of bytes.
  double H2dSeconds(uint64_t bytes) const { return bytes / bandwidth_.h2d; }
  double D2hSeconds(uint64_t bytes) const { return bytes / bandwidth_.d2h; }
  double iteration_compute_seconds() const { return prefix_.back(); }
  // Phases whose compute time was not measured.
  size_t unknown_phases() const { return unknown_phases_; }

  // Compute seconds of the phases from `from` up to, not including, `to`,
  // wrapping past the end of the iteration; from == to gives 0. O(1).
  // Phases are taken modulo period().
  double ComputeBetweenPhases(size_t from, size_t to) const;
  // Compute seconds of the operations at logical times [from, to), where the
  // operation at logical time `origin` has phase 0 (times before origin
  // count from the phase they would have). to <= from gives 0. O(1).
  double ComputeBetweenTimes(uint64_t origin, uint64_t from, uint64_t to) const;
  // Phase of logical time `time` given that `origin` has phase 0.
  size_t PhaseAt(uint64_t origin, uint64_t time) const;
  // Operations from `phase`, which touches buffer `id`, to the buffer's
  // next touch (period() for one touched once an iteration); 0 when the
  // profiled iteration does not touch `id` at `phase`. O(log touches).
  uint64_t GapAfter(uint64_t id, size_t phase) const;

 private:
  AccessProfile() = default;
  std::vector<ProfiledOp> ops_;
  std::vector<double> compute_;
  std::vector<uint64_t> bytes_;
  std::vector<double> prefix_;  // prefix_[i] = sum of compute_[0..i)
  Bandwidth bandwidth_;
  size_t unknown_phases_ = 0;
  // Each buffer's phases, ascending.
  absl::flat_hash_map<uint64_t, std::vector<uint32_t>> uses_;
};

}  // namespace stensor

#endif  // STENSOR_POLICY_ACCESS_PROFILE_H_
