#include "tools/min_cost_flow.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stensor {
namespace {
constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
}  // namespace

MinCostFlow::MinCostFlow(int nodes) : nodes_(nodes < 0 ? 0 : nodes), supply_(nodes_, 0) {}

int MinCostFlow::AddArc(int from, int to, int64_t capacity, int64_t cost) {
  if (built_ || from < 0 || from >= nodes_ || to < 0 || to >= nodes_ || capacity < 0) {
    bad_arc_ = true;
    from = to = 0;
    capacity = 0;
  }
  input_.push_back(InputArc{from, to, capacity, cost});
  return static_cast<int>(input_.size()) - 1;
}

void MinCostFlow::AddSupply(int node, int64_t supply) {
  if (built_ || node < 0 || node >= nodes_) {
    bad_arc_ = true;
    return;
  }
  supply_[node] += supply;
}

void MinCostFlow::SetCost(int arc, int64_t cost) {
  if (arc < 0 || arc >= static_cast<int>(input_.size())) {
    bad_arc_ = true;
    return;
  }
  input_[arc].cost = cost;
  if (built_) repriced_.emplace_back(arc, cost);
}

int64_t MinCostFlow::Flow(int arc) const {
  if (!built_ || arc < 0 || arc >= static_cast<int>(position_.size())) return 0;
  return input_[arc].capacity - arcs_[position_[arc]].capacity;
}

void MinCostFlow::Build() {
  // Every arc with its reverse beside it in the other node's row.
  first_.assign(nodes_ + 1, 0);
  for (const InputArc& a : input_) {
    ++first_[a.from + 1];
    ++first_[a.to + 1];
  }
  for (int v = 0; v < nodes_; ++v) first_[v + 1] += first_[v];
  std::vector<int> next(first_.begin(), first_.end() - 1);
  arcs_.assign(2 * input_.size(), Arc{});
  position_.resize(input_.size());
  for (size_t i = 0; i < input_.size(); ++i) {
    const InputArc& a = input_[i];
    const int forward = next[a.from]++;
    const int backward = next[a.to]++;
    arcs_[forward] = Arc{a.to, backward, a.capacity, a.cost};
    arcs_[backward] = Arc{a.from, forward, 0, -a.cost};
    position_[i] = forward;
  }
}

bool MinCostFlow::InitialPotentials() {
  // Bellman-Ford (queue-based) over arcs with room, from every node at once
  // (a virtual source): costs may be negative, and a negative cycle
  // anywhere is found, reachable from the supplies or not.
  const int n = nodes_;
  potential_.assign(n, 0);
  std::vector<int> relaxed(n, 0);
  std::vector<bool> queued(n, true);
  std::deque<int> queue;
  for (int v = 0; v < n; ++v) queue.push_back(v);
  while (!queue.empty()) {
    const int v = queue.front();
    queue.pop_front();
    queued[v] = false;
    for (int i = first_[v]; i < first_[v + 1]; ++i) {
      const Arc& a = arcs_[i];
      if (a.capacity <= 0 || potential_[v] + a.cost >= potential_[a.to]) continue;
      potential_[a.to] = potential_[v] + a.cost;
      if (++relaxed[a.to] > n) return false;  // a negative cycle
      if (!queued[a.to]) {
        queued[a.to] = true;
        queue.push_back(a.to);
      }
    }
  }
  return true;
}

void MinCostFlow::Push(int v, int i, int64_t units) {
  Arc& a = arcs_[i];
  a.capacity -= units;
  arcs_[a.rev].capacity += units;
  excess_[v] -= units;
  excess_[a.to] += units;
}

void MinCostFlow::Reprice() {
  for (const auto& [arc, cost] : repriced_) {
    const int i = position_[arc];
    const int v = input_[arc].from;
    Arc& a = arcs_[i];
    a.cost = cost;
    arcs_[a.rev].cost = -cost;
    // A residual arc of negative reduced cost would break the potentials:
    // take it whole now; what that moves is routed by the phases.
    if (a.capacity > 0 && Reduced(v, i) < 0) {
      Push(v, i, a.capacity);
    } else if (arcs_[a.rev].capacity > 0 && Reduced(a.to, a.rev) < 0) {
      Push(a.to, a.rev, arcs_[a.rev].capacity);
    }
  }
  repriced_.clear();
}

