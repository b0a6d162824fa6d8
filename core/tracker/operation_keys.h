// The iteration planner's keys: what an operation is and its shape, never
// its addresses nor the sizes of the buffers it reaches. A caching
// allocator (PyTorch's) places a tensor in whichever segment has room, so
// the same operation of two steps reaches segments of other sizes, and a
// key holding them would never repeat.
#ifndef STENSOR_CORE_TRACKER_OPERATION_KEYS_H_
#define STENSOR_CORE_TRACKER_OPERATION_KEYS_H_

#include <cstdint>

#include "core/driver/driver.h"

namespace stensor {

// A copy or memset: its extent and direction.
inline uint64_t TransferKey(uint64_t bytes, bool to_host, bool memset) {
  return (bytes * 4 + (to_host ? 2 : 0) + (memset ? 1 : 0)) ^ 0x7472616e73666572ull;
}

// A launch: the kernel and its grid and block (`stensor sim` keys a logged
// launch by the same three).
inline uint64_t LaunchKey(CUfunction f, const unsigned grid[3], const unsigned block[3]) {
  uint64_t key = reinterpret_cast<uintptr_t>(f);
  for (const unsigned* dims : {grid, block}) {
    for (int i = 0; i < 3; ++i) {
      key = (key ^ dims[i]) * 0x9e3779b97f4a7c15ull;
      key ^= key >> 29;
    }
  }
  return key;
}

}  // namespace stensor

#endif  // STENSOR_CORE_TRACKER_OPERATION_KEYS_H_
