// transformer_train: trains a small decoder-only transformer (single-head
// causal attention, pre-layernorm blocks, ReLU MLP, untied output head) with
// Adam on synthetic counting sequences, written against the CUDA driver API
// alone. It runs unchanged on the fake device (the default module,
// transformer_kernels_host.so beside the binary) and on a GPU (--module with
// the cubin built from transformer_kernels.cu).
//
// Its memory pattern differs from mlp_train's on purpose: only the weights
// and Adam moments live across steps. Every step allocates and frees its
// temporaries the way a framework's caching allocator hands them out:
//   forward   tokens (cuMemAllocAsync), one activation stash per block
//             (what its backward needs), the head's stash, the logits and
//             their gradient (the logits freed as soon as the loss is known);
//   backward  per block, from the last: its parameter gradient and a
//             workspace (cuMemAlloc), the gradient flowing to the block
//             below (cuMemAllocAsync, freed on the stream once consumed);
//             the block's Adam update runs as soon as its gradient is
//             complete, then its gradient, workspace and stash are freed;
//   end       the step's remaining temporaries are freed before the loss is
//             read back.
// So the live set rises through the forward pass, peaks at the head and
// falls through the backward pass, and buffers are freed and allocated again
// at new sizes and places every step.
//
// Output, on stdout:
//   working_set <bytes>        the peak of live device memory (persistent
//                              plus the step's temporaries), printed after
//                              step 0 and before its line
//   step <n> loss <x>          one line per step, n from 0
//   step_time <n> <seconds>    with --step-times: host wall time of step n,
//                              from its first call to the end of its sync
//   checksum <16 hex digits>   FNV-1a 64 over the final parameters
// Exit status: 0 on success, 1 on a failed driver call, 2 on bad flags.
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "examples/common/example_program.h"
#include "examples/common/layer_kernels.h"

