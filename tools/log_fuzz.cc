// Fuzz target for the access-log reader: tools/log_json.h (ParseLogLine,
// one record per line) and tools/workload.h (ParseWorkload, the log read into the
// operations `stensor sim` replays and the optimum bounds).
//
// Input: the bytes are a log. Checked on every input:
// - each line through ParseLogLine: it returns; an error is one line
//   "JSON: ... at offset N" with N within the line; a value prints back
//   (a canonical writer here) as text that parses to the same value; no
//   array of the record is kept past kMaxLogJsonElements, and the visitor
//   saw at least what was kept;
// - the whole text through ParseWorkload, at two granularities: it returns; an
//   error is one printable line that names the log line ("line N: ", N
//   within the text); a Workload is consistent: operations in line order, each
//   naming live, allocated buffers (writes among the prepared ids, whole
//   overwrites among the writes, no id twice), one buffer per allocation,
//   charges that cover the bytes, swappable charges in whole granules, the
//   launch counts, and a working set equal to the peak of the live charges;
// - a well-formed log that the input's bytes describe (allocations, frees,
//   launches with kernel names made of the input's bytes, memsets, copies),
//   written with core/base/json.h (the access log's own writer): ParseWorkload reads
//   back exactly the operations written, and each kernel name round-trips
//   (invalid UTF-8 replaced by U+FFFD, as core/base/json.h promises).
// Built with STENSOR_FUZZ_SCALE, the input instead describes a log of scale
// (CheckScale below, tools/log_generator.h): a training log thousands of
// records long, a thousand buffers live, a launch of a quarter of a million
// reads, with the input's own line spliced in; it is read, bounded and
// replayed on a 128 KiB stack.
// A broken check aborts, which libFuzzer and fuzz_main.cc report as a crash.
//
// Built by //tools:log_fuzz (and //tools:log_fuzz_scale) with
// tests/support/fuzz_main.cc as a bounded regression test, and by `scripts/fuzz.sh
// log` (log_scale) with libFuzzer.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/base/json.h"
#include "nlohmann/json.hpp"
#include "policy/eviction_policy.h"
#include "tests/support/fuzz_target.h"
#include "tools/log_generator.h"
#include "tools/log_json.h"
#include "tools/optimum.h"
#include "tools/replay.h"
#include "tools/workload.h"

namespace stensor {
namespace {

void Require(bool condition, absl::string_view what, absl::string_view detail) {
  if (condition) return;
  const size_t shown = std::min<size_t>(detail.size(), 800);
  std::fprintf(stderr, "log_fuzz: %.*s\n  %.*s\n", static_cast<int>(what.size()), what.data(),
               static_cast<int>(shown), detail.data());
  std::abort();
}

// `name` as the access log's writer promises to store it: each byte that
// does not start a well-formed UTF-8 sequence (RFC 3629) becomes U+FFFD.
// Decoded by code point, independently of the writer's lead-byte table.
std::string AsLogged(absl::string_view name) {
  std::string out;
  size_t i = 0;
  while (i < name.size()) {
    const unsigned char c = name[i];
    const size_t length = c < 0x80         ? 1
                          : (c >> 5) == 6  ? 2
                          : (c >> 4) == 14 ? 3
                          : (c >> 3) == 30 ? 4
                                           : 0;
    uint32_t cp = length == 1 ? c : length == 2 ? c & 0x1f : length == 3 ? c & 0x0f : c & 0x07;
    bool ok = length > 0 && i + length <= name.size();
    for (size_t k = 1; ok && k < length; ++k) {
      const unsigned char next = name[i + k];
      ok = (next & 0xc0) == 0x80;
      cp = (cp << 6) | (next & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[length] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    if (ok) {
      out.append(name.data() + i, length);
      i += length;
    } else {
      out.append("\xef\xbf\xbd");
      ++i;
    }
  }
  return out;
}

bool OneLine(absl::string_view message) {
  for (const char c : message) {
    if (static_cast<unsigned char>(c) < 0x20) return false;
  }
  return true;
}

// ---- ParseLogLine: canonical printing and structural equality ----

using Json = nlohmann::ordered_json;

void Print(const Json& v, std::string* out) {
  switch (v.type()) {
    case Json::value_t::null:
    case Json::value_t::discarded:
    case Json::value_t::binary:  // never from text
      out->append("null");
      break;
    case Json::value_t::boolean:
      out->append(v.get<bool>() ? "true" : "false");
      break;
    case Json::value_t::number_unsigned:
      absl::StrAppend(out, v.get<uint64_t>());
      break;
    case Json::value_t::number_integer: {
      // Only a literal with a minus sign is signed: 0 was "-0".
      const int64_t i = v.get<int64_t>();
      absl::StrAppend(out, i == 0 ? "-0" : absl::StrCat(i));
      break;
    }
    case Json::value_t::number_float: {
      char buffer[40];
      std::snprintf(buffer, sizeof(buffer), "%.17g", v.get<double>());
      out->append(buffer);
      // A float stays one: "1.0" must not print back as the integer "1".
      if (absl::string_view(buffer).find_first_of(".e") == absl::string_view::npos) {
        out->append("e0");
      }
      break;
    }
    case Json::value_t::string:
      AppendJsonString(out, v.get_ref<const std::string&>());
      break;
    case Json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const Json& item : v) {
        if (!first) out->push_back(',');
        first = false;
        Print(item, out);
      }
      out->push_back(']');
      break;
    }
    case Json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) out->push_back(',');
        first = false;
        AppendJsonString(out, key);
        out->push_back(':');
        Print(item, out);
      }
      out->push_back('}');
      break;
    }
  }
}

