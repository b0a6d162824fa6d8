#include "tools/chrome_trace.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/config.h"
#include "nlohmann/json.hpp"
#include "tools/charge.h"
#include "tools/log_json.h"

namespace stensor {
namespace {

using json = nlohmann::json;

constexpr char kUsage[] =
    "usage: stensor trace LOG -o TRACE.json [--op-us US]   (--help for more)\n";

constexpr char kHelp[] = R"(usage: stensor trace LOG -o TRACE.json [--op-us US]

Turns an access log (STENSOR_ACCESS_LOG=PATH, docs/access-log.md) into a trace
in the Chrome trace event format. Open it in Perfetto (ui.perfetto.dev, "Open
trace file") or in chrome://tracing. docs/trace.md describes what is shown.

  LOG               the access log; - reads standard input, so a compressed
                    log needs no copy: gzip -dc LOG.gz | stensor trace - -o T
  -o, --output FILE where the trace goes (required); - is standard output
  --op-us US        how long one operation lasts on the trace's clock, in
                    microseconds (default 10); a launch whose record has
                    compute_us lasts that long instead
  -h, --help        this text

The log has no timestamps, so the trace runs on a logical clock: operations
follow each other in log order, each lasting --op-us. Durations and gaps are
not the ones of the run; the order, the overlap of swaps with the work that
needed them and the memory curves are.

Tracks: one per CUDA stream (kernels named by their demangled names, copies,
memsets, graph launches; synchronisations as instants), "swap" (stensor's
swap-ins, swap-outs, clean and never-written drops and waits; OOMs, pins and
limitations as instants) and "host" (allocations and frees as instants).
Counters per device: resident bytes (tracked allocations whose device memory
is mapped, charged as the library charges them: whole 2 MiB granules for
cuMemAlloc buffers of a granule or more, 4 KiB pages otherwise), the cap (STENSOR_MEMORY_LIMIT from the log's header, percentages
of the device's memory) and host copies (bytes of buffers with a host copy
made by a swap-out); besides, the program's own pinned host memory and
STENSOR_HOST_LIMIT when it is a byte count.

A log over 64 MiB (or read from a pipe) gets a progress line on stderr
every 64 MiB.

Exit status: 0 done; 1 the log could not be read, is truncated or is not an
access log (one line naming the file and the line), or the trace could not
be written; 2 bad arguments.
)";

// Thread ids of the fixed tracks; streams get kFirstStreamTid and up in the
// order they appear.
constexpr int kHostTid = 1;
constexpr int kSwapTid = 2;
constexpr int kFirstStreamTid = 10;

absl::Status BadFlag(absl::string_view flag, absl::string_view value, absl::string_view forms) {
  return absl::InvalidArgumentError(
      absl::StrCat("stensor trace: ", flag, " '", value, "' is not valid; expected ", forms));
}

// A nlohmann exception's message without its "[json.exception.x.n] ".
std::string ExceptionText(std::string what) {
  if (size_t close = what.find("] ");
      what.rfind("[json.exception", 0) == 0 && close != std::string::npos) {
    what.erase(0, close + 2);
  }
  return what;
}
std::string ExceptionText(const json::exception& e) { return ExceptionText(e.what()); }

uint64_t ParseAddr(const json& value) {
  if (!value.is_string()) return 0;
  const std::string& s = value.get_ref<const std::string&>();
  errno = 0;
  char* end = nullptr;
  uint64_t addr = std::strtoull(s.c_str(), &end, 16);
  return errno == 0 && end != s.c_str() && *end == '\0' ? addr : 0;
}

std::string MiBText(uint64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

// A field of the wrong type or range (a number nlohmann::json would convert
// with undefined behaviour, a float where a count belongs).
struct BadField {
  std::string what;
};

// r[key] as an unsigned integer; `fallback` when there is no such field.
uint64_t Uint(const json& r, const char* key, std::optional<uint64_t> fallback = std::nullopt) {
  auto it = r.find(key);
  if (it == r.end()) {
    if (fallback) return *fallback;
    throw BadField{absl::StrCat("no \"", key, "\"")};
  }
  if (!it->is_number_unsigned()) {
    throw BadField{absl::StrCat("\"", key, "\" is not a count: ", it->dump())};
  }
  return it->get<uint64_t>();
}

// r[key] as a device ordinal (0 when absent).
int Ordinal(const json& r, const char* key) {
  const uint64_t ordinal = Uint(r, key, 0);
  if (ordinal > 1024) throw BadField{absl::StrCat("\"", key, "\" is not a device: ", ordinal)};
  return static_cast<int>(ordinal);
}

// One access log turned into trace events, record by record.
class Converter {
 public:
  Converter(absl::string_view log_name, const ChromeTraceOptions& options, std::ostream& out)
      : log_name_(log_name), options_(options), out_(out) {}

  // Line 1: must be a header. Writes the trace's opening and metadata.
  absl::Status Header(const json& r) {
    if (!r.is_object() || r.value("type", json()) != "header" || !r.contains("format")) {
      return absl::InvalidArgumentError(
          absl::StrCat(log_name_,
                       ":1: not a stensor access log: the first line is not a \"header\" "
                       "record with a \"format\" (docs/access-log.md)"));
    }
    if (r["format"] != 1) {
      return absl::InvalidArgumentError(absl::StrCat(log_name_, ":1: access log format ",
                                                     r["format"].dump(),
                                                     "; this stensor reads format 1"));
    }
    pid_ = Uint(r, "pid", 0);
    std::string memory_limit, host_limit;
    if (const json& config = r.value("config", json::object()); config.is_object()) {
      memory_limit = config.value("STENSOR_MEMORY_LIMIT", "");
      host_limit = config.value("STENSOR_HOST_LIMIT", "");
    }
    // The caps as the library reads them (core/base/config.h), from the header's
    // canonical values.
    absl::StatusOr<Config> config = LimitsFromHeader(memory_limit, host_limit);
    if (config.ok()) {
      limit_ = config->memory_limit;
      if (config->host_limit && config->host_limit->unit == MemoryAmount::Unit::kBytes) {
        host_limit_ = config->host_limit->value;
      }
    } else {
      notes_.push_back(absl::StrCat("the header's limits do not parse (", config.status().message(),
                                    "): no cap shown"));
    }
    memory_limit_text_ = memory_limit;
    if (config.ok() && config->host_limit && !host_limit_) {
      notes_.push_back(absl::StrCat("STENSOR_HOST_LIMIT=", host_limit,
                                    " is a share of host memory, which the log does not "
                                    "record: not shown"));
    }

    out_ << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    std::string process = absl::StrCat("stensor access log, pid ", pid_);
    Metadata("process_name", 0, {{"name", process}});
    Metadata("process_labels", 0,
             {{"labels", absl::StrFormat("logical clock: one operation = %g us, in log order",
                                         options_.op_us)}});
    Thread(kHostTid, "host (allocations, frees)", 1000);
    Thread(kSwapTid, "swap (stensor)", 1001);
    if (const json& devices = r.value("devices", json::array()); devices.is_array()) {
      for (const json& d : devices) {
        if (!d.is_object()) continue;
        Device(Ordinal(d, "ordinal"), Uint(d, "total_bytes", 0));
      }
    }
    if (host_limit_) Counter("host limit", *host_limit_);
    return absl::OkStatus();
  }

  // What the parse of the next record left out of its DOM (tools/log_json.h).
  void SetLeftOut(std::vector<std::pair<std::string, uint64_t>> left_out) {
    left_out_ = std::move(left_out);
  }

  // Any later line. Throws json::exception or BadField on a field of the
  // wrong type.
  absl::Status Record(const json& r, uint64_t line) {
    if (!r.is_object() || !r.contains("type") || !r["type"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(log_name_, ":", line, ": not an access-log record (no \"type\")"));
    }
    line_ = line;
    const std::string& type = r["type"].get_ref<const std::string&>();
    if (type == "launch") {
      std::string name = r.value("demangled", "");
      if (name.empty()) name = r.value("kernel", "");
      if (name.empty()) name = "launch";
      double dur = options_.op_us;
      // A logged compute time, if it is one (up to 1000 s).
      if (const json& c = r.value("compute_us", json());
          c.is_number() && c.get<double>() >= 0 && c.get<double>() <= 1e9) {
        dur = c.get<double>();
      }
      StreamOp(r, name, "kernel", dur);
    } else if (type == "memcpy") {
      StreamOp(r, absl::StrCat("memcpy ", r.value("kind", "")), "memcpy", options_.op_us);
    } else if (type == "memset") {
      StreamOp(r, "memset", "memset", options_.op_us);
    } else if (type == "graph_launch") {
      StreamOp(r, absl::StrCat("graph ", r.value("graph", "")), "graph", options_.op_us);
    } else if (type == "sync") {
      const int tid = r.contains("stream") ? StreamTid(r["stream"]) : kHostTid;
      Instant(tid, r.value("api", "sync"), "sync", ArgsOf(r, line_));
    } else if (type == "alloc") {
      Alloc(r);
    } else if (type == "free") {
      Free(r);
    } else if (type == "host_alloc" || type == "host_free") {
      const uint64_t bytes = Uint(r, "bytes", 0);
      if (type == "host_alloc") {
        program_pinned_ += bytes;
      } else {
        program_pinned_ -= std::min(bytes, program_pinned_);
      }
      Instant(kHostTid, type, "host", ArgsOf(r, line_));
      Counter("program pinned host", program_pinned_);
    } else if (type == "swap_out" || type == "drop_clean" || type == "drop_unwritten" ||
               type == "swap_in") {
      Swap(r, type);
    } else if (type == "slab") {
      // A slab of small allocations (STENSOR_SLABS): charged as one buffer.
      BufferState b;
      b.bytes = b.charge = Uint(r, "bytes");
      b.device = Ordinal(r, "device");
      b.resident = r.value("resident", true);
      DeviceState& d = Device(b.device, 0);
      if (b.resident) d.resident += b.charge;
      buffers_[Uint(r, "slab")] = std::move(b);
      Counter(DeviceCounter(Ordinal(r, "device"), "resident"), d.resident);
    } else if (type == "slab_alloc") {
      in_slabs_.insert(ParseAddr(r.value("addr", json())));  // its `alloc` is charged nothing
    } else if (type == "slab_free") {
      if (auto it = buffers_.find(Uint(r, "slab")); it != buffers_.end()) {
        Release(it->second);
        buffers_.erase(it);
      }
    } else if (type == "alloc_host" && r.contains("piece")) {
      // A piece born on the host, before its allocation's `alloc` record.
      born_pieces_[Uint(r, "id", 0)].insert(Uint(r, "piece", 0));
    } else if (type == "evict_wait" || type == "unknown_wait" || type == "swap_wait") {
      std::string name = type == "evict_wait" ? "evict wait"
                         : type == "unknown_wait"
                             ? "unknown-access wait"
                             : absl::StrCat("swap wait (", r.value("what", ""), ")");
      if (r.contains("id")) absl::StrAppend(&name, " #", Uint(r, "id"));
      Slice(kSwapTid, name, type, options_.op_us, ArgsOf(r, line_));
    } else if (type == "oom" || type == "pin" || type == "limitation" ||
               type == "table_read_back" || type == "verify_mismatch" ||
               type == "graph_instantiate") {
      Instant(type == "graph_instantiate" ? kHostTid : kSwapTid, type, type, ArgsOf(r, line_));
    } else if (type == "end") {
      ended_ = true;
      dropped_ = Uint(r, "dropped", 0);
      Instant(kHostTid, "end", "end", ArgsOf(r, line_));
    } else if (type == "header") {
      return absl::InvalidArgumentError(absl::StrCat(
          log_name_, ":", line, ": a second \"header\" record (two logs in one file?)"));
    }
    // Other types are from a newer library: skipped.
    return absl::OkStatus();
  }

  // Closes the trace: the counters carried to the last moment, the metadata.
  void Finish(uint64_t lines) {
    for (auto& [ordinal, d] : devices_) {
      Counter(DeviceCounter(ordinal, "resident"), d.resident);
      if (d.cap) Counter(DeviceCounter(ordinal, "cap"), *d.cap);
    }
    if (host_limit_) Counter("host limit", *host_limit_);
    json other = {
        {"source", log_name_},
        {"pid", pid_},
        {"clock", absl::StrFormat("logical: the access log has no timestamps; every operation "
                                  "lasts %g us (a launch its compute_us if logged), in log order",
                                  options_.op_us)},
        {"STENSOR_MEMORY_LIMIT", memory_limit_text_},
        {"lines", lines},
        {"complete", ended_},
    };
    if (!notes_.empty()) other["notes"] = notes_;
    out_ << "\n],\n\"otherData\":" << Dump(other) << "}\n";
  }

  uint64_t events() const { return events_; }
  bool ended() const { return ended_; }
  uint64_t dropped() const { return dropped_; }

 private:
  struct BufferState {
    uint64_t bytes = 0;   // as the program asked
    uint64_t charge = 0;  // resident, as the manager charges it (tools/charge.h)
    int device = 0;
    bool resident = true;
    bool host_copy = false;
    // Of an allocation made of pieces (records with a `piece`): those out,
    // and those with a host copy, by offset.
    absl::flat_hash_set<uint64_t> pieces_out;
    absl::flat_hash_set<uint64_t> pieces_copied;
    uint64_t piece_copy_bytes = 0;
    // A piece takes one granule (the last what is left of the charge).
    uint64_t PieceCharge(uint64_t piece) const {
      return piece < charge ? std::min(kDefaultGranularity, charge - piece) : 0;
    }
    uint64_t ResidentCharge() const {
      uint64_t out = 0;
      for (uint64_t piece : pieces_out) out += PieceCharge(piece);
      return resident ? charge - std::min(charge, out) : 0;
    }
  };
  struct DeviceState {
    uint64_t resident = 0;
    uint64_t host_copies = 0;
    std::optional<uint64_t> cap;
  };

  // The record's fields but `type`, as an event's args; `line` besides, so
  // a slice leads back to the log, and for a list cut short (log_json.h:
  // the first kMaxLogJsonElements kept) how many elements are not shown.
  json ArgsOf(const json& record, uint64_t line) const {
    json args = record;
    args.erase("type");
    args["line"] = line;
    for (const auto& [member, count] : left_out_) {
      if (!member.empty()) args[absl::StrCat(member, "_not_shown")] = count;
    }
    return args;
  }

  static std::string Dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  }

  void Emit(const json& event) {
    if (events_++ > 0) out_ << ",\n";
    out_ << Dump(event);
  }

  void Metadata(const char* name, int tid, json args) {
    Emit({{"ph", "M"}, {"name", name}, {"pid", pid_}, {"tid", tid}, {"args", std::move(args)}});
  }

  void Thread(int tid, const std::string& name, int sort_index) {
    Metadata("thread_name", tid, {{"name", name}});
    Metadata("thread_sort_index", tid, {{"sort_index", sort_index}});
  }

  void Slice(int tid, const std::string& name, const std::string& cat, double dur, json args) {
    Emit({{"ph", "X"},
          {"name", name},
          {"cat", cat},
          {"pid", pid_},
          {"tid", tid},
          {"ts", now_},
          {"dur", dur},
          {"args", std::move(args)}});
    now_ += dur;
  }

  void Instant(int tid, const std::string& name, const std::string& cat, json args) {
    Emit({{"ph", "i"},
          {"s", "t"},
          {"name", name},
          {"cat", cat},
          {"pid", pid_},
          {"tid", tid},
          {"ts", now_},
          {"args", std::move(args)}});
  }

  void Counter(const std::string& name, uint64_t bytes) {
    Emit({{"ph", "C"}, {"name", name}, {"pid", pid_}, {"ts", now_}, {"args", {{"bytes", bytes}}}});
  }

  static std::string DeviceCounter(int ordinal, absl::string_view what) {
    return absl::StrCat("device ", ordinal, " ", what);
  }

  // The device's state, made (with its counters at their start) when first
  // named; `total` is its memory when the header says (0: unknown).
  DeviceState& Device(int ordinal, uint64_t total) {
    auto [it, added] = devices_.try_emplace(ordinal);
    if (!added) return it->second;
    DeviceState& d = it->second;
    if (limit_.all_devices || limit_.per_device.count(ordinal)) {
      const MemoryAmount& amount =
          limit_.all_devices ? *limit_.all_devices : limit_.per_device.at(ordinal);
      if (amount.unit == MemoryAmount::Unit::kBytes || total > 0) {
        d.cap = limit_.BytesFor(ordinal, total);
      } else {
        notes_.push_back(absl::StrCat("device ", ordinal,
                                      ": a percentage cap of a device the header does not "
                                      "list: not shown"));
      }
    }
    Counter(DeviceCounter(ordinal, "resident"), 0);
    Counter(DeviceCounter(ordinal, "host copies"), 0);
    if (d.cap) Counter(DeviceCounter(ordinal, "cap"), *d.cap);
    return d;
  }

  int StreamTid(const json& stream) {
    std::string name = stream.is_string() ? stream.get<std::string>() : stream.dump();
    auto [it, added] =
        streams_.try_emplace(name, kFirstStreamTid + static_cast<int>(streams_.size()));
    if (added) {
      const std::string label = name == "legacy"       ? "stream legacy (default)"
                                : name == "per_thread" ? "stream per-thread (default)"
                                                       : absl::StrCat("stream ", name);
      Thread(it->second, label, it->second);
    }
    return it->second;
  }

  // A launch, copy, memset or graph launch on its stream; one captured into
  // a graph does not run, so it is an instant.
  void StreamOp(const json& r, const std::string& name, const std::string& cat, double dur) {
    const int tid = StreamTid(r.value("stream", json("legacy")));
    if (r.value("captured", false)) {
      Instant(tid, absl::StrCat("captured: ", name), cat, ArgsOf(r, line_));
      return;
    }
    Slice(tid, name, cat, dur, ArgsOf(r, line_));
  }

  // The live buffer `r` names: by id, or by address for an untracked one.
  BufferState* Find(const json& r) {
    const uint64_t id = Uint(r, "id", 0);
    if (id != 0) {
      auto it = buffers_.find(id);
      return it == buffers_.end() ? nullptr : &it->second;
    }
    auto it = untracked_.find(ParseAddr(r.value("addr", json())));
    return it == untracked_.end() ? nullptr : &it->second;
  }

  void Alloc(const json& r) {
    const uint64_t id = Uint(r, "id");
    BufferState b;
    b.bytes = Uint(r, "bytes");
    b.charge =
        ChargeOf(r.value("kind", std::string()), r.value("api", std::string()), b.bytes).bytes;
    if (in_slabs_.erase(ParseAddr(r.value("addr", json()))) > 0) b.charge = 0;  // its slab's
    b.device = Ordinal(r, "device");
    // An id reused (not done by the library) replaces the old buffer.
    if (BufferState* old = Find(r)) Release(*old);
    if (auto born = born_pieces_.find(id); born != born_pieces_.end() && id != 0) {
      b.pieces_out = std::move(born->second);
      born_pieces_.erase(born);
    }
    const uint64_t charge = b.ResidentCharge();
    if (id != 0) {
      buffers_[id] = std::move(b);
    } else {
      untracked_[ParseAddr(r.value("addr", json()))] = std::move(b);
    }
    DeviceState& d = Device(Ordinal(r, "device"), 0);
    d.resident += charge;
    Instant(kHostTid, absl::StrCat("alloc #", id), "alloc", ArgsOf(r, line_));
    Counter(DeviceCounter(Ordinal(r, "device"), "resident"), d.resident);
  }

  void Free(const json& r) {
    const uint64_t id = Uint(r, "id", 0);
    Instant(kHostTid, absl::StrCat("free #", id), "free", ArgsOf(r, line_));
    BufferState* b = Find(r);
    if (b == nullptr) return;
    Release(*b);
    if (id != 0) {
      buffers_.erase(id);
    } else {
      untracked_.erase(ParseAddr(r.value("addr", json())));
    }
  }

  // Takes a buffer that goes away off its device's counters.
  void Release(const BufferState& b) {
    DeviceState& d = Device(b.device, 0);
    if (b.resident) {
      d.resident -= std::min(b.ResidentCharge(), d.resident);
      Counter(DeviceCounter(b.device, "resident"), d.resident);
    }
    if (b.host_copy || b.piece_copy_bytes > 0) {
      d.host_copies -= std::min(b.host_copy ? b.bytes : b.piece_copy_bytes, d.host_copies);
      Counter(DeviceCounter(b.device, "host copies"), d.host_copies);
    }
  }

  void Swap(const json& r, const std::string& type) {
    const uint64_t id = Uint(r, "id");
    const uint64_t bytes = Uint(r, "bytes");
    const int device = Ordinal(r, "device");
    const bool in = type == "swap_in";
    const std::string name = type == "swap_in"      ? "swap-in"
                             : type == "swap_out"   ? "swap-out"
                             : type == "drop_clean" ? "drop clean"
                                                    : "drop unwritten";
    DeviceState& d = Device(device, 0);
    // Counters change as the slice starts: the memory is taken (or given
    // back) when the record is written.
    auto it = buffers_.find(id);
    BufferState* b = it == buffers_.end() ? nullptr : &it->second;
    if (b != nullptr && r.contains("piece")) {
      SwapPiece(*b, Uint(r, "piece", 0), bytes, device, type);
    } else if (b == nullptr || b->resident != in) {
      const uint64_t charge = b != nullptr ? b->charge : bytes;
      if (in) {
        d.resident += charge;
      } else {
        d.resident -= std::min(charge, d.resident);
      }
      Counter(DeviceCounter(device, "resident"), d.resident);
      if (b != nullptr) b->resident = in;
    }
    // A swap-out made a host copy; a clean drop had one (kept until freed).
    if (b != nullptr && !r.contains("piece") && !b->host_copy &&
        (type == "swap_out" || type == "drop_clean")) {
      b->host_copy = true;
      d.host_copies += b->bytes;
      Counter(DeviceCounter(device, "host copies"), d.host_copies);
    }
    json args = ArgsOf(r, line_);
    args["size"] = MiBText(bytes);
    Slice(kSwapTid, absl::StrCat(name, " #", id), type, options_.op_us, std::move(args));
  }

  // Swap of one piece of an allocation: its granule comes or goes.
  void SwapPiece(BufferState& b, uint64_t piece, uint64_t bytes, int device,
                 const std::string& type) {
    DeviceState& d = Device(device, 0);
    const bool in = type == "swap_in";
    const bool changed = in ? b.pieces_out.erase(piece) > 0 : b.pieces_out.insert(piece).second;
    if (changed && b.resident) {
      const uint64_t charge = b.PieceCharge(piece);
      d.resident = in ? d.resident + charge : d.resident - std::min(charge, d.resident);
      Counter(DeviceCounter(device, "resident"), d.resident);
    }
    if ((type == "swap_out" || type == "drop_clean") && b.pieces_copied.insert(piece).second) {
      b.piece_copy_bytes += bytes;
      d.host_copies += bytes;
      Counter(DeviceCounter(device, "host copies"), d.host_copies);
    }
  }

  const std::string log_name_;
  const ChromeTraceOptions options_;
  std::ostream& out_;

  uint64_t pid_ = 0;
  MemoryLimit limit_;
  std::string memory_limit_text_;
  std::optional<uint64_t> host_limit_;
  std::vector<std::string> notes_;
  // Pieces born on the host whose allocation's `alloc` has not come yet.
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> born_pieces_;
  // Addresses of small allocations placed in slabs (`slab_alloc`) whose
  // `alloc` has not come yet.
  absl::flat_hash_set<uint64_t> in_slabs_;

  double now_ = 0;  // the logical clock, us
  uint64_t line_ = 0;
  uint64_t events_ = 0;
  bool ended_ = false;
  uint64_t dropped_ = 0;
  uint64_t program_pinned_ = 0;
  std::vector<std::pair<std::string, uint64_t>> left_out_;  // of the record at hand

  std::map<int, DeviceState> devices_;
  std::map<std::string, int> streams_;
  absl::flat_hash_map<uint64_t, BufferState> buffers_;
  absl::flat_hash_map<uint64_t, BufferState> untracked_;  // id 0, by address
};

// The error for a record with a field of the wrong type.
absl::Status Malformed(absl::string_view log_name, uint64_t line, const json& record,
                       absl::string_view what) {
  const json type = record.is_object() ? record.value("type", json()) : json();
  return absl::InvalidArgumentError(absl::StrCat(log_name, ":", line, ": a malformed ",
                                                 type.is_string() ? type.dump() : "",
                                                 " record: ", what));
}

}  // namespace

absl::StatusOr<TraceFlags> ParseTraceFlags(const std::vector<std::string>& args) {
  TraceFlags flags;
  bool have_log = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-" || a.empty() || a[0] != '-') {
      if (have_log) {
        return absl::InvalidArgumentError(
            absl::StrCat("stensor trace: one log only ('", flags.log, "' and '", a, "')"));
      }
      flags.log = a;
      have_log = true;
      continue;
    }
    std::string name = a, value;
    if (size_t eq = name.find('='); eq != std::string::npos && name.rfind("--", 0) == 0) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else if (name == "-o" || name == "--output" || name == "--op-us") {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("stensor trace: ", name, " needs a value"));
      }
      value = args[++i];
    }
    if (name == "-o" || name == "--output") {
      if (value.empty()) return BadFlag(name, value, "a file name, or - for standard output");
      flags.output = value;
    } else if (name == "--op-us") {
      if (!absl::SimpleAtod(value, &flags.op_us) || !(flags.op_us > 0) ||
          !std::isfinite(flags.op_us)) {
        return BadFlag("--op-us", value, "a positive number of microseconds");
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("stensor trace: unknown flag ", a));
    }
  }
  if (!have_log || flags.log.empty()) {
    return absl::InvalidArgumentError("stensor trace: no access log given");
  }
  if (flags.output.empty()) {
    return absl::InvalidArgumentError("stensor trace: -o FILE is required (- for standard output)");
  }
  return flags;
}

