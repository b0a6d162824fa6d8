// Fake driver: FAKECUDA_TRACE, the device's timeline as Chrome trace events
// (the JSON object form: {"traceEvents": [...]}, times in microseconds).
//
// Tracks ("tid"s of one "pid", the process): first the copy engines, two
// per device (1 + 2 * device + direction), then the streams in the order
// they were created. Records are kept as plain data and only formatted at
// exit, so tracing a run costs little more than a clock read and an append
// per operation.
#include "tests/fakecuda/trace.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fakecuda {
namespace {

enum class RecordType : uint8_t { kStreamOp, kEngine };

// One stream operation or one copy engine window, as recorded.
struct Record {
  int64_t begin_ns = 0;  // op: start, after its dependencies; engine: window start
  int64_t end_ns = 0;    // op: end; engine: window end
  int64_t aux_ns = 0;    // op: submitted; engine: reached the engine
  int64_t aux2_ns = 0;   // op: at the head of its stream; engine: done
  uint64_t bytes = 0;
  uint32_t track = 0;
  uint32_t other = 0;   // op: the stream that held it; engine: the stream served
  uint32_t name = 0;    // op kKernel: index into Tracer::names
  uint32_t faults = 0;  // op kKernel: faults that counted its host touches
  RecordType type = RecordType::kStreamOp;
  OpKind op_kind = OpKind::kOther;
  CopyDir dir = CopyDir::kHtoH;
  Link link = Link::kNone;
};

struct Track {
  std::string name;
  bool used = false;  // has a record (engines are listed only then)
};

struct Tracer {
  std::mutex mu;
  bool started = false;        // guarded by mu; StartTrace could create the file
  bool written = false;        // guarded by mu; later records are dropped
  std::string path;            // as created (%p replaced)
  int64_t origin_ns = 0;       // time 0 of the file; set before tracing starts
  size_t max_records = 0;      // set before tracing starts
  std::deque<Record> records;  // guarded by mu; a deque never moves them
  uint64_t dropped = 0;        // guarded by mu
  int64_t first_drop_ns = 0;   // guarded by mu
  std::vector<Track> tracks;   // guarded by mu; index = tid (0 unused)
  // Kernel names, interned: a launch's name is copied once per kernel.
  std::deque<std::string> names;                              // guarded by mu
  std::unordered_map<std::string_view, uint32_t> name_index;  // guarded by mu
};

Tracer& GetTracer() {
  static Tracer* t = new Tracer;  // leaked: stream workers outlive exit()
  return *t;
}

thread_local uint32_t t_current_track = 0;

int EngineTrack(int device, Link link) {
  return 1 + 2 * device + (link == Link::kDeviceToHost ? 1 : 0);
}

// FAKECUDA_TRACE's value with every %p replaced by the process id, so that
// each process of a run can write its own file.
std::string ExpandPath(const std::string& value) {
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] == '%' && i + 1 < value.size() && value[i + 1] == 'p') {
      out += std::to_string(getpid());
      ++i;
    } else {
      out += value[i];
    }
  }
  return out;
}

// --- Formatting (at exit only) ----------------------------------------------

// Text of the file, built with appends and written in large blocks: a
// million records must not take seconds of printf at exit.
class Writer {
 public:
  explicit Writer(FILE* f) : f_(f) { buf_.reserve(kBlock + 4096); }

