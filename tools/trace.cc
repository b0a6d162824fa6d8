#include "tools/trace.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tools/json_reader.h"

namespace stensor {
namespace {


// Ids for untracked allocations, far above any the library assigns; a log
// naming one is rejected, so they never meet the log's own.
constexpr uint64_t kUntrackedBase = uint64_t{1} << 62;

// The iteration detector's key of an operation: a hash of what stays the
// same from one training step to the next. Never 0 (0 means "not observed").
uint64_t OpKey(const JsonValue& r, absl::string_view type) {
  std::string text(type);
  for (absl::string_view field : {"kernel", "kind", "api", "graph"}) {
    absl::StrAppend(&text, "|", r.StringOr(field, ""));
  }
  absl::StrAppend(&text, "|", r.Uint("bytes").value_or(0));
  for (absl::string_view field : {"grid", "block"}) {
    if (const JsonValue* dims = r.Find(field); dims != nullptr) {
      for (const JsonValue& d : dims->array) absl::StrAppend(&text, ",", d.uint.value_or(0));
    }
  }
  const uint64_t h = std::hash<std::string>()(text);
  return h == 0 ? 1 : h;
}

std::optional<uint64_t> HexAddress(const JsonValue& record, absl::string_view key) {
  absl::string_view text = record.StringOr(key, "");
  if (text.substr(0, 2) != "0x") return std::nullopt;
  uint64_t value = 0;
  if (!absl::SimpleHexAtoi(text.substr(2), &value)) return std::nullopt;
  return value;
}

absl::Status Ids(const JsonValue& record, absl::string_view key, size_t line,
                 std::vector<uint64_t>* out) {
  const JsonValue* list = record.Find(key);
  if (list == nullptr) return absl::OkStatus();
  if (list->kind != JsonValue::Kind::kArray) {
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": '", key, "' is not a list"));
  }
  for (const JsonValue& v : list->array) {
    if (v.kind != JsonValue::Kind::kNumber || !v.uint) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": '", key, "' holds something other than buffer ids"));
    }
    if (*v.uint >= kUntrackedBase) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line, ": buffer id ", *v.uint, " is out of range (2^62 or more)"));
    }
    if (*v.uint != 0 && std::find(out->begin(), out->end(), *v.uint) == out->end()) {
      out->push_back(*v.uint);
    }
  }
  return absl::OkStatus();
}

class Reader {
 public:
  explicit Reader(uint64_t granularity) { trace_.granularity = granularity; }

