// FAKECUDA_TRACE: the timeline the fake driver writes at exit. Each test runs
// a small program in a child process (a death test that must exit 0, so a
// crash or a hang at exit fails it), then reads the file back with a minimal
// JSON reader and checks its structure: the tracks and their names, the
// slices of every operation, and the copy engines' windows.
//
// The BUILD target sets FAKECUDA_LINK=0.01 for this binary: a 2 MiB copy
// holds its direction's engine for about 210 ms.
#include <cuda.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

// --- A minimal JSON reader ----------------------------------------------------
struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  const Json* Get(const std::string& key) const {
    for (const auto& m : object) {
      if (m.first == key) return &m.second;
    }
    return nullptr;
  }
  std::string Str(const std::string& key) const {
    const Json* v = Get(key);
    return v != nullptr && v->kind == Kind::kString ? v->string : "";
  }
  bool HasNumber(const std::string& key) const {
    const Json* v = Get(key);
    return v != nullptr && v->kind == Kind::kNumber;
  }
  double Num(const std::string& key) const {
    const Json* v = Get(key);
    return v != nullptr && v->kind == Kind::kNumber ? v->number : -1;
  }
};

// Strict enough for the file's grammar: objects, arrays, strings with
// escapes, numbers, literals; trailing text is an error.
class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}
  bool Parse(Json* out) {
    if (!Value(out, 0)) return false;
    Space();
    return i_ == s_.size();
  }
  size_t offset() const { return i_; }

 private:
  void Space() {
    while (i_ < s_.size() && std::strchr(" \t\r\n", s_[i_]) != nullptr) ++i_;
  }
  bool Eat(char c) {
    Space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool Literal(const char* word) {
    size_t n = std::strlen(word);
    if (s_.compare(i_, n, word) != 0) return false;
    i_ += n;
    return true;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (i_ >= s_.size()) return false;
      char e = s_[i_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          *out += e;
          break;
        case 'b':
          *out += '\b';
          break;
        case 'f':
          *out += '\f';
          break;
        case 'n':
          *out += '\n';
          break;
        case 'r':
          *out += '\r';
          break;
        case 't':
          *out += '\t';
          break;
        case 'u': {
          if (i_ + 4 > s_.size()) return false;
          unsigned code = 0;
          for (int k = 0; k < 4; ++k) {
            char h = s_[i_++];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return false;
            code = code * 16 + (std::isdigit(static_cast<unsigned char>(h))
                                    ? h - '0'
                                    : std::tolower(h) - 'a' + 10);
          }
          *out += code < 0x80 ? static_cast<char>(code) : '?';
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }
  bool Number(double* out) {
    size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    size_t digits = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (i_ == digits) return false;
    if (i_ < s_.size() && s_[i_] == '.') {
      size_t frac = ++i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      if (i_ == frac) return false;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      size_t exp = i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      if (i_ == exp) return false;
    }
    *out = std::strtod(s_.substr(start, i_ - start).c_str(), nullptr);
    return true;
  }
  bool Value(Json* out, int depth) {
    if (depth > 64) return false;
    Space();
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '{') {
      ++i_;
      out->kind = Json::Kind::kObject;
      if (Eat('}')) return true;
      do {
        std::string key;
        Json value;
        if (!String(&key) || !Eat(':') || !Value(&value, depth + 1)) return false;
        out->object.emplace_back(std::move(key), std::move(value));
      } while (Eat(','));
      return Eat('}');
    }
    if (c == '[') {
      ++i_;
      out->kind = Json::Kind::kArray;
      if (Eat(']')) return true;
      do {
        out->array.emplace_back();
        if (!Value(&out->array.back(), depth + 1)) return false;
      } while (Eat(','));
      return Eat(']');
    }
    if (c == '"') {
      out->kind = Json::Kind::kString;
      return String(&out->string);
    }
    if (Literal("true")) {
      out->kind = Json::Kind::kBool;
      out->boolean = true;
      return true;
    }
    if (Literal("false")) {
      out->kind = Json::Kind::kBool;
      return true;
    }
    if (Literal("null")) return true;
    out->kind = Json::Kind::kNumber;
    return Number(&out->number);
  }

  const std::string& s_;
  size_t i_ = 0;
};

// --- The trace as the tests read it ----------------------------------------------
struct Slice {
  std::string name;
  std::string cat;
  int tid = 0;
  double ts = 0;  // microseconds
  double dur = 0;
  const Json* args = nullptr;
  double end() const { return ts + dur; }
};

struct Trace {
  Json root;
  std::map<int, std::string> thread_names;  // tid -> name
  std::vector<Slice> slices;                // "ph":"X"
  std::vector<const Json*> instants;        // "ph":"i"
  const Json* other_data = nullptr;

  std::vector<Slice> Named(const std::string& name) const {
    std::vector<Slice> out;
    for (const Slice& s : slices) {
      if (s.name == name) out.push_back(s);
    }
    return out;
  }
  int TidNamed(const std::string& name) const {
    for (const auto& t : thread_names) {
      if (t.second == name) return t.first;
    }
    return -1;
  }
};

// Three-decimal microseconds: comparisons allow for the rounding of a sum.
constexpr double kSlack = 0.002;

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

// Reads and checks the envelope every trace has: an object whose
// traceEvents are metadata, complete and instant events with the fields
// the viewers need.
void LoadTrace(const std::string& path, Trace* t) {
  std::string text;
  ASSERT_TRUE(ReadFile(path, &text)) << path;
  JsonParser parser(text);
  ASSERT_TRUE(parser.Parse(&t->root))
      << path << " is not JSON; stopped at offset " << parser.offset();
  ASSERT_EQ(t->root.kind, Json::Kind::kObject);
  const Json* events = t->root.Get("traceEvents");
  ASSERT_NE(events, nullptr);
  ASSERT_EQ(events->kind, Json::Kind::kArray);
  t->other_data = t->root.Get("otherData");
  ASSERT_NE(t->other_data, nullptr);
  for (const Json& e : events->array) {
    ASSERT_EQ(e.kind, Json::Kind::kObject);
    std::string ph = e.Str("ph");
    ASSERT_TRUE(e.HasNumber("pid") && e.HasNumber("tid")) << ph;
    int tid = static_cast<int>(e.Num("tid"));
    const Json* args = e.Get("args");
    if (ph == "M") {
      ASSERT_NE(args, nullptr);
      if (e.Str("name") == "thread_name") t->thread_names[tid] = args->Str("name");
    } else if (ph == "X") {
      ASSERT_TRUE(e.HasNumber("ts") && e.HasNumber("dur")) << e.Str("name");
      ASSERT_GE(e.Num("dur"), 0) << e.Str("name");
      ASSERT_NE(args, nullptr) << e.Str("name");
      t->slices.push_back(Slice{e.Str("name"), e.Str("cat"), tid, e.Num("ts"), e.Num("dur"), args});
    } else if (ph == "i") {
      ASSERT_TRUE(e.HasNumber("ts"));
      t->instants.push_back(&e);
    } else {
      FAIL() << "unexpected phase " << ph;
    }
  }
  for (const Slice& s : t->slices) {
    ASSERT_EQ(t->thread_names.count(s.tid), 1u)
        << "slice " << s.name << " on unnamed track " << s.tid;
  }
}

// --- The programs the children run ----------------------------------------------
// A failed call ends the child with status 3, which fails the death test.
#define CHILD_CU(expr)                                                       \
  do {                                                                       \
    if ((expr) != CUDA_SUCCESS) {                                            \
      std::fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #expr); \
      std::exit(3);                                                          \
    }                                                                        \
  } while (0)

constexpr size_t kBytes = 2u << 20;  // ~210 ms on an engine at 0.01 GB/s
constexpr char kModule[] = "tests/fakecuda/test_kernels.so";
constexpr char kSlowFill[] = "_ZN5testk9slow_fillEPiiii";

CUcontext InitContext() {
  CHILD_CU(cuInit(0));
  CUcontext ctx = nullptr;
  CHILD_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHILD_CU(cuCtxSetCurrent(ctx));
  return ctx;
}

std::string Handle(CUstream s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(s));
  return buf;
}

