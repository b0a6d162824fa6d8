// A seeded stress program for the driver API: T host threads each run a
// random but reproducible sequence of operations on their own buffers and
// streams (cuMemAlloc of 4 KiB .. 8 MiB, cuMemFree with work still queued,
// copies in every direction, sync and async, whole and partial, memsets,
// kernels reading and writing through direct pointers and through pointer
// tables in device memory, cuEventRecord/cuStreamWaitEvent between streams,
// stream and context synchronisation), and keep a host model of every byte
// of every live buffer. Run under stensor with a cap below the working set,
// a missed swap-in, a lost write-back or a broken ordering shows as a byte
// that differs from the model.
//
//   stress MODULE.so [--seed N] [--threads T] [--ops N] [--streams S]
//                    [--working-set BYTES] [--op-bytes BYTES] [--tolerate ERROR_NUMBER]
//                    [--keep-stale-entries]
//
// --keep-stale-entries: a table upload leaves the table's earlier entries
// in place (by default the same copy zeroes them). stensor then keeps every
// buffer a table ever pointed to resident for each launch through it, and a
// run under a cap fails with CUDA_ERROR_OUT_OF_MEMORY once they exceed it
// (a reproducer of that limitation: see tests/stress_test.sh).
//
// Memory: each thread keeps its buffers within its share of the working
// set, at most two below 1 MiB (never swapped), and no operation touches
// swappable buffers charged (in 2 MiB granules) more than --op-bytes. The
// first line prints `min_cap`, a cap that always suffices: stensor evicts no
// operand of an operation being prepared, so every thread's may be held at
// once; below it a capped run may see CUDA_ERROR_OUT_OF_MEMORY.
//
// Ordering: an operation on stream s first waits (cuEventRecord on the
// other stream + cuStreamWaitEvent on s) for the last write of every buffer
// it touches and, if it writes one, for its reads since; so conflicting
// operations run in the order they were issued and the model, updated as
// each is issued, is what the device must hold once they complete. Bytes are
// checked only where that is known: after cuStreamSynchronize(s), buffers
// whose last write was on s; after cuCtxSynchronize and at the end, every
// buffer; and at once after a copy into pageable host memory (the driver
// returns only when it is done).
//
// Failed calls (--tolerate N: a call may fail with error number N, as
// FAKECUDA_FAIL injects it; any other failure is an error): a call that
// fails is not applied to the model, and an operation whose ordering calls
// fail is not issued. A failed synchronisation checks nothing; a failed
// cuMemFree keeps the buffer (freed again at the end); a buffer whose
// initial copy failed is never read or checked, only freed. Without
// --tolerate every failure stops the program, except CUDA_ERROR_OUT_OF_MEMORY
// from cuMemAlloc, which is counted and printed (`alloc_oom N`).
//
// A mismatch prints the seed, thread, operation index, buffer, offset, got
// and want, and exits 1. Output: a `stress ...` line with the parameters
// and the working set, per-thread counts, and last `checksum <hex>` (FNV-1a
// over every thread's final data buffer contents, in thread order): equal for
// equal parameters with or without stensor when no call failed.
#include <cuda.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/driver_check.h"

