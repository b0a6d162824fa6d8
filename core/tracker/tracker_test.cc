// Tests for core/tracker: the operation counts and the JSON Lines access log
// (docs/access-log.md) that Tracker writes for allocations, frees, launches,
// copies, memsets and synchronisations.
//
// No GPU and no fake driver: a Driver filled by hand reports two devices,
// the current device and one scripted kernel, mlp::sgd_momentum, under the
// name nvcc gives it. The log is read back after Shutdown() and every line
// is parsed by the small JSON parser below, which rejects anything that is
// not one complete JSON value.
//
// KernelCache and BufferRegistry key their per-thread caches by their own
// address, and a Tracker made after another is destroyed may be placed at
// the same address (see launch_inference_test.cc). So each test here uses
// its own kernel handle and address range.
#include "core/tracker/tracker.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/config.h"
#include "core/driver/driver.h"
#include "core/inference/buffer_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/scripted_driver_testing.h"

namespace stensor {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using testing_support::FindKernel;
using testing_support::InstallScriptedKernels;
using testing_support::ScriptedKernel;

// ---------------------------------------------------------------------------
// A minimal JSON parser: objects (members kept in order), arrays, strings
// with every JSON escape, numbers (kept as their literal text), true, false
// and null. Duplicate keys and trailing text are errors.

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;               // a string's value or a number's literal
  std::vector<Json> items;        // array elements
  std::vector<std::string> keys;  // object members, in order
  std::vector<Json> values;

  bool Has(std::string_view key) const {
    for (const std::string& k : keys) {
      if (k == key) return true;
    }
    return false;
  }

  // The member `key`; a test failure and null when there is none.
  const Json& operator[](std::string_view key) const {
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == key) return values[i];
    }
    ADD_FAILURE() << "no member \"" << key << "\"";
    static const Json* const null = new Json;
    return *null;
  }

  std::string Str() const {
    EXPECT_EQ(kind, Kind::kString) << text;
    return text;
  }

  uint64_t Uint() const {
    EXPECT_EQ(kind, Kind::kNumber);
    EXPECT_TRUE(!text.empty() && text.find_first_not_of("0123456789") == std::string::npos)
        << "not an unsigned integer: " << text;
    return std::strtoull(text.c_str(), nullptr, 10);
  }

  bool Bool() const {
    EXPECT_EQ(kind, Kind::kBool);
    return boolean;
  }

  // An array of unsigned integers.
  std::vector<uint64_t> Uints() const {
    EXPECT_EQ(kind, Kind::kArray);
    std::vector<uint64_t> out;
    for (const Json& item : items) out.push_back(item.Uint());
    return out;
  }
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view text) : text_(text) {}

  // Parses the whole text as one value; false with `error_` set otherwise.
  bool Parse(Json* out) {
    SkipSpace();
    if (!Value(out, 0)) return false;
    SkipSpace();
    if (pos_ != text_.size()) return Fail("trailing text");
    return true;
  }

  const std::string& error() const { return error_; }

 private:
  bool Fail(const std::string& what) {
    error_ = absl::StrCat(what, " at offset ", pos_);
    return false;
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  bool Literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return Fail("bad literal");
    pos_ += word.size();
    return true;
  }

  bool Value(Json* out, int depth) {
    if (depth > 32) return Fail("nested too deeply");
    if (pos_ >= text_.size()) return Fail("unexpected end");
    switch (text_[pos_]) {
      case '{':
        return Object(out, depth);
      case '[':
        return Array(out, depth);
      case '"':
        out->kind = Json::Kind::kString;
        return String(&out->text);
      case 't':
        out->kind = Json::Kind::kBool;
        out->boolean = true;
        return Literal("true");
      case 'f':
        out->kind = Json::Kind::kBool;
        out->boolean = false;
        return Literal("false");
      case 'n':
        out->kind = Json::Kind::kNull;
        return Literal("null");
      default:
        return Number(out);
    }
  }

  bool Object(Json* out, int depth) {
    out->kind = Json::Kind::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (Consume('}')) return true;
    for (;;) {
      SkipSpace();
      std::string key;
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        return Fail("expected a key");
      }
      if (!String(&key)) return false;
      if (out->Has(key)) return Fail(absl::StrCat("duplicate key ", key));
      SkipSpace();
      if (!Consume(':')) return Fail("expected ':'");
      SkipSpace();
      Json value;
      if (!Value(&value, depth + 1)) return false;
      out->keys.push_back(std::move(key));
      out->values.push_back(std::move(value));
      SkipSpace();
      if (Consume('}')) return true;
      if (!Consume(',')) return Fail("expected ',' or '}'");
    }
  }

  bool Array(Json* out, int depth) {
    out->kind = Json::Kind::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (Consume(']')) return true;
    for (;;) {
      SkipSpace();
      Json item;
      if (!Value(&item, depth + 1)) return false;
      out->items.push_back(std::move(item));
      SkipSpace();
      if (Consume(']')) return true;
      if (!Consume(',')) return Fail("expected ',' or ']'");
    }
  }

  bool Hex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return Fail("short \\u escape");
    *out = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      int digit = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
      if (digit < 0) return Fail("bad \\u escape");
      *out = *out * 16 + static_cast<uint32_t>(digit);
    }
    return true;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  bool String(std::string* out) {
    ++pos_;  // '"'
    for (;;) {
      if (pos_ >= text_.size()) return Fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) {
        return Fail("control character in string");
      }
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) return Fail("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xd800 && cp < 0xdc00) {  // a surrogate pair
            uint32_t low = 0;
            if (!Consume('\\') || !Consume('u') || !Hex4(&low) || low < 0xdc00 || low >= 0xe000) {
              return Fail("unpaired surrogate");
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            return Fail("unpaired surrogate");
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Fail("bad escape");
      }
    }
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool Number(Json* out) {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        ++pos_;
      }
      return pos_ - from;
    };
    Consume('-');
    if (Consume('0')) {
      // no further integer digits allowed
    } else if (digits() == 0) {
      return Fail("expected a value");
    }
    if (Consume('.') && digits() == 0) return Fail("bad fraction");
    if (Consume('e') || Consume('E')) {
      if (!Consume('+')) Consume('-');
      if (digits() == 0) return Fail("bad exponent");
    }
    out->kind = Json::Kind::kNumber;
    out->text = std::string(text_.substr(start, pos_ - start));
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::string error_;
};

