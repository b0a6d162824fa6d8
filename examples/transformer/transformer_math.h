// Element-level arithmetic of the transformer example, shared by the CUDA
// kernels (transformer_kernels.cu) and their host twins for the fake driver
// (transformer_kernels_host.cc), so both compute the same bits.
//
// The same rules as examples/mlp/mlp_math.h, whose primitives are repeated
// here (that header is private to its package): Mul/Add/Sub/Div/Sqrt are
// single IEEE round-to-nearest operations that no compiler may fuse (nvcc
// contracts `a * b + c` by default; the __f*_rn intrinsics opt out; the host
// side is built with -ffp-contract=off), Exp is built from those operations
// instead of libm or CUDA's math library, whose last bits differ, and every
// reduction runs in a fixed ascending order.
//
// All functions are pure; thread-safe.
#ifndef STENSOR_EXAMPLES_TRANSFORMER_TRANSFORMER_MATH_H_
#define STENSOR_EXAMPLES_TRANSFORMER_TRANSFORMER_MATH_H_

#if defined(__CUDACC__)
#define TFM_HOST_DEVICE __host__ __device__
#else
#define TFM_HOST_DEVICE
#include <cmath>
#include <cstring>
#endif

namespace tfm {

TFM_HOST_DEVICE inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

TFM_HOST_DEVICE inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TFM_HOST_DEVICE inline float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

TFM_HOST_DEVICE inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// acc + a * b with two roundings, the step of every dot product here.
TFM_HOST_DEVICE inline float MulAdd(float acc, float a, float b) {
  return Add(acc, Mul(a, b));
}

TFM_HOST_DEVICE inline float FloatFromBits(unsigned bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

TFM_HOST_DEVICE inline unsigned BitsFromFloat(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  unsigned bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
#endif
}

// 32-bit integer hash ("lowbias32", C. Wellons): a counter-based RNG needs
// no state, so each element is computed independently by whichever thread
// owns it, in any order, with the same result.
TFM_HOST_DEVICE inline unsigned Hash(unsigned x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The random key of element `index` of the stream named by `seed`. Indices
// wrap modulo 2^32, which only repeats values for absurdly large buffers.
TFM_HOST_DEVICE inline unsigned Key(unsigned seed, unsigned index) {
  return Hash(index ^ Hash(seed ^ 0x9e3779b9u));
}

// Approximately standard normal: the sum of four 16-bit uniforms (exact in
// float, so no rounding can differ), centred and scaled to unit variance.
TFM_HOST_DEVICE inline float Gaussian(unsigned key) {
  const unsigned h1 = Hash(key);
  const unsigned h2 = Hash(h1 ^ 0x68e31da4u);
  const unsigned sum =
      (h1 & 0xffffu) + (h1 >> 16) + (h2 & 0xffffu) + (h2 >> 16);
  const float uniform_sum = Mul(static_cast<float>(sum), 1.0f / 65536.0f);
  return Mul(Sub(uniform_sum, 2.0f), 1.7320508f);  // var(sum of 4 U) = 1/3
}

// e^x. Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, a degree-7
// Taylor polynomial for e^r (relative error < 1e-7 there), and 2^n built
// from exponent bits. Results below 2^-126 flush to zero: in a softmax such a
// term cannot change a sum that includes e^0 = 1.
TFM_HOST_DEVICE inline float Exp(float x) {
  if (x < -87.0f) return 0.0f;
  if (x > 88.0f) x = 88.0f;
  const float n = floorf(Add(Mul(x, 1.44269504f), 0.5f));
  // ln2 split so that n * kLn2Hi is exact for |n| < 2^9.
  const float kLn2Hi = 0.693145751953125f;
  const float kLn2Lo = 1.42860682030941723212e-6f;
  const float r = Sub(Sub(x, Mul(n, kLn2Hi)), Mul(n, kLn2Lo));
  float p = 1.0f / 5040.0f;
  p = MulAdd(1.0f / 720.0f, p, r);
  p = MulAdd(1.0f / 120.0f, p, r);
  p = MulAdd(1.0f / 24.0f, p, r);
  p = MulAdd(1.0f / 6.0f, p, r);
  p = MulAdd(0.5f, p, r);
  p = MulAdd(1.0f, p, r);
  p = MulAdd(1.0f, p, r);
  const int exponent = static_cast<int>(n) + 127;  // in [1, 254]
  return Mul(p, FloatFromBits(static_cast<unsigned>(exponent) << 23));
}

// Natural logarithm of a positive normal float: x = 2^e m with
// m in [sqrt(2)/2, sqrt(2)), log(m) = 2 atanh(s), s = (m - 1) / (m + 1),
// |s| < 0.172, from its odd series.
TFM_HOST_DEVICE inline float Log(float x) {
  const unsigned bits = BitsFromFloat(x);
  int e = static_cast<int>((bits >> 23) & 0xffu) - 127;
  float m = FloatFromBits((bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = Mul(m, 0.5f);
    e += 1;
  }
  const float s = Div(Sub(m, 1.0f), Add(m, 1.0f));
  const float s2 = Mul(s, s);
  float p = 2.0f / 11.0f;
  p = MulAdd(2.0f / 9.0f, p, s2);
  p = MulAdd(2.0f / 7.0f, p, s2);
  p = MulAdd(2.0f / 5.0f, p, s2);
  p = MulAdd(2.0f / 3.0f, p, s2);
  p = MulAdd(2.0f, p, s2);
  const float log_m = Mul(p, s);
  const float ef = static_cast<float>(e);
  // ln2 split as in Exp so that e * kLn2Hi is exact.
  return Add(Add(Mul(ef, 0.693145751953125f), log_m),
             Mul(ef, 1.42860682030941723212e-6f));
}

// Correctly rounded square root: IEEE requires it of both sides.
TFM_HOST_DEVICE inline float Sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// Token `t` of training sequence `sequence`: each sequence counts up from a
// random start by a random stride in [1, 3] modulo an alphabet of the first
// min(vocab, 64) tokens, so the next token follows from the context and a
// few steps already teach the model which tokens occur.
TFM_HOST_DEVICE inline int SequenceToken(unsigned seed, unsigned sequence,
                                         int t, int vocab) {
  const unsigned alphabet = vocab < 64 ? static_cast<unsigned>(vocab) : 64u;
  const unsigned start = Hash(Key(seed ^ 0x70c3u, sequence));
  const unsigned stride = 1u + Hash(start ^ 0x5d1du) % 3u;
  return static_cast<int>((start + stride * static_cast<unsigned>(t)) %
                          alphabet);
}

// A fixed position code added to the embedding, exact in float: a small
// multiple of 1/64 from a hash of (position, feature).
TFM_HOST_DEVICE inline float PositionCode(int t, int d) {
  const unsigned h = Hash(static_cast<unsigned>(t) * 0x10001u ^
                          static_cast<unsigned>(d) * 0x9e37u);
  return Mul(static_cast<float>(static_cast<int>(h % 17u) - 8), 1.0f / 64.0f);
}

// Initial value of parameter `index`: `scale` times a standard normal.
TFM_HOST_DEVICE inline float InitialParam(unsigned seed, int index,
                                          float scale) {
  return Mul(scale, Gaussian(Key(seed, static_cast<unsigned>(index))));
}

TFM_HOST_DEVICE inline float Relu(float x) { return x > 0.0f ? x : 0.0f; }

// One Adam step on one parameter; bias corrections c1 = 1 - beta1^t and
// c2 = 1 - beta2^t come from the host, computed once per step.
TFM_HOST_DEVICE inline void AdamStep(float* w, float* m, float* v, float g,
                                     float lr, float beta1, float beta2,
                                     float c1, float c2) {
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