namespace {

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;
constexpr size_t kMinBuffer = 4 * kKiB, kMaxBuffer = 8 * kMiB;
constexpr size_t kSmallTable = 4 * kKiB;      // below the granule: never swapped
constexpr size_t kLargeTable = 3 * kMiB / 2;  // swappable (>= half a granule)
constexpr int kMaxTableEntries = 3;
constexpr size_t kGranule = 2 * kMiB;
constexpr size_t kSwappable = kMiB;  // stensor swaps cuMemAlloc buffers from here up
constexpr int kMaxSmall = 2;         // live buffers below kSwappable per thread

// What a buffer holds of a cap while an operation uses it: swappable ones
// are charged whole granules; the few small ones are counted apart, since
// they are never evicted.
size_t Charged(size_t size) {
  return size < kSwappable ? 0 : (size + kGranule - 1) / kGranule * kGranule;
}

struct Options {
  uint64_t seed = 1;
  int threads = 4;
  int ops = 2000;
  int streams = 3;
  size_t working_set = 64 * kMiB;
  size_t op_bytes = 8 * kMiB;       // most an operation's swappable buffers are charged
  int tolerate = -1;                // error number a call may fail with; -1: none
  bool keep_stale_entries = false;  // table uploads leave earlier entries in place
};

struct Kernels {
  CUfunction mix, gather, scatter;
};

uint64_t Fnv(uint64_t h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

const char* ErrorName(CUresult r) {
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  return name != nullptr ? name : "?";
}

struct Buffer {
  int id = 0;
  CUdeviceptr ptr = 0;
  size_t size = 0;
  std::vector<uint8_t> model;               // what the device holds once issued work is done
  bool valid = true;                        // false: initial contents unknown; only freed
  bool table = false;                       // holds pointers: written only by table uploads
  size_t entries_off = 0, entries_len = 0;  // a table's current entries; the rest is 0
  int last_write = -1;                      // stream index of the last write not seen done
  uint32_t readers = 0;                     // streams that read it since that write
};

// A device-to-host copy into pinned memory, checked when its stream is done.
struct PendingHostCheck {
  int stream;
  int buffer;
  CUdeviceptr ptr;
  size_t size;
  size_t offset;
  std::vector<uint8_t> want;
};

// One thread's share of the run: its buffers, streams, events, pinned
// staging and random sequence. Thread-safety: used by one thread only.
class Worker {
 public:
  Worker(const Options& o, int thread, CUcontext ctx, const Kernels& k)
      : o_(o),
        thread_(thread),
        ctx_(ctx),
        k_(k),
        rng_(o.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(thread) + 1),
        budget_(o.working_set / o.threads) {}

  void Run() {
    Check(cuCtxSetCurrent(ctx_), "cuCtxSetCurrent", true);
    streams_.push_back(nullptr);  // index 0: the legacy stream (synchronous calls)
    for (int s = 1; s <= o_.streams; ++s) {
      CUstream st;
      // Stream 1 is blocking (ordered with the legacy stream by the driver
      // too), the others not.
      Check(cuStreamCreate(&st, s == 1 ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING),
            "cuStreamCreate", true);
      streams_.push_back(st);
    }
    for (size_t s = 0; s < streams_.size(); ++s) {
      CUevent e;
      Check(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate", true);
      events_.push_back(e);
    }
    Check(cuMemAllocHost(reinterpret_cast<void**>(&pinned_), kMaxBuffer), "cuMemAllocHost", true);
    scratch_.resize(kMaxBuffer);
    // Two table buffers, kept for the whole run.
    for (size_t size : {kSmallTable, kLargeTable}) {
      Buffer* b = Allocate(size, /*zero=*/true);
      if (b != nullptr) b->table = true;
    }
    for (op_ = 0; op_ < o_.ops; ++op_) Step();
    op_ = o_.ops;
    if (Check(cuCtxSynchronize(), "cuCtxSynchronize")) AllDone();
    checksum_ = 0xcbf29ce484222325ull;
    for (auto& b : buffers_) {
      // Tables hold addresses, which differ from run to run.
      if (b->valid && !b->table) checksum_ = Fnv(checksum_, b->model.data(), b->size);
    }
    for (auto& b : buffers_) {
      if (Check(cuMemFree(b->ptr), "cuMemFree")) ++count_[kFree];
    }
    buffers_.clear();
    Check(cuMemFreeHost(pinned_), "cuMemFreeHost");
  }

  uint64_t checksum() const { return checksum_; }
  size_t peak_bytes() const { return peak_; }
  void Print() const {
    std::printf("thread %d:", thread_);
    for (int i = 0; i < kKinds; ++i) std::printf(" %s %d", kKindNames[i], count_[i]);
    std::printf(" checked_bytes %" PRIu64 " failed_calls %d alloc_oom %d\n", checked_bytes_,
                failed_calls_, alloc_oom_);
  }

 private:
  enum Kind { kAlloc, kFree, kCopy, kSet, kLaunch, kTable, kSync, kKinds };
  static constexpr const char* kKindNames[kKinds] = {
      "alloc", "free", "copies", "memsets", "launches", "table_launches", "syncs"};

  // True on success. A failure with the tolerated error is counted; any
  // other stops the program.
  bool Check(CUresult r, const char* what, bool fatal = false) {
    if (r == CUDA_SUCCESS) return true;
    if (!fatal && o_.tolerate >= 0 && static_cast<int>(r) == o_.tolerate) {
      ++failed_calls_;
      return false;
    }
    std::fprintf(stderr, "seed %" PRIu64 " thread %d op %d: %s failed: %s (%d)\n", o_.seed, thread_,
                 op_, what, ErrorName(r), static_cast<int>(r));
    std::exit(1);
  }

  [[noreturn]] void Mismatch(const Buffer& b, size_t offset, uint8_t got, uint8_t want,
                             const char* where) {
    std::fprintf(stderr,
                 "MISMATCH seed %" PRIu64
                 " thread %d op %d buffer %d (0x%llx, %zu bytes) "
                 "offset %zu got 0x%02x want 0x%02x (%s)\n",
                 o_.seed, thread_, op_, b.id, static_cast<unsigned long long>(b.ptr), b.size,
                 offset, got, want, where);
    std::exit(1);
  }

  void Compare(const Buffer& b, size_t offset, const uint8_t* got, const uint8_t* want, size_t n,
               const char* where) {
    if (std::memcmp(got, want, n) != 0) {
      for (size_t i = 0; i < n; ++i) {
        if (got[i] != want[i]) Mismatch(b, offset + i, got[i], want[i], where);
      }
    }
    checked_bytes_ += n;
  }

  // Fills p with bytes from a splitmix64 stream seeded by rng_ (cheaper per
  // byte than the engine itself, and as reproducible).
  void Fill(uint8_t* p, size_t n) {
    uint64_t x = rng_();
    for (size_t i = 0; i < n; i += 8) {
      x += 0x9e3779b97f4a7c15ull;
      uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      std::memcpy(p + i, &z, std::min<size_t>(8, n - i));
    }
  }

  uint64_t Rand(uint64_t lo, uint64_t hi) {  // inclusive
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_);
  }

  // Candidates for data operations: valid, not tables.
  std::vector<Buffer*> Data() {
    std::vector<Buffer*> v;
    for (auto& b : buffers_) {
      if (b->valid && !b->table) v.push_back(b.get());
    }
    return v;
  }

  // Up to n distinct data buffers with at least min_size bytes, charged
  // at most `room` together (so that every thread's operation in flight at
  // once fits a cap: stensor evicts no operand of an operation being
  // prepared, on any thread).
  std::vector<Buffer*> Pick(int n, size_t min_size = 1, size_t room = SIZE_MAX) {
    room = std::min(room, o_.op_bytes);
    std::vector<Buffer*> all = Data(), out;
    std::shuffle(all.begin(), all.end(), rng_);
    size_t charged = 0;
    for (Buffer* b : all) {
      if (static_cast<int>(out.size()) == n) break;
      if (b->size >= min_size && charged + Charged(b->size) <= room) {
        out.push_back(b);
        charged += Charged(b->size);
      }
    }
    return out;
  }

  Buffer* Table() {
    std::vector<Buffer*> t;
    for (auto& b : buffers_) {
      if (b->table && b->valid) t.push_back(b.get());
    }
    return t.empty() ? nullptr : t[Rand(0, t.size() - 1)];
  }

  // Makes stream s wait for what an operation reading `reads` and writing
  // `writes` must come after. False (the operation is not issued) if a call
  // failed.
  bool Order(int s, const std::vector<Buffer*>& reads, const std::vector<Buffer*>& writes) {
    uint32_t need = 0;
    for (Buffer* b : reads) {
      if (b->last_write >= 0) need |= 1u << b->last_write;
    }
    for (Buffer* b : writes) {
      if (b->last_write >= 0) need |= 1u << b->last_write;
      need |= b->readers;
    }
    need &= ~(1u << s);
    for (size_t t = 0; t < streams_.size(); ++t) {
      if ((need & (1u << t)) == 0) continue;
      if (!Check(cuEventRecord(events_[t], streams_[t]), "cuEventRecord")) return false;
      if (!Check(cuStreamWaitEvent(streams_[s], events_[t], 0), "cuStreamWaitEvent")) {
        return false;
      }
    }
    return true;
  }

  // Records that an operation on stream s was issued.
  void Issued(int s, const std::vector<Buffer*>& reads, const std::vector<Buffer*>& writes) {
    for (Buffer* b : reads) b->readers |= 1u << s;
    for (Buffer* b : writes) {
      b->last_write = s;
      b->readers = 0;
    }
  }

  // Reads a whole buffer back (synchronous copy) and compares it.
  void CheckBuffer(Buffer& b, const char* where) {
    if (!b.valid) return;
    if (!Check(cuMemcpyDtoH(scratch_.data(), b.ptr, b.size), "cuMemcpyDtoH (check)")) return;
    Compare(b, 0, scratch_.data(), b.model.data(), b.size, where);
  }

  // Stream s was seen done.
  void StreamDone(int s) {
    for (auto& b : buffers_) {
      b->readers &= ~(1u << s);
      if (b->last_write == s) {
        b->last_write = -1;
        CheckBuffer(*b, "after cuStreamSynchronize");
      }
    }
    if (pinned_busy_ == s) pinned_busy_ = -1;
    CheckPinned([&](int stream) { return stream == s; });
  }

  void AllDone() {
    for (auto& b : buffers_) {
      b->readers = 0;
      b->last_write = -1;
      CheckBuffer(*b, "after cuCtxSynchronize");
    }
    pinned_busy_ = -1;
    CheckPinned([](int) { return true; });
  }

  template <typename Done>
  void CheckPinned(Done done) {
    if (pending_.empty() || !done(pending_.front().stream)) return;
    for (PendingHostCheck& p : pending_) {
      Buffer probe;  // the buffer may be gone: what the message needs
      probe.id = p.buffer;
      probe.ptr = p.ptr;
      probe.size = p.size;
      Compare(probe, p.offset, pinned_, p.want.data(), p.want.size(),
              "async copy into pinned memory");
    }
    pending_.clear();
    pinned_busy_ = -1;
  }

  // Pinned staging may be rewritten only once the copy using it is done.
  bool PinnedFree() {
    if (pinned_busy_ < 0) return true;
    const int s = pinned_busy_;
    if (!Check(cuStreamSynchronize(streams_[s]), "cuStreamSynchronize (pinned)")) return false;
    StreamDone(s);
    return true;
  }

  // Zeroed contents for tables (no stale words that look like pointers),
  // random ones else.
  Buffer* Allocate(size_t size, bool zero = false) {
    auto b = std::make_unique<Buffer>();
    b->id = next_id_++;
    b->size = size;
    CUresult r = cuMemAlloc(&b->ptr, size);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && o_.tolerate < 0) {
      ++alloc_oom_;
      return nullptr;
    }
    if (!Check(r, "cuMemAlloc")) return nullptr;
    ++count_[kAlloc];
    live_ += size;
    if (live_ > peak_) peak_ = live_;
    // Random contents (freshly allocated memory is not defined).
    b->model.resize(size);
    if (!zero) Fill(b->model.data(), size);
    if (Check(cuMemcpyHtoD(b->ptr, b->model.data(), size), "cuMemcpyHtoD (init)")) {
      b->last_write = 0;  // the DMA may still be in flight on the legacy stream
    } else {
      b->valid = false;
    }
    buffers_.push_back(std::move(b));
    return buffers_.back().get();
  }

  void Free(size_t index) {
    Buffer& b = *buffers_[index];
    if (!Check(cuMemFree(b.ptr), "cuMemFree")) return;
    ++count_[kFree];
    live_ -= b.size;
    buffers_.erase(buffers_.begin() + index);
  }

  size_t RandomSize() {
    int small = 0;
    for (auto& b : buffers_) small += b->size < kSwappable && !b->table;
    const size_t max = std::min({kMaxBuffer, o_.op_bytes, std::max(2 * kMiB, budget_ / 3)});
    if (small < kMaxSmall && Rand(0, 99) < 35) return Rand(kMinBuffer, kSwappable - 1);
    return Rand(kSwappable, max);
  }

  // A range [off, off + len) of b, aligned to `align`, at least 1 unit.
  void Range(const Buffer& b, size_t align, size_t max_len, size_t* off, size_t* len) {
    const size_t units = b.size / align;
    if (Rand(0, 3) == 0) {  // whole
      *off = 0;
      *len = std::min(units, max_len / align) * align;
      return;
    }
    const size_t n = Rand(1, std::min(units, max_len / align));
    *off = Rand(0, units - n) * align;
    *len = n * align;
  }

  int AsyncStream() { return static_cast<int>(Rand(1, streams_.size() - 1)); }

  void Step() {
    const uint64_t r = Rand(0, 99);
    if (r < 10) {  // allocate, freeing first to stay within the budget
      const size_t size = RandomSize();
      while (live_ + size > budget_ && !Data().empty()) {
        std::vector<Buffer*> d = Data();
        Buffer* victim = d[Rand(0, d.size() - 1)];
        for (size_t i = 0; i < buffers_.size(); ++i) {
          if (buffers_[i].get() == victim) {
            const size_t before = buffers_.size();
            Free(i);
            if (buffers_.size() == before) return;  // failed free: try later
            break;
          }
        }
      }
      if (live_ + size <= budget_) Allocate(size);
    } else if (r < 15) {  // free, often with work on it still queued
      for (size_t i = 0; i < buffers_.size(); ++i) {
        if (!buffers_[i]->valid) {
          Free(i);
          return;
        }
      }
      std::vector<Buffer*> d = Data();
      if (d.size() < 3) return;
      Buffer* victim = d[Rand(0, d.size() - 1)];
      for (size_t i = 0; i < buffers_.size(); ++i) {
        if (buffers_[i].get() == victim) {
          Free(i);
          break;
        }
      }
    } else if (r < 23) {
      HostToDevice();
    } else if (r < 31) {
      DeviceToHost();
    } else if (r < 39) {
      DeviceToDevice();
    } else if (r < 49) {
      Memset();
    } else if (r < 64) {
      Mix();
    } else if (r < 74) {
      Gather();
    } else if (r < 84) {
      Scatter();
    } else if (r < 97) {
      const int s = static_cast<int>(Rand(0, streams_.size() - 1));
      if (Check(cuStreamSynchronize(streams_[s]), "cuStreamSynchronize")) {
        ++count_[kSync];
        StreamDone(s);
      }
    } else {
      if (Check(cuCtxSynchronize(), "cuCtxSynchronize")) {
        ++count_[kSync];
        AllDone();
      }
    }
  }

  void HostToDevice() {
    std::vector<Buffer*> b = Pick(1);
    if (b.empty()) return;
    size_t off, len;
    Range(*b[0], 1, b[0]->size, &off, &len);
    std::vector<uint8_t>& src = host_src_;
    src.resize(len);
    Fill(src.data(), len);
    const uint64_t how = Rand(0, 2);
    const int s = how == 0 ? 0 : AsyncStream();
    if (how == 2 && !PinnedFree()) return;
    if (!Order(s, {}, b)) return;
    CUresult res;
    if (how == 0) {
      res = cuMemcpyHtoD(b[0]->ptr + off, src.data(), len);
    } else if (how == 1) {  // pageable: read before the call returns
      res = cuMemcpyHtoDAsync(b[0]->ptr + off, src.data(), len, streams_[s]);
    } else {
      std::memcpy(pinned_, src.data(), len);
      res = cuMemcpyHtoDAsync(b[0]->ptr + off, pinned_, len, streams_[s]);
    }
    if (!Check(res, "cuMemcpyHtoD")) return;
    if (how == 2) pinned_busy_ = s;
    Issued(s, {}, b);
    std::memcpy(&b[0]->model[off], src.data(), len);
    ++count_[kCopy];
  }

  void DeviceToHost() {
    std::vector<Buffer*> b = Pick(1);
    if (b.empty()) return;
    size_t off, len;
    Range(*b[0], 1, b[0]->size, &off, &len);
    const uint64_t how = Rand(0, 2);
    const int s = how == 0 ? 0 : AsyncStream();
    if (how == 2 && !PinnedFree()) return;
    if (!Order(s, b, {})) return;
    CUresult res;
    if (how == 0) {
      res = cuMemcpyDtoH(scratch_.data(), b[0]->ptr + off, len);
    } else if (how == 1) {  // into pageable memory: done when the call returns
      res = cuMemcpyDtoHAsync(scratch_.data(), b[0]->ptr + off, len, streams_[s]);
    } else {
      res = cuMemcpyDtoHAsync(pinned_, b[0]->ptr + off, len, streams_[s]);
    }
    if (!Check(res, "cuMemcpyDtoH")) return;
    Issued(s, b, {});
    ++count_[kCopy];
    if (how == 2) {
      pinned_busy_ = s;
      pending_.push_back(
          {s, b[0]->id, b[0]->ptr, b[0]->size, off,
           std::vector<uint8_t>(b[0]->model.begin() + off, b[0]->model.begin() + off + len)});
    } else {
      Compare(*b[0], off, scratch_.data(), &b[0]->model[off], len,
              how == 0 ? "cuMemcpyDtoH" : "cuMemcpyDtoHAsync into pageable memory");
    }
  }

  void DeviceToDevice() {
    std::vector<Buffer*> b = Pick(2);
    if (b.size() < 2) return;
    Buffer* src = b[0];
    Buffer* dst = b[1];
    const size_t max = std::min(src->size, dst->size);
    size_t soff, len;
    Range(*src, 1, max, &soff, &len);
    const size_t doff = Rand(0, dst->size - len);
    const bool async = Rand(0, 1) == 1;
    const int s = async ? AsyncStream() : 0;
    if (!Order(s, {src}, {dst})) return;
    CUresult res = async ? cuMemcpyDtoDAsync(dst->ptr + doff, src->ptr + soff, len, streams_[s])
                         : cuMemcpyDtoD(dst->ptr + doff, src->ptr + soff, len);
    if (!Check(res, "cuMemcpyDtoD")) return;
    Issued(s, {src}, {dst});
    std::memcpy(&dst->model[doff], &src->model[soff], len);
    ++count_[kCopy];
  }

  void Memset() {
    std::vector<Buffer*> b = Pick(1, 4);
    if (b.empty()) return;
    const bool d32 = Rand(0, 1) == 1;
    size_t off, len;
    Range(*b[0], d32 ? 4 : 1, b[0]->size, &off, &len);
    const bool async = Rand(0, 1) == 1;
    const int s = async ? AsyncStream() : 0;
    const uint32_t v = static_cast<uint32_t>(rng_());
    if (!Order(s, {}, b)) return;
    const CUdeviceptr p = b[0]->ptr + off;
    CUresult res;
    if (d32) {
      res = async ? cuMemsetD32Async(p, v, len / 4, streams_[s]) : cuMemsetD32(p, v, len / 4);
    } else {
      res = async ? cuMemsetD8Async(p, static_cast<uint8_t>(v), len, streams_[s])
                  : cuMemsetD8(p, static_cast<uint8_t>(v), len);
    }
    if (!Check(res, "cuMemset")) return;
    Issued(s, {}, b);
    if (d32) {
      for (size_t i = 0; i < len; i += 4) std::memcpy(&b[0]->model[off + i], &v, 4);
    } else {
      std::memset(&b[0]->model[off], static_cast<uint8_t>(v), len);
    }
    ++count_[kSet];
  }

  bool Launch(CUfunction f, int s, std::vector<void*> params) {
    return Check(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, streams_[s], params.data(), nullptr),
                 "cuLaunchKernel");
  }