TEST(JsonParserTest, ParsesWhatTheLogWritesAndRejectsBrokenText) {
  Json v;
  JsonParser ok(R"({"a":[1,2,{"b":"x\"y\\z\u00e9"}],"c":true,"d":null,"e":-0.5e3})");
  ASSERT_TRUE(ok.Parse(&v)) << ok.error();
  EXPECT_EQ(v["a"].items.size(), 3u);
  EXPECT_EQ(v["a"].items[2]["b"].Str(), "x\"y\\z\xc3\xa9");
  EXPECT_TRUE(v["c"].Bool());
  EXPECT_EQ(v["d"].kind, Json::Kind::kNull);
  EXPECT_EQ(v["e"].text, "-0.5e3");
  for (const char* bad : {"{", R"({"a":1,})", R"({"a":1}x)", R"({"a":1,"a":2})", R"(["a)", "[01]",
                          R"({a:1})", "{\"a\":\"\x01\"}"}) {
    Json ignored;
    JsonParser p(bad);
    EXPECT_FALSE(p.Parse(&ignored)) << bad;
  }
}

// ---------------------------------------------------------------------------
// The scripted driver.

constexpr char kSgdName[] = "_ZN3mlp12sgd_momentumEPfS0_PKfffi";
constexpr char kSgdDemangled[] =
    "mlp::sgd_momentum(float*, float*, float const*, float, float, int)";

// One handle per test, all naming mlp::sgd_momentum, plus a kernel whose
// layout the driver cannot report.
constexpr uintptr_t kSgdInOrderTest = 0x5100;
constexpr uintptr_t kSgdNoLogTest = 0x5200;
constexpr uintptr_t kSgdConservativeTest = 0x5300;
constexpr uintptr_t kOpaque = 0x5400;

constexpr int kCurrentDevice = 1;
constexpr uint64_t kGiB = uint64_t{1} << 30;
// The second name needs escaping in JSON.
const char* const kDeviceNames[] = {"Scripted GPU 0", "Scripted \"GPU\" 1"};
constexpr uint64_t kDeviceBytes[] = {16 * kGiB, 141 * kGiB};

// mlp::sgd_momentum(float*, float*, float const*, float, float, int).
const std::vector<std::pair<size_t, size_t>> kSgdLayout = {{0, 8},  {8, 8},  {16, 8},
                                                           {24, 4}, {28, 4}, {32, 4}};