  Writer& S(std::string_view s) {
    buf_.append(s);
    return *this;
  }
  Writer& U(uint64_t v) {
    char b[24];
    buf_.append(b, std::to_chars(b, b + sizeof(b), v).ptr);
    return *this;
  }
  // Signed nanoseconds as microseconds with three exact decimals.
  Writer& Us(int64_t ns) {
    uint64_t mag = ns < 0 ? 0 - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
    if (ns < 0) buf_ += '-';
    U(mag / 1000);
    char frac[4] = {'.', static_cast<char>('0' + mag % 1000 / 100),
                    static_cast<char>('0' + mag % 100 / 10), static_cast<char>('0' + mag % 10)};
    buf_.append(frac, 4);
    return *this;
  }
  // A JSON string literal.
  Writer& Q(std::string_view s) {
    buf_ += '"';
    for (unsigned char c : s) {
      if (c == '"' || c == '\\') {
        buf_ += '\\';
        buf_ += static_cast<char>(c);
      } else if (c < 0x20) {
        static const char kHex[] = "0123456789abcdef";
        buf_.append("\\u00");
        buf_ += kHex[c >> 4];
        buf_ += kHex[c & 15];
      } else {
        buf_ += static_cast<char>(c);
      }
    }
    buf_ += '"';
    return *this;
  }
  // Called between events: writes out a full block.
  void Spill() {
    if (buf_.size() >= kBlock) Write();
  }
  // Writes the rest; false on an I/O error (errno says which).
  bool Finish() {
    Write();
    return ok_;
  }

 private:
  static constexpr size_t kBlock = 1 << 20;
  void Write() {
    if (ok_ && !buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size()) {
      ok_ = false;
    }
    buf_.clear();
  }

  FILE* f_;
  std::string buf_;
  bool ok_ = true;
};

// "4 MiB", "1.5 KiB", "100 B".
std::string Bytes(uint64_t b) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && b >= (uint64_t{1} << (10 * (u + 1)))) ++u;
  uint64_t unit = uint64_t{1} << (10 * u);
  std::string out = std::to_string(b / unit);
  if (b % unit != 0) {
    // One decimal, rounded down: exact for what divides a tenth.
    out += '.';
    out += static_cast<char>('0' + (b % unit) * 10 / unit);
  }
  return out + " " + kUnits[u];
}

// A kernel's name as C++ source spells it (the symbol when it is not
// mangled, e.g. extern "C").
std::string Demangled(const std::string& symbol) {
  int status = 0;
  char* d = abi::__cxa_demangle(symbol.c_str(), nullptr, nullptr, &status);
  if (status != 0 || d == nullptr) return symbol;
  std::string out(d);
  std::free(d);
  return out;
}

const char* CopyDirName(CopyDir d) {
  switch (d) {
    case CopyDir::kHtoD:
      return "HtoD";
    case CopyDir::kDtoH:
      return "DtoH";
    case CopyDir::kDtoD:
      return "DtoD";
    case CopyDir::kHtoH:
      return "HtoH";
  }
  return "?";
}

// The slice's name and category of a stream operation.
void Describe(const Record& r, const std::vector<std::string>& kernels, std::string* name,
              const char** cat) {
  switch (r.op_kind) {
    case OpKind::kKernel:
      *name = kernels[r.name];
      *cat = "kernel";
      return;
    case OpKind::kCopy:
      *name = std::string("memcpy ") + CopyDirName(r.dir) + " " + Bytes(r.bytes);
      *cat = "copy";
      return;
    case OpKind::kMemset:
      *name = "memset " + Bytes(r.bytes);
      *cat = "memset";
      return;
    case OpKind::kHostFunc:
      *name = "host func";
      *cat = "host";
      return;
    case OpKind::kEventRecord:
      *name = "event record";
      *cat = "event";
      return;
    case OpKind::kWaitEvent:
      *name = "wait event";
      *cat = "event";
      return;
    case OpKind::kFree:
      *name = "free (stream-ordered)";
      *cat = "memory";
      return;
    case OpKind::kGraph:
      *name = "graph launch";
      *cat = "graph";
      return;
    case OpKind::kOther:
      break;
  }
  *name = "operation";
  *cat = "other";
}

