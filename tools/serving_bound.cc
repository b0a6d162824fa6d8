#include "tools/serving_bound.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace stensor {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A buffer's state after one of its uses: resident there, the writer of the
// stretch in force resident (its write is on the device), and that
// stretch's write-back already paid. Packed as r | wr << 1 | wb << 2.
constexpr int kStates = 8;
int Pack(bool r, bool wr, bool wb) { return (r ? 1 : 0) | (wr ? 2 : 0) | (wb ? 4 : 0); }

// Granules a schedule holds at each point: its kept links' gaps (kept only
// where both uses are resident) and its resident uses.
std::vector<int64_t> Held(const KeepProblem& p, const std::vector<bool>& resident,
                          const std::vector<bool>& kept) {
  std::vector<int64_t> held(p.points + 1, 0);
  for (size_t l = 0; l < p.links.size(); ++l) {
    const KeepLink& link = p.links[l];
    if (link.gap < 0 || !kept[l] || !resident[link.from] || (link.to >= 0 && !resident[link.to])) {
      continue;
    }
    held[p.gaps[link.gap].first] += p.gaps[link.gap].units;
    held[p.gaps[link.gap].last + 1] -= p.gaps[link.gap].units;
  }
  for (int t = 1; t <= p.points; ++t) held[t] += held[t - 1];
  held.pop_back();
  for (size_t u = 0; u < p.uses.size(); ++u)
    held[p.uses[u].point] += resident[u] ? p.uses[u].units : 0;
  return held;
}

// What the best choice behind a state came from: the state before and
// whether the link into it was kept.
struct Step {
  int8_t from = -1;
  bool kept = false;
};

class Relaxation {
 public:
  explicit Relaxation(const KeepProblem& p) : p_(p) {
    const int uses = static_cast<int>(p.uses.size());
    out_link_.assign(uses, -1);
    in_link_.assign(uses, -1);
    for (size_t l = 0; l < p.links.size(); ++l) {
      out_link_[p.links[l].from] = static_cast<int>(l);
      if (p.links[l].to >= 0) in_link_[p.links[l].to] = static_cast<int>(l);
    }
    for (int u = 0; u < uses; ++u) {
      if (in_link_[u] < 0) chain_starts_.push_back(u);
    }
    writer_.assign(uses, false);
    for (int w : p.stretch_writer) writer_[w] = true;
    // Rows that can bind: everything that could be there overfills the room.
    const std::vector<int64_t> here =
        Held(p, std::vector<bool>(uses, true), std::vector<bool>(p.links.size(), true));
    for (int t = 0; t < p.points; ++t) {
      if (here[t] > p.free_units[t]) rows_.push_back(t);
    }
    price_.assign(p.points, 0.0);
    prefix_.assign(p.points + 1, 0.0);
    steps_.resize(static_cast<size_t>(uses) * kStates);
    resident_.assign(uses, false);
    kept_.assign(p.links.size(), false);
  }

