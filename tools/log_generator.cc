#include "tools/log_generator.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/base/json.h"

namespace stensor {
namespace {

constexpr uint64_t kGranule = uint64_t{2} << 20;

class Writer {
 public:
  explicit Writer(std::ostream& out) : out_(out) {
    Line(JsonLine()
             .Str("type", "header")
             .Uint("format", 1)
             .Uint("pid", 1)
             .Raw("devices", R"([{"ordinal":0,"name":"generated","total_bytes":17179869184}])")
             .Raw("config", R"({"STENSOR_MEMORY_LIMIT":"","STENSOR_POLICY":"belady"})")
             .Finish());
  }

  // A cuMemAlloc; returns the buffer's id.
  uint64_t Alloc(uint64_t bytes) {
    const uint64_t id = ++last_id_;
    // Buffers of a granule or more start on a granule, as the library's
    // VMM reservations do.
    const uint64_t align = bytes >= kGranule ? kGranule : 4096;
    next_addr_ = (next_addr_ + align - 1) / align * align;
    addrs_.push_back(next_addr_);
    sizes_.push_back(bytes);
    next_addr_ += bytes;
    Line(JsonLine()
             .Str("type", "alloc")
             .Str("api", "cuMemAlloc_v2")
             .Uint("id", id)
             .Str("addr", Hex(Addr(id)))
             .Uint("bytes", bytes)
             .Uint("device", 0)
             .Str("kind", "device")
             .Finish());
    return id;
  }

  void Free(uint64_t id) {
    Line(JsonLine()
             .Str("type", "free")
             .Str("api", "cuMemFree_v2")
             .Uint("id", id)
             .Str("addr", Hex(Addr(id)))
             .Uint("bytes", Size(id))
             .Finish());
  }

  // A launch reading `reads` and writing `writes` (listed in reads too, as
  // the library logs them); `threads` sizes its grid.
  void Launch(std::string_view kernel, std::initializer_list<uint64_t> reads,
              std::initializer_list<uint64_t> writes, uint64_t threads) {
    std::vector<uint64_t> all(reads);
    for (uint64_t w : writes) {
      if (std::find(all.begin(), all.end(), w) == all.end()) all.push_back(w);
    }
    Line(JsonLine()
             .Str("type", "launch")
             .Str("api", "cuLaunchKernel")
             .Str("kernel", kernel)
             .Str("stream", "legacy")
             .Raw("grid", absl::StrCat("[", (threads + 255) / 256, ",1,1]"))
             .Raw("block", "[256,1,1]")
             .Uints("reads", all)
             .Uints("writes", std::vector<uint64_t>(writes))
             .Bool("inferred", true)
             .Raw("tables", "[]")
             .Bool("unknown_tables", false)
             .Finish());
  }

  // One launch whose reads list `count` ids cycling over `ids`, written a
  // piece at a time.
  void WideLaunch(const std::vector<uint64_t>& ids, uint64_t count) {
    out_ << R"({"type":"launch","api":"cuLaunchKernel","kernel":"_Z4widePKfPf",)"
         << R"("stream":"legacy","grid":[1,1,1],"block":[256,1,1],"reads":[)";
    std::string piece;
    for (uint64_t i = 0; i < count; ++i) {
      if (i > 0) piece.push_back(',');
      absl::StrAppend(&piece, ids[i % ids.size()]);
      if (piece.size() >= 1 << 16) {
        out_ << piece;
        piece.clear();
      }
    }
    out_ << piece << R"(],"writes":[],"inferred":true,"tables":[],"unknown_tables":false})"
         << "\n";
    ++lines_;
  }

  void Memset(uint64_t id) {
    Line(JsonLine()
             .Str("type", "memset")
             .Str("api", "cuMemsetD32_v2")
             .Uint("bytes", Size(id))
             .Str("dst", Hex(Addr(id)))
             .Uints("writes", {id})
             .Str("stream", "legacy")
             .Bool("async", false)
             .Finish());
  }

  // The synchronous read-back of a few bytes of `id` (the step's loss).
  void ReadBack(uint64_t id, uint64_t bytes) {
    Line(JsonLine()
             .Str("type", "memcpy")
             .Str("api", "cuMemcpyDtoH_v2")
             .Str("kind", "DtoH")
             .Uint("bytes", bytes)
             .Str("dst", "0x7ffd00000000")
             .Str("src", Hex(Addr(id)))
             .Uints("reads", {id})
             .Uints("writes", {})
             .Str("stream", "legacy")
             .Bool("async", false)
             .Finish());
  }

  uint64_t End() {
    Line(JsonLine().Str("type", "end").Uint("live_buffers", 0).Uint("dropped", 0).Finish());
    return lines_;
  }

 private:
  static std::string Hex(uint64_t addr) { return absl::StrCat("0x", absl::Hex(addr)); }
  uint64_t Addr(uint64_t id) const { return addrs_[id - 1]; }
  uint64_t Size(uint64_t id) const { return sizes_[id - 1]; }

