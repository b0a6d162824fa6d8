#include "tools/min_cost_flow.h"

#include <deque>
#include <functional>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stensor {
namespace {
constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
}  // namespace

MinCostFlow::MinCostFlow(int nodes)
    : nodes_(nodes < 0 ? 0 : nodes), adj_(nodes_ + 2), supply_(nodes_ + 2, 0) {}

int MinCostFlow::AddArc(int from, int to, int64_t capacity, int64_t cost) {
  if (from < 0 || from >= nodes_ || to < 0 || to >= nodes_ || capacity < 0) {
    bad_arc_ = true;
    from = to = 0;
    capacity = 0;
  }
  const int index = static_cast<int>(arcs_.size());
  const int at_from = static_cast<int>(adj_[from].size());
  const int at_to = static_cast<int>(adj_[to].size()) + (from == to ? 1 : 0);
  adj_[from].push_back(Arc{to, at_to, capacity, cost});
  adj_[to].push_back(Arc{from, at_from, 0, -cost});
  arcs_.emplace_back(from, at_from);
  original_capacity_.push_back(capacity);
  return index;
}

void MinCostFlow::AddSupply(int node, int64_t supply) {
  if (node < 0 || node >= nodes_) {
    bad_arc_ = true;
    return;
  }
  supply_[node] += supply;
}

int64_t MinCostFlow::Flow(int arc) const {
  const auto [from, index] = arcs_[arc];
  return original_capacity_[arc] - adj_[from][index].capacity;
}

bool MinCostFlow::InitialPotentials() {
  // Bellman-Ford (queue-based) over arcs with room, from every node at once
  // (a virtual source): costs may be negative, and a negative cycle
  // anywhere is found, reachable from the supplies or not.
  const int n = nodes_ + 2;
  potential_.assign(n, 0);
  std::vector<int> relaxed(n, 0);
  std::vector<bool> queued(n, true);
  std::deque<int> queue;
  for (int v = 0; v < n; ++v) queue.push_back(v);
  while (!queue.empty()) {
    const int v = queue.front();
    queue.pop_front();
    queued[v] = false;
    for (const Arc& a : adj_[v]) {
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

int64_t MinCostFlow::Push(int v, int sink, int64_t limit, const std::vector<int>& level,
                          std::vector<int>& next_arc, int64_t* cost) {
  if (v == sink) return limit;
  for (int& i = next_arc[v]; i < static_cast<int>(adj_[v].size()); ++i) {
    Arc& a = adj_[v][i];
    if (a.capacity <= 0 || level[a.to] != level[v] + 1 ||
        a.cost + potential_[v] - potential_[a.to] != 0) {
      continue;
    }
    const int64_t pushed = Push(a.to, sink, std::min(limit, a.capacity), level, next_arc, cost);
    if (pushed > 0) {
      a.capacity -= pushed;
      adj_[a.to][a.rev].capacity += pushed;
      *cost += pushed * a.cost;
      return pushed;
    }
  }
  return 0;
}

absl::StatusOr<int64_t> MinCostFlow::Solve() {
  if (bad_arc_) return absl::InvalidArgumentError("min-cost flow: arc or node out of range");
  const int source = nodes_, sink = nodes_ + 1;
  int64_t total = 0, balance = 0;
  for (int v = 0; v < nodes_; ++v) {
    balance += supply_[v];
    if (supply_[v] > 0) {
      const int at_v = static_cast<int>(adj_[v].size());
      adj_[source].push_back(Arc{v, at_v, supply_[v], 0});
      adj_[v].push_back(Arc{source, static_cast<int>(adj_[source].size()) - 1, 0, 0});
      total += supply_[v];
    } else if (supply_[v] < 0) {
      const int at_sink = static_cast<int>(adj_[sink].size());
      adj_[v].push_back(Arc{sink, at_sink, -supply_[v], 0});
      adj_[sink].push_back(Arc{v, static_cast<int>(adj_[v].size()) - 1, 0, 0});
    }
  }
  if (balance != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min-cost flow: supplies and demands differ by ", balance));
  }
  if (!InitialPotentials()) {
    return absl::FailedPreconditionError("min-cost flow: a cycle of negative cost");
  }
  const int n = nodes_ + 2;
  std::vector<int64_t> dist(n);
  std::vector<std::pair<int, int>> parent(n);  // (node, arc index in its list)
  std::vector<bool> done(n);
  std::vector<int> level(n), next_arc(n);
  int64_t flow = 0, cost = 0;
  using Entry = std::pair<int64_t, int>;
  while (flow < total) {
    std::fill(dist.begin(), dist.end(), kInf);
    std::fill(done.begin(), done.end(), false);
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    dist[source] = 0;
    heap.push({0, source});
    while (!heap.empty()) {
      const auto [d, v] = heap.top();
      heap.pop();
      if (done[v]) continue;
      done[v] = true;
      if (v == sink) break;  // nodes farther than the sink keep their bound below
      for (int i = 0; i < static_cast<int>(adj_[v].size()); ++i) {
        const Arc& a = adj_[v][i];
        if (a.capacity <= 0 || done[a.to]) continue;
        const int64_t reduced = a.cost + potential_[v] - potential_[a.to];
        const int64_t nd = d + reduced;
        if (nd < dist[a.to]) {
          dist[a.to] = nd;
          parent[a.to] = {v, i};
          heap.push({nd, a.to});
        }
      }
    }
    if (dist[sink] == kInf) {
      return absl::FailedPreconditionError(absl::StrCat(
          "min-cost flow: no feasible flow (", total - flow, " of ", total, " units unrouted)"));
    }
    // Potentials stay feasible when nodes not finalised are charged the
    // sink's distance (the early stop above).
    for (int v = 0; v < n; ++v) potential_[v] += done[v] ? dist[v] : dist[sink];
    // Every shortest path at once: a blocking flow (levels, as in Dinic's
    // algorithm) over the arcs of zero reduced cost, so one Dijkstra serves
    // all augmenting paths of the same length.
    for (;;) {
      std::fill(level.begin(), level.end(), -1);
      std::deque<int> bfs{source};
      level[source] = 0;
      while (!bfs.empty()) {
        const int v = bfs.front();
        bfs.pop_front();
        for (const Arc& a : adj_[v]) {
          if (a.capacity > 0 && level[a.to] < 0 &&
              a.cost + potential_[v] - potential_[a.to] == 0) {
            level[a.to] = level[v] + 1;
            bfs.push_back(a.to);
          }
        }
      }
      if (level[sink] < 0) break;
      std::fill(next_arc.begin(), next_arc.end(), 0);
      for (;;) {
        const int64_t pushed = Push(source, sink, total - flow, level, next_arc, &cost);
        if (pushed == 0) break;
        flow += pushed;
        ++augmentations_;
      }
      if (flow >= total) break;
    }
  }
  return cost;
}

}  // namespace stensor
