// The hash STENSOR_VERIFY=hash compares, defined once for the three places
// that compute it: the CUDA kernel (core/swap/verify_kernels.cu), its host twin
// for the fake driver (core/swap/verify_kernels_host.cc) and the host reference
// (HashBytes, for tests).
//
// The bytes are read as little-endian 8-byte words, the last one padded with
// zeros. Word i contributes Term(word, i), a bijective mix of the word and
// its index; the terms are summed modulo 2^64, so any grid, block size or
// reduction order gives the same sum, and Finish mixes in the size. Changing
// any single word changes its term, hence the hash; two changes cancel with
// a probability of about 2^-64. Not a cryptographic hash: it guards against
// missed writes, not against an adversary.
//
// Thread-safety: pure functions.
#ifndef STENSOR_CORE_SWAP_VERIFY_HASH_H_
#define STENSOR_CORE_SWAP_VERIFY_HASH_H_

#ifdef __CUDACC__
#define STENSOR_VERIFY_HD __host__ __device__ __forceinline__
#else
#define STENSOR_VERIFY_HD inline
#endif

namespace stensor_verify {

typedef unsigned long long u64;

// The splitmix64 finalizer: a bijection of 64-bit words.
STENSOR_VERIFY_HD u64 Mix(u64 x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

STENSOR_VERIFY_HD u64 Term(u64 word, u64 index) {
  return Mix(word ^ (index * 0x9e3779b97f4a7c15ull));
}

// Word `index` of `size` bytes at `data`, zero-padded past the end. `data`
// is 8-byte aligned.
STENSOR_VERIFY_HD u64 Word(const unsigned char* data, u64 size, u64 index) {
  if (8 * index + 8 <= size) return reinterpret_cast<const u64*>(data)[index];
  u64 word = 0;
  for (u64 b = 8 * index; b < size; ++b) word |= static_cast<u64>(data[b]) << (8 * (b - 8 * index));
  return word;
}

STENSOR_VERIFY_HD u64 Words(u64 size) { return (size + 7) / 8; }

// The hash of `size` bytes whose terms sum to `sum`.
STENSOR_VERIFY_HD u64 Finish(u64 sum, u64 size) { return Mix(sum ^ Mix(size)); }

#ifndef __CUDACC__
// The host reference.
inline u64 HashBytes(const void* data, u64 size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  u64 sum = 0;
  for (u64 i = 0; i < Words(size); ++i) sum += Term(Word(bytes, size, i), i);
  return Finish(sum, size);
}
#endif

}  // namespace stensor_verify

#endif  // STENSOR_CORE_SWAP_VERIFY_HASH_H_
