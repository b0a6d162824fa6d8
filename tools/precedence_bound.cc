#include "tools/precedence_bound.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

namespace stensor {
namespace {

// A buffer that may be left out of the device at a point: its charge, what
// leaving it out costs in bytes, and the point that orders it (its next use
// for the bytes in, its last writer for the bytes out).
struct Item {
  int64_t units = 0;
  double cost = 0;
  int key = 0;
};

// Fractional knapsack over items added one at a time: the least cost of
// leaving out (fractionally) enough of the added items that the others fit
// in `room` units. The cheapest bytes per unit go first; sums over them in
// that order live in a Fenwick tree, so an addition and a query are
// O(log n).
class LeastEviction {
 public:
  explicit LeastEviction(const std::vector<Item>& items)
      : items_(items), rank_(items.size()), ratio_(items.size()) {
    std::vector<int> order(items.size());
    std::iota(order.begin(), order.end(), 0);
    auto ratio = [&](int i) { return items[i].cost / static_cast<double>(items[i].units); };
    std::sort(order.begin(), order.end(), [&](int a, int b) { return ratio(a) < ratio(b); });
    for (size_t r = 0; r < order.size(); ++r) {
      rank_[order[r]] = r;
      ratio_[r] = ratio(order[r]);
    }
    units_.assign(items.size() + 1, 0);
    cost_.assign(items.size() + 1, 0.0);
    while (top_ * 2 <= items.size()) top_ *= 2;
  }

  void Add(size_t i) {
    total_ += items_[i].units;
    for (size_t p = rank_[i] + 1; p < units_.size(); p += p & (~p + 1)) {
      units_[p] += items_[i].units;
      cost_[p] += items_[i].cost;
    }
  }

  double Least(int64_t room) const {
    int64_t rest = total_ - room;
    if (rest <= 0) return 0;
    // The longest cheapest prefix that leaves out less than `rest`, then a
    // share of the next item.
    size_t pos = 0;
    double cost = 0;
    for (size_t step = top_; step > 0; step >>= 1) {
      if (pos + step < units_.size() && units_[pos + step] < rest) {
        pos += step;
        rest -= units_[pos];
        cost += cost_[pos];
      }
    }
    if (pos < ratio_.size()) cost += static_cast<double>(rest) * ratio_[pos];
    return cost;
  }

 private:
  const std::vector<Item>& items_;
  std::vector<size_t> rank_;    // by item
  std::vector<double> ratio_;   // by rank: cost per unit
  std::vector<int64_t> units_;  // Fenwick, by rank
  std::vector<double> cost_;
  size_t top_ = 1;
  int64_t total_ = 0;
};

// The gaps covering each point that `wanted` keeps, points visited in
// increasing order.
class Covering {
 public:
  template <typename Wanted>
  Covering(const KeepProblem& problem, Wanted wanted)
      : gaps_(problem.gaps), starts_(static_cast<size_t>(std::max(problem.points, 0))) {
    for (size_t g = 0; g < gaps_.size(); ++g) {
      const KeepGap& gap = gaps_[g];
      if (gap.first <= gap.last && gap.first >= 0 && gap.first < problem.points && wanted(gap)) {
        starts_[gap.first].push_back(static_cast<int>(g));
        work_ += gap.last - gap.first + 1;
      }
    }
  }

  // The sum over points of the gaps covering each.
  int64_t work() const { return work_; }

  const std::vector<int>& At(int point) {
    for (; next_ <= point; ++next_) {
      active_.insert(active_.end(), starts_[next_].begin(), starts_[next_].end());
    }
    active_.erase(std::remove_if(active_.begin(), active_.end(),
                                 [&](int g) { return gaps_[g].last < point; }),
                  active_.end());
    return active_;
  }