  static uint32_t Word(const Buffer* b, size_t off) {
    uint32_t w;
    std::memcpy(&w, &b->model[off], 4);
    return w;
  }
  static void SetWord(Buffer* b, size_t off, uint32_t w) { std::memcpy(&b->model[off], &w, 4); }

  void Mix() {
    std::vector<Buffer*> b = Pick(2, 4);
    if (b.size() < 2) return;
    Buffer* x = b[0];
    Buffer* y = b[1];
    size_t xoff, len;
    Range(*x, 4, y->size / 4 * 4, &xoff, &len);
    const size_t yoff = Rand(0, (y->size - len) / 4) * 4;
    const int s = AsyncStream();
    uint32_t a = static_cast<uint32_t>(rng_());
    int64_t n = static_cast<int64_t>(len / 4);
    CUdeviceptr px = x->ptr + xoff, py = y->ptr + yoff;
    if (!Order(s, {x}, {y})) return;
    if (!Launch(k_.mix, s, {&px, &py, &a, &n})) return;
    Issued(s, {x}, {y});
    for (int64_t i = 0; i < n; ++i) {
      SetWord(y, yoff + 4 * i, Word(y, yoff + 4 * i) * 2654435761u + Word(x, xoff + 4 * i) + a);
    }
    ++count_[kLaunch];
  }

