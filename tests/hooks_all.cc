// Calls every entry point libstensor.so exports (the STENSOR_HOOK lines of
// core/driver/driver_symbols.inc, and dlsym) on the fake driver, with valid
// arguments and with arguments the driver rejects, run with and without
// stensor (tests/hooks_test.sh). It prints, on stdout:
//   rc LABEL N        the CUresult of one call: the same in every run (the
//                     script compares the runs line by line);
//   val LABEL V       a value the call returned (a pitch, a size, the symbol
//                     cuGetProcAddress resolved to): the same in every run;
//   expect JSON       the access-log record that call must write, in order:
//                     every call the program makes through the driver that
//                     stensor logs has one, so a missing or extra record
//                     fails (tests/hooks_check.py);
//   swapped ADDR      under a cap, the next expected record's buffer at ADDR
//                     was swapped out before the call: a swap_in of it must
//                     come between the previous record and that one;
//   called SYMBOL     an entry point the program called (the script checks
//                     that every exported hook is among them);
//   ok                every check held (else each failure is on stderr).
// Device buffers are checked byte for byte against a host model after each
// call that changes them, and all of them at the end. Under a cap
// (STENSOR_MEMORY_LIMIT: two of the four 2 MiB buffers fit) every buffer a
// valid call touches is swapped out first, by writing two others.
//
// usage: hooks_all TEST_KERNELS_SO HOOK_LIST (the exported hooks, one a line)
#include <cuda.h>
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "tests/driver_check.h"

namespace {

using stensor_tests::failures;

constexpr size_t kGranule = 2u << 20;
const bool kCapped = std::getenv("STENSOR_MEMORY_LIMIT") != nullptr;
bool g_preloaded = false;
void* g_fake = nullptr;  // the fake libcuda.so.1
// Whether libcuda.so.1 is the fake (it exports its test controls) or a real
// driver (scripts/gpu_check.sh runs this program on a GPU).
bool g_on_fake = false;
std::set<std::string> g_called;

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}
uint64_t Ptr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The entry point `name` as the program finds it: dlsym(RTLD_DEFAULT), which
// under LD_PRELOAD must be stensor's hook of that exact symbol. Null when no
// library exports it (without stensor: the fake lacks it).
void* Resolve(const char* name) {
  void* p = dlsym(RTLD_DEFAULT, name);
  if (g_preloaded) {
    Dl_info info{};
    if (p == nullptr || dladdr(p, &info) == 0 || info.dli_sname == nullptr ||
        std::strcmp(info.dli_sname, name) != 0 ||
        std::strstr(info.dli_fname, "libstensor") == nullptr) {
      std::fprintf(stderr, "dlsym(%s) = %p is not stensor's hook (%s in %s)\n", name, p,
                   p && info.dli_sname ? info.dli_sname : "?",
                   p && info.dli_fname ? info.dli_fname : "?");
      ++failures;
      return nullptr;
    }
    // The CUDA runtime's way: dlopen("libcuda.so.1") and dlsym of that handle.
    void* via_driver = dlsym(g_fake, name);
    if (via_driver != nullptr && via_driver != p) {
      std::fprintf(stderr, "dlsym(libcuda.so.1, %s) = %p, not the hook %p\n", name, via_driver, p);
      ++failures;
    }
    g_called.insert("dlsym");
  }
  return p;
}
// Whether the fake driver itself exports `name`.
bool FakeHas(const char* name) {
  // dlsym of the fake's handle passes stensor's dlsym; a name the fake lacks
  // is null either way.
  return dlsym(g_fake, name) != nullptr;
}

