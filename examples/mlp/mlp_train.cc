// mlp_train: trains a multi-layer perceptron with SGD and momentum on a
// synthetic dataset held in device memory, written against the CUDA driver
// API alone. It runs unchanged on the fake device (the default module,
// mlp_kernels_host.so beside the binary) and on a GPU (--module with the
// cubin built from mlp_kernels.cu), which makes it stensor's driver-API test
// load: many device buffers of swappable size, kernels whose mangled names
// tell read-only from written parameters, and a deterministic result.
//
// With --threads N above 1, N host threads each train a model of their own
// (own buffers, own dataset, seed + thread index) on a non-blocking stream of
// their own in the primary context: concurrent driver calls from several
// threads and streams, with a result that is still deterministic.
//
// Output, on stdout:
//   working_set <bytes>        sum of all cuMemAlloc sizes, all threads
//   step <n> loss <x>          one line per step, n from 0 (thread 0's model)
//   thread <t> checksum <hex>  with --threads above 1: one line per thread, in
//                              order, over that thread's final parameters
//   checksum <16 hex digits>   FNV-1a 64 over the final weights and biases,
//                              of all threads' models in thread order
// Exit status: 0 on success, 1 on a failed driver call, 2 on bad flags.
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "examples/common/example_program.h"

namespace {

struct Options {
  std::string module;  // empty: mlp_kernels_host.so beside the binary
  int steps = 40;
  int batch = 32;
  int input = 1024;
  int hidden = 1024;
  int layers = 2;  // hidden layers; the output layer comes on top
  int classes = 16;
  int shards = 12;
  int shard_samples = 1024;
  float lr = 0.002f;
  float momentum = 0.9f;
  float noise = 2.0f;
  long long seed = 1;
  int threads = 1;
  int device = 0;  // ordinal, among the devices the process sees
  // cuMemAllocManaged instead of cuMemAlloc: the unified-memory baseline
  // stensor is compared with on a GPU (scripts/gpu_check.sh).
  bool managed = false;
};

constexpr char kUsage[] =
    "usage: mlp_train [--flag=value | --flag value]...\n"
    "  --module PATH        kernel module: a cubin on a GPU, a host-kernel\n"
    "                       .so on the fake driver\n"
    "                       (default: mlp_kernels_host.so beside the binary)\n"
    "  --steps N            training steps (default 40)\n"
    "  --batch N            samples per step (default 32)\n"
    "  --input N            features per sample (default 1024)\n"
    "  --hidden N           width of each hidden layer (default 1024)\n"
    "  --layers N           hidden layers, at least 1 (default 2)\n"
    "  --classes N          classes, at least 2 (default 16)\n"
    "  --shards N           dataset shards, one device buffer each "
    "(default 12)\n"
    "  --shard-samples N    samples per shard, at least --batch "
    "(default 1024)\n"
    "  --lr X               learning rate (default 0.002)\n"
    "  --momentum X         momentum in [0, 1) (default 0.9)\n"
    "  --noise X            standard deviation around the class means "
    "(default 2)\n"
    "  --seed N             seed of data and initial weights, 0..4294967295 "
    "(default 1)\n"
    "  --threads N          host threads, 1..64, each training a model of its\n"
    "                       own on a stream of its own; thread T seeds with\n"
    "                       seed + T (mod 2^32); step lines are thread 0's\n"
    "                       (default 1)\n"
    "  --device N           device ordinal, among the devices the process\n"
    "                       sees (CUDA_VISIBLE_DEVICES) (default 0)\n"
    "  --memory KIND        device (cuMemAlloc) or managed (cuMemAllocManaged,\n"
    "                       unified memory; a GPU driver only) (default device)\n";

Options ParseFlags(int argc, char** argv) {
  Options options;
  examples::ForEachFlag(argc, argv, {}, [&](const std::string& name, const std::string* flag) {
    const std::string& value = *flag;  // no switches: every flag has a value
    // Widths are capped so that every buffer's element count, a kernel's
    // `int n`, stays far from overflow; the products are checked later.
    constexpr int kMaxWidth = 1 << 20;
    if (name == "module") {
      if (value.empty()) examples::UsageError("--module needs a path");
      options.module = value;
    } else if (name == "steps") {
      options.steps = examples::ParseInt(name, value, 1, 1000000);
    } else if (name == "batch") {
      options.batch = examples::ParseInt(name, value, 1, kMaxWidth);
    } else if (name == "input") {
      options.input = examples::ParseInt(name, value, 1, kMaxWidth);
    } else if (name == "hidden") {
      options.hidden = examples::ParseInt(name, value, 1, kMaxWidth);
    } else if (name == "layers") {
      options.layers = examples::ParseInt(name, value, 1, 1000);
    } else if (name == "classes") {
      options.classes = examples::ParseInt(name, value, 2, kMaxWidth);
    } else if (name == "shards") {
      options.shards = examples::ParseInt(name, value, 1, 100000);
    } else if (name == "shard-samples") {
      options.shard_samples = examples::ParseInt(name, value, 1, INT_MAX);
    } else if (name == "lr") {
      options.lr = examples::ParseFloat(name, value, 0.0f, 10.0f, false);
    } else if (name == "momentum") {
      options.momentum = examples::ParseFloat(name, value, 0.0f, 1.0f, true);
    } else if (name == "noise") {
      options.noise = examples::ParseFloat(name, value, 0.0f, 1000.0f, false);
    } else if (name == "seed") {
      options.seed = examples::ParseInteger(name, value, 0, UINT_MAX);
    } else if (name == "threads") {
      options.threads = examples::ParseInt(name, value, 1, 64);
    } else if (name == "device") {
      options.device = examples::ParseInt(name, value, 0, 1023);
    } else if (name == "memory") {
      if (value != "device" && value != "managed") {
        examples::UsageError("--memory=%s: expected device or managed", value.c_str());
      }
      options.managed = value == "managed";
    } else {
      examples::UsageError("unknown flag --%s", name.c_str());
    }
  });
  if (options.shard_samples < options.batch) {
    examples::UsageError("--shard-samples=%d is smaller than --batch=%d", options.shard_samples,
                         options.batch);
  }
  // Kernels take element counts and sample indices as int.
  const long long width = std::max({options.input, options.hidden, options.classes});
  const long long counts[] = {
      static_cast<long long>(options.input) * options.hidden,
      static_cast<long long>(options.hidden) * options.hidden,
      static_cast<long long>(options.hidden) * options.classes,
      static_cast<long long>(options.batch) * width,
      static_cast<long long>(options.shard_samples) * options.input,
      static_cast<long long>(options.shard_samples) * options.shards,
  };
  examples::CheckElementCounts(counts);
  return options;
}

// Typed launchers, one per kernel of mlp_kernels.cu, each mirroring the
// kernel's C++ signature (CUdeviceptr standing for a pointer) so no call
// can pass a parameter of the wrong size. Functions are looked up by their
// mangled names, which encode those signatures. Launches go to the legacy
// default stream, or to the stream of a copy made by OnStream; copies are
// independent, so each training thread holds its own.
class Kernels {
 public:
  explicit Kernels(CUmodule module) {
    const auto Get = [module](const char* name) { return examples::GetKernel(module, name); };
    init_params_ = Get("_ZN3mlp11init_paramsEPfijf");
    synth_shard_ = Get("_ZN3mlp11synth_shardEPfPiiiiijf");
    gather_batch_ = Get("_ZN3mlp12gather_batchEPKfPKiPfPiiii");
    linear_forward_ = Get("_ZN3mlp14linear_forwardEPKfS1_S1_Pfiii");
    relu_forward_ = Get("_ZN3mlp12relu_forwardEPKfPfi");
    softmax_xent_ = Get("_ZN3mlp12softmax_xentEPKfPKiPfS4_ii");
    mean_loss_ = Get("_ZN3mlp9mean_lossEPKfPfi");
    linear_backward_input_ = Get("_ZN3mlp21linear_backward_inputEPKfS1_Pfiii");
    linear_backward_params_ = Get("_ZN3mlp22linear_backward_paramsEPKfS1_PfS2_iii");
    relu_backward_ = Get("_ZN3mlp13relu_backwardEPKfPfi");
    sgd_momentum_ = Get("_ZN3mlp12sgd_momentumEPfS0_PKfffi");
  }