// Whether `b`, read back from `a` printed, is `a`: strings as the writer
// stores them (invalid UTF-8 the reader accepted comes back as U+FFFD).
bool Same(const Json& a, const Json& b) {
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Json::value_t::boolean:
      return a.get<bool>() == b.get<bool>();
    case Json::value_t::number_unsigned:
      return a.get<uint64_t>() == b.get<uint64_t>();
    case Json::value_t::number_integer:
      return a.get<int64_t>() == b.get<int64_t>();
    // %.17g round-trips every double.
    case Json::value_t::number_float:
      return a.get<double>() == b.get<double>();
    case Json::value_t::string:
      return AsLogged(a.get_ref<const std::string&>()) == b.get_ref<const std::string&>();
    case Json::value_t::array: {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!Same(a[i], b[i])) return false;
      }
      return true;
    }
    case Json::value_t::object: {
      if (a.size() != b.size()) return false;
      auto x = a.items().begin();
      auto y = b.items().begin();
      for (; x != a.items().end(); ++x, ++y) {
        if (AsLogged(x.key()) != y.key() || !Same(x.value(), y.value())) return false;
      }
      return true;
    }
    default:
      return true;
  }
}

void CheckLine(absl::string_view line) {
  // The visitor sees every element of the record's array members.
  absl::flat_hash_map<std::string, uint64_t> visited;
  const LogArrayVisitor<Json> visit = [&](absl::string_view member, const Json&) {
    ++visited[std::string(member)];
  };
  const LogLine<Json> v = ParseLogLine<Json>(line, visit);
  if (!v.ok()) {
    const std::string m(v.error->ToStatus().message());
    Require(absl::StartsWith(m, "JSON: ") && OneLine(m), "a JSON error is not one line", m);
    Require(v.error->offset <= line.size(), "a JSON error names an offset past the line", m);
    return;
  }
  std::string printed;
  Print(v.record, &printed);
  const LogLine<Json> again = ParseLogLine<Json>(printed);
  Require(again.ok(), "a printed value does not parse", printed);
  Require(Same(v.record, again.record), "a printed value parses differently", printed);
  // What a parse keeps is bounded; what it cut is counted.
  for (const auto& [member, count] : v.left_out) {
    Require(count > 0, "a member with nothing left out is listed", member);
  }
  if (v.record.is_object()) {
    for (const auto& [key, value] : v.record.items()) {
      if (!value.is_array()) continue;
      Require(value.size() <= kMaxLogJsonElements, "an array kept whole past the cap", key);
      Require(visited[key] >= value.size(), "array elements not visited", key);
    }
  }
}

// ---- ParseWorkload: errors name a line; a Workload is consistent ----

void CheckWorkloadOf(const Workload& t, size_t lines);