// Calls `sym` through the pointer dlsym gave, records the call and prints
// its result as `rc LABEL N`. A symbol the fake lacks: without stensor it
// cannot be called (`rc LABEL missing`); with stensor the hook must answer
// CUDA_ERROR_NOT_SUPPORTED without calling anything (printed the same way).
#define CALL(sym, label, ...) \
  InvokeHook<decltype(&::sym)>(#sym, label, [&](decltype(&::sym) f_) { return f_(__VA_ARGS__); })

template <typename Fn, typename Invoke>
CUresult InvokeHook(const char* sym, const std::string& label, Invoke&& invoke) {
  const std::string full = std::string(sym) + "/" + label;
  void* p = Resolve(sym);
  if (!FakeHas(sym)) {
    if (g_preloaded && p != nullptr) {
      g_called.insert(sym);
      CUresult r = invoke(reinterpret_cast<Fn>(p));
      if (r != CUDA_ERROR_NOT_SUPPORTED) {
        std::fprintf(stderr, "%s: %d without a real entry point\n", full.c_str(), r);
        ++failures;
      }
    }
    std::printf("rc %s missing\n", full.c_str());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (p == nullptr) {
    ++failures;
    return CUDA_ERROR_UNKNOWN;
  }
  g_called.insert(sym);
  CUresult r = invoke(reinterpret_cast<Fn>(p));
  std::printf("rc %s %d\n", full.c_str(), static_cast<int>(r));
  return r;
}
// A call that must succeed / must be refused.
#define VALID(sym, label, ...) ExpectOk(#sym, label, CALL(sym, label, __VA_ARGS__))
#define INVALID(sym, label, ...) ExpectRefused(#sym, label, CALL(sym, label, __VA_ARGS__))
// An entry point the fake does not implement: on the fake the hook must
// answer CUDA_ERROR_NOT_SUPPORTED (VALID accepts that of a missing symbol);
// on a real driver, which has it, the answer is only compared.
#define ABSENT(sym, label, ...)                                           \
  (g_on_fake ? (VALID(sym, label, __VA_ARGS__), CUDA_ERROR_NOT_SUPPORTED) \
             : CALL(sym, label, __VA_ARGS__))
void ExpectOk(const char* sym, const std::string& label, CUresult r) {
  if (r != CUDA_SUCCESS && !(r == CUDA_ERROR_NOT_SUPPORTED && !FakeHas(sym))) {
    std::fprintf(stderr, "%s/%s failed: %d\n", sym, label.c_str(), r);
    ++failures;
  }
}
void ExpectRefused(const char* sym, const std::string& label, CUresult r) {
  if (r == CUDA_SUCCESS) {
    std::fprintf(stderr, "%s/%s: invalid arguments accepted\n", sym, label.c_str());
    ++failures;
  }
}
void Val(const std::string& label, const std::string& v) {
  std::printf("val %s %s\n", label.c_str(), v.c_str());
}

// One expected access-log record, printed as JSON. Buffers are named by
// their base addresses (the checker maps the log's ids to them).
class Rec {
 public:
  explicit Rec(const char* type, const char* api) { S("type", type).S("api", api); }
  Rec& S(const char* k, const std::string& v) { return Add(k, "\"" + v + "\""); }
  Rec& U(const char* k, uint64_t v) { return Add(k, std::to_string(v)); }
  Rec& B(const char* k, bool v) { return Add(k, v ? "true" : "false"); }
  Rec& Bufs(const char* k, std::initializer_list<uint64_t> bases) {
    std::string s = "[";
    for (uint64_t b : bases) {
      if (s.size() > 1) s += ",";
      s += "\"" + Hex(b) + "\"";
    }
    return Add(k, s + "]");
  }
  Rec& Raw(const char* k, const std::string& v) { return Add(k, v); }
  ~Rec() { std::printf("expect {%s}\n", body_.c_str()); }

 private:
  Rec& Add(const char* k, const std::string& v) {
    if (!body_.empty()) body_ += ",";
    body_ += "\"" + std::string(k) + "\":" + v;
    return *this;
  }
  std::string body_;
};

std::string StreamName(CUstream s, bool per_thread) {
  if (s == nullptr) return per_thread ? "per_thread" : "legacy";
  return Hex(Ptr(s));
}

// A device buffer and the bytes it must hold.
struct Buf {
  const char* name;
  CUdeviceptr p = 0;
  std::vector<uint8_t> model;
};
Buf g_bufs[4] = {{"A"}, {"B"}, {"C"}, {"D"}};
Buf& A = g_bufs[0];
Buf& B = g_bufs[1];
CUstream g_stream = nullptr;
uint8_t g_fill = 1;

void SetAll(Buf& b, uint8_t v) {
  VALID(cuMemsetD8_v2, std::string("fill") + b.name, b.p, v, kGranule);
  Rec("memset", "cuMemsetD8_v2")
      .U("bytes", kGranule)
      .S("dst", Hex(b.p))
      .Bufs("writes", {b.p})
      .S("stream", "legacy")
      .B("async", false);
  std::fill(b.model.begin(), b.model.end(), v);
}

// Swaps the buffers of `keep` out (under a cap that holds two of the four):
// the two others are written; every buffer of `keep` is then marked for the
// checker.
void Evict(std::initializer_list<Buf*> keep) {
  int written = 0;
  for (Buf& b : g_bufs) {
    bool kept = false;
    for (Buf* k : keep) kept |= k == &b;
    if (kept || written == 2) continue;
    SetAll(b, g_fill++);
    ++written;
  }
  if (g_fill == 0) g_fill = 1;
  for (Buf* k : keep) std::printf("swapped %s\n", Hex(k->p).c_str());
}

// Reads [off, off + n) of `b` back and compares it with the model.
void Verify(Buf& b, size_t off, size_t n) {
  std::vector<uint8_t> got(n);
  VALID(cuMemcpyDtoH_v2, std::string("verify") + b.name, got.data(), b.p + off, n);
  Rec("memcpy", "cuMemcpyDtoH_v2")
      .S("kind", "DtoH")
      .U("bytes", n)
      .S("dst", Hex(Ptr(got.data())))
      .S("src", Hex(b.p + off))
      .Bufs("reads", {b.p})
      .Bufs("writes", {})
      .S("stream", "legacy")
      .B("async", false);
  if (std::memcmp(got.data(), b.model.data() + off, n) != 0) {
    std::fprintf(stderr, "buffer %s [%zu, +%zu) differs from its model\n", b.name, off, n);
    ++failures;
  }
}

void SyncStream(CUstream s, bool per_thread) {
  if (per_thread) {
    VALID(cuStreamSynchronize_ptsz, "after", s);
    Rec("sync", "cuStreamSynchronize_ptsz").S("stream", StreamName(s, true));
  } else {
    VALID(cuStreamSynchronize, "after", s);
    Rec("sync", "cuStreamSynchronize").S("stream", StreamName(s, false));
  }
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13 + (i >> 9));
  return v;
}

// --- Copies ---------------------------------------------------------------------
// Device to device, [src_off, +n) of B to [dst_off, +n) of A, both swapped out
// first. `call` makes the copy; `kind` is the record's.
template <typename Call>
void DeviceCopy(const char* api, const char* kind, bool async, bool per_thread, CUstream s,
                Call&& call) {
  const size_t src_off = 4096 + 24, dst_off = 65536 + 8, n = 300000;
  for (size_t i = 0; i < n; ++i) B.model[src_off + i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<uint8_t> src_data(B.model.begin() + src_off, B.model.begin() + src_off + n);
  // The source's bytes are put there first (a write of B), then both evicted.
  VALID(cuMemcpyHtoD_v2, std::string("stage/") + api, B.p + src_off, src_data.data(), n);
  Rec("memcpy", "cuMemcpyHtoD_v2")
      .S("kind", "HtoD")
      .U("bytes", n)
      .S("dst", Hex(B.p + src_off))
      .S("src", Hex(Ptr(src_data.data())))
      .Bufs("reads", {})
      .Bufs("writes", {B.p});
  Evict({&A, &B});
  if (call(A.p + dst_off, B.p + src_off, n) != CUDA_SUCCESS) return;
  Rec("memcpy", api)
      .S("kind", kind)
      .U("bytes", n)
      .S("dst", Hex(A.p + dst_off))
      .S("src", Hex(B.p + src_off))
      .Bufs("reads", {B.p})
      .Bufs("writes", {A.p})
      .S("stream", StreamName(s, per_thread))
      .B("async", async);
  if (async) SyncStream(s, per_thread);
  std::memcpy(A.model.data() + dst_off, B.model.data() + src_off, n);
  Verify(A, dst_off, n);
}

// Host to device into A (swapped out first), then checked.
template <typename Call>
void Upload(const char* api, bool async, bool per_thread, CUstream s, Call&& call) {
  const size_t off = 12345, n = 200000;
  std::vector<uint8_t> data = Pattern(n, static_cast<uint8_t>(std::strlen(api)));
  Evict({&A});
  if (call(A.p + off, data.data(), n) != CUDA_SUCCESS) return;
  Rec("memcpy", api)
      .S("kind", "HtoD")
      .U("bytes", n)
      .S("dst", Hex(A.p + off))
      .S("src", Hex(Ptr(data.data())))
      .Bufs("reads", {})
      .Bufs("writes", {A.p})
      .S("stream", StreamName(s, per_thread))
      .B("async", async);
  if (async) SyncStream(s, per_thread);
  std::memcpy(A.model.data() + off, data.data(), n);
  Verify(A, off, n);
}

// Device (A, swapped out first) to host, compared with the model.
template <typename Call>
void Download(const char* api, bool async, bool per_thread, CUstream s, Call&& call) {
  const size_t off = 777, n = 250000;
  std::vector<uint8_t> got(n, 0);
  Evict({&A});
  if (call(got.data(), A.p + off, n) != CUDA_SUCCESS) return;
  Rec("memcpy", api)
      .S("kind", "DtoH")
      .U("bytes", n)
      .S("dst", Hex(Ptr(got.data())))
      .S("src", Hex(A.p + off))
      .Bufs("reads", {A.p})
      .Bufs("writes", {})
      .S("stream", StreamName(s, per_thread))
      .B("async", async);
  if (async) SyncStream(s, per_thread);
  EXPECT_TRUE(std::memcmp(got.data(), A.model.data() + off, n) == 0);
}

CUcontext g_ctx = nullptr;

void Copies() {
  const size_t kOver = kGranule + 1;  // one byte past the end of a buffer
  std::vector<uint8_t> host(kOver);
  // cuMemcpy / cuMemcpyAsync (unified addressing) and peer copies.
  DeviceCopy(
      "cuMemcpy", "default", false, false, nullptr,
      [&](CUdeviceptr d, CUdeviceptr s, size_t n) { return CALL(cuMemcpy, "valid", d, s, n); });
  DeviceCopy("cuMemcpy_ptds", "default", false, true, nullptr,
             [&](CUdeviceptr d, CUdeviceptr s, size_t n) {
               return CALL(cuMemcpy_ptds, "valid", d, s, n);
             });
  INVALID(cuMemcpy, "overrun", A.p, B.p, kOver);
  INVALID(cuMemcpy_ptds, "overrun", A.p, B.p, kOver);
  DeviceCopy("cuMemcpyAsync", "default", true, false, g_stream,
             [&](CUdeviceptr d, CUdeviceptr s, size_t n) {
               return CALL(cuMemcpyAsync, "valid", d, s, n, g_stream);
             });
  DeviceCopy("cuMemcpyAsync_ptsz", "default", true, true, nullptr,
             [&](CUdeviceptr d, CUdeviceptr s, size_t n) {
               return CALL(cuMemcpyAsync_ptsz, "valid", d, s, n, nullptr);
             });
  INVALID(cuMemcpyAsync, "overrun", A.p, B.p, kOver, g_stream);
  INVALID(cuMemcpyAsync_ptsz, "overrun", A.p, B.p, kOver, nullptr);
  DeviceCopy("cuMemcpyPeer", "peer", false, false, nullptr,
             [&](CUdeviceptr d, CUdeviceptr s, size_t n) {
               return CALL(cuMemcpyPeer, "valid", d, g_ctx, s, g_ctx, n);
             });
  DeviceCopy("cuMemcpyPeer_ptds", "peer", false, true, nullptr,
             [&](CUdeviceptr d, CUdeviceptr s, size_t n) {
               return CALL(cuMemcpyPeer_ptds, "valid", d, g_ctx, s, g_ctx, n);
             });
  INVALID(cuMemcpyPeer, "overrun", A.p, g_ctx, B.p, g_ctx, kOver);
  INVALID(cuMemcpyPeer_ptds, "overrun", A.p, g_ctx, B.p, g_ctx, kOver);
  DeviceCopy("cuMemcpyPeerAsync", "peer", true, false, g_stream,
             [&](CUdeviceptr d, CUdeviceptr s, size_t n) {
               return CALL(cuMemcpyPeerAsync, "valid", d, g_ctx, s, g_ctx, n, g_stream);
             });
  DeviceCopy("cuMemcpyPeerAsync_ptsz", "peer", true, true, nullptr,
             [&](CUdeviceptr d, CUdeviceptr s, size_t n) {
               return CALL(cuMemcpyPeerAsync_ptsz, "valid", d, g_ctx, s, g_ctx, n, nullptr);
             });
  INVALID(cuMemcpyPeerAsync, "overrun", A.p, g_ctx, B.p, g_ctx, kOver, g_stream);
  INVALID(cuMemcpyPeerAsync_ptsz, "overrun", A.p, g_ctx, B.p, g_ctx, kOver, nullptr);

  // The explicit directions.
  Upload("cuMemcpyHtoD_v2", false, false, nullptr, [&](CUdeviceptr d, const void* s, size_t n) {
    return CALL(cuMemcpyHtoD_v2, "valid", d, s, n);
  });
  Upload("cuMemcpyHtoD_v2_ptds", false, true, nullptr, [&](CUdeviceptr d, const void* s, size_t n) {
    return CALL(cuMemcpyHtoD_v2_ptds, "valid", d, s, n);
  });
  INVALID(cuMemcpyHtoD_v2, "overrun", A.p, host.data(), kOver);
  INVALID(cuMemcpyHtoD_v2_ptds, "overrun", A.p, host.data(), kOver);
  INVALID(cuMemcpyHtoD_v2, "null-src", A.p, nullptr, 16);
  Upload("cuMemcpyHtoDAsync_v2", true, false, g_stream,
         [&](CUdeviceptr d, const void* s, size_t n) {
           return CALL(cuMemcpyHtoDAsync_v2, "valid", d, s, n, g_stream);
         });
  Upload("cuMemcpyHtoDAsync_v2_ptsz", true, true, nullptr,
         [&](CUdeviceptr d, const void* s, size_t n) {
           return CALL(cuMemcpyHtoDAsync_v2_ptsz, "valid", d, s, n, nullptr);
         });
  INVALID(cuMemcpyHtoDAsync_v2, "overrun", A.p, host.data(), kOver, g_stream);
  INVALID(cuMemcpyHtoDAsync_v2_ptsz, "overrun", A.p, host.data(), kOver, nullptr);
  Download("cuMemcpyDtoH_v2", false, false, nullptr, [&](void* d, CUdeviceptr s, size_t n) {
    return CALL(cuMemcpyDtoH_v2, "valid", d, s, n);
  });
  Download("cuMemcpyDtoH_v2_ptds", false, true, nullptr, [&](void* d, CUdeviceptr s, size_t n) {
    return CALL(cuMemcpyDtoH_v2_ptds, "valid", d, s, n);
  });
  INVALID(cuMemcpyDtoH_v2, "overrun", host.data(), A.p, kOver);
  INVALID(cuMemcpyDtoH_v2_ptds, "overrun", host.data(), A.p, kOver);
  INVALID(cuMemcpyDtoH_v2, "null-dst", nullptr, A.p, 16);
  Download("cuMemcpyDtoHAsync_v2", true, false, g_stream, [&](void* d, CUdeviceptr s, size_t n) {
    return CALL(cuMemcpyDtoHAsync_v2, "valid", d, s, n, g_stream);
  });
  Download("cuMemcpyDtoHAsync_v2_ptsz", true, true, nullptr, [&](void* d, CUdeviceptr s, size_t n) {
    return CALL(cuMemcpyDtoHAsync_v2_ptsz, "valid", d, s, n, nullptr);
  });
  INVALID(cuMemcpyDtoHAsync_v2, "overrun", host.data(), A.p, kOver, g_stream);
  INVALID(cuMemcpyDtoHAsync_v2_ptsz, "overrun", host.data(), A.p, kOver, nullptr);
  DeviceCopy("cuMemcpyDtoD_v2", "DtoD", false, false, nullptr,
             [&](CUdeviceptr d, CUdeviceptr s, size_t n) {
               return CALL(cuMemcpyDtoD_v2, "valid", d, s, n);
             });
  DeviceCopy("cuMemcpyDtoD_v2_ptds", "DtoD", false, true, nullptr,
             [&](CUdeviceptr d, CUdeviceptr s, size_t n) {
               return CALL(cuMemcpyDtoD_v2_ptds, "valid", d, s, n);
             });
  INVALID(cuMemcpyDtoD_v2, "overrun", A.p, B.p, kOver);
  INVALID(cuMemcpyDtoD_v2_ptds, "overrun", A.p, B.p + 8, kGranule);
  // Within one buffer (swapped out): both sides are A.
  {
    const size_t src_off = 100, dst_off = kGranule / 2 + 4, n = 70000;
    Evict({&A});
    VALID(cuMemcpyDtoD_v2, "same-buffer", A.p + dst_off, A.p + src_off, n);
    Rec("memcpy", "cuMemcpyDtoD_v2")
        .S("kind", "DtoD")
        .U("bytes", n)
        .S("dst", Hex(A.p + dst_off))
        .S("src", Hex(A.p + src_off))
        .Bufs("reads", {A.p})
        .Bufs("writes", {A.p});
    std::memmove(A.model.data() + dst_off, A.model.data() + src_off, n);
    Verify(A, 0, kGranule);
  }
  DeviceCopy("cuMemcpyDtoDAsync_v2", "DtoD", true, false, g_stream,
             [&](CUdeviceptr d, CUdeviceptr s, size_t n) {
               return CALL(cuMemcpyDtoDAsync_v2, "valid", d, s, n, g_stream);
             });
  DeviceCopy("cuMemcpyDtoDAsync_v2_ptsz", "DtoD", true, true, nullptr,
             [&](CUdeviceptr d, CUdeviceptr s, size_t n) {
               return CALL(cuMemcpyDtoDAsync_v2_ptsz, "valid", d, s, n, nullptr);
             });
  INVALID(cuMemcpyDtoDAsync_v2, "overrun", A.p, B.p, kOver, g_stream);
  INVALID(cuMemcpyDtoDAsync_v2_ptsz, "overrun", A.p, B.p, kOver, nullptr);
}

// 2D and 3D copies: a 1000-byte-wide, 40-row (3D: 2 slices of 20) region of
// B, pitch 4096, to A at another offset and pitch 8192, both swapped out.
constexpr size_t kW = 1000, kH = 40, kSrcPitch = 4096, kDstPitch = 8192;
constexpr size_t kSrcX = 100, kSrcY = 3, kDstX = 50, kDstY = 7;

void Stage2D() {
  std::vector<uint8_t> data = Pattern(kGranule, g_fill++);
  VALID(cuMemcpyHtoD_v2, "stage2d", B.p, data.data(), kGranule);
  Rec("memcpy", "cuMemcpyHtoD_v2")
      .S("kind", "HtoD")
      .U("bytes", kGranule)
      .S("dst", Hex(B.p))
      .S("src", Hex(Ptr(data.data())))
      .Bufs("reads", {})
      .Bufs("writes", {B.p});
  B.model = data;
  Evict({&A, &B});
}
void Model2D() {
  for (size_t y = 0; y < kH; ++y) {
    std::memcpy(A.model.data() + (kDstY + y) * kDstPitch + kDstX,
                B.model.data() + (kSrcY + y) * kSrcPitch + kSrcX, kW);
  }
}
void Expect2D(const char* api, bool async, bool per_thread, CUstream s) {
  Rec("memcpy", api)
      .S("kind", "DtoD")
      .U("bytes", kW * kH)
      .S("dst", Hex(A.p + kDstY * kDstPitch + kDstX))
      .S("src", Hex(B.p + kSrcY * kSrcPitch + kSrcX))
      .Bufs("reads", {B.p})
      .Bufs("writes", {A.p})
      .S("stream", StreamName(s, per_thread))
      .B("async", async);
  if (async) SyncStream(s, per_thread);
  Model2D();
  Verify(A, kDstY * kDstPitch, kH * kDstPitch);
}

CUDA_MEMCPY2D Desc2D() {
  CUDA_MEMCPY2D p{};
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = B.p;
  p.srcXInBytes = kSrcX;
  p.srcY = kSrcY;
  p.srcPitch = kSrcPitch;
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = A.p;
  p.dstXInBytes = kDstX;
  p.dstY = kDstY;
  p.dstPitch = kDstPitch;
  p.WidthInBytes = kW;
  p.Height = kH;
  return p;
}
// The same rows as Desc2D in two slices of 20 rows, slices `height` (20)
// rows apart; the start rows are in the base addresses (a slice's rows must
// lie within its height).
CUDA_MEMCPY3D Desc3D() {
  CUDA_MEMCPY3D p{};
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = B.p + kSrcY * kSrcPitch;
  p.srcXInBytes = kSrcX;
  p.srcPitch = kSrcPitch;
  p.srcHeight = 20;
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = A.p + kDstY * kDstPitch;
  p.dstXInBytes = kDstX;
  p.dstPitch = kDstPitch;
  p.dstHeight = 20;
  p.WidthInBytes = kW;
  p.Height = 20;
  p.Depth = 2;
  return p;
}

void Copies2D3D() {
  CUDA_MEMCPY2D p = Desc2D();
  CUDA_MEMCPY2D wide = p;
  wide.WidthInBytes = kSrcPitch + 1;  // wider than the source pitch
  CUDA_MEMCPY2D past = p;
  past.Height = kGranule / kSrcPitch;  // from row 3: past the end of B
  struct {
    const char* api;
    bool async, per_thread;
  } forms[] = {
      {"cuMemcpy2D_v2", false, false},          {"cuMemcpy2D_v2_ptds", false, true},
      {"cuMemcpy2DUnaligned_v2", false, false}, {"cuMemcpy2DUnaligned_v2_ptds", false, true},
      {"cuMemcpy2DAsync_v2", true, false},      {"cuMemcpy2DAsync_v2_ptsz", true, true}};
  for (const auto& f : forms) {
    CUstream s = f.async && !f.per_thread ? g_stream : nullptr;
    auto call = [&](const CUDA_MEMCPY2D* d, const std::string& label) {
      std::string api = f.api;
      if (api == "cuMemcpy2D_v2") return CALL(cuMemcpy2D_v2, label, d);
      if (api == "cuMemcpy2D_v2_ptds") return CALL(cuMemcpy2D_v2_ptds, label, d);
      if (api == "cuMemcpy2DUnaligned_v2") return CALL(cuMemcpy2DUnaligned_v2, label, d);
      if (api == "cuMemcpy2DUnaligned_v2_ptds") return CALL(cuMemcpy2DUnaligned_v2_ptds, label, d);
      if (api == "cuMemcpy2DAsync_v2") return CALL(cuMemcpy2DAsync_v2, label, d, s);
      return CALL(cuMemcpy2DAsync_v2_ptsz, label, d, s);
    };
    Stage2D();
    ExpectOk(f.api, "valid", call(&p, "valid"));
    Expect2D(f.api, f.async, f.per_thread, s);
    ExpectRefused(f.api, "wide", call(&wide, "wide"));
    ExpectRefused(f.api, "overrun", call(&past, "overrun"));
    ExpectRefused(f.api, "null", call(nullptr, "null"));
  }

  // Host to device and device (as unified memory) to host, 2D.
  {
    std::vector<uint8_t> host = Pattern(kH * kSrcPitch, 91), back(kH * kSrcPitch, 0);
    CUDA_MEMCPY2D up = Desc2D();
    up.srcMemoryType = CU_MEMORYTYPE_HOST;
    up.srcHost = host.data();
    up.srcXInBytes = 0;
    up.srcY = 0;
    Evict({&A});
    VALID(cuMemcpy2D_v2, "host-to-device", &up);
    Rec("memcpy", "cuMemcpy2D_v2")
        .S("kind", "HtoD")
        .U("bytes", kW * kH)
        .S("dst", Hex(A.p + kDstY * kDstPitch + kDstX))
        .S("src", Hex(Ptr(host.data())))
        .Bufs("reads", {})
        .Bufs("writes", {A.p});
    for (size_t y = 0; y < kH; ++y) {
      std::memcpy(A.model.data() + (kDstY + y) * kDstPitch + kDstX, host.data() + y * kSrcPitch,
                  kW);
    }
    Verify(A, 0, kGranule);
    CUDA_MEMCPY2D down{};
    down.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
    down.srcDevice = A.p;
    down.srcY = kDstY;
    down.srcXInBytes = kDstX;
    down.srcPitch = kDstPitch;
    down.dstMemoryType = CU_MEMORYTYPE_HOST;
    down.dstHost = back.data();
    down.dstPitch = kSrcPitch;
    down.WidthInBytes = kW;
    down.Height = kH;
    Evict({&A});
    VALID(cuMemcpy2DAsync_v2_ptsz, "unified-to-host", &down, nullptr);
    Rec("memcpy", "cuMemcpy2DAsync_v2_ptsz")
        .S("kind", "UtoH")
        .U("bytes", kW * kH)
        .S("dst", Hex(Ptr(back.data())))
        .S("src", Hex(A.p + kDstY * kDstPitch + kDstX))
        .Bufs("reads", {A.p})
        .Bufs("writes", {})
        .S("stream", "per_thread")
        .B("async", true);
    SyncStream(nullptr, true);
    for (size_t y = 0; y < kH; ++y) {
      EXPECT_TRUE(std::memcmp(back.data() + y * kSrcPitch, host.data() + y * kSrcPitch, kW) == 0);
    }
  }

  CUDA_MEMCPY3D q = Desc3D();
  CUDA_MEMCPY3D q_past = q;  // B's addresses do not change
  q_past.Depth = kGranule / (20 * kSrcPitch) + 1;
  struct {
    const char* api;
    bool async, per_thread;
  } forms3[] = {{"cuMemcpy3D_v2", false, false},
                {"cuMemcpy3D_v2_ptds", false, true},
                {"cuMemcpy3DAsync_v2", true, false},
                {"cuMemcpy3DAsync_v2_ptsz", true, true}};
  for (const auto& f : forms3) {
    CUstream s = f.async && !f.per_thread ? g_stream : nullptr;
    auto call = [&](const CUDA_MEMCPY3D* d, const std::string& label) {
      std::string api = f.api;
      if (api == "cuMemcpy3D_v2") return CALL(cuMemcpy3D_v2, label, d);
      if (api == "cuMemcpy3D_v2_ptds") return CALL(cuMemcpy3D_v2_ptds, label, d);
      if (api == "cuMemcpy3DAsync_v2") return CALL(cuMemcpy3DAsync_v2, label, d, s);
      return CALL(cuMemcpy3DAsync_v2_ptsz, label, d, s);
    };
    Stage2D();
    q = Desc3D();
    ExpectOk(f.api, "valid", call(&q, "valid"));
    // Two slices of 20 rows, each `height` (20) rows apart: the same rows as
    // the 40-row 2D copy.
    Expect2D(f.api, f.async, f.per_thread, s);
    ExpectRefused(f.api, "overrun", call(&q_past, "overrun"));
    ExpectRefused(f.api, "null", call(nullptr, "null"));
  }

  // Entry points the fake does not implement: the hook answers
  // CUDA_ERROR_NOT_SUPPORTED, logs nothing and touches nothing. A real
  // driver has them: there the answers are only compared (the batch copy
  // really copies B's first 4 KiB to A, which the model follows).
  CUDA_MEMCPY3D_PEER peer{};
  ABSENT(cuMemcpy3DPeer, "absent", &peer);
  ABSENT(cuMemcpy3DPeer_ptds, "absent", &peer);
  ABSENT(cuMemcpy3DPeerAsync, "absent", &peer, g_stream);
  ABSENT(cuMemcpy3DPeerAsync_ptsz, "absent", &peer, nullptr);
  CUdeviceptr dsts[1] = {A.p}, srcs[1] = {B.p};
  size_t sizes[1] = {4096}, idx[1] = {0};
  CUmemcpyAttributes attr{};
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  auto batch_copied = [&](CUresult r, CUstream s, bool per_thread) {
    if (g_on_fake || r != CUDA_SUCCESS) return;
    CHECK(per_thread ? cuStreamSynchronize_ptsz(s) : cuStreamSynchronize(s));
    std::memcpy(A.model.data(), B.model.data(), sizes[0]);
  };
  batch_copied(
      ABSENT(cuMemcpyBatchAsync_v2, "absent", dsts, srcs, sizes, 1, &attr, idx, 1, g_stream),
      g_stream, false);
  batch_copied(
      ABSENT(cuMemcpyBatchAsync_v2_ptsz, "absent", dsts, srcs, sizes, 1, &attr, idx, 1, nullptr),
      nullptr, true);
  CUDA_MEMCPY3D_BATCH_OP op{};
  ABSENT(cuMemcpy3DBatchAsync_v2, "absent", 1, &op, 0, g_stream);
  ABSENT(cuMemcpy3DBatchAsync_v2_ptsz, "absent", 1, &op, 0, nullptr);
  ABSENT(cuMemcpyDtoA_v2, "absent", nullptr, 0, A.p, 16);
  ABSENT(cuMemcpyDtoA_v2_ptds, "absent", nullptr, 0, A.p, 16);
  ABSENT(cuMemcpyAtoD_v2, "absent", A.p, nullptr, 0, 16);
  ABSENT(cuMemcpyAtoD_v2_ptds, "absent", A.p, nullptr, 0, 16);
}

// --- Memsets --------------------------------------------------------------------
template <typename T>
void ModelSet(Buf& b, size_t off, size_t pitch, T v, size_t w, size_t h) {
  for (size_t y = 0; y < h; ++y) {
    for (size_t x = 0; x < w; ++x)
      std::memcpy(b.model.data() + off + y * pitch + x * sizeof(T), &v, sizeof(T));
  }
}

// A 1D memset of n elements of T at A + off, and one past the end.
template <typename T, typename Call>
void Memset1D(const char* api, bool async, bool per_thread, T v, Call&& call) {
  CUstream s = async && !per_thread ? g_stream : nullptr;
  const size_t off = 4096 * 3, n = 50000;
  Evict({&A});
  ExpectOk(api, "valid", call(A.p + off, v, n, s, "valid"));
  Rec("memset", api)
      .U("bytes", n * sizeof(T))
      .S("dst", Hex(A.p + off))
      .Bufs("writes", {A.p})
      .S("stream", StreamName(s, per_thread))
      .B("async", async);
  if (async) SyncStream(s, per_thread);
  ModelSet<T>(A, off, 0, v, n, 1);
  Verify(A, off, n * sizeof(T));
  ExpectRefused(api, "overrun", call(A.p + sizeof(T), v, kGranule / sizeof(T), s, "overrun"));
}

// A 2D memset of w x h elements, pitch 4096, and one too wide for its pitch.
template <typename T, typename Call>
void Memset2D(const char* api, bool async, bool per_thread, T v, Call&& call) {
  CUstream s = async && !per_thread ? g_stream : nullptr;
  const size_t off = 8192, pitch = 4096, w = 300, h = 30;
  Evict({&A});
  ExpectOk(api, "valid", call(A.p + off, pitch, v, w, h, s, "valid"));
  Rec("memset", api)
      .U("bytes", w * h * sizeof(T))
      .S("dst", Hex(A.p + off))
      .Bufs("writes", {A.p})
      .S("stream", StreamName(s, per_thread))
      .B("async", async);
  if (async) SyncStream(s, per_thread);
  ModelSet<T>(A, off, pitch, v, w, h);
  Verify(A, off, h * pitch);
  ExpectRefused(api, "wide", call(A.p + off, pitch, v, pitch / sizeof(T) + 1, 2, s, "wide"));
  ExpectRefused(api, "overrun", call(A.p + off, pitch, v, w, kGranule / pitch, s, "overrun"));
}

void Memsets() {
#define M1(sym, T, async, pt, v)                                                               \
  Memset1D<T>(#sym, async, pt, v, [&](CUdeviceptr d, T x, size_t n, CUstream, const char* l) { \
    return CALL(sym, l, d, x, n);                                                              \
  })
#define M1A(sym, T, async, pt, v)                                                                \
  Memset1D<T>(#sym, async, pt, v, [&](CUdeviceptr d, T x, size_t n, CUstream s, const char* l) { \
    return CALL(sym, l, d, x, n, s);                                                             \
  })
#define M2(sym, T, async, pt, v)                                                               \
  Memset2D<T>(#sym, async, pt, v,                                                              \
              [&](CUdeviceptr d, size_t p, T x, size_t w, size_t h, CUstream, const char* l) { \
                return CALL(sym, l, d, p, x, w, h);                                            \
              })
#define M2A(sym, T, async, pt, v)                                                                \
  Memset2D<T>(#sym, async, pt, v,                                                                \
              [&](CUdeviceptr d, size_t p, T x, size_t w, size_t h, CUstream s, const char* l) { \
                return CALL(sym, l, d, p, x, w, h, s);                                           \
              })
  M1(cuMemsetD8_v2, uint8_t, false, false, 0x5a);
  M1(cuMemsetD8_v2_ptds, uint8_t, false, true, 0x5b);
  M1(cuMemsetD16_v2, uint16_t, false, false, 0x1234);
  M1(cuMemsetD16_v2_ptds, uint16_t, false, true, 0x1235);
  M1(cuMemsetD32_v2, uint32_t, false, false, 0xdeadbeefu);
  M1(cuMemsetD32_v2_ptds, uint32_t, false, true, 0xdeadbef0u);
  M1A(cuMemsetD8Async, uint8_t, true, false, 0x6a);
  M1A(cuMemsetD8Async_ptsz, uint8_t, true, true, 0x6b);
  M1A(cuMemsetD16Async, uint16_t, true, false, 0x4321);
  M1A(cuMemsetD16Async_ptsz, uint16_t, true, true, 0x4322);
  M1A(cuMemsetD32Async, uint32_t, true, false, 0xcafef00du);
  M1A(cuMemsetD32Async_ptsz, uint32_t, true, true, 0xcafef00eu);
  M2(cuMemsetD2D8_v2, uint8_t, false, false, 0x7a);
  M2(cuMemsetD2D8_v2_ptds, uint8_t, false, true, 0x7b);
  M2(cuMemsetD2D16_v2, uint16_t, false, false, 0x2468);
  M2(cuMemsetD2D16_v2_ptds, uint16_t, false, true, 0x2469);
  M2(cuMemsetD2D32_v2, uint32_t, false, false, 0x01020304u);
  M2(cuMemsetD2D32_v2_ptds, uint32_t, false, true, 0x01020305u);
  M2A(cuMemsetD2D8Async, uint8_t, true, false, 0x8a);
  M2A(cuMemsetD2D8Async_ptsz, uint8_t, true, true, 0x8b);
  M2A(cuMemsetD2D16Async, uint16_t, true, false, 0x1357);
  M2A(cuMemsetD2D16Async_ptsz, uint16_t, true, true, 0x1358);
  M2A(cuMemsetD2D32Async, uint32_t, true, false, 0x0a0b0c0du);
  M2A(cuMemsetD2D32Async_ptsz, uint32_t, true, true, 0x0a0b0c0eu);
#undef M1
#undef M1A
#undef M2
#undef M2A
  // A misaligned 16/32-bit memset is refused by the driver.
  INVALID(cuMemsetD16_v2, "misaligned", A.p + 1, 1, 16);
  INVALID(cuMemsetD32Async, "misaligned", A.p + 2, 1, 16, g_stream);
}