// A kernel on s1, then an event; s2 and s4 copy host to device and s3
// device to host, all three held by that event, so the copies reach their
// engines at once. The handles of s1..s4 go to `streams_path`. Then a slow
// kernel is still running when the program calls exit().
void CopiesAtOnceThenExit(const std::string& streams_path) {
  InitContext();
  CUdeviceptr up = 0, up2 = 0, down = 0, out = 0;
  CHILD_CU(cuMemAlloc_v2(&up, kBytes));
  CHILD_CU(cuMemAlloc_v2(&up2, kBytes));
  CHILD_CU(cuMemAlloc_v2(&down, kBytes));
  CHILD_CU(cuMemAlloc_v2(&out, 64));
  void* from = nullptr;
  void* from2 = nullptr;
  void* to = nullptr;
  CHILD_CU(cuMemAllocHost_v2(&from, kBytes));
  CHILD_CU(cuMemAllocHost_v2(&from2, kBytes));
  CHILD_CU(cuMemAllocHost_v2(&to, kBytes));
  std::memset(from, 1, kBytes);
  std::memset(from2, 2, kBytes);
  CHILD_CU(cuMemsetD8_v2(down, 0x5a, kBytes));  // on the legacy stream
  CHILD_CU(cuCtxSynchronize());

  CUmodule module = nullptr;
  CUfunction fill = nullptr;
  CHILD_CU(cuModuleLoad(&module, kModule));
  CHILD_CU(cuModuleGetFunction(&fill, module, kSlowFill));
  CUstream s[4];
  for (CUstream& x : s) CHILD_CU(cuStreamCreate(&x, CU_STREAM_NON_BLOCKING));
  CUevent go = nullptr;
  CHILD_CU(cuEventCreate(&go, CU_EVENT_DISABLE_TIMING));

  int value = 7, n = 16, delay_ms = 100;
  void* params[] = {&out, &value, &n, &delay_ms};
  CHILD_CU(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s[0], params, nullptr));
  CHILD_CU(cuEventRecord(go, s[0]));
  for (int i = 1; i < 4; ++i) CHILD_CU(cuStreamWaitEvent(s[i], go, 0));
  CHILD_CU(cuMemcpyHtoDAsync_v2(up, from, kBytes, s[1]));
  CHILD_CU(cuMemcpyDtoHAsync_v2(to, down, kBytes, s[2]));
  CHILD_CU(cuMemcpyHtoDAsync_v2(up2, from2, kBytes, s[3]));
  CHILD_CU(cuCtxSynchronize());
  if (static_cast<unsigned char*>(to)[kBytes - 1] != 0x5a) std::exit(4);

  FILE* f = std::fopen(streams_path.c_str(), "w");
  if (f == nullptr) std::exit(5);
  for (CUstream x : s) std::fprintf(f, "%s\n", Handle(x).c_str());
  std::fclose(f);

  // Still running when exit() writes the trace: it must neither wait for it
  // nor crash because of it.
  delay_ms = 2000;
  CHILD_CU(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s[0], params, nullptr));
  std::exit(0);
}