 private:
  const std::vector<KeepGap>& gaps_;
  std::vector<std::vector<int>> starts_;
  std::vector<int> active_;
  int next_ = 0;
  int64_t work_ = 0;
};

// Points whose windows are looked at: all of them unless that means more
// than this many knapsack items in all (a log of very many buffers live at
// once); then every stride-th, which only leaves edges out: still a bound.
constexpr int64_t kItemBudget = int64_t{1} << 24;

int Stride(int64_t work) {
  return static_cast<int>(std::max<int64_t>(1, (work + kItemBudget - 1) / kItemBudget));
}

bool CostsIn(const KeepGap& gap) { return gap.swap_in > 0 && gap.units > 0; }

int64_t RoomAt(const KeepProblem& problem, bool serving, int point) {
  return serving ? problem.free_units[point] : problem.room[point];
}

// What leaving gap `g` out at a point it covers costs in bytes in: its next
// use's copy (or, with serving, what serving it there reads, no less).
void AddInItem(const KeepGap& gap, std::vector<Item>& items) {
  if (CostsIn(gap)) {
    items.push_back({gap.units, static_cast<double>(gap.swap_in), gap.last + 1});
  }
}

// With serving, a use of the point itself that is not resident is served.
void AddServedItem(const KeepUse& use, std::vector<Item>& items) {
  if (!use.allocation && use.units > 0 && use.bytes > 0) {
    items.push_back({use.units, static_cast<double>(use.bytes), use.point});
  }
}

void AddOutItem(const KeepProblem& problem, const KeepGap& gap, std::vector<Item>& items) {
  if (gap.stretch < 0 || gap.units <= 0) return;
  const uint64_t bytes = problem.stretch_bytes[gap.stretch];
  if (bytes == 0) return;
  const int writer = problem.uses[problem.stretch_writer[gap.stretch]].point;
  items.push_back({gap.units, static_cast<double>(bytes), writer});
}

double LeastOf(const std::vector<Item>& items, int64_t room) {
  LeastEviction least(items);
  for (size_t i = 0; i < items.size(); ++i) least.Add(i);
  return least.Least(room);
}

}  // namespace

double BytesInWindow(const KeepProblem& problem, bool serving, int from, int to) {
  std::vector<Item> items;
  for (const KeepGap& gap : problem.gaps) {
    if (gap.first <= from && from <= gap.last) AddInItem(gap, items);
  }
  items.erase(std::remove_if(items.begin(), items.end(), [&](const Item& i) { return i.key > to; }),
              items.end());
  return LeastOf(items, RoomAt(problem, serving, from));
}

double BytesOutAfter(const KeepProblem& problem, int writer, int at) {
  std::vector<Item> items;
  for (const KeepGap& gap : problem.gaps) {
    if (gap.first <= at && at <= gap.last) AddOutItem(problem, gap, items);
  }
  items.erase(
      std::remove_if(items.begin(), items.end(), [&](const Item& i) { return i.key < writer; }),
      items.end());
  return LeastOf(items, problem.room[at]);
}

double PrecedenceBoundUs(const KeepProblem& problem, const std::vector<double>& compute_us,
                         const PrecedenceOptions& options) {
  const int n = problem.points;
  // ends[j + 1]: no schedule ends operation j (its serving included)
  // sooner; ends[0] = 0, the start.
  std::vector<double> ends(static_cast<size_t>(n) + 1, 0.0);
  auto reach = [&](int j, double at) { ends[j + 1] = std::max(ends[j + 1], at); };
  // One edge per key (next use): between two, the window's bytes stay and
  // the ends only grow. `at(next, link_us, next_us)`: the end of `next` the
  // window's bytes force (their time on the link; `next_us`: the link time
  // of the candidates `next` uses, which it may read while it computes).
  auto edges = [&](std::vector<Item>& items, int64_t room, auto&& at) {
    std::sort(items.begin(), items.end(),
              [](const Item& a, const Item& b) { return a.key < b.key; });
    LeastEviction least(items);
    for (size_t i = 0; i < items.size();) {
      const int next = items[i].key;
      double own = 0;
      for (; i < items.size() && items[i].key == next; ++i) {
        own += items[i].cost;
        least.Add(i);
      }
      const double bytes = least.Least(room);
      if (bytes > 0) {
        const double link_us = bytes * options.in_us_per_byte;
        reach(next, at(next, link_us, own * options.in_us_per_byte));
      }
    }
  };
  std::vector<Item> items;
  Covering covering(problem, CostsIn);
  const int stride = Stride(covering.work());
  Covering written(problem, [&](const KeepGap& gap) {
    return gap.stretch >= 0 && gap.units > 0 && problem.stretch_bytes[gap.stretch] > 0;
  });
  const int out_stride = Stride(written.work());
  const bool out_timed = options.out_us_per_byte > 0;
  size_t use = 0;
  for (int v = 0; v < n; ++v) {
    reach(v, ends[v] + compute_us[v]);
    if (out_timed && v % out_stride == 0) {
      // The write-backs before v starts. A buffer v does not use whose
      // memory is free when v starts, although its last write was by
      // operation w < v, was written back after w ended and before v
      // started: its memory holds its bytes until the copy out is done. The
      // least such bytes, by the knapsack at v's room, bound v's start
      // from w's end. With serving, the write may instead have gone to the
      // host copy, read over the other engine while its writer ran (from
      // w's start): the bytes split between the two as finishes soonest.
      items.clear();
      for (int g : written.At(v)) AddOutItem(problem, problem.gaps[g], items);
      std::sort(items.begin(), items.end(),
                [](const Item& a, const Item& b) { return a.key > b.key; });
      LeastEviction least(items);
      // The latest writer first: each earlier one adds its buffers.
      for (size_t i = 0; i < items.size();) {
        const int writer = items[i].key;
        for (; i < items.size() && items[i].key == writer; ++i) least.Add(i);
        const double bytes = least.Least(RoomAt(problem, options.serving, v));
        if (!(bytes > 0)) continue;
        const double after_end = ends[writer + 1];
        double out_bytes = bytes;
        if (options.serving) {
          // Some bytes out after w's end, the rest served from w's start:
          // the larger of the two ends, least where they meet (never more
          // than all of them out).
          const double from_start = ends[writer] + bytes * options.in_us_per_byte;
          out_bytes =
              from_start <= after_end
                  ? 0
                  : (from_start - after_end) / (options.out_us_per_byte + options.in_us_per_byte);
        }
        reach(v, after_end + out_bytes * options.out_us_per_byte + compute_us[v]);
      }
    }
    if (v % stride != 0) continue;
    const std::vector<int>& covered = covering.At(v);
    if (options.serving) {
      // With v's own buffers among the candidates: what v serves of them
      // crosses while it runs (it ends no sooner than its compute and that
      // read), the others' bytes after it ends.
      items.clear();
      for (; use < problem.uses.size() && problem.uses[use].point <= v; ++use) {
        if (problem.uses[use].point == v) AddServedItem(problem.uses[use], items);
      }
      if (!items.empty()) {
        double own = 0;
        for (const Item& item : items) own += item.cost;
        const double own_us = own * options.in_us_per_byte;
        for (int g : covered) AddInItem(problem.gaps[g], items);
        // v and `next` each hide under their compute at most what they
        // read themselves; the rest crosses between them.
        edges(items, problem.free_units[v], [&](int next, double link_us, double next_us) {
          if (next == v) return ends[v] + std::max(compute_us[v], link_us);
          const double at_v = std::min({own_us, link_us, compute_us[v]});
          const double at_next = std::min({next_us, link_us - at_v, compute_us[next]});
          return ends[v] + compute_us[v] + compute_us[next] + (link_us - at_v - at_next);
        });
      }
    }
    // ends[v + 1] is final now: every edge into it starts at v or before.
    // A buffer v does not use that is not on the device while v runs is
    // copied in (or served) after v ends: decisions fall between
    // operations, and it held no room to be copied into before. Copied,
    // it is in before its use starts; served, it crosses while its use
    // runs. So `next` computes after all of them but its own served bytes.
    items.clear();
    for (int g : covered) AddInItem(problem.gaps[g], items);
    edges(items, RoomAt(problem, options.serving, v),
          [&](int next, double link_us, double next_us) {
            const double hidden =
                options.serving ? std::min({next_us, link_us, compute_us[next]}) : 0;
            return ends[v + 1] + link_us - hidden + compute_us[next];
          });
  }
  return ends[n];
}

}  // namespace stensor