namespace {

struct Options {
  std::string module;  // empty: transformer_kernels_host.so beside the binary
  int steps = 8;
  int layers = 2;
  int dim = 128;
  int seq = 64;
  int batch = 4;
  int vocab = 4096;
  float lr = 0.003f;
  long long seed = 1;
  bool step_times = false;
};

constexpr char kUsage[] =
    "usage: transformer_train [--flag=value | --flag value]...\n"
    "  --module PATH   kernel module: a cubin on a GPU, a host-kernel .so on\n"
    "                  the fake driver\n"
    "                  (default: transformer_kernels_host.so beside the "
    "binary)\n"
    "  --steps N       training steps (default 8)\n"
    "  --layers N      transformer blocks, at least 1 (default 2)\n"
    "  --dim N         model width (default 128)\n"
    "  --seq N         tokens per sequence (default 64)\n"
    "  --batch N       sequences per step (default 4)\n"
    "  --vocab N       vocabulary size, at least 2 (default 4096)\n"
    "  --lr X          Adam learning rate (default 0.003)\n"
    "  --seed N        seed of data and initial weights, 0..4294967295 "
    "(default 1)\n"
    "  --step-times    print 'step_time <n> <seconds>' after each step\n";

Options ParseFlags(int argc, char** argv) {
  Options options;
  examples::ForEachFlag(argc, argv, {"step-times"},
                        [&](const std::string& name, const std::string* flag) {
                          if (flag == nullptr) {  // the only switch
                            options.step_times = true;
                            return;
                          }
                          const std::string& value = *flag;
                          constexpr int kMaxWidth = 1 << 16;
                          if (name == "module") {
                            if (value.empty()) examples::UsageError("--module needs a path");
                            options.module = value;
                          } else if (name == "steps") {
                            options.steps = examples::ParseInt(name, value, 1, 1000000);
                          } else if (name == "layers") {
                            options.layers = examples::ParseInt(name, value, 1, 1000);
                          } else if (name == "dim") {
                            options.dim = examples::ParseInt(name, value, 1, kMaxWidth);
                          } else if (name == "seq") {
                            options.seq = examples::ParseInt(name, value, 1, kMaxWidth);
                          } else if (name == "batch") {
                            options.batch = examples::ParseInt(name, value, 1, kMaxWidth);
                          } else if (name == "vocab") {
                            options.vocab = examples::ParseInt(name, value, 2, 1 << 24);
                          } else if (name == "lr") {
                            options.lr = examples::ParseFloat(name, value, 0.0f, 10.0f);
                          } else if (name == "seed") {
                            options.seed = examples::ParseInteger(name, value, 0, UINT_MAX);
                          } else {
                            examples::UsageError("unknown flag --%s", name.c_str());
                          }
                        });
  // Kernels take element counts as int and index with 64 bits; every buffer
  // and every thread count must stay below 2^31.
  const long long rows = static_cast<long long>(options.batch) * options.seq;
  const long long d = options.dim;
  const long long counts[] = {
      12 * d * d + 13 * d,                 // a block's parameters
      rows * 16 * d + rows * options.seq,  // a block's stash
      rows * options.vocab,                // logits
      static_cast<long long>(options.vocab) * d,
      rows * (options.seq + d),  // attention_backward_apply's threads
  };
  examples::CheckElementCounts(counts);
  return options;
}

using Ptr = CUdeviceptr;

// Typed launchers, one per kernel of transformer_kernels.cu (those it shares
// with other examples from examples::LayerKernels), each mirroring the
// kernel's C++ signature (CUdeviceptr standing for a pointer) so no call can
// pass a parameter of the wrong size. Functions are looked up by their
// mangled names, which encode those signatures. All launch on one stream.
class Kernels : public examples::LayerKernels {
 public:
  Kernels(CUmodule module, CUstream stream) : LayerKernels(module, stream) {
    const auto Get = [module](const char* name) { return examples::GetKernel(module, name); };
    synth_tokens_ = Get("_ZN3tfm12synth_tokensEPiiiiji");
    embed_ = Get("_ZN3tfm5embedEPKiPKfPfiii");
    layernorm_forward_ = Get("_ZN3tfm17layernorm_forwardEPKfS1_S1_PfS2_S2_ii");
    layernorm_backward_ = Get("_ZN3tfm18layernorm_backwardEPKfS1_S1_S1_S1_PfS2_S2_ii");
    attention_scores_ = Get("_ZN3tfm16attention_scoresEPKfPfiiif");
    attention_apply_ = Get("_ZN3tfm15attention_applyEPKfS1_Pfiii");
    attention_backward_apply_ = Get("_ZN3tfm24attention_backward_applyEPKfS1_S1_PfS2_iii");
    softmax_backward_ = Get("_ZN3tfm16softmax_backwardEPKfPfiif");
    attention_backward_qk_ = Get("_ZN3tfm21attention_backward_qkEPKfS1_Pfiii");
    softmax_xent_ = Get("_ZN3tfm12softmax_xentEPKfPKiPfS4_iii");
    mean_loss_ = Get("_ZN3tfm9mean_lossEPKfPfi");
    embed_backward_ = Get("_ZN3tfm14embed_backwardEPKiPKfPfiiii");
    adam_ = Get("_ZN3tfm4adamEPfS0_S0_PKffffffi");
  }