// Work that checks its own result: a copy up and back.
void SmallWorkThenExit() {
  InitContext();
  CUdeviceptr d = 0;
  CHILD_CU(cuMemAlloc_v2(&d, 4096));
  unsigned char in[4096], back[4096] = {};
  std::memset(in, 0x33, sizeof(in));
  CHILD_CU(cuMemcpyHtoD_v2(d, in, sizeof(in)));
  CHILD_CU(cuMemcpyDtoH_v2(back, d, sizeof(back)));
  if (std::memcmp(in, back, sizeof(in)) != 0) std::exit(4);
  CHILD_CU(cuMemFree_v2(d));
  std::exit(0);
}

// slow_fill over host-located VMM memory (8 MiB, read-write at a device
// address): one page, then 2.5 pages straddling three, then 4 MiB end to
// end.
void HostTouchesThenExit() {
  InitContext();
  constexpr size_t kMapped = 8u << 20;
  CUdeviceptr va = 0;
  CHILD_CU(cuMemAddressReserve(&va, kMapped, 0, 0, 0));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
  CUmemGenericAllocationHandle h = 0;
  CHILD_CU(cuMemCreate(&h, kMapped, &prop, 0));
  CHILD_CU(cuMemMap(va, kMapped, 0, h, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHILD_CU(cuMemSetAccess(va, kMapped, &access, 1));
  CUmodule module = nullptr;
  CHILD_CU(cuModuleLoad(&module, kModule));
  CUfunction fill = nullptr;
  CHILD_CU(cuModuleGetFunction(&fill, module, kSlowFill));
  int value = 1, delay_ms = 0;
  for (auto [offset, n] :
       {std::pair<size_t, int>{4096 * 100, 1024}, std::pair<size_t, int>{4096 * 200 + 2048, 2560},
        std::pair<size_t, int>{4096 * 1024, 1 << 20}}) {
    CUdeviceptr out = va + offset;
    void* params[] = {&out, &value, &n, &delay_ms};
    CHILD_CU(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
    CHILD_CU(cuCtxSynchronize());
  }
  CHILD_CU(cuMemUnmap(va, kMapped));
  CHILD_CU(cuMemRelease(h));
  CHILD_CU(cuMemAddressFree(va, kMapped));
  std::exit(0);
}

// One allocation of 4 MiB reserved at once, its first half mapped in
// device memory and its second in host memory (a tensor over two pieces,
// the second served from host): a kernel given its start fills it whole.
void HostTouchPastItsPointerThenExit() {
  InitContext();
  constexpr size_t kHalf = 2u << 20;
  CUdeviceptr va = 0;
  CHILD_CU(cuMemAddressReserve(&va, 2 * kHalf, 0, 0, 0));
  CUmemAllocationProp on_device{};
  on_device.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  on_device.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemAllocationProp on_host = on_device;
  on_host.location.type = CU_MEM_LOCATION_TYPE_HOST;
  CUmemGenericAllocationHandle d = 0, h = 0;
  CHILD_CU(cuMemCreate(&d, kHalf, &on_device, 0));
  CHILD_CU(cuMemCreate(&h, kHalf, &on_host, 0));
  CHILD_CU(cuMemMap(va, kHalf, 0, d, 0));
  CHILD_CU(cuMemMap(va + kHalf, kHalf, 0, h, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHILD_CU(cuMemSetAccess(va, 2 * kHalf, &access, 1));
  CUmodule module = nullptr;
  CHILD_CU(cuModuleLoad(&module, kModule));
  CUfunction fill = nullptr;
  CHILD_CU(cuModuleGetFunction(&fill, module, kSlowFill));
  int value = 1, n = static_cast<int>(2 * kHalf / sizeof(int)), delay_ms = 0;
  CUdeviceptr out = va;
  void* params[] = {&out, &value, &n, &delay_ms};
  CHILD_CU(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  CHILD_CU(cuCtxSynchronize());
  CHILD_CU(cuMemUnmap(va, 2 * kHalf));
  CHILD_CU(cuMemRelease(d));
  CHILD_CU(cuMemRelease(h));
  CHILD_CU(cuMemAddressFree(va, 2 * kHalf));
  std::exit(0);
}

constexpr int kThreads = 4;
constexpr int kMemsetsPerThread = 250;

// kThreads host threads, each with kMemsetsPerThread memsets on its
// per-thread default stream.
void ManyThreadsThenExit() {
  CUcontext ctx = InitContext();
  CUdeviceptr d = 0;
  CHILD_CU(cuMemAlloc_v2(&d, 4 * kThreads));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([ctx, d, t] {
      CHILD_CU(cuCtxSetCurrent(ctx));
      for (int i = 0; i < kMemsetsPerThread; ++i) {
        CHILD_CU(
            cuMemsetD8Async(d + 4 * t, static_cast<unsigned char>(i), 4, CU_STREAM_PER_THREAD));
      }
      CHILD_CU(cuStreamSynchronize(CU_STREAM_PER_THREAD));
    });
  }
  for (std::thread& t : threads) t.join();
  std::exit(0);
}

// Two processes trace to the same path, both started before either ends:
// the other one (many operations, a long file) ends first, this one (one
// copy up and back) last. The file must be this one's whole trace.
void TwoProcessesOnePathThenExit() {
  int go[2];
  if (pipe(go) != 0) std::exit(7);
  pid_t other = fork();
  if (other < 0) std::exit(7);
  if (other == 0) {
    char c;
    if (read(go[0], &c, 1) != 1) _exit(8);  // this one has opened the file
    CUcontext ctx = InitContext();
    (void)ctx;
    CUdeviceptr d = 0;
    CHILD_CU(cuMemAlloc_v2(&d, 4));
    for (int i = 0; i < 2000; ++i) CHILD_CU(cuMemsetD8_v2(d, 1, 4));
    CHILD_CU(cuCtxSynchronize());
    std::exit(0);
  }
  InitContext();
  if (write(go[1], "g", 1) != 1) std::exit(7);
  int status = 0;
  if (waitpid(other, &status, 0) != other || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::exit(9);
  }
  SmallWorkThenExit();
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(FakeCudaTraceTest, StreamsAndCopyEnginesAreTracksOfTheirOperations) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = TmpPath("copies.json");
  const std::string streams_path = TmpPath("copies.streams");
  std::remove(path.c_str());
  EXPECT_EXIT(
      {
        setenv("FAKECUDA_TRACE", path.c_str(), 1);
        CopiesAtOnceThenExit(streams_path);
      },
      ::testing::ExitedWithCode(0), "");
  Trace t;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, &t));
  std::vector<std::string> handles = ReadLines(streams_path);
  ASSERT_EQ(handles.size(), 4u);
  int tid[4];
  for (int i = 0; i < 4; ++i) {
    tid[i] = t.TidNamed("stream " + handles[i] + " (created) device 0");
    ASSERT_GT(tid[i], 0) << handles[i];
  }
  int h2d = t.TidNamed("copy engine H2D device 0");
  int d2h = t.TidNamed("copy engine D2H device 0");
  ASSERT_GT(h2d, 0);
  ASSERT_GT(d2h, 0);
  EXPECT_EQ(t.other_data->Num("dropped"), 0);

  // The legacy stream's memset.
  std::vector<Slice> memsets = t.Named("memset 2 MiB");
  ASSERT_EQ(memsets.size(), 1u);
  const std::string legacy = t.thread_names[memsets[0].tid];
  EXPECT_EQ(legacy.rfind("stream 0x", 0), 0u) << legacy;
  EXPECT_NE(legacy.find(" (legacy) device 0"), std::string::npos) << legacy;
  EXPECT_EQ(memsets[0].args->Num("bytes"), kBytes);

  // The kernel, by its C++ name, with its symbol; and the event after it.
  std::vector<Slice> kernels = t.Named("testk::slow_fill(int*, int, int, int)");
  ASSERT_GE(kernels.size(), 1u);  // the second may still run at exit
  EXPECT_EQ(kernels[0].tid, tid[0]);
  EXPECT_EQ(kernels[0].cat, "kernel");
  EXPECT_EQ(kernels[0].args->Str("symbol"), kSlowFill);
  std::vector<Slice> records = t.Named("event record");
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].tid, tid[0]);
  EXPECT_GE(records[0].ts + kSlack, kernels[0].end());

  // Each copy stream: a wait for the event, then its copy, which starts only
  // once the event was reached. Every operation says when it was submitted
  // and how long it waited for other streams.
  std::vector<Slice> waits = t.Named("wait event");
  ASSERT_EQ(waits.size(), 3u);
  const char* copy_name[4] = {nullptr, "memcpy HtoD 2 MiB", "memcpy DtoH 2 MiB",
                              "memcpy HtoD 2 MiB"};
  std::map<int, Slice> copy_of;  // by tid
  for (int i = 1; i < 4; ++i) {
    int on_stream = 0;
    for (const Slice& w : waits) on_stream += w.tid == tid[i];
    EXPECT_EQ(on_stream, 1) << "stream " << i;
    for (const Slice& c : t.Named(copy_name[i])) {
      if (c.tid == tid[i]) copy_of[tid[i]] = c;
    }
    ASSERT_EQ(copy_of.count(tid[i]), 1u) << copy_name[i] << " on stream " << i;
    const Slice& c = copy_of[tid[i]];
    EXPECT_EQ(c.cat, "copy");
    EXPECT_EQ(c.args->Num("bytes"), kBytes);
    EXPECT_GE(c.ts + kSlack, records[0].end());
    ASSERT_TRUE(c.args->HasNumber("enqueued_us"));
    EXPECT_LE(c.args->Num("enqueued_us"), c.ts + kSlack);
    ASSERT_TRUE(c.args->HasNumber("dep_wait_us"));
  }
  // The waits were submitted at once while s1's kernel ran for 100 ms: they
  // show as held by s1.
  std::vector<Slice> held = t.Named("dep wait");
  ASSERT_GE(held.size(), 1u);
  for (const Slice& h : held) {
    EXPECT_EQ(h.args->Str("on"), t.thread_names[tid[0]]);
    EXPECT_EQ(h.args->Str("for"), "wait event");
    EXPECT_EQ(h.args->Num("on_tid"), tid[0]);
  }

  // The engines: two host-to-device windows, one after the other though
  // they came from two streams at once; the device-to-host window overlaps
  // them. Each window lies inside its stream's copy.
  std::vector<Slice> up, down;
  for (const Slice& s : t.slices) {
    if (s.tid == h2d) up.push_back(s);
    if (s.tid == d2h) down.push_back(s);
  }
  ASSERT_EQ(up.size(), 2u);
  ASSERT_EQ(down.size(), 1u);
  if (up[1].ts < up[0].ts) std::swap(up[0], up[1]);
  EXPECT_GE(up[1].ts + kSlack, up[0].end()) << "one direction serialises";
  EXPECT_TRUE(down[0].ts < up[0].end() && up[0].ts < down[0].end())
      << "the two directions overlap: D2H [" << down[0].ts << ", " << down[0].end() << "), H2D ["
      << up[0].ts << ", " << up[0].end() << ")";
  EXPECT_NE(up[0].args->Num("stream_tid"), up[1].args->Num("stream_tid"));
  for (const Slice* e : {&up[0], &up[1], &down[0]}) {
    EXPECT_EQ(e->cat, "engine");
    EXPECT_EQ(e->name, e == &down[0] ? "D2H 2 MiB" : "H2D 2 MiB");
    EXPECT_EQ(e->args->Num("bytes"), kBytes);
    int served = static_cast<int>(e->args->Num("stream_tid"));
    EXPECT_EQ(e->args->Str("stream"), t.thread_names[served]);
    ASSERT_EQ(copy_of.count(served), 1u) << e->name;
    const Slice& c = copy_of[served];
    EXPECT_LE(c.ts, e->ts + kSlack) << e->name;
    EXPECT_GE(c.end() + kSlack, e->end()) << e->name;
    EXPECT_GE(e->args->Num("engine_wait_us"), 0);
  }
}

// Runs `child` (which exits 0) in a forked process whose FAKECUDA_TRACE is
// TmpPath(name), and loads the trace it wrote.
void TraceOfChild(const std::string& name, void (*child)(), Trace* t) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = TmpPath(name);
  std::remove(path.c_str());
  EXPECT_EXIT(
      {
        setenv("FAKECUDA_TRACE", path.c_str(), 1);
        child();
      },
      ::testing::ExitedWithCode(0), "");
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, t));
}

