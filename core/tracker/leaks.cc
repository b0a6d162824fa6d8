#include "core/tracker/leaks.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stensor {

void Leaks::OnAlloc(uint64_t id, const char* api, uint64_t bytes, int device) {
  if (id == 0) return;  // not registered (an overlapping range)
  MutexLock lock(&mu_);
  live_[id] = Live{api, nullptr, bytes, device};
}

void Leaks::OnFree(uint64_t id) {
  MutexLock lock(&mu_);
  live_.erase(id);
}

void Leaks::OnLaunch(const char* kernel, absl::Span<const uint64_t> reads,
                     absl::Span<const uint64_t> writes) {
  MutexLock lock(&mu_);
  for (absl::Span<const uint64_t> ids : {reads, writes}) {
    for (uint64_t id : ids) {
      auto it = live_.find(id);
      if (it != live_.end() && it->second.first_kernel == nullptr) it->second.first_kernel = kernel;
    }
  }
}

std::vector<std::string> Leaks::Report(size_t shown) const {
  std::vector<std::tuple<uint64_t, uint64_t, Live>> leaked;  // (bytes, id, what)
  {
    MutexLock lock(&mu_);
    for (const auto& [id, live] : live_) leaked.emplace_back(live.bytes, id, live);
  }
  if (leaked.empty()) return {};
  // Largest first; the oldest (smallest id) first among equals.
  std::sort(leaked.begin(), leaked.end(), [](const auto& a, const auto& b) {
    return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) > std::get<0>(b)
                                            : std::get<1>(a) < std::get<1>(b);
  });
  uint64_t total = 0;
  for (const auto& l : leaked) total += std::get<0>(l);
  std::vector<std::string> lines;
  lines.push_back(
      absl::StrFormat("%u device buffer%s never freed, %u bytes (%.1f MiB) in all%s", leaked.size(),
                      leaked.size() == 1 ? "" : "s", total, total / 1048576.0,
                      leaked.size() > shown ? absl::StrCat("; the ", shown, " largest:") : ":"));
  for (size_t i = 0; i < leaked.size() && i < shown; ++i) {
    const auto& [bytes, id, live] = leaked[i];
    lines.push_back(absl::StrFormat(
        "  buffer %u: %u bytes on device %d, from %s, first used by %s", id, bytes, live.device,
        live.api, live.first_kernel != nullptr ? live.first_kernel : "no kernel"));
  }
  if (leaked.size() > shown) {
    uint64_t rest = 0;
    for (size_t i = shown; i < leaked.size(); ++i) rest += std::get<0>(leaked[i]);
    lines.push_back(absl::StrFormat("  and %u more, %u bytes", leaked.size() - shown, rest));
  }
  return lines;
}

}  // namespace stensor