const ScriptedKernel* Scripted(uintptr_t handle, bool is_cukernel) {
  static const auto* const kernels = new std::vector<ScriptedKernel>{
      {kSgdInOrderTest, false, kSgdName, kSgdLayout},
      {kSgdNoLogTest, false, kSgdName, kSgdLayout},
      {kSgdConservativeTest, false, kSgdName, kSgdLayout},
      // A driver without the parameter queries.
      {kOpaque, false, "_Z4fillPfi", {}, 0, CUDA_ERROR_NOT_SUPPORTED},
  };
  return FindKernel(*kernels, handle, is_cukernel);
}

CUresult CtxGetDevice(CUdevice* device) {
  *device = kCurrentDevice;
  return CUDA_SUCCESS;
}

CUresult DeviceGetCount(int* count) {
  *count = 2;
  return CUDA_SUCCESS;
}

CUresult DeviceGetName(char* name, int len, CUdevice device) {
  if (device < 0 || device > 1 || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "%s", kDeviceNames[device]);
  return CUDA_SUCCESS;
}

CUresult DeviceTotalMem(size_t* bytes, CUdevice device) {
  if (device < 0 || device > 1) return CUDA_ERROR_INVALID_VALUE;
  *bytes = kDeviceBytes[device];
  return CUDA_SUCCESS;
}

// Device 0 has a UUID; device 1's query fails (the header then says "").
CUresult DeviceGetUuid(CUuuid* uuid, CUdevice device) {
  if (device != 0) return CUDA_ERROR_NOT_SUPPORTED;
  for (int i = 0; i < 16; ++i) uuid->bytes[i] = static_cast<char>(i * 0x11);
  return CUDA_SUCCESS;
}

const char* const kDeviceBusIds[] = {"0000:17:00.0", "0000:2a:00.0"};

CUresult DeviceGetPCIBusId(char* bus, int len, CUdevice device) {
  if (device < 0 || device > 1 || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(bus, static_cast<size_t>(len), "%s", kDeviceBusIds[device]);
  return CUDA_SUCCESS;
}

const Driver* ScriptedDriver() {
  static const Driver* const driver = [] {
    auto* d = new Driver;  // every other entry point stays null
    InstallScriptedKernels(&Scripted, d);
    d->cuCtxGetDevice = &CtxGetDevice;
    d->cuDeviceGetCount = &DeviceGetCount;
    d->cuDeviceGetName = &DeviceGetName;
    d->cuDeviceTotalMem_v2 = &DeviceTotalMem;
    d->cuDeviceGetUuid_v2 = &DeviceGetUuid;
    d->cuDeviceGetPCIBusId = &DeviceGetPCIBusId;
    return d;
  }();
  return driver;
}

CUfunction Handle(uintptr_t handle) { return reinterpret_cast<CUfunction>(handle); }

// A launch as the hook reports it: inferred (and made resident) before,
// recorded after.
void Launch(Tracker& t, const char* api, CUfunction f, const unsigned grid[3],
            const unsigned block[3], StreamRef stream, void** params) {
  Accesses accesses;
  CUresult r = t.BeginLaunch(f, grid, block, stream, params, nullptr, &accesses);
  t.EndLaunch(api, f, grid, block, stream, accesses, r == CUDA_SUCCESS);
}

// ---------------------------------------------------------------------------
// Helpers.

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::string LogPath(const std::string& name) {
  return absl::StrCat(testing::TempDir(), "/tracker_test_", name, ".jsonl");
}

std::unique_ptr<Tracker> MakeTracker(std::map<std::string, std::string> vars) {
  absl::StatusOr<Config> config = Config::Parse(Env(std::move(vars)));
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<Tracker>> tracker = Tracker::Create(*config, ScriptedDriver());
  EXPECT_TRUE(tracker.ok()) << tracker.status();
  if (!tracker.ok()) return nullptr;
  return std::move(*tracker);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every line of the log, parsed. Fails the test on a line that is not one
// JSON object or a file that does not end with a newline.
std::vector<Json> ReadLog(const std::string& path) {
  const std::string text = ReadFile(path);
  std::vector<Json> records;
  EXPECT_FALSE(text.empty()) << path;
  if (text.empty()) return records;
  EXPECT_EQ(text.back(), '\n') << "the last record is not terminated";
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + start, end - start);
    Json record;
    JsonParser parser(line);
    EXPECT_TRUE(parser.Parse(&record)) << parser.error() << ": " << line;
    EXPECT_EQ(record.kind, Json::Kind::kObject) << line;
    records.push_back(std::move(record));
    start = end + 1;
  }
  return records;
}

std::vector<std::string> Types(const std::vector<Json>& records) {
  std::vector<std::string> types;
  for (const Json& r : records) types.push_back(r["type"].Str());
  return types;
}