// A kernel reaching host-located memory says how much of it it touched
// (whole pages), and the host-to-device engine carries that much. A touch
// of the page after the ones the previous touch opened opens twice as many:
// one fault a page would cost far more than the link time charged, so a
// sequential read of 1,024 pages takes 22 faults and is charged at most 63
// pages it did not reach.
TEST(FakeCudaTraceTest, AKernelsRecordSaysTheHostBytesItTouched) {
  Trace t;
  ASSERT_NO_FATAL_FAILURE(TraceOfChild("host_touch.json", &HostTouchesThenExit, &t));
  std::vector<Slice> kernels = t.Named("testk::slow_fill(int*, int, int, int)");
  ASSERT_EQ(kernels.size(), 3u);
  EXPECT_EQ(kernels[0].args->Num("host_bytes_touched"), 4096);
  EXPECT_EQ(kernels[0].args->Num("host_touch_faults"), 1);
  EXPECT_EQ(kernels[1].args->Num("host_bytes_touched"), 3 * 4096);
  EXPECT_EQ(kernels[1].args->Num("host_touch_faults"), 2);  // 1 page, then 2
  EXPECT_GE(kernels[2].args->Num("host_bytes_touched"), 1024 * 4096);
  EXPECT_LE(kernels[2].args->Num("host_bytes_touched"), (1024 + 63) * 4096);
  EXPECT_EQ(kernels[2].args->Num("host_touch_faults"), 22);  // 1, 2, ..., 32, then 64 each
  std::vector<Slice> one = t.Named("H2D 4 KiB");
  std::vector<Slice> three = t.Named("H2D 12 KiB");
  EXPECT_EQ(one.size(), 1u);
  EXPECT_EQ(three.size(), 1u);
}

