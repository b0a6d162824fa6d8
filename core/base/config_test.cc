#include "core/base/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stensor {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kGiB = uint64_t{1} << 30;

// A fake environment: the variables in `vars`, nothing else.
EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

// Writes `text` to a fresh file under the test's temporary directory.
std::string WriteTempFile(const std::string& text) {
  static int counter = 0;
  const std::string path = absl::StrCat(testing::TempDir(), "/config_test_", ++counter, ".conf");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

const OptionInfo& Info(const std::string& name) {
  for (const OptionInfo& option : Options()) {
    if (option.name == name) return option;
  }
  ADD_FAILURE() << "no option " << name;
  return Options().front();
}

// Every accepted form prints back as its canonical text, which parses to
// the same setting.
struct ValidCase {
  const char* variable;
  const char* value;
  const char* canonical;
};

constexpr ValidCase kValidCases[] = {
    {"STENSOR_MEMORY_LIMIT", "8GiB", "8GiB"},
    {"STENSOR_MEMORY_LIMIT", "8gib", "8GiB"},
    {"STENSOR_MEMORY_LIMIT", "8G", "8GiB"},
    {"STENSOR_MEMORY_LIMIT", "8GB", "8GiB"},
    {"STENSOR_MEMORY_LIMIT", "8 GiB", "8GiB"},
    {"STENSOR_MEMORY_LIMIT", "  8GiB\t", "8GiB"},
    {"STENSOR_MEMORY_LIMIT", "512MiB", "512MiB"},
    {"STENSOR_MEMORY_LIMIT", "512m", "512MiB"},
    {"STENSOR_MEMORY_LIMIT", "2048M", "2GiB"},
    {"STENSOR_MEMORY_LIMIT", "1073741824", "1GiB"},
    {"STENSOR_MEMORY_LIMIT", "1000", "1000"},
    {"STENSOR_MEMORY_LIMIT", "1000B", "1000"},
    {"STENSOR_MEMORY_LIMIT", "4kb", "4KiB"},
    {"STENSOR_MEMORY_LIMIT", "1T", "1TiB"},
    {"STENSOR_MEMORY_LIMIT", "16777215TiB", "16777215TiB"},  // just fits
    {"STENSOR_MEMORY_LIMIT", "18446744073709551615", "18446744073709551615"},
    {"STENSOR_MEMORY_LIMIT", "0008GiB", "8GiB"},
    {"STENSOR_MEMORY_LIMIT", "75%", "75%"},
    {"STENSOR_MEMORY_LIMIT", "37.5%", "37.5%"},
    {"STENSOR_MEMORY_LIMIT", "37.50 %", "37.5%"},
    {"STENSOR_MEMORY_LIMIT", "100%", "100%"},
    {"STENSOR_MEMORY_LIMIT", "100.000000%", "100%"},
    {"STENSOR_MEMORY_LIMIT", "0.000001%", "0.000001%"},
    {"STENSOR_MEMORY_LIMIT", "0=8GiB,1=4GiB", "0=8GiB,1=4GiB"},
    {"STENSOR_MEMORY_LIMIT", "1=4g, 0 = 8g", "0=8GiB,1=4GiB"},
    {"STENSOR_MEMORY_LIMIT", "3=50%", "3=50%"},
    {"STENSOR_MEMORY_LIMIT", "0=1GiB,63=25%", "0=1GiB,63=25%"},
    {"STENSOR_HOST_LIMIT", "64GiB", "64GiB"},
    {"STENSOR_HOST_LIMIT", "50%", "50%"},
    {"STENSOR_HOST_LIMIT", "12.25%", "12.25%"},
    {"STENSOR_POLICY", "lru", "lru"},
    {"STENSOR_POLICY", "version", "version"},
    {"STENSOR_POLICY", "BELADY", "belady"},
    {"STENSOR_PREFETCH", "on", "on"},
    {"STENSOR_PREFETCH", "off", "off"},
    {"STENSOR_PREFETCH", "0", "off"},
    {"STENSOR_PREFETCH", "1", "on"},
    {"STENSOR_PREFETCH", "False", "off"},
    {"STENSOR_PREFETCH", "yes", "on"},
    {"STENSOR_PREFETCH", "NO", "off"},
    {"STENSOR_SLABS", "on", "on"},
    {"STENSOR_SLABS", "0", "off"},
    {"STENSOR_SLABS", "AUTO", "auto"},
    {"STENSOR_SLABS", "yes", "on"},
    {"STENSOR_ACCESS_LOG", "/tmp/stensor.log", "/tmp/stensor.log"},
    {"STENSOR_ACCESS_LOG", "/tmp/log.%p.%r", "/tmp/log.%p.%r"},
    {"STENSOR_ACCESS_LOG", "/tmp/100%%", "/tmp/100%%"},
    {"STENSOR_LOG_LEVEL", "trace", "trace"},
    {"STENSOR_LOG_LEVEL", "debug", "debug"},
    {"STENSOR_LOG_LEVEL", "Info", "info"},
    {"STENSOR_LOG_LEVEL", "warn", "warn"},
    {"STENSOR_LOG_LEVEL", "error", "error"},
    {"STENSOR_LOG_LEVEL", "critical", "critical"},
    {"STENSOR_LOG_LEVEL", "off", "off"},
    {"STENSOR_STATS", "true", "on"},
    {"STENSOR_STATS", "off", "off"},
    {"STENSOR_WRITE_INFERENCE", "signature", "signature"},
    {"STENSOR_WRITE_INFERENCE", "Conservative", "conservative"},
    {"STENSOR_BANDWIDTH", "25", "25"},
    {"STENSOR_BANDWIDTH", " 12.5 ", "12.5"},
    {"STENSOR_BANDWIDTH", "12.500GB/s", "12.5"},
    {"STENSOR_BANDWIDTH", "25,20", "25,20"},
    {"STENSOR_BANDWIDTH", "0.001, 7 gb/s", "0.001,7"},
    {"STENSOR_BANDWIDTH", "3,3", "3"},
    {"STENSOR_BANDWIDTH", "100000", "100000"},
    {"STENSOR_ITERATION_MARKER", "_Z6updatePfPKfi", "_Z6updatePfPKfi"},
    {"STENSOR_ITERATION_MARKER", "mlp::update", "mlp::update"},
    {"STENSOR_VERIFY", "off", "off"},
    {"STENSOR_VERIFY", "0", "off"},
    {"STENSOR_VERIFY", "No", "off"},
    {"STENSOR_VERIFY", "copy", "copy"},
    {"STENSOR_VERIFY", " HASH ", "hash"},
    {"STENSOR_REAL_LIBCUDA", "/usr/lib/x86_64-linux-gnu/libcuda.so.550",
     "/usr/lib/x86_64-linux-gnu/libcuda.so.550"},
    {"STENSOR_REAL_LIBCUDA", " libcuda.so.1 ", "libcuda.so.1"},
};

TEST(ConfigTest, AcceptsEveryValidForm) {
  for (const ValidCase& c : kValidCases) {
    SCOPED_TRACE(absl::StrCat(c.variable, "=\"", c.value, "\""));
    const absl::StatusOr<Config> config = Config::Parse(Env({{c.variable, c.value}}));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->ValueText(c.variable), c.canonical);

    const absl::StatusOr<Config> again = Config::Parse(Env({{c.variable, c.canonical}}));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, *config);
  }
}

