#include "core/base/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>  // environ

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/json.h"

namespace stensor {
namespace {

// A config file is a few lines; the cap keeps STENSOR_CONFIG=/dev/zero from
// reading forever.
constexpr size_t kMaxConfigFileBytes = 1 << 20;

// Values longer than this are cut in error messages, which stay one line of
// readable length whatever was passed.
constexpr size_t kMaxQuotedBytes = 200;

// Parsers return OK, or InvalidArgument whose message is the specific reason
// (e.g. "device 0 is listed twice"), or empty when the accepted forms say
// all there is to say.
absl::Status Invalid(absl::string_view reason = "") { return absl::InvalidArgumentError(reason); }

// `value` quoted and C-escaped, so that any bytes print as one line.
std::string Quote(absl::string_view value) {
  if (value.size() <= kMaxQuotedBytes) {
    return absl::StrCat("\"", absl::CEscape(value), "\"");
  }
  return absl::StrCat("\"", absl::CEscape(value.substr(0, kMaxQuotedBytes)), "\"...");
}

// " (from FILE:LINE)" for a value read from the config file, else "".
std::string Origin(absl::string_view file, int line) {
  if (line == 0) return "";
  return absl::StrCat(" (from ", absl::CEscape(file), ":", line, ")");
}

// ---------------------------------------------------------------------------
// Value forms shared by several options.

template <typename T>
struct Keyword {
  const char* text;
  T value;
};

// Matches `text` case-insensitively against `keywords`.
template <typename T, size_t N>
absl::Status ParseKeyword(absl::string_view text, const Keyword<T> (&keywords)[N], T* out) {
  for (const Keyword<T>& keyword : keywords) {
    if (absl::EqualsIgnoreCase(text, keyword.text)) {
      *out = keyword.value;
      return absl::OkStatus();
    }
  }
  return Invalid();
}

// The first keyword for `value`, which is its canonical spelling.
template <typename T, size_t N>
std::string KeywordText(T value, const Keyword<T> (&keywords)[N]) {
  for (const Keyword<T>& keyword : keywords) {
    if (keyword.value == value) return keyword.text;
  }
  return "";
}

// Canonical spellings first.
constexpr Keyword<bool> kBooleans[] = {
    {"on", true},   {"off", false},   {"1", true},   {"0", false},
    {"true", true}, {"false", false}, {"yes", true}, {"no", false},
};
constexpr char kBooleanForms[] = "on or off (also 1/0, true/false, yes/no)";

// `on` and `off` also in their boolean spellings.
constexpr Keyword<SlabMode> kSlabModes[] = {
    {"auto", SlabMode::kAuto}, {"on", SlabMode::kOn},  {"off", SlabMode::kOff},
    {"1", SlabMode::kOn},      {"0", SlabMode::kOff},  {"true", SlabMode::kOn},
    {"false", SlabMode::kOff}, {"yes", SlabMode::kOn}, {"no", SlabMode::kOff},
};

constexpr Keyword<EvictionPolicyKind> kPolicies[] = {
    {"lru", EvictionPolicyKind::kLru},
    {"version", EvictionPolicyKind::kVersion},
    {"belady", EvictionPolicyKind::kBelady},
};

constexpr Keyword<LogLevel> kLogLevels[] = {
    {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
    {"warn", LogLevel::kWarn},   {"error", LogLevel::kError}, {"critical", LogLevel::kCritical},
    {"off", LogLevel::kOff},
};

constexpr Keyword<WriteInference> kWriteInferences[] = {
    {"signature", WriteInference::kSignature},
    {"conservative", WriteInference::kConservative},
};

// `off` also in its boolean spellings, as the option was once a boolean.
constexpr Keyword<VerifyMode> kVerifyModes[] = {
    {"off", VerifyMode::kOff}, {"copy", VerifyMode::kCopy}, {"hash", VerifyMode::kHash},
    {"0", VerifyMode::kOff},   {"false", VerifyMode::kOff}, {"no", VerifyMode::kOff},
};

// Every size unit is a power of 1024, whatever its spelling: `8GB` in a
// memory setting almost always means 8GiB, and one rule is easier to state.
constexpr Keyword<uint64_t> kSizeUnits[] = {
    {"", 1},
    {"b", 1},
    {"k", uint64_t{1} << 10},
    {"kb", uint64_t{1} << 10},
    {"kib", uint64_t{1} << 10},
    {"m", uint64_t{1} << 20},
    {"mb", uint64_t{1} << 20},
    {"mib", uint64_t{1} << 20},
    {"g", uint64_t{1} << 30},
    {"gb", uint64_t{1} << 30},
    {"gib", uint64_t{1} << 30},
    {"t", uint64_t{1} << 40},
    {"tb", uint64_t{1} << 40},
    {"tib", uint64_t{1} << 40},
};

// Units a size prints with, largest first.
constexpr Keyword<uint64_t> kPrintUnits[] = {
    {"TiB", uint64_t{1} << 40},
    {"GiB", uint64_t{1} << 30},
    {"MiB", uint64_t{1} << 20},
    {"KiB", uint64_t{1} << 10},
};

// Consumes the leading decimal digits of `*text` into `*value`. Returns
// false when there are none or they do not fit in 64 bits.
bool ConsumeDigits(absl::string_view* text, uint64_t* value, bool* overflow) {
  size_t n = 0;
  uint64_t v = 0;
  *overflow = false;
  while (n < text->size() && absl::ascii_isdigit((*text)[n])) {
    const uint64_t digit = (*text)[n] - '0';
    if (v > (UINT64_MAX - digit) / 10) *overflow = true;
    v = v * 10 + digit;
    ++n;
  }
  text->remove_prefix(n);
  *value = v;
  return n > 0 && !*overflow;
}

absl::Status ParseSize(absl::string_view text, uint64_t* bytes) {
  if (absl::StartsWith(text, "-")) return Invalid("must not be negative");
  uint64_t number;
  bool overflow;
  if (!ConsumeDigits(&text, &number, &overflow)) {
    return overflow ? Invalid("too large for 64 bits") : Invalid();
  }
  uint64_t unit = 0;
  if (!ParseKeyword(absl::StripLeadingAsciiWhitespace(text), kSizeUnits, &unit).ok()) {
    return Invalid();
  }
  if (number > UINT64_MAX / unit) return Invalid("too large for 64 bits");
  if (number == 0) return Invalid("must be greater than 0");
  *bytes = number * unit;
  return absl::OkStatus();
}

std::string SizeText(uint64_t bytes) {
  for (const Keyword<uint64_t>& unit : kPrintUnits) {
    if (bytes % unit.value == 0) {
      return absl::StrCat(bytes / unit.value, unit.text);
    }
  }
  return absl::StrCat(bytes);
}

// Parses `12.5` (GB/s, at most 3 decimals, optionally followed by GB/s)
// into MB/s.
absl::Status ParseGigabytesPerSecond(absl::string_view text, uint64_t* mbps) {
  constexpr uint64_t kMaxGBps = 100000;  // far above any link
  if (absl::StartsWith(text, "-")) return Invalid("must not be negative");
  absl::string_view number = absl::StripTrailingAsciiWhitespace(text);
  if (number.size() >= 4 && absl::EqualsIgnoreCase(number.substr(number.size() - 4), "GB/s")) {
    number = absl::StripTrailingAsciiWhitespace(number.substr(0, number.size() - 4));
  }
  uint64_t whole;
  bool overflow;
  if (!ConsumeDigits(&number, &whole, &overflow) || whole > kMaxGBps) {
    return overflow || whole > kMaxGBps ? Invalid("must be at most 100000 GB/s") : Invalid();
  }
  uint64_t fraction = 0;
  if (absl::ConsumePrefix(&number, ".")) {
    int decimals = 0;
    while (!number.empty() && absl::ascii_isdigit(number.front())) {
      if (++decimals > 3) return Invalid("at most 3 decimals");
      fraction = fraction * 10 + (number.front() - '0');
      number.remove_prefix(1);
    }
    if (decimals == 0) return Invalid();
    for (; decimals < 3; ++decimals) fraction *= 10;
  }
  if (!number.empty()) return Invalid();
  *mbps = whole * 1000 + fraction;
  if (*mbps == 0) return Invalid("must be greater than 0");
  if (*mbps > kMaxGBps * 1000) return Invalid("must be at most 100000 GB/s");
  return absl::OkStatus();
}

std::string GigabytesPerSecondText(uint64_t mbps) {
  std::string text = absl::StrCat(mbps / 1000);
  if (uint64_t fraction = mbps % 1000; fraction != 0) {
    std::string digits = absl::StrFormat("%03u", fraction);
    while (digits.back() == '0') digits.pop_back();
    absl::StrAppend(&text, ".", digits);
  }
  return text;
}

// STENSOR_BANDWIDTH: `H2D[,D2H]` in GB/s; one number is both directions.
absl::Status ParseBandwidth(absl::string_view text, BandwidthSetting* bandwidth) {
  std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(text, absl::MaxSplits(',', 1));
  BandwidthSetting parsed;
  if (absl::Status s =
          ParseGigabytesPerSecond(absl::StripAsciiWhitespace(parts.first), &parsed.h2d_mbps);
      !s.ok()) {
    return s;
  }
  parsed.d2h_mbps = parsed.h2d_mbps;
  if (text.find(',') != absl::string_view::npos) {
    if (absl::Status s =
            ParseGigabytesPerSecond(absl::StripAsciiWhitespace(parts.second), &parsed.d2h_mbps);
        !s.ok()) {
      return s;
    }
  }
  *bandwidth = parsed;
  return absl::OkStatus();
}

std::string BandwidthText(const BandwidthSetting& b) {
  if (b.measured()) return "";
  if (b.h2d_mbps == b.d2h_mbps) return GigabytesPerSecondText(b.h2d_mbps);
  return absl::StrCat(GigabytesPerSecondText(b.h2d_mbps), ",", GigabytesPerSecondText(b.d2h_mbps));
}

// Parses `37.5` (the text before '%') into millionths of a percent.
absl::Status ParsePercent(absl::string_view text, uint64_t* millionths) {
  constexpr int kMaxDecimals = 6;
  if (absl::StartsWith(text, "-")) return Invalid("must not be negative");
  uint64_t whole;
  bool overflow;
  if (!ConsumeDigits(&text, &whole, &overflow)) {
    return overflow ? Invalid("must be at most 100%") : Invalid();
  }
  uint64_t fraction = 0;
  if (absl::ConsumePrefix(&text, ".")) {
    const size_t before = text.size();
    // Overflow needs more digits than kMaxDecimals, so it is caught below.
    ConsumeDigits(&text, &fraction, &overflow);
    const size_t decimals = before - text.size();
    if (decimals == 0) return Invalid();
    if (decimals > kMaxDecimals) {
      return Invalid(absl::StrCat("at most ", kMaxDecimals, " decimals"));
    }
    for (size_t i = decimals; i < kMaxDecimals; ++i) fraction *= 10;
  }
  if (!text.empty()) return Invalid();
  if (whole > 100) return Invalid("must be at most 100%");
  const uint64_t value = whole * 1'000'000 + fraction;
  if (value > MemoryAmount::kHundredPercent) {
    return Invalid("must be at most 100%");
  }
  if (value == 0) return Invalid("must be greater than 0%");
  *millionths = value;
  return absl::OkStatus();
}

std::string PercentText(uint64_t millionths) {
  std::string text = absl::StrCat(millionths / 1'000'000);
  if (const uint64_t fraction = millionths % 1'000'000; fraction != 0) {
    std::string digits = absl::StrFormat("%06d", fraction);
    digits.erase(digits.find_last_not_of('0') + 1);
    absl::StrAppend(&text, ".", digits);
  }
  return absl::StrCat(text, "%");
}

// A size or a percentage (`8GiB`, `75%`).
absl::Status ParseAmount(absl::string_view text, MemoryAmount* amount) {
  text = absl::StripAsciiWhitespace(text);
  if (absl::ConsumeSuffix(&text, "%")) {
    amount->unit = MemoryAmount::Unit::kPercent;
    return ParsePercent(absl::StripTrailingAsciiWhitespace(text), &amount->value);
  }
  amount->unit = MemoryAmount::Unit::kBytes;
  return ParseSize(text, &amount->value);
}

std::string AmountText(const MemoryAmount& amount) {
  return amount.unit == MemoryAmount::Unit::kPercent ? PercentText(amount.value)
                                                     : SizeText(amount.value);
}

std::string OptionalAmountText(const std::optional<MemoryAmount>& amount) {
  return amount ? AmountText(*amount) : "";
}

// `8GiB`, `75%` or `0=8GiB,1=50%`.
absl::Status ParseMemoryLimit(absl::string_view text, MemoryLimit* limit) {
  *limit = MemoryLimit();
  if (!absl::StrContains(text, '=')) {
    MemoryAmount amount;
    if (absl::Status status = ParseAmount(text, &amount); !status.ok()) {
      return status;
    }
    limit->all_devices = amount;
    return absl::OkStatus();
  }
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    std::pair<absl::string_view, absl::string_view> device_and_amount =
        absl::StrSplit(entry, absl::MaxSplits('=', 1));
    absl::string_view device_text = absl::StripAsciiWhitespace(device_and_amount.first);
    uint64_t device;
    bool overflow;
    if (!ConsumeDigits(&device_text, &device, &overflow) && !overflow) {
      return Invalid();
    }
    if (!device_text.empty()) return Invalid();
    if (overflow || device >= MemoryLimit::kMaxDevices) {
      return Invalid(absl::StrCat("device ", absl::StripAsciiWhitespace(device_and_amount.first),
                                  " is out of range 0..", MemoryLimit::kMaxDevices - 1));
    }
    MemoryAmount amount;
    if (absl::Status status = ParseAmount(device_and_amount.second, &amount); !status.ok()) {
      if (status.message().empty()) return status;
      return Invalid(absl::StrCat("device ", device, ": ", status.message()));
    }
    if (!limit->per_device.emplace(static_cast<int>(device), amount).second) {
      return Invalid(absl::StrCat("device ", device, " is listed twice"));
    }
  }
  return absl::OkStatus();
}

std::string MemoryLimitText(const MemoryLimit& limit) {
  if (limit.all_devices) return AmountText(*limit.all_devices);
  std::vector<std::string> entries;
  for (const auto& [device, amount] : limit.per_device) {
    entries.push_back(absl::StrCat(device, "=", AmountText(amount)));
  }
  return absl::StrJoin(entries, ",");
}

// Checks that every '%' in an access-log pattern starts %p, %r or %%.
absl::Status ValidateLogPattern(absl::string_view pattern) {
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') continue;
    if (i + 1 == pattern.size()) return Invalid("it ends in a lone %");
    const char next = pattern[++i];
    if (next != 'p' && next != 'r' && next != '%') {
      return Invalid(absl::StrCat("unknown placeholder ", Quote(pattern.substr(i - 1, 2))));
    }
  }
  return absl::OkStatus();
}

bool UsesRank(absl::string_view pattern) {
  for (size_t i = 0; i + 1 < pattern.size(); ++i) {
    if (pattern[i] != '%') continue;
    if (pattern[++i] == 'r') return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// The option table.

using ParseFn = absl::Status (*)(absl::string_view value, Config* config);
using PrintFn = std::string (*)(const Config& config);

struct Option {
  const char* name;
  const char* accepted_forms;
  const char* help;
  bool allowed_in_file;
  // Describe() prints the value as a JSON boolean rather than a string.
  bool is_boolean;
  // Sets the option from a non-empty, trimmed value.
  ParseFn parse;
  // The canonical text `parse` turns back into the same setting.
  PrintFn print;
};

constexpr char kConfigOption[] = "STENSOR_CONFIG";

constexpr Option kOptions[] = {
    {"STENSOR_MEMORY_LIMIT",
     "a size (e.g. 8GiB, 512MiB, 1073741824; units B, K/KB/KiB, M/MB/MiB, "
     "G/GB/GiB, T/TB/TiB in any case, all multiples of 1024), a percentage "
     "of device memory (e.g. 75%, 37.5%; above 0, at most 100), or "
     "per-device entries (e.g. 0=8GiB,1=4GiB; devices 0..63, each a size or "
     "a percentage)",
     "Cap on the device memory stensor lets the program use, per device; "
     "unset = no cap. In the per-device form, unlisted devices have no cap.",
     true, false,
     [](absl::string_view v, Config* c) { return ParseMemoryLimit(v, &c->memory_limit); },
     [](const Config& c) { return MemoryLimitText(c.memory_limit); }},
    {"STENSOR_HOST_LIMIT",
     "a size (e.g. 64GiB, 1073741824; units B, K/KB/KiB, M/MB/MiB, G/GB/GiB, "
     "T/TB/TiB in any case, all multiples of 1024) or a percentage of host "
     "memory (e.g. 50%; above 0, at most 100)",
     "Cap on the pinned host memory that holds swapped-out buffers; unset = "
     "no limit.",
     true, false,
     [](absl::string_view v, Config* c) {
       MemoryAmount amount;
       if (absl::Status status = ParseAmount(v, &amount); !status.ok()) {
         return status;
       }
       c->host_limit = amount;
       return absl::OkStatus();
     },
     [](const Config& c) { return OptionalAmountText(c.host_limit); }},
    {"STENSOR_POLICY", "lru, version or belady",
     "Which buffers are swapped out first: least recently used, unmodified "
     "copies first (free to drop), or by next use in the profiled "
     "iteration.",
     true, false,
     [](absl::string_view v, Config* c) { return ParseKeyword(v, kPolicies, &c->policy); },
     [](const Config& c) { return KeywordText(c.policy, kPolicies); }},
    {"STENSOR_PREFETCH", kBooleanForms,
     "Swap buffers in ahead of use, as planned from the profiled iteration.", true, true,
     [](absl::string_view v, Config* c) { return ParseKeyword(v, kBooleans, &c->prefetch); },
     [](const Config& c) { return KeywordText(c.prefetch, kBooleans); }},
    {"STENSOR_SLABS", "auto, on or off (also 1/0, true/false, yes/no)",
     "Pack allocations below half a granule (1 MiB on most GPUs) into "
     "swappable slabs of one granule where the device maps host memory; "
     "off: each one is the driver's and stays on the device; auto: off "
     "until those a device holds reach an eighth of its cap.",
     true, false,
     [](absl::string_view v, Config* c) { return ParseKeyword(v, kSlabModes, &c->slabs); },
     [](const Config& c) { return KeywordText(c.slabs, kSlabModes); }},
    {"STENSOR_BANDWIDTH",
     "a bandwidth in GB/s (10^9 bytes per second, at most 3 decimals, "
     "optionally followed by GB/s), e.g. 25 or 12.5, or two of them, "
     "host-to-device and device-to-host, e.g. 25,20",
     "Host<->device bandwidth the prefetch planner assumes; unset = measured "
     "by a short pinned-copy probe at start.",
     true, false, [](absl::string_view v, Config* c) { return ParseBandwidth(v, &c->bandwidth); },
     [](const Config& c) { return BandwidthText(c.bandwidth); }},
    {"STENSOR_ITERATION_MARKER",
     "a kernel name, mangled (e.g. _Z6updatePfPKfi) or demangled without "
     "parameters (e.g. mlp::update)",
     "Kernel whose launch starts a training iteration; unset = found from the "
     "repeating sequence of launches.",
     true, false,
     [](absl::string_view v, Config* c) {
       c->iteration_marker = std::string(v);
       return absl::OkStatus();
     },
     [](const Config& c) { return c.iteration_marker; }},
    {"STENSOR_ACCESS_LOG",
     "a file path, where %p stands for the process id, %r for the rank "
     "(RANK, else LOCAL_RANK, else 0) and %% for a literal %",
     "File that receives every inferred buffer access; unset = no log.", true, false,
     [](absl::string_view v, Config* c) {
       if (absl::Status status = ValidateLogPattern(v); !status.ok()) {
         return status;
       }
       c->access_log = std::string(v);
       return absl::OkStatus();
     },
     [](const Config& c) { return c.access_log; }},
    {"STENSOR_LOG_LEVEL", "trace, debug, info, warn, error, critical or off",
     "Least severe message stensor logs to stderr.", true, false,
     [](absl::string_view v, Config* c) { return ParseKeyword(v, kLogLevels, &c->log_level); },
     [](const Config& c) { return KeywordText(c.log_level, kLogLevels); }},
    {"STENSOR_STATS", kBooleanForms, "Print swap and memory statistics when the program exits.",
     true, true,
     [](absl::string_view v, Config* c) { return ParseKeyword(v, kBooleans, &c->stats); },
     [](const Config& c) { return KeywordText(c.stats, kBooleans); }},
    {"STENSOR_WRITE_INFERENCE", "signature or conservative",
     "How kernel pointer parameters are classified: const T* in the mangled "
     "name is a read (signature), or every pointer may be written "
     "(conservative).",
     true, false,
     [](absl::string_view v, Config* c) {
       return ParseKeyword(v, kWriteInferences, &c->write_inference);
     },
     [](const Config& c) { return KeywordText(c.write_inference, kWriteInferences); }},
    {"STENSOR_VERIFY", "off (also 0, false, no), copy or hash",
     "Check each clean drop before it happens: compare the device contents "
     "with the host copy (copy), or hash them on the device against the hash "
     "taken when the host copy was made (hash). A mismatch is logged and the "
     "buffer copied instead.",
     true, false,
     [](absl::string_view v, Config* c) { return ParseKeyword(v, kVerifyModes, &c->verify); },
     [](const Config& c) { return KeywordText(c.verify, kVerifyModes); }},
    {"STENSOR_REAL_LIBCUDA", "the path of the real CUDA driver library",
     "Driver library stensor forwards to; unset = the system's libcuda.so.1.", true, false,
     [](absl::string_view v, Config* c) {
       c->real_libcuda = std::string(v);
       return absl::OkStatus();
     },
     [](const Config& c) { return c.real_libcuda; }},
    {kConfigOption, "the path of a file of NAME=value lines",
     "File read for any option the environment leaves unset: NAME=value "
     "lines, # comment lines and blank lines.",
     false, false,
     [](absl::string_view v, Config* c) {
       c->config_file = std::string(v);
       return absl::OkStatus();
     },
     [](const Config& c) { return c.config_file; }},
};

const Option* FindOption(absl::string_view name) {
  for (const Option& option : kOptions) {
    if (name == option.name) return &option;
  }
  return nullptr;
}

// Edits (insert, delete, replace, swap two neighbours) turning `a` into `b`.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// The option whose name is fewest edits from `name` (the first of equals).
absl::string_view ClosestOption(absl::string_view name) {
  absl::string_view best;
  size_t best_distance = SIZE_MAX;
  for (const Option& option : kOptions) {
    const size_t distance = EditDistance(name, option.name);
    if (distance < best_distance) {
      best = option.name;
      best_distance = distance;
    }
  }
  return best;
}

// ---------------------------------------------------------------------------
// The config file.

// A value read from the config file and where it was.
struct FileValue {
  std::string value;
  int line;
};

absl::StatusOr<std::string> ReadConfigFile(const std::string& path) {
  auto failure = [&path](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("stensor: cannot read ", kConfigOption, "=", Quote(path), ": ", why));
  };
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer, and the
  // constructor of every preloaded process (the shell, `timeout`) reads it.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return failure(std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return failure(std::strerror(error));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return failure("not a regular file (a FIFO, device or directory is never read)");
  }
  std::string text;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return failure(std::strerror(error));
    }
    if (n == 0) break;
    text.append(buffer, n);
    if (text.size() > kMaxConfigFileBytes) {
      close(fd);
      return failure(absl::StrCat("larger than ", SizeText(kMaxConfigFileBytes)));
    }
  }
  close(fd);
  return text;
}