  // The same kernels, launched on `stream` (nullptr: the legacy stream).
  Kernels OnStream(CUstream stream) const {
    Kernels copy = *this;
    copy.stream_ = stream;
    return copy;
  }
  CUstream stream() const { return stream_; }

  void InitParams(CUdeviceptr w, int n, unsigned seed, float scale) const {
    void* args[] = {&w, &n, &seed, &scale};
    Launch(init_params_, "init_params", n, args);
  }
  void SynthShard(CUdeviceptr data, CUdeviceptr labels, int first_sample, int count, int features,
                  int classes, unsigned seed, float noise) const {
    void* args[] = {&data, &labels, &first_sample, &count, &features, &classes, &seed, &noise};
    Launch(synth_shard_, "synth_shard", static_cast<long long>(count) * features, args);
  }
  void GatherBatch(CUdeviceptr data, CUdeviceptr labels, CUdeviceptr x, CUdeviceptr y, int first,
                   int batch, int features) const {
    void* args[] = {&data, &labels, &x, &y, &first, &batch, &features};
    Launch(gather_batch_, "gather_batch", static_cast<long long>(batch) * features, args);
  }
  void LinearForward(CUdeviceptr x, CUdeviceptr w, CUdeviceptr b, CUdeviceptr y, int batch, int in,
                     int out) const {
    void* args[] = {&x, &w, &b, &y, &batch, &in, &out};
    Launch(linear_forward_, "linear_forward", static_cast<long long>(batch) * out, args);
  }
  void ReluForward(CUdeviceptr pre, CUdeviceptr post, int n) const {
    void* args[] = {&pre, &post, &n};
    Launch(relu_forward_, "relu_forward", n, args);
  }
  void SoftmaxXent(CUdeviceptr logits, CUdeviceptr labels, CUdeviceptr dlogits,
                   CUdeviceptr sample_loss, int batch, int classes) const {
    void* args[] = {&logits, &labels, &dlogits, &sample_loss, &batch, &classes};
    Launch(softmax_xent_, "softmax_xent", batch, args);
  }
  void MeanLoss(CUdeviceptr sample_loss, CUdeviceptr loss, int batch) const {
    void* args[] = {&sample_loss, &loss, &batch};
    Launch(mean_loss_, "mean_loss", 1, args);
  }
  void LinearBackwardInput(CUdeviceptr dy, CUdeviceptr w, CUdeviceptr dx, int batch, int in,
                           int out) const {
    void* args[] = {&dy, &w, &dx, &batch, &in, &out};
    Launch(linear_backward_input_, "linear_backward_input", static_cast<long long>(batch) * in,
           args);
  }
  void LinearBackwardParams(CUdeviceptr x, CUdeviceptr dy, CUdeviceptr dw, CUdeviceptr db,
                            int batch, int in, int out) const {
    void* args[] = {&x, &dy, &dw, &db, &batch, &in, &out};
    Launch(linear_backward_params_, "linear_backward_params",
           static_cast<long long>(in) * out + out, args);
  }
  void ReluBackward(CUdeviceptr pre, CUdeviceptr grad, int n) const {
    void* args[] = {&pre, &grad, &n};
    Launch(relu_backward_, "relu_backward", n, args);
  }
  void SgdMomentum(CUdeviceptr w, CUdeviceptr v, CUdeviceptr g, float lr, float momentum,
                   int n) const {
    void* args[] = {&w, &v, &g, &lr, &momentum, &n};
    Launch(sgd_momentum_, "sgd_momentum", n, args);
  }

