// torchlike_train: a training program that talks to the CUDA driver the way
// a PyTorch training loop does, so that stensor is measured against that
// traffic rather than against a tidy hand-written loop. Written against the
// driver API alone; it runs on the fake device (the default module,
// torchlike_kernels_host.so beside the binary) and on a GPU (--module with
// the cubin built from torchlike_kernels.cu).
//
// What it imitates:
//   - Memory (--alloc): `caching`, PyTorch's CUDACachingAllocator
//     (caching_allocator.h: 2 MiB and 20 MiB segments, best-fit splits,
//     coalescing, per-stream reuse, record_stream events, empty_cache after
//     each evaluation, private pools for graph captures); or `per-tensor`,
//     every tensor through libstensor.so's stensor_torch_malloc /
//     stensor_torch_free as torch.cuda.memory.CUDAPluggableAllocator calls
//     them; when libstensor.so is not loaded, the driver's stream-ordered
//     allocator as PyTorch's cudaMallocAsync backend uses it
//     (cuMemAllocAsync / cuMemFreeAsync on the tensor's stream, the default
//     pool keeping what it holds: release threshold UINT64_MAX).
//     Every op's output is a tensor of its own, allocated when the op runs
//     and freed when autograd drops it; gradients are set to None after
//     each optimizer step (zero_grad's default) and allocated again in the
//     next backward.
//   - The model: a bigram-hash embedding, dense transformer-ish layers
//     (matmuls, multi-head causal attention whose per-head Q/K/V/output
//     pointers are a host-built table uploaded H2D into an allocator block
//     every time, as batched-GEMM pointer arrays are), after the first of
//     them a top-1 mixture-of-experts block (the router kernel writes the
//     grouped GEMM's per-token table of expert weight pointers on the
//     device; the experts' gradients go through a host-built table), dense
//     layer 1 checkpointed (its forward runs again in backward), and an
//     output head with softmax cross-entropy.
//   - Gradient accumulation over --micro micro-batches per step; an
//     evaluation pass (forward only, no grad) every --eval-every steps.
//   - AdamW (--optimizer): `fused`, as torch.optim.AdamW(fused=True) through
//     ATen's multi_tensor_apply: a TensorListMetadata struct passed by value
//     to each launch, refilled chunk by chunk so slots past a launch's
//     tensors keep pointers of earlier launches; or `per-param`, one launch
//     per tensor. Both capturable: the step count lives on the device.
//   - A data loader on its own thread and stream: pinned staging buffers
//     (cuMemHostAlloc), cuMemcpyHtoDAsync into a tensor allocated on the
//     loader's stream, an event the compute stream waits for, and
//     record_stream on the compute stream before the tensor's free.
//   - CUDA graphs (--graphs): `eager`; `step`, the whole training step
//     captured once (after one eager warm-up step) and replayed, its inputs
//     copied into static tensors first; `layer`, each dense layer's forward
//     and backward captured as graphs of their own (make_graphed_callables),
//     eager glue copying into their static inputs and accumulating their
//     static gradients. Captures use a private pool of the caching allocator.
//
// All arithmetic rounds exactly (examples/common/exact_math.h), so every
// mode computes the same bits: one checksum for all of them.
//
// Output, on stdout:
//   step <n> loss <x>          one line per step (the mean over micro-batches)
//   eval <n> loss <x>          after step n, every --eval-every steps
//   step_time <n> <seconds>    with --step-times: host wall time of step n
//                              and its evaluation, from its first call to
//                              the end of its last loss read-back
//   train_seconds <s>          wall time of the training loop
//   working_set <bytes>        caching: the most segment bytes held at once;
//                              per-tensor: the most tensor bytes live at once
//                              (from half a 2 MiB granule up in granules,
//                              else in 4 KiB pages: what a cap charges)
//   checksum <16 hex digits>   FNV-1a 64 over the final parameters
//   ok                         every tensor was freed, every check held
// Exit status: 0 on success, 1 on a failed driver call (out of memory
// included), 2 on bad flags.
#include <cuda.h>
#include <dlfcn.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "examples/common/example_program.h"
#include "examples/common/layer_kernels.h"
#include "examples/torchlike/caching_allocator.h"
#include "examples/torchlike/torchlike_ops.h"

namespace torchlike {
namespace {

enum class AllocMode { kCaching, kPerTensor };
enum class OptimizerMode { kFused, kPerParam };
enum class GraphMode { kEager, kStep, kLayer };

struct Options {
  std::string module;  // empty: torchlike_kernels_host.so beside the binary
  int steps = 4;
  int micro = 2;
  int layers = 3;
  int dim = 128;
  int heads = 4;
  int seq = 32;
  int batch = 2;
  int vocab = 1024;
  int buckets = 49152;
  int experts = 16;
  int ffn = 1024;
  int eval_every = 2;
  bool step_times = false;
  float lr = 0.001f;
  long long seed = 1;
  AllocMode alloc = AllocMode::kCaching;
  OptimizerMode optimizer = OptimizerMode::kFused;
  GraphMode graphs = GraphMode::kEager;
};

constexpr char kUsage[] =
    "usage: torchlike_train [--flag=value | --flag value]...\n"
    "  --module PATH     kernel module: a cubin on a GPU, a host-kernel .so\n"
    "                    on the fake driver (default: "
    "torchlike_kernels_host.so\n"
    "                    beside the binary)\n"
    "  --alloc MODE      caching (default) | per-tensor\n"
    "  --optimizer MODE  fused (default) | per-param\n"
    "  --graphs MODE     eager (default) | step | layer (caching only)\n"
    "  --steps N         optimizer steps (default 4)\n"
    "  --micro N         micro-batches per step (default 2)\n"
    "  --layers N        dense layers, at least 2 (default 3)\n"
    "  --dim N           model width, a multiple of --heads (default 128)\n"
    "  --heads N         attention heads (default 4)\n"
    "  --seq N           tokens per sequence (default 32)\n"
    "  --batch N         sequences per micro-batch (default 2)\n"
    "  --vocab N         vocabulary, at least 2 (default 1024)\n"
    "  --buckets N       embedding rows (default 49152)\n"
    "  --experts N       mixture-of-experts experts (default 16)\n"
    "  --ffn N           expert hidden width (default 1024)\n"
    "  --eval-every N    evaluate after every Nth step (default 2)\n"
    "  --step-times      print 'step_time <n> <seconds>' after each step\n"
    "  --lr X            AdamW learning rate (default 0.001)\n"
    "  --seed N          seed of data and weights, 0..4294967295 (default 1)\n";

Options ParseFlags(int argc, char** argv) {
  Options o;
  constexpr int kMax = 1 << 16;
  examples::ForEachFlag(
      argc, argv, {"step-times"}, [&](const std::string& name, const std::string* flag) {
        if (name == "step-times") {
          o.step_times = true;
          return;
        }
        const std::string& value = *flag;
        if (name == "module") {
          if (value.empty()) examples::UsageError("--module needs a path");
          o.module = value;
        } else if (name == "alloc") {
          if (value == "caching") {
            o.alloc = AllocMode::kCaching;
          } else if (value == "per-tensor") {
            o.alloc = AllocMode::kPerTensor;
          } else {
            examples::UsageError("--alloc=%s: caching or per-tensor", value.c_str());
          }
        } else if (name == "optimizer") {
          if (value == "fused") {
            o.optimizer = OptimizerMode::kFused;
          } else if (value == "per-param") {
            o.optimizer = OptimizerMode::kPerParam;
          } else {
            examples::UsageError("--optimizer=%s: fused or per-param", value.c_str());
          }
        } else if (name == "graphs") {
          if (value == "eager") {
            o.graphs = GraphMode::kEager;
          } else if (value == "step") {
            o.graphs = GraphMode::kStep;
          } else if (value == "layer") {
            o.graphs = GraphMode::kLayer;
          } else {
            examples::UsageError("--graphs=%s: eager, step or layer", value.c_str());
          }
        } else if (name == "steps") {
          o.steps = examples::ParseInt(name, value, 1, 1000000);
        } else if (name == "micro") {
          o.micro = examples::ParseInt(name, value, 1, 1024);
        } else if (name == "layers") {
          o.layers = examples::ParseInt(name, value, 2, 1000);
        } else if (name == "dim") {
          o.dim = examples::ParseInt(name, value, 1, kMax);
        } else if (name == "heads") {
          o.heads = examples::ParseInt(name, value, 1, kMax);
        } else if (name == "seq") {
          o.seq = examples::ParseInt(name, value, 1, kMax);
        } else if (name == "batch") {
          o.batch = examples::ParseInt(name, value, 1, kMax);
        } else if (name == "vocab") {
          o.vocab = examples::ParseInt(name, value, 2, 1 << 24);
        } else if (name == "buckets") {
          o.buckets = examples::ParseInt(name, value, 1, 1 << 28);
        } else if (name == "experts") {
          o.experts = examples::ParseInt(name, value, 1, 1024);
        } else if (name == "ffn") {
          o.ffn = examples::ParseInt(name, value, 1, kMax);
        } else if (name == "eval-every") {
          o.eval_every = examples::ParseInt(name, value, 1, 1000000);
        } else if (name == "lr") {
          o.lr = examples::ParseFloat(name, value, 0.0f, 10.0f);
        } else if (name == "seed") {
          o.seed = examples::ParseInteger(name, value, 0, UINT_MAX);
        } else {
          examples::UsageError("unknown flag --%s", name.c_str());
        }
      });
  if (o.dim % o.heads != 0) {
    examples::UsageError("--dim %d is not a multiple of --heads %d", o.dim, o.heads);
  }
  if (o.alloc == AllocMode::kPerTensor && o.graphs != GraphMode::kEager) {
    // PyTorch's CUDAPluggableAllocator has no private pools to capture into.
    examples::UsageError(
        "--graphs=step and --graphs=layer need --alloc "
        "caching");
  }
  const long long rows = static_cast<long long>(o.batch) * o.seq;
  const long long d = o.dim;
  const long long counts[] = {
      static_cast<long long>(o.buckets) * d,
      2LL * o.experts * d * o.ffn,  // moe_backward_params's threads
      rows * o.vocab,
      rows * 4 * d,
      rows * o.ffn,
      static_cast<long long>(o.batch) * o.heads * o.seq * o.seq,
  };
  examples::CheckElementCounts(counts);
  return o;
}

using Ptr = CUdeviceptr;

Ptr At(Ptr base, long long floats) { return base + static_cast<Ptr>(floats) * sizeof(float); }

// Typed launchers, one per kernel of torchlike_kernels.cu (those it shares
// with other examples from examples::LayerKernels), each mirroring the
// kernel's C++ signature (CUdeviceptr standing for a pointer, including
// pointer tables) so no call can pass a parameter of the wrong size. All
// launch on the compute stream.
class Kernels : public examples::LayerKernels {
 public:
  Kernels(CUmodule module, CUstream stream) : LayerKernels(module, stream) {
    const auto Get = [module](const char* name) { return examples::GetKernel(module, name); };
    embed_forward_ = Get("_ZN9torchlike13embed_forwardEPKiPKfPfiiiii");
    embed_backward_ = Get("_ZN9torchlike14embed_backwardEPKiPKfPfiiiiii");
    attention_forward_ = Get("_ZN9torchlike17attention_forwardEPKPKfPKPfiiiiif");
    attention_backward_ = Get("_ZN9torchlike18attention_backwardEPKPKfPKPfiiiiif");
    router_forward_ = Get("_ZN9torchlike14router_forwardEPKfPKS1_PiPfPS1_ii");
    moe_forward_ = Get("_ZN9torchlike11moe_forwardEPKPKfS1_S1_PfS4_S4_iii");
    moe_backward_ = Get("_ZN9torchlike12moe_backwardEPKPKfS1_S1_S1_S1_PfS4_S4_iii");
    moe_backward_params_ = Get("_ZN9torchlike19moe_backward_paramsEPKiPKfS3_S3_S3_S3_PKPfiiiii");
    router_backward_ = Get("_ZN9torchlike15router_backwardEPKfS1_Pfii");
    softmax_xent_ = Get("_ZN9torchlike12softmax_xentEPKfPKiPfS4_iiif");
    loss_accumulate_ = Get("_ZN9torchlike15loss_accumulateEPKfPfifi");
    step_increment_ = Get("_ZN9torchlike14step_incrementEPi");
    adamw_ = Get("_ZN9torchlike5adamwEPfPKfS0_S0_PKifffffi");
    adamw_fused_ = Get("_ZN9torchlike11adamw_fusedENS_18TensorListMetadataEiPKifffff");
  }