struct InvalidCase {
  const char* variable;
  const char* value;
  // A part of the reason, or "" when the accepted forms say it all.
  const char* reason;
};

constexpr InvalidCase kInvalidCases[] = {
    {"STENSOR_MEMORY_LIMIT", "8 gigs", ""},
    {"STENSOR_MEMORY_LIMIT", "GiB", ""},
    {"STENSOR_MEMORY_LIMIT", "8GiBs", ""},
    {"STENSOR_MEMORY_LIMIT", "8Gi", ""},
    {"STENSOR_MEMORY_LIMIT", "1.5GiB", ""},
    {"STENSOR_MEMORY_LIMIT", "1e9", ""},
    {"STENSOR_MEMORY_LIMIT", "0x100", ""},
    {"STENSOR_MEMORY_LIMIT", "+8GiB", ""},
    {"STENSOR_MEMORY_LIMIT", "8 8GiB", ""},
    {"STENSOR_MEMORY_LIMIT", "-1", "must not be negative"},
    {"STENSOR_MEMORY_LIMIT", "-8GiB", "must not be negative"},
    {"STENSOR_MEMORY_LIMIT", "0", "must be greater than 0"},
    {"STENSOR_MEMORY_LIMIT", "0GiB", "must be greater than 0"},
    {"STENSOR_MEMORY_LIMIT", "99999999999999999999GiB", "too large"},
    {"STENSOR_MEMORY_LIMIT", "18446744073709551616", "too large"},
    {"STENSOR_MEMORY_LIMIT", "16777216TiB", "too large"},
    {"STENSOR_MEMORY_LIMIT", "0%", "must be greater than 0%"},
    {"STENSOR_MEMORY_LIMIT", "0.0%", "must be greater than 0%"},
    {"STENSOR_MEMORY_LIMIT", "100.000001%", "at most 100%"},
    {"STENSOR_MEMORY_LIMIT", "101%", "at most 100%"},
    {"STENSOR_MEMORY_LIMIT", "99999999999999999999999%", "at most 100%"},
    {"STENSOR_MEMORY_LIMIT", "-5%", "must not be negative"},
    {"STENSOR_MEMORY_LIMIT", "12.3456789%", "at most 6 decimals"},
    {"STENSOR_MEMORY_LIMIT", "75.%", ""},
    {"STENSOR_MEMORY_LIMIT", ".5%", ""},
    {"STENSOR_MEMORY_LIMIT", "%", ""},
    {"STENSOR_MEMORY_LIMIT", "75%%", ""},
    {"STENSOR_MEMORY_LIMIT", "0=8GiB,0=4GiB", "device 0 is listed twice"},
    {"STENSOR_MEMORY_LIMIT", "64=8GiB", "device 64 is out of range 0..63"},
    {"STENSOR_MEMORY_LIMIT", "99999999999999999999=8GiB", "out of range"},
    {"STENSOR_MEMORY_LIMIT", "-1=8GiB", ""},
    {"STENSOR_MEMORY_LIMIT", "0=8GiB,", ""},
    {"STENSOR_MEMORY_LIMIT", "0=8GiB,,1=1GiB", ""},
    {"STENSOR_MEMORY_LIMIT", "0=", ""},
    {"STENSOR_MEMORY_LIMIT", "=8GiB", ""},
    {"STENSOR_MEMORY_LIMIT", "a=8GiB", ""},
    {"STENSOR_MEMORY_LIMIT", "0=8GiB=1", ""},
    {"STENSOR_MEMORY_LIMIT", "8GiB,1=4GiB", ""},
    {"STENSOR_MEMORY_LIMIT", "1=0", "device 1: must be greater than 0"},
    {"STENSOR_MEMORY_LIMIT", "1=200%", "device 1: must be at most 100%"},
    {"STENSOR_HOST_LIMIT", "lots", ""},
    {"STENSOR_HOST_LIMIT", "0=8GiB", ""},
    {"STENSOR_HOST_LIMIT", "-1GiB", "must not be negative"},
    {"STENSOR_HOST_LIMIT", "150%", "at most 100%"},
    {"STENSOR_POLICY", "fifo", ""},
    {"STENSOR_POLICY", "lru,version", ""},
    {"STENSOR_PREFETCH", "maybe", ""},
    {"STENSOR_PREFETCH", "2", ""},
    {"STENSOR_PREFETCH", "onn", ""},
    {"STENSOR_SLABS", "slab", ""},
    {"STENSOR_ACCESS_LOG", "/tmp/log.%d", "unknown placeholder \"%d\""},
    {"STENSOR_ACCESS_LOG", "/tmp/log%", "lone %"},
    {"STENSOR_ACCESS_LOG", "/tmp/%%%", "lone %"},
    {"STENSOR_LOG_LEVEL", "warning", ""},
    {"STENSOR_LOG_LEVEL", "5", ""},
    {"STENSOR_STATS", "enabled", ""},
    {"STENSOR_WRITE_INFERENCE", "mangled", ""},
    {"STENSOR_VERIFY", "-1", ""},
    {"STENSOR_BANDWIDTH", "0", ""},
    {"STENSOR_BANDWIDTH", "-3", ""},
    {"STENSOR_BANDWIDTH", "fast", ""},
    {"STENSOR_BANDWIDTH", "1.2345", ""},
    {"STENSOR_BANDWIDTH", "100001", ""},
    {"STENSOR_BANDWIDTH", "99999999999999999999999", ""},
    {"STENSOR_BANDWIDTH", "12,", ""},
    {"STENSOR_BANDWIDTH", "12,3,4", ""},
    {"STENSOR_BANDWIDTH", "12.", ""},
    {"STENSOR_BANDWIDTH", "12 MB/s", ""},
    // Which check "on" would mean is not guessed.
    {"STENSOR_VERIFY", "on", ""},
    {"STENSOR_VERIFY", "hashes", ""},
};