std::string Hex(uint64_t v) { return absl::StrFormat("0x%x", v); }

uint64_t HostAddress(const void* p) { return reinterpret_cast<uintptr_t>(p); }

const OpType kAllOpTypes[] = {OpType::kAlloc,  OpType::kFree, OpType::kLaunch,     OpType::kMemcpy,
                              OpType::kMemset, OpType::kSync, OpType::kGraphLaunch};

// The header's fields other than `config`.
void ExpectHeader(const Json& header) {
  ASSERT_FALSE(header.keys.empty());
  EXPECT_EQ(header.keys[0], "type");
  EXPECT_EQ(header["type"].Str(), "header");
  EXPECT_EQ(header["format"].Uint(), 1u);
  EXPECT_EQ(header["pid"].Uint(), static_cast<uint64_t>(getpid()));
  const Json& devices = header["devices"];
  ASSERT_EQ(devices.kind, Json::Kind::kArray);
  ASSERT_EQ(devices.items.size(), 2u);
  for (uint64_t d = 0; d < 2; ++d) {
    SCOPED_TRACE(d);
    EXPECT_EQ(devices.items[d]["ordinal"].Uint(), d);
    EXPECT_EQ(devices.items[d]["name"].Str(), kDeviceNames[d]);
    EXPECT_EQ(devices.items[d]["total_bytes"].Uint(), kDeviceBytes[d]);
    EXPECT_EQ(devices.items[d]["uuid"].Str(),
              d == 0 ? "GPU-00112233-4455-6677-8899-aabbccddeeff" : "");
    EXPECT_EQ(devices.items[d]["pci_bus_id"].Str(), kDeviceBusIds[d]);
  }
}

// The header's `config` names every option with its effective value.
void ExpectConfig(const Json& config, const Config& expected) {
  ASSERT_EQ(config.kind, Json::Kind::kObject);
  EXPECT_EQ(config.keys.size(), Options().size());
  for (const OptionInfo& option : Options()) {
    SCOPED_TRACE(option.name);
    ASSERT_TRUE(config.Has(option.name));
    const Json& value = config[option.name];
    const std::string want = expected.ValueText(option.name).value_or("?");
    if (value.kind == Json::Kind::kBool) {
      EXPECT_EQ(value.boolean ? "on" : "off", want);
    } else {
      EXPECT_EQ(value.Str(), want);
    }
  }
}

// ---------------------------------------------------------------------------
// Tests.

