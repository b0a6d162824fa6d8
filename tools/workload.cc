#include "tools/workload.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/swap/slab_pool.h"
#include "core/swap/tensor_bounds.h"
#include "nlohmann/json.hpp"
#include "tools/log_json.h"

namespace stensor {
namespace {

using Json = nlohmann::ordered_json;

// Ids for untracked allocations, far above any the library assigns; a log
// naming one is rejected, so they never meet the log's own.
constexpr uint64_t kUntrackedBase = uint64_t{1} << 62;

const Json* Find(const Json& r, absl::string_view key) {
  if (!r.is_object()) return nullptr;
  auto it = r.find(std::string(key));
  return it == r.end() ? nullptr : &*it;
}

absl::string_view StringOr(const Json& r, absl::string_view key, absl::string_view fallback) {
  const Json* v = Find(r, key);
  return v != nullptr && v->is_string() ? absl::string_view(v->get_ref<const std::string&>())
                                        : fallback;
}

// Exact: unsigned integers never pass through a double.
std::optional<uint64_t> Uint(const Json& r, absl::string_view key) {
  const Json* v = Find(r, key);
  if (v == nullptr || !v->is_number_unsigned()) return std::nullopt;
  return v->get<uint64_t>();
}

bool BoolOr(const Json& r, absl::string_view key, bool fallback) {
  const Json* v = Find(r, key);
  return v != nullptr && v->is_boolean() ? v->get<bool>() : fallback;
}

std::optional<double> Number(const Json& r, absl::string_view key) {
  const Json* v = Find(r, key);
  if (v == nullptr || !v->is_number()) return std::nullopt;
  return v->get<double>();
}

// The iteration detector's key of an operation: a hash of what stays the
// same from one training step to the next. Never 0 (0 means "not observed").
uint64_t OpKey(const Json& r, absl::string_view type) {
  std::string text(type);
  for (absl::string_view field : {"kernel", "kind", "api", "graph"}) {
    absl::StrAppend(&text, "|", StringOr(r, field, ""));
  }
  absl::StrAppend(&text, "|", Uint(r, "bytes").value_or(0));
  for (absl::string_view field : {"grid", "block"}) {
    if (const Json* dims = Find(r, field); dims != nullptr && dims->is_array()) {
      for (const Json& d : *dims) {
        absl::StrAppend(&text, ",", d.is_number_unsigned() ? d.get<uint64_t>() : 0);
      }
    }
  }
  const uint64_t h = std::hash<std::string>()(text);
  return h == 0 ? 1 : h;
}

std::optional<uint64_t> HexAddress(const Json& record, absl::string_view key) {
  absl::string_view text = StringOr(record, key, "");
  if (text.substr(0, 2) != "0x") return std::nullopt;
  uint64_t value = 0;
  if (!absl::SimpleHexAtoi(text.substr(2), &value)) return std::nullopt;
  return value;
}

// One of a record's id lists (`reads`, `writes`), taken element by element
// as the line is parsed (tools/log_json.h), so a launch listing millions of
// ids costs its distinct live ones, not a DOM of all: in text order, zeros
// and repeats dropped, with the first element that is no buffer id and the
// first id that is not live. Past that id nothing more is kept: the record
// is an error wherever the list is used.
class IdList {
 public:
  explicit IdList(absl::string_view key) : key_(key) {}

  void Clear() {
    ids_.clear();
    seen_.clear();
    bad_.reset();
    not_live_.reset();
  }

  // `live` tells whether an id names a live buffer.
  template <typename Live>
  void Add(const Json& v, const Live& live) {
    if (bad_) return;
    if (!v.is_number_unsigned()) {
      bad_ = absl::StrCat("'", key_, "' holds something other than buffer ids");
      return;
    }
    const uint64_t id = v.get<uint64_t>();
    if (id >= kUntrackedBase) {
      bad_ = absl::StrCat("buffer id ", id, " is out of range (2^62 or more)");
      return;
    }
    if (id == 0 || not_live_ || Contains(id)) return;
    if (!live(id)) {
      not_live_ = id;
      return;
    }
    Insert(id);
  }

  // A live id not in the list yet.
  void Insert(uint64_t id) {
    ids_.push_back(id);
    if (!seen_.empty()) {
      seen_.insert(id);
    } else if (ids_.size() > kLinear) {
      seen_.insert(ids_.begin(), ids_.end());
    }
  }