absl::StatusOr<ChromeTraceSummary> WriteChromeTrace(std::istream& in, absl::string_view log_name,
                                                    const ChromeTraceOptions& options,
                                                    std::ostream& out, std::ostream& progress) {
  Converter converter(log_name, options, out);
  ChromeTraceSummary summary;
  // An input of unknown size (a pipe) is reported on as it goes.
  const bool report = options.progress_every > 0 &&
                      (options.input_bytes == 0 || options.input_bytes > options.progress_every);
  uint64_t read = 0, next_report = options.progress_every;
  std::string line;
  while (std::getline(in, line)) {
    ++summary.lines;
    read += line.size() + 1;
    LogLine<json> parsed = ParseLogLine<json>(line);
    if (!parsed.ok()) {
      const LogJsonError& e = *parsed.error;
      if (e.kind == LogJsonError::Kind::kTooDeep) {
        return absl::InvalidArgumentError(absl::StrCat(log_name, ":", summary.lines,
                                                       ": not an access-log record (nested over ",
                                                       kMaxLogJsonDepth, " levels deep)"));
      }
      if (summary.lines == 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(log_name,
                         ":1: not a stensor access log: the first line is not a JSON "
                         "record (",
                         ExceptionText(e.what), ")"));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          log_name, ":", summary.lines, ": not a complete JSON record",
          in.eof() ? " (the log ends mid-line: truncated?)" : "", ": ", ExceptionText(e.what)));
    }
    const json& record = parsed.record;
    converter.SetLeftOut(std::move(parsed.left_out));
    absl::Status status;
    try {
      status =
          summary.lines == 1 ? converter.Header(record) : converter.Record(record, summary.lines);
    } catch (const BadField& e) {
      status = Malformed(log_name, summary.lines, record, e.what);
    } catch (const json::exception& e) {
      status = Malformed(log_name, summary.lines, record, ExceptionText(e));
    }
    if (!status.ok()) return status;
    if (report && read >= next_report) {
      if (options.input_bytes > 0) {
        progress << absl::StrFormat("stensor trace: %s: %u of %u MiB read\n", log_name, read >> 20,
                                    options.input_bytes >> 20);
      } else {
        progress << absl::StrFormat("stensor trace: %s: %u MiB read\n", log_name, read >> 20);
      }
      while (next_report <= read) next_report += options.progress_every;
    }
  }
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat(log_name, ": read failed after line ", summary.lines,
                                            ": ", std::strerror(errno)));
  }
  if (summary.lines == 0) {
    return absl::InvalidArgumentError(absl::StrCat(log_name, ": empty: not a stensor access log"));
  }
  converter.Finish(summary.lines);
  summary.events = converter.events();
  summary.ended = converter.ended();
  summary.dropped = converter.dropped();
  return summary;
}