TEST(ConfigTest, RejectsEveryInvalidFormWithOneLine) {
  for (const InvalidCase& c : kInvalidCases) {
    SCOPED_TRACE(absl::StrCat(c.variable, "=\"", c.value, "\""));
    const absl::StatusOr<Config> config = Config::Parse(Env({{c.variable, c.value}}));
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(config.status().message());
    EXPECT_THAT(message, StartsWith(absl::StrCat("stensor: invalid ", c.variable, "=\"")));
    EXPECT_THAT(message, HasSubstr(c.value));
    EXPECT_THAT(message, HasSubstr(c.reason));
    EXPECT_THAT(message, HasSubstr(absl::StrCat("expected ", Info(c.variable).accepted_forms)));
    EXPECT_FALSE(absl::StrContains(message, '\n'));
  }
}

TEST(ConfigTest, ErrorMessageHasTheDocumentedShape) {
  const absl::StatusOr<Config> config = Config::Parse(Env({{"STENSOR_POLICY", "fifo"}}));
  EXPECT_EQ(config.status().message(),
            "stensor: invalid STENSOR_POLICY=\"fifo\": expected lru, version "
            "or belady");

  const absl::StatusOr<Config> limit = Config::Parse(Env({{"STENSOR_MEMORY_LIMIT", "0=1G,0=2G"}}));
  EXPECT_EQ(limit.status().message(),
            absl::StrCat("stensor: invalid STENSOR_MEMORY_LIMIT=\"0=1G,0=2G\": "
                         "device 0 is listed twice; expected ",
                         Info("STENSOR_MEMORY_LIMIT").accepted_forms));
}