  bool Contains(uint64_t id) const {
    if (!seen_.empty()) return seen_.contains(id);
    return std::find(ids_.begin(), ids_.end(), id) != ids_.end();
  }

  // What makes the list unusable, as a message naming the line.
  absl::Status Check(size_t line) const {
    if (!bad_) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", *bad_));
  }
  absl::Status Live(size_t line) const {
    if (!not_live_) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line, ": buffer ", *not_live_, " is not live"));
  }

  absl::string_view key() const { return key_; }
  const std::vector<uint64_t>& ids() const { return ids_; }
  std::vector<uint64_t> Take() { return std::move(ids_); }

 private:
  // Lists up to this long are searched; longer ones get a set.
  static constexpr size_t kLinear = 16;
  const std::string key_;
  std::vector<uint64_t> ids_;
  absl::flat_hash_set<uint64_t> seen_;
  std::optional<std::string> bad_;
  std::optional<uint64_t> not_live_;
};

class Reader {
 public:
  explicit Reader(uint64_t granularity) {
    workload_.granularity = granularity;
    visitor_ = [this](absl::string_view member, const Json& element) {
      auto live = [this](uint64_t id) { return Live(id); };
      if (member == "reads") {
        reads_.Add(element, live);
      } else if (member == "writes") {
        writes_.Add(element, live);
      }
    };
  }