int RunTrace(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      out << kHelp;
      return 0;
    }
  }
  absl::StatusOr<TraceFlags> flags = ParseTraceFlags(args);
  if (!flags.ok()) {
    err << flags.status().message() << "\n" << kUsage;
    return 2;
  }
  std::ifstream file;
  std::istream* in = &std::cin;
  ChromeTraceOptions options;
  options.op_us = flags->op_us;
  if (flags->log != "-") {
    file.open(flags->log, std::ios::binary);
    if (!file) {
      err << "stensor trace: " << flags->log << ": cannot open: " << std::strerror(errno) << "\n";
      return 1;
    }
    struct stat st;
    if (stat(flags->log.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      options.input_bytes = st.st_size;
      // -o the log itself would empty it before it is read.
      struct stat out_st;
      if (flags->output != "-" && stat(flags->output.c_str(), &out_st) == 0 &&
          out_st.st_dev == st.st_dev && out_st.st_ino == st.st_ino) {
        err << "stensor trace: -o " << flags->output << " is the log itself\n" << kUsage;
        return 2;
      }
    }
    in = &file;
  }
  const bool to_stdout = flags->output == "-";
  std::ofstream trace_file;
  if (!to_stdout) {
    trace_file.open(flags->output, std::ios::binary | std::ios::trunc);
    if (!trace_file) {
      err << "stensor trace: " << flags->output << ": cannot write: " << std::strerror(errno)
          << "\n";
      return 1;
    }
  }
  std::ostream& trace_out = to_stdout ? out : trace_file;
  const std::string log_name = flags->log == "-" ? "(standard input)" : flags->log;
  absl::StatusOr<ChromeTraceSummary> summary =
      WriteChromeTrace(*in, log_name, options, trace_out, err);
  trace_out.flush();
  if (!to_stdout) trace_file.close();
  if (summary.ok() && !trace_out) {
    summary = absl::DataLossError(absl::StrCat(flags->output, ": write failed"));
  }
  if (!summary.ok()) {
    // Half a trace is not one: the file goes.
    if (!to_stdout) std::remove(flags->output.c_str());
    err << "stensor trace: " << summary.status().message() << "\n";
    return 1;
  }
  if (!summary->ended) {
    err << "stensor trace: " << log_name << ": no \"end\" record after line " << summary->lines
        << " (the program did not exit normally?); the trace shows what was logged\n";
  }
  if (summary->dropped > 0) {
    err << "stensor trace: " << log_name << ": " << summary->dropped
        << " records were lost when the log was written; counters may be off\n";
  }
  return 0;
}

}  // namespace stensor