  void EmbedForward(Ptr tokens, Ptr table, Ptr x, int rows, int seq, int vocab, int buckets,
                    int dim) const {
    void* args[] = {&tokens, &table, &x, &rows, &seq, &vocab, &buckets, &dim};
    Launch(embed_forward_, "embed_forward", 1LL * rows * dim, args);
  }
  void EmbedBackward(Ptr tokens, Ptr dx, Ptr dtable, int rows, int seq, int vocab, int buckets,
                     int dim, int accumulate) const {
    void* args[] = {&tokens, &dx, &dtable, &rows, &seq, &vocab, &buckets, &dim, &accumulate};
    Launch(embed_backward_, "embed_backward", 1LL * buckets * dim, args);
  }
  void AttentionForward(Ptr in, Ptr out, int count, int seq, int head_dim, int stride,
                        int out_stride, float scale) const {
    void* args[] = {&in, &out, &count, &seq, &head_dim, &stride, &out_stride, &scale};
    Launch(attention_forward_, "attention_forward", 1LL * count * seq, args);
  }
  void AttentionBackward(Ptr in, Ptr out, int count, int seq, int head_dim, int stride,
                         int out_stride, float scale) const {
    void* args[] = {&in, &out, &count, &seq, &head_dim, &stride, &out_stride, &scale};
    Launch(attention_backward_, "attention_backward", count, args);
  }
  void RouterForward(Ptr logits, Ptr expert_table, Ptr expert_of, Ptr gate, Ptr token_table,
                     int rows, int experts) const {
    void* args[] = {&logits, &expert_table, &expert_of, &gate, &token_table, &rows, &experts};
    Launch(router_forward_, "router_forward", rows, args);
  }
  void MoeForward(Ptr table, Ptr x, Ptr gate, Ptr hid, Ptr u, Ptr out, int rows, int dim,
                  int ffn) const {
    void* args[] = {&table, &x, &gate, &hid, &u, &out, &rows, &dim, &ffn};
    Launch(moe_forward_, "moe_forward", rows, args);
  }
  void MoeBackward(Ptr table, Ptr gate, Ptr hid, Ptr u, Ptr dy, Ptr dhid, Ptr dgate, Ptr dx,
                   int rows, int dim, int ffn) const {
    void* args[] = {&table, &gate, &hid, &u, &dy, &dhid, &dgate, &dx, &rows, &dim, &ffn};
    Launch(moe_backward_, "moe_backward", rows, args);
  }
  void MoeBackwardParams(Ptr expert_of, Ptr x, Ptr gate, Ptr hid, Ptr dhid, Ptr dy, Ptr grads,
                         int rows, int dim, int ffn, int experts, int accumulate) const {
    void* args[] = {&expert_of, &x,    &gate, &hid, &dhid,    &dy,
                    &grads,     &rows, &dim,  &ffn, &experts, &accumulate};
    Launch(moe_backward_params_, "moe_backward_params", 2LL * experts * dim * ffn, args);
  }
  void RouterBackward(Ptr logits, Ptr dgate, Ptr dlogits, int rows, int experts) const {
    void* args[] = {&logits, &dgate, &dlogits, &rows, &experts};
    Launch(router_backward_, "router_backward", rows, args);
  }
  void SoftmaxXent(Ptr logits, Ptr tokens, Ptr dlogits, Ptr row_loss, int rows, int seq, int vocab,
                   float scale) const {
    void* args[] = {&logits, &tokens, &dlogits, &row_loss, &rows, &seq, &vocab, &scale};
    Launch(softmax_xent_, "softmax_xent", rows, args);
  }
  void LossAccumulate(Ptr row_loss, Ptr loss, int rows, float scale, int accumulate) const {
    void* args[] = {&row_loss, &loss, &rows, &scale, &accumulate};
    Launch(loss_accumulate_, "loss_accumulate", 1, args);
  }
  void StepIncrement(Ptr step) const {
    void* args[] = {&step};
    Launch(step_increment_, "step_increment", 1, args);
  }
  void AdamW(Ptr p, Ptr g, Ptr m, Ptr v, Ptr step, float lr, float beta1, float beta2, float eps,
             float weight_decay, int n) const {
    void* args[] = {&p, &g, &m, &v, &step, &lr, &beta1, &beta2, &eps, &weight_decay, &n};
    Launch(adamw_, "adamw", n, args);
  }
  // One block per (tensor, chunk) of `tl`, as multi_tensor_apply launches.
  void AdamWFused(const TensorListMetadata& tl, int blocks, int chunk_size, Ptr step, float lr,
                  float beta1, float beta2, float eps, float weight_decay) const {
    TensorListMetadata copy = tl;
    void* args[] = {&copy, &chunk_size, &step, &lr, &beta1, &beta2, &eps, &weight_decay};
    const CUresult r = cuLaunchKernel(adamw_fused_, static_cast<unsigned>(blocks), 1, 1, 512, 1, 1,
                                      0, stream(), args, nullptr);
    if (r != CUDA_SUCCESS) {
      std::fprintf(stderr, "%s: launch of torchlike::adamw_fused:\n", examples::ProgramName());
      examples::CheckCu(r, "cuLaunchKernel");
    }
  }