  absl::Status Line(absl::string_view text, size_t line) {
    if (text.find_first_not_of(" \t\r") == absl::string_view::npos) return absl::OkStatus();
    reads_.Clear();
    writes_.Clear();
    LogLine<Json> parsed = ParseLogLine<Json>(text, visitor_);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": ", parsed.error->ToStatus().message()));
    }
    const Json& r = parsed.record;
    left_out_ = &parsed.left_out;
    absl::string_view type = StringOr(r, "type", "");
    if (type.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line, ": record without a type"));
    }
    if (type == "sync") {
      synced_ = true;  // the host waited: told to the next operation
      return absl::OkStatus();
    }
    const size_t before = workload_.ops.size();
    absl::Status s = Record(r, type, line);
    if (synced_ && workload_.ops.size() > before) {
      workload_.ops[before].host_waits_before = true;
      synced_ = false;
    }
    return s;
  }

  Workload Finish() && { return std::move(workload_); }

 private:
  absl::Status Record(const Json& r, absl::string_view type, size_t line) {
    if (type == "header") return Header(r, line);
    // Work pushed into a capturing stream ran later, as graph nodes.
    if (BoolOr(r, "captured", false)) return absl::OkStatus();
    if (type == "alloc") return Alloc(r, line);
    if (type == "free") return Free(r, line);
    if (type == "launch") return Launch(r, line);
    if (type == "memcpy") return Memcpy(r, line);
    if (type == "memset") return Memset(r, line);
    // A graph whose nodes were read: one operation touching what they touch.
    if (type == "graph_launch" && BoolOr(r, "inferred", false)) {
      const size_t before = workload_.ops.size();
      absl::Status s = Launch(r, line);
      if (workload_.ops.size() > before) workload_.ops.back().graph = true;
      return s;
    }
    if (type == "graph_launch") {
      WorkloadOp op;
      op.key = OpKey(r, type);
      op.kind = WorkloadOp::Kind::kUnknown;
      op.launch = true;
      op.line = line;
      ++workload_.launches;
      ++workload_.unknown_launches;
      ++workload_.blind_launches;
      workload_.ops.push_back(std::move(op));
      return absl::OkStatus();
    }
    LoggedSwaps& l = workload_.logged;
    if (type == "swap_out") {
      ++l.swap_outs;
      l.bytes_out += Uint(r, "bytes").value_or(0);
    } else if (type == "drop_clean") {
      ++l.clean_drops;
    } else if (type == "drop_unwritten") {
      ++l.never_written_drops;
    } else if (type == "swap_in" && BoolOr(r, "copy", false)) {
      ++l.swap_ins_copied;
      l.bytes_in += Uint(r, "bytes").value_or(0);
    }
    return absl::OkStatus();  // host allocations, waits: nothing to replay
  }

  absl::Status Header(const Json& r, size_t line) {
    if (std::optional<uint64_t> format = Uint(r, "format"); format && *format != 1) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line, ": access log format ", *format,
                                                     " is not supported (only 1)"));
    }
    if (const Json* config = Find(r, "config")) {
      workload_.logged_policy = std::string(StringOr(*config, "STENSOR_POLICY", ""));
      workload_.logged_limit = std::string(StringOr(*config, "STENSOR_MEMORY_LIMIT", ""));
    }
    return absl::OkStatus();
  }

  absl::Status Alloc(const Json& r, size_t line) {
    std::optional<uint64_t> id = Uint(r, "id");
    std::optional<uint64_t> bytes = Uint(r, "bytes");
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
    absl::string_view kind = StringOr(r, "kind", "device");
    absl::string_view api = StringOr(r, "api", "");
    WorkloadBuffer b;
    b.id = *id;
    b.addr = HexAddress(r, "addr").value_or(0);
    b.bytes = *bytes;
    // As the manager serves them (tools/charge.h).
    const AllocationCharge charge = ChargeOf(kind, api, b.bytes, workload_.granularity);
    b.charge = charge.bytes;
    b.swappable = charge.swappable && *id != 0;
    b.small = charge.small && *id != 0;
    if (*id == 0) {
      // Untracked (overlapping a live range): charged, never named again.
      b.id = kUntrackedBase + untracked_++;
    } else if (workload_.buffers.count(*id) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": buffer id ", *id, " allocated twice"));
    }
    if (live_ > UINT64_MAX - b.charge) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": live allocations exceed 2^64 bytes"));
    }
    live_ += b.charge;
    workload_.working_set = std::max(workload_.working_set, live_);
    WorkloadOp op;
    op.kind = WorkloadOp::Kind::kAlloc;
    op.buffer = b.id;
    op.line = line;
    workload_.buffers[b.id] = b;
    workload_.ops.push_back(std::move(op));
    return absl::OkStatus();
  }

  absl::Status Free(const Json& r, size_t line) {
    std::optional<uint64_t> id = Uint(r, "id");
    if (!id || *id == 0) return absl::OkStatus();  // untracked: charge kept (unknown which)
    if (absl::Status s = CheckId(*id, line); !s.ok()) return s;
    auto it = workload_.buffers.find(*id);
    if (it == workload_.buffers.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": free of buffer ", *id, " never allocated"));
    }
    if (freed_.count(*id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": buffer ", *id, " freed twice"));
    }
    freed_.insert(*id);
    live_ -= it->second.charge;
    WorkloadOp op;
    op.kind = WorkloadOp::Kind::kFree;
    op.buffer = *id;
    op.line = line;
    workload_.ops.push_back(std::move(op));
    return absl::OkStatus();
  }

  bool Live(uint64_t id) const { return workload_.buffers.contains(id) && !freed_.contains(id); }

  // The record's list as read (IdList): an error when its member is
  // there but no list, or holds something other than ids.
  absl::Status ListOk(const Json& r, const IdList& list, size_t line) const {
    if (const Json* v = Find(r, list.key()); v != nullptr && !v->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line, ": '", list.key(), "' is not a list"));
    }
    return list.Check(line);
  }

  absl::Status Launch(const Json& r, size_t line) {
    if (absl::Status s = ListOk(r, reads_, line); !s.ok()) return s;
    if (absl::Status s = ListOk(r, writes_, line); !s.ok()) return s;
    // Reads first, as the manager prepares them.
    if (absl::Status s = reads_.Live(line); !s.ok()) return s;
    if (absl::Status s = writes_.Live(line); !s.ok()) return s;
    WorkloadOp op;
    op.launch = true;
    op.line = line;
    op.key = OpKey(r, "launch");
    op.compute_us = Number(r, "compute_us");
    op.writes = writes_.ids();
    // Every written buffer was prepared too (the log lists it in reads).
    for (uint64_t id : op.writes) {
      if (!reads_.Contains(id)) reads_.Insert(id);
    }
    op.ids = reads_.Take();
    ++workload_.launches;
    if (!BoolOr(r, "inferred", true) || BoolOr(r, "unknown_tables", false)) {
      op.kind = WorkloadOp::Kind::kUnknown;
      ++workload_.unknown_launches;
      if (!BoolOr(r, "inferred", true)) ++workload_.blind_launches;
    } else {
      ReadPointers(r, &op);
    }
    workload_.ops.push_back(std::move(op));
    return absl::OkStatus();
  }

  // WorkloadOp::pointers from the record's `pointers` and `tables`. A list cut
  // short by the parser's bounds leaves none (every piece reached).
  void ReadPointers(const Json& r, WorkloadOp* op) const {
    for (const auto& [member, count] : *left_out_) {
      if (member == "pointers" || member == "tables") return;
    }
    absl::flat_hash_set<uint64_t> through_table;
    if (auto t = r.find("tables"); t != r.end() && t->is_array()) {
      for (const Json& table : *t) {
        auto refs = table.is_object() ? table.find("refs") : table.end();
        if (refs == table.end() || !refs->is_array()) continue;
        for (const Json& id : *refs) {
          if (id.is_number_unsigned()) through_table.insert(id.template get<uint64_t>());
        }
      }
    }
    absl::flat_hash_map<uint64_t, std::vector<uint64_t>> listed;
    if (auto p = r.find("pointers"); p != r.end() && p->is_array()) {
      for (const Json& e : *p) {
        if (!e.is_array() || e.size() != 2 || !e[0].is_number_unsigned() || !e[1].is_string()) {
          continue;
        }
        const uint64_t id = e[0].template get<uint64_t>();
        uint64_t word = 0;
        const std::string& text = e[1].template get_ref<const std::string&>();
        auto b = workload_.buffers.find(id);
        if (b == workload_.buffers.end() || text.substr(0, 2) != "0x" ||
            !absl::SimpleHexAtoi(absl::string_view(text).substr(2), &word) ||
            word < b->second.addr) {
          continue;
        }
        listed[id].push_back(word - b->second.addr);
      }
    }
    for (uint64_t id : op->ids) {
      if (through_table.contains(id)) continue;
      auto l = listed.find(id);
      if (l == listed.end()) {
        op->pointers.push_back({id, 0});
        continue;
      }
      for (uint64_t offset : l->second) op->pointers.push_back({id, offset});
    }
  }

  // Whether [addr, addr+bytes) is all of buffer `id`.
  bool Whole(uint64_t id, std::optional<uint64_t> addr, uint64_t bytes) const {
    auto it = workload_.buffers.find(id);
    return it != workload_.buffers.end() && addr && *addr == it->second.addr &&
           bytes == it->second.bytes;
  }

  // Records where [addr, addr + bytes) lies in buffer `id` (WorkloadOp::extents).
  void AddExtent(WorkloadOp& op, uint64_t id, std::optional<uint64_t> addr, uint64_t bytes) const {
    auto it = workload_.buffers.find(id);
    if (it == workload_.buffers.end() || !addr || *addr < it->second.addr) return;
    op.extents.push_back(WorkloadOp::Extent{id, *addr - it->second.addr, bytes});
  }

  absl::Status Memcpy(const Json& r, size_t line) {
    if (absl::Status s = ListOk(r, reads_, line); !s.ok()) return s;
    if (absl::Status s = ListOk(r, writes_, line); !s.ok()) return s;
    if (absl::Status s = reads_.Live(line); !s.ok()) return s;
    if (absl::Status s = writes_.Live(line); !s.ok()) return s;
    const std::vector<uint64_t>& reads = reads_.ids();
    const std::vector<uint64_t>& writes = writes_.ids();
    absl::string_view api = StringOr(r, "api", "");
    // 2D/3D copies are rows of a region: never "whole", never served.
    const bool linear =
        api.find("2D") == absl::string_view::npos && api.find("3D") == absl::string_view::npos;
    const uint64_t bytes = Uint(r, "bytes").value_or(0);
    WorkloadOp op;
    op.line = line;
    op.key = OpKey(r, "memcpy");
    // A copy to or from host memory returns once done, unless asynchronous.
    const absl::string_view direction = StringOr(r, "kind", "");
    const bool blocking = !BoolOr(r, "async", true);
    op.host_waits_after = blocking && (direction == "DtoH" || direction == "HtoD");
    const uint64_t dst = writes.empty() ? 0 : writes[0];
    const uint64_t src = reads.empty() ? 0 : reads[0];
    if (linear && direction == "DtoH" && blocking && src != 0 && dst == 0 &&
        workload_.buffers.at(src).swappable) {
      op.kind = WorkloadOp::Kind::kHostRead;
      op.buffer = src;
      op.ids = {src};
      AddExtent(op, src, HexAddress(r, "src"), bytes);
      workload_.ops.push_back(std::move(op));
      return absl::OkStatus();
    }
    // As the manager prepares a transfer: destination, then source.
    if (dst != 0) op.ids.push_back(dst);
    if (src != 0 && src != dst) op.ids.push_back(src);
    if (dst != 0) op.writes.push_back(dst);
    if (linear && dst != 0 && dst != src && Whole(dst, HexAddress(r, "dst"), bytes)) {
      op.overwritten.push_back(dst);
    }
    if (linear && dst != 0) AddExtent(op, dst, HexAddress(r, "dst"), bytes);
    if (linear && src != 0) AddExtent(op, src, HexAddress(r, "src"), bytes);
    workload_.ops.push_back(std::move(op));
    return absl::OkStatus();
  }

  absl::Status Memset(const Json& r, size_t line) {
    if (absl::Status s = ListOk(r, writes_, line); !s.ok()) return s;
    if (absl::Status s = writes_.Live(line); !s.ok()) return s;
    std::vector<uint64_t> writes = writes_.Take();
    absl::string_view api = StringOr(r, "api", "");
    const bool linear = api.find("2D") == absl::string_view::npos;
    WorkloadOp op;
    op.line = line;
    op.key = OpKey(r, "memset");
    if (linear && !writes.empty() &&
        Whole(writes[0], HexAddress(r, "dst"), Uint(r, "bytes").value_or(0))) {
      op.overwritten.push_back(writes[0]);
    }
    if (linear && !writes.empty()) {
      AddExtent(op, writes[0], HexAddress(r, "dst"), Uint(r, "bytes").value_or(0));
    }
    op.ids = writes;
    op.writes = std::move(writes);
    workload_.ops.push_back(std::move(op));
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
  Workload workload_;
  uint64_t live_ = 0;
  uint64_t untracked_ = 0;
  absl::flat_hash_set<uint64_t> freed_;
  bool synced_ = false;                       // a synchronize since the last operation
  IdList reads_{"reads"}, writes_{"writes"};  // of the line being read
  // What the parser left out of the line being read (LogLine::left_out).
  const std::vector<std::pair<std::string, uint64_t>>* left_out_ = nullptr;
  LogArrayVisitor<Json> visitor_;
};

