// The user's settings: every STENSOR_* option, parsed once into a Config.
//
// All options live in one table in config.cc (name, accepted forms, help,
// parser, printer); Options() exposes it so documentation and error messages
// come from that one place. Values come from the environment and from the
// file named by STENSOR_CONFIG; the environment wins. An empty value (after
// trimming ASCII whitespace) counts as unset, so `STENSOR_POLICY=` keeps the
// default. A value that does not parse makes Parse fail with a status whose
// message is one line naming the variable, the value and the accepted forms:
//
//   stensor: invalid STENSOR_POLICY="fifo": expected lru, version or belady
//
// The library prints that line and stops at start; nothing here aborts.
//
// Thread-safety: a Config is immutable once built; share it as
// `const Config&` and read it from any thread without locking. Options() is
// safe to call from any thread. FromEnvironment reads the process
// environment and must not race with setenv.
#ifndef STENSOR_CORE_BASE_CONFIG_H_
#define STENSOR_CORE_BASE_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace stensor {

// A number of bytes, or a share of a total that is only known later (device
// or host memory size).
struct MemoryAmount {
  enum class Unit { kBytes, kPercent };

  // A percentage is kept in millionths of a percent so that `37.5%` is exact
  // and resolves with integer arithmetic.
  static constexpr uint64_t kHundredPercent = 100'000'000;

  Unit unit = Unit::kBytes;
  // Bytes for kBytes (> 0); millionths of a percent for kPercent, in
  // (0, kHundredPercent].
  uint64_t value = 0;

  // The amount in bytes, given the total a percentage refers to.
  size_t Resolve(size_t total) const;

  friend bool operator==(const MemoryAmount& a, const MemoryAmount& b) {
    return a.unit == b.unit && a.value == b.value;
  }
  friend bool operator!=(const MemoryAmount& a, const MemoryAmount& b) { return !(a == b); }
};

// STENSOR_MEMORY_LIMIT: one cap for every device, or caps per device.
struct MemoryLimit {
  // Device indices a per-device entry may name.
  static constexpr int kMaxDevices = 64;

  // Applies to every device (`8GiB`, `75%`); unset in the per-device form.
  std::optional<MemoryAmount> all_devices;
  // Per-device form (`0=8GiB,1=4GiB`): a device not listed has no cap.
  std::map<int, MemoryAmount> per_device;

  // The cap for `device` in bytes, percentages taken of `device_total`, or
  // nullopt when that device has no cap.
  std::optional<size_t> BytesFor(int device, size_t device_total) const;

  friend bool operator==(const MemoryLimit& a, const MemoryLimit& b) {
    return a.all_devices == b.all_devices && a.per_device == b.per_device;
  }
  friend bool operator!=(const MemoryLimit& a, const MemoryLimit& b) { return !(a == b); }
};

// STENSOR_POLICY: which buffers to swap out first.
enum class EvictionPolicyKind { kLru, kVersion, kBelady };

// STENSOR_LOG_LEVEL, in spdlog's order (most verbose first).
// STENSOR_SLABS.
enum class SlabMode { kOff, kOn, kAuto };

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kCritical, kOff };

// STENSOR_WRITE_INFERENCE: how a kernel's pointer parameters are classified.
enum class WriteInference {
  // `const T*` parameters of a mangled kernel name are reads.
  kSignature,
  // Every pointer parameter may be written.
  kConservative,
};

// STENSOR_VERIFY: whether a clean drop (a device copy dropped because its
// host copy is current) is checked first.
enum class VerifyMode {
  kOff,
  // The device contents are compared with the host copy, byte by byte.
  kCopy,
  // A hash kernel reads the device contents; its hash is compared with the
  // one taken when the host copy was made.
  kHash,
};

// STENSOR_BANDWIDTH: host<->device bandwidth per direction, in MB/s (10^6
// bytes per second); 0 = measured by a short pinned-copy probe at start.
struct BandwidthSetting {
  uint64_t h2d_mbps = 0;
  uint64_t d2h_mbps = 0;
  bool measured() const { return h2d_mbps == 0; }
  friend bool operator==(const BandwidthSetting& a, const BandwidthSetting& b) {
    return a.h2d_mbps == b.h2d_mbps && a.d2h_mbps == b.d2h_mbps;
  }
};

// Returns a variable's value, or nullptr when it is not set (the shape of
// ::getenv, so tests can pass a map instead of the real environment).
using EnvLookup = std::function<const char*(const char*)>;