// --- Launches -------------------------------------------------------------------
// testk::axpy(float a, const float* x, float* y, int n): y += a * x over the
// first kN floats; x in B, y in A, both swapped out first.
constexpr int kN = 4096;
CUfunction g_axpy = nullptr;
const char kAxpy[] = "_ZN5testk4axpyEfPKfPfi";

void ModelAxpy(float a) {
  for (int i = 0; i < kN; ++i) {
    float x, y;
    std::memcpy(&x, B.model.data() + 4 * i, 4);
    std::memcpy(&y, A.model.data() + 4 * i, 4);
    y += a * x;
    std::memcpy(A.model.data() + 4 * i, &y, 4);
  }
}

template <typename Call>
void LaunchCase(const char* api, bool per_thread, Call&& call) {
  CUstream s = per_thread ? nullptr : g_stream;
  // Small integers, so that the sums are exact.
  for (int i = 0; i < kN; ++i) {
    float x = static_cast<float>(i % 17), y = static_cast<float>(i % 5);
    std::memcpy(B.model.data() + 4 * i, &x, 4);
    std::memcpy(A.model.data() + 4 * i, &y, 4);
  }
  VALID(cuMemcpyHtoD_v2, std::string("stage/") + api, B.p, B.model.data(), 4 * kN);
  Rec("memcpy", "cuMemcpyHtoD_v2")
      .S("kind", "HtoD")
      .U("bytes", 4 * kN)
      .S("dst", Hex(B.p))
      .S("src", Hex(Ptr(B.model.data())))
      .Bufs("reads", {})
      .Bufs("writes", {B.p});
  VALID(cuMemcpyHtoD_v2, std::string("stage/") + api, A.p, A.model.data(), 4 * kN);
  Rec("memcpy", "cuMemcpyHtoD_v2")
      .S("kind", "HtoD")
      .U("bytes", 4 * kN)
      .S("dst", Hex(A.p))
      .S("src", Hex(Ptr(A.model.data())))
      .Bufs("reads", {})
      .Bufs("writes", {A.p});
  Evict({&A, &B});
  float a = 2.0f;
  int n = kN;
  CUdeviceptr x = B.p, y = A.p;
  void* params[] = {&a, &x, &y, &n};
  if (call(s, params) != CUDA_SUCCESS) return;
  Rec("launch", api)
      .S("kernel", kAxpy)
      .S("stream", StreamName(s, per_thread))
      .Raw("grid", "[4,1,1]")
      .Raw("block", "[32,1,1]")
      .Bufs("reads", {A.p, B.p})
      .Bufs("writes", {A.p})
      .B("inferred", true);
  SyncStream(s, per_thread);
  ModelAxpy(a);
  Verify(A, 0, 4 * kN);
}