// Splits the file's text into its settings, by option name.
absl::StatusOr<std::map<std::string, FileValue>> ParseConfigFile(absl::string_view path,
                                                                 absl::string_view text) {
  std::map<std::string, FileValue> values;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string origin = Origin(path, line_number);
    const size_t equals = line.find('=');
    if (equals == absl::string_view::npos || line.find('\0') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("stensor: invalid line ", Quote(line), origin,
                       ": expected NAME=value, a # comment or a blank line"));
    }
    const absl::string_view name = absl::StripTrailingAsciiWhitespace(line.substr(0, equals));
    const Option* option = FindOption(name);
    if (option == nullptr) {
      std::vector<absl::string_view> known;
      for (const Option& o : kOptions) {
        if (o.allowed_in_file) known.push_back(o.name);
      }
      return absl::InvalidArgumentError(absl::StrCat("stensor: unknown option ", Quote(name),
                                                     origin, ": expected one of ",
                                                     absl::StrJoin(known, ", ")));
    }
    if (!option->allowed_in_file) {
      return absl::InvalidArgumentError(
          absl::StrCat("stensor: ", option->name, " cannot be set in a config file", origin));
    }
    auto [it, inserted] = values.emplace(
        option->name,
        FileValue{std::string(absl::StripLeadingAsciiWhitespace(line.substr(equals + 1))),
                  line_number});
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("stensor: ", option->name, " is set twice (lines ", it->second.line, " and ",
                       line_number, " of ", absl::CEscape(path), ")"));
    }
  }
  return values;
}