 private:
  void Launch(CUfunction function, const char* name, long long threads, void** args) const {
    examples::LaunchPerElement(function, "torchlike", name, threads, stream(), args);
  }

  CUfunction embed_forward_, embed_backward_, attention_forward_, attention_backward_,
      router_forward_, moe_forward_, moe_backward_, moe_backward_params_, router_backward_,
      softmax_xent_, loss_accumulate_, step_increment_, adamw_, adamw_fused_;
};

// Where tensors come from: the caching allocator, or libstensor.so's
// per-tensor pair (the driver's stream-ordered allocator without it, never
// cuMemFree, which waits for the whole device). Tracks the
// live bytes and their peak, the working set. Thread-safe (the data loader
// allocates on its own thread).
class TensorMemory {
 public:
  explicit TensorMemory(AllocMode mode) : mode_(mode) {
    if (mode_ == AllocMode::kPerTensor) {
      torch_malloc_ = reinterpret_cast<MallocFn>(dlsym(RTLD_DEFAULT, "stensor_torch_malloc"));
      torch_free_ = reinterpret_cast<FreeFn>(dlsym(RTLD_DEFAULT, "stensor_torch_free"));
      if ((torch_malloc_ == nullptr) != (torch_free_ == nullptr)) {
        std::fprintf(stderr, "%s: only one of stensor_torch_malloc/free\n",
                     examples::ProgramName());
        std::exit(1);
      }
      if (torch_malloc_ == nullptr) {
        // As PyTorch's cudaMallocAsync backend: the pool keeps freed memory
        // for the next step rather than releasing it at each synchronisation.
        CUdevice device;
        CUmemoryPool pool;
        CU_CHECK(cuCtxGetDevice, &device);
        CU_CHECK(cuDeviceGetDefaultMemPool, &pool, device);
        cuuint64_t keep_all = UINT64_MAX;
        CU_CHECK(cuMemPoolSetAttribute, pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all);
      }
    }
  }

  Ptr Alloc(size_t bytes, CUstream stream) {
    Ptr p = 0;
    if (mode_ == AllocMode::kCaching) {
      p = caching_.Malloc(bytes, stream);
    } else if (torch_malloc_ != nullptr) {
      p = reinterpret_cast<uintptr_t>(torch_malloc_(static_cast<ssize_t>(bytes), 0, stream));
      if (p == 0) {
        // PyTorch would hand the tensor a null pointer; stop instead.
        std::fprintf(stderr, "%s: stensor_torch_malloc(%zu) returned null\n",
                     examples::ProgramName(), bytes);
        examples::CheckCu(CUDA_ERROR_OUT_OF_MEMORY, "stensor_torch_malloc");
      }
    } else {
      CU_CHECK(cuMemAllocAsync, &p, bytes, stream);
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_[p] = Live{bytes, stream, {}};
    charged_ += Charge(bytes);
    peak_charged_ = std::max(peak_charged_, charged_);
    return p;
  }

  void Free(Ptr p) {
    Live live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = live_.find(p);
      if (it == live_.end()) {
        std::fprintf(stderr, "%s: free of unknown tensor\n", examples::ProgramName());
        std::exit(1);
      }
      live = it->second;
      live_.erase(it);
      charged_ -= Charge(live.bytes);
    }
    if (mode_ == AllocMode::kCaching) {
      caching_.Free(p);
      return;
    }
    for (CUstream use : live.uses) {
      CUevent used;
      CU_CHECK(cuEventCreate, &used, CU_EVENT_DISABLE_TIMING);
      CU_CHECK(cuEventRecord, used, use);
      CU_CHECK(cuStreamWaitEvent, live.stream, used, 0);
      CU_CHECK(cuEventDestroy, used);
    }
    if (torch_free_ != nullptr) {
      torch_free_(reinterpret_cast<void*>(p), static_cast<ssize_t>(live.bytes), 0, live.stream);
    } else {
      CU_CHECK(cuMemFreeAsync, p, live.stream);
    }
  }

  // The tensor is used on `stream` too. Caching: Tensor.record_stream.
  // Per-tensor: PyTorch's pluggable allocator ignores record_stream and
  // frees on the allocation's stream, so the program orders that stream
  // after the other one's use before the free (loader.wait_stream(compute)),
  // as a careful user must: without it the driver's stream-ordered free
  // releases the memory while the other stream still reads it.
  void RecordStream(Ptr p, CUstream stream) {
    if (mode_ == AllocMode::kCaching) {
      caching_.RecordStream(p, stream);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_.at(p).uses.push_back(stream);
  }

  void EmptyCache() {
    if (mode_ == AllocMode::kCaching) caching_.EmptyCache();
  }

  CachingAllocator& caching() { return caching_; }
  AllocMode mode() const { return mode_; }

  size_t working_set() const {
    if (mode_ == AllocMode::kCaching) return caching_.peak_reserved_bytes();
    std::lock_guard<std::mutex> lock(mu_);
    return peak_charged_;
  }
  size_t live_tensors() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }

 private:
  using MallocFn = void* (*)(ssize_t, int, CUstream);
  using FreeFn = void (*)(void*, ssize_t, int, CUstream);
  struct Live {
    size_t bytes;
    CUstream stream;
    std::vector<CUstream> uses;  // other streams (per-tensor mode)
  };

  // What a cap charges a tensor of its own: granules from half a granule
  // up, else 4 KiB pages (tests/torch_allocator.cc).
  static size_t Charge(size_t bytes) {
    constexpr size_t kGranule = 2 << 20;
    return bytes >= kGranule / 2 ? (bytes + kGranule - 1) / kGranule * kGranule
                                 : (bytes + 4095) / 4096 * 4096;
  }

  const AllocMode mode_;
  CachingAllocator caching_;
  MallocFn torch_malloc_ = nullptr;
  FreeFn torch_free_ = nullptr;
  mutable std::mutex mu_;
  std::map<Ptr, Live> live_;
  size_t charged_ = 0, peak_charged_ = 0;
};

// Pinned host memory for pointer-table uploads, handed out in order and
// taken back all at once: PyTorch's pinned CachingHostAllocator reduced to
// what this program needs. Reset only once the copies from it are done
// (after a stream synchronisation), or never for a capture's arena, whose
// copies every replay repeats.
class PinnedArena {
 public:
  explicit PinnedArena(size_t bytes) : size_(bytes) {
    CU_CHECK(cuMemHostAlloc, reinterpret_cast<void**>(&base_), bytes, 0);
  }
  ~PinnedArena() { cuMemFreeHost(base_); }
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  uint64_t* Take(size_t words) {
    const size_t bytes = (words * sizeof(uint64_t) + 63) / 64 * 64;
    if (used_ + bytes > size_) {
      std::fprintf(stderr, "%s: pinned table arena full\n", examples::ProgramName());
      std::exit(1);
    }
    uint64_t* p = reinterpret_cast<uint64_t*>(base_ + used_);
    used_ += bytes;
    return p;
  }
  void Reset() { used_ = 0; }