// At most 1 TiB, so rounding a size up to it cannot wrap.
absl::Status CheckGranularity(uint64_t granularity) {
  if (granularity > 0 && granularity <= (uint64_t{1} << 40)) return absl::OkStatus();
  return absl::InvalidArgumentError("granularity must be positive and at most 1 TiB");
}

}  // namespace

WriteSet::WriteSet(const WorkloadOp& op) : writes_(op.writes) {
  if (writes_.size() > kScanned) set_.insert(writes_.begin(), writes_.end());
}

bool WriteSet::Contains(uint64_t id) const {
  if (writes_.size() > kScanned) return set_.contains(id);
  return std::find(writes_.begin(), writes_.end(), id) != writes_.end();
}

// `workload` without its operations, which a transformation rebuilds.
static Workload WithoutOps(const Workload& workload) {
  Workload out;
  out.granularity = workload.granularity;
  out.working_set = workload.working_set;
  out.logged_policy = workload.logged_policy;
  out.logged_limit = workload.logged_limit;
  out.logged = workload.logged;
  out.launches = workload.launches;
  out.unknown_launches = workload.unknown_launches;
  out.blind_launches = workload.blind_launches;
  out.buffers = workload.buffers;
  out.groups = workload.groups;
  out.ops.reserve(workload.ops.size());
  return out;
}