  // Writes `entries` into table t at a random 8-byte-aligned place on stream
  // s, in one of the ways a program builds a table; the same copy zeroes the
  // previous entries, so that the table refers to these buffers only (as
  // stensor must assume a kernel may read every entry of a table, stale
  // ones would make each launch keep every buffer resident). Returns that
  // place, or 0 if the upload failed.
  CUdeviceptr Upload(Buffer* t, int s, const std::vector<CUdeviceptr>& entries) {
    const size_t bytes = entries.size() * sizeof(CUdeviceptr);
    const size_t off = Rand(0, (t->size - bytes) / 8) * 8;
    const bool clear = t->entries_len != 0 && !o_.keep_stale_entries;
    const size_t lo = clear ? std::min(off, t->entries_off) : off;
    const size_t hi = clear ? std::max(off + bytes, t->entries_off + t->entries_len) : off + bytes;
    std::vector<uint8_t> region(hi - lo, 0);
    std::memcpy(&region[off - lo], entries.data(), bytes);
    const uint64_t how = Rand(0, 2);
    if (how == 2 && !PinnedFree()) return 0;
    if (!Order(how == 0 ? 0 : s, {}, {t})) return 0;
    CUresult res;
    const CUdeviceptr dst = t->ptr + lo;
    if (how == 0) {
      res = cuMemcpyHtoD(dst, region.data(), region.size());
    } else if (how == 1) {
      res = cuMemcpyHtoDAsync(dst, region.data(), region.size(), streams_[s]);
    } else {
      std::memcpy(pinned_, region.data(), region.size());
      res = cuMemcpyHtoDAsync(dst, pinned_, region.size(), streams_[s]);
    }
    if (!Check(res, "cuMemcpyHtoD (table)")) return 0;
    if (how == 2) pinned_busy_ = s;
    Issued(how == 0 ? 0 : s, {}, {t});
    std::memcpy(&t->model[lo], region.data(), region.size());
    t->entries_off = off;
    t->entries_len = bytes;
    ++count_[kCopy];
    return t->ptr + off;
  }