TEST(TrackerTest, LogsEveryOperationInOrderBetweenHeaderAndEnd) {
  const std::string path = LogPath("in_order");
  std::unique_ptr<Tracker> tracker = MakeTracker({{"STENSOR_ACCESS_LOG", path}});
  ASSERT_NE(tracker, nullptr);
  Tracker& t = *tracker;

  constexpr uint64_t kW = 0x20000000, kV = 0x20100000, kG = 0x20200000;
  t.OnAlloc("cuMemAlloc_v2", kW, 0x1000, BufferKind::kDeviceAlloc);
  t.OnAlloc("cuMemAlloc_v2", kV, 0x1000, BufferKind::kDeviceAlloc);
  t.OnAlloc("cuMemAllocAsync", kG, 0x2000, BufferKind::kStreamOrdered);

  // mlp::sgd_momentum(w, v, g, lr, momentum, n) with interior pointers.
  uint64_t w = kW + 0x40, v = kV, g = kG + 0x1000;
  float lr = 0.01f, momentum = 0.9f;
  int n = 1024;
  void* params[] = {&w, &v, &g, &lr, &momentum, &n};
  const unsigned grid[3] = {4, 1, 1};
  const unsigned block[3] = {256, 1, 1};
  Launch(t, "cuLaunchKernel", Handle(kSgdInOrderTest), grid, block, StreamRef{}, params);

  unsigned char host[256];
  const CUstream stream = reinterpret_cast<CUstream>(0xabc0);
  t.OnCopy("cuMemcpyDtoH_v2", CopyKind::kDeviceToHost, HostAddress(host), kW + 0x10, sizeof(host),
           StreamRef{}, /*async=*/false);
  t.OnCopy("cuMemcpyHtoDAsync_v2", CopyKind::kHostToDevice, kV, HostAddress(host), sizeof(host),
           StreamRef{stream, false}, /*async=*/true);
  t.OnCopy("cuMemcpyDtoD_v2", CopyKind::kDeviceToDevice, kG, kW, 0x1000, StreamRef{}, false);
  t.OnMemset("cuMemsetD32_v2_ptds", kG + 0x100, 0x400, StreamRef{nullptr, /*per_thread=*/true},
             false);
  t.OnSync("cuCtxSynchronize", StreamRef{});
  t.OnFree("cuMemFree_v2", kV);
  t.Shutdown();

  const std::vector<Json> log = ReadLog(path);
  ASSERT_THAT(Types(log), ElementsAre("header", "alloc", "alloc", "alloc", "launch", "memcpy",
                                      "memcpy", "memcpy", "memset", "sync", "free", "end"));

  ExpectHeader(log[0]);
  ExpectConfig(log[0]["config"], t.config());
  EXPECT_EQ(log[0]["config"]["STENSOR_ACCESS_LOG"].Str(), path);

  // alloc: ids are distinct and non-zero, and name the buffers from now on.
  const uint64_t w_id = log[1]["id"].Uint();
  const uint64_t v_id = log[2]["id"].Uint();
  const uint64_t g_id = log[3]["id"].Uint();
  EXPECT_NE(w_id, 0u);
  EXPECT_NE(v_id, 0u);
  EXPECT_NE(g_id, 0u);
  EXPECT_EQ(std::set<uint64_t>({w_id, v_id, g_id}).size(), 3u);
  EXPECT_EQ(log[1]["api"].Str(), "cuMemAlloc_v2");
  EXPECT_EQ(log[1]["addr"].Str(), Hex(kW));
  EXPECT_EQ(log[1]["bytes"].Uint(), 0x1000u);
  EXPECT_EQ(log[1]["device"].Uint(), static_cast<uint64_t>(kCurrentDevice));
  EXPECT_EQ(log[1]["kind"].Str(), "device");
  EXPECT_EQ(log[3]["api"].Str(), "cuMemAllocAsync");
  EXPECT_EQ(log[3]["bytes"].Uint(), 0x2000u);
  EXPECT_EQ(log[3]["kind"].Str(), "stream_ordered");

  const Json& launch = log[4];
  EXPECT_EQ(launch["api"].Str(), "cuLaunchKernel");
  EXPECT_EQ(launch["kernel"].Str(), kSgdName);
  EXPECT_EQ(launch["demangled"].Str(), kSgdDemangled);
  EXPECT_EQ(launch["stream"].Str(), "legacy");
  EXPECT_THAT(launch["grid"].Uints(), ElementsAre(4u, 1u, 1u));
  EXPECT_THAT(launch["block"].Uints(), ElementsAre(256u, 1u, 1u));
  EXPECT_THAT(launch["reads"].Uints(), UnorderedElementsAre(w_id, v_id, g_id));
  EXPECT_THAT(launch["writes"].Uints(), UnorderedElementsAre(w_id, v_id));
  EXPECT_TRUE(launch["inferred"].Bool());

  const Json& dtoh = log[5];
  EXPECT_EQ(dtoh["api"].Str(), "cuMemcpyDtoH_v2");
  EXPECT_EQ(dtoh["kind"].Str(), "DtoH");
  EXPECT_EQ(dtoh["bytes"].Uint(), sizeof(host));
  EXPECT_EQ(dtoh["dst"].Str(), Hex(HostAddress(host)));
  EXPECT_EQ(dtoh["src"].Str(), Hex(kW + 0x10));
  EXPECT_THAT(dtoh["reads"].Uints(), ElementsAre(w_id));
  EXPECT_THAT(dtoh["writes"].Uints(), IsEmpty());
  EXPECT_EQ(dtoh["stream"].Str(), "legacy");
  EXPECT_FALSE(dtoh["async"].Bool());

  const Json& htod = log[6];
  EXPECT_EQ(htod["kind"].Str(), "HtoD");
  EXPECT_THAT(htod["reads"].Uints(), IsEmpty());
  EXPECT_THAT(htod["writes"].Uints(), ElementsAre(v_id));
  EXPECT_EQ(htod["stream"].Str(), "0xabc0");
  EXPECT_TRUE(htod["async"].Bool());

  const Json& dtod = log[7];
  EXPECT_EQ(dtod["kind"].Str(), "DtoD");
  EXPECT_THAT(dtod["reads"].Uints(), ElementsAre(w_id));
  EXPECT_THAT(dtod["writes"].Uints(), ElementsAre(g_id));

  const Json& memset = log[8];
  EXPECT_EQ(memset["api"].Str(), "cuMemsetD32_v2_ptds");
  EXPECT_EQ(memset["bytes"].Uint(), 0x400u);
  EXPECT_EQ(memset["dst"].Str(), Hex(kG + 0x100));
  EXPECT_THAT(memset["writes"].Uints(), ElementsAre(g_id));
  EXPECT_EQ(memset["stream"].Str(), "per_thread");
  EXPECT_FALSE(memset["async"].Bool());

  EXPECT_EQ(log[9]["api"].Str(), "cuCtxSynchronize");
  EXPECT_FALSE(log[9].Has("stream"));

  EXPECT_EQ(log[10]["api"].Str(), "cuMemFree_v2");
  EXPECT_EQ(log[10]["id"].Uint(), v_id);
  EXPECT_EQ(log[10]["addr"].Str(), Hex(kV));
  EXPECT_EQ(log[10]["bytes"].Uint(), 0x1000u);

  const Json& end = log[11];
  const Json& counts = end["counts"];
  EXPECT_EQ(counts.keys.size(), std::size(kAllOpTypes));
  for (OpType type : kAllOpTypes) {
    SCOPED_TRACE(OpTypeName(type));
    EXPECT_EQ(counts[OpTypeName(type)].Uint(), t.count(type));
  }
  EXPECT_EQ(counts["alloc"].Uint(), 3u);
  EXPECT_EQ(counts["free"].Uint(), 1u);
  EXPECT_EQ(counts["launch"].Uint(), 1u);
  EXPECT_EQ(counts["memcpy"].Uint(), 3u);
  EXPECT_EQ(counts["memset"].Uint(), 1u);
  EXPECT_EQ(counts["sync"].Uint(), 1u);
  EXPECT_EQ(counts["graph_launch"].Uint(), 0u);
  EXPECT_EQ(end["live_buffers"].Uint(), 2u);
  EXPECT_EQ(end["dropped"].Uint(), 0u);

  // Shutdown is idempotent: a second call writes nothing.
  const std::string before = ReadFile(path);
  t.Shutdown();
  tracker.reset();
  EXPECT_EQ(ReadFile(path), before);
}