void MinCostFlow::GlobalRelabel() {
  const int n = nodes_;
  std::fill(height_.begin(), height_.end(), -1);
  // Breadth first backwards over admissible arcs from every deficit.
  queue_.clear();
  for (int v = 0; v < n; ++v) {
    if (excess_[v] < 0) {
      height_[v] = 0;
      queue_.push_back(v);
    }
  }
  for (size_t head = 0; head < queue_.size(); ++head) {
    const int v = queue_[head];
    for (int i = first_[v]; i < first_[v + 1]; ++i) {
      const int u = arcs_[i].to;
      if (height_[u] < 0 && Admissible(u, arcs_[i].rev)) {
        height_[u] = height_[v] + 1;
        queue_.push_back(u);
      }
    }
  }
  for (int v = 0; v < n; ++v) {
    if (height_[v] < 0) height_[v] = n;  // reaches no deficit in this phase
  }
  std::copy(first_.begin(), first_.end() - 1, current_.begin());
}

void MinCostFlow::MaxFlow() {
  const int n = nodes_;
  height_.assign(n, 0);
  current_.assign(n, 0);
  // Active nodes (excess, height below n) in stacks by height, the highest
  // discharged first: excess arriving at a node from many arcs moves on
  // together, once, instead of a wave per arrival.
  std::vector<int> active(n + 1, -1), next_active(n, -1);
  std::vector<bool> queued(n, false);
  int highest = -1;
  // Every node below n in a list by height, for the gap heuristic: when no
  // node is left at some height, nothing above it reaches a deficit, and
  // it all goes to n at once instead of climbing there a step at a time.
  std::vector<int> level(n + 1, -1), next_in_level(n, -1), prev_in_level(n, -1);
  int top = -1;  // highest non-empty level
  auto activate = [&](int v) {
    if (queued[v] || excess_[v] <= 0 || height_[v] >= n) return;
    queued[v] = true;
    next_active[v] = active[height_[v]];
    active[height_[v]] = v;
    highest = std::max(highest, height_[v]);
  };
  auto place = [&](int v) {
    const int h = height_[v];
    if (h >= n) return;
    prev_in_level[v] = -1;
    next_in_level[v] = level[h];
    if (level[h] >= 0) prev_in_level[level[h]] = v;
    level[h] = v;
    top = std::max(top, h);
  };
  auto unplace = [&](int v) {
    const int h = height_[v];
    if (h >= n) return;
    if (prev_in_level[v] >= 0) {
      next_in_level[prev_in_level[v]] = next_in_level[v];
    } else {
      level[h] = next_in_level[v];
    }
    if (next_in_level[v] >= 0) prev_in_level[next_in_level[v]] = prev_in_level[v];
  };
  auto relabel_all = [&] {
    GlobalRelabel();
    std::fill(active.begin(), active.end(), -1);
    std::fill(queued.begin(), queued.end(), false);
    std::fill(level.begin(), level.end(), -1);
    highest = top = -1;
    for (int v = 0; v < n; ++v) {
      place(v);
      activate(v);
    }
  };
  relabel_all();
  int64_t relabels = 0;
  while (highest >= 0) {
    const int v = active[highest];
    if (v < 0) {
      --highest;
      continue;
    }
    active[highest] = next_active[v];
    queued[v] = false;
    if (height_[v] != highest) continue;  // lifted by a gap since it was queued
    int& i = current_[v];
    bool relabelled = false;
    while (excess_[v] > 0) {
      if (i == first_[v + 1]) {
        // One above the lowest admissible neighbour; at n, its excess
        // waits for a later phase.
        int lowest = n;
        for (int j = first_[v]; j < first_[v + 1]; ++j) {
          if (Admissible(v, j)) lowest = std::min(lowest, height_[arcs_[j].to]);
        }
        const int old = height_[v];
        unplace(v);
        i = first_[v];
        relabelled = true;
        if (level[old] < 0) {
          // A gap: v and everything above it are cut off from the deficits.
          for (int h = old + 1; h <= top; ++h) {
            for (int u = level[h]; u >= 0; u = next_in_level[u]) height_[u] = n;
            level[h] = -1;
          }
          top = old - 1;
          height_[v] = n;
        } else {
          height_[v] = std::min(n, lowest + 1);
          place(v);
        }
        break;
      }
      const int to = arcs_[i].to;
      if (height_[v] == height_[to] + 1 && Admissible(v, i)) {
        Push(v, i, std::min(excess_[v], arcs_[i].capacity));
        activate(to);
        if (excess_[v] == 0) break;
      }
      ++i;
    }
    // Exact heights now and then keep the pushes on shortest routes.
    if (relabelled && ++relabels % n == 0) {
      relabel_all();
      continue;
    }
    activate(v);
  }
}

