// Fuzz target for the access-log reader: tools/json_reader.h (ParseJson,
// one record per line) and tools/trace.h (ParseTrace, the log read into the
// operations `stensor sim` replays and the optimum bounds).
//
// Input: the bytes are a log. Checked on every input:
// - each line through ParseJson: it returns; an error is one line
//   "JSON: ... at offset N" with N within the line; a value prints back
//   (a canonical writer here) as text that parses to the same value;
// - the whole text through ParseTrace, at two granularities: it returns; an
//   error is one printable line that names the log line ("line N: ", N
//   within the text); a Trace is consistent: operations in line order, each
//   naming live, allocated buffers (writes among the prepared ids, whole
//   overwrites among the writes, no id twice), one buffer per allocation,
//   charges that cover the bytes, swappable charges in whole granules, the
//   launch counts, and a working set equal to the peak of the live charges;
// - a well-formed log that the input's bytes describe (allocations, frees,
//   launches with kernel names made of the input's bytes, memsets, copies),
//   written with core/json.h (the access log's own writer): ParseTrace reads
//   back exactly the operations written, and each kernel name round-trips
//   (invalid UTF-8 replaced by U+FFFD, as core/json.h promises).
// A broken check aborts, which libFuzzer and fuzz_main.cc report as a crash.
//
// Built by //tools:log_fuzz with core/fuzz_main.cc as a bounded regression
// test, and by `scripts/fuzz.sh log` with libFuzzer.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/fuzz_target.h"
#include "core/json.h"
#include "tools/json_reader.h"
#include "tools/trace.h"

