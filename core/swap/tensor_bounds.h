#ifndef STENSOR_CORE_SWAP_TENSOR_BOUNDS_H_
#define STENSOR_CORE_SWAP_TENSOR_BOUNDS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stensor {

// Where the tensors a program carves out of one allocation (a caching
// allocator's segment) begin and end, as far as operations have shown: the
// offsets kernels' pointer words point at, and the start and end of each
// exact copy or memset. A kernel's pointer says where the tensor it names
// begins, never where it ends; a caching allocator lays its blocks end to
// end, so the next offset seen after the pointer is the likeliest end.
//
// A guess for what to fetch, never for what may be written: a kernel may
// reach past it, so what it leaves out is still mapped (served from host)
// and versioned as written.
class TensorBounds {
 public:
  // Offsets kept per allocation: past this many a new one is ignored (a
  // guess from fewer bounds reaches further, never less far).
  static constexpr size_t kMaxBounds = 512;

  void Note(uint64_t offset);
  // The end of what a pointer at `offset` likely reaches: the first bound
  // after it, or `size`.
  uint64_t EndFrom(uint64_t offset, uint64_t size) const;
  size_t size() const { return bounds_.size(); }

 private:
  std::vector<uint64_t> bounds_;  // ascending, unique
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_TENSOR_BOUNDS_H_