 private:
  // One thread per element on stream_.
  void Launch(CUfunction function, const char* name, long long threads, void** args) const {
    examples::LaunchPerElement(function, "mlp", name, threads, stream_, args);
  }

  CUfunction init_params_, synth_shard_, gather_batch_, linear_forward_, relu_forward_,
      softmax_xent_, mean_loss_, linear_backward_input_, linear_backward_params_, relu_backward_,
      sgd_momentum_;
  CUstream stream_ = nullptr;
};

// Every device allocation of the program, so the working set is their sum
// and all can be freed at the end.
class DeviceMemory {
 public:
  void set_managed(bool managed) { managed_ = managed; }
  CUdeviceptr Alloc(size_t bytes) {
    CUdeviceptr ptr = 0;
    if (managed_) {
      // Looked up when asked for: the fake driver has no unified memory, and
      // a direct reference would not link against it.
      using AllocManaged = CUresult (*)(CUdeviceptr*, size_t, unsigned int);
      static const auto alloc_managed =
          reinterpret_cast<AllocManaged>(dlsym(RTLD_DEFAULT, "cuMemAllocManaged"));
      if (alloc_managed == nullptr) {
        std::fprintf(stderr, "mlp_train: --memory managed: this driver has no cuMemAllocManaged\n");
        std::exit(1);
      }
      CU_CHECK(alloc_managed, &ptr, bytes, CU_MEM_ATTACH_GLOBAL);
    } else {
      CU_CHECK(cuMemAlloc, &ptr, bytes);
    }
    buffers_.push_back(ptr);
    total_bytes_ += bytes;
    return ptr;
  }
  CUdeviceptr AllocFloats(long long count) {
    return Alloc(static_cast<size_t>(count) * sizeof(float));
  }
  CUdeviceptr AllocInts(long long count) { return Alloc(static_cast<size_t>(count) * sizeof(int)); }
  void FreeAll() {
    for (CUdeviceptr ptr : buffers_) CU_CHECK(cuMemFree, ptr);
    buffers_.clear();
  }
  size_t total_bytes() const { return total_bytes_; }