 private:
  unsigned char* base_ = nullptr;
  size_t size_;
  size_t used_ = 0;
};

// The training tokens of batch `index` (or the evaluation batch): sequences
// that mostly follow next = 5 cur + 3 (mod vocab), with random jumps.
void SynthBatch(int* tokens, int batch, int seq, int vocab, unsigned seed, unsigned index) {
  for (int b = 0; b < batch; ++b) {
    int* s = tokens + static_cast<size_t>(b) * (seq + 1);
    const unsigned base = exact::Key(seed ^ 0xda7au, index * 4099u + b);
    s[0] = static_cast<int>(exact::Hash(base) % static_cast<unsigned>(vocab));
    for (int t = 1; t <= seq; ++t) {
      const unsigned h = exact::Hash(base + static_cast<unsigned>(t));
      s[t] = (h & 7u) == 0 ? static_cast<int>((h >> 3) % static_cast<unsigned>(vocab))
                           : static_cast<int>((5LL * s[t - 1] + 3) % static_cast<long long>(vocab));
    }
  }
}

// The data loader: a thread with its own context binding and stream that
// fills pinned staging buffers, copies each batch into a tensor allocated on
// its stream and hands it over with an event, at most `depth` ahead of the
// trainer.
class DataLoader {
 public:
  struct Batch {
    Ptr tokens;
    CUevent ready;
  };

  DataLoader(CUcontext context, TensorMemory* memory, const Options& o, int total)
      : memory_(memory), o_(o), total_(total), words_(static_cast<size_t>(o.batch) * (o.seq + 1)) {
    CU_CHECK(cuStreamCreate, &stream_, CU_STREAM_NON_BLOCKING);
    slots_.resize(kDepth);
    for (Slot& s : slots_) {
      CU_CHECK(cuMemHostAlloc, reinterpret_cast<void**>(&s.staging), words_ * sizeof(int), 0);
      CU_CHECK(cuEventCreate, &s.copied, CU_EVENT_DISABLE_TIMING);
    }
    thread_ = std::thread([this, context] { Run(context); });
  }
  ~DataLoader() {
    thread_.join();
    for (Slot& s : slots_) {
      cuEventDestroy(s.copied);
      cuMemFreeHost(s.staging);
    }
    cuStreamDestroy(stream_);
  }

  // The next batch, with `consumer` made to wait for its copy; the tensor is
  // recorded as used on `consumer`, and the caller frees it.
  Ptr Next(CUstream consumer) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return !ready_.empty(); });
    const Batch b = ready_.front();
    CU_CHECK(cuStreamWaitEvent, consumer, b.ready, 0);
    ready_.pop_front();
    ++consumed_;
    changed_.notify_all();
    lock.unlock();
    memory_->RecordStream(b.tokens, consumer);
    return b.tokens;
  }

  // Returns once the loader makes no driver call until the next Next: its
  // queue is full or it has produced every batch. A capture in the global
  // mode must not see another thread's allocations or event waits.
  void WaitIdle() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return produced_ == total_ || produced_ - consumed_ == kDepth; });
  }

  CUstream stream() const { return stream_; }

 private:
  static constexpr int kDepth = 2;
  struct Slot {
    int* staging = nullptr;
    CUevent copied = nullptr;
    bool used = false;
  };

  void Run(CUcontext context) {
    CU_CHECK(cuCtxSetCurrent, context);
    for (int k = 0; k < total_; ++k) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [this] { return produced_ - consumed_ < kDepth; });
      }
      Slot& s = slots_[k % kDepth];
      // The staging buffer's previous copy must be done before refilling.
      if (s.used) CU_CHECK(cuEventSynchronize, s.copied);
      SynthBatch(s.staging, o_.batch, o_.seq, o_.vocab, static_cast<unsigned>(o_.seed),
                 static_cast<unsigned>(k));
      const Ptr tokens = memory_->Alloc(words_ * sizeof(int), stream_);
      CU_CHECK(cuMemcpyHtoDAsync, tokens, s.staging, words_ * sizeof(int), stream_);
      CU_CHECK(cuEventRecord, s.copied, stream_);
      s.used = true;
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back({tokens, s.copied});
      ++produced_;
      changed_.notify_all();
    }
  }

  TensorMemory* memory_;
  const Options& o_;
  const int total_;
  const size_t words_;
  CUstream stream_ = nullptr;
  std::vector<Slot> slots_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;  // guarded by mu_
  int produced_ = 0;         // guarded by mu_
  int consumed_ = 0;         // guarded by mu_
};

// A parameter: weights and AdamW moments (persistent), and the gradient,
// allocated in the backward pass and freed after the optimizer step.
struct Param {
  Ptr w = 0, m = 0, v = 0, grad = 0;
  long long n = 0;
};

struct DenseParams {
  Param* wqkv;
  Param* bqkv;
  Param* wo;
  Param* bo;
  Param* w1;
  Param* b1;
  Param* w2;
  Param* b2;
};

// What a dense layer's backward needs from its forward.
struct DenseSaved {
  Ptr x = 0;  // the input, owned by the caller
  Ptr qkv = 0, probs = 0, attn = 0, h = 0, u = 0, a = 0;
};

struct MoeSaved {
  Ptr x = 0;
  Ptr logits = 0, expert_of = 0, gate = 0, token_table = 0, hid = 0, u = 0;
};

// A dense layer's forward and backward as graphs (--graphs layer), with the
// static tensors they read and write, all in the layer's private pool.
struct LayerGraphs {
  CUgraphExec forward = nullptr, backward = nullptr;
  Ptr in = 0, out = 0, dy = 0, dx = 0;
  DenseSaved saved;
  std::vector<Ptr> grads;  // static gradients, in DenseParams order
};

constexpr float kBeta1 = 0.9f;
constexpr float kBeta2 = 0.999f;
constexpr float kEps = 1e-8f;
constexpr float kWeightDecay = 0.01f;
constexpr int kChunkSize = 65536;  // multi_tensor_apply's chunk
constexpr int kStepPool = 1;       // private pool of the whole-step graph
constexpr int kLayerPool = 100;    // + layer: pools of the layer graphs

class Trainer {
 public:
  Trainer(const Options& o, const Kernels& k, TensorMemory* memory)
      : o_(o),
        k_(k),
        stream_(k.stream()),
        mem_(memory),
        rows_(o.batch * o.seq),
        head_dim_(o.dim / o.heads),
        count_(o.batch * o.heads),
        eager_tables_(1 << 20),
        capture_tables_(1 << 20) {}

  void Init() {
    const unsigned seed = static_cast<unsigned>(o_.seed);
    const int d = o_.dim;
    const float in_scale = 1.0f / std::sqrt(static_cast<float>(d));
    embedding_ = NewParam(1LL * o_.buckets * d, seed ^ 0xe0u, 1.0f);
    dense_.resize(o_.layers);
    for (int l = 0; l < o_.layers; ++l) {
      const unsigned s = seed ^ (0xb10c0000u + 16u * l);
      DenseParams& p = dense_[l];
      p.wqkv = NewParam(3LL * d * d, s + 1, in_scale);
      p.bqkv = NewParam(3LL * d, 0, 0.0f);
      p.wo = NewParam(1LL * d * d, s + 2, in_scale * 0.5f);
      p.bo = NewParam(d, 0, 0.0f);
      p.w1 = NewParam(4LL * d * d, s + 3, in_scale);
      p.b1 = NewParam(4LL * d, 0, 0.0f);
      p.w2 = NewParam(4LL * d * d, s + 4, 0.5f / std::sqrt(static_cast<float>(4 * d)));
      p.b2 = NewParam(d, 0, 0.0f);
    }
    router_w_ = NewParam(1LL * d * o_.experts, seed ^ 0x407e4u, in_scale);
    router_b_ = NewParam(o_.experts, 0, 0.0f);
    for (int e = 0; e < o_.experts; ++e) {
      expert_w1_.push_back(NewParam(1LL * d * o_.ffn, seed ^ (0xe1000u + e), in_scale));
      expert_w2_.push_back(NewParam(1LL * o_.ffn * d, seed ^ (0xe2000u + e),
                                    0.5f / std::sqrt(static_cast<float>(o_.ffn))));
    }
    head_w_ = NewParam(1LL * d * o_.vocab, seed ^ 0x4eadu, 0.1f * in_scale);
    head_b_ = NewParam(o_.vocab, 0, 0.0f);

    step_count_ = mem_->Alloc(sizeof(int), stream_);
    CU_CHECK(cuMemsetD32Async, step_count_, 0, 1, stream_);
    loss_ = mem_->Alloc(sizeof(float), stream_);
    eval_loss_ = mem_->Alloc(sizeof(float), stream_);
    // The evaluation batch, uploaded once.
    const size_t words = static_cast<size_t>(o_.batch) * (o_.seq + 1);
    std::vector<int> tokens(words);
    SynthBatch(tokens.data(), o_.batch, o_.seq, o_.vocab, seed, 0x7fffffffu);
    eval_tokens_ = mem_->Alloc(words * sizeof(int), stream_);
    CU_CHECK(cuMemcpyHtoDAsync, eval_tokens_, tokens.data(), words * sizeof(int), stream_);
    CU_CHECK(cuStreamSynchronize, stream_);
  }