Workload SplitIntoPieces(const Workload& workload, uint64_t cap, size_t* split) {
  constexpr uint64_t kPieceIds = (uint64_t{1} << 62) + (uint64_t{1} << 61);
  const uint64_t granule = workload.granularity;
  Workload out = WithoutOps(workload);
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> pieces;  // of an allocation
  uint64_t next_id = kPieceIds;
  size_t allocations_split = 0;
  // Piece `i` of an allocation spans [i x granule, + its bytes).
  auto reaches = [&](const WorkloadOp::Extent* e, size_t i, uint64_t piece) {
    const uint64_t from = i * granule, to = from + out.buffers.at(piece).bytes;
    return e == nullptr || (to > e->offset && from < e->offset + e->bytes);
  };
  auto covers = [&](const WorkloadOp::Extent& e, size_t i, uint64_t piece) {
    const uint64_t from = i * granule, to = from + out.buffers.at(piece).bytes;
    return from >= e.offset && to <= e.offset + e.bytes;
  };
  // The extents of `id` in `op` (a copy within one allocation has two).
  auto extents_of = [](const WorkloadOp& op, uint64_t id) {
    std::vector<const WorkloadOp::Extent*> found;
    for (const WorkloadOp::Extent& e : op.extents) {
      if (e.id == id) found.push_back(&e);
    }
    return found;
  };
  auto expand = [&](const WorkloadOp& op, const std::vector<uint64_t>& ids) {
    std::vector<uint64_t> expanded;
    expanded.reserve(ids.size());
    for (uint64_t id : ids) {
      auto it = pieces.find(id);
      if (it == pieces.end()) {
        expanded.push_back(id);
        continue;
      }
      const std::vector<const WorkloadOp::Extent*> extents = extents_of(op, id);
      for (size_t i = 0; i < it->second.size(); ++i) {
        const bool named =
            extents.empty() || std::any_of(extents.begin(), extents.end(),
                                           [&](auto* e) { return reaches(e, i, it->second[i]); });
        if (named) expanded.push_back(it->second[i]);
      }
    }
    return expanded;
  };
  // Where each split allocation's tensors were seen to start and end, as
  // the library keeps them (MemoryManager::Narrow, FarPieces).
  absl::flat_hash_map<uint64_t, TensorBounds> bounds;
  auto note_extents = [&](const WorkloadOp& op) {
    for (const WorkloadOp::Extent& e : op.extents) {
      if (pieces.count(e.id) == 0) continue;
      const uint64_t size = out.buffers.at(e.id).bytes;
      TensorBounds& known = bounds[e.id];
      known.Note(e.offset);
      known.Note(e.offset + std::min(e.bytes, size - std::min(e.offset, size)));
    }
  };
  // The pieces of `op`'s allocations its pointers likely do not reach.
  auto far_pieces = [&](const WorkloadOp& op) {
    std::vector<uint64_t> far;
    for (size_t i = 0; i < op.pointers.size();) {
      const uint64_t id = op.pointers[i].id;
      size_t end = i;
      while (end < op.pointers.size() && op.pointers[end].id == id) ++end;
      auto it = pieces.find(id);
      if (it != pieces.end()) {
        const uint64_t size = out.buffers.at(id).bytes;
        TensorBounds& known = bounds[id];
        for (size_t k = i; k < end; ++k) {
          if (op.pointers[k].offset < size) known.Note(op.pointers[k].offset);
        }
        for (size_t p = 0; p < it->second.size(); ++p) {
          const uint64_t from = p * granule, to = from + out.buffers.at(it->second[p]).bytes;
          const bool near = std::any_of(op.pointers.begin() + i, op.pointers.begin() + end,
                                        [&](const WorkloadOp::Pointer& w) {
                                          return w.offset < to && w.offset < size &&
                                                 known.EndFrom(w.offset, size) > from;
                                        });
          if (!near) far.push_back(it->second[p]);
        }
      }
      i = end;
    }
    std::sort(far.begin(), far.end());
    return far;
  };
  for (const WorkloadOp& op : workload.ops) {
    if (op.kind == WorkloadOp::Kind::kAlloc) {
      const WorkloadBuffer& b = workload.buffers.at(op.buffer);
      if (b.swappable && b.charge > granule && b.bytes <= cap) {
        ++allocations_split;
        std::vector<uint64_t>& ids = pieces[b.id];
        for (uint64_t at = 0; at < b.charge; at += granule) {
          WorkloadBuffer piece = b;
          piece.id = next_id++;
          piece.addr = b.addr + at;
          piece.bytes = std::min(granule, b.bytes - at);
          piece.charge = granule;
          piece.group = b.id;
          out.buffers[piece.id] = piece;
          ids.push_back(piece.id);
          WorkloadOp alloc = op;
          alloc.buffer = piece.id;
          out.ops.push_back(std::move(alloc));
        }
        out.groups[b.id] = ids;
        continue;
      }
    }
    auto it = op.kind == WorkloadOp::Kind::kFree ? pieces.find(op.buffer) : pieces.end();
    if (it != pieces.end()) {
      for (uint64_t id : it->second) {
        WorkloadOp free = op;
        free.buffer = id;
        out.ops.push_back(std::move(free));
      }
      pieces.erase(it);
      bounds.erase(op.buffer);
      continue;
    }
    WorkloadOp expanded = op;
    if (!pieces.empty()) {
      note_extents(op);
      if (op.launch && !op.graph && op.kind == WorkloadOp::Kind::kAccess) {
        expanded.far = far_pieces(op);
      }
      expanded.ids = expand(op, op.ids);
      // The destination is the first extent (a copy's, or a memset's).
      const WorkloadOp::Extent* dst =
          op.extents.empty() || op.writes.empty() || op.extents[0].id != op.writes[0]
              ? nullptr
              : &op.extents[0];
      if (dst != nullptr && pieces.count(dst->id) != 0) {
        // Exact: what it reaches in the destination, overwritten where it
        // covers a piece whole and reads none of it.
        WorkloadOp only_dst = op;
        only_dst.extents = {*dst};
        expanded.writes = expand(only_dst, op.writes);
        expanded.overwritten.clear();
        const std::vector<uint64_t>& all = pieces.at(dst->id);
        const std::vector<const WorkloadOp::Extent*> read = extents_of(op, dst->id);
        for (size_t i = 0; i < all.size(); ++i) {
          const bool also_read = std::any_of(
              read.begin(), read.end(), [&](auto* e) { return e != dst && reaches(e, i, all[i]); });
          if (covers(*dst, i, all[i]) && !also_read) expanded.overwritten.push_back(all[i]);
        }
        for (uint64_t id : op.overwritten) {
          if (id != dst->id) expanded.overwritten.push_back(id);
        }
      } else {
        expanded.writes = expand(op, op.writes);
        expanded.overwritten = expand(op, op.overwritten);
      }
    }
    out.ops.push_back(std::move(expanded));
  }
  if (split != nullptr) *split = allocations_split;
  return out;
}