// The rank %r expands to, from RANK, else LOCAL_RANK, else 0.
absl::StatusOr<int> LookUpRank(const EnvLookup& getenv) {
  for (const char* variable : {"RANK", "LOCAL_RANK"}) {
    const char* raw = getenv(variable);
    const absl::string_view value = absl::StripAsciiWhitespace(raw == nullptr ? "" : raw);
    if (value.empty()) continue;
    absl::string_view digits = value;
    uint64_t rank;
    bool overflow;
    if (!ConsumeDigits(&digits, &rank, &overflow) || !digits.empty() || rank > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("stensor: invalid ", variable, "=", Quote(value),
                       " (used for %r in STENSOR_ACCESS_LOG): expected an integer from 0 "
                       "to ",
                       INT_MAX));
    }
    return static_cast<int>(rank);
  }
  return 0;
}

}  // namespace

size_t MemoryAmount::Resolve(size_t total) const {
  if (unit == Unit::kBytes) return value;
  return absl::Uint128Low64(absl::uint128(total) * value / kHundredPercent);
}

std::optional<size_t> MemoryLimit::BytesFor(int device, size_t device_total) const {
  if (all_devices) return all_devices->Resolve(device_total);
  const auto it = per_device.find(device);
  if (it == per_device.end()) return std::nullopt;
  return it->second.Resolve(device_total);
}