TEST(TrackerTest, HeaderAndEndAreWrittenEvenWithoutOperations) {
  const std::string path = LogPath("empty");
  std::unique_ptr<Tracker> tracker = MakeTracker({{"STENSOR_ACCESS_LOG", path}});
  ASSERT_NE(tracker, nullptr);
  tracker->Shutdown();
  const std::vector<Json> log = ReadLog(path);
  ASSERT_THAT(Types(log), ElementsAre("header", "end"));
  ExpectHeader(log[0]);
  for (OpType type : kAllOpTypes) {
    EXPECT_EQ(log[1]["counts"][OpTypeName(type)].Uint(), 0u) << OpTypeName(type);
  }
  EXPECT_EQ(log[1]["live_buffers"].Uint(), 0u);
  EXPECT_EQ(log[1]["dropped"].Uint(), 0u);
}

TEST(TrackerTest, ConservativeWriteInferenceWritesTheConstPointer) {
  const std::string path = LogPath("conservative");
  std::unique_ptr<Tracker> tracker =
      MakeTracker({{"STENSOR_ACCESS_LOG", path}, {"STENSOR_WRITE_INFERENCE", "conservative"}});
  ASSERT_NE(tracker, nullptr);
  constexpr uint64_t kW = 0x22000000, kV = 0x22100000, kG = 0x22200000;
  for (uint64_t base : {kW, kV, kG}) {
    tracker->OnAlloc("cuMemAlloc_v2", base, 0x1000, BufferKind::kDeviceAlloc);
  }
  uint64_t w = kW, v = kV, g = kG;
  float lr = 0.01f, momentum = 0.9f;
  int n = 16;
  void* params[] = {&w, &v, &g, &lr, &momentum, &n};
  const unsigned grid[3] = {1, 1, 1};
  Launch(*tracker, "cuLaunchKernel_ptsz", Handle(kSgdConservativeTest), grid, grid,
         StreamRef{nullptr, true}, params);
  tracker->Shutdown();

  const std::vector<Json> log = ReadLog(path);
  ASSERT_THAT(Types(log), ElementsAre("header", "alloc", "alloc", "alloc", "launch", "end"));
  EXPECT_EQ(log[0]["config"]["STENSOR_WRITE_INFERENCE"].Str(), "conservative");
  const uint64_t ids[] = {log[1]["id"].Uint(), log[2]["id"].Uint(), log[3]["id"].Uint()};
  EXPECT_EQ(log[4]["stream"].Str(), "per_thread");
  EXPECT_THAT(log[4]["reads"].Uints(), UnorderedElementsAre(ids[0], ids[1], ids[2]));
  EXPECT_THAT(log[4]["writes"].Uints(), UnorderedElementsAre(ids[0], ids[1], ids[2]));
}