  void SynthTokens(Ptr tokens, int batch, int seq, int vocab, unsigned seed, int step) const {
    void* args[] = {&tokens, &batch, &seq, &vocab, &seed, &step};
    Launch(synth_tokens_, "synth_tokens", static_cast<long long>(batch) * (seq + 1), args);
  }
  void Embed(Ptr tokens, Ptr table, Ptr x, int rows, int seq, int dim) const {
    void* args[] = {&tokens, &table, &x, &rows, &seq, &dim};
    Launch(embed_, "embed", static_cast<long long>(rows) * dim, args);
  }
  void LayerNormForward(Ptr x, Ptr gain, Ptr bias, Ptr y, Ptr mean, Ptr rstd, int rows,
                        int dim) const {
    void* args[] = {&x, &gain, &bias, &y, &mean, &rstd, &rows, &dim};
    Launch(layernorm_forward_, "layernorm_forward", rows, args);
  }
  void LayerNormBackward(Ptr x, Ptr gain, Ptr mean, Ptr rstd, Ptr dy, Ptr dx, Ptr dgain, Ptr dbias,
                         int rows, int dim) const {
    void* args[] = {&x, &gain, &mean, &rstd, &dy, &dx, &dgain, &dbias, &rows, &dim};
    Launch(layernorm_backward_, "layernorm_backward", static_cast<long long>(rows) * dim + dim,
           args);
  }
  void AttentionScores(Ptr qkv, Ptr probs, int batch, int seq, int dim, float scale) const {
    void* args[] = {&qkv, &probs, &batch, &seq, &dim, &scale};
    Launch(attention_scores_, "attention_scores", static_cast<long long>(batch) * seq, args);
  }
  void AttentionApply(Ptr qkv, Ptr probs, Ptr out, int batch, int seq, int dim) const {
    void* args[] = {&qkv, &probs, &out, &batch, &seq, &dim};
    Launch(attention_apply_, "attention_apply", static_cast<long long>(batch) * seq * dim, args);
  }
  void AttentionBackwardApply(Ptr qkv, Ptr probs, Ptr dout, Ptr dprobs, Ptr dqkv, int batch,
                              int seq, int dim) const {
    void* args[] = {&qkv, &probs, &dout, &dprobs, &dqkv, &batch, &seq, &dim};
    Launch(attention_backward_apply_, "attention_backward_apply",
           static_cast<long long>(batch) * seq * (seq + dim), args);
  }
  void SoftmaxBackward(Ptr probs, Ptr dprobs, int batch, int seq, float scale) const {
    void* args[] = {&probs, &dprobs, &batch, &seq, &scale};
    Launch(softmax_backward_, "softmax_backward", static_cast<long long>(batch) * seq, args);
  }
  void AttentionBackwardQk(Ptr qkv, Ptr dscores, Ptr dqkv, int batch, int seq, int dim) const {
    void* args[] = {&qkv, &dscores, &dqkv, &batch, &seq, &dim};
    Launch(attention_backward_qk_, "attention_backward_qk", 2LL * batch * seq * dim, args);
  }
  void SoftmaxXent(Ptr logits, Ptr tokens, Ptr dlogits, Ptr row_loss, int rows, int seq,
                   int vocab) const {
    void* args[] = {&logits, &tokens, &dlogits, &row_loss, &rows, &seq, &vocab};
    Launch(softmax_xent_, "softmax_xent", rows, args);
  }
  void MeanLoss(Ptr row_loss, Ptr loss, int rows) const {
    void* args[] = {&row_loss, &loss, &rows};
    Launch(mean_loss_, "mean_loss", 1, args);
  }
  void EmbedBackward(Ptr tokens, Ptr dx, Ptr dtable, int rows, int seq, int vocab, int dim) const {
    void* args[] = {&tokens, &dx, &dtable, &rows, &seq, &vocab, &dim};
    Launch(embed_backward_, "embed_backward", static_cast<long long>(vocab) * dim, args);
  }
  void Adam(Ptr w, Ptr m, Ptr v, Ptr g, float lr, float beta1, float beta2, float c1, float c2,
            int n) const {
    void* args[] = {&w, &m, &v, &g, &lr, &beta1, &beta2, &c1, &c2, &n};
    Launch(adam_, "adam", n, args);
  }

 private:
  // One thread per element on stream().
  void Launch(CUfunction function, const char* name, long long threads, void** args) const {
    examples::LaunchPerElement(function, "tfm", name, threads, stream(), args);
  }

  CUfunction synth_tokens_, embed_, layernorm_forward_, layernorm_backward_, attention_scores_,
      attention_apply_, attention_backward_apply_, softmax_backward_, attention_backward_qk_,
      softmax_xent_, mean_loss_, embed_backward_, adam_;
};

// The program's device allocations, with the live total and its peak: the
// working set. Plain buffers come from cuMemAlloc and are freed with
// cuMemFree (which waits for the work using them); stream-ordered ones from
// cuMemAllocAsync and cuMemFreeAsync on the training stream.
class DeviceMemory {
 public:
  explicit DeviceMemory(CUstream stream) : stream_(stream) {}

  Ptr Alloc(long long floats) {
    Ptr ptr = 0;
    CU_CHECK(cuMemAlloc, &ptr, Bytes(floats));
    Track(ptr, Bytes(floats));
    return ptr;
  }
  Ptr AllocAsync(long long words) {
    Ptr ptr = 0;
    CU_CHECK(cuMemAllocAsync, &ptr, Bytes(words), stream_);
    Track(ptr, Bytes(words));
    return ptr;
  }
  void Free(Ptr ptr) {
    CU_CHECK(cuMemFree, ptr);
    Untrack(ptr);
  }
  void FreeAsync(Ptr ptr) {
    CU_CHECK(cuMemFreeAsync, ptr, stream_);
    Untrack(ptr);
  }
  size_t live_bytes() const { return live_bytes_; }
  size_t peak_bytes() const { return peak_bytes_; }