  // The last Evaluate's schedule made to fit (see serving_bound.h).
  void Repair(std::vector<bool>* resident, std::vector<bool>* kept) const {
    *resident = resident_;
    *kept = kept_;
    // Kept links over each point, by gap; uses at each point.
    std::vector<std::vector<int>> starting(p_.points), at(p_.points);
    for (size_t l = 0; l < p_.links.size(); ++l) {
      const int gap = p_.links[l].gap;
      if (gap >= 0 && (*kept)[l]) starting[p_.gaps[gap].first].push_back(static_cast<int>(l));
    }
    for (size_t u = 0; u < p_.uses.size(); ++u) at[p_.uses[u].point].push_back(static_cast<int>(u));
    std::vector<int64_t> ending(p_.points + 1, 0);
    std::vector<int> open;  // kept links whose gap covers the point
    int64_t held_by_gaps = 0;
    for (int t = 0; t < p_.points; ++t) {
      held_by_gaps -= ending[t];
      ending[t] = 0;
      for (int l : starting[t]) {
        if (!(*kept)[l]) continue;  // let go of at an earlier point
        open.push_back(l);
        const KeepGap& g = p_.gaps[p_.links[l].gap];
        held_by_gaps += g.units;
        ending[g.last + 1] += g.units;
      }
      int64_t held = held_by_gaps;
      for (int u : at[t]) held += (*resident)[u] ? p_.uses[u].units : 0;
      if (held <= p_.free_units[t]) continue;
      open.erase(
          std::remove_if(open.begin(), open.end(),
                         [&](int l) { return !(*kept)[l] || p_.gaps[p_.links[l].gap].last < t; }),
          open.end());
      // The furthest next use goes first, as Belady's rule has it.
      std::sort(open.begin(), open.end(), [&](int a, int b) {
        return p_.gaps[p_.links[a].gap].last > p_.gaps[p_.links[b].gap].last;
      });
      for (size_t i = 0; i < open.size() && held > p_.free_units[t]; ++i) {
        const KeepGap& g = p_.gaps[p_.links[open[i]].gap];
        (*kept)[open[i]] = false;
        held -= g.units;
        held_by_gaps -= g.units;
        ending[g.last + 1] -= g.units;
      }
      std::vector<int> uses = at[t];
      std::sort(uses.begin(), uses.end(),
                [&](int a, int b) { return p_.uses[a].units > p_.uses[b].units; });
      for (size_t i = 0; i < uses.size() && held > p_.free_units[t]; ++i) {
        const int u = uses[i];
        if (!(*resident)[u]) continue;
        (*resident)[u] = false;  // served: its links are kept no more
        held -= p_.uses[u].units;
        if (out_link_[u] >= 0) (*kept)[out_link_[u]] = false;  // its gap starts after t
      }
    }
  }

  // Spends the room a fitting schedule leaves, never adding bytes: served
  // uses brought on the device where their point has room (largest saving
  // first; a use whose stretch would then be written back where it was
  // not is left), then links between resident uses kept where their whole
  // gap has room (most bytes saved per granule-point first).
  void Improve(std::vector<bool>* resident, std::vector<bool>* kept) const {
    std::vector<bool>& r = *resident;
    std::vector<bool>& k = *kept;
    auto is_kept = [&](size_t l) {
      const KeepLink& link = p_.links[l];
      return k[l] && r[link.from] && (link.to < 0 || r[link.to]);
    };
    std::vector<int64_t> held = Held(p_, r, k);
    // Stretches written back somewhere: a use brought in within one costs
    // no write-back more.
    std::vector<char> paid(p_.stretch_bytes.size(), 0);
    for (size_t l = 0; l < p_.links.size(); ++l) {
      const KeepLink& link = p_.links[l];
      if (link.stretch >= 0 && !is_kept(l) && r[link.from] && r[p_.stretch_writer[link.stretch]]) {
        paid[link.stretch] = 1;
      }
    }
    std::vector<std::pair<double, int>> order;
    for (size_t u = 0; u < p_.uses.size(); ++u) {
      const KeepUse& use = p_.uses[u];
      if (r[u] || use.allocation || writer_[u] || use.units <= 0) continue;
      const int out = out_link_[u];
      const int stretch = out >= 0 ? p_.links[out].stretch : -1;
      if (stretch >= 0 && r[p_.stretch_writer[stretch]] && !paid[stretch]) continue;
      const double saving = static_cast<double>(use.bytes) - static_cast<double>(use.swap_in);
      if (saving > 0)
        order.push_back({saving / static_cast<double>(use.units), static_cast<int>(u)});
    }
    std::sort(order.begin(), order.end(), std::greater<>());
    for (const auto& [unused, u] : order) {
      const KeepUse& use = p_.uses[u];
      if (held[use.point] + use.units > p_.free_units[use.point]) continue;
      r[u] = true;
      held[use.point] += use.units;
      // Its links are kept only as chosen below, where their gaps have room.
      if (out_link_[u] >= 0) k[out_link_[u]] = false;
      if (in_link_[u] >= 0) k[in_link_[u]] = false;
    }
    order.clear();
    for (size_t l = 0; l < p_.links.size(); ++l) {
      const KeepLink& link = p_.links[l];
      if (link.gap < 0 || link.to < 0 || is_kept(l) || !r[link.from] || !r[link.to]) continue;
      const int64_t saved = p_.uses[link.to].swap_in;
      const KeepGap& g = p_.gaps[link.gap];
      if (saved <= 0 || g.units <= 0) continue;
      order.push_back(
          {static_cast<double>(saved) / (static_cast<double>(g.units) * (g.last - g.first + 1)),
           static_cast<int>(l)});
    }
    std::sort(order.begin(), order.end(), std::greater<>());
    for (const auto& [unused, l] : order) {
      const KeepGap& g = p_.gaps[p_.links[l].gap];
      bool fits = true;
      for (int t = g.first; t <= g.last && fits; ++t) fits = held[t] + g.units <= p_.free_units[t];
      if (!fits) continue;
      k[l] = true;
      for (int t = g.first; t <= g.last; ++t) held[t] += g.units;
    }
  }