// A kernel's pointer need not point into the host memory it reaches: one
// given the start of an allocation whose second half is in host memory
// reads that half over the link, every page of it charged.
TEST(FakeCudaTraceTest, HostMemoryPastTheMappingAPointerStartsInIsCharged) {
  Trace t;
  ASSERT_NO_FATAL_FAILURE(
      TraceOfChild("host_touch_past.json", &HostTouchPastItsPointerThenExit, &t));
  std::vector<Slice> kernels = t.Named("testk::slow_fill(int*, int, int, int)");
  ASSERT_EQ(kernels.size(), 1u);
  ASSERT_TRUE(kernels[0].args->HasNumber("host_bytes_touched"));
  EXPECT_GE(kernels[0].args->Num("host_bytes_touched"), 512 * 4096);
  EXPECT_LE(kernels[0].args->Num("host_bytes_touched"), (512 + 63) * 4096);
  // The host-to-device engine carried that much.
  const double touched = kernels[0].args->Num("host_bytes_touched");
  int carried = 0;
  for (const Slice& e : t.slices) {
    carried += e.cat == "engine" && e.args->HasNumber("bytes") && e.args->Num("bytes") == touched;
  }
  EXPECT_EQ(carried, 1);
}

TEST(FakeCudaTraceTest, UnsetWritesNoFile) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = TmpPath("unset");
  mkdir(dir.c_str(), 0755);
  EXPECT_EXIT(
      {
        unsetenv("FAKECUDA_TRACE");
        if (chdir(dir.c_str()) != 0) std::exit(6);
        SmallWorkThenExit();
      },
      ::testing::ExitedWithCode(0), "");
  // Nothing was written anywhere the child could have chosen by default.
  std::string listing;
  FILE* ls = popen(("ls -A " + dir).c_str(), "r");
  ASSERT_NE(ls, nullptr);
  char buf[256];
  while (std::fgets(buf, sizeof(buf), ls) != nullptr) listing += buf;
  pclose(ls);
  EXPECT_EQ(listing, "");
}