void CheckWorkload(absl::string_view text, uint64_t granularity) {
  const size_t lines = std::count(text.begin(), text.end(), '\n') + 1;
  const absl::StatusOr<Workload> workload = ParseWorkload(text, granularity);
  if (!workload.ok()) {
    const absl::string_view m = workload.status().message();
    Require(OneLine(m), "a log error is not one line", m);
    uint64_t line = 0;
    Require(absl::StartsWith(m, "line ") && absl::SimpleAtoi(m.substr(5, m.find(':') - 5), &line) &&
                line >= 1 && line <= lines,
            "a log error does not name a line of the log", m);
    return;
  }
  CheckWorkloadOf(*workload, lines);
}

// A Workload of a log of `lines` lines is consistent.
void CheckWorkloadOf(const Workload& t, size_t lines) {
  size_t last_line = 0, allocs = 0, launches = 0, unknown = 0;
  uint64_t live = 0, peak = 0;
  std::set<uint64_t> allocated, freed;
  for (const WorkloadOp& op : t.ops) {
    const std::string where = absl::StrCat("operation at line ", op.line);
    Require(op.line > last_line && op.line <= lines, "operations out of line order", where);
    last_line = op.line;
    launches += op.launch;
    unknown += op.kind == WorkloadOp::Kind::kUnknown;
    auto live_buffer = [&](uint64_t id) {
      return allocated.count(id) != 0 && freed.count(id) == 0;
    };
    if (op.kind == WorkloadOp::Kind::kAlloc) {
      ++allocs;
      const auto it = t.buffers.find(op.buffer);
      Require(it != t.buffers.end(), "an allocation without its buffer", where);
      Require(allocated.insert(op.buffer).second, "a buffer allocated twice", where);
      const WorkloadBuffer& b = it->second;
      Require(b.charge >= b.bytes, "a charge below the bytes", where);
      Require(!b.swappable || b.charge % t.granularity == 0,
              "a swappable charge not in whole granules", where);
      Require(live + b.charge >= live, "the live charges overflow", where);
      live += b.charge;
      peak = std::max(peak, live);
      continue;
    }
    if (op.kind == WorkloadOp::Kind::kFree) {
      Require(live_buffer(op.buffer), "a free of a buffer not live", where);
      freed.insert(op.buffer);
      live -= t.buffers.at(op.buffer).charge;
      continue;
    }
    std::set<uint64_t> ids;
    for (uint64_t id : op.ids) {
      Require(live_buffer(id), "an operation on a buffer not live", where);
      Require(ids.insert(id).second, "an id listed twice", where);
    }
    for (uint64_t id : op.writes) Require(ids.count(id) != 0, "a write not prepared", where);
    for (uint64_t id : op.overwritten) {
      Require(std::count(op.writes.begin(), op.writes.end(), id) != 0,
              "an overwrite that is not a write", where);
    }
    if (op.kind == WorkloadOp::Kind::kHostRead) {
      Require(op.ids.size() == 1 && op.ids[0] == op.buffer && t.buffers.at(op.buffer).swappable,
              "a host read not of one swappable buffer", where);
    }
  }
  Require(allocs == t.buffers.size(), "buffers without an allocation", "");
  Require(
      launches == t.launches && unknown == t.unknown_launches && t.unknown_launches <= t.launches,
      "launch counts", "");
  Require(peak == t.working_set, "the working set is not the peak of the live charges",
          absl::StrCat(peak, " vs ", t.working_set));
}

// ---- A well-formed log from the input's bytes, read back ----

