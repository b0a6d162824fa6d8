#include "tools/run_summary.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <istream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/base/config.h"
#include "nlohmann/json.hpp"
#include "tools/charge.h"
#include "tools/log_json.h"

namespace stensor {

void ResidentTimeline::Resident(uint64_t op, size_t slot, uint64_t bytes) {
  PlotPoint& p = At(op, slot);
  p.max_resident = std::max(p.max_resident, bytes);
  p.last_resident = bytes;
  current_[slot] = bytes;
}

void ResidentTimeline::Traffic(uint64_t op, size_t slot, uint64_t in, uint64_t out) {
  PlotPoint& p = At(op, slot);
  p.bytes_in += in;
  p.bytes_out += out;
}

void ResidentTimeline::Reach(uint64_t op, size_t slots) {
  for (size_t slot = 0; slot < std::max(slots, current_.size()); ++slot) At(op, slot);
}

PlotPoint& ResidentTimeline::At(uint64_t op, size_t slot) {
  if (slot >= current_.size()) current_.resize(slot + 1, 0);
  while (op / width_ >= kMaxPlotBuckets) Merge();
  const size_t b = op / width_;
  while (columns_.size() <= b) {
    std::vector<PlotPoint> column(current_.size());
    for (size_t s = 0; s < current_.size(); ++s) {
      column[s].max_resident = column[s].last_resident = current_[s];
    }
    columns_.push_back(std::move(column));
  }
  std::vector<PlotPoint>& column = columns_[b];
  if (column.size() <= slot) column.resize(slot + 1);
  return column[slot];
}

void ResidentTimeline::Merge() {
  std::vector<std::vector<PlotPoint>> merged((columns_.size() + 1) / 2);
  for (size_t i = 0; i < columns_.size(); ++i) {
    std::vector<PlotPoint>& into = merged[i / 2];
    const std::vector<PlotPoint>& from = columns_[i];
    if (into.size() < from.size()) into.resize(from.size());
    for (size_t s = 0; s < from.size(); ++s) {
      into[s].max_resident = std::max(into[s].max_resident, from[s].max_resident);
      into[s].last_resident = from[s].last_resident;
      into[s].bytes_in += from[s].bytes_in;
      into[s].bytes_out += from[s].bytes_out;
    }
  }
  columns_ = std::move(merged);
  width_ *= 2;
}

namespace {

using Json = nlohmann::json;

std::optional<uint64_t> Uint(const Json& r, const char* key) {
  auto it = r.find(key);
  if (it == r.end() || !it->is_number_unsigned()) return std::nullopt;
  return it->get<uint64_t>();
}

std::optional<double> Number(const Json& r, const char* key) {
  auto it = r.find(key);
  if (it == r.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// A wait's seconds; 0 for a value no clock gives (negative, infinite).
double Seconds(const Json& r) {
  const double s = Number(r, "seconds").value_or(0);
  return std::isfinite(s) && s > 0 ? s : 0;
}

std::string String(const Json& r, const char* key) {
  auto it = r.find(key);
  if (it == r.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

// A header value as text: strings as they are, anything else as JSON.
std::string ValueText(const Json& r, const char* key) {
  auto it = r.find(key);
  if (it == r.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  return it->dump();
}

// No device holds 2^60 bytes; bounding sizes keeps every sum exact.
constexpr uint64_t kMaxBytes = uint64_t{1} << 60;

// `alloc_host` records kept waiting for their `alloc` (a log that never
// brings them stays in bounded memory).
constexpr size_t kMaxPendingBirths = 4096;

class Reader {
 public:
  Reader(std::string log, const SummaryOptions& options)
      : granularity_(options.granularity), top_(options.top) {
    report_.log = std::move(log);
    reads_visitor_ = [this](absl::string_view member, const Json& id) {
      if (member != "reads" || !id.is_number_unsigned()) return;
      auto it = live_.find(id.get<uint64_t>());
      if (it != live_.end() && it->second.first_kernel < 0) launch_reads_.insert(it->first);
    };
  }

  absl::Status Line(absl::string_view text, uint64_t line) {
    report_.lines = line;
    launch_reads_.clear();
    LogLine<Json> parsed = ParseLogLine<Json>(text, reads_visitor_);
    if (!parsed.ok()) {
      if (line == 1) return NotALog(line);
      if (parsed.error->kind == LogJsonError::Kind::kTooDeep) {
        return Error(line, absl::StrCat("not an access-log record (nested deeper than ",
                                        kMaxLogJsonDepth, " levels)"));
      }
      // A syntax error, a number out of range.
      return Error(line, absl::StrCat("not a JSON record (a truncated or corrupt log): ",
                                      Explain(parsed.error->what)));
    }
    Json& r = parsed.record;
    if (!r.is_object() || !r.contains("type") || !r["type"].is_string()) {
      if (line == 1) return NotALog(line);
      return Error(line, "not an access-log record (no \"type\")");
    }
    const std::string type = r["type"].get<std::string>();
    if (line == 1) {
      if (type != "header") return NotALog(line);
      return Header(r, line);
    }
    if (report_.ended) return Error(line, "a record after the `end` record");
    if (absl::Status s = CheckDevice(r, "device", line); !s.ok()) return s;
    if (auto bytes = r.find("bytes");
        bytes != r.end() && bytes->is_number_unsigned() && bytes->get<uint64_t>() > kMaxBytes) {
      return Error(line, absl::StrCat("`", type, "` of more than 2^60 bytes"));
    }
    if (type == "header") return Error(line, "a second `header` record (two logs in one file?)");
    if (type == "end") return End(r);
    if (type == "alloc") return Alloc(r, line);
    if (type == "free") return Free(r, line);
    if (type == "swap_out" || type == "drop_clean" || type == "drop_unwritten") {
      return Evict(type, r, line);
    }
    if (type == "swap_in") return SwapIn(r, line);
    if (type == "serve_host") return ServeHost(r, line);
    if (type == "slab") return Slab(r, line);
    if (type == "slab_alloc") {
      // Its `alloc` follows: charged nothing, its slab is.
      if (in_slabs_.size() < kMaxPendingBirths) in_slabs_.insert(String(r, "addr"));
      return absl::OkStatus();
    }
    if (type == "slab_free") {
      auto it = live_.find(Uint(r, "slab").value_or(0));
      if (it != live_.end()) {
        if (it->second.resident) {
          SetResident(it->second.slot, -static_cast<int64_t>(ResidentCharge(it->second)));
        }
        live_.erase(it);
      }
      return absl::OkStatus();
    }
    if (type == "alloc_host") {
      // Logged as the buffer is made, before its `alloc` record: that
      // record's buffer is not resident (a piece's: that piece of it).
      const uint64_t bytes = Uint(r, "bytes").value_or(0);
      report_.born_on_host.Add(bytes);
      if (std::optional<uint64_t> piece = Uint(r, "piece")) {
        if (born_pieces_.size() < kMaxPendingBirths) {
          born_pieces_[Uint(r, "id").value_or(0)].insert(*piece);
        }
        return absl::OkStatus();
      }
      if (born_on_host_.size() < kMaxPendingBirths) {
        ++born_on_host_[{Uint(r, "device").value_or(0), bytes}];
      }
      return absl::OkStatus();
    }
    if (type == "launch" || type == "graph_launch") return Launch(type, r);
    if (type == "swap_wait") {
      const double s = Seconds(r);
      auto& w = report_.swap_waits[String(r, "what")];
      ++w.first;
      w.second += s;
      pending_wait_ += s;
      ++pending_waits_;
    } else if (type == "evict_wait" || type == "unknown_wait") {
      auto& w = type == "evict_wait" ? report_.evict_waits : report_.unknown_waits;
      ++w.first;
      w.second += Seconds(r);
    } else if (type == "oom") {
      report_.ooms.Add(Uint(r, "bytes").value_or(0));
    } else if (type == "pin") {
      report_.pins.Add(Uint(r, "bytes").value_or(0));
    } else if (type == "verify_mismatch") {
      report_.verify_mismatches.Add(Uint(r, "bytes").value_or(0));
    } else if (type == "table_read_back") {
      report_.table_read_backs.Add(Uint(r, "bytes").value_or(0));
    } else if (type == "memcpy" || type == "memset" || type == "sync" || type == "host_alloc" ||
               type == "host_free") {
      ++report_.operations;
    }
    // graph_instantiate, limitation and record types newer than this reader
    // carry nothing the report shows.
    return absl::OkStatus();
  }

  absl::StatusOr<RunSummary> Finish(bool partial) && {
    if (report_.lines == 0) return Error(1, "an empty file, not an access log");
    if (!report_.ended && !partial) {
      return Error(report_.lines,
                   "the log ends without its `end` record (truncated: the program did not exit "
                   "normally, or the file was cut); --partial reports what is there");
    }
    report_.timeline.Reach(report_.operations == 0 ? 0 : report_.operations - 1,
                           report_.devices.size());
    if (pending_waits_ > 0) {
      KernelSummary& k = Kernel("(no launch after the wait)");
      k.waits += pending_waits_;
      k.wait_seconds += pending_wait_;
    }
    for (auto& [id, b] : live_) freed_.push_back(std::move(b));
    live_.clear();
    Trim(freed_, static_cast<size_t>(top_));
    report_.top_buffers = std::move(freed_);
    return std::move(report_);
  }

 private:
  static std::string Explain(absl::string_view what) {
    // nlohmann's message starts "[json.exception.parse_error.101] "; the rest
    // says where and why.
    if (size_t close = what.find("] "); close != absl::string_view::npos) {
      what.remove_prefix(close + 2);
    }
    // The parser saw one line: its "line 1, " says nothing.
    std::string text(what);
    if (size_t at = text.find("at line 1, column "); at != std::string::npos) {
      text.erase(at + 3, std::strlen("line 1, "));
    }
    return text;
  }

  // One line: control characters from the log's values become spaces.
  absl::Status Error(uint64_t line, absl::string_view what) const {
    std::string text(what);
    for (char& c : text) {
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    }
    return absl::InvalidArgumentError(absl::StrCat(report_.log, ": line ", line, ": ", text));
  }

  absl::Status NotALog(uint64_t line) const {
    return Error(line,
                 "not a stensor access log: its first line must be a `header` record "
                 "(docs/access-log.md)");
  }

  absl::Status Header(const Json& r, uint64_t line) {
    if (Uint(r, "format").value_or(0) != 1) {
      return Error(line, absl::StrCat("access-log format ", ValueText(r, "format"),
                                      "; this report reads format 1"));
    }
    report_.pid = Uint(r, "pid").value_or(0);
    if (auto config = r.find("config"); config != r.end() && config->is_object()) {
      report_.limit_text = ValueText(*config, "STENSOR_MEMORY_LIMIT");
      report_.policy = ValueText(*config, "STENSOR_POLICY");
      report_.prefetch = ValueText(*config, "STENSOR_PREFETCH");
    }
    if (!report_.limit_text.empty()) {
      const std::string text = report_.limit_text;
      absl::StatusOr<Config> parsed = LimitsFromHeader(text, "");
      if (!parsed.ok()) {
        return Error(line,
                     absl::StrCat("STENSOR_MEMORY_LIMIT '", text,
                                  "' in the header does not parse: ", parsed.status().message()));
      }
      memory_limit_ = parsed->memory_limit;
    }
    if (auto devices = r.find("devices"); devices != r.end() && devices->is_array()) {
      for (const Json& d : *devices) {
        if (!d.is_object()) continue;
        if (absl::Status s = CheckDevice(d, "ordinal", line); !s.ok()) return s;
        const size_t slot = Slot(Uint(d, "ordinal").value_or(0));
        report_.devices[slot].name = String(d, "name");
        report_.devices[slot].total_bytes = Uint(d, "total_bytes").value_or(0);
        report_.devices[slot].cap = CapOf(report_.devices[slot]);
      }
    }
    return absl::OkStatus();
  }

  // Device ordinals name at most MemoryLimit::kMaxDevices devices (each is
  // a plot and a column of every bucket).
  absl::Status CheckDevice(const Json& r, const char* key, uint64_t line) const {
    std::optional<uint64_t> ordinal = Uint(r, key);
    if (!ordinal || *ordinal < MemoryLimit::kMaxDevices) return absl::OkStatus();
    return Error(line, absl::StrCat("device ", *ordinal, " is out of range 0..",
                                    MemoryLimit::kMaxDevices - 1));
  }

  std::optional<uint64_t> CapOf(const DeviceSummary& d) const {
    std::optional<size_t> cap = memory_limit_.BytesFor(static_cast<int>(d.ordinal), d.total_bytes);
    // A percentage of a device the header did not describe says nothing.
    if (!cap || (*cap == 0 && d.total_bytes == 0)) return std::nullopt;
    return static_cast<uint64_t>(*cap);
  }

  size_t Slot(uint64_t ordinal) {
    for (size_t i = 0; i < report_.devices.size(); ++i) {
      if (report_.devices[i].ordinal == static_cast<int64_t>(ordinal)) return i;
    }
    DeviceSummary d;
    d.ordinal = static_cast<int64_t>(ordinal);
    d.name = absl::StrCat("device ", ordinal);
    d.cap = CapOf(d);
    report_.devices.push_back(std::move(d));
    return report_.devices.size() - 1;
  }

  void SetResident(size_t slot, int64_t delta) {
    DeviceSummary& d = report_.devices[slot];
    if (delta < 0 && static_cast<uint64_t>(-delta) > d.resident) {
      ++report_.inconsistent;
      d.resident = 0;
    } else if (delta > 0 && d.resident > UINT64_MAX - static_cast<uint64_t>(delta)) {
      ++report_.inconsistent;  // more than 2^64 bytes live: held at the most
      d.resident = UINT64_MAX;
    } else {
      d.resident += delta;
    }
    if (d.resident > d.peak) {
      d.peak = d.resident;
      d.peak_op = report_.operations;
    }
    report_.timeline.Resident(report_.operations, slot, d.resident);
  }

  absl::Status End(const Json& r) {
    report_.ended = true;
    report_.dropped = Uint(r, "dropped").value_or(0);
    report_.live_at_end = Uint(r, "live_buffers");
    return absl::OkStatus();
  }

  absl::Status Alloc(const Json& r, uint64_t line) {
    std::optional<uint64_t> id = Uint(r, "id");
    std::optional<uint64_t> bytes = Uint(r, "bytes");
    if (!id || !bytes) return Error(line, "an `alloc` without `id` or `bytes`");
    BufferSummary b;
    b.id = *id;
    b.bytes = *bytes;
    std::string kind = String(r, "kind");
    if (kind.empty()) kind = "device";
    b.slot = Slot(Uint(r, "device").value_or(0));
    // As the manager charges them (tools/charge.h).
    b.charge = ChargeOf(kind, String(r, "api"), b.bytes, granularity_).bytes;
    if (in_slabs_.erase(String(r, "addr")) > 0) b.charge = 0;  // its slab is charged
    const size_t slot = b.slot;
    // Born in host memory (an `alloc_host` of its device and size came
    // first): charged once brought in.
    if (auto born = born_on_host_.find({Uint(r, "device").value_or(0), b.bytes});
        born != born_on_host_.end()) {
      b.resident = false;
      if (--born->second == 0) born_on_host_.erase(born);
    }
    uint64_t charge = b.resident ? b.charge : 0;
    // Pieces born on the host: the rest of it is resident.
    if (auto born = born_pieces_.find(*id); born != born_pieces_.end() && *id != 0) {
      charge -= std::min(charge, born->second.size() * granularity_);
      pieces_out_[*id] = std::move(born->second);
      born_pieces_.erase(born);
    }
    if (*id == 0) {
      untracked_[String(r, "addr")] = std::move(b);
    } else if (!live_.emplace(*id, std::move(b)).second) {
      return Error(line, absl::StrCat("buffer ", *id, " allocated twice"));
    }
    SetResident(slot, static_cast<int64_t>(charge));
    ++report_.operations;
    return absl::OkStatus();
  }

  // A slab of small allocations (STENSOR_SLABS): one buffer, by its key.
  absl::Status Slab(const Json& r, uint64_t line) {
    std::optional<uint64_t> slab = Uint(r, "slab");
    std::optional<uint64_t> bytes = Uint(r, "bytes");
    if (!slab || !bytes) return Error(line, "a `slab` without `slab` or `bytes`");
    BufferSummary b;
    b.id = *slab;
    b.bytes = b.charge = *bytes;
    b.slot = Slot(Uint(r, "device").value_or(0));
    auto resident = r.find("resident");
    b.resident = resident == r.end() || !resident->is_boolean() || resident->get<bool>();
    const size_t slot = b.slot;
    const uint64_t charge = b.resident ? b.charge : 0;
    if (!live_.emplace(*slab, std::move(b)).second) {
      return Error(line, absl::StrCat("slab ", *slab, " made twice"));
    }
    SetResident(slot, static_cast<int64_t>(charge));
    return absl::OkStatus();
  }

  absl::Status Free(const Json& r, uint64_t line) {
    std::optional<uint64_t> id = Uint(r, "id");
    if (!id) return Error(line, "a `free` without `id`");
    BufferSummary b;
    if (*id == 0) {
      auto it = untracked_.find(String(r, "addr"));
      if (it != untracked_.end()) {
        b = std::move(it->second);
        untracked_.erase(it);
        if (b.resident) SetResident(b.slot, -static_cast<int64_t>(b.charge));
      }
    } else {
      auto it = live_.find(*id);
      if (it == live_.end()) {
        return Error(line, absl::StrCat("a `free` of buffer ", *id, ", never allocated"));
      }
      b = std::move(it->second);
      live_.erase(it);
      if (b.resident) SetResident(b.slot, -static_cast<int64_t>(ResidentCharge(b)));
      pieces_out_.erase(*id);
      if (b.moved() > 0) {
        freed_.push_back(std::move(b));
        if (freed_.size() > 4 * static_cast<size_t>(top_) + 64) {
          Trim(freed_, static_cast<size_t>(top_));
        }
      }
    }
    ++report_.operations;
    return absl::OkStatus();
  }

  absl::Status Evict(const std::string& type, const Json& r, uint64_t line) {
    std::optional<uint64_t> id = Uint(r, "id");
    const uint64_t bytes = Uint(r, "bytes").value_or(0);
    if (!id) return Error(line, absl::StrCat("a `", type, "` without `id`"));
    RecordCount& count = type == "swap_out"     ? report_.swap_out
                         : type == "drop_clean" ? report_.drop_clean
                                                : report_.drop_unwritten;
    count.Add(bytes);
    auto it = live_.find(*id);
    const std::optional<uint64_t> piece = Uint(r, "piece");
    if (it == live_.end() || !it->second.resident ||
        (piece && !pieces_out_[*id].insert(*piece).second)) {
      // Records of concurrent threads can meet in the log out of order; the
      // report says how many did (resident bytes are then approximate).
      ++report_.inconsistent;
      if (type == "swap_out") {
        report_.timeline.Traffic(report_.operations, Slot(Uint(r, "device").value_or(0)), 0, bytes);
      }
      return absl::OkStatus();
    }
    BufferSummary& b = it->second;
    if (!piece) b.resident = false;
    if (type == "swap_out") {
      b.bytes_out += bytes;
      ++b.swap_outs;
      report_.timeline.Traffic(report_.operations, b.slot, 0, bytes);
    } else {
      ++b.drops;
    }
    SetResident(b.slot, -static_cast<int64_t>(piece ? PieceCharge(b, *piece) : b.charge));
    return absl::OkStatus();
  }

  // A piece of an allocation larger than a granule takes one granule (the
  // last one what is left of the charge).
  uint64_t PieceCharge(const BufferSummary& b, uint64_t piece) const {
    return piece < b.charge ? std::min(granularity_, b.charge - piece) : 0;
  }

  // What a resident buffer takes now: its charge less its pieces out.
  uint64_t ResidentCharge(const BufferSummary& b) const {
    auto it = pieces_out_.find(b.id);
    if (it == pieces_out_.end()) return b.charge;
    uint64_t out = 0;
    for (uint64_t piece : it->second) out += PieceCharge(b, piece);
    return b.charge - std::min(b.charge, out);
  }

  absl::Status SwapIn(const Json& r, uint64_t line) {
    std::optional<uint64_t> id = Uint(r, "id");
    const uint64_t bytes = Uint(r, "bytes").value_or(0);
    if (!id) return Error(line, "a `swap_in` without `id`");
    auto copy = r.find("copy");
    const bool copied = copy == r.end() || !copy->is_boolean() || copy->get<bool>();
    (copied ? report_.swap_in_copy : report_.swap_in_no_copy).Add(bytes);
    auto it = live_.find(*id);
    const std::optional<uint64_t> piece = Uint(r, "piece");
    if (it == live_.end() || (piece ? pieces_out_[*id].erase(*piece) == 0 : it->second.resident)) {
      ++report_.inconsistent;
      if (copied) {
        report_.timeline.Traffic(report_.operations, Slot(Uint(r, "device").value_or(0)), bytes, 0);
      }
      return absl::OkStatus();
    }
    BufferSummary& b = it->second;
    b.resident = true;
    ++b.swap_ins;
    if (copied) {
      b.bytes_in += bytes;
      report_.timeline.Traffic(report_.operations, b.slot, bytes, 0);
    }
    SetResident(b.slot, static_cast<int64_t>(piece ? PieceCharge(b, *piece) : b.charge));
    return absl::OkStatus();
  }

  absl::Status ServeHost(const Json& r, uint64_t line) {
    std::optional<uint64_t> id = Uint(r, "id");
    if (!id) return Error(line, "a `serve_host` without `id`");
    report_.served_from_host.Add(Uint(r, "bytes").value_or(0));
    auto choice = r.find("by_choice");
    if (choice != r.end() && choice->is_boolean() && choice->get<bool>()) {
      ++report_.served_by_choice;
    }
    auto it = live_.find(*id);
    if (it == live_.end()) {
      ++report_.inconsistent;
      return absl::OkStatus();
    }
    if (it->second.served++ == 0) ++report_.buffers_served;
    return absl::OkStatus();
  }

  KernelSummary& Kernel(const std::string& name) {
    auto [it, inserted] = kernel_index_.emplace(name, report_.kernels.size());
    if (inserted) report_.kernels.push_back(KernelSummary{name});
    return report_.kernels[it->second];
  }

  absl::Status Launch(const std::string& type, const Json& r) {
    std::string name;
    if (type == "launch") {
      name = String(r, "demangled");
      if (name.empty()) name = String(r, "kernel");
      if (name.empty()) name = "(unnamed kernel)";
    } else {
      name = absl::StrCat("graph ", String(r, "graph"), " (graph launch)");
    }
    KernelSummary& k = Kernel(name);
    const int index = kernel_index_[name];
    ++k.launches;
    k.waits += pending_waits_;
    k.wait_seconds += pending_wait_;
    pending_waits_ = 0;
    pending_wait_ = 0;
    ++report_.launches;
    for (uint64_t id : launch_reads_) live_.at(id).first_kernel = index;
    ++report_.operations;
    return absl::OkStatus();
  }

  // Keeps the `top` buffers that moved most (ties: the lower id first).
  static void Trim(std::vector<BufferSummary>& buffers, size_t top) {
    auto more = [](const BufferSummary& a, const BufferSummary& b) {
      return a.moved() != b.moved() ? a.moved() > b.moved() : a.id < b.id;
    };
    buffers.erase(std::remove_if(buffers.begin(), buffers.end(),
                                 [](const BufferSummary& b) { return b.moved() == 0; }),
                  buffers.end());
    const size_t n = std::min(top, buffers.size());
    std::partial_sort(buffers.begin(), buffers.begin() + n, buffers.end(), more);
    buffers.resize(n);
  }

  const uint64_t granularity_;
  const int top_;
  MemoryLimit memory_limit_;
  RunSummary report_;
  absl::flat_hash_map<uint64_t, BufferSummary> live_;          // by id
  absl::flat_hash_map<std::string, BufferSummary> untracked_;  // id 0, by address
  std::vector<BufferSummary> freed_;  // buffers that moved bytes, trimmed to the top now and then
  // `alloc_host` records whose `alloc` has not come yet, by (device,
  // bytes): at most one per thread allocating at once.
  std::map<std::pair<uint64_t, uint64_t>, uint64_t> born_on_host_;
  // Of allocations made of pieces (records with a `piece`): the pieces born
  // on the host before the `alloc` record, and those out of live buffers,
  // by id.
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> born_pieces_;
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> pieces_out_;
  // Addresses of small allocations placed in slabs (`slab_alloc`) whose
  // `alloc` has not come yet.
  absl::flat_hash_set<std::string> in_slabs_;
  absl::flat_hash_map<std::string, int> kernel_index_;  // into report_.kernels
  // Live buffers in the line's `reads` never launched with yet, taken as
  // the line is parsed (a launch may list millions of ids: log_json.h).
  absl::flat_hash_set<uint64_t> launch_reads_;
  LogArrayVisitor<Json> reads_visitor_;
  double pending_wait_ = 0;  // swap_wait seconds not yet followed by a launch
  uint64_t pending_waits_ = 0;
};

}  // namespace

absl::StatusOr<RunSummary> SummarizeLog(std::istream& in, const std::string& name,
                                        const SummaryOptions& options) {
  Reader reader(name, options);
  std::string text;
  uint64_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (absl::Status s = reader.Line(text, line); !s.ok()) return s;
  }
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat(name, ": line ", line + 1, ": cannot read: ", std::strerror(errno)));
  }
  return std::move(reader).Finish(options.partial);
}

absl::StatusOr<RunSummary> SummarizeLog(const std::string& path, const SummaryOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open access log ", path, ": ", std::strerror(errno)));
  }
  return SummarizeLog(in, path, options);
}

}  // namespace stensor