  // Picks `count` distinct buffers plus one more, and a word count n that
  // each can hold from a random word offset.
  bool TableOperands(const Buffer* table, int count, std::vector<Buffer*>* refs, Buffer** other,
                     std::vector<size_t>* offs, size_t* other_off, int64_t* n) {
    std::vector<Buffer*> b = Pick(count + 1, 4, o_.op_bytes - Charged(table->size));
    if (static_cast<int>(b.size()) < count + 1) return false;
    size_t min_words = SIZE_MAX;
    for (Buffer* p : b) min_words = std::min(min_words, p->size / 4);
    const size_t words = Rand(1, min_words);
    *other = b.back();
    refs->assign(b.begin(), b.end() - 1);
    for (Buffer* p : *refs) offs->push_back(Rand(0, p->size / 4 - words) * 4);
    *other_off = Rand(0, (*other)->size / 4 - words) * 4;
    *n = static_cast<int64_t>(words);
    return true;
  }

  void Gather() {
    Buffer* t = Table();
    if (t == nullptr) return;
    int count = static_cast<int>(Rand(1, kMaxTableEntries));
    std::vector<Buffer*> xs;
    std::vector<size_t> offs;
    Buffer* y;
    size_t yoff;
    int64_t n;
    if (!TableOperands(t, count, &xs, &y, &offs, &yoff, &n)) return;
    const int s = AsyncStream();
    std::vector<CUdeviceptr> entries;
    for (int i = 0; i < count; ++i) entries.push_back(xs[i]->ptr + offs[i]);
    CUdeviceptr table = Upload(t, s, entries);
    if (table == 0) return;
    std::vector<Buffer*> reads = xs;
    reads.push_back(t);
    CUdeviceptr py = y->ptr + yoff;
    if (!Order(s, reads, {y})) return;
    if (!Launch(k_.gather, s, {&table, &py, &count, &n})) return;
    Issued(s, reads, {y});
    for (int64_t i = 0; i < n; ++i) {
      uint32_t v = Word(y, yoff + 4 * i) * 31u;
      for (int k = 0; k < count; ++k) v += Word(xs[k], offs[k] + 4 * i);
      SetWord(y, yoff + 4 * i, v);
    }
    ++count_[kTable];
  }

