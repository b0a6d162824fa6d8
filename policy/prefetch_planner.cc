#include "policy/prefetch_planner.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "policy/eviction_policy.h"

namespace stensor {
namespace {
constexpr uint64_t kNoNextUse = EvictionCandidate::kNoNextUse;
}  // namespace

void PrefetchPlanner::SetProfile(std::shared_ptr<const AccessProfile> profile,
                                 uint64_t phase0_time) {
  profile_ = std::move(profile);
  origin_ = phase0_time;
}

void PrefetchPlanner::Unindex(uint64_t id, Buffer& b) {
  if (!b.resident) {
    swapped_.erase(Key(id, b));
  } else if (!b.pinned || b.listed) {
    MarkRekey(id, b);
  }
}

void PrefetchPlanner::Index(uint64_t id, Buffer& b) {
  if (!b.resident) {
    swapped_.insert(Key(id, b));
    return;
  }
  // A pinned resident buffer is never a victim: in neither set (no work
  // for it at each use of a buffer that is never swapped).
  if (b.pinned && !b.listed) return;
  MarkRekey(id, b);
  if (b.pinned || b.next_use == kNoNextUse) return;
  expiry_.push(Key(id, b));
  if (expiry_.size() > 2 * buffers_.size() + 64) {
    // Mostly keys no buffer has any more (a plan pops them only once their
    // time passed, and only with a profile): only the current ones stay.
    std::vector<Entry> current;
    for (const auto& [other, o] : buffers_) {
      if (o.resident && !o.pinned && o.next_use != kNoNextUse) current.push_back(Key(other, o));
    }
    expiry_ = decltype(expiry_)(Later(), std::move(current));
  }
}

void PrefetchPlanner::MarkRekey(uint64_t id, Buffer& b) {
  if (b.rekey) return;
  b.rekey = true;
  rekey_.push_back(id);
}

void PrefetchPlanner::FlushResident() {
  for (uint64_t id : rekey_) {
    auto it = buffers_.find(id);
    if (it == buffers_.end() || !it->second.rekey) continue;  // freed, or done
    Buffer& b = it->second;
    b.rekey = false;
    const Entry key = Key(id, b);
    const bool belongs = b.resident && !b.pinned;
    if (b.listed && (!belongs || !(b.listed_key == key))) {
      resident_.erase(b.listed_key);
      b.listed = false;
    }
    if (belongs && !b.listed) {
      resident_.insert(key);
      b.listed = true;
      b.listed_key = key;
    }
  }
  rekey_.clear();
}

void PrefetchPlanner::Thrashed() {
  ++stats_.fetches_wasted;
  ++stats_.backoffs;
  backoff_ = backoff_ == 0 ? options_.min_backoff : std::min(options_.max_backoff, backoff_ * 2);
  paused_until_ = last_plan_ + backoff_;
}

void PrefetchPlanner::Charge(uint64_t bytes) {
  stats_.bytes_caused += bytes;
  const double budget = options_.cost_share * stats_.bytes_moved + largest_;
  if (!stats_.stopped && stats_.bytes_caused > budget) stats_.stopped = true;
}

void PrefetchPlanner::Returned(Buffer& b, uint64_t now) {
  stats_.bytes_moved += b.bytes;
  if (b.charge != 0 && now < b.charge_until) Charge(b.charge);
  b.charge = 0;
}

void PrefetchPlanner::OnUse(uint64_t id, uint64_t bytes, uint64_t now, uint64_t next_use,
                            bool write) {
  auto [it, inserted] = buffers_.try_emplace(id);
  Buffer& b = it->second;
  // Swapped out and no OnResident came: the operation reads it where it is,
  // in host memory (served), and it stays swapped out.
  const bool served = !inserted && !b.resident && !b.fetched;
  if (!inserted) {
    Unindex(id, b);
    if (!b.resident && b.fetched) Returned(b, now);
  }
  b.charge = 0;  // used: its eviction's effect is over
  largest_ = std::max(largest_, bytes);
  AdvanceStream(now);
  if (b.fetched) {
    // The operation waits for the modelled copy.
    stream_ = std::max(stream_, b.ready);
    if (b.resident) fetched_resident_.erase({b.next_use, id});
    // A planned fetch arrived in time for its use: the pause shrinks.
    ++stats_.fetch_hits;
    b.fetched = false;
    backoff_ /= 2;
    if (backoff_ < options_.min_backoff) backoff_ = 0;
  }
  b.bytes = bytes;
  b.next_use = next_use;
  b.last_use = now;
  b.proposed_for = 0;
  if (served) {
    ++stats_.served;
  } else {
    b.resident = true;
    if (write) b.dirty = true;  // a new buffer starts dirty: no host copy yet
  }
  Index(id, b);
}

void PrefetchPlanner::OnNextUse(uint64_t id, uint64_t next_use) {
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  Buffer& b = it->second;
  Unindex(id, b);
  if (b.fetched && b.resident) {
    fetched_resident_.erase({b.next_use, id});
    fetched_resident_.insert({next_use, id});
  }
  b.next_use = next_use;
  Index(id, b);
}

void PrefetchPlanner::OnResident(uint64_t id) {
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;  // never used: nothing to plan for it
  Buffer& b = it->second;
  Unindex(id, b);
  if (!b.resident) {
    if (!b.fetched) ++stats_.on_demand;
    if (b.fetched) fetched_resident_.insert({b.next_use, id});
    // On demand, the operation waits for its copy, queued behind everything
    // on the link (a fetch's copy was queued when it was proposed).
    if (!b.fetched && profile_ != nullptr) {
      AdvanceStream(last_plan_ + 1);  // for the coming operation
      link_free_ = std::max(link_free_, stream_) + profile_->H2dSeconds(b.bytes);
      stream_ = link_free_;
    }
    // Swapped in for the coming operation (on demand) or after the latest
    // plan (a fetch): either way not before the next operation.
    Returned(b, last_plan_ + 1);
  }
  b.resident = true;
  b.dirty = false;  // just copied from its current host copy
  Index(id, b);
}

void PrefetchPlanner::OnEvicted(uint64_t id) {
  auto [it, inserted] = buffers_.try_emplace(id);
  Buffer& b = it->second;
  if (inserted) {
    // Not used since the planner began (evicted before it existed, or born
    // in host memory): known swapped out, so that a use serving it where it
    // is leaves it so.
    b.resident = false;
    b.dirty = false;
    b.next_use = kNoNextUse;
    Index(id, b);
    return;
  }
  Unindex(id, b);
  if (b.resident) {
    const uint64_t cost = b.dirty ? 2 * b.bytes : b.bytes;
    if (b.dirty) stats_.bytes_moved += b.bytes;
    // A write-back goes on the swap stream ahead of later fetches (and the
    // fetch into its memory waits for it).
    if (b.dirty && profile_ != nullptr) {
      link_free_ = std::max(link_free_, stream_) + profile_->D2hSeconds(b.bytes);
    }
    if (b.fetched) {
      fetched_resident_.erase({b.next_use, id});
      b.fetched = false;
      Thrashed();
      Charge(b.bytes);
    } else if (b.proposed_for != 0) {
      b.charge = cost;
      b.charge_until = b.proposed_for;
    } else if (!fetched_resident_.empty()) {
      b.charge = cost;
      b.charge_until = fetched_resident_.begin()->first;
    }
  }
  b.proposed_for = 0;
  b.resident = false;
  b.dirty = false;  // the host copy is current (copied, or clean dropped)
  Index(id, b);
}

void PrefetchPlanner::OnFreed(uint64_t id) {
  auto it = buffers_.find(id);
  if (it == buffers_.end()) return;
  Unindex(id, it->second);
  if (it->second.listed) resident_.erase(it->second.listed_key);
  if (it->second.fetched && it->second.resident) {
    fetched_resident_.erase({it->second.next_use, id});
  }
  buffers_.erase(it);
}

void PrefetchPlanner::SetPinned(uint64_t id, bool pinned) {
  auto it = buffers_.find(id);
  // Told again at every use of a buffer that is never swapped: re-indexing
  // an unchanged entry would cost each launch two ordered-set updates.
  if (it == buffers_.end() || it->second.pinned == pinned) return;
  Unindex(id, it->second);
  it->second.pinned = pinned;
  Index(id, it->second);
}

void PrefetchPlanner::CancelFetch(uint64_t id) {
  auto it = buffers_.find(id);
  if (it == buffers_.end() || it->second.resident) return;
  // Not on the link after all (a later fetch queued behind it keeps its
  // finish time: an upper bound).
  if (it->second.fetched && profile_ != nullptr) {
    link_free_ = std::max(stream_, link_free_ - profile_->H2dSeconds(it->second.bytes));
  }
  it->second.fetched = false;
}

void PrefetchPlanner::AdvanceStream(uint64_t now) {
  if (now <= stream_time_) return;
  if (profile_ != nullptr) stream_ += profile_->ComputeBetweenTimes(origin_, stream_time_, now);
  stream_time_ = now;
}

double PrefetchPlanner::ComputeBetween(uint64_t from, uint64_t to) const {
  if (to == kNoNextUse) return std::numeric_limits<double>::infinity();
  return profile_->ComputeBetweenTimes(origin_, from, to);
}

std::vector<PlannedAction> PrefetchPlanner::Plan(uint64_t now, uint64_t free_bytes,
                                                 double h2d_queued_seconds,
                                                 const ForcedOutLog* forced) {
  ++stats_.plans;
  last_plan_ = now;
  std::vector<PlannedAction> actions;
  if (profile_ == nullptr) return actions;
  if (stats_.stopped) {
    ++stats_.plans_paused;
    return actions;
  }
  if (now < paused_until_) {
    ++stats_.plans_paused;
    return actions;
  }
  const uint64_t period = profile_->period();
  const uint64_t horizon = now > kNoNextUse - period ? kNoNextUse : now + period;
  uint64_t free = free_bytes;
  AdvanceStream(now);
  double queue = std::max(link_free_ - stream_, h2d_queued_seconds);
  size_t scanned = 0;
  absl::flat_hash_set<uint64_t> chosen;  // evicted by this plan
  std::vector<uint64_t> stale;           // predicted use passed, not used
  uint64_t demand = 0;                   // bytes due soon that do not fit
  uint64_t demand_until = now;           // latest next use among them

  // Resident buffers whose predicted use passed without one predict nothing
  // any more: re-keyed as unknown, they become victims again instead of
  // looking needed soonest forever. Bounded like the rest of the scan.
  // The smallest such key first, as the order of resident_ would give them.
  while (scanned < options_.max_scan && !expiry_.empty() && expiry_.top().next_use < now) {
    const Entry e = expiry_.top();
    expiry_.pop();
    auto it = buffers_.find(e.id);
    if (it == buffers_.end() || !it->second.resident || it->second.pinned ||
        !(Key(e.id, it->second) == e)) {
      continue;  // not its key any more
    }
    OnNextUse(e.id, kNoNextUse);
    ++scanned;
  }

  // Room for `bytes` due at `due` from resident buffers needed strictly
  // later than `later_than` (>= due), farthest first; nothing if they cannot
  // make it.
  const auto make_room = [&](uint64_t bytes, uint64_t due, uint64_t later_than, bool planned,
                             std::vector<PlannedAction>& out) {
    FlushResident();
    uint64_t gained = 0;
    std::vector<uint64_t> victims;
    // Two passes for an urgent fetch. First the clean buffers not needed
    // again this iteration (beyond the horizon), farthest first: a drop
    // costs no write-back, which a dirty one needed later may never have
    // needed (a shard of mlp_train --steps 20 next read after the run's
    // end: 4 MiB more than the optimum at a 60 % cap). Then everything
    // needed after the fetched buffer, farthest first: within the
    // iteration, taking a nearer clean buffer over a farther dirty one
    // brought it back sooner (5 % more bytes in replay_test). A planned
    // eviction takes clean ones only, in one pass.
    for (int pass = 0; pass < (planned ? 1 : 2); ++pass)
      for (auto r = resident_.rbegin();
           r != resident_.rend() && free + gained < bytes && scanned < options_.max_scan;
           ++r, ++scanned) {
        if (r->next_use <= later_than) break;  // all further ones are needed sooner
        const Buffer& v = buffers_.at(r->id);
        if (!planned && pass == 0) {
          if (r->next_use <= horizon) break;  // needed this iteration
          if (v.dirty) continue;
        } else if (!planned && std::find(victims.begin(), victims.end(), r->id) != victims.end()) {
          continue;  // taken in the first pass
        }
        // A buffer of the current operation may go for an urgent fetch (its
        // swap-out queues behind the operation, as every eviction does), not
        // for a planned one, which exists to start early.
        if (v.fetched || chosen.contains(r->id) || (v.last_use >= now && planned)) {
          continue;
        }
        if (planned) {
          // Only clean buffers (a drop, no copy): a planned write-back is a
          // copy swapping on demand may never make (the cap may not bind
          // before the buffer's use; in the library a dirty planned victim
          // cost up to 7x the bytes of on demand at a 75 % cap). An unknown
          // future is the cheapest room there is. Otherwise a gap too short
          // to fetch again under compute gains nothing.
          if (v.dirty) continue;
          if (r->next_use != kNoNextUse &&
              ComputeBetween(now, r->next_use) <
                  profile_->H2dSeconds(v.bytes) * options_.lead_factor) {
            continue;
          }
        }
        victims.push_back(r->id);
        gained += v.bytes;
      }
    if (free + gained < bytes && !planned) return false;
    for (uint64_t id : victims) {
      Buffer& v = buffers_.at(id);
      chosen.insert(id);
      v.proposed_for = due;
      out.push_back({PlannedAction::Kind::kEvict, id, v.dirty});
      free += v.bytes;
      if (planned) {
        ++stats_.planned_evictions;
        if (v.dirty) ++stats_.planned_copies;
      } else {
        ++stats_.fetch_evictions;
      }
    }
    return free >= bytes;
  };

  for (auto s = swapped_.begin();
       s != swapped_.end() && actions.size() < options_.max_actions && scanned < options_.max_scan;
       ++s, ++scanned) {
    const uint64_t due = s->next_use;
    if (due <= now) {
      stale.push_back(s->id);
      continue;
    }
    if (due > horizon) break;  // sorted: nothing later is due this iteration
    Buffer& b = buffers_.at(s->id);
    if (b.fetched) continue;  // proposed already, its swap-in not reported
    // Needed again after that use no sooner than a buffer the cap forced out
    // within the last iteration: its use will serve it (ChooseReach) rather
    // than bring it in to be forced out again, so a fetch would move its
    // bytes for nothing. Left to its use, and no room made for it.
    uint64_t gap = 0;  // to its use after `due`, where the profile knows it
    if (forced != nullptr) {
      gap = profile_->GapAfter(s->id, profile_->PhaseAt(origin_, due));
      if (gap != 0 && forced->Within(gap, due > period ? due - period : 0)) {
        ++stats_.left_to_use;
        continue;
      }
    }
    const double t = profile_->H2dSeconds(b.bytes);
    // Waiting one more operation would leave less compute before the use
    // than the transfer plus what is queued ahead of it.
    const double need = (queue + t) * options_.lead_factor;
    const double slack = ComputeBetween(now + 1, due);
    const bool urgent = slack < need;
    // Too late to hide a useful share of the transfer (no compute left
    // before the use, or none at all in the profile): fetching now would
    // only hold memory, and evict for it, for a stall it barely shortens;
    // left to the on-demand swap-in.
    if (urgent && ComputeBetween(now, due) < options_.min_cover * t) {
      demand += b.bytes;
      demand_until = std::max(demand_until, due);
      continue;
    }
    // Soon: within early_factor of its lead. Fetching earlier than that
    // only holds memory the step's own allocations may want, which then
    // costs evictions that would not have been needed.
    if (!urgent && slack >= need * options_.early_factor) continue;
    bool fetch = false;
    if (urgent) {
      std::vector<PlannedAction> evictions;
      // Under a next-use policy a use serves a buffer whose room would
      // displace one needed no later than its own use after that
      // (ChooseReach): a victim needed that soon would make the fetch bring
      // in what its use would have served, at the victim's bytes on top
      // (mlp_train --hidden 2048 at 50 %: twice the bytes of prefetch off).
      const uint64_t after = gap != 0 && due <= kNoNextUse - gap ? due + gap : due;
      fetch = free >= b.bytes || make_room(b.bytes, due, after, false, evictions);
      actions.insert(actions.end(), evictions.begin(), evictions.end());
    } else {
      fetch = free >= b.bytes + options_.free_reserve_bytes;
    }
    if (!fetch) {
      demand += b.bytes;
      demand_until = std::max(demand_until, due);
      continue;
    }
    actions.push_back({PlannedAction::Kind::kFetch, s->id, false});
    b.fetched = true;
    ++stats_.fetches;
    free -= b.bytes;
    queue += t;
    link_free_ = std::max(link_free_, stream_) + t;
    b.ready = link_free_;
  }

  // Planned eviction: what is due soon does not fit; make the room now,
  // from buffers needed after all of it, so write-backs overlap compute
  // instead of delaying the urgent fetch that would otherwise evict them.
  if (demand > free && actions.size() < options_.max_actions) {
    make_room(demand, demand_until, demand_until, true, actions);
  }

  // A prediction that passed without a use predicts nothing any more; moved
  // to the far end so it no longer takes the scan's place every plan.
  for (uint64_t id : stale) OnNextUse(id, kNoNextUse);
  return actions;
}

}  // namespace stensor