  bool binds() const { return !rows_.empty(); }
  const std::vector<int>& rows() const { return rows_; }
  std::vector<double>& price() { return price_; }

  // L(price): every buffer's cheapest schedule at these prices, less the
  // prices of the room; leaves that schedule in resident_ and kept_.
  double Evaluate() {
    for (int t = 0; t < p_.points; ++t) prefix_[t + 1] = prefix_[t] + price_[t];
    double total = 0;
    for (int start : chain_starts_) total += Chain(start);
    for (int t : rows_) total -= price_[t] * static_cast<double>(p_.free_units[t]);
    return total;
  }

  // Per binding row, what the last Evaluate's schedule holds there less the
  // room.
  void Overfill(std::vector<double>* g) const {
    const std::vector<int64_t> held = Held(p_, resident_, kept_);
    g->resize(rows_.size());
    for (size_t i = 0; i < rows_.size(); ++i) {
      const int t = rows_[i];
      (*g)[i] = static_cast<double>(held[t] - p_.free_units[t]);
    }
  }

 private:
  double UseCost(int u, bool resident, bool kept_in) const {
    const KeepUse& use = p_.uses[u];
    if (!resident) return use.allocation ? 0.0 : static_cast<double>(use.bytes);
    return price_[use.point] * static_cast<double>(use.units) +
           (kept_in ? 0.0 : static_cast<double>(use.swap_in));
  }

  double GapCost(const KeepLink& link) const {
    if (link.gap < 0) return 0.0;
    const KeepGap& g = p_.gaps[link.gap];
    return (prefix_[g.last + 1] - prefix_[g.first]) * static_cast<double>(g.units);
  }

  // The cheapest schedule of the buffer whose first use is `first`, by
  // dynamic programming over its uses; records it.
  double Chain(int first) {
    std::array<double, kStates> cost;
    cost.fill(kInf);
    for (bool r : {false, true}) {
      const int s = Pack(r, writer_[first] && r, false);
      cost[s] = std::min(cost[s], UseCost(first, r, /*kept_in=*/false));
    }
    int u = first;
    double best = kInf;
    int best_state = -1;
    bool best_kept = false;
    for (;;) {
      const int l = out_link_[u];
      if (l < 0) {  // no link out (not in a well-formed problem): ends here
        for (int s = 0; s < kStates; ++s) {
          if (cost[s] < best) best = cost[s], best_state = s, best_kept = false;
        }
        break;
      }
      const KeepLink& link = p_.links[l];
      const double keep_cost = GapCost(link);
      const double write_back =
          link.stretch >= 0 ? static_cast<double>(p_.stretch_bytes[link.stretch]) : 0.0;
      std::array<double, kStates> next;
      next.fill(kInf);
      Step* steps = link.to >= 0 ? &steps_[static_cast<size_t>(link.to) * kStates] : nullptr;
      if (steps != nullptr) std::fill(steps, steps + kStates, Step{});
      for (int s = 0; s < kStates; ++s) {
        if (cost[s] == kInf) continue;
        const bool r = s & 1, wr = s & 2, wb = s & 4;
        for (bool k : {false, true}) {
          if (k && !r) continue;
          // Leaving after a resident write of the stretch writes it back.
          const bool pays = !k && r && wr && !wb && link.stretch >= 0;
          const double c = cost[s] + (k ? keep_cost : 0.0) + (pays ? write_back : 0.0);
          const bool paid = wb || pays;
          if (link.to < 0) {
            if (c < best) best = c, best_state = s, best_kept = k;
            continue;
          }
          for (bool r2 : {false, true}) {
            if (k && !r2) continue;
            const double c2 = c + UseCost(link.to, r2, k);
            const int s2 = writer_[link.to] ? Pack(r2, r2, false) : Pack(r2, wr, paid);
            if (c2 < next[s2]) {
              next[s2] = c2;
              steps[s2] = Step{static_cast<int8_t>(s), k};
            }
          }
        }
      }
      if (link.to < 0) break;
      cost = next;
      u = link.to;
    }
    // Back along the chain: which uses are resident, which links kept.
    int s = best_state;
    if (out_link_[u] >= 0) kept_[out_link_[u]] = best_kept;
    for (;;) {
      resident_[u] = s & 1;
      if (u == first) break;
      const Step& step = steps_[static_cast<size_t>(u) * kStates + s];
      const int in_link = in_link_[u];
      kept_[in_link] = step.kept;
      s = step.from;
      u = p_.links[in_link].from;
    }
    return best;
  }