  void Scatter() {
    Buffer* t = Table();
    if (t == nullptr) return;
    int count = static_cast<int>(Rand(1, kMaxTableEntries));
    std::vector<Buffer*> ys;
    std::vector<size_t> offs;
    Buffer* x;
    size_t xoff;
    int64_t n;
    if (!TableOperands(t, count, &ys, &x, &offs, &xoff, &n)) return;
    const int s = AsyncStream();
    std::vector<CUdeviceptr> entries;
    for (int i = 0; i < count; ++i) entries.push_back(ys[i]->ptr + offs[i]);
    CUdeviceptr table = Upload(t, s, entries);
    if (table == 0) return;
    uint32_t a = static_cast<uint32_t>(rng_());
    CUdeviceptr px = x->ptr + xoff;
    if (!Order(s, {t, x}, ys)) return;
    if (!Launch(k_.scatter, s, {&table, &px, &a, &count, &n})) return;
    Issued(s, {t, x}, ys);
    for (int k = 0; k < count; ++k) {
      const uint32_t add = a * static_cast<uint32_t>(k + 1);
      for (int64_t i = 0; i < n; ++i) {
        const size_t o = offs[k] + 4 * i;
        SetWord(ys[k], o, Word(ys[k], o) ^ (Word(x, xoff + 4 * i) + add));
      }
    }
    ++count_[kTable];
  }