TEST(ConfigTest, ErrorMessageEscapesAndShortensTheValue) {
  const absl::StatusOr<Config> config =
      Config::Parse(Env({{"STENSOR_LOG_LEVEL", "in\nfo\"" + std::string(1000, 'x')}}));
  const std::string message(config.status().message());
  EXPECT_THAT(message, HasSubstr("=\"in\\nfo\\\"xxx"));
  EXPECT_THAT(message, HasSubstr("xxx\"...: expected"));
  EXPECT_LT(message.size(), 400u);
  EXPECT_FALSE(absl::StrContains(message, '\n'));
}

TEST(ConfigTest, UnsetAndEmptyValuesGiveTheDefaults) {
  const absl::StatusOr<Config> unset = Config::Parse(Env({}));
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_EQ(*unset, Config());

  std::map<std::string, std::string> blank;
  for (const OptionInfo& option : Options()) blank[option.name] = " \t";
  const absl::StatusOr<Config> empty = Config::Parse(Env(blank));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, Config());
}

TEST(ConfigTest, DefaultsAreAsDocumented) {
  const std::map<std::string, std::string> kDefaults = {
      {"STENSOR_MEMORY_LIMIT", ""},
      {"STENSOR_HOST_LIMIT", ""},
      {"STENSOR_POLICY", "belady"},
      {"STENSOR_PREFETCH", "on"},
      {"STENSOR_SLABS", "auto"},
      {"STENSOR_BANDWIDTH", ""},
      {"STENSOR_ITERATION_MARKER", ""},
      {"STENSOR_ACCESS_LOG", ""},
      {"STENSOR_LOG_LEVEL", "warn"},
      {"STENSOR_STATS", "off"},
      {"STENSOR_WRITE_INFERENCE", "signature"},
      {"STENSOR_VERIFY", "off"},
      {"STENSOR_REAL_LIBCUDA", ""},
      {"STENSOR_CONFIG", ""},
  };
  std::map<std::string, std::string> actual;
  for (const OptionInfo& option : Options()) {
    actual[option.name] = option.default_value;
  }
  EXPECT_EQ(actual, kDefaults);

  const Config defaults;
  EXPECT_EQ(defaults.memory_limit.BytesFor(0, 80 * kGiB), std::nullopt);
  EXPECT_EQ(defaults.HostLimitBytes(512 * kGiB), std::nullopt);
  EXPECT_EQ(defaults.policy, EvictionPolicyKind::kBelady);
  EXPECT_TRUE(defaults.prefetch);
  EXPECT_EQ(defaults.slabs, SlabMode::kAuto);
  EXPECT_EQ(defaults.log_level, LogLevel::kWarn);
  EXPECT_FALSE(defaults.stats);
  EXPECT_EQ(defaults.write_inference, WriteInference::kSignature);
  EXPECT_EQ(defaults.verify, VerifyMode::kOff);
  EXPECT_EQ(defaults.AccessLogPath(42), "");
}

TEST(ConfigTest, OptionTableIsComplete) {
  std::set<std::string> names;
  for (const OptionInfo& option : Options()) {
    SCOPED_TRACE(option.name);
    EXPECT_TRUE(names.insert(option.name).second) << "listed twice";
    EXPECT_THAT(option.name, StartsWith("STENSOR_"));
    EXPECT_FALSE(option.accepted_forms.empty());
    EXPECT_FALSE(option.help.empty());
    EXPECT_EQ(option.allowed_in_file, option.name != "STENSOR_CONFIG");
    EXPECT_TRUE(Config().ValueText(option.name).has_value());
  }
  EXPECT_EQ(names.size(), 14u);
  EXPECT_EQ(Config().ValueText("STENSOR_NOPE"), std::nullopt);
}

TEST(ConfigTest, ParsesIntoTypedFields) {
  const absl::StatusOr<Config> config = Config::Parse(Env({
      {"STENSOR_POLICY", "version"},  // not the default
      {"STENSOR_PREFETCH", "off"},    // not the default
      {"STENSOR_LOG_LEVEL", "debug"},
      {"STENSOR_STATS", "on"},
      {"STENSOR_WRITE_INFERENCE", "conservative"},
      {"STENSOR_VERIFY", "hash"},
      {"STENSOR_REAL_LIBCUDA", "/opt/libcuda.so.1"},
  }));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->policy, EvictionPolicyKind::kVersion);
  EXPECT_FALSE(config->prefetch);
  EXPECT_EQ(config->log_level, LogLevel::kDebug);
  EXPECT_TRUE(config->stats);
  EXPECT_EQ(config->write_inference, WriteInference::kConservative);
  EXPECT_EQ(config->verify, VerifyMode::kHash);
  EXPECT_EQ(config->real_libcuda, "/opt/libcuda.so.1");
}

