// Element-level arithmetic of the MLP example, shared by the CUDA kernels
// (mlp_kernels.cu) and their host twins for the fake driver
// (mlp_kernels_host.cc), so both compute the same values: the exact-rounding
// primitives of examples/common/exact_math.h (whose rules hold here too:
// the BUILD file passes -ffp-contract=off), and the example's dataset, loss
// and update on top of them.
//
// All functions are pure; thread-safe.
#ifndef STENSOR_EXAMPLES_MLP_MLP_MATH_H_
#define STENSOR_EXAMPLES_MLP_MLP_MATH_H_

// Relative: nvcc compiles the .cu files that include this without the
// workspace's include path.
#include "../common/exact_math.h"

#define MLP_HOST_DEVICE EXACT_HOST_DEVICE

namespace mlp {

using exact::Add;
using exact::BitsFromFloat;
using exact::Div;
using exact::Exp;
using exact::FloatFromBits;
using exact::Gaussian;
using exact::Hash;
using exact::Key;
using exact::Log;
using exact::Mul;
using exact::MulAdd;
using exact::Sub;

// Seeds of the independent random streams of the example.
constexpr unsigned kLabelStream = 0x1abe1u;
constexpr unsigned kMeanStream = 0x3ea1u;
constexpr unsigned kNoiseStream = 0x4015eu;

// Class of dataset sample `sample`.
MLP_HOST_DEVICE inline int SampleLabel(unsigned seed, unsigned sample, int classes) {
  return static_cast<int>(Hash(Key(seed ^ kLabelStream, sample)) % static_cast<unsigned>(classes));
}

// Feature `feature` of dataset sample `sample`: its class mean (a standard
// normal per class and feature) plus `noise` times standard normal noise.
MLP_HOST_DEVICE inline float SampleFeature(unsigned seed, unsigned sample, int feature,
                                           int features, int classes, float noise) {
  const unsigned label = static_cast<unsigned>(SampleLabel(seed, sample, classes));
  const unsigned width = static_cast<unsigned>(features);
  const unsigned column = static_cast<unsigned>(feature);
  const float mean = Gaussian(Key(seed ^ kMeanStream, label * width + column));
  const float jitter = Gaussian(Key(seed ^ kNoiseStream, sample * width + column));
  return MulAdd(mean, noise, jitter);
}

// Softmax cross-entropy of one sample. Writes the sample's share of the
// gradient of the batch-mean loss into dlogits[0, classes) and returns the
// sample's loss. Sums run over classes in ascending order.
MLP_HOST_DEVICE inline float SoftmaxXentRow(const float* logits, int label, float* dlogits,
                                            int classes, int batch) {
  float max_logit = logits[0];
  for (int c = 1; c < classes; ++c) {
    max_logit = logits[c] > max_logit ? logits[c] : max_logit;
  }
  float sum = 0.0f;
  for (int c = 0; c < classes; ++c) {
    sum = Add(sum, Exp(Sub(logits[c], max_logit)));
  }
  const float batch_f = static_cast<float>(batch);
  for (int c = 0; c < classes; ++c) {
    const float p = Div(Exp(Sub(logits[c], max_logit)), sum);
    dlogits[c] = Div(c == label ? Sub(p, 1.0f) : p, batch_f);
  }
  return Sub(Log(sum), Sub(logits[label], max_logit));
}

// One step of SGD with (heavy-ball) momentum on one parameter.
MLP_HOST_DEVICE inline void SgdMomentumStep(float* w, float* v, float g, float lr, float momentum) {
  const float velocity = MulAdd(g, momentum, *v);
  *v = velocity;
  *w = Sub(*w, Mul(lr, velocity));
}

}  // namespace mlp

#endif  // STENSOR_EXAMPLES_MLP_MLP_MATH_H_