  const Options& o_;
  const int thread_;
  const CUcontext ctx_;
  const Kernels& k_;
  std::mt19937_64 rng_;
  const size_t budget_;  // this thread's share of the working set
  int op_ = -1;
  int next_id_ = 0;
  size_t live_ = 0, peak_ = 0;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<CUstream> streams_;
  std::vector<CUevent> events_;  // one per stream, re-recorded for each wait
  uint8_t* pinned_ = nullptr;
  int pinned_busy_ = -1;                   // stream whose queued copy uses pinned_, or -1
  std::vector<PendingHostCheck> pending_;  // at most one: the copy into pinned_
  std::vector<uint8_t> scratch_;
  std::vector<uint8_t> host_src_;  // pageable source of host-to-device copies
  int count_[kKinds] = {};
  uint64_t checked_bytes_ = 0;
  int failed_calls_ = 0;
  int alloc_oom_ = 0;
  uint64_t checksum_ = 0;
};

bool ParseSize(const char* s, size_t* out) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s) return false;
  const std::string unit = end;
  size_t mul = 1;
  if (unit == "KiB" || unit == "K") {
    mul = kKiB;
  } else if (unit == "MiB" || unit == "M") {
    mul = kMiB;
  } else if (unit == "GiB" || unit == "G") {
    mul = kMiB * kKiB;
  } else if (!unit.empty()) {
    return false;
  }
  *out = static_cast<size_t>(v) * mul;
  return true;
}