  // One optimizer step over `micro` batches from the loader; returns the
  // mean loss.
  float Step(int step, DataLoader* loader) {
    eager_tables_.Reset();
    std::vector<Ptr> batches;
    for (int i = 0; i < o_.micro; ++i) batches.push_back(loader->Next(stream_));
    if (o_.graphs == GraphMode::kStep && step >= 1) {
      if (static_inputs_.empty()) {
        for (int i = 0; i < o_.micro; ++i) {
          static_inputs_.push_back(mem_->Alloc(TokenBytes(), stream_));
        }
      }
      for (int i = 0; i < o_.micro; ++i) {
        CU_CHECK(cuMemcpyDtoDAsync, static_inputs_[i], batches[i], TokenBytes(), stream_);
        mem_->Free(batches[i]);
      }
      if (step_graph_ == nullptr) {
        loader->WaitIdle();
        tables_ = &capture_tables_;
        step_graph_ = Capture(kStepPool, [&] { TrainStep(static_inputs_); });
        tables_ = &eager_tables_;
      }
      CU_CHECK(cuGraphLaunch, step_graph_, stream_);
    } else {
      if (o_.graphs == GraphMode::kLayer && step >= 1) {
        capture_layers_ = loader;  // the first use of each layer captures
      }
      TrainStep(batches);
      capture_layers_ = nullptr;
      for (Ptr b : batches) mem_->Free(b);
    }
    float loss = 0.0f;
    CU_CHECK(cuMemcpyDtoHAsync, &loss, loss_, sizeof(loss), stream_);
    CU_CHECK(cuStreamSynchronize, stream_);
    return loss;
  }

  // Forward only on the evaluation batch, as under torch.no_grad(), then
  // torch.cuda.empty_cache().
  float Evaluate() {
    eager_tables_.Reset();
    Ptr x = Forward(eval_tokens_, /*keep=*/false, nullptr);
    const Ptr logits = mem_->Alloc(Floats(1LL * rows_ * o_.vocab), stream_);
    k_.MatmulForward(x, head_w_->w, head_b_->w, logits, rows_, o_.dim, o_.vocab);
    mem_->Free(x);
    const Ptr dlogits = mem_->Alloc(Floats(1LL * rows_ * o_.vocab), stream_);
    const Ptr row_loss = mem_->Alloc(Floats(rows_), stream_);
    k_.SoftmaxXent(logits, eval_tokens_, dlogits, row_loss, rows_, o_.seq, o_.vocab, 1.0f);
    k_.LossAccumulate(row_loss, eval_loss_, rows_, 1.0f / static_cast<float>(rows_), 0);
    mem_->Free(logits);
    mem_->Free(dlogits);
    mem_->Free(row_loss);
    float loss = 0.0f;
    CU_CHECK(cuMemcpyDtoHAsync, &loss, eval_loss_, sizeof(loss), stream_);
    CU_CHECK(cuStreamSynchronize, stream_);
    mem_->EmptyCache();
    return loss;
  }

  std::vector<float> Parameters() {
    std::vector<float> values;
    for (const Param& p : params_) {
      const size_t at = values.size();
      values.resize(at + static_cast<size_t>(p.n));
      CU_CHECK(cuMemcpyDtoHAsync, values.data() + at, p.w, static_cast<size_t>(p.n) * sizeof(float),
               stream_);
    }
    CU_CHECK(cuStreamSynchronize, stream_);
    return values;
  }

  // Destroys the graphs, frees every tensor and the private pools.
  void FreeAll() {
    CU_CHECK(cuStreamSynchronize, stream_);
    if (step_graph_ != nullptr) CU_CHECK(cuGraphExecDestroy, step_graph_);
    for (Ptr p : static_inputs_) mem_->Free(p);
    for (size_t l = 0; l < layer_graphs_.size(); ++l) {
      LayerGraphs& g = layer_graphs_[l];
      if (g.forward == nullptr) continue;
      CU_CHECK(cuGraphExecDestroy, g.forward);
      CU_CHECK(cuGraphExecDestroy, g.backward);
      for (Ptr p : {g.in, g.out, g.dy, g.dx}) mem_->Free(p);
      FreeSaved(g.saved);
      for (Ptr p : g.grads) mem_->Free(p);
    }
    for (Param& p : params_) {
      mem_->Free(p.w);
      mem_->Free(p.m);
      mem_->Free(p.v);
    }
    for (Ptr p : {step_count_, loss_, eval_loss_, eval_tokens_}) mem_->Free(p);
    if (mem_->mode() == AllocMode::kCaching) {
      CachingAllocator& c = mem_->caching();
      c.ReleasePool(kStepPool);
      for (int l = 0; l < o_.layers; ++l) c.ReleasePool(kLayerPool + l);
      c.EmptyCache();
    }
  }

 private:
  size_t TokenBytes() const { return static_cast<size_t>(o_.batch) * (o_.seq + 1) * sizeof(int); }
  static size_t Floats(long long n) { return static_cast<size_t>(n) * sizeof(float); }

  Param* NewParam(long long n, unsigned seed, float scale) {
    params_.emplace_back();
    Param& p = params_.back();
    p.n = n;
    p.w = mem_->Alloc(Floats(n), stream_);
    p.m = mem_->Alloc(Floats(n), stream_);
    p.v = mem_->Alloc(Floats(n), stream_);
    if (scale == 0.0f) {
      CU_CHECK(cuMemsetD32Async, p.w, 0, static_cast<size_t>(n), stream_);
    } else {
      k_.InitParams(p.w, static_cast<int>(n), seed, scale);
    }
    CU_CHECK(cuMemsetD32Async, p.m, 0, static_cast<size_t>(n), stream_);
    CU_CHECK(cuMemsetD32Async, p.v, 0, static_cast<size_t>(n), stream_);
    return &p;
  }

  // The gradient of `p`, allocated on first use in a step (set_to_none);
  // returns whether to accumulate into it.
  int Grad(Param* p) {
    if (p->grad != 0) return 1;
    p->grad = mem_->Alloc(Floats(p->n), stream_);
    return 0;
  }

  // Uploads a host-built pointer table into a new tensor (its free is the
  // caller's, after the kernel that reads it is queued).
  Ptr UploadTable(const std::vector<Ptr>& entries) {
    uint64_t* host = tables_->Take(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) host[i] = entries[i];
    const size_t bytes = entries.size() * sizeof(uint64_t);
    const Ptr table = mem_->Alloc(bytes, stream_);
    CU_CHECK(cuMemcpyHtoDAsync, table, host, bytes, stream_);
    return table;
  }

  // Records `work` on the compute stream into a graph, its allocations from
  // private pool `pool`, and returns the instantiated graph.
  template <typename Work>
  CUgraphExec Capture(int pool, Work&& work) {
    if (mem_->mode() == AllocMode::kCaching) {
      mem_->caching().BeginAllocateToPool(pool, stream_);
    }
    CU_CHECK(cuStreamBeginCapture, stream_, CU_STREAM_CAPTURE_MODE_GLOBAL);
    work();
    CUgraph graph = nullptr;
    CU_CHECK(cuStreamEndCapture, stream_, &graph);
    if (mem_->mode() == AllocMode::kCaching) {
      mem_->caching().EndAllocateToPool();
    }
    CUgraphExec exec = nullptr;
    CU_CHECK(cuGraphInstantiateWithFlags, &exec, graph, 0);
    CU_CHECK(cuGraphDestroy, graph);
    return exec;
  }