TEST(FakeCudaTraceTest, BadValuesAreSaidAndTheProgramRunsOn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string dir = TmpPath("");
  const struct {
    std::string value;
    std::string message;
  } cases[] = {
      {"", "fakecuda: invalid FAKECUDA_TRACE=\"\"; expected the path of a file"},
      {"/nonexistent-fakecuda-dir/trace.json",
       "fakecuda: FAKECUDA_TRACE=\"/nonexistent-fakecuda-dir/trace.json\": "
       "cannot open .* for writing: No such file or directory; no trace is "
       "written"},
      {dir, "FAKECUDA_TRACE=\".*/\": cannot open .*: Is a directory"},
  };
  for (const auto& c : cases) {
    EXPECT_EXIT(
        {
          setenv("FAKECUDA_TRACE", c.value.c_str(), 1);
          SmallWorkThenExit();
        },
        ::testing::ExitedWithCode(0), c.message)
        << "FAKECUDA_TRACE=" << c.value;
  }
  EXPECT_EXIT(
      {
        setenv("FAKECUDA_TRACE", TmpPath("bad_events.json").c_str(), 1);
        setenv("FAKECUDA_TRACE_EVENTS", "lots", 1);
        SmallWorkThenExit();
      },
      ::testing::ExitedWithCode(0),
      "fakecuda: invalid FAKECUDA_TRACE_EVENTS=\"lots\"; expected an integer "
      "from 1 to 100000000; the trace keeps at most 1000000 events");
  Trace t;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(TmpPath("bad_events.json"), &t));
  EXPECT_EQ(t.other_data->Num("max_events"), 1000000);
  EXPECT_EQ(t.Named("memcpy HtoD 4 KiB").size(), 1u);
  EXPECT_EQ(t.Named("memcpy DtoH 4 KiB").size(), 1u);
}

