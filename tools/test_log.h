// TestLog: writes access-log text (docs/access-log.md) for tests of the
// simulator, so they read logs exactly as `stensor sim` does.
//
// Thread-safety: one thread per instance.
#ifndef STENSOR_TOOLS_TEST_LOG_H_
#define STENSOR_TOOLS_TEST_LOG_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stensor {

class TestLog {
 public:
  static constexpr uint64_t kMiB = 1 << 20;

  // A cuMemAlloc of `bytes`; returns its id.
  uint64_t Alloc(uint64_t bytes) {
    const uint64_t id = ++last_id_;
    const uint64_t addr = next_addr_;
    next_addr_ += (bytes + (64 * kMiB) - 1) / (64 * kMiB) * (64 * kMiB);
    addr_.resize(id + 1);
    size_.resize(id + 1);
    addr_[id] = addr;
    size_[id] = bytes;
    Add(absl::StrCat(R"({"type":"alloc","api":"cuMemAlloc_v2","id":)", id, R"(,"addr":"0x)",
                     absl::Hex(addr), R"(","bytes":)", bytes, R"(,"device":0,"kind":"device"})"));
    return id;
  }
  void Free(uint64_t id) {
    Add(absl::StrCat(R"({"type":"free","api":"cuMemFree_v2","id":)", id, R"(,"addr":"0x)",
                     absl::Hex(addr_[id]), R"(","bytes":)", size_[id], "}"));
  }
  // A kernel reading `reads` and writing `writes` (listed in reads too, as
  // the library logs them).
  void Launch(std::vector<uint64_t> reads, const std::vector<uint64_t>& writes,
              double compute_us = -1, const std::string& kernel = "k") {
    for (uint64_t w : writes) {
      bool listed = false;
      for (uint64_t r : reads) listed |= r == w;
      if (!listed) reads.push_back(w);
    }
    Add(absl::StrCat(R"({"type":"launch","api":"cuLaunchKernel","kernel":")", kernel,
                     R"(","demangled":"k",)",
                     R"("stream":"legacy","grid":[1,1,1],"block":[1,1,1],"reads":[)",
                     absl::StrJoin(reads, ","), R"(],"writes":[)", absl::StrJoin(writes, ","),
                     R"(],"inferred":true,"tables":[],"unknown_tables":false)",
                     compute_us >= 0 ? absl::StrCat(R"(,"compute_us":)", compute_us) : "", "}"));
  }
  // A cuGraphLaunch whose nodes read `reads` and write `writes`; with
  // `unknown_tables`, through a table an earlier node of the same launch
  // wrote (work of unknown accesses that names what it was seen to reach).
  void GraphLaunch(std::vector<uint64_t> reads, const std::vector<uint64_t>& writes,
                   bool unknown_tables) {
    for (uint64_t w : writes) {
      if (std::find(reads.begin(), reads.end(), w) == reads.end()) reads.push_back(w);
    }
    Add(absl::StrCat(R"({"type":"graph_launch","api":"cuGraphLaunch","graph":"0x1",)",
                     R"("stream":"legacy","inferred":true,"nodes":2,"reads":[)",
                     absl::StrJoin(reads, ","), R"(],"writes":[)", absl::StrJoin(writes, ","),
                     R"(],"tables":[],"unknown_tables":)", unknown_tables ? "true" : "false", "}"));
  }
  // A cuGraphLaunch of a graph whose nodes the library could not read.
  void BlindGraphLaunch() {
    Add(R"({"type":"graph_launch","api":"cuGraphLaunch","graph":"0x2","stream":"legacy","inferred":false})");
  }
  // A launch the library could not describe.
  void UnknownLaunch() {
    Add(R"({"type":"launch","api":"cuLaunchKernel","kernel":"k","demangled":"k","stream":"legacy","grid":[1,1,1],"block":[1,1,1],"reads":[],"writes":[],"inferred":false,"tables":[],"unknown_tables":false})");
  }
  // cuStreamSynchronize: the host waits for the device.
  void Sync() { Add(R"({"type":"sync","api":"cuStreamSynchronize","stream":"legacy"})"); }
  // cuMemsetD8 of `bytes` from `from` bytes into `id` (all of it by
  // default).
  void Memset(uint64_t id, uint64_t bytes = 0, uint64_t from = 0) {
    Add(absl::StrCat(R"({"type":"memset","api":"cuMemsetD8_v2","bytes":)",
                     bytes ? bytes : size_[id], R"(,"dst":"0x)", absl::Hex(addr_[id] + from),
                     R"(","writes":[)", id, R"(],"stream":"legacy","async":false})"));
  }
  // A synchronous cuMemcpyDtoH of 4 bytes from `id` into host memory.
  void ReadToHost(uint64_t id) {
    Add(absl::StrCat(R"({"type":"memcpy","api":"cuMemcpyDtoH_v2","kind":"DtoH","bytes":4,)",
                     R"("dst":"0x7ffd00000000","src":"0x)", absl::Hex(addr_[id]), R"(","reads":[)",
                     id, R"(],"writes":[],"stream":"legacy","async":false})"));
  }
  // A synchronous cuMemcpyHtoD of all of `id`.
  void WriteFromHost(uint64_t id) {
    Add(absl::StrCat(R"({"type":"memcpy","api":"cuMemcpyHtoD_v2","kind":"HtoD","bytes":)",
                     size_[id], R"(,"dst":"0x)", absl::Hex(addr_[id]),
                     R"(","src":"0x7ffd00000000","reads":[],"writes":[)", id,
                     R"(],"stream":"legacy","async":false})"));
  }

  // `ops` operations on buffers drawn from `live`: a whole memset, a kernel
  // reading and writing one, reading one and writing another, or reading
  // one. For the optimum tests' random logs.
  template <typename Rng>
  void RandomOps(Rng& rng, const std::vector<uint64_t>& live, int ops) {
    for (int i = 0; i < ops; ++i) {
      const uint64_t x = live[rng() % live.size()];
      switch (rng() % 5) {
        case 0:
          Memset(x);
          break;
        case 1:
          Launch({x}, {x});
          break;
        case 2: {
          const uint64_t y = live[rng() % live.size()];
          Launch({x, y}, {y});
          break;
        }
        default:
          Launch({x}, {});
          break;
      }
    }
  }

  std::string Text() const { return text_; }

 private:
  void Add(const std::string& line) {
    if (text_.empty()) {
      text_ =
          R"({"type":"header","format":1,"pid":1,"devices":[],"config":{"STENSOR_POLICY":"version"}})"
          "\n";
    }
    absl::StrAppend(&text_, line, "\n");
  }
  std::string text_;
  uint64_t last_id_ = 0;
  uint64_t next_addr_ = uint64_t{0x7f0000000000};
  std::vector<uint64_t> addr_, size_;
};

}  // namespace stensor

#endif  // STENSOR_TOOLS_TEST_LOG_H_
