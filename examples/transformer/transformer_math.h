// Element-level arithmetic of the transformer example, shared by the CUDA
// kernels (transformer_kernels.cu) and their host twins for the fake driver
// (transformer_kernels_host.cc), so both compute the same bits: the
// exact-rounding primitives of examples/common/exact_math.h (whose rules
// hold here too: the BUILD file passes -ffp-contract=off, and every
// reduction runs in a fixed ascending order), and the example's data and
// update on top of them.
//
// All functions are pure; thread-safe.
#ifndef STENSOR_EXAMPLES_TRANSFORMER_TRANSFORMER_MATH_H_
#define STENSOR_EXAMPLES_TRANSFORMER_TRANSFORMER_MATH_H_

// Relative: nvcc compiles the .cu files that include this without the
// workspace's include path.
#include "../common/exact_math.h"

#define TFM_HOST_DEVICE EXACT_HOST_DEVICE

namespace tfm {

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
using exact::Sqrt;
using exact::Sub;

// Token `t` of training sequence `sequence`: each sequence counts up from a
// random start by a random stride in [1, 3] modulo an alphabet of the first
// min(vocab, 64) tokens, so the next token follows from the context and a
// few steps already teach the model which tokens occur.
TFM_HOST_DEVICE inline int SequenceToken(unsigned seed, unsigned sequence, int t, int vocab) {
  const unsigned alphabet = vocab < 64 ? static_cast<unsigned>(vocab) : 64u;
  const unsigned start = Hash(Key(seed ^ 0x70c3u, sequence));
  const unsigned stride = 1u + Hash(start ^ 0x5d1du) % 3u;
  return static_cast<int>((start + stride * static_cast<unsigned>(t)) % alphabet);
}

// A fixed position code added to the embedding, exact in float: a small
// multiple of 1/64 from a hash of (position, feature).
TFM_HOST_DEVICE inline float PositionCode(int t, int d) {
  const unsigned h = Hash(static_cast<unsigned>(t) * 0x10001u ^ static_cast<unsigned>(d) * 0x9e37u);
  return Mul(static_cast<float>(static_cast<int>(h % 17u) - 8), 1.0f / 64.0f);
}

// One Adam step on one parameter; bias corrections c1 = 1 - beta1^t and
// c2 = 1 - beta2^t come from the host, computed once per step.
TFM_HOST_DEVICE inline void AdamStep(float* w, float* m, float* v, float g, float lr, float beta1,
                                     float beta2, float c1, float c2) {
  const float m_new = Add(Mul(beta1, *m), Mul(Sub(1.0f, beta1), g));
  const float v_new = Add(Mul(beta2, *v), Mul(Sub(1.0f, beta2), Mul(g, g)));
  *m = m_new;
  *v = v_new;
  const float m_hat = Div(m_new, c1);
  const float v_hat = Div(v_new, c2);
  *w = Sub(*w, Div(Mul(lr, m_hat), Add(Sqrt(v_hat), 1e-8f)));
}

}  // namespace tfm

#endif  // STENSOR_EXAMPLES_TRANSFORMER_TRANSFORMER_MATH_H_