 private:
  std::vector<CUdeviceptr> buffers_;
  size_t total_bytes_ = 0;
  bool managed_ = false;
};

// A fully connected layer: parameters, their gradients and momentum each in
// a buffer of its own, and the activations of one batch.
struct Layer {
  int in = 0;
  int out = 0;
  bool relu = false;           // hidden layers; the output layer yields logits
  CUdeviceptr w = 0, b = 0;    // [in, out], [out]
  CUdeviceptr dw = 0, db = 0;  // gradients
  CUdeviceptr vw = 0, vb = 0;  // momentum
  CUdeviceptr pre = 0;         // [batch, out] x w + b
  CUdeviceptr post = 0;        // [batch, out] relu(pre); hidden layers only
  // [batch, out] gradient of the loss. Output layer: with respect to the
  // logits (pre). Hidden layers: with respect to post, then, in place after
  // relu_backward, with respect to pre.
  CUdeviceptr grad = 0;
};

struct Shard {
  CUdeviceptr data = 0;    // [shard_samples, input]
  CUdeviceptr labels = 0;  // [shard_samples]
};

// One model's device buffers: its layers, its dataset and its batch.
struct Model {
  DeviceMemory memory;
  std::vector<Layer> layers;
  std::vector<Shard> shards;
  CUdeviceptr x = 0;            // [batch, input] the batch's samples
  CUdeviceptr y = 0;            // [batch] their labels
  CUdeviceptr sample_loss = 0;  // [batch]
  CUdeviceptr loss = 0;         // [1] mean over the batch
};

void AllocateModel(const Options& options, Model* model) {
  const int batch = options.batch;
  DeviceMemory& memory = model->memory;
  memory.set_managed(options.managed);
  model->layers.resize(options.layers + 1);
  for (int l = 0; l <= options.layers; ++l) {
    Layer& layer = model->layers[l];
    layer.in = l == 0 ? options.input : options.hidden;
    layer.out = l == options.layers ? options.classes : options.hidden;
    layer.relu = l < options.layers;
    const long long weights = static_cast<long long>(layer.in) * layer.out;
    const long long activations = static_cast<long long>(batch) * layer.out;
    layer.w = memory.AllocFloats(weights);
    layer.b = memory.AllocFloats(layer.out);
    layer.dw = memory.AllocFloats(weights);
    layer.db = memory.AllocFloats(layer.out);
    layer.vw = memory.AllocFloats(weights);
    layer.vb = memory.AllocFloats(layer.out);
    layer.pre = memory.AllocFloats(activations);
    if (layer.relu) layer.post = memory.AllocFloats(activations);
    layer.grad = memory.AllocFloats(activations);
  }
  model->shards.resize(options.shards);
  for (Shard& shard : model->shards) {
    shard.data = memory.AllocFloats(static_cast<long long>(options.shard_samples) * options.input);
    shard.labels = memory.AllocInts(options.shard_samples);
  }
  model->x = memory.AllocFloats(static_cast<long long>(batch) * options.input);
  model->y = memory.AllocInts(batch);
  model->sample_loss = memory.AllocFloats(batch);
  model->loss = memory.AllocFloats(1);
}

// Zero-fills `count` 32-bit words in stream order: the synchronous memset on
// the legacy stream (nullptr), the asynchronous one on any other stream.
void ZeroWords(CUstream stream, CUdeviceptr ptr, size_t count) {
  if (stream == nullptr) {
    CU_CHECK(cuMemsetD32, ptr, 0, count);
  } else {
    CU_CHECK(cuMemsetD32Async, ptr, 0, count, stream);
  }
}

// Copies `bytes` to the host after the work queued before it on `stream`:
// the synchronous copy on the legacy stream (nullptr); on any other stream,
// the asynchronous copy and a wait for that stream.
void CopyToHost(CUstream stream, void* dst, CUdeviceptr src, size_t bytes) {
  if (stream == nullptr) {
    CU_CHECK(cuMemcpyDtoH, dst, src, bytes);
    return;
  }
  CU_CHECK(cuMemcpyDtoHAsync, dst, src, bytes, stream);
  CU_CHECK(cuStreamSynchronize, stream);
}

// Synthesises the model's dataset from `seed`, initialises its parameters
// and trains it for options.steps steps, all on kernels.stream(); prints the
// step lines if print_steps. Returns the final weights and biases, layer by
// layer, each layer's weights before its biases.
std::vector<float> Train(const Options& options, const Kernels& kernels, unsigned seed,
                         bool print_steps, Model* model) {
  const int batch = options.batch;
  const CUstream stream = kernels.stream();
  std::vector<Layer>& layers = model->layers;
  const std::vector<Shard>& shards = model->shards;
  const CUdeviceptr x = model->x;
  const CUdeviceptr y = model->y;

  for (int s = 0; s < options.shards; ++s) {
    kernels.SynthShard(shards[s].data, shards[s].labels, s * options.shard_samples,
                       options.shard_samples, options.input, options.classes, seed, options.noise);
  }
  for (int l = 0; l <= options.layers; ++l) {
    Layer& layer = layers[l];
    // He initialisation before a ReLU keeps activations at unit scale; the
    // output layer starts near zero so the first loss is close to
    // log(classes) instead of the loss of confident random guesses.
    const float gain = layer.relu ? 2.0f : 0.01f;
    const float scale = std::sqrt(gain / static_cast<float>(layer.in));
    kernels.InitParams(layer.w, layer.in * layer.out,
                       seed ^ (0x51ed0000u + static_cast<unsigned>(l)), scale);
    ZeroWords(stream, layer.b, layer.out);
    ZeroWords(stream, layer.vw, static_cast<size_t>(layer.in) * layer.out);
    ZeroWords(stream, layer.vb, layer.out);
  }

  // Steps visit the shards round robin, so every shard buffer is touched
  // again only after all the others: a long reuse distance to swap across.
  const int batches_per_shard = options.shard_samples / batch;
  for (int step = 0; step < options.steps; ++step) {
    const Shard& shard = shards[step % options.shards];
    const int first = (step / options.shards) % batches_per_shard * batch;
    kernels.GatherBatch(shard.data, shard.labels, x, y, first, batch, options.input);

    CUdeviceptr input = x;
    for (Layer& layer : layers) {
      kernels.LinearForward(input, layer.w, layer.b, layer.pre, batch, layer.in, layer.out);
      if (layer.relu) {
        kernels.ReluForward(layer.pre, layer.post, batch * layer.out);
        input = layer.post;
      }
    }
    const Layer& top = layers.back();
    kernels.SoftmaxXent(top.pre, y, top.grad, model->sample_loss, batch, options.classes);
    kernels.MeanLoss(model->sample_loss, model->loss, batch);

    for (int l = options.layers; l >= 0; --l) {
      Layer& layer = layers[l];
      const CUdeviceptr layer_input = l == 0 ? x : layers[l - 1].post;
      kernels.LinearBackwardParams(layer_input, layer.grad, layer.dw, layer.db, batch, layer.in,
                                   layer.out);
      if (l > 0) {
        Layer& below = layers[l - 1];
        kernels.LinearBackwardInput(layer.grad, layer.w, below.grad, batch, layer.in, layer.out);
        kernels.ReluBackward(below.pre, below.grad, batch * below.out);
      }
    }
    for (Layer& layer : layers) {
      kernels.SgdMomentum(layer.w, layer.vw, layer.dw, options.lr, options.momentum,
                          layer.in * layer.out);
      kernels.SgdMomentum(layer.b, layer.vb, layer.db, options.lr, options.momentum, layer.out);
    }

    // Waits for the step to finish.
    float step_loss = 0.0f;
    CopyToHost(stream, &step_loss, model->loss, sizeof(step_loss));
    if (print_steps) {
      std::printf("step %d loss %.6f\n", step, step_loss);
      std::fflush(stdout);
    }
  }

  size_t count = 0;
  for (const Layer& layer : layers) {
    count += static_cast<size_t>(layer.in) * layer.out + layer.out;
  }
  std::vector<float> parameters(count);
  float* next = parameters.data();
  for (const Layer& layer : layers) {
    const size_t weights = static_cast<size_t>(layer.in) * layer.out;
    CopyToHost(stream, next, layer.w, weights * sizeof(float));
    next += weights;
    CopyToHost(stream, next, layer.b, layer.out * sizeof(float));
    next += layer.out;
  }
  return parameters;
}

// What a training thread hands back.
struct ThreadResult {
  std::vector<float> parameters;  // as Train returns them
  uint64_t checksum = 0;          // FNV-1a 64 over parameters
};

// Trains `model` as Train does, from a thread of its own: makes `context`
// current, creates a non-blocking stream for the model's work and destroys
// it at the end.
ThreadResult TrainOnThread(const Options& options, const Kernels& kernels, CUcontext context,
                           unsigned seed, bool print_steps, Model* model) {
  CU_CHECK(cuCtxSetCurrent, context);
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate, &stream, CU_STREAM_NON_BLOCKING);
  ThreadResult result;
  result.parameters = Train(options, kernels.OnStream(stream), seed, print_steps, model);
  CU_CHECK(cuStreamDestroy, stream);
  examples::Fnv1a64 checksum;
  checksum.Update(result.parameters.data(), result.parameters.size() * sizeof(float));
  result.checksum = checksum.hash();
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  examples::InitProgram("mlp_train", kUsage);
  const Options options = ParseFlags(argc, argv);
  const std::string module_path =
      options.module.empty() ? examples::BesideBinary("mlp_kernels_host.so") : options.module;
  const unsigned seed = static_cast<unsigned>(options.seed);