  // Forward and backward of every micro-batch, then the optimizer step.
  void TrainStep(const std::vector<Ptr>& batches) {
    const float scale = 1.0f / static_cast<float>(rows_ * o_.micro);
    for (int i = 0; i < o_.micro; ++i) {
      const Ptr tokens = batches[i];
      std::vector<Ptr> acts;
      Ptr x = Forward(tokens, /*keep=*/true, &acts);
      // Head: logits, loss and their gradient.
      const Ptr logits = mem_->Alloc(Floats(1LL * rows_ * o_.vocab), stream_);
      k_.MatmulForward(x, head_w_->w, head_b_->w, logits, rows_, o_.dim, o_.vocab);
      const Ptr dlogits = mem_->Alloc(Floats(1LL * rows_ * o_.vocab), stream_);
      const Ptr row_loss = mem_->Alloc(Floats(rows_), stream_);
      k_.SoftmaxXent(logits, tokens, dlogits, row_loss, rows_, o_.seq, o_.vocab, scale);
      mem_->Free(logits);
      k_.LossAccumulate(row_loss, loss_, rows_, scale, i > 0);
      mem_->Free(row_loss);
      const int acc_w = Grad(head_w_), acc_b = Grad(head_b_);
      (void)acc_b;
      k_.MatmulBackwardParams(x, dlogits, head_w_->grad, head_b_->grad, rows_, o_.dim, o_.vocab,
                              acc_w);
      Ptr dx = mem_->Alloc(Floats(1LL * rows_ * o_.dim), stream_);
      k_.MatmulBackwardInput(dlogits, head_w_->w, dx, rows_, o_.dim, o_.vocab);
      mem_->Free(dlogits);
      mem_->Free(x);
      Backward(tokens, dx, &acts);
    }
    k_.StepIncrement(step_count_);
    Optimize();
    for (Param& p : params_) {
      mem_->Free(p.grad);
      p.grad = 0;
    }
  }

  // The blocks in order: dense 0, the MoE block, dense 1 (checkpointed),
  // dense 2... Returns the last block's output; with `keep`, `acts` gets
  // each block's input, in order, for Backward (and its saved tensors are
  // in saved_dense_ / saved_moe_); without, everything but the output is
  // freed.
  Ptr Forward(Ptr tokens, bool keep, std::vector<Ptr>* acts) {
    Ptr x = mem_->Alloc(Floats(1LL * rows_ * o_.dim), stream_);
    k_.EmbedForward(tokens, embedding_->w, x, rows_, o_.seq, o_.vocab, o_.buckets, o_.dim);
    saved_dense_.assign(o_.layers, DenseSaved());
    for (int block = 0; block <= o_.layers; ++block) {
      if (keep) acts->push_back(x);
      Ptr out = 0;
      if (block == 1) {
        out = MoeForward(x, keep ? &saved_moe_ : nullptr);
      } else {
        const int l = block == 0 ? 0 : block - 1;
        const bool checkpointed = l == 1;
        out = DenseForward(l, x, keep && !checkpointed ? &saved_dense_[l] : nullptr);
      }
      if (!keep) mem_->Free(x);
      x = out;
    }
    return x;
  }

  // dx: the gradient of the last block's output (freed here).
  void Backward(Ptr tokens, Ptr dx, std::vector<Ptr>* acts) {
    for (int block = o_.layers; block >= 0; --block) {
      const Ptr x = (*acts)[block];
      Ptr dnext = 0;
      if (block == 1) {
        dnext = MoeBackward(saved_moe_, dx);
      } else {
        const int l = block == 0 ? 0 : block - 1;
        if (l == 1) {
          // Checkpointed: run the forward again to rebuild what it saved.
          DenseSaved saved;
          const Ptr out = DenseForward(l, x, &saved);
          mem_->Free(out);
          dnext = DenseBackward(l, saved, dx);
        } else {
          dnext = DenseBackward(l, saved_dense_[l], dx);
        }
      }
      mem_->Free(dx);
      if (block > 0) mem_->Free(x);  // block 0's input is freed below
      dx = dnext;
    }
    const int acc = Grad(embedding_);
    k_.EmbedBackward(tokens, dx, embedding_->grad, rows_, o_.seq, o_.vocab, o_.buckets, o_.dim,
                     acc);
    mem_->Free(dx);
    mem_->Free((*acts)[0]);
  }

  // --- Dense layers ---------------------------------------------------------

  Ptr DenseForward(int l, Ptr x, DenseSaved* keep) {
    if (capture_layers_ != nullptr || LayerGraphed(l)) {
      return GraphedDenseForward(l, x, keep);
    }
    DenseSaved s;
    const Ptr out = DenseForwardOps(l, x, &s);
    if (keep != nullptr) {
      *keep = s;
    } else {
      FreeSaved(s);
    }
    return out;
  }

  Ptr DenseBackward(int l, const DenseSaved& s, Ptr dy) {
    if (LayerGraphed(l) && l != 1) return GraphedDenseBackward(l, dy);
    return DenseBackwardOps(l, s, dy, /*static_grads=*/nullptr);
  }

  // The forward's kernels; `s` gets the tensors the backward needs.
  Ptr DenseForwardOps(int l, Ptr x, DenseSaved* s) {
    const DenseParams& p = dense_[l];
    const int d = o_.dim, rows = rows_;
    s->x = x;
    s->qkv = mem_->Alloc(Floats(3LL * rows * d), stream_);
    k_.MatmulForward(x, p.wqkv->w, p.bqkv->w, s->qkv, rows, d, 3 * d);
    s->probs = mem_->Alloc(Floats(1LL * count_ * o_.seq * o_.seq), stream_);
    s->attn = mem_->Alloc(Floats(1LL * rows * d), stream_);
    // The batched attention's pointer table: per (sequence, head) its Q, K,
    // V, output and probabilities.
    std::vector<Ptr> entries(5 * count_);
    for (int n = 0; n < count_; ++n) {
      const int b = n / o_.heads, h = n % o_.heads;
      const long long row0 = 1LL * b * o_.seq;
      const Ptr q = At(s->qkv, row0 * 3 * d + 1LL * h * head_dim_);
      entries[n] = q;
      entries[count_ + n] = At(q, d);
      entries[2 * count_ + n] = At(q, 2LL * d);
      entries[3 * count_ + n] = At(s->attn, row0 * d + 1LL * h * head_dim_);
      entries[4 * count_ + n] = At(s->probs, 1LL * n * o_.seq * o_.seq);
    }
    const Ptr table = UploadTable(entries);
    k_.AttentionForward(table, At(table, 3LL * count_ * 2), count_, o_.seq, head_dim_, 3 * d, d,
                        AttentionScale());
    mem_->Free(table);
    const Ptr proj = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.MatmulForward(s->attn, p.wo->w, p.bo->w, proj, rows, d, d);
    s->h = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.AddVectors(x, proj, s->h, rows * d);
    mem_->Free(proj);
    s->u = mem_->Alloc(Floats(4LL * rows * d), stream_);
    k_.MatmulForward(s->h, p.w1->w, p.b1->w, s->u, rows, d, 4 * d);
    s->a = mem_->Alloc(Floats(4LL * rows * d), stream_);
    k_.ReluForward(s->u, s->a, rows * 4 * d);
    const Ptr m = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.MatmulForward(s->a, p.w2->w, p.b2->w, m, rows, 4 * d, d);
    const Ptr out = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.AddVectors(s->h, m, out, rows * d);
    mem_->Free(m);
    return out;
  }

  void FreeSaved(const DenseSaved& s) {
    for (Ptr p : {s.qkv, s.probs, s.attn, s.h, s.u, s.a}) {
      if (p != 0) mem_->Free(p);
    }
  }