bool ParseInt(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: stress MODULE.so [--seed N] [--threads 1-16] [--ops N] [--streams 1-8]\n"
      "              [--working-set BYTES[KiB|MiB|GiB], >= 16 MiB per thread]\n"
      "              [--op-bytes BYTES, >= 4 MiB] [--tolerate ERROR_NUMBER]\n"
      "              [--keep-stale-entries]\n";
  if (argc < 2) {
    std::fputs(usage, stderr);
    return 2;
  }
  Options o;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    long v = 0;
    const bool has = i + 1 < argc;
    const char* val = has ? argv[i + 1] : "";
    bool ok = has;
    if (a == "--seed" && has) {
      ok = ParseInt(val, 0, 1L << 40, &v);
      o.seed = static_cast<uint64_t>(v);
    } else if (a == "--threads" && has) {
      ok = ParseInt(val, 1, 16, &v);
      o.threads = static_cast<int>(v);
    } else if (a == "--ops" && has) {
      ok = ParseInt(val, 0, 100000000, &v);
      o.ops = static_cast<int>(v);
    } else if (a == "--streams" && has) {
      ok = ParseInt(val, 1, 8, &v);
      o.streams = static_cast<int>(v);
    } else if (a == "--working-set" && has) {
      ok = ParseSize(val, &o.working_set);
    } else if (a == "--op-bytes" && has) {
      ok = ParseSize(val, &o.op_bytes) && o.op_bytes >= 4 * kMiB;
    } else if (a == "--keep-stale-entries") {
      o.keep_stale_entries = true;
      ok = true;
      --i;  // takes no value
    } else if (a == "--tolerate" && has) {
      ok = ParseInt(val, 1, 100000, &v);
      o.tolerate = static_cast<int>(v);
    } else {
      std::fprintf(stderr, "unknown argument %s\n%s", a.c_str(), usage);
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "%s: bad value %s\n%s", a.c_str(), val, usage);
      return 2;
    }
    ++i;
  }
  if (o.working_set / o.threads < 16 * kMiB) {
    std::fprintf(stderr, "--working-set: at least 16 MiB per thread (two tables and data)\n%s",
                 usage);
    return 2;
  }
  stensor_tests::StartOnDevice0();
  CUcontext ctx;
  CHECK(cuCtxGetCurrent(&ctx));
  CUmodule module;
  CHECK(cuModuleLoad(&module, argv[1]));
  Kernels k;
  CHECK(cuModuleGetFunction(&k.mix, module, "_ZN6stress3mixEPKjPjjl"));
  CHECK(cuModuleGetFunction(&k.gather, module, "_ZN6stress6gatherEPKPKjPjil"));
  CHECK(cuModuleGetFunction(&k.scatter, module, "_ZN6stress7scatterEPKPjPKjjil"));
  // A cap this large always suffices: every thread's small buffers and
  // tables, and one operation's swappable buffers per thread.
  const size_t min_cap = o.threads * (kMaxSmall * kSwappable + kSmallTable + o.op_bytes);
  std::printf("stress seed %" PRIu64 " threads %d ops %d streams %d working_set %zu min_cap %zu\n",
              o.seed, o.threads, o.ops, o.streams, o.working_set, min_cap);
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < o.threads; ++t) workers.push_back(std::make_unique<Worker>(o, t, ctx, k));
  std::vector<std::thread> threads;
  for (auto& w : workers) threads.emplace_back([&w] { w->Run(); });
  for (std::thread& t : threads) t.join();
  uint64_t h = 0xcbf29ce484222325ull;
  size_t peak = 0;
  for (auto& w : workers) {
    w->Print();
    const uint64_t c = w->checksum();
    h = Fnv(h, reinterpret_cast<const uint8_t*>(&c), sizeof(c));
    peak += w->peak_bytes();
  }
  std::printf("peak_live_bytes %zu\n", peak);
  std::printf("checksum %016" PRIx64 "\n", h);
  return 0;
}
