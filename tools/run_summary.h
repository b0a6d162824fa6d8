// RunSummary: what `stensor report` shows of an access log
// (docs/access-log.md), gathered in one pass over its lines: per device the
// resident bytes (as the manager charges buffers) and their peak against the
// cap of the header's STENSOR_MEMORY_LIMIT, the swap records counted with
// their bytes, the host's waits, the buffers that moved most and the waits
// charged to the kernel launched next, and a ResidentTimeline to plot.
//
// Memory is bounded whatever the log's length: per live buffer state, the
// few freed buffers that may still make the top list, one entry per kernel
// name, and at most kMaxPlotBuckets plot buckets per device.
//
// Thread-safety: plain data; SummarizeLog is reentrant.
#ifndef STENSOR_TOOLS_RUN_SUMMARY_H_
#define STENSOR_TOOLS_RUN_SUMMARY_H_

#include <cstddef>
#include <cstdint>
#include <istream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace stensor {

// At most this many buckets of operations per plotted device.
inline constexpr size_t kMaxPlotBuckets = 2000;

// One bucket of operations on one device.
struct PlotPoint {
  uint64_t max_resident = 0;   // the highest resident bytes within the bucket
  uint64_t last_resident = 0;  // at its end
  uint64_t bytes_in = 0;       // host->device: swap-ins with a copy
  uint64_t bytes_out = 0;      // device->host: swap-outs
};

// Resident bytes and swap traffic per bucket of operations, for every device
// slot, in at most kMaxPlotBuckets buckets: when the log outgrows them,
// adjacent buckets merge (maxima kept, traffic summed) and the width doubles.
class ResidentTimeline {
 public:
  // Device slot `slot`'s resident bytes became `bytes` at operation `op`
  // (ops never decrease from call to call).
  void Resident(uint64_t op, size_t slot, uint64_t bytes);
  // Bytes copied in and out for `slot` at operation `op`.
  void Traffic(uint64_t op, size_t slot, uint64_t in, uint64_t out);
  // Makes the buckets of slots 0 to `slots` - 1 (and any other seen) reach
  // operation `op` (the log's last).
  void Reach(uint64_t op, size_t slots);

  // Operations per bucket: a power of two.
  uint64_t width() const { return width_; }
  size_t buckets() const { return columns_.size(); }
  // Bucket `b` of slot `slot` (zeros before the device appeared).
  PlotPoint Get(size_t b, size_t slot) const {
    return slot < columns_[b].size() ? columns_[b][slot] : PlotPoint{};
  }

 private:
  PlotPoint& At(uint64_t op, size_t slot);
  void Merge();

  uint64_t width_ = 1;
  std::vector<std::vector<PlotPoint>> columns_;  // [bucket][slot]
  std::vector<uint64_t> current_;                // resident bytes now, per slot
};

// A count of records of one kind and the bytes they name.
struct RecordCount {
  uint64_t records = 0;
  uint64_t bytes = 0;
  void Add(uint64_t b) {
    ++records;
    bytes += b;
  }
};

struct BufferSummary {
  uint64_t id = 0;
  uint64_t bytes = 0;   // as the program asked
  uint64_t charge = 0;  // against the cap: whole granules, or pages
  size_t slot = 0;      // index into RunSummary::devices
  bool resident = true;
  uint64_t bytes_out = 0;  // swap-outs
  uint64_t bytes_in = 0;   // swap-ins with a copy
  uint64_t swap_outs = 0;
  uint64_t swap_ins = 0;  // with a copy or not
  uint64_t drops = 0;     // clean and never-written
  uint64_t served = 0;    // operations that reached it in host memory (serve_host)
  int first_kernel = -1;  // index into RunSummary::kernels; -1: never launched with
  uint64_t moved() const { return bytes_out + bytes_in; }
};

struct KernelSummary {
  std::string name;  // demangled where the log has it; "graph H (graph launch)"
  uint64_t launches = 0;
  uint64_t waits = 0;  // swap_wait records charged to it (those before its launches)
  double wait_seconds = 0;
};

struct DeviceSummary {
  int64_t ordinal = 0;
  std::string name;
  uint64_t total_bytes = 0;
  std::optional<uint64_t> cap;  // none when uncapped
  uint64_t resident = 0;        // at the end of the log
  uint64_t peak = 0;
  uint64_t peak_op = 0;  // the operation index the peak was reached at
};

struct RunSummary {
  std::string log;  // the path, as named
  uint64_t pid = 0;
  std::string limit_text;  // STENSOR_MEMORY_LIMIT as the header has it ("" = none)
  std::string policy, prefetch;
  std::vector<DeviceSummary> devices;  // slots, in order of appearance
  uint64_t lines = 0;
  uint64_t operations = 0;  // the program's operation records: the plot's x
  uint64_t launches = 0;
  bool ended = false;  // the `end` record was read
  uint64_t dropped = 0;
  std::optional<uint64_t> live_at_end;

  RecordCount swap_out, swap_in_copy, swap_in_no_copy, drop_clean, drop_unwritten;
  RecordCount pins, ooms, verify_mismatches, table_read_backs;
  // Served from host memory (host-located VMM): `serve_host` records, one
  // per buffer and operation that reached it there (its bytes over the
  // link), the distinct buffers among them, and `alloc_host` records
  // (buffers born in host memory, not charged until brought in).
  RecordCount served_from_host, born_on_host;
  uint64_t served_by_choice = 0;  // serve_host records with by_choice
  uint64_t buffers_served = 0;
  std::map<std::string, std::pair<uint64_t, double>> swap_waits;  // by `what`: count, seconds
  std::pair<uint64_t, double> evict_waits{0, 0}, unknown_waits{0, 0};
  // Swap records that contradict the buffer's state (concurrent threads'
  // records meeting in the log out of order): resident bytes approximate.
  uint64_t inconsistent = 0;

  std::vector<BufferSummary> top_buffers;  // most bytes moved first, at most `top`
  std::vector<KernelSummary> kernels;      // every kernel name launched
  ResidentTimeline timeline;
};

struct SummaryOptions {
  uint64_t granularity = uint64_t{2} << 20;  // VMM granule (tools/workload.h)
  int top = 10;                              // rows of top_buffers
  bool partial = false;                      // accept a log without its `end` record
};

// Reads the log at `path`. An error is one line naming the file and the
// line: a file that cannot be read, a first line that is not a `header`
// record, a line that is not JSON, a record that contradicts the log (a
// buffer allocated twice, a free of one never allocated), no `end` record
// (unless options.partial).
absl::StatusOr<RunSummary> SummarizeLog(const std::string& path, const SummaryOptions& options);
// The same over `in`, named `name` in errors.
absl::StatusOr<RunSummary> SummarizeLog(std::istream& in, const std::string& name,
                                        const SummaryOptions& options);

}  // namespace stensor

#endif  // STENSOR_TOOLS_RUN_SUMMARY_H_