TEST(FakeCudaTraceTest, TheFileIsOneWholeTraceWhenTwoProcessesShareItsPath) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = TmpPath("shared.json");
  EXPECT_EXIT(
      {
        setenv("FAKECUDA_TRACE", path.c_str(), 1);
        TwoProcessesOnePathThenExit();
      },
      ::testing::ExitedWithCode(0), "");
  Trace t;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, &t));
  EXPECT_EQ(t.Named("memcpy HtoD 4 KiB").size(), 1u);
  EXPECT_EQ(t.Named("memcpy DtoH 4 KiB").size(), 1u);
  EXPECT_TRUE(t.Named("memset 4 B").empty());
}

TEST(FakeCudaTraceTest, ManyHostThreadsEachGetTheirPerThreadStreamsTrack) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = TmpPath("threads.json");
  EXPECT_EXIT(
      {
        setenv("FAKECUDA_TRACE", path.c_str(), 1);
        ManyThreadsThenExit();
      },
      ::testing::ExitedWithCode(0), "");
  Trace t;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, &t));
  std::map<int, int> per_track;
  for (const Slice& s : t.Named("memset 4 B")) ++per_track[s.tid];
  ASSERT_EQ(per_track.size(), static_cast<size_t>(kThreads));
  for (const auto& p : per_track) {
    EXPECT_EQ(p.second, kMemsetsPerThread);
    const std::string& name = t.thread_names[p.first];
    EXPECT_NE(name.find(" (per-thread) device 0"), std::string::npos) << name;
  }
  EXPECT_EQ(t.other_data->Num("dropped"), 0);
  EXPECT_TRUE(t.instants.empty());
}