  // The backward's kernels; frees what `s` saved (not its input) and
  // returns the input's gradient. Gradients go to the parameters' (with
  // accumulation), or overwrite `static_grads` (a layer graph's).
  Ptr DenseBackwardOps(int l, const DenseSaved& s, Ptr dy, const std::vector<Ptr>* static_grads) {
    const DenseParams& p = dense_[l];
    const int d = o_.dim, rows = rows_;
    Param* const order[] = {p.wqkv, p.bqkv, p.wo, p.bo, p.w1, p.b1, p.w2, p.b2};
    Ptr g[8];
    int acc = 0;
    for (int i = 0; i < 8; ++i) {
      if (static_grads != nullptr) {
        g[i] = (*static_grads)[i];
      } else {
        acc = Grad(order[i]);
        g[i] = order[i]->grad;
      }
    }
    k_.MatmulBackwardParams(s.a, dy, g[6], g[7], rows, 4 * d, d, acc);
    const Ptr da = mem_->Alloc(Floats(4LL * rows * d), stream_);
    k_.MatmulBackwardInput(dy, p.w2->w, da, rows, 4 * d, d);
    k_.ReluBackward(s.u, da, rows * 4 * d);
    k_.MatmulBackwardParams(s.h, da, g[4], g[5], rows, d, 4 * d, acc);
    const Ptr dmlp = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.MatmulBackwardInput(da, p.w1->w, dmlp, rows, d, 4 * d);
    mem_->Free(da);
    const Ptr dh = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.AddVectors(dmlp, dy, dh, rows * d);
    mem_->Free(dmlp);
    k_.MatmulBackwardParams(s.attn, dh, g[2], g[3], rows, d, d, acc);
    const Ptr dattn = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.MatmulBackwardInput(dh, p.wo->w, dattn, rows, d, d);
    const Ptr dqkv = mem_->Alloc(Floats(3LL * rows * d), stream_);
    const Ptr dscores = mem_->Alloc(Floats(1LL * count_ * o_.seq * o_.seq), stream_);
    std::vector<Ptr> entries(9 * count_);
    for (int n = 0; n < count_; ++n) {
      const int b = n / o_.heads, h = n % o_.heads;
      const long long row0 = 1LL * b * o_.seq;
      const long long qoff = row0 * 3 * d + 1LL * h * head_dim_;
      const long long ooff = row0 * d + 1LL * h * head_dim_;
      entries[n] = At(s.qkv, qoff);
      entries[count_ + n] = At(s.qkv, qoff + d);
      entries[2 * count_ + n] = At(s.qkv, qoff + 2LL * d);
      entries[3 * count_ + n] = At(s.probs, 1LL * n * o_.seq * o_.seq);
      entries[4 * count_ + n] = At(dattn, ooff);
      entries[5 * count_ + n] = At(dqkv, qoff);
      entries[6 * count_ + n] = At(dqkv, qoff + d);
      entries[7 * count_ + n] = At(dqkv, qoff + 2LL * d);
      entries[8 * count_ + n] = At(dscores, 1LL * n * o_.seq * o_.seq);
    }
    const Ptr table = UploadTable(entries);
    k_.AttentionBackward(table, At(table, 5LL * count_ * 2), count_, o_.seq, head_dim_, 3 * d, d,
                         AttentionScale());
    mem_->Free(table);
    mem_->Free(dscores);
    mem_->Free(dattn);
    k_.MatmulBackwardParams(s.x, dqkv, g[0], g[1], rows, d, 3 * d, acc);
    const Ptr dattn_in = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.MatmulBackwardInput(dqkv, p.wqkv->w, dattn_in, rows, d, 3 * d);
    mem_->Free(dqkv);
    const Ptr dx = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.AddVectors(dattn_in, dh, dx, rows * d);
    mem_->Free(dattn_in);
    mem_->Free(dh);
    FreeSaved(s);
    return dx;
  }

  float AttentionScale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim_)); }

  // --- Layer graphs (--graphs layer) ----------------------------------------

  bool LayerGraphed(int l) const {
    return l != 1 && l < static_cast<int>(layer_graphs_.size()) &&
           layer_graphs_[l].forward != nullptr;
  }

  // Copies x into the layer's static input, replays its forward graph and
  // copies its static output into a new tensor. The first call (in a step
  // that captures) captures both graphs; the checkpointed layer stays eager.
  Ptr GraphedDenseForward(int l, Ptr x, DenseSaved* keep) {
    if (l == 1 || (!LayerGraphed(l) && (capture_layers_ == nullptr || keep == nullptr))) {
      DenseSaved s;
      const Ptr out = DenseForwardOps(l, x, &s);
      if (keep != nullptr) {
        *keep = s;
      } else {
        FreeSaved(s);
      }
      return out;
    }
    if (!LayerGraphed(l)) CaptureLayer(l);
    LayerGraphs& g = layer_graphs_[l];
    const size_t bytes = Floats(1LL * rows_ * o_.dim);
    CU_CHECK(cuMemcpyDtoDAsync, g.in, x, bytes, stream_);
    CU_CHECK(cuGraphLaunch, g.forward, stream_);
    const Ptr out = mem_->Alloc(bytes, stream_);
    CU_CHECK(cuMemcpyDtoDAsync, out, g.out, bytes, stream_);
    if (keep != nullptr) *keep = DenseSaved{x};  // the graph keeps the rest
    return out;
  }

  // Copies dy into the static gradient input, replays the backward graph,
  // accumulates its static parameter gradients into the parameters' (as
  // autograd does with a graphed callable's outputs) and copies its static
  // input gradient into a new tensor.
  Ptr GraphedDenseBackward(int l, Ptr dy) {
    LayerGraphs& g = layer_graphs_[l];
    const size_t bytes = Floats(1LL * rows_ * o_.dim);
    CU_CHECK(cuMemcpyDtoDAsync, g.dy, dy, bytes, stream_);
    CU_CHECK(cuGraphLaunch, g.backward, stream_);
    const DenseParams& p = dense_[l];
    Param* const order[] = {p.wqkv, p.bqkv, p.wo, p.bo, p.w1, p.b1, p.w2, p.b2};
    for (int i = 0; i < 8; ++i) {
      if (Grad(order[i])) {
        k_.AddVectors(order[i]->grad, g.grads[i], order[i]->grad, static_cast<int>(order[i]->n));
      } else {
        CU_CHECK(cuMemcpyDtoDAsync, order[i]->grad, g.grads[i], Floats(order[i]->n), stream_);
      }
    }
    const Ptr dx = mem_->Alloc(bytes, stream_);
    CU_CHECK(cuMemcpyDtoDAsync, dx, g.dx, bytes, stream_);
    return dx;
  }

  // make_graphed_callables for dense layer l: static tensors from the
  // layer's private pool, then its forward captured, then its backward.
  void CaptureLayer(int l) {
    if (layer_graphs_.empty()) layer_graphs_.resize(o_.layers);
    LayerGraphs& g = layer_graphs_[l];
    const int pool = kLayerPool + l;
    const size_t bytes = Floats(1LL * rows_ * o_.dim);
    CachingAllocator& c = mem_->caching();
    capture_layers_->WaitIdle();
    c.BeginAllocateToPool(pool, stream_);
    g.in = mem_->Alloc(bytes, stream_);
    g.dy = mem_->Alloc(bytes, stream_);
    const DenseParams& p = dense_[l];
    for (Param* q : {p.wqkv, p.bqkv, p.wo, p.bo, p.w1, p.b1, p.w2, p.b2}) {
      g.grads.push_back(mem_->Alloc(Floats(q->n), stream_));
    }
    c.EndAllocateToPool();
    tables_ = &capture_tables_;
    g.forward = Capture(pool, [&] { g.out = DenseForwardOps(l, g.in, &g.saved); });
    // The backward frees the saved tensors back into the pool; the next
    // forward replay writes them again before the backward replay reads.
    Ptr dx = 0;
    g.backward = Capture(pool, [&] { dx = DenseBackwardOps(l, g.saved, g.dy, &g.grads); });
    g.dx = dx;
    // The saved tensors were freed in the backward's capture, but their
    // memory is the graphs'; keep them out of FreeAll.
    g.saved = DenseSaved();
    tables_ = &eager_tables_;
  }

  // --- Mixture of experts ---------------------------------------------------

  Ptr MoeForward(Ptr x, MoeSaved* keep) {
    const int d = o_.dim, rows = rows_, e = o_.experts, f = o_.ffn;
    MoeSaved s;
    s.x = x;
    s.logits = mem_->Alloc(Floats(1LL * rows * e), stream_);
    k_.MatmulForward(x, router_w_->w, router_b_->w, s.logits, rows, d, e);
    // The experts' weights, a host-built table the router reads.
    std::vector<Ptr> entries;
    for (const Param* w : expert_w1_) entries.push_back(w->w);
    for (const Param* w : expert_w2_) entries.push_back(w->w);
    const Ptr expert_table = UploadTable(entries);
    s.expert_of = mem_->Alloc(sizeof(int) * rows, stream_);
    s.gate = mem_->Alloc(Floats(rows), stream_);
    s.token_table = mem_->Alloc(sizeof(uint64_t) * 2 * rows, stream_);
    k_.RouterForward(s.logits, expert_table, s.expert_of, s.gate, s.token_table, rows, e);
    mem_->Free(expert_table);
    s.hid = mem_->Alloc(Floats(1LL * rows * f), stream_);
    s.u = mem_->Alloc(Floats(1LL * rows * d), stream_);
    const Ptr out = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.MoeForward(s.token_table, x, s.gate, s.hid, s.u, out, rows, d, f);
    if (keep != nullptr) {
      *keep = s;
    } else {
      FreeMoe(s);
    }
    return out;
  }

  void FreeMoe(const MoeSaved& s) {
    for (Ptr p : {s.logits, s.expert_of, s.gate, s.token_table, s.hid, s.u}) {
      mem_->Free(p);
    }
  }

  Ptr MoeBackward(const MoeSaved& s, Ptr dy) {
    const int d = o_.dim, rows = rows_, e = o_.experts, f = o_.ffn;
    const Ptr dhid = mem_->Alloc(Floats(1LL * rows * f), stream_);
    const Ptr dgate = mem_->Alloc(Floats(rows), stream_);
    const Ptr dmoe = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.MoeBackward(s.token_table, s.gate, s.hid, s.u, dy, dhid, dgate, dmoe, rows, d, f);
    // The experts' gradients, a host-built table (they move every step).
    int acc = 0;
    std::vector<Ptr> entries;
    for (Param* w : expert_w1_) {
      acc = Grad(w);
      entries.push_back(w->grad);
    }
    for (Param* w : expert_w2_) {
      Grad(w);
      entries.push_back(w->grad);
    }
    const Ptr grad_table = UploadTable(entries);
    k_.MoeBackwardParams(s.expert_of, s.x, s.gate, s.hid, dhid, dy, grad_table, rows, d, f, e, acc);
    mem_->Free(grad_table);
    mem_->Free(dhid);
    const Ptr dlogits = mem_->Alloc(Floats(1LL * rows * e), stream_);
    k_.RouterBackward(s.logits, dgate, dlogits, rows, e);
    mem_->Free(dgate);
    acc = Grad(router_w_);
    Grad(router_b_);
    k_.MatmulBackwardParams(s.x, dlogits, router_w_->grad, router_b_->grad, rows, d, e, acc);
    const Ptr drouter = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.MatmulBackwardInput(dlogits, router_w_->w, drouter, rows, d, e);
    mem_->Free(dlogits);
    const Ptr dx = mem_->Alloc(Floats(1LL * rows * d), stream_);
    k_.AddVectors(dmoe, drouter, dx, rows * d);
    mem_->Free(dmoe);
    mem_->Free(drouter);
    FreeMoe(s);
    return dx;
  }

  // --- AdamW ----------------------------------------------------------------

  void Optimize() {
    if (o_.optimizer == OptimizerMode::kPerParam) {
      for (const Param& p : params_) {
        k_.AdamW(p.w, p.grad, p.m, p.v, step_count_, o_.lr, kBeta1, kBeta2, kEps, kWeightDecay,
                 static_cast<int>(p.n));
      }
      return;
    }
    // ATen's multi_tensor_apply: one metadata struct, refilled in place.
    TensorListMetadata tl;
    std::memset(&tl, 0, sizeof(tl));
    int blocks = 0, tensors = 0;
    for (size_t t = 0; t < params_.size(); ++t) {
      const Param& p = params_[t];
      tl.numel_for_tensor[tensors] = p.n;
      const Ptr lists[kListDepth] = {p.w, p.grad, p.m, p.v};
      for (int d = 0; d < kListDepth; ++d) {
        tl.addresses[d][tensors] = reinterpret_cast<void*>(static_cast<uintptr_t>(lists[d]));
      }
      ++tensors;
      const long long chunks = (p.n + kChunkSize - 1) / kChunkSize;
      for (long long chunk = 0; chunk < chunks; ++chunk) {
        tl.block_to_tensor[blocks] = static_cast<unsigned char>(tensors - 1);
        tl.block_to_chunk[blocks] = static_cast<int>(chunk);
        ++blocks;
        const bool last_chunk = chunk == chunks - 1;
        const bool tensors_full = tensors == kListMaxTensors && last_chunk;
        const bool blocks_full = blocks == kListMaxBlocks;
        const bool last = t + 1 == params_.size() && last_chunk;
        if (!(tensors_full || blocks_full || last)) continue;
        k_.AdamWFused(tl, blocks, kChunkSize, step_count_, o_.lr, kBeta1, kBeta2, kEps,
                      kWeightDecay);
        blocks = 0;
        if (last_chunk) {
          tensors = 0;
          tl.start_tensor_this_launch = static_cast<int>(t + 1);
        } else {
          // The tensor goes on in the next launch, from slot 0.
          tl.numel_for_tensor[0] = tl.numel_for_tensor[tensors - 1];
          for (int d = 0; d < kListDepth; ++d) {
            tl.addresses[d][0] = tl.addresses[d][tensors - 1];
          }
          tensors = 1;
          tl.start_tensor_this_launch = static_cast<int>(t);
        }
      }
    }
  }

  const Options& o_;
  const Kernels& k_;
  CUstream stream_;
  TensorMemory* mem_;
  const int rows_, head_dim_, count_;
  std::deque<Param> params_;  // in creation order; pointers into it stay
  Param* embedding_ = nullptr;
  std::vector<DenseParams> dense_;
  Param *router_w_ = nullptr, *router_b_ = nullptr;
  std::vector<Param*> expert_w1_, expert_w2_;
  Param *head_w_ = nullptr, *head_b_ = nullptr;
  Ptr step_count_ = 0, loss_ = 0, eval_loss_ = 0, eval_tokens_ = 0;
  std::vector<DenseSaved> saved_dense_;
  MoeSaved saved_moe_;
  PinnedArena eager_tables_, capture_tables_;
  PinnedArena* tables_ = &eager_tables_;
  CUgraphExec step_graph_ = nullptr;
  std::vector<Ptr> static_inputs_;
  std::vector<LayerGraphs> layer_graphs_;
  DataLoader* capture_layers_ = nullptr;  // set while a step may capture
};

}  // namespace
}  // namespace torchlike