class Bytes {
 public:
  explicit Bytes(absl::string_view data) : data_(data) {}
  bool empty() const { return pos_ >= data_.size(); }
  uint8_t Next() { return empty() ? 0 : static_cast<uint8_t>(data_[pos_++]); }
  absl::string_view Take(size_t n) {
    n = std::min(n, data_.size() - std::min(pos_, data_.size()));
    const absl::string_view s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  absl::string_view data_;
  size_t pos_ = 0;
};

void CheckWrittenLog(absl::string_view data) {
  constexpr uint64_t kGranule = 2u << 20;
  Bytes in(data);
  struct Live {
    uint64_t id, addr, bytes;
  };
  std::vector<Live> live;
  std::vector<WorkloadOp> expected;
  std::vector<std::string> kernels;  // per launch, in order
  std::string text =
      JsonLine().Str("type", "header").Uint("format", 1).Raw("config", "{}").Finish() + "\n";
  size_t line = 1;
  uint64_t next_id = 1, next_addr = uint64_t{1} << 40;
  for (int records = 0; records < 64 && !in.empty(); ++records) {
    const uint8_t op = in.Next();
    JsonLine r;
    WorkloadOp e;
    switch (op % 6) {
      case 0:
      case 1: {  // a cuMemAlloc, small or in granules
        const uint64_t bytes =
            op & 0x10 ? (1 + in.Next()) * kGranule + in.Next() : 1 + in.Next() * 97;
        const Live b{next_id++, next_addr, bytes};
        next_addr += (bytes / kGranule + 2) * kGranule;
        live.push_back(b);
        r.Str("type", "alloc")
            .Str("api", "cuMemAlloc_v2")
            .Uint("id", b.id)
            .Str("addr", absl::StrCat("0x", absl::Hex(b.addr)))
            .Uint("bytes", b.bytes)
            .Uint("device", 0)
            .Str("kind", "device");
        e.kind = WorkloadOp::Kind::kAlloc;
        e.buffer = b.id;
        break;
      }
      case 2: {  // a free
        if (live.empty()) continue;
        const size_t i = in.Next() % live.size();
        r.Str("type", "free")
            .Str("api", "cuMemFree_v2")
            .Uint("id", live[i].id)
            .Str("addr", absl::StrCat("0x", absl::Hex(live[i].addr)))
            .Uint("bytes", live[i].bytes);
        e.kind = WorkloadOp::Kind::kFree;
        e.buffer = live[i].id;
        live.erase(live.begin() + i);
        break;
      }
      case 3: {  // a launch: reads, writes (listed in reads too), a name
        std::vector<uint64_t> reads, writes;
        const uint8_t picks = in.Next();
        for (size_t i = 0; i < live.size() && i < 8; ++i) {
          if (picks & (1u << i)) reads.push_back(live[i].id);
        }
        for (uint64_t id : reads) {
          if (in.Next() & 1) writes.push_back(id);
        }
        const std::string kernel(in.Take(in.Next() % 24));
        kernels.push_back(kernel);
        const bool inferred = (op & 0x40) == 0;
        r.Str("type", "launch")
            .Str("api", "cuLaunchKernel")
            .Str("kernel", kernel)
            .Str("stream", "legacy")
            .Raw("grid", "[1,1,1]")
            .Raw("block", "[32,1,1]")
            .Uints("reads", reads)
            .Uints("writes", writes)
            .Bool("inferred", inferred)
            .Raw("tables", "[]")
            .Bool("unknown_tables", false);
        e.kind = inferred ? WorkloadOp::Kind::kAccess : WorkloadOp::Kind::kUnknown;
        e.launch = true;
        e.ids = reads;
        e.writes = writes;
        break;
      }
      case 4: {  // a memset, whole or a prefix
        if (live.empty()) continue;
        const Live& b = live[in.Next() % live.size()];
        const bool whole = in.Next() & 1;
        const uint64_t bytes = whole ? b.bytes : (b.bytes + 1) / 2;
        const bool really_whole = bytes == b.bytes;
        r.Str("type", "memset")
            .Str("api", "cuMemsetD8_v2")
            .Uint("bytes", bytes)
            .Str("dst", absl::StrCat("0x", absl::Hex(b.addr)))
            .Uints("writes", {b.id})
            .Str("stream", "legacy")
            .Bool("async", false);
        e.kind = WorkloadOp::Kind::kAccess;
        e.ids = {b.id};
        e.writes = {b.id};
        if (really_whole) e.overwritten = {b.id};
        break;
      }
      default: {  // a synchronous host-to-device copy of all of a buffer
        if (live.empty()) continue;
        const Live& b = live[in.Next() % live.size()];
        r.Str("type", "memcpy")
            .Str("api", "cuMemcpyHtoD_v2")
            .Str("kind", "HtoD")
            .Uint("bytes", b.bytes)
            .Str("dst", absl::StrCat("0x", absl::Hex(b.addr)))
            .Str("src", "0x7ffd00000000")
            .Uints("reads", {})
            .Uints("writes", {b.id})
            .Str("stream", "legacy")
            .Bool("async", false);
        e.kind = WorkloadOp::Kind::kAccess;
        e.ids = {b.id};
        e.writes = {b.id};
        e.overwritten = {b.id};
        break;
      }
    }
    absl::StrAppend(&text, r.Finish(), "\n");
    e.line = ++line;
    expected.push_back(std::move(e));
  }
  const absl::StatusOr<Workload> workload = ParseWorkload(text, kGranule);
  Require(workload.ok(), "a well-formed log does not parse",
          absl::StrCat(workload.status().message(), "\n", text));
  Require(workload->ops.size() == expected.size(), "a well-formed log reads back other operations",
          text);
  for (size_t i = 0; i < expected.size(); ++i) {
    const WorkloadOp& a = workload->ops[i];
    const WorkloadOp& e = expected[i];
    Require(a.kind == e.kind && a.line == e.line && a.launch == e.launch &&
                (e.kind != WorkloadOp::Kind::kAlloc && e.kind != WorkloadOp::Kind::kFree
                     ? true
                     : a.buffer == e.buffer) &&
                a.ids == e.ids && a.writes == e.writes && a.overwritten == e.overwritten,
            "an operation reads back differently", absl::StrCat("line ", e.line, "\n", text));
  }
  // The kernel names round-trip through the writer and the reader.
  size_t k = 0;
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    if (!absl::StrContains(l, "\"type\":\"launch\"")) continue;
    const LogLine<Json> v = ParseLogLine<Json>(l);
    Require(v.ok() && k < kernels.size() && v.record.is_object() && v.record.contains("kernel") &&
                v.record["kernel"] == AsLogged(kernels[k]),
            "a kernel name does not round-trip", l);
    ++k;
  }
  Require(k == kernels.size(), "launch lines lost", text);
}