// Writes the whole file; false on an I/O error (errno says which).
bool WriteJson(FILE* f, const std::deque<Record>& records, const std::vector<Track>& tracks,
               const std::deque<std::string>& names, int64_t origin_ns, size_t max_records,
               uint64_t dropped, int64_t first_drop_ns) {
  const uint64_t pid = static_cast<uint64_t>(getpid());
  std::vector<std::string> kernels;
  kernels.reserve(names.size());
  for (const std::string& n : names) kernels.push_back(Demangled(n));
  auto track_name = [&](uint32_t tid) -> std::string_view {
    return tid < tracks.size() ? std::string_view(tracks[tid].name) : "unknown";
  };

  Writer w(f);
  w.S("{\"traceEvents\":[\n{\"ph\":\"M\",\"pid\":")
      .U(pid)
      .S(",\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":")
      .Q(std::string("fakecuda: ") + program_invocation_short_name)
      .S("}}");
  for (uint32_t tid = 1; tid < tracks.size(); ++tid) {
    const Track& t = tracks[tid];
    if (t.name.empty() || (!t.used && t.name.rfind("stream ", 0) != 0)) continue;
    w.S(",\n{\"ph\":\"M\",\"pid\":")
        .U(pid)
        .S(",\"tid\":")
        .U(tid)
        .S(",\"name\":\"thread_name\",\"args\":{\"name\":")
        .Q(t.name)
        .S("}}");
    w.S(",\n{\"ph\":\"M\",\"pid\":")
        .U(pid)
        .S(",\"tid\":")
        .U(tid)
        .S(",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":")
        .U(tid)
        .S("}}");
  }
  std::string name;
  const char* cat = "";
  for (const Record& r : records) {
    w.Spill();
    w.S(",\n{\"ph\":\"X\",\"pid\":").U(pid).S(",\"tid\":");
    if (r.type == RecordType::kEngine) {
      w.U(r.track)
          .S(",\"ts\":")
          .Us(r.begin_ns - origin_ns)
          .S(",\"dur\":")
          .Us(r.end_ns - r.begin_ns)
          .S(r.link == Link::kDeviceToHost ? ",\"name\":\"D2H " : ",\"name\":\"H2D ")
          .S(Bytes(r.bytes))
          .S("\",\"cat\":\"engine\",\"args\":{\"bytes\":")
          .U(r.bytes)
          .S(",\"stream\":")
          .Q(track_name(r.other))
          .S(",\"stream_tid\":")
          .U(r.other)
          .S(",\"reached_us\":")
          .Us(r.aux_ns - origin_ns)
          .S(",\"engine_wait_us\":")
          .Us(r.begin_ns - r.aux_ns)
          .S(",\"overran_us\":")
          .Us(r.aux2_ns > r.end_ns ? r.aux2_ns - r.end_ns : 0)
          .S("}}");
      continue;
    }
    Describe(r, kernels, &name, &cat);
    int64_t dep_wait = r.other != 0 ? r.begin_ns - r.aux2_ns : 0;
    if (dep_wait > 0) {
      w.U(r.track)
          .S(",\"ts\":")
          .Us(r.aux2_ns - origin_ns)
          .S(",\"dur\":")
          .Us(dep_wait)
          .S(",\"name\":\"dep wait\",\"cat\":\"wait\",\"args\":{\"for\":")
          .Q(name)
          .S(",\"on\":")
          .Q(track_name(r.other))
          .S(",\"on_tid\":")
          .U(r.other)
          .S("}},\n{\"ph\":\"X\",\"pid\":")
          .U(pid)
          .S(",\"tid\":");
    }
    w.U(r.track)
        .S(",\"ts\":")
        .Us(r.begin_ns - origin_ns)
        .S(",\"dur\":")
        .Us(r.end_ns - r.begin_ns)
        .S(",\"name\":")
        .Q(name)
        .S(",\"cat\":\"")
        .S(cat)
        .S("\",\"args\":{\"enqueued_us\":")
        .Us(r.aux_ns - origin_ns)
        .S(",\"dep_wait_us\":")
        .Us(dep_wait > 0 ? dep_wait : 0);
    if (r.op_kind == OpKind::kCopy || r.op_kind == OpKind::kMemset) {
      w.S(",\"bytes\":").U(r.bytes);
    }
    if (r.op_kind == OpKind::kKernel) {
      w.S(",\"symbol\":").Q(names[r.name]);
      // Host-located memory it read over the link (pages touched).
      if (r.bytes > 0) w.S(",\"host_bytes_touched\":").U(r.bytes);
      if (r.faults > 0) w.S(",\"host_touch_faults\":").U(r.faults);
    }
    w.S("}}");
  }
  if (dropped > 0) {
    w.S(",\n{\"ph\":\"i\",\"s\":\"g\",\"pid\":")
        .U(pid)
        .S(",\"tid\":0,\"ts\":")
        .Us(first_drop_ns - origin_ns)
        .S(",\"name\":\"trace full: ")
        .U(dropped)
        .S(" later events dropped (FAKECUDA_TRACE_EVENTS=")
        .U(max_records)
        .S(")\"}");
  }
  w.S("\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"recorded\":")
      .U(records.size())
      .S(",\"dropped\":")
      .U(dropped)
      .S(",\"max_events\":")
      .U(max_records)
      .S("}}\n");
  return w.Finish();
}

}  // namespace

int64_t TraceNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void StartTrace() {
  const Options& o = GetOptions();
  if (!o.trace) return;
  if (o.trace_path.empty()) {
    std::fprintf(stderr,
                 "fakecuda: invalid FAKECUDA_TRACE=\"\"; expected the path of a "
                 "file to write the trace to; no trace is written\n");
    return;
  }
  Tracer& t = GetTracer();
  std::string path = ExpandPath(o.trace_path);
  // Created now, empty, so that a path that cannot be written is said at
  // once (and an empty file tells that the process never reached exit()).
  FILE* f = std::fopen(path.c_str(), "we");
  if (f == nullptr || std::fclose(f) != 0) {
    int err = errno;
    std::fprintf(stderr,
                 "fakecuda: FAKECUDA_TRACE=\"%s\": cannot open \"%s\" for "
                 "writing: %s; no trace is written\n",
                 o.trace_path.c_str(), path.c_str(), std::strerror(err));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(t.mu);
    t.started = true;
    t.path = path;
    t.origin_ns = TraceNowNs();
    t.max_records = o.trace_max_events;
    t.tracks.assign(1 + 2 * DeviceCount(), Track{});
    for (int d = 0; d < DeviceCount(); ++d) {
      t.tracks[EngineTrack(d, Link::kHostToDevice)].name =
          "copy engine H2D device " + std::to_string(d);
      t.tracks[EngineTrack(d, Link::kDeviceToHost)].name =
          "copy engine D2H device " + std::to_string(d);
    }
  }
  trace_internal::enabled.store(true, std::memory_order_release);
}

uint32_t TraceStreamTrack(const void* handle, StreamKind kind, int device) {
  const char* what = kind == StreamKind::kLegacy      ? "legacy"
                     : kind == StreamKind::kPerThread ? "per-thread"
                                                      : "created";
  char buf[96];
  std::snprintf(buf, sizeof(buf), "stream 0x%" PRIxPTR " (%s) device %d",
                reinterpret_cast<uintptr_t>(handle), what, device);
  Tracer& t = GetTracer();
  std::lock_guard<std::mutex> lock(t.mu);
  t.tracks.push_back(Track{buf, false});
  return static_cast<uint32_t>(t.tracks.size() - 1);
}

uint32_t CurrentStreamTrack() { return t_current_track; }

namespace {
thread_local size_t t_host_bytes_touched = 0;
thread_local size_t t_host_touch_faults = 0;
}  // namespace

void NoteHostBytesTouched(size_t bytes, size_t faults) {
  if (!TraceEnabled()) return;
  t_host_bytes_touched += bytes;
  t_host_touch_faults += faults;
}

size_t TakeHostBytesTouched(size_t* faults) {
  size_t bytes = t_host_bytes_touched;
  *faults = t_host_touch_faults;
  t_host_bytes_touched = 0;
  t_host_touch_faults = 0;
  return bytes;
}
void SetCurrentStreamTrack(uint32_t track) { t_current_track = track; }

namespace {
// Room for one more record, or false (counted as dropped). Needs t.mu.
bool Admit(Tracer& t, int64_t now_ns) {
  if (t.written) return false;
  if (t.records.size() < t.max_records) return true;
  if (t.dropped++ == 0) t.first_drop_ns = now_ns;
  return false;
}
}  // namespace

void TraceStreamOp(const TracedOp& op) {
  Tracer& t = GetTracer();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!Admit(t, op.end_ns)) return;
  Record r;
  r.type = RecordType::kStreamOp;
  r.begin_ns = op.start_ns;
  r.end_ns = op.end_ns;
  r.aux_ns = op.enqueued_ns;
  r.aux2_ns = op.ready_ns;
  r.bytes = op.label.bytes;
  r.faults = op.label.host_faults;
  r.track = op.track;
  r.other = op.held_by;
  r.op_kind = op.label.kind;
  r.dir = op.label.dir;
  if (op.label.kind == OpKind::kKernel) {
    std::string_view symbol(op.label.name != nullptr ? op.label.name : "kernel");
    auto it = t.name_index.find(symbol);
    if (it == t.name_index.end()) {
      t.names.emplace_back(symbol);
      it = t.name_index.emplace(t.names.back(), static_cast<uint32_t>(t.names.size() - 1)).first;
    }
    r.name = it->second;
  }
  if (r.track < t.tracks.size()) t.tracks[r.track].used = true;
  t.records.push_back(r);
}