absl::StatusOr<int64_t> MinCostFlow::Solve() {
  if (bad_arc_) return absl::InvalidArgumentError("min-cost flow: arc or node out of range");
  if (!built_) {
    // Two arcs each: indices fit an int.
    if (input_.size() > static_cast<size_t>(std::numeric_limits<int>::max() / 2)) {
      return absl::InvalidArgumentError("min-cost flow: too many arcs");
    }
    int64_t balance = 0;
    for (int v = 0; v < nodes_; ++v) balance += supply_[v];
    if (balance != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("min-cost flow: supplies and demands differ by ", balance));
    }
    Build();
    built_ = true;
    excess_ = supply_;
    if (!InitialPotentials()) {
      return absl::FailedPreconditionError("min-cost flow: a cycle of negative cost");
    }
  } else {
    Reprice();
  }
  const int n = nodes_;
  std::vector<int64_t> dist(n);
  std::vector<bool> done(n);
  using Entry = std::pair<int64_t, int>;
  std::vector<Entry> heap;
  const auto later = std::greater<Entry>();
  for (;;) {
    int64_t unrouted = 0;
    std::fill(dist.begin(), dist.end(), kInf);
    std::fill(done.begin(), done.end(), false);
    heap.clear();
    for (int v = 0; v < n; ++v) {
      if (excess_[v] <= 0) continue;
      unrouted += excess_[v];
      dist[v] = 0;
      heap.push_back({0, v});
    }
    if (unrouted == 0) break;
    std::make_heap(heap.begin(), heap.end(), later);
    // Dijkstra from every excess to the nearest deficit.
    int64_t nearest = kInf;
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      const auto [d, v] = heap.back();
      heap.pop_back();
      if (done[v]) continue;
      done[v] = true;
      if (excess_[v] < 0) {
        nearest = d;  // farther nodes keep their bound below
        break;
      }
      for (int i = first_[v]; i < first_[v + 1]; ++i) {
        const Arc& a = arcs_[i];
        if (a.capacity <= 0 || done[a.to]) continue;
        const int64_t nd = d + Reduced(v, i);
        if (nd < dist[a.to]) {
          dist[a.to] = nd;
          heap.push_back({nd, a.to});
          std::push_heap(heap.begin(), heap.end(), later);
        }
      }
    }
    if (nearest == kInf) {
      return absl::FailedPreconditionError(
          absl::StrCat("min-cost flow: no feasible flow (", unrouted, " units unrouted)"));
    }
    // Potentials stay feasible when nodes not finalised are charged the
    // nearest deficit's distance (the early stop above).
    for (int v = 0; v < n; ++v) potential_[v] += done[v] ? dist[v] : nearest;
    ++phases_;
    MaxFlow();
  }
  int64_t cost = 0;
  for (size_t i = 0; i < input_.size(); ++i) {
    cost += Flow(static_cast<int>(i)) * input_[i].cost;
  }
  return cost;
}

}  // namespace stensor