 private:
  // Floats and ints are both 4 bytes.
  static size_t Bytes(long long words) { return static_cast<size_t>(words) * sizeof(float); }
  void Track(Ptr ptr, size_t bytes) {
    sizes_[ptr] = bytes;
    live_bytes_ += bytes;
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  }
  void Untrack(Ptr ptr) {
    const auto it = sizes_.find(ptr);
    if (it == sizes_.end()) {
      std::fprintf(stderr, "transformer_train: freeing unknown buffer\n");
      std::exit(1);
    }
    live_bytes_ -= it->second;
    sizes_.erase(it);
  }

  CUstream stream_;
  std::map<Ptr, size_t> sizes_;
  size_t live_bytes_ = 0;
  size_t peak_bytes_ = 0;
};

// Offsets, in floats, of one block's parameters within its flat buffer (as
// a framework's flat parameter groups keep them), and of the same tensors'
// gradients within the gradient buffer of the same layout.
struct BlockLayout {
  explicit BlockLayout(int d) {
    long long next = 0;
    auto take = [&next](long long n) {
      const long long at = next;
      next += n;
      return at;
    };
    ln1_gain = take(d);
    ln1_bias = take(d);
    wqkv = take(3LL * d * d);
    bqkv = take(3LL * d);
    wo = take(1LL * d * d);
    bo = take(d);
    ln2_gain = take(d);
    ln2_bias = take(d);
    w1 = take(4LL * d * d);
    b1 = take(4LL * d);
    w2 = take(4LL * d * d);
    b2 = take(d);
    total = next;
  }
  long long ln1_gain, ln1_bias, wqkv, bqkv, wo, bo, ln2_gain, ln2_bias, w1, b1, w2, b2, total;
};

// Offsets, in floats, of what a block's backward pass needs within its
// activation stash. `x` is the block's input.
struct StashLayout {
  StashLayout(long long rows, int d, int seq) {
    long long next = 0;
    auto take = [&next](long long n) {
      const long long at = next;
      next += n;
      return at;
    };
    x = take(rows * d);
    ln1_mean = take(rows);
    ln1_rstd = take(rows);
    ln1 = take(rows * d);
    qkv = take(rows * 3 * d);
    probs = take(rows * seq);
    attn = take(rows * d);
    mid = take(rows * d);
    ln2_mean = take(rows);
    ln2_rstd = take(rows);
    ln2 = take(rows * d);
    h_pre = take(rows * 4 * d);
    h_post = take(rows * 4 * d);
    total = next;
  }
  long long x, ln1_mean, ln1_rstd, ln1, qkv, probs, attn, mid, ln2_mean, ln2_rstd, ln2, h_pre,
      h_post, total;
};

// Offsets of a block's backward workspace.
struct WorkspaceLayout {
  WorkspaceLayout(long long rows, int d, int seq) {
    long long next = 0;
    auto take = [&next](long long n) {
      const long long at = next;
      next += n;
      return at;
    };
    dh = take(rows * 4 * d);
    dmid = take(rows * d);
    dln2 = take(rows * d);
    dattn = take(rows * d);
    dprobs = take(rows * seq);
    dqkv = take(rows * 3 * d);
    dln1 = take(rows * d);
    dx_branch = take(rows * d);
    total = next;
  }
  long long dh, dmid, dln2, dattn, dprobs, dqkv, dln1, dx_branch, total;
};

// A persistent parameter tensor with its two Adam moments.
struct Param {
  Ptr w = 0, m = 0, v = 0;
  long long n = 0;
};

Param NewParam(DeviceMemory* memory, CUstream stream, long long n) {
  Param p;
  p.n = n;
  p.w = memory->Alloc(n);
  p.m = memory->Alloc(n);
  p.v = memory->Alloc(n);
  CU_CHECK(cuMemsetD32Async, p.m, 0, static_cast<size_t>(n), stream);
  CU_CHECK(cuMemsetD32Async, p.v, 0, static_cast<size_t>(n), stream);
  return p;
}

constexpr unsigned kOneBits = 0x3f800000u;  // 1.0f
constexpr float kBeta1 = 0.9f;
constexpr float kBeta2 = 0.999f;

class Trainer {
 public:
  Trainer(const Options& options, const Kernels& kernels)
      : o_(options),
        k_(kernels),
        stream_(kernels.stream()),
        memory_(kernels.stream()),
        rows_(options.batch * options.seq),
        block_(options.dim),
        stash_(rows_, options.dim, options.seq),
        workspace_(rows_, options.dim, options.seq) {}

