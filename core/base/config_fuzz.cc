// Fuzz target for the STENSOR_* parser (core/base/config.h).
//
// Input: the first byte picks a variable, `data[0] % Options().size()`, an
// option by its place in the table, except that STENSOR_CONFIG's place stands
// for RANK (a fuzzed STENSOR_CONFIG could name a FIFO or a terminal and block;
// the file is fuzzed below instead). The rest of the input is that
// variable's value, cut at the first NUL as an environment value would be,
// and, whole, the body of a config file.
//
// Checked on every input: parsing returns; an error is one printable line
// that starts "stensor: " and names the variable (or the file); a success
// prints back as text that parses to the same Config; Describe() is a valid
// one-line JSON object with one member per option; byte caps from
// percentages never exceed the total. A broken check aborts, which libFuzzer
// and fuzz_main.cc report as a crash.
//
// Built by //core/base:config_fuzz with fuzz_main.cc as a bounded regression test,
// and by scripts/fuzz.sh config with libFuzzer. The seeds (every value also
// runs as a file body, and a file body as a value) are at the end.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/base/config.h"
#include "tests/support/fuzz_target.h"

namespace stensor {
namespace {

// Reports a broken invariant and aborts, which is how a fuzzer sees it.
void Require(bool condition, absl::string_view what, absl::string_view detail) {
  if (condition) return;
  std::fprintf(stderr, "config_fuzz: %.*s\n  %.*s\n", static_cast<int>(what.size()), what.data(),
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

// A fake environment of `vars`, which must outlive the lookup.
EnvLookup Env(const std::map<std::string, std::string>& vars) {
  return [&vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

// The config file the fuzzer writes: an in-memory file, so no input touches
// the disk, reached by a path as STENSOR_CONFIG requires.
class FuzzFile {
 public:
  FuzzFile() : fd_(memfd_create("stensor_config_fuzz", MFD_CLOEXEC)) {
    Require(fd_ >= 0, "memfd_create failed", "");
    path_ = absl::StrCat("/proc/self/fd/", fd_);
  }

  const std::string& path() const { return path_; }

  void Write(absl::string_view text) {
    Require(ftruncate(fd_, 0) == 0, "ftruncate failed", path_);
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = pwrite(fd_, text.data() + done, text.size() - done, done);
      Require(n > 0, "pwrite failed", path_);
      done += n;
    }
  }

 private:
  int fd_;
  std::string path_;
};

// An error is one printable line, "stensor: ...", that names `subject`.
void CheckError(const absl::Status& status, absl::string_view subject) {
  const std::string message(status.message());
  Require(absl::StartsWith(message, "stensor: "), "error without prefix", message);
  Require(absl::StrContains(message, subject), "error does not name it",
          absl::StrCat(subject, " / ", message));
  for (const char c : message) {
    Require(c >= 0x20 && c < 0x7f, "error is not one printable line", message);
  }
}

// Consumes one JSON string (RFC 8259) from the front of `*json`.
bool ConsumeJsonString(absl::string_view* json) {
  if (!absl::ConsumePrefix(json, "\"")) return false;
  while (!json->empty()) {
    const unsigned char c = json->front();
    json->remove_prefix(1);
    if (c == '"') return true;
    if (c < 0x20) return false;
    if (c == '\\') {
      if (json->empty()) return false;
      const char escape = json->front();
      json->remove_prefix(1);
      if (escape == 'u') {
        if (json->size() < 4) return false;
        for (int i = 0; i < 4; ++i) {
          if (!absl::ascii_isxdigit((*json)[i])) return false;
        }
        json->remove_prefix(4);
      } else if (!absl::StrContains("\"\\/bfnrt", escape)) {
        return false;
      }
      continue;
    }
    if (c < 0x80) continue;
    // A UTF-8 sequence: its lead byte's length, then continuation bytes.
    // (Overlong forms are the writer's concern; config_test checks them.)
    const size_t length = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    if (length == 0 || c > 0xf4 || json->size() < length - 1) return false;
    for (size_t i = 0; i + 1 < length; ++i) {
      if (((*json)[i] & 0xc0) != 0x80) return false;
    }
    json->remove_prefix(length - 1);
  }
  return false;
}

// Describe() must be `{"NAME": value, ...}` with every option, in order,
// each value a string or a boolean.
void CheckDescribe(const Config& config) {
  const std::string json = config.Describe();
  absl::string_view rest = json;
  bool ok = absl::ConsumePrefix(&rest, "{");
  for (size_t i = 0; ok && i < Options().size(); ++i) {
    const std::string key = absl::StrCat("\"", Options()[i].name, "\": ");
    ok = (i == 0 || absl::ConsumePrefix(&rest, ", ")) && absl::ConsumePrefix(&rest, key) &&
         (absl::ConsumePrefix(&rest, "true") || absl::ConsumePrefix(&rest, "false") ||
          ConsumeJsonString(&rest));
  }
  Require(ok && rest == "}", "Describe() is not the expected JSON", json);
}

// Caps exist exactly where the limits say, and a percentage never resolves
// above the total it is taken of.
void CheckLimits(const Config& config) {
  const MemoryLimit& limit = config.memory_limit;
  // Every listed device and some that no entry can name.
  std::vector<int> devices = {-1, 0, MemoryLimit::kMaxDevices};
  for (const auto& entry : limit.per_device) devices.push_back(entry.first);
  bool ok = true;
  for (const size_t total : {size_t{0}, size_t{1}, size_t{12345}, size_t{1} << 40, SIZE_MAX}) {
    for (const int device : devices) {
      std::optional<MemoryAmount> amount = limit.all_devices;
      if (!amount && limit.per_device.count(device) != 0) {
        amount = limit.per_device.at(device);
      }
      const std::optional<size_t> bytes = limit.BytesFor(device, total);
      ok = ok && bytes.has_value() == amount.has_value();
      if (amount && amount->unit == MemoryAmount::Unit::kPercent) {
        ok = ok && *bytes <= total;
      }
    }
    if (config.host_limit && config.host_limit->unit == MemoryAmount::Unit::kPercent) {
      ok = ok && *config.HostLimitBytes(total) <= total;
    }
  }
  Require(ok, "a limit resolves wrongly", config.Describe());
}

// One variable set to `value` in an otherwise empty environment.
void FuzzVariable(absl::string_view variable, absl::string_view value) {
  std::map<std::string, std::string> env = {{std::string(variable), std::string(value)}};
  if (variable == "RANK") env["STENSOR_ACCESS_LOG"] = "/tmp/log.%r";
  const absl::StatusOr<Config> config = Config::Parse(Env(env));
  if (!config.ok()) {
    CheckError(config.status(), variable);
    return;
  }
  CheckDescribe(*config);
  CheckLimits(*config);
  if (variable == "RANK") {
    Require(config->AccessLogPath(1) == absl::StrCat("/tmp/log.", config->rank),
            "rank does not expand", std::string(value));
    return;
  }
  const std::string text = *config->ValueText(variable);
  env[std::string(variable)] = text;
  const absl::StatusOr<Config> again = Config::Parse(Env(env));
  Require(again.ok(), "canonical text does not parse", absl::StrCat(variable, "=", text));
  Require(*again == *config, "canonical text parses differently",
          absl::StrCat(variable, "=", text));
  Require(*again->ValueText(variable) == text, "canonical text is unstable", text);
}

// `body` as the STENSOR_CONFIG file.
void FuzzFileBody(FuzzFile& file, absl::string_view body) {
  file.Write(body);
  const std::map<std::string, std::string> env = {{"STENSOR_CONFIG", file.path()}};
  const absl::StatusOr<Config> config = Config::Parse(Env(env));
  if (!config.ok()) {
    CheckError(config.status(), file.path());
    return;
  }
  CheckDescribe(*config);
  CheckLimits(*config);
  // Printing every setting back into the file reproduces the same Config.
  std::string printed;
  for (const OptionInfo& option : Options()) {
    if (!option.allowed_in_file) continue;
    absl::StrAppend(&printed, option.name, "=", *config->ValueText(option.name), "\n");
  }
  file.Write(printed);
  const absl::StatusOr<Config> again = Config::Parse(Env(env));
  Require(again.ok(), "printed file does not parse", printed);
  Require(*again == *config, "printed file parses differently", printed);
}

}  // namespace

namespace fuzz {
namespace {

// Values of every option, good and bad, and config file bodies. Each also
// runs as the other kind: a value as a file body, a file body as a value.
std::vector<std::string> Values() {
  return {
      "8GiB",
      "512MiB",
      "1073741824",
      "8 gigs",
      "4kb",
      "16777215TiB",
      "16777216TiB",
      "99999999999999999999GiB",
      "18446744073709551615",
      "-1",
      "0",
      "75%",
      "37.5%",
      "0.000001%",
      "100.000001%",
      "12.3456789%",
      "75.%",
      "0=8GiB,1=4GiB",
      "1=50%, 0 = 8g",
      "0=1G,0=2G",
      "64=1G",
      "0=8GiB,",
      "lru",
      "version",
      "BELADY",
      "on",
      "off",
      "yes",
      "False",
      "1",
      "/tmp/log.%p.%r",
      "/tmp/100%%",
      "/tmp/bad%",
      "/tmp/%x",
      "trace",
      "critical",
      "signature",
      "conservative",
      "7",
      "\xc3\xa9 \xff\"\\\t\x7f",
      "STENSOR_POLICY=lru\n# comment\n\nSTENSOR_MEMORY_LIMIT = "
      "0=8GiB,1=50%\r\n",
      "STENSOR_ACCESS_LOG=/tmp/%p\nSTENSOR_HOST_LIMIT=25%\nSTENSOR_PREFETCH=no"
      "\nSTENSOR_LOG_LEVEL=debug\nSTENSOR_STATS=on\nSTENSOR_VERIFY=hash\n"
      "STENSOR_WRITE_INFERENCE=conservative\nSTENSOR_REAL_LIBCUDA=/l.so\n",
      "STENSOR_VERBOSE=1\n",
      "STENSOR_CONFIG=/etc/stensor.conf\n",
      "STENSOR_POLICY=lru\nSTENSOR_POLICY=lru\n",
      "no equals sign\n",
      std::string("STENSOR_ACCESS_LOG=/a\0b\n", 24),
  };
}

// Pieces the mutator inserts: unit and placeholder spellings, separators,
// boundary numbers and option names, which random bytes rarely hit.
std::vector<std::string> Tokens() {
  return {
      "GiB",
      "MiB",
      "KiB",
      "TiB",
      "G",
      "kb",
      "%",
      "%%",
      "%p",
      "%r",
      "=",
      ",",
      ".",
      "-",
      " ",
      "\t",
      "\n",
      "\r\n",
      "#",
      std::string(1, '\0'),
      "\xff",
      "\xc3",
      "99999999999999999999",
      "18446744073709551616",
      "100",
      "63",
      "64",
      "0.",
      "STENSOR_MEMORY_LIMIT=",
      "STENSOR_POLICY=",
      "STENSOR_CONFIG=",
      "\nSTENSOR_HOST_LIMIT=",
  };
}

// The seeds, each behind every first byte that picks a different variable.
std::vector<std::string> SeedInputs() {
  std::vector<std::string> inputs;
  for (const std::string& value : Values()) {
    for (size_t selector = 0; selector < Options().size(); ++selector) {
      inputs.push_back(std::string(1, static_cast<char>(selector)) + value);
    }
  }
  return inputs;
}

}  // namespace

const FuzzTarget& Target() {
  static const FuzzTarget* const target =
      new FuzzTarget{"config_fuzz", SeedInputs(), Tokens(), 4096, 0};
  return *target;
}

}  // namespace fuzz
}  // namespace stensor

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& options = stensor::Options();
  const std::string& selected = options[data[0] % options.size()].name;
  const absl::string_view variable =
      selected == "STENSOR_CONFIG" ? "RANK" : absl::string_view(selected);
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  stensor::FuzzVariable(variable, rest.substr(0, rest.find('\0')));
  static stensor::FuzzFile* const file = new stensor::FuzzFile();
  stensor::FuzzFileBody(*file, rest);
  return 0;
}