namespace stensor {
namespace {

void Require(bool condition, absl::string_view what, absl::string_view detail) {
  if (condition) return;
  const size_t shown = std::min<size_t>(detail.size(), 800);
  std::fprintf(stderr, "log_fuzz: %.*s\n  %.*s\n", static_cast<int>(what.size()),
               what.data(), static_cast<int>(shown), detail.data());
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
    const size_t length = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
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

// ---- ParseJson: canonical printing and structural equality ----

void Print(const JsonValue& v, std::string* out) {
  switch (v.kind) {
    case JsonValue::Kind::kNull: out->append("null"); break;
    case JsonValue::Kind::kBool: out->append(v.boolean ? "true" : "false"); break;
    case JsonValue::Kind::kNumber:
      if (v.uint) {
        absl::StrAppend(out, *v.uint);
      } else if (std::isinf(v.number)) {
        out->append(v.number > 0 ? "1e999" : "-1e999");  // what parsed to it
      } else {
        char buffer[40];
        std::snprintf(buffer, sizeof(buffer), "%.17g", v.number);
        out->append(buffer);
        // The reader keeps `uint` only for integer literals, so a value
        // written "1.0" or "0e5" must not print back as "1" or "0".
        if (absl::string_view(buffer).find_first_of(".e") == absl::string_view::npos) {
          out->append("e0");
        }
      }
      break;
    case JsonValue::Kind::kString: AppendJsonString(out, v.string); break;
    case JsonValue::Kind::kArray:
      out->push_back('[');
      for (size_t i = 0; i < v.array.size(); ++i) {
        if (i > 0) out->push_back(',');
        Print(v.array[i], out);
      }
      out->push_back(']');
      break;
    case JsonValue::Kind::kObject:
      out->push_back('{');
      for (size_t i = 0; i < v.object.size(); ++i) {
        if (i > 0) out->push_back(',');
        AppendJsonString(out, v.object[i].first);
        out->push_back(':');
        Print(v.object[i].second, out);
      }
      out->push_back('}');
      break;
  }
}

// Whether `b`, read back from `a` printed, is `a`: strings as the writer
// stores them (invalid UTF-8 the reader accepted comes back as U+FFFD).
bool Same(const JsonValue& a, const JsonValue& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case JsonValue::Kind::kNull: return true;
    case JsonValue::Kind::kBool: return a.boolean == b.boolean;
    case JsonValue::Kind::kNumber:
      // %.17g round-trips every double; integers print exactly.
      return a.uint == b.uint && (a.uint || a.number == b.number);
    case JsonValue::Kind::kString: return AsLogged(a.string) == b.string;
    case JsonValue::Kind::kArray:
      if (a.array.size() != b.array.size()) return false;
      for (size_t i = 0; i < a.array.size(); ++i) {
        if (!Same(a.array[i], b.array[i])) return false;
      }
      return true;
    case JsonValue::Kind::kObject:
      if (a.object.size() != b.object.size()) return false;
      for (size_t i = 0; i < a.object.size(); ++i) {
        if (AsLogged(a.object[i].first) != b.object[i].first ||
            !Same(a.object[i].second, b.object[i].second)) {
          return false;
        }
      }
      return true;
  }
  return false;
}

void CheckLine(absl::string_view line) {
  const absl::StatusOr<JsonValue> v = ParseJson(line);
  if (!v.ok()) {
    const absl::string_view m = v.status().message();
    Require(absl::StartsWith(m, "JSON: ") && OneLine(m), "a JSON error is not one line", m);
    const size_t at = m.rfind(" at offset ");
    uint64_t offset = 0;
    Require(at != absl::string_view::npos &&
                absl::SimpleAtoi(m.substr(at + 11), &offset) && offset <= line.size(),
            "a JSON error does not name an offset in the line", m);
    return;
  }
  std::string printed;
  Print(*v, &printed);
  const absl::StatusOr<JsonValue> again = ParseJson(printed);
  Require(again.ok(), "a printed value does not parse", printed);
  Require(Same(*v, *again), "a printed value parses differently", printed);
}

// ---- ParseTrace: errors name a line; a Trace is consistent ----

void CheckTrace(absl::string_view text, uint64_t granularity) {
  const size_t lines = std::count(text.begin(), text.end(), '\n') + 1;
  const absl::StatusOr<Trace> trace = ParseTrace(text, granularity);
  if (!trace.ok()) {
    const absl::string_view m = trace.status().message();
    Require(OneLine(m), "a log error is not one line", m);
    uint64_t line = 0;
    Require(absl::StartsWith(m, "line ") &&
                absl::SimpleAtoi(m.substr(5, m.find(':') - 5), &line) && line >= 1 &&
                line <= lines,
            "a log error does not name a line of the log", m);
    return;
  }
  const Trace& t = *trace;
  size_t last_line = 0, allocs = 0, launches = 0, unknown = 0;
  uint64_t live = 0, peak = 0;
  std::set<uint64_t> allocated, freed;
  for (const TraceOp& op : t.ops) {
    const std::string where = absl::StrCat("operation at line ", op.line);
    Require(op.line > last_line && op.line <= lines, "operations out of line order", where);
    last_line = op.line;
    launches += op.launch;
    unknown += op.kind == TraceOp::Kind::kUnknown;
    auto live_buffer = [&](uint64_t id) {
      return allocated.count(id) != 0 && freed.count(id) == 0;
    };
    if (op.kind == TraceOp::Kind::kAlloc) {
      ++allocs;
      const auto it = t.buffers.find(op.buffer);
      Require(it != t.buffers.end(), "an allocation without its buffer", where);
      Require(allocated.insert(op.buffer).second, "a buffer allocated twice", where);
      const TraceBuffer& b = it->second;
      Require(b.charge >= b.bytes, "a charge below the bytes", where);
      Require(!b.swappable || b.charge % t.granularity == 0,
              "a swappable charge not in whole granules", where);
      Require(live + b.charge >= live, "the live charges overflow", where);
      live += b.charge;
      peak = std::max(peak, live);
      continue;
    }
    if (op.kind == TraceOp::Kind::kFree) {
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
    if (op.kind == TraceOp::Kind::kHostRead) {
      Require(op.ids.size() == 1 && op.ids[0] == op.buffer &&
                  t.buffers.at(op.buffer).swappable,
              "a host read not of one swappable buffer", where);
    }
  }
  Require(allocs == t.buffers.size(), "buffers without an allocation", "");
  Require(launches == t.launches && unknown == t.unknown_launches &&
              t.unknown_launches <= t.launches,
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
  std::vector<TraceOp> expected;
  std::vector<std::string> kernels;  // per launch, in order
  std::string text =
      JsonLine().Str("type", "header").Uint("format", 1).Raw("config", "{}").Finish() + "\n";
  size_t line = 1;
  uint64_t next_id = 1, next_addr = uint64_t{1} << 40;
  for (int records = 0; records < 64 && !in.empty(); ++records) {
    const uint8_t op = in.Next();
    JsonLine r;
    TraceOp e;
    switch (op % 6) {
      case 0:
      case 1: {  // a cuMemAlloc, small or in granules
        const uint64_t bytes =
            op & 0x10 ? (1 + in.Next()) * kGranule + in.Next() : 1 + in.Next() * 97;
        const Live b{next_id++, next_addr, bytes};
        next_addr += (bytes / kGranule + 2) * kGranule;
        live.push_back(b);
        r.Str("type", "alloc").Str("api", "cuMemAlloc_v2").Uint("id", b.id)
            .Str("addr", absl::StrCat("0x", absl::Hex(b.addr))).Uint("bytes", b.bytes)
            .Uint("device", 0).Str("kind", "device");
        e.kind = TraceOp::Kind::kAlloc;
        e.buffer = b.id;
        break;
      }
      case 2: {  // a free
        if (live.empty()) continue;
        const size_t i = in.Next() % live.size();
        r.Str("type", "free").Str("api", "cuMemFree_v2").Uint("id", live[i].id)
            .Str("addr", absl::StrCat("0x", absl::Hex(live[i].addr)))
            .Uint("bytes", live[i].bytes);
        e.kind = TraceOp::Kind::kFree;
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
        r.Str("type", "launch").Str("api", "cuLaunchKernel").Str("kernel", kernel)
            .Str("stream", "legacy").Raw("grid", "[1,1,1]").Raw("block", "[32,1,1]")
            .Uints("reads", reads).Uints("writes", writes).Bool("inferred", inferred)
            .Raw("tables", "[]").Bool("unknown_tables", false);
        e.kind = inferred ? TraceOp::Kind::kAccess : TraceOp::Kind::kUnknown;
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
        r.Str("type", "memset").Str("api", "cuMemsetD8_v2").Uint("bytes", bytes)
            .Str("dst", absl::StrCat("0x", absl::Hex(b.addr))).Uints("writes", {b.id})
            .Str("stream", "legacy").Bool("async", false);
        e.kind = TraceOp::Kind::kAccess;
        e.ids = {b.id};
        e.writes = {b.id};
        if (really_whole) e.overwritten = {b.id};
        break;
      }
      default: {  // a synchronous host-to-device copy of all of a buffer
        if (live.empty()) continue;
        const Live& b = live[in.Next() % live.size()];
        r.Str("type", "memcpy").Str("api", "cuMemcpyHtoD_v2").Str("kind", "HtoD")
            .Uint("bytes", b.bytes).Str("dst", absl::StrCat("0x", absl::Hex(b.addr)))
            .Str("src", "0x7ffd00000000").Uints("reads", {}).Uints("writes", {b.id})
            .Str("stream", "legacy").Bool("async", false);
        e.kind = TraceOp::Kind::kAccess;
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
  const absl::StatusOr<Trace> trace = ParseTrace(text, kGranule);
  Require(trace.ok(), "a well-formed log does not parse",
          absl::StrCat(trace.status().message(), "\n", text));
  Require(trace->ops.size() == expected.size(), "a well-formed log reads back other operations",
          text);
  for (size_t i = 0; i < expected.size(); ++i) {
    const TraceOp& a = trace->ops[i];
    const TraceOp& e = expected[i];
    Require(a.kind == e.kind && a.line == e.line && a.launch == e.launch &&
                (e.kind != TraceOp::Kind::kAlloc && e.kind != TraceOp::Kind::kFree
                     ? true
                     : a.buffer == e.buffer) &&
                a.ids == e.ids && a.writes == e.writes && a.overwritten == e.overwritten,
            "an operation reads back differently", absl::StrCat("line ", e.line, "\n", text));
  }
  // The kernel names round-trip through the writer and the reader.
  size_t k = 0;
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    if (!absl::StrContains(l, "\"type\":\"launch\"")) continue;
    const absl::StatusOr<JsonValue> v = ParseJson(l);
    Require(v.ok() && k < kernels.size() && v->StringOr("kernel", "\x01") == AsLogged(kernels[k]),
            "a kernel name does not round-trip", l);
    ++k;
  }
  Require(k == kernels.size(), "launch lines lost", text);
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
  seeds.push_back(R"([1e999,-1e999,-0,0.1,1.5e-300,"\ud83d\ude00\u0000\/",{"a":[[[]]]},null,true])");
  seeds.push_back(std::string(200, '[') + std::string(200, ']'));
  // Bytes for the written log: allocs, launches, memsets, copies, frees.
  seeds.push_back(std::string("\x00\x01\x10\x02\x03\x07\x01\x00\x05kern\"\\\n\x04\x01\x01\x05\x00\x02\x00",
                              24));
  return seeds;
}

}  // namespace

const FuzzTarget& Target() {
  static const FuzzTarget* const target = new FuzzTarget{
      "log_fuzz",
      Seeds(),
      {"\n", "{", "}", "[", "]", ",", ":", "\"", "\\u", "\\ud800", "\\udc00", "1e999", "-0",
       "18446744073709551615", "18446744073709551616", "4611686018427387904",
       "9223372036854775808", "\"type\":", "\"alloc\"", "\"free\"", "\"launch\"", "\"memcpy\"",
       "\"memset\"", "\"header\"", "\"id\":", "\"bytes\":", "\"reads\":[", "\"writes\":[",
       "\"kind\":\"DtoH\"", "\"async\":false", "\"inferred\":false", "\"format\":",
       "\"addr\":\"0x", "\"dst\":\"0x", "\"api\":\"cuMemAlloc_v2\"", "\"kind\":\"app_vmm\""},
      8192,
      0,
  };
  return *target;
}

}  // namespace fuzz
}  // namespace stensor

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  for (absl::string_view line : absl::StrSplit(text, '\n')) stensor::CheckLine(line);
  stensor::CheckTrace(text, stensor::kDefaultGranularity);
  stensor::CheckTrace(text, 4096);
  stensor::CheckWrittenLog(text);
  return 0;
}