// ---- Logs of scale (STENSOR_FUZZ_SCALE): long, wide, many buffers ----

// A generated log (tools/log_generator.h, ScaleLogFromBytes) read and
// replayed whole, on the driver's bounded stack (Target().stack_bytes):
// nothing may recurse as deep as the log is long. The workload is consistent
// (CheckWorkload); unspliced, it holds every record as an operation and the
// wide launch its buffers once each; the LP bound runs, and no policy moves
// less than it, nor less than a whole schedule proven optimal.
void CheckScale(absl::string_view data) {
  const ScaleLog log = ScaleLogFromBytes(data);
  const absl::StatusOr<Workload> workload = ParseWorkload(log.text);
  const size_t lines = std::count(log.text.begin(), log.text.end(), '\n') + 1;
  if (!workload.ok()) {
    CheckWorkload(log.text, kDefaultGranularity);  // the error names a line
    return;
  }
  CheckWorkloadOf(*workload, lines);
  if (!log.spliced) {
    const size_t records = lines - 3;  // not the header, the end, the empty last
    Require(workload->ops.size() == records, "a generated log reads back other operations",
            absl::StrCat(workload->ops.size(), " of ", records));
    if (log.spec.shape == GeneratedLog::Shape::kWide) {
      std::vector<uint64_t> all;
      for (uint64_t id = 1; id <= log.spec.buffers; ++id) all.push_back(id);
      const auto launch = std::find_if(workload->ops.begin(), workload->ops.end(),
                                       [](const WorkloadOp& op) { return op.launch; });
      Require(launch != workload->ops.end() && launch->ids == all,
              "the wide launch does not name each of its buffers once", "");
    }
  }
  // Wide: the launch needs every buffer at once.
  const uint64_t percent = log.spec.shape == GeneratedLog::Shape::kWide ? 100 : 30 + log.knob % 71;
  OptimumOptions options;
  options.cap = workload->working_set / 100 * percent;
  options.rounds = 1;
  const absl::StatusOr<OptimumBound> bound = ComputeOptimumBound(*workload, options);
  if (!bound.ok()) {
    Require(bound.status().code() == absl::StatusCode::kFailedPrecondition,
            "the bound failed otherwise than for a cap too small", bound.status().message());
    return;
  }
  std::unique_ptr<EvictionPolicy> belady = MakeBeladyPolicy();
  ReplayOptions replay;
  replay.cap = options.cap;
  replay.policy = belady.get();
  replay.host_vmm = false;  // the bound's rules: whole buffers, nothing served
  const absl::StatusOr<ReplayResult> moved = Replay(*workload, replay);
  if (!moved.ok()) return;  // out of memory: what the bound does not model
  Require(moved->bytes_moved() >= bound->bytes_moved, "a policy moved less than the bound",
          absl::StrCat(moved->bytes_moved(), " < ", bound->bytes_moved));
  if (bound->proven()) {
    Require(moved->bytes_moved() >= bound->schedule_bytes.moved(),
            "a policy moved less than the optimum", "");
  }
}

}  // namespace