  void Line(const std::string& text) {
    out_ << text << "\n";
    ++lines_;
  }

  std::ostream& out_;
  uint64_t lines_ = 0;
  uint64_t last_id_ = 0;
  uint64_t next_addr_ = uint64_t{0x7f0000000000};
  std::vector<uint64_t> addrs_, sizes_;  // by id - 1
};

// examples/mlp's model with its defaults (batch 32, 1024 inputs and hidden
// units, 16 classes, shards of 1024 samples) and its step, kernel for kernel.
void WriteMlp(const GeneratedLog& spec, Writer& w) {
  constexpr uint64_t kBatch = 32, kInput = 1024, kHidden = 1024, kClasses = 16;
  constexpr uint64_t kShardSamples = 1024;
  constexpr uint64_t kFloat = 4;
  struct Layer {
    uint64_t in, out, w, b, vw, vb, dw, db, pre, post, grad;
    bool relu;
  };
  std::vector<Layer> layers;
  const int count = std::max(1, spec.layers) + 1;
  for (int l = 0; l < count; ++l) {
    Layer layer{};
    layer.in = l == 0 ? kInput : kHidden;
    layer.out = l + 1 == count ? kClasses : kHidden;
    layer.relu = l + 1 < count;
    layer.w = w.Alloc(layer.in * layer.out * kFloat);
    layer.b = w.Alloc(layer.out * kFloat);
    layer.vw = w.Alloc(layer.in * layer.out * kFloat);
    layer.vb = w.Alloc(layer.out * kFloat);
    layer.dw = w.Alloc(layer.in * layer.out * kFloat);
    layer.db = w.Alloc(layer.out * kFloat);
    layer.pre = w.Alloc(kBatch * layer.out * kFloat);
    layer.post = layer.relu ? w.Alloc(kBatch * layer.out * kFloat) : 0;
    layer.grad = w.Alloc(kBatch * layer.out * kFloat);
    layers.push_back(layer);
  }
  struct Shard {
    uint64_t data, labels;
  };
  std::vector<Shard> shards;
  for (int s = 0; s < std::max(1, spec.shards); ++s) {
    shards.push_back({w.Alloc(kShardSamples * kInput * kFloat), w.Alloc(kShardSamples * 4)});
  }
  const uint64_t x = w.Alloc(kBatch * kInput * kFloat);
  const uint64_t y = w.Alloc(kBatch * 4);
  const uint64_t sample_loss = w.Alloc(kBatch * kFloat);
  const uint64_t loss = w.Alloc(kFloat);

  for (const Shard& s : shards) {
    w.Launch("_ZN3mlp11synth_shardEPfPiiiiijf", {}, {s.data, s.labels}, kShardSamples * kInput);
  }
  for (const Layer& l : layers) {
    w.Launch("_ZN3mlp11init_paramsEPfijf", {}, {l.w}, l.in * l.out);
    w.Memset(l.b);
    w.Memset(l.vw);
    w.Memset(l.vb);
  }
  for (uint64_t step = 0; step < spec.steps; ++step) {
    const Shard& shard = shards[step % shards.size()];
    w.Launch("_ZN3mlp12gather_batchEPKfPKiPfPiiii", {shard.data, shard.labels}, {x, y},
             kBatch * kInput);
    uint64_t input = x;
    for (const Layer& l : layers) {
      w.Launch("_ZN3mlp14linear_forwardEPKfS1_S1_Pfiii", {input, l.w, l.b}, {l.pre},
               kBatch * l.out);
      if (l.relu) {
        w.Launch("_ZN3mlp12relu_forwardEPKfPfi", {l.pre}, {l.post}, kBatch * l.out);
        input = l.post;
      }
    }
    const Layer& top = layers.back();
    w.Launch("_ZN3mlp12softmax_xentEPKfPKiPfS4_ii", {top.pre, y}, {top.grad, sample_loss}, kBatch);
    w.Launch("_ZN3mlp9mean_lossEPKfPfi", {sample_loss}, {loss}, kBatch);
    for (size_t l = layers.size(); l-- > 0;) {
      const Layer& layer = layers[l];
      const uint64_t layer_input = l == 0 ? x : layers[l - 1].post;
      w.Launch("_ZN3mlp22linear_backward_paramsEPKfS1_PfS2_iii", {layer_input, layer.grad},
               {layer.dw, layer.db}, layer.in * layer.out);
      if (l > 0) {
        const Layer& below = layers[l - 1];
        w.Launch("_ZN3mlp21linear_backward_inputEPKfS1_Pfiii", {layer.grad, layer.w}, {below.grad},
                 kBatch * layer.in);
        w.Launch("_ZN3mlp13relu_backwardEPKfPfi", {below.pre}, {below.grad}, kBatch * below.out);
      }
    }
    for (const Layer& l : layers) {
      w.Launch("_ZN3mlp12sgd_momentumEPfS0_PKfffi", {l.dw}, {l.w, l.vw}, l.in * l.out);
      w.Launch("_ZN3mlp12sgd_momentumEPfS0_PKfffi", {l.db}, {l.b, l.vb}, l.out);
    }
    w.ReadBack(loss, kFloat);
  }
  for (uint64_t id = 1; id <= loss; ++id) w.Free(id);
}

void WriteLive(const GeneratedLog& spec, Writer& w) {
  const uint64_t n = std::max<uint64_t>(1, spec.buffers);
  for (uint64_t i = 0; i < n; ++i) w.Alloc(kGranule);
  for (uint64_t round = 0; round < spec.steps; ++round) {
    for (uint64_t id = 1; id <= n; ++id) {
      w.Launch("_Z4stepPKfPf", {id == 1 ? n : id - 1}, {id}, kGranule / 4);
    }
  }
  for (uint64_t id = 1; id <= n; ++id) w.Free(id);
}

void WriteWide(const GeneratedLog& spec, Writer& w) {
  std::vector<uint64_t> ids;
  for (uint64_t i = 0; i < std::max<uint64_t>(1, spec.buffers); ++i) {
    ids.push_back(w.Alloc(kGranule));
  }
  w.WideLaunch(ids, spec.reads);
  for (uint64_t id : ids) w.Free(id);
}

}  // namespace

absl::StatusOr<GeneratedLog::Shape> ParseLogShape(absl::string_view name) {
  if (name == "mlp") return GeneratedLog::Shape::kMlp;
  if (name == "live") return GeneratedLog::Shape::kLive;
  if (name == "wide") return GeneratedLog::Shape::kWide;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log shape '", name, "' (mlp, live or wide)"));
}

uint64_t WriteGeneratedLog(const GeneratedLog& spec, std::ostream& out) {
  Writer w(out);
  switch (spec.shape) {
    case GeneratedLog::Shape::kMlp:
      WriteMlp(spec, w);
      break;
    case GeneratedLog::Shape::kLive:
      WriteLive(spec, w);
      break;
    case GeneratedLog::Shape::kWide:
      WriteWide(spec, w);
      break;
  }
  return w.End();
}

std::string GeneratedLogText(const GeneratedLog& spec) {
  std::ostringstream out;
  WriteGeneratedLog(spec, out);
  return out.str();
}

ScaleLog ScaleLogFromBytes(absl::string_view data) {
  auto byte = [&](size_t i) -> uint64_t {
    return i < data.size() ? static_cast<uint8_t>(data[i]) : 0;
  };
  const uint64_t size = byte(1) << 8 | byte(2);
  ScaleLog log;
  log.knob = static_cast<uint8_t>(byte(3));
  GeneratedLog& spec = log.spec;
  switch (byte(0) % 3) {
    case 0:
      spec.shape = GeneratedLog::Shape::kMlp;
      spec.steps = 100 + size % 256;
      spec.layers = 1 + log.knob % 3;
      spec.shards = 1 + log.knob % 13;
      break;
    case 1:
      spec.shape = GeneratedLog::Shape::kLive;
      spec.buffers = 300 + size % 1024;
      spec.steps = 1 + log.knob % 3;
      break;
    default:
      spec.shape = GeneratedLog::Shape::kWide;
      spec.buffers = 1 + log.knob % 64;
      spec.reads = 1024 + size * 4;
      break;
  }
  log.text = GeneratedLogText(spec);
  if (data.size() <= 6) return log;
  // After line `at` (counted from 1), or at the end.
  const uint64_t at = byte(4) << 8 | byte(5);
  size_t offset = 0;
  for (uint64_t line = 0; line < at && offset < log.text.size(); ++line) {
    offset = log.text.find('\n', offset);
    offset = offset == std::string::npos ? log.text.size() : offset + 1;
  }
  std::string line(data.substr(6));
  line.push_back('\n');
  log.text.insert(offset, line);
  log.spliced = true;
  return log;
}

}  // namespace stensor

namespace stensor {

std::vector<std::string> ScaleLogSeeds(const std::vector<std::string>& lines) {
  auto bytes = [](std::initializer_list<int> values) {
    std::string seed;
    for (int v : values) seed.push_back(static_cast<char>(v));
    return seed;
  };
  std::vector<std::string> seeds = {bytes({0, 0, 0, 0}), bytes({0, 0xff, 0xff, 2}),
                                    bytes({1, 0, 0, 0}), bytes({1, 0xff, 0xff, 0x32}),
                                    bytes({2, 0, 0, 0}), bytes({2, 0xff, 0xff, 0x0f})};
  // After line 4,096 of a training log of 6,000.
  for (const std::string& line : lines) seeds.push_back(bytes({0, 1, 0, 5, 0x10, 0}) + line);
  return seeds;
}

}  // namespace stensor