  absl::Status Line(absl::string_view text, size_t line) {
    if (text.find_first_not_of(" \t\r") == absl::string_view::npos) return absl::OkStatus();
    absl::StatusOr<JsonValue> parsed = ParseJson(text);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": ", parsed.status().message()));
    }
    const JsonValue& r = *parsed;
    absl::string_view type = r.StringOr("type", "");
    if (type.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line, ": record without a type"));
    }
    if (type == "header") return Header(r, line);
    // Work pushed into a capturing stream ran later, as graph nodes.
    if (r.BoolOr("captured", false)) return absl::OkStatus();
    if (type == "alloc") return Alloc(r, line);
    if (type == "free") return Free(r, line);
    if (type == "launch") return Launch(r, line);
    if (type == "memcpy") return Memcpy(r, line);
    if (type == "memset") return Memset(r, line);
    // A graph whose nodes were read: one operation touching what they touch.
    if (type == "graph_launch" && r.BoolOr("inferred", false)) return Launch(r, line);
    if (type == "graph_launch") {
      TraceOp op;
      op.key = OpKey(r, type);
      op.kind = TraceOp::Kind::kUnknown;
      op.launch = true;
      op.line = line;
      ++trace_.launches;
      ++trace_.unknown_launches;
      trace_.ops.push_back(std::move(op));
      return absl::OkStatus();
    }
    LoggedSwaps& l = trace_.logged;
    if (type == "swap_out") {
      ++l.swap_outs;
      l.bytes_out += r.Uint("bytes").value_or(0);
    } else if (type == "drop_clean") {
      ++l.clean_drops;
    } else if (type == "drop_unwritten") {
      ++l.never_written_drops;
    } else if (type == "swap_in" && r.BoolOr("copy", false)) {
      ++l.swap_ins_copied;
      l.bytes_in += r.Uint("bytes").value_or(0);
    }
    return absl::OkStatus();  // sync, host allocations, waits: nothing to replay
  }

  Trace Finish() && { return std::move(trace_); }

 private:
  absl::Status Header(const JsonValue& r, size_t line) {
    if (std::optional<uint64_t> format = r.Uint("format"); format && *format != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line, ": access log format ", *format, " is not supported (only 1)"));
    }
    if (const JsonValue* config = r.Find("config")) {
      trace_.logged_policy = std::string(config->StringOr("STENSOR_POLICY", ""));
      trace_.logged_limit = std::string(config->StringOr("STENSOR_MEMORY_LIMIT", ""));
    }
    return absl::OkStatus();
  }

  absl::Status Alloc(const JsonValue& r, size_t line) {
    std::optional<uint64_t> id = r.Uint("id");
    std::optional<uint64_t> bytes = r.Uint("bytes");
    if (!id || !bytes) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line, ": alloc without id or bytes"));
    }
    // Ids from kUntrackedBase up are this reader's own (the library counts
    // from 1); a byte count near 2^64 would wrap the charge.
    if (absl::Status s = CheckId(*id, line); !s.ok()) return s;
    if (*bytes > kMaxBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": alloc of ", *bytes, " bytes (more than 2^60)"));
    }
    absl::string_view kind = r.StringOr("kind", "device");
    absl::string_view api = r.StringOr("api", "");
    TraceBuffer b;
    b.id = *id;
    b.addr = HexAddress(r, "addr").value_or(0);
    b.bytes = *bytes;
    // As the manager serves them (tools/charge.h).
    const AllocationCharge charge = ChargeOf(kind, api, b.bytes, trace_.granularity);
    b.charge = charge.bytes;
    b.swappable = charge.swappable && *id != 0;
    if (*id == 0) {
      // Untracked (overlapping a live range): charged, never named again.
      b.id = kUntrackedBase + untracked_++;
    } else if (trace_.buffers.count(*id) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": buffer id ", *id, " allocated twice"));
    }
    if (live_ > UINT64_MAX - b.charge) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": live allocations exceed 2^64 bytes"));
    }
    live_ += b.charge;
    trace_.working_set = std::max(trace_.working_set, live_);
    TraceOp op;
    op.kind = TraceOp::Kind::kAlloc;
    op.buffer = b.id;
    op.line = line;
    trace_.buffers[b.id] = b;
    trace_.ops.push_back(std::move(op));
    return absl::OkStatus();
  }

  absl::Status Free(const JsonValue& r, size_t line) {
    std::optional<uint64_t> id = r.Uint("id");
    if (!id || *id == 0) return absl::OkStatus();  // untracked: charge kept (unknown which)
    if (absl::Status s = CheckId(*id, line); !s.ok()) return s;
    auto it = trace_.buffers.find(*id);
    if (it == trace_.buffers.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": free of buffer ", *id, " never allocated"));
    }
    if (freed_.count(*id)) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line, ": buffer ", *id,
                                                     " freed twice"));
    }
    freed_[*id] = true;
    live_ -= it->second.charge;
    TraceOp op;
    op.kind = TraceOp::Kind::kFree;
    op.buffer = *id;
    op.line = line;
    trace_.ops.push_back(std::move(op));
    return absl::OkStatus();
  }

  absl::Status Known(const std::vector<uint64_t>& ids, size_t line) const {
    for (uint64_t id : ids) {
      if (trace_.buffers.count(id) == 0 || freed_.count(id) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line, ": buffer ", id, " is not live"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Launch(const JsonValue& r, size_t line) {
    TraceOp op;
    op.launch = true;
    op.line = line;
    op.key = OpKey(r, "launch");
    op.compute_us = r.Number("compute_us");
    if (absl::Status s = Ids(r, "reads", line, &op.ids); !s.ok()) return s;
    if (absl::Status s = Ids(r, "writes", line, &op.writes); !s.ok()) return s;
    // Every written buffer was prepared too (the log lists it in reads).
    for (uint64_t id : op.writes) {
      if (std::find(op.ids.begin(), op.ids.end(), id) == op.ids.end()) op.ids.push_back(id);
    }
    if (absl::Status s = Known(op.ids, line); !s.ok()) return s;
    ++trace_.launches;
    if (!r.BoolOr("inferred", true) || r.BoolOr("unknown_tables", false)) {
      op.kind = TraceOp::Kind::kUnknown;
      ++trace_.unknown_launches;
    }
    trace_.ops.push_back(std::move(op));
    return absl::OkStatus();
  }

  // Whether [addr, addr+bytes) is all of buffer `id`.
  bool Whole(uint64_t id, std::optional<uint64_t> addr, uint64_t bytes) const {
    auto it = trace_.buffers.find(id);
    return it != trace_.buffers.end() && addr && *addr == it->second.addr &&
           bytes == it->second.bytes;
  }

  absl::Status Memcpy(const JsonValue& r, size_t line) {
    std::vector<uint64_t> reads, writes;
    if (absl::Status s = Ids(r, "reads", line, &reads); !s.ok()) return s;
    if (absl::Status s = Ids(r, "writes", line, &writes); !s.ok()) return s;
    if (absl::Status s = Known(reads, line); !s.ok()) return s;
    if (absl::Status s = Known(writes, line); !s.ok()) return s;
    absl::string_view api = r.StringOr("api", "");
    // 2D/3D copies are rows of a region: never "whole", never served.
    const bool linear = api.find("2D") == absl::string_view::npos &&
                        api.find("3D") == absl::string_view::npos;
    const uint64_t bytes = r.Uint("bytes").value_or(0);
    TraceOp op;
    op.line = line;
    op.key = OpKey(r, "memcpy");
    const uint64_t dst = writes.empty() ? 0 : writes[0];
    const uint64_t src = reads.empty() ? 0 : reads[0];
    if (linear && r.StringOr("kind", "") == "DtoH" && !r.BoolOr("async", true) && src != 0 &&
        dst == 0 && trace_.buffers[src].swappable) {
      op.kind = TraceOp::Kind::kHostRead;
      op.buffer = src;
      op.ids = {src};
      trace_.ops.push_back(std::move(op));
      return absl::OkStatus();
    }
    // As the manager prepares a transfer: destination, then source.
    if (dst != 0) op.ids.push_back(dst);
    if (src != 0 && src != dst) op.ids.push_back(src);
    if (dst != 0) op.writes.push_back(dst);
    if (linear && dst != 0 && dst != src && Whole(dst, HexAddress(r, "dst"), bytes)) {
      op.overwritten.push_back(dst);
    }
    trace_.ops.push_back(std::move(op));
    return absl::OkStatus();
  }

  absl::Status Memset(const JsonValue& r, size_t line) {
    std::vector<uint64_t> writes;
    if (absl::Status s = Ids(r, "writes", line, &writes); !s.ok()) return s;
    if (absl::Status s = Known(writes, line); !s.ok()) return s;
    absl::string_view api = r.StringOr("api", "");
    const bool linear = api.find("2D") == absl::string_view::npos;
    TraceOp op;
    op.line = line;
    op.key = OpKey(r, "memset");
    op.ids = writes;
    op.writes = writes;
    if (linear && !writes.empty() &&
        Whole(writes[0], HexAddress(r, "dst"), r.Uint("bytes").value_or(0))) {
      op.overwritten.push_back(writes[0]);
    }
    trace_.ops.push_back(std::move(op));
    return absl::OkStatus();
  }

  static absl::Status CheckId(uint64_t id, size_t line) {
    if (id < kUntrackedBase) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line, ": buffer id ", id, " is out of range (2^62 or more)"));
  }

  // No device holds 2^60 bytes; bounding sizes keeps every charge and sum
  // below 2^64.
  static constexpr uint64_t kMaxBytes = uint64_t{1} << 60;
  Trace trace_;
  uint64_t live_ = 0;
  uint64_t untracked_ = 0;
  absl::flat_hash_map<uint64_t, bool> freed_;
};

}  // namespace

absl::StatusOr<Trace> ParseTrace(absl::string_view text, uint64_t granularity) {
  // At most 1 TiB, so rounding a size up to it cannot wrap.
  if (granularity == 0 || granularity > (uint64_t{1} << 40)) {
    return absl::InvalidArgumentError("granularity must be positive and at most 1 TiB");
  }
  Reader reader(granularity);
  size_t line = 0;
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    ++line;
    if (absl::Status s = reader.Line(l, line); !s.ok()) return s;
  }
  return std::move(reader).Finish();
}

absl::StatusOr<Trace> ReadTrace(const std::string& path, uint64_t granularity) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open access log ", path));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read access log ", path));
  absl::StatusOr<Trace> trace = ParseTrace(text.str(), granularity);
  if (!trace.ok()) {
    return absl::Status(trace.status().code(), absl::StrCat(path, ": ", trace.status().message()));
  }
  return trace;
}

}  // namespace stensor