  // Allocates and initialises the parameters.
  void Init() {
    const unsigned seed = static_cast<unsigned>(o_.seed);
    const int d = o_.dim;
    embedding_ = NewParam(&memory_, stream_, 1LL * o_.vocab * d);
    k_.InitParams(embedding_.w, static_cast<int>(embedding_.n), seed ^ 0xe0u, 1.0f);
    blocks_.resize(o_.layers);
    for (int l = 0; l < o_.layers; ++l) {
      Param& p = blocks_[l];
      p = NewParam(&memory_, stream_, block_.total);
      CU_CHECK(cuMemsetD32Async, p.w, 0, static_cast<size_t>(p.n), stream_);
      for (long long gain : {block_.ln1_gain, block_.ln2_gain}) {
        CU_CHECK(cuMemsetD32Async, At(p.w, gain), kOneBits, static_cast<size_t>(d), stream_);
      }
      const unsigned layer_seed = seed ^ (0xb10c0000u + 16u * l);
      const float in_scale = 1.0f / std::sqrt(static_cast<float>(d));
      Init(p.w, block_.wqkv, 3LL * d * d, layer_seed + 1, in_scale);
      Init(p.w, block_.wo, 1LL * d * d, layer_seed + 2, in_scale);
      Init(p.w, block_.w1, 4LL * d * d, layer_seed + 3, in_scale);
      Init(p.w, block_.w2, 4LL * d * d, layer_seed + 4,
           0.5f / std::sqrt(static_cast<float>(4 * d)));
    }
    // Final layernorm gain and bias, then the output bias.
    head_small_ = NewParam(&memory_, stream_, 2LL * d + o_.vocab);
    CU_CHECK(cuMemsetD32Async, head_small_.w, 0, static_cast<size_t>(head_small_.n), stream_);
    CU_CHECK(cuMemsetD32Async, head_small_.w, kOneBits, static_cast<size_t>(d), stream_);
    head_ = NewParam(&memory_, stream_, 1LL * d * o_.vocab);
    // Small output weights: the first loss is close to log(vocab).
    k_.InitParams(head_.w, static_cast<int>(head_.n), seed ^ 0x4eadu,
                  0.1f / std::sqrt(static_cast<float>(d)));
    loss_ = memory_.Alloc(1);
  }