void TraceCopyEngine(int device, Link link, size_t bytes, int64_t reached_ns, int64_t start_ns,
                     int64_t end_ns, int64_t done_ns) {
  uint32_t stream = CurrentStreamTrack();
  Tracer& t = GetTracer();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!Admit(t, done_ns)) return;
  Record r;
  r.type = RecordType::kEngine;
  r.begin_ns = start_ns;
  r.end_ns = end_ns;
  r.aux_ns = reached_ns;
  r.aux2_ns = done_ns;
  r.bytes = bytes;
  r.track = static_cast<uint32_t>(EngineTrack(device, link));
  r.other = stream;
  r.link = link;
  if (r.track < t.tracks.size()) t.tracks[r.track].used = true;
  t.records.push_back(r);
}

void WriteTrace() {
  Tracer& t = GetTracer();
  std::deque<Record> records;
  std::vector<Track> tracks;
  std::deque<std::string> names;
  std::string path;
  uint64_t dropped;
  int64_t first_drop_ns;
  {
    // Taken whole under the lock, then written without it: stream workers
    // still running at exit only ever wait for this copy, not for the disk.
    std::lock_guard<std::mutex> lock(t.mu);
    if (t.written || !t.started) return;
    t.written = true;
    path = t.path;
    records.swap(t.records);
    tracks = t.tracks;
    names = t.names;
    dropped = t.dropped;
    first_drop_ns = t.first_drop_ns;
  }
  // A regular file is written beside itself and renamed over: whatever
  // else writes the same path (another process given the same
  // FAKECUDA_TRACE), the file is one whole trace, never two interleaved.
  // Anything else (a symlink, /dev/stdout, a FIFO) is written in place.
  struct stat st;
  bool replace = lstat(path.c_str(), &st) == 0 ? S_ISREG(st.st_mode) : errno == ENOENT;
  std::string tmp = replace ? path + ".XXXXXX" : path;
  int fd = replace ? mkostemp(tmp.data(), O_CLOEXEC)
                   : open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FILE* f = fd < 0 ? nullptr : fdopen(fd, "w");
  bool ok =
      f != nullptr && (!replace || fchmod(fd, 0644) == 0) &&
      WriteJson(f, records, tracks, names, t.origin_ns, t.max_records, dropped, first_drop_ns);
  int err = ok ? 0 : errno;
  if (f != nullptr && std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  } else if (f == nullptr && fd >= 0) {
    close(fd);
  }
  if (ok && replace && std::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok && replace && fd >= 0) unlink(tmp.c_str());
  if (!ok) {
    std::fprintf(stderr, "fakecuda: FAKECUDA_TRACE: writing \"%s\" failed: %s\n", path.c_str(),
                 std::strerror(err));
  } else if (dropped > 0) {
    std::fprintf(stderr,
                 "fakecuda: FAKECUDA_TRACE: \"%s\" holds the first %zu events; "
                 "%" PRIu64 " later ones were dropped (FAKECUDA_TRACE_EVENTS)\n",
                 path.c_str(), records.size(), dropped);
  }
}

}  // namespace fakecuda