absl::StatusOr<Config> Config::Parse(const EnvLookup& getenv) {
  // Trimmed; empty when unset.
  auto env = [&getenv](const char* name) {
    const char* value = getenv(name);
    return std::string(absl::StripAsciiWhitespace(value ? value : ""));
  };

  std::map<std::string, FileValue> file_values;
  const std::string file = env(kConfigOption);
  if (!file.empty()) {
    absl::StatusOr<std::string> text = ReadConfigFile(file);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::map<std::string, FileValue>> values = ParseConfigFile(file, *text);
    if (!values.ok()) return values.status();
    file_values = *std::move(values);
  }

  Config config;
  for (const Option& option : kOptions) {
    std::string value = env(option.name);
    int line = 0;
    if (value.empty()) {
      const auto it = file_values.find(option.name);
      if (it == file_values.end() || it->second.value.empty()) continue;
      value = it->second.value;
      line = it->second.line;
    }
    const absl::Status status = option.parse(value, &config);
    if (status.ok()) continue;
    const std::string reason = status.message().empty() ? "" : absl::StrCat(status.message(), "; ");
    return absl::InvalidArgumentError(absl::StrCat("stensor: invalid ", option.name, "=",
                                                   Quote(value), Origin(file, line), ": ", reason,
                                                   "expected ", option.accepted_forms));
  }

  if (UsesRank(config.access_log)) {
    absl::StatusOr<int> rank = LookUpRank(getenv);
    if (!rank.ok()) return rank.status();
    config.rank = *rank;
  }
  return config;
}