  // One training step; returns its loss.
  float Step(int step) {
    const int d = o_.dim, seq = o_.seq, batch = o_.batch, vocab = o_.vocab;
    const int rows = rows_;
    const float attention_scale = 1.0f / std::sqrt(static_cast<float>(d));

    const Ptr tokens = memory_.AllocAsync(1LL * batch * (seq + 1));
    k_.SynthTokens(tokens, batch, seq, vocab, static_cast<unsigned>(o_.seed), step);

    // Forward. stash[l] holds block l's input and what its backward needs;
    // block l writes its output into stash[l + 1] (the head's stash for the
    // last block).
    std::vector<Ptr> stash(o_.layers);
    stash[0] = memory_.Alloc(stash_.total);
    k_.Embed(tokens, embedding_.w, At(stash[0], stash_.x), rows, seq, d);
    const long long head_stash_floats = 2LL * rows * d + 2LL * rows;
    Ptr head_stash = 0;
    for (int l = 0; l < o_.layers; ++l) {
      const Ptr s = stash[l];
      const Ptr w = blocks_[l].w;
      Ptr out = 0;
      if (l + 1 < o_.layers) {
        stash[l + 1] = memory_.Alloc(stash_.total);
        out = At(stash[l + 1], stash_.x);
      } else {
        head_stash = memory_.Alloc(head_stash_floats);
        out = head_stash;
      }
      k_.LayerNormForward(At(s, stash_.x), At(w, block_.ln1_gain), At(w, block_.ln1_bias),
                          At(s, stash_.ln1), At(s, stash_.ln1_mean), At(s, stash_.ln1_rstd), rows,
                          d);
      k_.MatmulForward(At(s, stash_.ln1), At(w, block_.wqkv), At(w, block_.bqkv), At(s, stash_.qkv),
                       rows, d, 3 * d);
      k_.AttentionScores(At(s, stash_.qkv), At(s, stash_.probs), batch, seq, d, attention_scale);
      k_.AttentionApply(At(s, stash_.qkv), At(s, stash_.probs), At(s, stash_.attn), batch, seq, d);
      // The attention output projection goes to `out` for a moment, then
      // becomes the residual sum in stash.mid.
      k_.MatmulForward(At(s, stash_.attn), At(w, block_.wo), At(w, block_.bo), out, rows, d, d);
      k_.AddVectors(At(s, stash_.x), out, At(s, stash_.mid), rows * d);
      k_.LayerNormForward(At(s, stash_.mid), At(w, block_.ln2_gain), At(w, block_.ln2_bias),
                          At(s, stash_.ln2), At(s, stash_.ln2_mean), At(s, stash_.ln2_rstd), rows,
                          d);
      k_.MatmulForward(At(s, stash_.ln2), At(w, block_.w1), At(w, block_.b1), At(s, stash_.h_pre),
                       rows, d, 4 * d);
      k_.ReluForward(At(s, stash_.h_pre), At(s, stash_.h_post), rows * 4 * d);
      // A temporary for the MLP's output, then the residual sum into `out`.
      const Ptr mlp_out = memory_.AllocAsync(1LL * rows * d);
      k_.MatmulForward(At(s, stash_.h_post), At(w, block_.w2), At(w, block_.b2), mlp_out, rows,
                       4 * d, d);
      k_.AddVectors(At(s, stash_.mid), mlp_out, out, rows * d);
      memory_.FreeAsync(mlp_out);
    }

    // Head: final layernorm, logits, loss and the logits' gradient.
    const Ptr hx = head_stash;
    const Ptr hln = At(head_stash, 1LL * rows * d);
    const Ptr hmean = At(head_stash, 2LL * rows * d);
    const Ptr hrstd = At(head_stash, 2LL * rows * d + rows);
    const Ptr lnf_gain = head_small_.w;
    const Ptr lnf_bias = At(head_small_.w, d);
    const Ptr out_bias = At(head_small_.w, 2LL * d);
    k_.LayerNormForward(hx, lnf_gain, lnf_bias, hln, hmean, hrstd, rows, d);
    const Ptr logits = memory_.Alloc(1LL * rows * vocab);
    k_.MatmulForward(hln, head_.w, out_bias, logits, rows, d, vocab);
    const Ptr dlogits = memory_.Alloc(1LL * rows * vocab);
    const Ptr row_loss = memory_.AllocAsync(rows);
    k_.SoftmaxXent(logits, tokens, dlogits, row_loss, rows, seq, vocab);
    memory_.Free(logits);
    k_.MeanLoss(row_loss, loss_, rows);
    memory_.FreeAsync(row_loss);

    // Backward through the head, then the head's Adam step.
    ++adam_steps_;
    bias1_ = 1.0f - std::pow(kBeta1, static_cast<float>(adam_steps_));
    bias2_ = 1.0f - std::pow(kBeta2, static_cast<float>(adam_steps_));
    const Ptr dhead = memory_.Alloc(head_.n);
    const Ptr dhead_small = memory_.Alloc(head_small_.n);
    k_.MatmulBackwardParams(hln, dlogits, dhead, At(dhead_small, 2LL * d), rows, d, vocab,
                            /*accumulate=*/0);
    const Ptr dln = memory_.AllocAsync(1LL * rows * d);
    k_.MatmulBackwardInput(dlogits, head_.w, dln, rows, d, vocab);
    memory_.Free(dlogits);
    Ptr dx = memory_.AllocAsync(1LL * rows * d);  // gradient of the stream
    k_.LayerNormBackward(hx, lnf_gain, hmean, hrstd, dln, dx, dhead_small, At(dhead_small, d), rows,
                         d);
    memory_.FreeAsync(dln);
    memory_.Free(head_stash);
    Update(head_, dhead);
    Update(head_small_, dhead_small);
    memory_.Free(dhead);
    memory_.Free(dhead_small);

    for (int l = o_.layers - 1; l >= 0; --l) {
      dx = BlockBackward(l, stash[l], dx);
      memory_.Free(stash[l]);
    }

    // The embedding's gradient; the position codes are fixed.
    const Ptr dembedding = memory_.Alloc(embedding_.n);
    k_.EmbedBackward(tokens, dx, dembedding, rows, seq, vocab, d);
    memory_.FreeAsync(dx);
    memory_.FreeAsync(tokens);
    Update(embedding_, dembedding);
    memory_.Free(dembedding);

    float loss = 0.0f;
    CU_CHECK(cuMemcpyDtoHAsync, &loss, loss_, sizeof(loss), stream_);
    CU_CHECK(cuStreamSynchronize, stream_);
    return loss;
  }

