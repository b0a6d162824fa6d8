// What a copy or memset touches, read from its arguments alone: for the
// driver's 1D, 2D, 3D, 3D peer and batch copy descriptors, each side's memory
// kind, the address of its first byte and its extent (the bytes from there to
// the last byte touched, pitch gaps included), the bytes copied, and the
// copy's direction as the access log names it. interpose/ hands these to the
// tracker, which makes the buffers resident, refuses overruns of stensor's
// buffers and logs the copy.
//
// All arithmetic saturates: a descriptor whose sizes or offsets overflow 64
// bits gives UINT64_MAX (a range that overruns every buffer and lies inside
// none), never a small wrapped range that could name an unrelated buffer.
// The driver still judges such a descriptor (it answers
// CUDA_ERROR_INVALID_VALUE); stensor returns its answer.
//
// Thread-safety: pure functions of their arguments.
#ifndef STENSOR_CORE_INFERENCE_COPY_RANGES_H_
#define STENSOR_CORE_INFERENCE_COPY_RANGES_H_

#include <cuda.h>

#include <cstdint>

namespace stensor {

// Where one side of a copy lives, as its descriptor states it.
enum class MemoryKind : uint8_t {
  kHost,     // CU_MEMORYTYPE_HOST: a host pointer
  kDevice,   // CU_MEMORYTYPE_DEVICE: a device pointer
  kArray,    // CU_MEMORYTYPE_ARRAY: a CUarray, not linear memory
  kUnified,  // CU_MEMORYTYPE_UNIFIED, or a pointer operand of a batch copy:
             // the driver tells host from device by the address
  kUnknown,  // any other value (the driver refuses the descriptor)
};

// A copy's direction, as the access log's "kind" field names it
// (CopyKindName). The first sixteen are source x destination over host,
// device, array and unified-or-unknown memory ("HtoD", "DtoA", "UtoU", ...),
// as 2D/3D descriptors and the typed 1D entry points state them.
enum class CopyKind : uint8_t {
  kHostToHost,
  kHostToDevice,
  kHostToArray,
  kHostToUnified,
  kDeviceToHost,
  kDeviceToDevice,
  kDeviceToArray,
  kDeviceToUnified,
  kArrayToHost,
  kArrayToDevice,
  kArrayToArray,
  kArrayToUnified,
  kUnifiedToHost,
  kUnifiedToDevice,
  kUnifiedToArray,
  kUnifiedToUnified,
  kDefault,  // cuMemcpy, cuMemcpyAsync, cuMemcpyBatchAsync: unified addressing
  kPeer,     // cuMemcpyPeer(Async): device to device across contexts
  kBatch3D,  // one operation of cuMemcpy3DBatchAsync
};

// The access log's name of `kind` ("HtoD", "default", "peer", "batch3d").
const char* CopyKindName(CopyKind kind);
// The direction from `src` to `dst` memory (kUnknown counts as unified).
CopyKind CopyKindOf(MemoryKind src, MemoryKind dst);
MemoryKind MemoryKindOf(CUmemorytype type);

// One side of a copy or memset.
struct CopySide {
  MemoryKind memory = MemoryKind::kUnknown;
  // The address of the first byte; 0 where the side is no linear memory (an
  // array, an unknown memory type) or its pointer is null.
  uint64_t start = 0;
  // The bytes from `start` to the last byte touched; 0 when nothing is
  // touched or `start` is 0.
  uint64_t extent = 0;
};

struct CopyRanges {
  CopyKind kind = CopyKind::kDefault;
  CopySide dst;
  CopySide src;
  uint64_t bytes = 0;  // the bytes copied (the region's, not its extent)
};

// The bytes from a region's first byte to its last: `rows` rows of `width`
// bytes, `pitch` apart (0 when either is 0).
uint64_t RegionExtent(uint64_t width, uint64_t rows, uint64_t pitch);

// A 1D copy of `bytes` from src to dst: both extents are `bytes`, the sides'
// memory follows from `kind` (unified for kDefault, device for kPeer).
CopyRanges LinearCopyRanges(CopyKind kind, uint64_t dst, uint64_t src, uint64_t bytes);
// cuMemcpy2D: WidthInBytes x Height, each side's rows its pitch apart.
CopyRanges CopyRangesOf(const CUDA_MEMCPY2D& p);
// cuMemcpy3D and cuMemcpy3DPeer: Depth slices of Height rows; a side's
// slices are its srcHeight/dstHeight rows apart (for the extent, Height when
// 0). A peer copy is named by its memory types, as a plain 3D copy.
CopyRanges CopyRangesOf(const CUDA_MEMCPY3D& p);
CopyRanges CopyRangesOf(const CUDA_MEMCPY3D_PEER& p);
// One operation of cuMemcpy3DBatchAsync (kind kBatch3D): a pointer operand's
// rows are rowLength bytes apart and its layers layerHeight rows apart (the
// extent's width and height when 0); an array operand has no linear range.
CopyRanges CopyRangesOf(const CUDA_MEMCPY3D_BATCH_OP& op);

// A memset of `height` rows of `width` elements of `element_bytes` each,
// rows `pitch` bytes apart (1D: height 1, any pitch).
struct MemsetRange {
  uint64_t bytes = 0;   // the bytes set
  uint64_t extent = 0;  // from the first to the last byte set
  // Every byte of the extent is set (one row, or rows without gaps), so
  // what it overwrote is known exactly. A saturated size (rows past 2^64)
  // is not: the rows' gaps were lost in it.
  bool linear() const { return extent == bytes && bytes != UINT64_MAX; }
};
MemsetRange MemsetRangeOf(uint64_t element_bytes, uint64_t width, uint64_t height, uint64_t pitch);

}  // namespace stensor

#endif  // STENSOR_CORE_INFERENCE_COPY_RANGES_H_