TEST(FakeCudaTraceTest, EventsPastTheCapAreCountedAndSaid) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = TmpPath("capped.json");
  EXPECT_EXIT(
      {
        setenv("FAKECUDA_TRACE", path.c_str(), 1);
        setenv("FAKECUDA_TRACE_EVENTS", "100", 1);
        ManyThreadsThenExit();
      },
      ::testing::ExitedWithCode(0),
      "fakecuda: FAKECUDA_TRACE: \".*capped.json\" holds the first 100 events; "
      "[0-9]+ later ones were dropped");
  Trace t;
  ASSERT_NO_FATAL_FAILURE(LoadTrace(path, &t));
  size_t operations = 0;
  for (const Slice& s : t.slices) operations += s.name != "dep wait";
  EXPECT_EQ(operations, 100u);
  EXPECT_EQ(t.other_data->Num("recorded"), 100);
  EXPECT_EQ(t.other_data->Num("max_events"), 100);
  double dropped = t.other_data->Num("dropped");
  EXPECT_GE(dropped + 100, kThreads * kMemsetsPerThread);
  ASSERT_EQ(t.instants.size(), 1u);
  char said[128];
  std::snprintf(said, sizeof(said),
                "trace full: %.0f later events dropped (FAKECUDA_TRACE_EVENTS=100)", dropped);
  EXPECT_EQ(t.instants[0]->Str("name"), said);
}

}  // namespace