  // The final parameters, in allocation order.
  std::vector<float> Parameters() {
    std::vector<const Param*> all = {&embedding_};
    for (const Param& p : blocks_) all.push_back(&p);
    all.push_back(&head_small_);
    all.push_back(&head_);
    std::vector<float> values;
    for (const Param* p : all) {
      const size_t at = values.size();
      values.resize(at + static_cast<size_t>(p->n));
      CU_CHECK(cuMemcpyDtoHAsync, values.data() + at, p->w,
               static_cast<size_t>(p->n) * sizeof(float), stream_);
    }
    CU_CHECK(cuStreamSynchronize, stream_);
    return values;
  }

  void FreeAll() {
    std::vector<Param*> all = {&embedding_, &head_small_, &head_};
    for (Param& p : blocks_) all.push_back(&p);
    for (Param* p : all) {
      memory_.Free(p->w);
      memory_.Free(p->m);
      memory_.Free(p->v);
    }
    memory_.Free(loss_);
    if (memory_.live_bytes() != 0) {
      std::fprintf(stderr, "transformer_train: %zu bytes still allocated\n", memory_.live_bytes());
      std::exit(1);
    }
  }

  size_t working_set() const { return memory_.peak_bytes(); }

 private:
  static Ptr At(Ptr base, long long floats) {
    return base + static_cast<Ptr>(floats) * sizeof(float);
  }

  void Init(Ptr base, long long offset, long long n, unsigned seed, float scale) {
    k_.InitParams(At(base, offset), static_cast<int>(n), seed, scale);
  }

  void Update(const Param& p, Ptr grad) {
    k_.Adam(p.w, p.m, p.v, grad, o_.lr, kBeta1, kBeta2, bias1_, bias2_, static_cast<int>(p.n));
  }

