// How the memory manager charges an allocation against the cap, for every
// tool that reads its access logs (`stensor sim`, `trace`, `report`), so
// they count resident bytes as the library's own statistics do
// (core/swap/memory_manager.cc): from half a granule up, a cuMemAlloc buffer and
// a cuMemAllocAsync one from the default pool are swappable VMM buffers that
// take whole granules; the rest (smaller, pitched, from an explicit pool)
// take 4 KiB pages; the program's own VMM memory counts as it is. And the
// caps a log's header recorded, read as the library reads them.
//
// Thread-safety: pure functions.
#ifndef STENSOR_TOOLS_CHARGE_H_
#define STENSOR_TOOLS_CHARGE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "core/base/config.h"

namespace stensor {

inline constexpr uint64_t kDefaultGranularity = 2u << 20;  // VMM granule of current GPUs
inline constexpr uint64_t kPageBytes = 4096;               // plain allocations' unit

struct AllocationCharge {
  uint64_t bytes = 0;      // against the cap
  bool swappable = false;  // a VMM buffer stensor may evict
  // Below half a granule, from cuMemAlloc or the default pool: where the
  // device maps host memory and no room is left, the manager makes it a
  // buffer of one granule born in host memory (ServesSmallFromHost).
  bool small = false;
};

// An `alloc` record's charge: `kind` and `api` as logged (an empty kind is
// "device"), `bytes` below 2^60 (callers refuse larger ones first).
inline AllocationCharge ChargeOf(absl::string_view kind, absl::string_view api, uint64_t bytes,
                                 uint64_t granularity = kDefaultGranularity) {
  auto align_up = [](uint64_t v, uint64_t unit) { return (v + unit - 1) / unit * unit; };
  if (kind == "app_vmm") return {bytes, false};
  const bool mem_alloc =
      (kind.empty() || kind == "device") && api.find("Pitch") == absl::string_view::npos;
  const bool default_pool = kind == "stream_ordered" && absl::StartsWith(api, "cuMemAllocAsync");
  if ((mem_alloc || default_pool) && bytes >= granularity / 2) {
    return {align_up(bytes, granularity), true, false};
  }
  return {align_up(bytes, kPageBytes), false, mem_alloc || default_pool};
}

// The caps a log's header recorded (its STENSOR_MEMORY_LIMIT and
// STENSOR_HOST_LIMIT texts; "" = unset), parsed as the library parses them
// (core/base/config.h). Nothing else is read: no file, no environment.
inline absl::StatusOr<Config> LimitsFromHeader(const std::string& memory_limit,
                                               const std::string& host_limit) {
  return Config::Parse([&](const char* name) -> const char* {
    const absl::string_view option(name);
    if (option == "STENSOR_MEMORY_LIMIT") return memory_limit.c_str();
    if (option == "STENSOR_HOST_LIMIT") return host_limit.c_str();
    return nullptr;
  });
}

}  // namespace stensor

#endif  // STENSOR_TOOLS_CHARGE_H_