int main(int argc, char** argv) {
  using torchlike::Options;
  examples::InitProgram("torchlike_train", torchlike::kUsage);
  const Options options = torchlike::ParseFlags(argc, argv);
  const std::string module_path =
      options.module.empty() ? examples::BesideBinary("torchlike_kernels_host.so") : options.module;

  CUdevice device = 0;
  CUcontext context = examples::UsePrimaryContext(&device);
  CUmodule module = examples::LoadModule(module_path);
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate, &stream, CU_STREAM_NON_BLOCKING);
  const torchlike::Kernels kernels(module, stream);
  bool ok = true;
  {
    torchlike::TensorMemory memory(options.alloc);
    torchlike::Trainer trainer(options, kernels, &memory);
    trainer.Init();
    torchlike::DataLoader loader(context, &memory, options, options.steps * options.micro);
    const auto start = std::chrono::steady_clock::now();
    for (int step = 0; step < options.steps; ++step) {
      const auto step_start = std::chrono::steady_clock::now();
      const float loss = trainer.Step(step, &loader);
      std::printf("step %d loss %.6f\n", step, loss);
      if ((step + 1) % options.eval_every == 0) {
        std::printf("eval %d loss %.6f\n", step, trainer.Evaluate());
      }
      if (options.step_times) {
        std::printf(
            "step_time %d %.6f\n", step,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
      }
      std::fflush(stdout);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("train_seconds %.3f\n", seconds);
    const std::vector<float> parameters = trainer.Parameters();
    trainer.FreeAll();
    if (memory.live_tensors() != 0) {
      std::fprintf(stderr, "torchlike_train: %zu tensors still live\n", memory.live_tensors());
      ok = false;
    }
    if (options.alloc == torchlike::AllocMode::kCaching &&
        (memory.caching().allocated_bytes() != 0 || memory.caching().reserved_bytes() != 0)) {
      std::fprintf(stderr,
                   "torchlike_train: caching allocator holds %zu bytes in "
                   "%zu reserved at the end\n",
                   memory.caching().allocated_bytes(), memory.caching().reserved_bytes());
      ok = false;
    }
    std::printf("working_set %zu\n", memory.working_set());
    if (options.alloc == torchlike::AllocMode::kCaching) {
      std::fprintf(stderr, "torchlike_train: segments allocated %d freed %d\n",
                   memory.caching().segment_allocs(), memory.caching().segment_frees());
    }
    examples::Fnv1a64 checksum;
    checksum.Update(parameters.data(), parameters.size() * sizeof(float));
    std::printf("checksum %016llx\n", static_cast<unsigned long long>(checksum.hash()));
  }
  CU_CHECK(cuStreamDestroy, stream);
  CU_CHECK(cuModuleUnload, module);
  CU_CHECK(cuDevicePrimaryCtxRelease, device);
  if (ok) std::printf("ok\n");
  std::fflush(stdout);
  return ok ? 0 : 1;
}