// stensor's variables that set nothing in the library: STENSOR_LIBRARY
// names it for the Python package (python/stensor).
constexpr const char* kOtherVariables[] = {"STENSOR_LIBRARY"};

bool IsOtherVariable(absl::string_view name) {
  for (const char* other : kOtherVariables) {
    if (name == other) return true;
  }
  return false;
}

absl::Status CheckVariableNames(absl::Span<const std::string> names, const EnvLookup& getenv) {
  for (const std::string& name : names) {
    if (!absl::StartsWith(name, "STENSOR_") || FindOption(name) != nullptr ||
        IsOtherVariable(name)) {
      continue;
    }
    const char* value = getenv(name.c_str());
    std::vector<absl::string_view> known;
    for (const Option& o : kOptions) known.push_back(o.name);
    return absl::InvalidArgumentError(
        absl::StrCat("stensor: unknown variable ", name, "=", Quote(value == nullptr ? "" : value),
                     " in the environment: did you mean ", ClosestOption(name),
                     "? (stensor's options are ", absl::StrJoin(known, ", "), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Config> Config::FromEnvironment() {
  std::vector<std::string> names;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const absl::string_view text(*entry);
    names.emplace_back(text.substr(0, text.find('=')));
  }
  const EnvLookup lookup = [](const char* name) { return std::getenv(name); };
  if (absl::Status s = CheckVariableNames(names, lookup); !s.ok()) return s;
  return Parse(lookup);
}

std::optional<size_t> Config::HostLimitBytes(size_t host_total) const {
  if (!host_limit) return std::nullopt;
  return host_limit->Resolve(host_total);
}

std::string Config::AccessLogPath(int pid) const { return ExpandLogPath(access_log, pid, rank); }

std::optional<std::string> Config::ValueText(absl::string_view option) const {
  const Option* found = FindOption(option);
  if (found == nullptr) return std::nullopt;
  return found->print(*this);
}

std::string Config::Describe() const {
  std::string json = "{";
  for (const Option& option : kOptions) {
    if (json.size() > 1) json.append(", ");
    AppendJsonString(&json, option.name);
    json.append(": ");
    if (option.is_boolean) {
      // A boolean's canonical text is "on" or "off".
      json.append(option.print(*this) == "on" ? "true" : "false");
    } else {
      AppendJsonString(&json, option.print(*this));
    }
  }
  json.append("}");
  return json;
}

bool operator==(const Config& a, const Config& b) {
  return a.memory_limit == b.memory_limit && a.host_limit == b.host_limit && a.policy == b.policy &&
         a.prefetch == b.prefetch && a.slabs == b.slabs && a.bandwidth == b.bandwidth &&
         a.iteration_marker == b.iteration_marker && a.access_log == b.access_log &&
         a.log_level == b.log_level && a.stats == b.stats &&
         a.write_inference == b.write_inference && a.verify == b.verify &&
         a.real_libcuda == b.real_libcuda && a.config_file == b.config_file && a.rank == b.rank;
}

const std::vector<OptionInfo>& Options() {
  // Built once, never destroyed, so it stays valid in exit-time code.
  static const std::vector<OptionInfo>* const options = [] {
    auto* rows = new std::vector<OptionInfo>();
    const Config defaults;
    for (const Option& option : kOptions) {
      rows->push_back({option.name, option.print(defaults), option.accepted_forms, option.help,
                       option.allowed_in_file});
    }
    return rows;
  }();
  return *options;
}

std::string ExpandLogPath(absl::string_view pattern, int pid, int rank) {
  std::string path;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      path.push_back(pattern[i]);
      continue;
    }
    switch (pattern[i + 1]) {
      case 'p':
        absl::StrAppend(&path, pid);
        ++i;
        break;
      case 'r':
        absl::StrAppend(&path, rank);
        ++i;
        break;
      case '%':
        path.push_back('%');
        ++i;
        break;
      default:
        path.push_back('%');
    }
  }
  return path;
}

}  // namespace stensor