namespace fuzz {
namespace {

const char kHeader[] =
    R"j({"type":"header","format":1,"pid":19719,"devices":[{"ordinal":0,"name":"fakecuda device 0","total_bytes":17179869184}],"config":{"STENSOR_MEMORY_LIMIT": "40%", "STENSOR_POLICY": "version", "STENSOR_PREFETCH": true, "STENSOR_ACCESS_LOG": "/tmp/p2/mlp20.jsonl", "STENSOR_STATS": false}})j";

// Records as the library writes them (tools/testdata's logs).
const char* const kRecords[] = {
    R"j({"type":"alloc","api":"cuMemAlloc_v2","id":1,"addr":"0x7f425f800000","bytes":4194304,"device":0,"kind":"device"})j",
    R"j({"type":"alloc","api":"cuMemAlloc_v2","id":2,"addr":"0x7f4261300000","bytes":4096,"device":0,"kind":"device"})j",
    R"j({"type":"alloc","api":"cuMemAllocAsync","id":3,"addr":"0x7f7a67233000","bytes":1040,"device":0,"kind":"stream_ordered"})j",
    R"j({"type":"launch","api":"cuLaunchKernel","kernel":"_ZN3mlp11synth_shardEPfPiiiiijf","demangled":"mlp::synth_shard(float*, int*, int, int, int, int, unsigned int, float)","stream":"legacy","grid":[4096,1,1],"block":[256,1,1],"reads":[1,2],"writes":[1,2],"inferred":true,"tables":[],"unknown_tables":false,"compute_us":12.5})j",
    R"j({"type":"memcpy","api":"cuMemcpyDtoH_v2","kind":"DtoH","bytes":4,"dst":"0x7ffc73b56200","src":"0x7f425f800000","reads":[1],"writes":[],"stream":"legacy","async":false})j",
    R"j({"type":"memcpy","api":"cuMemcpyDtoHAsync_v2","kind":"DtoH","bytes":4,"dst":"0x7ffc028a90f0","src":"0x7f4261300000","reads":[2],"writes":[],"stream":"0x555808da49d0","async":true})j",
    R"j({"type":"memcpy","api":"cuMemcpyHtoD_v2","kind":"HtoD","bytes":4194304,"dst":"0x7f425f800000","src":"0x7ffd00000000","reads":[],"writes":[1],"stream":"legacy","async":false})j",
    R"j({"type":"memset","api":"cuMemsetD32_v2","bytes":4096,"dst":"0x7f4261300000","writes":[2],"stream":"legacy","async":false})j",
    R"j({"type":"memset","api":"cuMemsetD2D8_v2","bytes":4096,"dst":"0x7f425f800000","writes":[1],"stream":"legacy","async":false})j",
    R"j({"type":"sync","api":"cuStreamSynchronize","stream":"0x555808da49d0"})j",
    R"j({"type":"graph_launch","api":"cuGraphLaunch","stream":"legacy"})j",
    R"j({"type":"swap_out","id":1,"bytes":4194304})j",
    R"j({"type":"drop_clean","id":1,"bytes":4194304})j",
    R"j({"type":"swap_in","id":1,"bytes":4194304,"copy":true})j",
    R"j({"type":"free","api":"cuMemFreeAsync","id":3,"addr":"0x7f7a67233000","bytes":1040})j",
    R"j({"type":"free","api":"cuMemFree_v2","id":1,"addr":"0x7f425f800000","bytes":4194304})j",
    R"j({"type":"end","counts":{"alloc":54,"free":54,"launch":435,"memcpy":26,"memset":9,"sync":0,"graph_launch":0},"live_buffers":0,"host_pinned_bytes":0,"dropped":0})j",
};

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  std::string log = std::string(kHeader) + "\n";
  for (const char* r : kRecords) {
    seeds.push_back(r);
    absl::StrAppend(&log, r, "\n");
  }
  seeds.push_back(log);
  seeds.push_back(log.substr(0, log.size() / 2));  // cut mid-record
  // Values at the edges of what the reader keeps exactly.
  seeds.push_back(std::string(kHeader) + "\n" +
                  R"({"type":"alloc","id":18446744073709551615,"bytes":18446744073709551615})");
  seeds.push_back(
      R"({"type":"alloc","id":4611686018427387904,"bytes":4096}
{"type":"alloc","id":0,"bytes":4096}
{"type":"free","id":4611686018427387904})");
  seeds.push_back(
      R"({"type":"alloc","id":1,"bytes":9223372036854775808}
{"type":"alloc","id":2,"bytes":9223372036854775808}
{"type":"alloc","id":3,"bytes":4096})");
  seeds.push_back(R"({"type":"header","format":2})");
  seeds.push_back(
      R"([1e999,-1e999,-0,0.1,1.5e-300,"\ud83d\ude00\u0000\/",{"a":[[[]]]},null,true])");
  seeds.push_back(std::string(200, '[') + std::string(200, ']'));
  // Bytes for the written log: allocs, launches, memsets, copies, frees.
  seeds.push_back(std::string(
      "\x00\x01\x10\x02\x03\x07\x01\x00\x05kern\"\\\n\x04\x01\x01\x05\x00\x02\x00", 24));
  return seeds;
}

}  // namespace