  // Backward through block l given dy, the gradient of its output; updates
  // the block's parameters and returns the gradient of its input (a new
  // stream-ordered buffer; dy is freed).
  Ptr BlockBackward(int l, Ptr s, Ptr dy) {
    const int d = o_.dim, seq = o_.seq, batch = o_.batch, rows = rows_;
    const float attention_scale = 1.0f / std::sqrt(static_cast<float>(d));
    const Param& p = blocks_[l];
    const Ptr w = p.w;
    const Ptr g = memory_.Alloc(block_.total);
    const Ptr ws = memory_.Alloc(workspace_.total);
    auto W = [&](long long offset) { return At(ws, offset); };
    auto S = [&](long long offset) { return At(s, offset); };

    // out = mid + mlp(ln2(mid)): dy reaches mid directly and through the MLP.
    k_.MatmulBackwardParams(S(stash_.h_post), dy, At(g, block_.w2), At(g, block_.b2), rows, 4 * d,
                            d, /*accumulate=*/0);
    k_.MatmulBackwardInput(dy, At(w, block_.w2), W(workspace_.dh), rows, 4 * d, d);
    k_.ReluBackward(S(stash_.h_pre), W(workspace_.dh), rows * 4 * d);
    k_.MatmulBackwardParams(S(stash_.ln2), W(workspace_.dh), At(g, block_.w1), At(g, block_.b1),
                            rows, d, 4 * d, /*accumulate=*/0);
    k_.MatmulBackwardInput(W(workspace_.dh), At(w, block_.w1), W(workspace_.dln2), rows, d, 4 * d);
    k_.LayerNormBackward(S(stash_.mid), At(w, block_.ln2_gain), S(stash_.ln2_mean),
                         S(stash_.ln2_rstd), W(workspace_.dln2), W(workspace_.dx_branch),
                         At(g, block_.ln2_gain), At(g, block_.ln2_bias), rows, d);
    k_.AddVectors(dy, W(workspace_.dx_branch), W(workspace_.dmid), rows * d);
    memory_.FreeAsync(dy);

    // mid = x + attn(ln1(x)) wo + bo.
    k_.MatmulBackwardParams(S(stash_.attn), W(workspace_.dmid), At(g, block_.wo), At(g, block_.bo),
                            rows, d, d,
                            /*accumulate=*/0);
    k_.MatmulBackwardInput(W(workspace_.dmid), At(w, block_.wo), W(workspace_.dattn), rows, d, d);
    k_.AttentionBackwardApply(S(stash_.qkv), S(stash_.probs), W(workspace_.dattn),
                              W(workspace_.dprobs), W(workspace_.dqkv), batch, seq, d);
    k_.SoftmaxBackward(S(stash_.probs), W(workspace_.dprobs), batch, seq, attention_scale);
    k_.AttentionBackwardQk(S(stash_.qkv), W(workspace_.dprobs), W(workspace_.dqkv), batch, seq, d);
    k_.MatmulBackwardParams(S(stash_.ln1), W(workspace_.dqkv), At(g, block_.wqkv),
                            At(g, block_.bqkv), rows, d, 3 * d, /*accumulate=*/0);
    k_.MatmulBackwardInput(W(workspace_.dqkv), At(w, block_.wqkv), W(workspace_.dln1), rows, d,
                           3 * d);
    k_.LayerNormBackward(S(stash_.x), At(w, block_.ln1_gain), S(stash_.ln1_mean),
                         S(stash_.ln1_rstd), W(workspace_.dln1), W(workspace_.dx_branch),
                         At(g, block_.ln1_gain), At(g, block_.ln1_bias), rows, d);
    const Ptr dx = memory_.AllocAsync(1LL * rows * d);
    k_.AddVectors(W(workspace_.dmid), W(workspace_.dx_branch), dx, rows * d);
    memory_.Free(ws);

    Update(p, g);
    memory_.Free(g);
    return dx;
  }

  const Options& o_;
  const Kernels& k_;
  CUstream stream_;
  DeviceMemory memory_;
  const int rows_;
  const BlockLayout block_;
  const StashLayout stash_;
  const WorkspaceLayout workspace_;
  Param embedding_, head_small_, head_;
  std::vector<Param> blocks_;
  Ptr loss_ = 0;
  int adam_steps_ = 0;
  float bias1_ = 1.0f, bias2_ = 1.0f;
};

}  // namespace

int main(int argc, char** argv) {
  examples::InitProgram("transformer_train", kUsage);
  const Options options = ParseFlags(argc, argv);
  const std::string module_path = options.module.empty()
                                      ? examples::BesideBinary("transformer_kernels_host.so")
                                      : options.module;

  CUdevice device = 0;
  examples::UsePrimaryContext(&device);
  CUmodule module = examples::LoadModule(module_path);
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate, &stream, CU_STREAM_NON_BLOCKING);
  const Kernels kernels(module, stream);

  {
    Trainer trainer(options, kernels);
    trainer.Init();
    for (int step = 0; step < options.steps; ++step) {
      const auto start = std::chrono::steady_clock::now();
      const float loss = trainer.Step(step);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // Step 0 has allocated everything a step allocates, so the peak is
      // known now.
      if (step == 0) std::printf("working_set %zu\n", trainer.working_set());
      std::printf("step %d loss %.6f\n", step, loss);
      if (options.step_times) std::printf("step_time %d %.6f\n", step, seconds);
      std::fflush(stdout);
    }
    const std::vector<float> parameters = trainer.Parameters();
    examples::Fnv1a64 checksum;
    checksum.Update(parameters.data(), parameters.size() * sizeof(float));
    std::printf("checksum %016llx\n", static_cast<unsigned long long>(checksum.hash()));
    std::fflush(stdout);
    trainer.FreeAll();
  }

  CU_CHECK(cuStreamDestroy, stream);
  CU_CHECK(cuModuleUnload, module);
  CU_CHECK(cuDevicePrimaryCtxRelease, device);
  return 0;
}
