#include "policy/eviction_policy.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"

namespace stensor {
namespace {

// The baseline: least recently used first, and every swap-out copies, since
// without version control nothing tells that the host copy is current.
class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  EvictionKey Key(const EvictionCandidate& c) const override { return {0, c.last_use, 0}; }
  bool Copies(const EvictionCandidate&) const override { return true; }
  std::vector<Eviction> Choose(absl::Span<const EvictionCandidate> candidates,
                               uint64_t needed) const override {
    return ChooseInKeyOrder(*this, candidates, needed);
  }
};

// Tensor version control: a clean buffer frees its bytes without a transfer
// (S403), so all of them go before any dirty one, however recently used; the
// dirty ones follow least recently used first and are copied (S405).
class VersionPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "version"; }
  EvictionKey Key(const EvictionCandidate& c) const override {
    return {c.clean() ? 0u : 1u, c.last_use, 0};
  }
  bool Copies(const EvictionCandidate& c) const override { return !c.clean(); }
  std::vector<Eviction> Choose(absl::Span<const EvictionCandidate> candidates,
                               uint64_t needed) const override {
    return ChooseInKeyOrder(*this, candidates, needed);
  }
};

// Belady's rule on predicted next uses: what is needed last (or never, as far
// as anything predicts) goes first; at equal distance a clean buffer costs no
// transfer; then the least recently used. kNoNextUse - next_use turns
// "farthest" into "smallest key". Without a predicted time, buffers of a
// sequence (kInSequence) go before those nothing predicts.
class BeladyPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "belady"; }
  EvictionKey Key(const EvictionCandidate& c) const override {
    const uint64_t dirty = c.clean() ? 0u : 1u;
    if (c.next_use_is_time()) {
      // At least 2^63: after everything that has no predicted time.
      return {EvictionCandidate::kNoNextUse - c.next_use, dirty, c.last_use};
    }
    if (c.next_use == EvictionCandidate::kNoNextUse) return {1, dirty, c.last_use};
    // In a sequence: before anything unknown (a buffer nothing predicts
    // may be needed next; this one is needed after the rest of its
    // sequence), the last written first.
    return {0, dirty, EvictionCandidate::kNoNextUse - c.next_use};
  }
  bool Copies(const EvictionCandidate& c) const override { return !c.clean(); }
  bool RanksByNextUse() const override { return true; }
  bool ServeRatherThanFetch(uint64_t next_use, const EvictionCandidate& displaced) const override {
    // Only between predicted times: an unknown next use may be the next
    // operation, and a displaced buffer never used again is the one to go.
    return next_use < EvictionCandidate::kInSequence && displaced.next_use_is_time() &&
           next_use >= displaced.next_use;
  }
  std::vector<Eviction> Choose(absl::Span<const EvictionCandidate> candidates,
                               uint64_t needed) const override {
    return ChooseInKeyOrder(*this, candidates, needed);
  }
};

}  // namespace

std::vector<Eviction> ChooseInKeyOrder(const EvictionPolicy& policy,
                                       absl::Span<const EvictionCandidate> candidates,
                                       uint64_t needed) {
  std::vector<Eviction> evictions;
  if (needed == 0 || candidates.empty()) return evictions;
  // (key, id, index): the id breaks ties so that the same candidates always
  // give the same evictions, whatever order the caller listed them in; the
  // index only matters for duplicate ids (a caller bug).
  using OrderKey = std::tuple<EvictionKey, uint64_t, size_t>;
  std::vector<OrderKey> order;
  order.reserve(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    order.emplace_back(policy.Key(candidates[i]), candidates[i].id, i);
  }
  std::sort(order.begin(), order.end());
  // Counting down what is still missing cannot overflow.
  uint64_t missing = needed;
  absl::flat_hash_set<uint64_t> taken;  // no id twice, even if listed twice
  for (const OrderKey& key : order) {
    const EvictionCandidate& c = candidates[std::get<2>(key)];
    if (!taken.insert(c.id).second) continue;
    evictions.push_back(Eviction{c.id, policy.Copies(c)});
    missing -= std::min(missing, c.bytes);
    if (missing == 0) break;
  }
  return evictions;
}

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }

std::unique_ptr<EvictionPolicy> MakeVersionPolicy() { return std::make_unique<VersionPolicy>(); }

std::unique_ptr<EvictionPolicy> MakeBeladyPolicy() { return std::make_unique<BeladyPolicy>(); }

}  // namespace stensor