void Launches(const char* kernels) {
  CUmodule module;
  CHECK(cuModuleLoad(&module, kernels));
  CHECK(cuModuleGetFunction(&g_axpy, module, kAxpy));
  auto kernel = [&](const char* api, auto&& fn) {
    LaunchCase(api, std::strstr(api, "_ptsz") != nullptr, fn);
  };
  kernel("cuLaunchKernel", [&](CUstream s, void** p) {
    return CALL(cuLaunchKernel, "valid", g_axpy, 4, 1, 1, 32, 1, 1, 0, s, p, nullptr);
  });
  kernel("cuLaunchKernel_ptsz", [&](CUstream s, void** p) {
    return CALL(cuLaunchKernel_ptsz, "valid", g_axpy, 4, 1, 1, 32, 1, 1, 0, s, p, nullptr);
  });
  auto ex = [&](const char* api, CUstream s, void** p) {
    CUlaunchConfig c{};
    c.gridDimX = 4;
    c.gridDimY = c.gridDimZ = 1;
    c.blockDimX = 32;
    c.blockDimY = c.blockDimZ = 1;
    c.hStream = s;
    return std::strstr(api, "_ptsz") ? CALL(cuLaunchKernelEx_ptsz, "valid", &c, g_axpy, p, nullptr)
                                     : CALL(cuLaunchKernelEx, "valid", &c, g_axpy, p, nullptr);
  };
  kernel("cuLaunchKernelEx", [&](CUstream s, void** p) { return ex("cuLaunchKernelEx", s, p); });
  kernel("cuLaunchKernelEx_ptsz",
         [&](CUstream s, void** p) { return ex("cuLaunchKernelEx_ptsz", s, p); });
  kernel("cuLaunchCooperativeKernel", [&](CUstream s, void** p) {
    return CALL(cuLaunchCooperativeKernel, "valid", g_axpy, 4, 1, 1, 32, 1, 1, 0, s, p);
  });
  kernel("cuLaunchCooperativeKernel_ptsz", [&](CUstream s, void** p) {
    return CALL(cuLaunchCooperativeKernel_ptsz, "valid", g_axpy, 4, 1, 1, 32, 1, 1, 0, s, p);
  });

  // The packed `extra` form: (float, pad, ptr, ptr, int) as laid out. Its
  // size is the parameters' exactly, 28 bytes: the struct's 32 (with tail
  // padding) is refused by the driver (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
  // from driver 580 on an H200), below.
  struct Packed {
    float a;
    CUdeviceptr x, y;
    int n;
  };
  kernel("cuLaunchKernel", [&](CUstream s, void** p) {
    Packed packed{*static_cast<float*>(p[0]), *static_cast<CUdeviceptr*>(p[1]),
                  *static_cast<CUdeviceptr*>(p[2]), *static_cast<int*>(p[3])};
    size_t size = offsetof(Packed, n) + sizeof(int);
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    return CALL(cuLaunchKernel, "extra-exact", g_axpy, 4, 1, 1, 32, 1, 1, 0, s, nullptr, extra);
  });

  float a = 1.0f;
  int n = kN;
  CUdeviceptr x = B.p, y = A.p;
  void* params[] = {&a, &x, &y, &n};
  {
    Packed padded{a, x, y, n};
    size_t size = sizeof padded;
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &padded, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    INVALID(cuLaunchKernel, "extra", g_axpy, 4, 1, 1, 32, 1, 1, 0, g_stream, nullptr, extra);
  }
  // Neither parameters nor `extra`: the driver's error; stensor must not
  // read them. An `extra` holding only its end is no `extra`: with
  // parameters the kernel runs (driver 580 on an H200), alone it is none.
  INVALID(cuLaunchKernel, "no-params", g_axpy, 1, 1, 1, 1, 1, 1, 0, g_stream, nullptr, nullptr);
  void* extra_end[] = {CU_LAUNCH_PARAM_END};
  VALID(cuLaunchKernel_ptsz, "both", g_axpy, 1, 1, 1, 1, 1, 1, 0, nullptr, params, extra_end);
  Rec("launch", "cuLaunchKernel_ptsz")
      .S("kernel", kAxpy)
      .S("stream", "per_thread")
      .Raw("grid", "[1,1,1]")
      .Raw("block", "[1,1,1]")
      .Bufs("reads", {A.p, B.p})
      .Bufs("writes", {A.p})
      .B("inferred", true);
  SyncStream(nullptr, true);
  ModelAxpy(a);
  Verify(A, 0, 4 * kN);
  INVALID(cuLaunchKernel, "extra-empty", g_axpy, 1, 1, 1, 1, 1, 1, 0, g_stream, nullptr, extra_end);
  INVALID(cuLaunchCooperativeKernel, "no-params", g_axpy, 1, 1, 1, 1, 1, 1, 0, g_stream, nullptr);
  INVALID(cuLaunchKernel, "null-function", nullptr, 1, 1, 1, 1, 1, 1, 0, g_stream, params, nullptr);
  INVALID(cuLaunchKernel_ptsz, "zero-grid", g_axpy, 0, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr);
  INVALID(cuLaunchKernelEx, "null-config", nullptr, g_axpy, params, nullptr);
  INVALID(cuLaunchKernelEx_ptsz, "null-config", nullptr, g_axpy, params, nullptr);
  INVALID(cuLaunchCooperativeKernel, "null-function", nullptr, 1, 1, 1, 1, 1, 1, 0, g_stream,
          params);
  INVALID(cuLaunchCooperativeKernel_ptsz, "zero-block", g_axpy, 1, 1, 1, 0, 1, 1, 0, nullptr,
          params);
  INVALID(cuGraphLaunch, "null-exec", nullptr, g_stream);
  INVALID(cuGraphLaunch_ptsz, "null-exec", nullptr, nullptr);

  // Graphs and capture: what the driver refuses (a graph of the program's
  // own is tested by tests/graph_test); one capture begun and ended.
  INVALID(cuGraphInstantiate, "null", nullptr, nullptr, nullptr, nullptr, 0);
  INVALID(cuGraphInstantiate_v2, "null", nullptr, nullptr, nullptr, nullptr, 0);
  INVALID(cuGraphInstantiateWithFlags, "null", nullptr, nullptr, 0);
  INVALID(cuGraphInstantiateWithParams, "null", nullptr, nullptr, nullptr);
  INVALID(cuGraphInstantiateWithParams_ptsz, "null", nullptr, nullptr, nullptr);
  INVALID(cuGraphExecDestroy, "null", nullptr);
  INVALID(cuGraphExecChildGraphNodeSetParams, "null", nullptr, nullptr, nullptr);
  INVALID(cuGraphExecKernelNodeSetParams, "null", nullptr, nullptr, nullptr);
  INVALID(cuGraphExecKernelNodeSetParams_v2, "null", nullptr, nullptr, nullptr);
  INVALID(cuGraphExecMemcpyNodeSetParams, "null", nullptr, nullptr, nullptr, nullptr);
  INVALID(cuGraphExecMemsetNodeSetParams, "null", nullptr, nullptr, nullptr, nullptr);
  INVALID(cuGraphExecNodeSetParams, "null", nullptr, nullptr, nullptr);
  INVALID(cuGraphExecUpdate, "null", nullptr, nullptr, nullptr, nullptr);
  INVALID(cuGraphExecUpdate_v2, "null", nullptr, nullptr, nullptr);
  INVALID(cuStreamBeginCapture, "legacy", nullptr);
  INVALID(cuStreamBeginCapture_v2, "legacy", nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL);
  INVALID(cuStreamBeginCapture_v2_ptsz, "bad-mode", g_stream, static_cast<CUstreamCaptureMode>(99));
  INVALID(cuStreamBeginCaptureToGraph, "null-graph", g_stream, nullptr, nullptr, nullptr, 0,
          CU_STREAM_CAPTURE_MODE_GLOBAL);
  INVALID(cuStreamBeginCaptureToGraph_ptsz, "null-graph", g_stream, nullptr, nullptr, nullptr, 0,
          CU_STREAM_CAPTURE_MODE_GLOBAL);
  CUgraph captured = nullptr;
  INVALID(cuStreamEndCapture, "not-capturing", g_stream, &captured);
  VALID(cuStreamBeginCapture_ptsz, "valid", g_stream);
  VALID(cuStreamEndCapture_ptsz, "valid", g_stream, &captured);

  // Module lifetime: a second instance of the module, unloaded; then a
  // handle already unloaded.
  CUmodule second;
  CHECK(cuModuleLoad(&second, kernels));
  VALID(cuModuleUnload, "valid", second);
  INVALID(cuModuleUnload, "unloaded", second);
  ABSENT(cuLibraryUnload, "absent", nullptr);
  VALID(cuModuleUnload, "first", module);
}