Workload PackIntoSlabs(const Workload& workload, std::optional<uint64_t> onset_cap,
                       size_t* packed) {
  constexpr uint64_t kSlabIds = (uint64_t{1} << 62) + (uint64_t{1} << 60);
  const uint64_t granule = workload.granularity;
  Workload out = WithoutOps(workload);
  // The library's placement; addresses of its own, one granule per slab.
  SlabPool pool;
  absl::flat_hash_map<uint64_t, CUdeviceptr> base_of;  // a live small allocation's
  uint64_t next_slab = kSlabIds;
  size_t placed = 0;
  // STENSOR_SLABS=auto: small allocations stay outside slabs, counted,
  // until those held reach the library's share of the cap.
  SlabOnset onset;
  absl::flat_hash_set<uint64_t> counted;  // held outside slabs, counted
  auto slab_op = [&](WorkloadOp::Kind kind, uint64_t slab, const WorkloadOp& at) {
    WorkloadOp op;
    op.kind = kind;
    op.buffer = slab;
    op.line = at.line;
    op.host_waits_before = at.host_waits_before;  // issued after the same wait
    out.ops.push_back(std::move(op));
  };
  // Each id once, a small allocation's as its slab's; none for `drop`.
  auto mapped = [&](const std::vector<uint64_t>& ids, bool drop) {
    std::vector<uint64_t> result;
    result.reserve(ids.size());
    for (uint64_t id : ids) {
      auto b = out.buffers.find(id);
      if (b == out.buffers.end() || b->second.in_slab == 0) {
        result.push_back(id);
      } else if (!drop &&
                 std::find(result.begin(), result.end(), b->second.in_slab) == result.end()) {
        result.push_back(b->second.in_slab);
      }
    }
    return result;
  };
  for (const WorkloadOp& op : workload.ops) {
    const WorkloadBuffer* info = nullptr;
    if (op.kind == WorkloadOp::Kind::kAlloc || op.kind == WorkloadOp::Kind::kFree) {
      auto it = out.buffers.find(op.buffer);
      if (it != out.buffers.end() && it->second.small && it->second.bytes < granule / 2) {
        info = &it->second;
      }
    }
    if (info != nullptr && op.kind == WorkloadOp::Kind::kAlloc && onset_cap && !onset.packing()) {
      onset.Made(info->bytes, *onset_cap);
      counted.insert(op.buffer);
      info = nullptr;  // as it is
    }
    if (info != nullptr && op.kind == WorkloadOp::Kind::kFree && counted.erase(op.buffer) > 0) {
      onset.Freed(info->bytes);
      info = nullptr;
    }
    if (info != nullptr && op.kind == WorkloadOp::Kind::kAlloc) {
      std::optional<SlabPool::Block> block = pool.Take(0, info->bytes);
      if (!block) {
        const uint64_t slab = next_slab++;
        WorkloadBuffer b;
        b.id = slab;
        b.bytes = granule;
        b.charge = granule;
        b.swappable = true;
        b.slab = true;
        out.buffers[slab] = b;
        pool.AddSlab(slab, 0, (slab - kSlabIds + 1) * granule, granule);
        slab_op(WorkloadOp::Kind::kAlloc, slab, op);
        block = pool.Take(0, info->bytes);
      }
      WorkloadBuffer& b = out.buffers.at(op.buffer);
      b.in_slab = block->slab;
      b.charge = 0;
      b.swappable = false;
      b.small = false;
      base_of[b.id] = block->base;
      ++placed;
      out.ops.push_back(op);
      continue;
    }
    if (op.kind == WorkloadOp::Kind::kFree) {
      out.ops.push_back(op);
      auto at = base_of.find(op.buffer);
      if (at == base_of.end()) continue;
      pool.Free(at->second);
      base_of.erase(at);
      for (uint64_t slab : pool.TakeEmpty(0, /*keep=*/1)) {
        slab_op(WorkloadOp::Kind::kFree, slab, op);
      }
      continue;
    }
    if (base_of.empty()) {
      out.ops.push_back(op);
      continue;
    }
    WorkloadOp packed_op = op;
    packed_op.ids = mapped(op.ids, false);
    packed_op.writes = mapped(op.writes, false);
    packed_op.overwritten = mapped(op.overwritten, true);
    auto outside = [&](uint64_t id) { return base_of.count(id) == 0; };
    packed_op.extents.clear();
    for (const WorkloadOp::Extent& e : op.extents) {
      if (outside(e.id)) packed_op.extents.push_back(e);
    }
    packed_op.pointers.clear();
    for (const WorkloadOp::Pointer& p : op.pointers) {
      if (outside(p.id)) packed_op.pointers.push_back(p);
    }
    if (op.kind == WorkloadOp::Kind::kHostRead && !outside(op.buffer)) {
      packed_op.buffer = out.buffers.at(op.buffer).in_slab;
    }
    out.ops.push_back(std::move(packed_op));
  }
  if (packed != nullptr) *packed = placed;
  return out;
}

absl::StatusOr<Workload> ParseWorkload(absl::string_view text, uint64_t granularity) {
  if (absl::Status s = CheckGranularity(granularity); !s.ok()) return s;
  Reader reader(granularity);
  size_t line = 0;
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    ++line;
    if (absl::Status s = reader.Line(l, line); !s.ok()) return s;
  }
  return std::move(reader).Finish();
}

absl::StatusOr<Workload> ReadWorkload(const std::string& path, uint64_t granularity) {
  if (absl::Status s = CheckGranularity(granularity); !s.ok()) return s;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open access log ", path));
  // Line by line: a log is held as its operations, never as its text.
  Reader reader(granularity);
  std::string text;
  size_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (absl::Status s = reader.Line(text, line); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
    }
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read access log ", path));
  return std::move(reader).Finish();
}

std::vector<double> ComputeTimes(const Workload& workload, double kernel_us) {
  std::vector<double> compute(workload.ops.size(), 0.0);
  for (size_t i = 0; i < compute.size(); ++i) {
    const WorkloadOp& op = workload.ops[i];
    if (op.launch) compute[i] = op.compute_us.value_or(kernel_us);
  }
  return compute;
}

}  // namespace stensor