const FuzzTarget& Target() {
#ifdef STENSOR_FUZZ_SCALE
  // Past the first thousands of operations, a recursion as deep as the log
  // overflows this stack.
  static const FuzzTarget* const target = new FuzzTarget{
      "log_fuzz_scale",
      // A free and a launch of buffers never allocated, a cut record.
      ScaleLogSeeds({R"({"type":"free","api":"cuMemFree_v2","id":7})",
                     R"({"type":"launch","reads":[1,999999],"writes":[]})",
                     R"({"type":"alloc","id":1,"bytes":)"}),
      {"\n", "{", "}", "\"reads\":[", "\"type\":\"free\""},
      512,
      128 << 10,
  };
  return *target;
#else
  static const FuzzTarget* const target = new FuzzTarget{
      "log_fuzz",
      Seeds(),
      {"\n",
       "{",
       "}",
       "[",
       "]",
       ",",
       ":",
       "\"",
       "\\u",
       "\\ud800",
       "\\udc00",
       "1e999",
       "-0",
       "18446744073709551615",
       "18446744073709551616",
       "4611686018427387904",
       "9223372036854775808",
       "\"type\":",
       "\"alloc\"",
       "\"free\"",
       "\"launch\"",
       "\"memcpy\"",
       "\"memset\"",
       "\"header\"",
       "\"id\":",
       "\"bytes\":",
       "\"reads\":[",
       "\"writes\":[",
       "\"kind\":\"DtoH\"",
       "\"async\":false",
       "\"inferred\":false",
       "\"format\":",
       "\"addr\":\"0x",
       "\"dst\":\"0x",
       "\"api\":\"cuMemAlloc_v2\"",
       "\"kind\":\"app_vmm\""},
      8192,
      0,
  };
  return *target;
#endif
}

}  // namespace fuzz
}  // namespace stensor

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
#ifdef STENSOR_FUZZ_SCALE
  stensor::CheckScale(text);
  return 0;
#endif
  for (absl::string_view line : absl::StrSplit(text, '\n')) stensor::CheckLine(line);
  stensor::CheckWorkload(text, stensor::kDefaultGranularity);
  stensor::CheckWorkload(text, 4096);
  stensor::CheckWrittenLog(text);
  return 0;
}