  CUdevice device = 0;
  const CUcontext context = examples::UsePrimaryContext(&device, options.device);
  CUmodule module = examples::LoadModule(module_path);
  const Kernels kernels(module);

  // Every model is allocated here, in thread order, before any trains, so
  // the first line gives the whole working set.
  std::vector<Model> models(options.threads);
  size_t working_set = 0;
  for (Model& model : models) {
    AllocateModel(options, &model);
    working_set += model.memory.total_bytes();
  }
  std::printf("working_set %zu\n", working_set);
  std::fflush(stdout);

  std::vector<ThreadResult> results(options.threads);
  if (options.threads == 1) {
    // On this thread and the legacy default stream, with synchronous
    // memsets and read-backs: the driver calls of the program before
    // --threads existed.
    results[0].parameters = Train(options, kernels, seed, /*print_steps=*/true, &models[0]);
  } else {
    // Thread t touches only models[t] and results[t]; the module and its
    // functions are shared read-only.
    std::vector<std::thread> threads;
    for (int t = 0; t < options.threads; ++t) {
      threads.emplace_back([&options, &kernels, &models, &results, context, seed, t] {
        // Unsigned: seed + t wraps around modulo 2^32.
        results[t] = TrainOnThread(options, kernels, context, seed + static_cast<unsigned>(t),
                                   /*print_steps=*/t == 0, &models[t]);
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (int t = 0; t < options.threads; ++t) {
      std::printf("thread %d checksum %016llx\n", t,
                  static_cast<unsigned long long>(results[t].checksum));
    }
  }

  examples::Fnv1a64 checksum;
  for (const ThreadResult& result : results) {
    checksum.Update(result.parameters.data(), result.parameters.size() * sizeof(float));
  }
  std::printf("checksum %016llx\n", static_cast<unsigned long long>(checksum.hash()));
  std::fflush(stdout);

  for (Model& model : models) model.memory.FreeAll();
  CU_CHECK(cuModuleUnload, module);
  CU_CHECK(cuDevicePrimaryCtxRelease, device);
  return 0;
}