struct BytesForCase {
  const char* limit;
  int device;
  size_t device_total;
  std::optional<size_t> bytes;
};

const BytesForCase kBytesForCases[] = {
    {"8GiB", 0, 80 * kGiB, 8 * kGiB},
    {"8GiB", 7, 80 * kGiB, 8 * kGiB},
    // A cap above the device's size is simply never reached.
    {"8GiB", 0, 4 * kGiB, 8 * kGiB},
    {"75%", 0, 80 * kGiB, 60 * kGiB},
    {"37.5%", 1, 16 * kGiB, 6 * kGiB},
    {"100%", 0, 12345, 12345},
    {"50%", 0, 3, 1},  // rounds down
    {"100%", 0, SIZE_MAX, SIZE_MAX},
    {"0.000001%", 0, 100'000'000, 1},
    {"0=8GiB,1=50%", 0, 80 * kGiB, 8 * kGiB},
    {"0=8GiB,1=50%", 1, 80 * kGiB, 40 * kGiB},
    {"0=8GiB,1=50%", 2, 80 * kGiB, std::nullopt},
    {"0=8GiB,1=50%", -1, 80 * kGiB, std::nullopt},
};

TEST(MemoryLimitTest, BytesForResolvesPercentagesAndDevices) {
  for (const BytesForCase& c : kBytesForCases) {
    SCOPED_TRACE(absl::StrCat(c.limit, " device ", c.device, " of ", c.device_total));
    const absl::StatusOr<Config> config = Config::Parse(Env({{"STENSOR_MEMORY_LIMIT", c.limit}}));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->memory_limit.BytesFor(c.device, c.device_total), c.bytes);
  }
}

// The environment is read as strictly as the config file: a STENSOR_*
// variable that is no option is an error naming the closest one.
TEST(VariableNamesTest, AMisspelledOptionNamesTheClosest) {
  const std::map<std::string, std::string> vars = {{"STENSOR_MEMRY_LIMIT", "8MiB"},
                                                   {"STENSOR_POLICYY", "lru"},
                                                   {"STENSOR_PERFETCH", "off"},
                                                   {"STENSOR_ACESS_LOG", "x"}};
  for (const auto& [name, meant] : std::vector<std::pair<std::string, std::string>>{
           {"STENSOR_MEMRY_LIMIT", "STENSOR_MEMORY_LIMIT"},
           {"STENSOR_POLICYY", "STENSOR_POLICY"},
           {"STENSOR_PERFETCH", "STENSOR_PREFETCH"},
           {"STENSOR_ACESS_LOG", "STENSOR_ACCESS_LOG"}}) {
    const absl::Status s = CheckVariableNames({"PATH", name}, Env(vars));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(s.message()),
                StartsWith(absl::StrCat("stensor: unknown variable ", name, "=\"", vars.at(name),
                                        "\" in the environment: did you mean ", meant, "?")));
    EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos);
  }
}

TEST(VariableNamesTest, OptionsAndOtherVariablesPass) {
  std::vector<std::string> names = {"PATH",           "STENSOR",        "STENSORX", "MY_STENSOR_X",
                                    "stensor_policy", "STENSOR_LIBRARY"};  // the Python package's
  for (const OptionInfo& o : Options()) names.push_back(o.name);
  EXPECT_TRUE(CheckVariableNames(names, Env({})).ok());
  EXPECT_TRUE(CheckVariableNames({}, Env({})).ok());
  // Set but empty, or unset by the time it is looked up: still named.
  EXPECT_THAT(std::string(CheckVariableNames({"STENSOR_X"}, Env({})).message()),
              HasSubstr("STENSOR_X=\"\""));
}

TEST(ConfigTest, HostLimitResolvesAgainstHostMemory) {
  const absl::StatusOr<Config> share = Config::Parse(Env({{"STENSOR_HOST_LIMIT", "25%"}}));
  ASSERT_TRUE(share.ok()) << share.status();
  EXPECT_EQ(share->HostLimitBytes(256 * kGiB), 64 * kGiB);

  const absl::StatusOr<Config> size = Config::Parse(Env({{"STENSOR_HOST_LIMIT", "100GiB"}}));
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(size->HostLimitBytes(256 * kGiB), 100 * kGiB);
}

struct ExpandCase {
  const char* pattern;
  const char* path;
};