// --- Synchronisation ------------------------------------------------------------
int g_host_functions_ran = 0;
void CUDA_CB CountHostFunction(void*) { ++g_host_functions_ran; }
void CUDA_CB CountCallback(CUstream, CUresult, void*) { ++g_host_functions_ran; }

void Syncs() {
  CUevent e;
  CHECK(cuEventCreate(&e, 0));
  VALID(cuCtxSynchronize, "valid");
  Rec("sync", "cuCtxSynchronize");
  VALID(cuCtxSynchronize_v2, "valid", g_ctx);
  Rec("sync", "cuCtxSynchronize_v2");
  VALID(cuStreamSynchronize, "valid", g_stream);
  Rec("sync", "cuStreamSynchronize").S("stream", StreamName(g_stream, false));
  VALID(cuStreamSynchronize_ptsz, "valid", nullptr);
  Rec("sync", "cuStreamSynchronize_ptsz").S("stream", "per_thread");
  VALID(cuEventRecord, "valid", e, g_stream);
  Rec("sync", "cuEventRecord").S("stream", StreamName(g_stream, false));
  VALID(cuEventRecord_ptsz, "valid", e, nullptr);
  Rec("sync", "cuEventRecord_ptsz").S("stream", "per_thread");
  VALID(cuEventRecordWithFlags, "valid", e, g_stream, CU_EVENT_RECORD_DEFAULT);
  Rec("sync", "cuEventRecordWithFlags").S("stream", StreamName(g_stream, false));
  VALID(cuEventRecordWithFlags_ptsz, "valid", e, nullptr, CU_EVENT_RECORD_DEFAULT);
  Rec("sync", "cuEventRecordWithFlags_ptsz").S("stream", "per_thread");
  VALID(cuStreamWaitEvent, "valid", g_stream, e, 0);
  Rec("sync", "cuStreamWaitEvent").S("stream", StreamName(g_stream, false));
  VALID(cuStreamWaitEvent_ptsz, "valid", nullptr, e, 0);
  Rec("sync", "cuStreamWaitEvent_ptsz").S("stream", "per_thread");
  VALID(cuEventSynchronize, "valid", e);
  Rec("sync", "cuEventSynchronize");

  INVALID(cuEventSynchronize, "null", nullptr);
  INVALID(cuEventRecord, "null", nullptr, g_stream);
  INVALID(cuEventRecord_ptsz, "null", nullptr, nullptr);
  INVALID(cuEventRecordWithFlags, "flags", e, g_stream, 0x80);
  INVALID(cuEventRecordWithFlags_ptsz, "null", nullptr, nullptr, 0);
  INVALID(cuStreamWaitEvent, "null", g_stream, nullptr, 0);
  INVALID(cuStreamWaitEvent_ptsz, "flags", nullptr, e, 0x80);
  CHECK(cuEventDestroy_v2(e));

  // Host functions: passed through (no record), run in stream order.
  g_host_functions_ran = 0;
  VALID(cuLaunchHostFunc, "valid", g_stream, CountHostFunction, nullptr);
  VALID(cuLaunchHostFunc_ptsz, "valid", nullptr, CountHostFunction, nullptr);
  VALID(cuStreamAddCallback, "valid", g_stream, CountCallback, nullptr, 0);
  VALID(cuStreamAddCallback_ptsz, "valid", nullptr, CountCallback, nullptr, 0);
  INVALID(cuLaunchHostFunc, "null", g_stream, nullptr, nullptr);
  INVALID(cuStreamAddCallback_ptsz, "flags", nullptr, CountCallback, nullptr, 1);
  CHECK(cuStreamSynchronize(g_stream));
  Rec("sync", "cuStreamSynchronize").S("stream", StreamName(g_stream, false));
  CHECK(cuStreamSynchronize_ptsz(nullptr));
  Rec("sync", "cuStreamSynchronize_ptsz").S("stream", "per_thread");
  if (g_host_functions_ran != 4) {
    std::fprintf(stderr, "host functions: %d ran, want 4\n", g_host_functions_ran);
    std::exit(1);
  }
}

