// Element-level arithmetic that rounds the same on a GPU and on the host,
// shared by the examples' CUDA kernels and their host twins for the fake
// driver (examples/mlp, examples/transformer), so both compute the same
// bits.
//
// Every rounding step is spelled out: Mul/Add/Sub/Div/Sqrt are single IEEE
// round-to-nearest operations that no compiler may fuse into an FMA (nvcc
// contracts `a * b + c` by default; the __f*_rn intrinsics opt out), and
// Exp/Log are implemented here from those operations instead of calling
// libm or CUDA's math library, whose last-bit results differ. Together with
// a fixed summation order in the kernels this makes the GPU and the fake
// device produce the same bits, provided the host side is compiled without
// FMA contraction (the examples' BUILD files pass -ffp-contract=off to every
// target that includes this header).
//
// Included by .cu files too, so it includes only by relative path and
// nothing of the project's.
//
// All functions are pure; thread-safe.
#ifndef STENSOR_EXAMPLES_COMMON_EXACT_MATH_H_
#define STENSOR_EXAMPLES_COMMON_EXACT_MATH_H_

#if defined(__CUDACC__)
#define EXACT_HOST_DEVICE __host__ __device__
#else
#define EXACT_HOST_DEVICE
#include <cmath>
#include <cstring>
#endif

namespace exact {

EXACT_HOST_DEVICE inline float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

EXACT_HOST_DEVICE inline float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

EXACT_HOST_DEVICE inline float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

EXACT_HOST_DEVICE inline float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Correctly rounded square root: IEEE requires it of both sides.
EXACT_HOST_DEVICE inline float Sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// acc + a * b with two roundings, the step of every dot product here.
EXACT_HOST_DEVICE inline float MulAdd(float acc, float a, float b) { return Add(acc, Mul(a, b)); }

EXACT_HOST_DEVICE inline float FloatFromBits(unsigned bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

EXACT_HOST_DEVICE inline unsigned BitsFromFloat(float f) {
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
EXACT_HOST_DEVICE inline unsigned Hash(unsigned x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The random key of element `index` of the stream named by `seed`. Indices
// wrap modulo 2^32, which only repeats values for absurdly large buffers.
EXACT_HOST_DEVICE inline unsigned Key(unsigned seed, unsigned index) {
  return Hash(index ^ Hash(seed ^ 0x9e3779b9u));
}

// Approximately standard normal: the sum of four 16-bit uniforms (exact in
// float, so no rounding can differ), centred and scaled to unit variance.
EXACT_HOST_DEVICE inline float Gaussian(unsigned key) {
  const unsigned h1 = Hash(key);
  const unsigned h2 = Hash(h1 ^ 0x68e31da4u);
  const unsigned sum = (h1 & 0xffffu) + (h1 >> 16) + (h2 & 0xffffu) + (h2 >> 16);
  const float uniform_sum = Mul(static_cast<float>(sum), 1.0f / 65536.0f);
  return Mul(Sub(uniform_sum, 2.0f), 1.7320508f);  // var(sum of 4 U) = 1/3
}

// e^x. Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, a degree-7
// Taylor polynomial for e^r (relative error < 1e-7 there), and 2^n built
// from exponent bits. Results below 2^-126 flush to zero: in a softmax such a
// term cannot change a sum that includes e^0 = 1.
EXACT_HOST_DEVICE inline float Exp(float x) {
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
EXACT_HOST_DEVICE inline float Log(float x) {
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
  return Add(Add(Mul(ef, 0.693145751953125f), log_m), Mul(ef, 1.42860682030941723212e-6f));
}

// Initial value of parameter `index`: `scale` times a standard normal.
EXACT_HOST_DEVICE inline float InitialParam(unsigned seed, int index, float scale) {
  return Mul(scale, Gaussian(Key(seed, static_cast<unsigned>(index))));
}

EXACT_HOST_DEVICE inline float Relu(float x) { return x > 0.0f ? x : 0.0f; }

}  // namespace exact

#endif  // STENSOR_EXAMPLES_COMMON_EXACT_MATH_H_