constexpr ExpandCase kExpandCases[] = {
    {"/tmp/a.log", "/tmp/a.log"},
    {"/tmp/a.%p.log", "/tmp/a.1234.log"},
    {"/tmp/rank%r/%p", "/tmp/rank3/1234"},
    {"%r%r%p", "331234"},
    {"/tmp/100%%", "/tmp/100%"},
    {"%%p", "%p"},
    {"%%%p", "%1234"},
    // Patterns Parse rejects still expand without losing anything.
    {"%x%", "%x%"},
    {"", ""},
};

TEST(ExpandLogPathTest, ExpandsPlaceholders) {
  for (const ExpandCase& c : kExpandCases) {
    EXPECT_EQ(ExpandLogPath(c.pattern, 1234, 3), c.path) << c.pattern;
  }
}

struct RankCase {
  std::map<std::string, std::string> env;
  // The expanded path for pid 7, or "" when Parse must fail.
  const char* path;
  const char* error;
};

const RankCase kRankCases[] = {
    {{{"STENSOR_ACCESS_LOG", "/l.%r.%p"}}, "/l.0.7", ""},
    {{{"STENSOR_ACCESS_LOG", "/l.%r"}, {"RANK", "5"}}, "/l.5", ""},
    {{{"STENSOR_ACCESS_LOG", "/l.%r"}, {"LOCAL_RANK", "2"}}, "/l.2", ""},
    {{{"STENSOR_ACCESS_LOG", "/l.%r"}, {"RANK", "5"}, {"LOCAL_RANK", "2"}}, "/l.5", ""},
    {{{"STENSOR_ACCESS_LOG", "/l.%r"}, {"RANK", ""}, {"LOCAL_RANK", "2"}}, "/l.2", ""},
    // A malformed RANK matters only to a pattern that uses it.
    {{{"STENSOR_ACCESS_LOG", "/l.%p"}, {"RANK", "x"}}, "/l.7", ""},
    {{{"STENSOR_ACCESS_LOG", "/l.%%r"}, {"RANK", "x"}}, "/l.%r", ""},
    {{{"STENSOR_ACCESS_LOG", "/l.%r"}, {"RANK", "x"}},
     "",
     "stensor: invalid RANK=\"x\" (used for %r in STENSOR_ACCESS_LOG)"},
    {{{"STENSOR_ACCESS_LOG", "/l.%r"}, {"RANK", "-1"}}, "", "RANK=\"-1\""},
    // RANK wins over LOCAL_RANK, malformed or not.
    {{{"STENSOR_ACCESS_LOG", "/l.%r"}, {"RANK", "one"}, {"LOCAL_RANK", "1"}},
     "",
     "stensor: invalid RANK=\"one\" (used for %r in STENSOR_ACCESS_LOG): "
     "expected an integer from 0 to 2147483647"},
    {{{"STENSOR_ACCESS_LOG", "/l.%r"}, {"LOCAL_RANK", "99999999999"}},
     "",
     "LOCAL_RANK=\"99999999999\""},
};

TEST(ConfigTest, AccessLogPathUsesPidAndRank) {
  for (const RankCase& c : kRankCases) {
    SCOPED_TRACE(c.env.begin()->second);
    const absl::StatusOr<Config> config = Config::Parse(Env(c.env));
    if (*c.error != '\0') {
      EXPECT_THAT(config.status().message(), HasSubstr(c.error));
      continue;
    }
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->AccessLogPath(7), c.path);
  }
}

TEST(ConfigFileTest, ReadsSettingsCommentsAndBlankLines) {
  const std::string path = WriteTempFile(
      "# stensor settings\n"
      "\n"
      "STENSOR_MEMORY_LIMIT = 0=8GiB, 1=4GiB\n"
      "  STENSOR_POLICY=lru\r\n"
      "\t# indented comment\n"
      "STENSOR_ACCESS_LOG=/tmp/a b.%p\n"
      "STENSOR_STATS=\n"
      "STENSOR_LOG_LEVEL=debug");
  const absl::StatusOr<Config> config = Config::Parse(Env({{"STENSOR_CONFIG", path}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->memory_limit.BytesFor(1, 80 * kGiB), 4 * kGiB);
  EXPECT_EQ(config->policy, EvictionPolicyKind::kLru);
  EXPECT_EQ(config->access_log, "/tmp/a b.%p");
  EXPECT_FALSE(config->stats);  // empty = the default
  EXPECT_EQ(config->log_level, LogLevel::kDebug);
  EXPECT_EQ(config->config_file, path);
}

// Only a regular file is read: opening a FIFO waited for a writer, so every
// preloaded process (including `timeout` itself) hung in the constructor.
TEST(ConfigFileTest, ReadsRegularFilesOnly) {
  const std::string fifo = testing::TempDir() + "/stensor.fifo";
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& path : {fifo, std::string("/dev/zero"), std::string("/")}) {
    SCOPED_TRACE(path);
    const absl::StatusOr<Config> config = Config::Parse(Env({{"STENSOR_CONFIG", path}}));
    ASSERT_FALSE(config.ok());
    EXPECT_THAT(config.status().message(),
                HasSubstr("cannot read STENSOR_CONFIG=\"" + path + "\": not a regular file"));
  }
  unlink(fifo.c_str());
}

TEST(ConfigFileTest, EnvironmentWinsOverTheFile) {
  const std::string path = WriteTempFile(
      "STENSOR_POLICY=lru\n"
      "STENSOR_PREFETCH=off\n"  // not the default: the file's value shows
      "STENSOR_STATS=on\n");
  const absl::StatusOr<Config> config = Config::Parse(Env({
      {"STENSOR_CONFIG", path},
      {"STENSOR_POLICY", "belady"},
      {"STENSOR_PREFETCH", ""},  // empty = unset, so the file's value holds
  }));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->policy, EvictionPolicyKind::kBelady);
  EXPECT_FALSE(config->prefetch);
  EXPECT_TRUE(config->stats);
}

