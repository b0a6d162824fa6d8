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

// Sort key of one candidate: policies differ only in `rank`, which groups
// candidates before last_use is compared (0 for everything under LRU; clean
// before dirty under `version`). The id breaks last_use ties so that the
// same candidates always give the same evictions, whatever order the caller
// listed them in; the index only matters for duplicate ids (a caller bug)
// and keeps even that case deterministic.
using OrderKey = std::tuple<int, uint64_t, uint64_t, size_t>;

// Takes candidates in ascending key order until their bytes cover `needed`,
// or all of them when they do not. `copy_clean` is false when a clean
// buffer's device copy may simply be dropped (S403) and true when every
// eviction must copy (S405 without version control).
template <typename RankFn>
std::vector<Eviction> TakeInOrder(
    absl::Span<const EvictionCandidate> candidates, uint64_t needed,
    RankFn rank, bool copy_clean) {
  std::vector<Eviction> evictions;
  if (needed == 0 || candidates.empty()) return evictions;

  // Sorting keys rather than indices with a comparator that recomputes them
  // keeps each comparison a plain tuple compare.
  std::vector<OrderKey> order;
  order.reserve(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    const EvictionCandidate& c = candidates[i];
    order.emplace_back(rank(c), c.last_use, c.id, i);
  }
  std::sort(order.begin(), order.end());

  // Counting down what is still missing, instead of summing what was taken,
  // cannot overflow however large the buffers are.
  uint64_t missing = needed;
  // The header promises no id twice even if the caller lists one twice; the
  // first occurrence in eviction order is the one taken.
  absl::flat_hash_set<uint64_t> taken;
  for (const OrderKey& key : order) {
    const EvictionCandidate& c = candidates[std::get<3>(key)];
    if (!taken.insert(c.id).second) continue;
    evictions.push_back(Eviction{c.id, copy_clean || !c.clean()});
    missing -= std::min(missing, c.bytes);
    if (missing == 0) break;
  }
  return evictions;
}

// The baseline: least recently used first, and every swap-out copies, since
// without version control nothing tells that the host copy is current.
class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }

  std::vector<Eviction> Choose(absl::Span<const EvictionCandidate> candidates,
                               uint64_t needed) const override {
    return TakeInOrder(
        candidates, needed, [](const EvictionCandidate&) { return 0; },
        /*copy_clean=*/true);
  }
};

// Tensor version control: a clean buffer frees its bytes without a transfer
// (S403), so all of them go before any dirty one, however recently used; the
// dirty ones follow least recently used first and are copied (S405).
class VersionPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "version"; }

  std::vector<Eviction> Choose(absl::Span<const EvictionCandidate> candidates,
                               uint64_t needed) const override {
    return TakeInOrder(
        candidates, needed,
        [](const EvictionCandidate& c) { return c.clean() ? 0 : 1; },
        /*copy_clean=*/false);
  }
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() {
  return std::make_unique<LruPolicy>();
}

std::unique_ptr<EvictionPolicy> MakeVersionPolicy() {
  return std::make_unique<VersionPolicy>();
}

}  // namespace stensor