// The effective settings. A default-constructed Config holds the defaults
// (Options() renders them from here, so they are written down only once).
struct Config {
  // STENSOR_MEMORY_LIMIT; default: no cap.
  MemoryLimit memory_limit;
  // STENSOR_HOST_LIMIT; nullopt = no limit.
  std::optional<MemoryAmount> host_limit;
  // STENSOR_POLICY. `belady` by default: until an iteration is profiled it
  // orders as `version` does, and once one is it evicts what is needed last.
  EvictionPolicyKind policy = EvictionPolicyKind::kBelady;
  // STENSOR_PREFETCH: fetches and planned evictions from the profiled
  // iteration (policy/prefetch_planner.h). Nothing is planned before a
  // profile exists, so an irregular program only pays the bookkeeping.
  // On by default: with a link to hide, it shortens capped steps by a third
  // and more (docs/measurements.md), for a few percent more bytes moved.
  bool prefetch = true;
  // STENSOR_SLABS: allocations below half a granule packed into swappable
  // one-granule slabs (core/swap/slab_pool.h), where host memory can stand
  // in at an address; otherwise driver allocations, charged, never swapped.
  // `auto`: once those a device holds reach a share of its cap (SlabOnset).
  SlabMode slabs = SlabMode::kAuto;
  // STENSOR_BANDWIDTH; default: measured.
  BandwidthSetting bandwidth;
  // STENSOR_ITERATION_MARKER: the kernel whose launch starts an iteration,
  // as its mangled name or its demangled name without parameters; "" = the
  // iteration is found from the repeating sequence of launches.
  std::string iteration_marker;
  // STENSOR_ACCESS_LOG, the pattern as given; "" = no log.
  std::string access_log;
  // STENSOR_LOG_LEVEL.
  LogLevel log_level = LogLevel::kWarn;
  // STENSOR_STATS.
  bool stats = false;
  // STENSOR_WRITE_INFERENCE.
  WriteInference write_inference = WriteInference::kSignature;
  // STENSOR_VERIFY.
  VerifyMode verify = VerifyMode::kOff;
  // STENSOR_REAL_LIBCUDA; "" = the system's libcuda.so.1.
  std::string real_libcuda;
  // STENSOR_CONFIG: the file the settings were also read from; "" = none.
  std::string config_file;
  // The process's rank for `%r` in access_log: RANK, else LOCAL_RANK, else
  // 0. Looked up only when access_log uses %r, so a malformed RANK cannot
  // stop a program that does not need it.
  int rank = 0;

  // Builds the settings from `getenv` and the file named by its
  // STENSOR_CONFIG. Never crashes on any input.
  static absl::StatusOr<Config> Parse(const EnvLookup& getenv);
  // Parse over the process environment.
  static absl::StatusOr<Config> FromEnvironment();

  // The host-memory limit in bytes (percentages of `host_total`), or
  // nullopt for no limit.
  std::optional<size_t> HostLimitBytes(size_t host_total) const;

  // The access log's file name for process `pid`, or "" when there is none.
  std::string AccessLogPath(int pid) const;

  // The effective value of `option` (e.g. "STENSOR_POLICY") in the
  // canonical form its parser accepts; "" when unset. nullopt for a name
  // that is not an option.
  std::optional<std::string> ValueText(absl::string_view option) const;

  // The effective settings as a one-line JSON object keyed by option name,
  // booleans as JSON booleans and everything else as strings ("" = unset),
  // for the access log's header.
  std::string Describe() const;

  friend bool operator==(const Config& a, const Config& b);
  friend bool operator!=(const Config& a, const Config& b) { return !(a == b); }
};

// Checks the names of the environment's variables: every STENSOR_* one must
// be an option or STENSOR_LIBRARY, the Python package's (a misspelled
// STENSOR_MEMRY_LIMIT would otherwise leave the run uncapped without a word). The error names the
// variable, its value (from `getenv`) and the closest option. FromEnvironment checks the process
// environment with it before parsing.
absl::Status CheckVariableNames(absl::Span<const std::string> names, const EnvLookup& getenv);

// One row of the option table.
struct OptionInfo {
  std::string name;            // e.g. "STENSOR_POLICY"
  std::string default_value;   // canonical text; "" = unset
  std::string accepted_forms;  // completes "expected ..."
  std::string help;            // one sentence for documentation
  bool allowed_in_file;        // false only for STENSOR_CONFIG itself
};

// Every option, in a fixed order (the order of Describe()).
const std::vector<OptionInfo>& Options();

// Expands `%p` to `pid`, `%r` to `rank` and `%%` to `%` in an access-log
// pattern; any other `%` is copied as is (Parse rejects such patterns).
std::string ExpandLogPath(absl::string_view pattern, int pid, int rank);

}  // namespace stensor

#endif  // STENSOR_CORE_BASE_CONFIG_H_