TEST(ConfigFileTest, EnvironmentValueReplacesAnInvalidFileValue) {
  const std::string path = WriteTempFile("STENSOR_POLICY=fifo\n");
  const absl::StatusOr<Config> config =
      Config::Parse(Env({{"STENSOR_CONFIG", path}, {"STENSOR_POLICY", "lru"}}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->policy, EvictionPolicyKind::kLru);
}

struct FileErrorCase {
  const char* text;
  // Expected in the message after "stensor: "; FILE stands for the path.
  const char* error;
};

constexpr FileErrorCase kFileErrorCases[] = {
    {"STENSOR_POLICY=lru\nSTENSOR_MEMORY_LIMIT=8 gigs\n",
     "invalid STENSOR_MEMORY_LIMIT=\"8 gigs\" (from FILE:2): expected a size"},
    {"\n\nSTENSOR_VERBOSE=1\n",
     "unknown option \"STENSOR_VERBOSE\" (from FILE:3): expected one of "
     "STENSOR_MEMORY_LIMIT, "},
    {"stensor_policy=lru\n", "unknown option \"stensor_policy\" (from FILE:1)"},
    {"STENSOR_POLICY lru\n", "invalid line \"STENSOR_POLICY lru\" (from FILE:1)"},
    {"=lru\n", "unknown option \"\" (from FILE:1)"},
    {"STENSOR_CONFIG=/etc/other.conf\n",
     "STENSOR_CONFIG cannot be set in a config file (from FILE:1)"},
    {"STENSOR_POLICY=lru\n#\nSTENSOR_POLICY=version\n",
     "STENSOR_POLICY is set twice (lines 1 and 3 of FILE)"},
};

TEST(ConfigFileTest, ReportsBadLinesWithFileAndLine) {
  for (const FileErrorCase& c : kFileErrorCases) {
    SCOPED_TRACE(c.text);
    const std::string path = WriteTempFile(c.text);
    const absl::StatusOr<Config> config = Config::Parse(Env({{"STENSOR_CONFIG", path}}));
    ASSERT_FALSE(config.ok());
    std::string expected = c.error;
    expected.replace(expected.find("FILE"), 4, path);
    EXPECT_THAT(config.status().message(), HasSubstr(absl::StrCat("stensor: ", expected)));
  }
}

TEST(ConfigFileTest, RejectsNulBytes) {
  const std::string path = WriteTempFile(std::string("STENSOR_ACCESS_LOG=/a\0b\n", 23));
  const absl::StatusOr<Config> config = Config::Parse(Env({{"STENSOR_CONFIG", path}}));
  EXPECT_THAT(config.status().message(),
              HasSubstr(absl::StrCat("invalid line \"STENSOR_ACCESS_LOG=/a\\000b\" "
                                     "(from ",
                                     path, ":1)")));
}

TEST(ConfigFileTest, ReportsAFileThatCannotBeRead) {
  const std::string missing = testing::TempDir() + "/no/such/stensor.conf";
  const absl::StatusOr<Config> config = Config::Parse(Env({{"STENSOR_CONFIG", missing}}));
  EXPECT_EQ(config.status().message(), absl::StrCat("stensor: cannot read STENSOR_CONFIG=\"",
                                                    missing, "\": No such file or directory"));

  const absl::StatusOr<Config> directory =
      Config::Parse(Env({{"STENSOR_CONFIG", testing::TempDir()}}));
  EXPECT_THAT(directory.status().message(), HasSubstr("stensor: cannot read STENSOR_CONFIG="));
  EXPECT_THAT(directory.status().message(), HasSubstr("not a regular file"));

  const std::string path = WriteTempFile("STENSOR_POLICY=lru\n");
  ASSERT_EQ(chmod(path.c_str(), 0), 0);
  if (geteuid() != 0) {  // root reads files whatever their mode
    EXPECT_THAT(Config::Parse(Env({{"STENSOR_CONFIG", path}})).status().message(),
                HasSubstr("Permission denied"));
  }
}

TEST(ConfigFileTest, RejectsAnOversizedFile) {
  const std::string path = WriteTempFile(std::string(2 << 20, '#'));
  EXPECT_THAT(Config::Parse(Env({{"STENSOR_CONFIG", path}})).status().message(),
              HasSubstr("larger than 1MiB"));
}

TEST(ConfigFileTest, EveryOptionCanComeFromTheFile) {
  std::string text;
  std::map<std::string, std::string> env;
  for (const ValidCase& c : kValidCases) {
    // The last valid case of each option wins in both forms.
    env[c.variable] = c.value;
  }
  for (const auto& [name, value] : env) absl::StrAppend(&text, name, "=", value, "\n");
  const std::string path = WriteTempFile(text);
  const absl::StatusOr<Config> from_file = Config::Parse(Env({{"STENSOR_CONFIG", path}}));
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  env["STENSOR_CONFIG"] = path;
  const absl::StatusOr<Config> from_env = Config::Parse(Env(env));
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ(*from_file, *from_env);
}

TEST(DescribeTest, RendersDefaultsAsOneJsonObject) {
  EXPECT_EQ(Config().Describe(),
            "{\"STENSOR_MEMORY_LIMIT\": \"\", \"STENSOR_HOST_LIMIT\": \"\", "
            "\"STENSOR_POLICY\": \"belady\", \"STENSOR_PREFETCH\": true, "
            "\"STENSOR_SLABS\": \"auto\", "
            "\"STENSOR_BANDWIDTH\": \"\", \"STENSOR_ITERATION_MARKER\": \"\", "
            "\"STENSOR_ACCESS_LOG\": \"\", \"STENSOR_LOG_LEVEL\": \"warn\", "
            "\"STENSOR_STATS\": false, \"STENSOR_WRITE_INFERENCE\": "
            "\"signature\", \"STENSOR_VERIFY\": \"off\", "
            "\"STENSOR_REAL_LIBCUDA\": \"\", \"STENSOR_CONFIG\": \"\"}");
}

TEST(DescribeTest, RendersEffectiveValuesAndEscapes) {
  const absl::StatusOr<Config> config = Config::Parse(Env({
      {"STENSOR_MEMORY_LIMIT", "1=50%,0=8g"},
      {"STENSOR_STATS", "yes"},
      {"STENSOR_ACCESS_LOG", "/tmp/\"q\"\\x\ty\x7f.%p"},
  }));
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string json = config->Describe();
  EXPECT_THAT(json, HasSubstr("\"STENSOR_MEMORY_LIMIT\": \"0=8GiB,1=50%\""));
  EXPECT_THAT(json, HasSubstr("\"STENSOR_STATS\": true"));
  EXPECT_THAT(json, HasSubstr("\"STENSOR_ACCESS_LOG\": "
                              "\"/tmp/\\\"q\\\"\\\\x\\u0009y\\u007f.%p\""));
  for (const OptionInfo& option : Options()) {
    EXPECT_THAT(json, HasSubstr(absl::StrCat("\"", option.name, "\": ")));
  }
  EXPECT_FALSE(absl::StrContains(json, '\n'));
}

struct Utf8Case {
  const char* bytes;
  const char* json;
};

// A path may hold any bytes; the header must stay valid JSON (RFC 3629).
constexpr Utf8Case kUtf8Cases[] = {
    {"\xc3\xa9", "\xc3\xa9"},
    {"\xe2\x82\xac", "\xe2\x82\xac"},
    {"\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80"},
    {"\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf"},              // U+10FFFF
    {"\xff", "\\ufffd"},                                   // never in UTF-8
    {"\xa9", "\\ufffd"},                                   // stray continuation
    {"\xc0\xaf", "\\ufffd\\ufffd"},                        // overlong '/'
    {"\xe0\x80\xaf", "\\ufffd\\ufffd\\ufffd"},             // overlong '/'
    {"\xed\xa0\x80", "\\ufffd\\ufffd\\ufffd"},             // surrogate
    {"\xf4\x90\x80\x80", "\\ufffd\\ufffd\\ufffd\\ufffd"},  // > U+10FFFF
    {"\xe2\x82", "\\ufffd\\ufffd"},                        // cut short
};

TEST(DescribeTest, KeepsValidUtf8AndReplacesTheRest) {
  for (const Utf8Case& c : kUtf8Cases) {
    SCOPED_TRACE(c.json);
    const absl::StatusOr<Config> config =
        Config::Parse(Env({{"STENSOR_REAL_LIBCUDA", absl::StrCat("/", c.bytes)}}));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_THAT(config->Describe(),
                HasSubstr(absl::StrCat("\"STENSOR_REAL_LIBCUDA\": \"/", c.json, "\"")));
  }
}

}  // namespace
}  // namespace stensor