  const KeepProblem& p_;
  std::vector<int> out_link_, in_link_, chain_starts_, rows_;
  std::vector<bool> writer_;
  std::vector<double> price_, prefix_;
  std::vector<Step> steps_;
  std::vector<bool> resident_, kept_;
};

}  // namespace

ServingBound ComputeServingBound(const KeepProblem& problem, const ServingBoundOptions& options) {
  ServingBound result;
  if (problem.uses.empty()) return result;
  Relaxation relaxation(problem);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.time_limit_ms);
  double upper = static_cast<double>(options.upper);
  // A schedule from the relaxed one, kept when it is the cheapest yet (and
  // then the step sizes' target).
  std::vector<bool> resident, kept;
  auto try_schedule = [&] {
    relaxation.Repair(&resident, &kept);
    relaxation.Improve(&resident, &kept);
    const uint64_t bytes = CountServeSchedule(problem, resident, kept).moved();
    if (bytes >= upper) return;
    upper = static_cast<double>(bytes);
    result.schedule_bytes = bytes;
    result.resident = resident;
    result.kept = kept;
  };
  double best = relaxation.Evaluate();
  if (options.schedules) try_schedule();
  // Polyak steps towards the known schedule's bytes, halved whenever the
  // bound stalls.
  double theta = 2.0;
  int since_better = 0;
  std::vector<double> g;
  std::vector<double>& price = relaxation.price();
  const std::vector<int>& rows = relaxation.rows();
  double value = best;
  for (int i = 0; relaxation.binds() && i < options.max_iterations; ++i) {
    relaxation.Overfill(&g);
    double norm = 0;
    for (size_t k = 0; k < rows.size(); ++k) {
      // A row with no price and room to spare cannot move.
      if (price[rows[k]] <= 0 && g[k] < 0) g[k] = 0;
      norm += g[k] * g[k];
    }
    if (norm == 0) break;  // the relaxed schedule fits, complementary: optimal
    const double gap = std::max(upper - value, 0.01 * std::max(1.0, std::fabs(value)));
    const double step = theta * gap / norm;
    for (size_t k = 0; k < rows.size(); ++k) {
      price[rows[k]] = std::max(0.0, price[rows[k]] + step * g[k]);
    }
    value = relaxation.Evaluate();
    result.iterations = i + 1;
    if (options.schedules && i % 10 == 9) try_schedule();
    if (value > best * (1 + 1e-6) + 1) {
      best = value;
      since_better = 0;
    } else if (++since_better >= 20) {
      theta /= 2;
      since_better = 0;
      if (theta < 1e-4) break;
    }
    if (best >= upper || std::chrono::steady_clock::now() >= deadline) break;
  }
  // The arithmetic's rounding must not lift the bound past a schedule.
  const double bytes = std::floor(best * (1 - 1e-9));
  result.bytes =
      bytes <= 0 ? 0 : std::min(static_cast<uint64_t>(bytes), static_cast<uint64_t>(upper));
  return result;
}

}  // namespace stensor