// Without a cap every allocation call is the driver's: its answer is the
// program's, and only what succeeded (and asked for bytes) is logged.
TEST(TrackerTest, AllocationCallsUncappedAreTheDriversAndLogWhatSucceeded) {
  const std::string path = LogPath("alloc_calls");
  std::unique_ptr<Tracker> tracker = MakeTracker({{"STENSOR_ACCESS_LOG", path}});
  ASSERT_NE(tracker, nullptr);
  Tracker& t = *tracker;
  int calls = 0;
  auto answer = [&](CUdeviceptr* dptr, CUdeviceptr value, CUresult r) {
    return [&calls, dptr, value, r] {
      ++calls;
      if (r == CUDA_SUCCESS) *dptr = value;
      return r;
    };
  };
  CUdeviceptr p = 0;
  EXPECT_EQ(t.Allocate("cuMemAlloc_v2", &p, 0x1000, answer(&p, 0x30000000, CUDA_SUCCESS)),
            CUDA_SUCCESS);
  EXPECT_EQ(p, 0x30000000u);
  CUdeviceptr q = 0;
  EXPECT_EQ(t.Allocate("cuMemAlloc_v2", &q, 0x1000, answer(&q, 0, CUDA_ERROR_OUT_OF_MEMORY)),
            CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr empty = 0;
  EXPECT_EQ(t.AllocateAsync("cuMemAllocAsync", &empty, 0, StreamRef{},
                            answer(&empty, 0x31000000, CUDA_SUCCESS)),
            CUDA_SUCCESS);
  CUdeviceptr a = 0;
  EXPECT_EQ(t.AllocateAsync("cuMemAllocAsync", &a, 0x2000, StreamRef{},
                            answer(&a, 0x32000000, CUDA_SUCCESS)),
            CUDA_SUCCESS);
  EXPECT_EQ(t.FreeAsync("cuMemFreeAsync", a, StreamRef{}, [&] { return CUDA_ERROR_INVALID_VALUE; }),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(t.FreeAsync("cuMemFreeAsync", a, StreamRef{}, [&] { return CUDA_SUCCESS; }),
            CUDA_SUCCESS);
  EXPECT_EQ(t.Free("cuMemFree_v2", p, [&] { return CUDA_SUCCESS; }), CUDA_SUCCESS);
  EXPECT_EQ(calls, 4);
  tracker->Shutdown();

  const std::vector<Json> log = ReadLog(path);
  ASSERT_THAT(Types(log), ElementsAre("header", "alloc", "alloc", "free", "free", "end"));
  EXPECT_EQ(log[1]["api"].Str(), "cuMemAlloc_v2");
  EXPECT_EQ(log[1]["bytes"].Uint(), 0x1000u);
  EXPECT_EQ(log[2]["kind"].Str(), "stream_ordered");
  EXPECT_EQ(log[3]["id"].Uint(), log[2]["id"].Uint());
  EXPECT_EQ(log[4]["id"].Uint(), log[1]["id"].Uint());
}

TEST(TrackerTest, LaunchOfAKernelTheDriverCannotDescribeIsNotInferred) {
  const std::string path = LogPath("opaque");
  std::unique_ptr<Tracker> tracker = MakeTracker({{"STENSOR_ACCESS_LOG", path}});
  ASSERT_NE(tracker, nullptr);
  constexpr uint64_t kBuffer = 0x23000000;
  tracker->OnAlloc("cuMemAlloc_v2", kBuffer, 0x1000, BufferKind::kDeviceAlloc);
  uint64_t p = kBuffer;
  int value = 3;
  void* params[] = {&p, &value};
  const unsigned grid[3] = {1, 1, 1};
  Launch(*tracker, "cuLaunchKernel", Handle(kOpaque), grid, grid, StreamRef{}, params);
  tracker->Shutdown();

  const std::vector<Json> log = ReadLog(path);
  ASSERT_THAT(Types(log), ElementsAre("header", "alloc", "launch", "end"));
  EXPECT_EQ(log[2]["kernel"].Str(), "_Z4fillPfi");
  EXPECT_EQ(log[2]["demangled"].Str(), "fill(float*, int)");
  EXPECT_FALSE(log[2]["inferred"].Bool());
  EXPECT_THAT(log[2]["reads"].Uints(), IsEmpty());
  EXPECT_THAT(log[2]["writes"].Uints(), IsEmpty());
}

std::set<std::string> FilesIn(const std::string& dir) {
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    files.insert(entry.path().string());
  }
  return files;
}

TEST(TrackerTest, WithoutAnAccessLogNothingIsWrittenAndCountsAdvance) {
  const std::set<std::string> files_before = FilesIn(testing::TempDir());
  std::unique_ptr<Tracker> tracker = MakeTracker({});
  ASSERT_NE(tracker, nullptr);
  ASSERT_EQ(tracker->config().access_log, "");
  Tracker& t = *tracker;
  for (OpType type : kAllOpTypes) EXPECT_EQ(t.count(type), 0u);

  constexpr uint64_t kA = 0x21000000, kB = 0x21100000;
  t.OnAlloc("cuMemAlloc_v2", kA, 0x1000, BufferKind::kDeviceAlloc);
  t.OnAlloc("cuMemAllocAsync", kB, 0x1000, BufferKind::kStreamOrdered);
  uint64_t w = kA, v = kB, g = kB + 8;
  float lr = 0.01f, momentum = 0.9f;
  int n = 16;
  void* params[] = {&w, &v, &g, &lr, &momentum, &n};
  const unsigned grid[3] = {1, 1, 1};
  Launch(t, "cuLaunchKernel", Handle(kSgdNoLogTest), grid, grid, StreamRef{}, params);
  Launch(t, "cuLaunchKernel", Handle(kSgdNoLogTest), grid, grid, StreamRef{}, params);
  unsigned char host[16];
  t.OnCopy("cuMemcpyDtoH_v2", CopyKind::kDeviceToHost, HostAddress(host), kA, sizeof(host),
           StreamRef{}, false);
  t.OnMemset("cuMemsetD8_v2", kB, 16, StreamRef{}, false);
  t.OnSync("cuStreamSynchronize", StreamRef{});
  GraphLaunchScope graph;
  const CUgraphExec exec = reinterpret_cast<CUgraphExec>(0x99);
  ASSERT_EQ(t.BeginGraphLaunch(exec, StreamRef{}, &graph), CUDA_SUCCESS);
  t.EndGraphLaunch("cuGraphLaunch", exec, StreamRef{}, graph, /*submitted=*/true);
  t.OnFree("cuMemFree_v2", kA);

  EXPECT_EQ(t.count(OpType::kAlloc), 2u);
  EXPECT_EQ(t.count(OpType::kLaunch), 2u);
  EXPECT_EQ(t.count(OpType::kMemcpy), 1u);
  EXPECT_EQ(t.count(OpType::kMemset), 1u);
  EXPECT_EQ(t.count(OpType::kSync), 1u);
  EXPECT_EQ(t.count(OpType::kGraphLaunch), 1u);
  EXPECT_EQ(t.count(OpType::kFree), 1u);
  // The registry is kept all the same.
  EXPECT_EQ(t.registry().size(), 1u);
  EXPECT_FALSE(t.registry().Find(kA).has_value());
  ASSERT_TRUE(t.registry().Find(kB + 8).has_value());
  EXPECT_EQ(t.registry().Find(kB + 8)->kind, BufferKind::kStreamOrdered);
  EXPECT_EQ(t.registry().Find(kB + 8)->device, kCurrentDevice);

  t.Shutdown();
  tracker.reset();
  EXPECT_EQ(FilesIn(testing::TempDir()), files_before);
}

}  // namespace
}  // namespace stensor

namespace stensor {
namespace {

TEST(TrackerTest, PinnedHostMemoryIsCountedUntilFreed) {
  std::unique_ptr<Tracker> tracker = MakeTracker({});
  ASSERT_NE(tracker, nullptr);
  int a = 0, b = 0;
  tracker->OnHostAlloc("cuMemAllocHost_v2", &a, 4096);
  tracker->OnHostAlloc("cuMemHostAlloc", &b, 1 << 20);
  EXPECT_EQ(tracker->host_pinned_bytes(), 4096u + (1u << 20));
  tracker->OnHostFree("cuMemFreeHost", &a);
  EXPECT_EQ(tracker->host_pinned_bytes(), 1u << 20);
  tracker->OnHostFree("cuMemFreeHost", &a);  // unknown now: no change
  EXPECT_EQ(tracker->host_pinned_bytes(), 1u << 20);
}

}  // namespace
}  // namespace stensor