// --- Contexts that end -------------------------------------------------------------
// Last: the reset ends the primary context everything before ran in.
void Contexts() {
  CUdevice dev;
  CHECK(cuCtxGetDevice(&dev));
  CUcontext created;
  CHECK(cuCtxCreate_v2(&created, 0, dev));
  VALID(cuCtxDestroy_v2, "valid", created);
  INVALID(cuCtxDestroy_v2, "destroyed", created);
  CUcontext primary;
  CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
  VALID(cuDevicePrimaryCtxRelease_v2, "valid", dev);  // a reference is left
  INVALID(cuDevicePrimaryCtxRelease_v2, "device", 99);
  INVALID(cuDevicePrimaryCtxReset_v2, "device", 99);
  VALID(cuDevicePrimaryCtxReset_v2, "valid", dev);
}

// --- Allocation, reporting, host memory, VMM --------------------------------------
void Allocations() {
  // cuMemAlloc: a swappable buffer (2 MiB) and a small one (the driver's).
  for (size_t bytes : {kGranule, size_t{4096}}) {
    CUdeviceptr p = 0;
    const std::string label = "valid" + std::to_string(bytes);
    VALID(cuMemAlloc_v2, label, &p, bytes);
    Rec("alloc", "cuMemAlloc_v2").S("addr", Hex(p)).U("bytes", bytes).S("kind", "device");
    std::vector<uint8_t> data = Pattern(bytes, 9), got(bytes);
    VALID(cuMemcpyHtoD_v2, "alloc" + label, p, data.data(), bytes);
    Rec("memcpy", "cuMemcpyHtoD_v2")
        .S("kind", "HtoD")
        .U("bytes", bytes)
        .S("dst", Hex(p))
        .Bufs("writes", {p});
    VALID(cuMemcpyDtoH_v2, "alloc" + label, got.data(), p, bytes);
    Rec("memcpy", "cuMemcpyDtoH_v2")
        .S("kind", "DtoH")
        .U("bytes", bytes)
        .S("src", Hex(p))
        .Bufs("reads", {p});
    EXPECT_TRUE(got == data);
    VALID(cuMemFree_v2, label, p);
    Rec("free", "cuMemFree_v2").S("addr", Hex(p)).U("bytes", bytes);
    INVALID(cuMemFree_v2, "twice" + label, p);
  }
  CUdeviceptr p = 0;
  INVALID(cuMemAlloc_v2, "null", nullptr, 4096);
  INVALID(cuMemAlloc_v2, "zero", &p, 0);
  INVALID(cuMemFree_v2, "host", Ptr(&p));

  size_t pitch = 0;
  VALID(cuMemAllocPitch_v2, "valid", &p, &pitch, 1000, 10, 4);
  Val("cuMemAllocPitch_v2/pitch", std::to_string(pitch));
  Rec("alloc", "cuMemAllocPitch_v2").S("addr", Hex(p)).U("bytes", pitch * 10).S("kind", "device");
  VALID(cuMemFree_v2, "pitched", p);
  Rec("free", "cuMemFree_v2").S("addr", Hex(p)).U("bytes", pitch * 10);
  INVALID(cuMemAllocPitch_v2, "element", &p, &pitch, 1000, 10, 3);
  INVALID(cuMemAllocPitch_v2, "null", nullptr, &pitch, 1000, 10, 4);

  // Stream-ordered memory.
  for (bool pt : {false, true}) {
    CUstream s = pt ? nullptr : g_stream;
    CUdeviceptr q = 0;
    if (pt) {
      VALID(cuMemAllocAsync_ptsz, "valid", &q, 65536, s);
    } else {
      VALID(cuMemAllocAsync, "valid", &q, 65536, s);
    }
    Rec("alloc", pt ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync")
        .S("addr", Hex(q))
        .U("bytes", 65536)
        .S("kind", "stream_ordered");
    if (pt) {
      VALID(cuMemFreeAsync_ptsz, "valid", q, s);
    } else {
      VALID(cuMemFreeAsync, "valid", q, s);
    }
    Rec("free", pt ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync").S("addr", Hex(q)).U("bytes", 65536);
    SyncStream(s, pt);
  }
  // cuMemFreeAsync of cuMemAlloc memory (under a cap: stensor's), in stream
  // order after work that uses it.
  for (bool pt : {false, true}) {
    CUstream s = pt ? nullptr : g_stream;
    CUdeviceptr q = 0;
    VALID(cuMemAlloc_v2, "for-free-async", &q, kGranule);
    Rec("alloc", "cuMemAlloc_v2").S("addr", Hex(q)).U("bytes", kGranule).S("kind", "device");
    if (pt) {
      VALID(cuMemsetD8Async_ptsz, "before-free", q, 3, kGranule, s);
      VALID(cuMemFreeAsync_ptsz, "device-memory", q, s);
    } else {
      VALID(cuMemsetD8Async, "before-free", q, 3, kGranule, s);
      VALID(cuMemFreeAsync, "device-memory", q, s);
    }
    Rec("memset", pt ? "cuMemsetD8Async_ptsz" : "cuMemsetD8Async")
        .U("bytes", kGranule)
        .Bufs("writes", {q})
        .S("stream", StreamName(s, pt))
        .B("async", true);
    Rec("free", pt ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync")
        .S("addr", Hex(q))
        .U("bytes", kGranule);
    SyncStream(s, pt);
  }
  INVALID(cuMemAllocAsync, "null", nullptr, 65536, g_stream);
  // No bytes: CUDA_SUCCESS from driver 580 on an H200; which pointer it
  // gives is printed (the fake gives null).
  p = 1;
  VALID(cuMemAllocAsync_ptsz, "zero", &p, 0, nullptr);
  Val("cuMemAllocAsync_ptsz/zero", p == 0 ? "null" : "non-null");
  INVALID(cuMemFreeAsync, "host", Ptr(&p), g_stream);
  INVALID(cuMemFreeAsync_ptsz, "host", Ptr(&p), nullptr);
  // Pools: an explicit allocation from the default pool (the driver's,
  // counted under a cap), the pool's attributes and trim (under a cap they
  // include stensor's share: core/swap/stream_ordered.h).
  CUmemoryPool pool = nullptr;
  auto default_pool = reinterpret_cast<decltype(&::cuDeviceGetDefaultMemPool)>(
      dlsym(g_fake, "cuDeviceGetDefaultMemPool"));
  if (default_pool == nullptr || default_pool(&pool, 0) != CUDA_SUCCESS) ++failures;
  for (bool pt : {false, true}) {
    CUstream s = pt ? nullptr : g_stream;
    CUdeviceptr q = 0;
    if (pt) {
      VALID(cuMemAllocFromPoolAsync_ptsz, "default", &q, 65536, pool, s);
    } else {
      VALID(cuMemAllocFromPoolAsync, "default", &q, 65536, pool, s);
    }
    Rec("alloc", pt ? "cuMemAllocFromPoolAsync_ptsz" : "cuMemAllocFromPoolAsync")
        .S("addr", Hex(q))
        .U("bytes", 65536)
        .S("kind", "stream_ordered");
    if (pt) {
      VALID(cuMemFreeAsync_ptsz, "from-pool", q, s);
    } else {
      VALID(cuMemFreeAsync, "from-pool", q, s);
    }
    Rec("free", pt ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync").S("addr", Hex(q)).U("bytes", 65536);
    SyncStream(s, pt);
  }
  INVALID(cuMemAllocFromPoolAsync, "null-pool", &p, 65536, nullptr, g_stream);
  INVALID(cuMemAllocFromPoolAsync_ptsz, "null-pool", &p, 65536, nullptr, nullptr);
  cuuint64_t pool_value = 0, zero = 0, one = 1;
  VALID(cuMemPoolGetAttribute, "used", pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &pool_value);
  VALID(cuMemPoolGetAttribute, "reserved-high", pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        &pool_value);
  INVALID(cuMemPoolGetAttribute, "null-pool", nullptr, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
          &pool_value);
  INVALID(cuMemPoolGetAttribute, "attribute", pool, static_cast<CUmemPool_attribute>(99),
          &pool_value);
  VALID(cuMemPoolSetAttribute, "reset-high", pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero);
  INVALID(cuMemPoolSetAttribute, "nonzero-high", pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &one);
  INVALID(cuMemPoolSetAttribute, "current", pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero);
  VALID(cuMemPoolTrimTo, "all", pool, 0);
  INVALID(cuMemPoolTrimTo, "null-pool", nullptr, 0);

  // What the device reports: the cap under one, else the driver's numbers.
  const char* cap_text = std::getenv("STENSOR_MEMORY_LIMIT");
  const size_t cap = cap_text ? std::strtoull(cap_text, nullptr, 10) : 0;
  size_t free_bytes = 0, total = 0;
  VALID(cuMemGetInfo_v2, "valid", &free_bytes, &total);
  if (kCapped) {
    EXPECT_TRUE(total == cap && free_bytes <= cap);
  } else {
    Val("cuMemGetInfo_v2/total", std::to_string(total));
  }
  // A null output is left out (driver 580 on an H200).
  VALID(cuMemGetInfo_v2, "null", nullptr, &total);
  VALID(cuDeviceTotalMem_v2, "valid", &total, 0);
  if (kCapped) {
    EXPECT_TRUE(total == cap);
  } else {
    Val("cuDeviceTotalMem_v2/total", std::to_string(total));
  }
  INVALID(cuDeviceTotalMem_v2, "device", &total, 99);
  INVALID(cuDeviceTotalMem_v2, "null", nullptr, 0);

  // Page-locked host memory.
  void* h = nullptr;
  VALID(cuMemAllocHost_v2, "valid", &h, 8192);
  Rec("host_alloc", "cuMemAllocHost_v2").S("addr", Hex(Ptr(h))).U("bytes", 8192);
  std::memset(h, 0x42, 8192);
  VALID(cuMemFreeHost, "valid", h);
  Rec("host_free", "cuMemFreeHost").S("addr", Hex(Ptr(h))).U("bytes", 8192);
  VALID(cuMemHostAlloc, "valid", &h, 12288, CU_MEMHOSTALLOC_PORTABLE);
  Rec("host_alloc", "cuMemHostAlloc").S("addr", Hex(Ptr(h))).U("bytes", 12288);
  std::memset(h, 0x43, 12288);
  VALID(cuMemFreeHost, "valid2", h);
  Rec("host_free", "cuMemFreeHost").S("addr", Hex(Ptr(h))).U("bytes", 12288);
  INVALID(cuMemAllocHost_v2, "null", nullptr, 8192);
  INVALID(cuMemHostAlloc, "flags", &h, 4096, 0x80);
  std::vector<uint8_t> pageable(4096);
  INVALID(cuMemFreeHost, "pageable", pageable.data());
  // Registered memory: passed through (no record).
  VALID(cuMemHostRegister_v2, "valid", pageable.data(), pageable.size(), 0);
  INVALID(cuMemHostRegister_v2, "again", pageable.data(), pageable.size(), 0);
  VALID(cuMemHostUnregister, "valid", pageable.data());
  INVALID(cuMemHostUnregister, "again", pageable.data());
  INVALID(cuMemHostRegister_v2, "null", nullptr, 4096, 0);
}

void Vmm() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0, bad = 0;
  VALID(cuMemCreate, "valid", &h, kGranule, &prop, 0);
  INVALID(cuMemCreate, "size", &bad, 1000, &prop, 0);
  INVALID(cuMemCreate, "null-prop", &bad, kGranule, nullptr, 0);
  CUdeviceptr va = 0;
  CHECK(cuMemAddressReserve(&va, kGranule, 0, 0, 0));
  VALID(cuMemMap, "valid", va, kGranule, 0, h, 0);
  Rec("alloc", "cuMemMap").S("addr", Hex(va)).U("bytes", kGranule).S("kind", "app_vmm");
  INVALID(cuMemMap, "mapped", va, kGranule, 0, h, 0);
  INVALID(cuMemMap, "size", va + 4096, 4096, 0, h, 0);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK(cuMemSetAccess(va, kGranule, &access, 1));
  std::vector<uint8_t> data = Pattern(kGranule, 77), got(kGranule);
  VALID(cuMemcpyHtoD_v2, "vmm", va, data.data(), kGranule);
  Rec("memcpy", "cuMemcpyHtoD_v2")
      .S("kind", "HtoD")
      .U("bytes", kGranule)
      .S("dst", Hex(va))
      .Bufs("writes", {va});
  VALID(cuMemcpyDtoH_v2, "vmm", got.data(), va, kGranule);
  Rec("memcpy", "cuMemcpyDtoH_v2")
      .S("kind", "DtoH")
      .U("bytes", kGranule)
      .S("src", Hex(va))
      .Bufs("reads", {va});
  EXPECT_TRUE(got == data);

  CUmemGenericAllocationHandle retained = 0;
  VALID(cuMemRetainAllocationHandle, "vmm", &retained, reinterpret_cast<void*>(va));
  EXPECT_TRUE(retained == h);
  INVALID(cuMemRetainAllocationHandle, "null", nullptr, reinterpret_cast<void*>(va));
  INVALID(cuMemRetainAllocationHandle, "unmapped", &bad, &retained);
  int fd = -1;
  VALID(cuMemExportToShareableHandle, "valid", &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  EXPECT_TRUE(fd >= 0);
  INVALID(cuMemExportToShareableHandle, "type", &fd, h, CU_MEM_HANDLE_TYPE_WIN32, 0);
  // A handle that is none crashes the real driver (seen on an H200: driver
  // 580 reads through it); the fake refuses it. Asked of the fake only.
  if (g_on_fake) {
    INVALID(cuMemExportToShareableHandle, "handle", &fd, h + 12345,
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  }

  VALID(cuMemUnmap, "valid", va, kGranule);
  Rec("free", "cuMemUnmap").S("addr", Hex(va)).U("bytes", kGranule);
  // Nothing mapped in a range of a reservation: nothing to do, CUDA_SUCCESS
  // (driver 580 on an H200), even for a size below the granularity.
  VALID(cuMemUnmap, "unmapped-size", va, 4096);
  VALID(cuMemRelease, "retained", retained);
  VALID(cuMemRelease, "valid", h);
  INVALID(cuMemRelease, "released", h);
  CHECK(cuMemAddressFree(va, kGranule));
}

// Exact sizes on a swapped-out buffer: the allocation as asked for.
void Attributes() {
  Evict({&A});
  CUdeviceptr base = 0;
  size_t size = 0;
  VALID(cuMemGetAddressRange_v2, "valid", &base, &size, A.p + 1000);
  EXPECT_TRUE(base == A.p && size == kGranule);
  VALID(cuMemGetAddressRange_v2, "size-only", nullptr, &size, A.p + 1);
  Val("cuMemGetAddressRange_v2/size", std::to_string(size));
  INVALID(cuMemGetAddressRange_v2, "unknown", &base, &size, 0x1000);

  unsigned type = 0;
  VALID(cuPointerGetAttribute, "type", &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, A.p + 8);
  Val("cuPointerGetAttribute/type", std::to_string(type));
  size_t range = 0;
  CUdeviceptr start = 0;
  VALID(cuPointerGetAttribute, "range", &range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, A.p + 8);
  VALID(cuPointerGetAttribute, "start", &start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, A.p + 8);
  EXPECT_TRUE(range == kGranule && start == A.p);
  INVALID(cuPointerGetAttribute, "unknown", &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 0x1000);
  INVALID(cuPointerGetAttribute, "null", nullptr, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, A.p);

  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
  int ordinal = -1;
  range = 0;
  start = 0;
  void* data[] = {&range, &ordinal, &start};
  VALID(cuPointerGetAttributes, "valid", 3, attrs, data, A.p + 4096);
  EXPECT_TRUE(range == kGranule && ordinal == 0 && start == A.p);
  INVALID(cuPointerGetAttributes, "null", 3, nullptr, data, A.p);
  INVALID(cuPointerGetAttributes, "zero", 0, attrs, data, A.p);
}

// Edge cases whose answers are only compared with the driver's (the script
// compares every `rc` line): zero sizes, null and unknown pointers, on
// swapped-out buffers where stensor may answer itself under a cap.
void Edges() {
  CUdeviceptr p = 0;
  size_t free_bytes = 0, total = 0, pitch = 0;
  std::vector<uint8_t> host(64);
  // Above the device (under a cap: above the cap): its size and 2 GiB, in
  // granules.
  size_t device_bytes = 0;
  CHECK(cuDeviceTotalMem_v2(&device_bytes, 0));
  const size_t above = (device_bytes + (size_t{2} << 30) + kGranule - 1) / kGranule * kGranule;
  CALL(cuMemAlloc_v2, "huge", &p, SIZE_MAX);
  // Under a cap the device's size is the cap: above it but within the
  // device's memory, stensor serves the buffer from host memory.
  p = 0;
  if (CALL(cuMemAlloc_v2, "above-device", &p, above) == CUDA_SUCCESS) {
    Rec("alloc", "cuMemAlloc_v2").S("addr", Hex(p)).U("bytes", above).S("kind", "device");
    CHECK(cuMemFree_v2(p));  // no answer printed: the driver's run has none
    Rec("free", "cuMemFree_v2").S("addr", Hex(p)).U("bytes", above);
  }
  CALL(cuMemFree_v2, "zero", 0);
  CALL(cuMemFreeAsync, "zero", 0, g_stream);
  CALL(cuMemAllocPitch_v2, "zero-width", &p, &pitch, 0, 10, 4);
  CALL(cuMemAllocPitch_v2, "huge", &p, &pitch, SIZE_MAX, 2, 4);
  CALL(cuMemAllocAsync, "huge", &p, SIZE_MAX, g_stream);
  CALL(cuMemGetInfo_v2, "null-total", &free_bytes, nullptr);
  CALL(cuDeviceTotalMem_v2, "negative", &total, -1);
  void* h = nullptr;
  h = &h;
  CALL(cuMemHostAlloc, "zero", &h, 0, 0);
  Val("cuMemHostAlloc/zero", h == nullptr ? "null" : "non-null");
  CALL(cuMemFreeHost, "null", nullptr);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle handle = 0;
  CALL(cuMemCreate, "above-device", &handle, above, &prop, 0);
  CALL(cuMemCreate, "null-handle", nullptr, kGranule, &prop, 0);
  prop.location.id = 7;
  CALL(cuMemCreate, "device", &handle, kGranule, &prop, 0);
  CALL(cuMemMap, "zero-handle", A.p, kGranule, 0, 0, 0);
  CALL(cuMemUnmap, "stensor-buffer-size", A.p, 4096);
  CALL(cuMemRelease, "zero", 0);
  int fd = -1;
  CALL(cuMemExportToShareableHandle, "zero", &fd, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  CALL(cuMemRetainAllocationHandle, "null-addr", &handle, nullptr);
  CALL(cuIpcGetMemHandle, "zero", nullptr, 0);

  Evict({&A, &B});
  CALL(cuMemGetAddressRange_v2, "null-both", nullptr, nullptr, A.p + 5);
  CALL(cuMemGetAddressRange_v2, "end", &p, &total, A.p + kGranule);
  unsigned long long token[2];
  CALL(cuPointerGetAttribute, "p2p-tokens", token, CU_POINTER_ATTRIBUTE_P2P_TOKENS, A.p);
  CALL(cuPointerGetAttribute, "bad-attribute", token, static_cast<CUpointer_attribute>(999), A.p);
  int managed = -1;
  CALL(cuPointerGetAttribute, "managed", &managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, A.p + 3);
  Val("cuPointerGetAttribute/managed", std::to_string(managed));
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_P2P_TOKENS, CU_POINTER_ATTRIBUTE_MAPPED};
  int mapped = -1;
  void* data[] = {token, &mapped};
  CALL(cuPointerGetAttributes, "unsupported", 2, attrs, data, A.p);
  Val("cuPointerGetAttributes/mapped", std::to_string(mapped));
  CALL(cuPointerGetAttributes, "unknown", 2, attrs, data, 0x1000);
  CUpointer_attribute sizes[] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR};
  size_t range = 0;
  void* null_entry[] = {&range, nullptr};
  CALL(cuPointerGetAttributes, "null-entry", 2, sizes, null_entry, A.p + 16);
  // The program's own memory mapped at a buffer's address (swapped out:
  // under a cap its range is stensor's reservation, unmapped): not a
  // reservation of the program's, refused.
  prop.location.id = 0;
  if (cuMemCreate(&handle, kGranule, &prop, 0) == CUDA_SUCCESS) {
    CALL(cuMemMap, "buffer-address", A.p, kGranule, 0, handle, 0);
    CALL(cuMemRelease, "after-buffer-address", handle);
  }
  // Null device pointers, a bad memory type and a region of no bytes.
  CALL(cuMemcpyHtoD_v2, "null-dst", 0, host.data(), 16);
  CALL(cuMemcpyDtoD_v2, "null-src", A.p, 0, 16);
  CALL(cuMemsetD8_v2, "null", 0, 1, 16);
  CUDA_MEMCPY2D q = Desc2D();
  q.dstMemoryType = static_cast<CUmemorytype>(0);
  CALL(cuMemcpy2D_v2, "bad-type", &q);
  CUDA_MEMCPY3D r = Desc3D();
  r.srcMemoryType = CU_MEMORYTYPE_ARRAY;  // with no array
  CALL(cuMemcpy3D_v2, "no-array", &r);
  // Null contexts: the copy is made (driver 580 on an H200: unified
  // addressing names the memory).
  if (CALL(cuMemcpyPeer, "null-context", A.p, nullptr, B.p, nullptr, 16) == CUDA_SUCCESS) {
    Rec("memcpy", "cuMemcpyPeer")
        .S("kind", "peer")
        .U("bytes", 16)
        .S("dst", Hex(A.p))
        .S("src", Hex(B.p))
        .Bufs("reads", {B.p})
        .Bufs("writes", {A.p});
    std::memcpy(A.model.data(), B.model.data(), 16);
  }
  CALL(cuEventRecord, "destroyed-stream", nullptr, nullptr);
}

// Handles that leave stensor's control; their buffers stay resident after
// (under a cap, then two of the four slots are pinned), so this comes last.
void Handles() {
  CUipcMemHandle ipc;
  Evict({&A});
  CUresult r = CALL(cuIpcGetMemHandle, "valid", &ipc, A.p);
  if (kCapped) {
    // The buffer is made resident and pinned; the driver then refuses IPC
    // on VMM memory (docs/limits.md).
    Rec("pin", "cuIpcGetMemHandle").U("bytes", kGranule).S("id_of", Hex(A.p));
    EXPECT_TRUE(r == CUDA_ERROR_INVALID_VALUE);
  } else {
    EXPECT_TRUE(r == CUDA_SUCCESS);
  }
  // Refused by the driver: nothing handed out, so nothing pinned (B must
  // stay evictable). An interior pointer is refused too, but under a cap
  // stensor pins the buffer it reaches first (as for any IPC call there:
  // docs/limits.md), so it is asked of A, pinned already.
  INVALID(cuIpcGetMemHandle, "null", nullptr, B.p);
  // An interior pointer: the driver gives the allocation's handle (driver
  // 580 on an H200); under a cap refused as VMM memory, like the base.
  r = CALL(cuIpcGetMemHandle, "interior", &ipc, A.p + 64);
  EXPECT_TRUE(kCapped ? r == CUDA_ERROR_INVALID_VALUE : r == CUDA_SUCCESS);
  Evict({&B});
  CUmemGenericAllocationHandle h = 0;
  // Refused by the driver: nothing handed out, so nothing pinned (C must
  // stay evictable, or the next call finds no room).
  INVALID(cuMemRetainAllocationHandle, "null", nullptr, reinterpret_cast<void*>(g_bufs[2].p));
  r = CALL(cuMemRetainAllocationHandle, "stensor-buffer", &h, reinterpret_cast<void*>(B.p));
  if (kCapped) {
    // stensor's buffers are VMM memory: a handle of its physical memory,
    // resident for good.
    Rec("pin", "cuMemRetainAllocationHandle").U("bytes", kGranule).S("id_of", Hex(B.p));
    EXPECT_TRUE(r == CUDA_SUCCESS);
    if (r == CUDA_SUCCESS) VALID(cuMemRelease, "stensor-buffer", h);
  } else {
    EXPECT_TRUE(r != CUDA_SUCCESS);  // cuMemAlloc memory has no such handle
  }
  Verify(A, 0, kGranule);
  Verify(B, 0, kGranule);
}

// cuGetProcAddress and cuGetProcAddress_v2: every hook, by each base name,
// version and stream flag the driver maps to it, must come back as
// stensor's hook of that exact symbol (without stensor: the fake's).
struct ProcEntry {
  const char* name;
  int version;
  bool per_thread;
  const char* symbol;
};
constexpr ProcEntry kProcs[] = {
#define FAKECUDA_PROC(name, version, per_thread, symbol) {#name, version, per_thread != 0, #symbol},
#include "tests/fakecuda/proc_table.inc"
#undef FAKECUDA_PROC
};
// The hooks libstensor.so exports (`nm -D --defined-only`), one a line.
std::vector<std::string> g_hooks;

std::string Where(void* p) {
  Dl_info info{};
  if (p == nullptr) return "null";
  if (dladdr(p, &info) == 0 || info.dli_sname == nullptr) return "unknown";
  const bool ours = std::strstr(info.dli_fname, "libstensor") != nullptr;
  if (g_preloaded != ours && FakeHas(info.dli_sname)) {
    return std::string(info.dli_sname) + (ours ? "@stensor" : "@driver");
  }
  return info.dli_sname;
}

void ProcAddresses() {
  using V1 = decltype(&::cuGetProcAddress);
  using V2 = decltype(&::cuGetProcAddress_v2);
  auto v1 = reinterpret_cast<V1>(Resolve("cuGetProcAddress"));
  auto v2 = reinterpret_cast<V2>(Resolve("cuGetProcAddress_v2"));
  if (v1 == nullptr || v2 == nullptr) return;
  g_called.insert("cuGetProcAddress");
  g_called.insert("cuGetProcAddress_v2");
  for (const std::string& name : g_hooks) {
    const char* hook = name.c_str();
    bool found = false;
    for (const ProcEntry& e : kProcs) {
      if (std::strcmp(e.symbol, hook) != 0) continue;
      found = true;
      // The newest toolkit's version too: the entry must still be chosen
      // unless a newer ABI replaced it (then both runs name that one).
      for (int version : {e.version, 13000}) {
        for (cuuint64_t flags : {cuuint64_t{CU_GET_PROC_ADDRESS_DEFAULT},
                                 cuuint64_t{CU_GET_PROC_ADDRESS_LEGACY_STREAM},
                                 cuuint64_t{CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM}}) {
          const std::string label =
              std::string(e.name) + "/" + std::to_string(version) + "/" + std::to_string(flags);
          void* p = nullptr;
          CUdriverProcAddressQueryResult status{};
          CUresult r = v2(e.name, &p, version, flags, &status);
          std::printf("rc cuGetProcAddress_v2/%s %d\n", label.c_str(), r);
          Val("cuGetProcAddress_v2/" + label, Where(p) + "/" + std::to_string(status));
          p = nullptr;
          r = v1(e.name, &p, version, flags);
          std::printf("rc cuGetProcAddress/%s %d\n", label.c_str(), r);
          Val("cuGetProcAddress/" + label, Where(p));
        }
      }
    }
    if (!found && std::strncmp(hook, "cuGetProcAddress", 16) != 0) {
      std::fprintf(stderr, "no cuGetProcAddress name maps to %s\n", hook);
      ++failures;
    }
  }
  // What stensor's own entry points resolve to (the 4-argument one is 12000+).
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  std::printf("rc cuGetProcAddress_v2/self %d\n", v2("cuGetProcAddress", &p, 12000, 0, &status));
  Val("cuGetProcAddress_v2/self", Where(p));
  // A null symbol crashes the real driver (seen on a GPU: the 580 driver
  // reads it); the fake refuses it. Asked of the fake only.
  if (g_on_fake) {
    std::printf("rc cuGetProcAddress_v2/null-symbol %d\n", v2(nullptr, &p, 12000, 0, &status));
    std::printf("rc cuGetProcAddress_v2/null-pfn %d\n",
                v2("cuMemAlloc", nullptr, 12000, 0, &status));
  }
  std::printf("rc cuGetProcAddress_v2/unknown %d\n",
              v2("cuNoSuchEntryPoint", &p, 12000, 0, &status));
  Val("cuGetProcAddress_v2/unknown", std::to_string(status));
  std::printf("rc cuGetProcAddress_v2/flags %d\n", v2("cuMemAlloc", &p, 12000, 0x40, &status));
  std::printf("rc cuGetProcAddress_v2/old %d\n", v2("cuMemAllocAsync", &p, 10000, 0, &status));
  Val("cuGetProcAddress_v2/old", std::to_string(status));
  if (g_on_fake) std::printf("rc cuGetProcAddress/null-symbol %d\n", v1(nullptr, &p, 12000, 0));
  std::printf("rc cuGetProcAddress/unknown %d\n", v1("cuNoSuchEntryPoint", &p, 12000, 0));
  std::printf("rc cuGetProcAddress/flags %d\n", v1("cuMemAlloc", &p, 12000, 0x40));
}

}  // namespace

int main(int argc, char** argv) {
  // A line at a time: if a call crashes the program, its output ends at the
  // call before.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s TEST_KERNELS_SO HOOK_LIST\n", argv[0]);
    return 2;
  }
  if (std::FILE* f = std::fopen(argv[2], "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      line[std::strcspn(line, "\n")] = 0;
      if (std::strncmp(line, "cu", 2) == 0) g_hooks.push_back(line);
    }
    std::fclose(f);
  }
  if (g_hooks.empty()) {
    std::fprintf(stderr, "no hooks listed in %s\n", argv[2]);
    return 2;
  }
  Dl_info info{};
  g_preloaded = dladdr(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), &info) != 0 &&
                std::strstr(info.dli_fname, "libstensor") != nullptr;
  g_fake = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (g_fake == nullptr) {
    std::fprintf(stderr, "libcuda.so.1 is not loaded\n");
    return 2;
  }
  g_on_fake = dlsym(g_fake, "fakecuda_used_bytes") != nullptr;
  stensor_tests::StartOnDevice0();
  CHECK(cuCtxGetCurrent(&g_ctx));
  CHECK(cuStreamCreate(&g_stream, CU_STREAM_DEFAULT));
  ProcAddresses();
  for (Buf& b : g_bufs) {
    VALID(cuMemAlloc_v2, std::string("buffer") + b.name, &b.p, kGranule);
    Rec("alloc", "cuMemAlloc_v2").S("addr", Hex(b.p)).U("bytes", kGranule).S("kind", "device");
    b.model.assign(kGranule, 0);
    SetAll(b, 0);
  }
  Copies();
  Copies2D3D();
  Memsets();
  Launches(argv[1]);
  Syncs();
  Allocations();
  Vmm();
  Attributes();
  Edges();
  for (Buf& b : g_bufs) Verify(b, 0, kGranule);
  Handles();
  for (Buf& b : g_bufs) {
    VALID(cuMemFree_v2, std::string("buffer") + b.name, b.p);
    Rec("free", "cuMemFree_v2").S("addr", Hex(b.p)).U("bytes", kGranule);
  }
  CHECK(cuStreamDestroy_v2(g_stream));
  Contexts();
  for (const std::string& s : g_called) std::printf("called %s\n", s.c_str());
  if (failures != 0) {
    std::fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
