#include "core/inference/copy_ranges.h"

#include <cstdint>

namespace stensor {
namespace {

constexpr uint64_t kSaturated = UINT64_MAX;

uint64_t Mul(uint64_t a, uint64_t b) {
  uint64_t out;
  return __builtin_mul_overflow(a, b, &out) ? kSaturated : out;
}

uint64_t Add(uint64_t a, uint64_t b) {
  uint64_t out;
  return __builtin_add_overflow(a, b, &out) ? kSaturated : out;
}

uint64_t Ptr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The rows from a region's first to its last: `depth` slices of `height`
// rows, slices `slice_rows` rows apart.
uint64_t Rows(uint64_t height, uint64_t depth, uint64_t slice_rows) {
  if (height == 0 || depth == 0) return 0;
  return Add(Mul(depth - 1, slice_rows), height);
}

// One side of a 2D/3D descriptor: its first byte is at row `y` of slice `z`,
// `x` bytes in.
CopySide Side(CUmemorytype type, const void* host, CUdeviceptr device, uint64_t x, uint64_t y,
              uint64_t z, uint64_t pitch, uint64_t slice_rows, uint64_t extent) {
  CopySide side;
  side.memory = MemoryKindOf(type);
  const uint64_t base = side.memory == MemoryKind::kHost ? Ptr(host)
                        : side.memory == MemoryKind::kDevice || side.memory == MemoryKind::kUnified
                            ? device
                            : 0;  // arrays are not linear memory
  if (base == 0) return side;
  side.start = Add(base, Add(Mul(Add(Mul(z, slice_rows), y), pitch), x));
  side.extent = extent;
  return side;
}

// CUDA_MEMCPY3D and CUDA_MEMCPY3D_PEER share these field names.
// The first byte is where the driver documents it, (Z * height + Y) * pitch
// + X with the side's height as given (0 is allowed when Depth is 1); the
// extent takes a height of 0 as Height, so that a descriptor the driver
// refuses (Depth > 1 needs height >= Height + Y) still spans its rows.
template <typename Params>
CopyRanges Of3D(const Params& p) {
  const uint64_t src_slice = p.srcHeight != 0 ? p.srcHeight : p.Height;
  const uint64_t dst_slice = p.dstHeight != 0 ? p.dstHeight : p.Height;
  CopyRanges r;
  r.kind = CopyKindOf(MemoryKindOf(p.srcMemoryType), MemoryKindOf(p.dstMemoryType));
  r.dst = Side(p.dstMemoryType, p.dstHost, p.dstDevice, p.dstXInBytes, p.dstY, p.dstZ, p.dstPitch,
               p.dstHeight,
               RegionExtent(p.WidthInBytes, Rows(p.Height, p.Depth, dst_slice), p.dstPitch));
  r.src = Side(p.srcMemoryType, p.srcHost, p.srcDevice, p.srcXInBytes, p.srcY, p.srcZ, p.srcPitch,
               p.srcHeight,
               RegionExtent(p.WidthInBytes, Rows(p.Height, p.Depth, src_slice), p.srcPitch));
  r.bytes = Mul(Mul(p.WidthInBytes, p.Height), p.Depth);
  return r;
}

CopySide OperandSide(const CUmemcpy3DOperand& o, const CUextent3D& e) {
  CopySide side;
  if (o.type != CU_MEMCPY_OPERAND_TYPE_POINTER) {
    side.memory =
        o.type == CU_MEMCPY_OPERAND_TYPE_ARRAY ? MemoryKind::kArray : MemoryKind::kUnknown;
    return side;
  }
  side.memory = MemoryKind::kUnified;
  side.start = o.op.ptr.ptr;
  if (side.start == 0) return side;
  // Elements of pointer operands are bytes; 0 means packed.
  const uint64_t row = o.op.ptr.rowLength != 0 ? o.op.ptr.rowLength : e.width;
  const uint64_t layer = o.op.ptr.layerHeight != 0 ? o.op.ptr.layerHeight : e.height;
  side.extent = RegionExtent(e.width, Rows(e.height, e.depth, layer), row);
  return side;
}

}  // namespace

const char* CopyKindName(CopyKind kind) {
  static const char* const kNames[] = {"HtoH", "HtoD", "HtoA",    "HtoU", "DtoH",   "DtoD", "DtoA",
                                       "DtoU", "AtoH", "AtoD",    "AtoA", "AtoU",   "UtoH", "UtoD",
                                       "UtoA", "UtoU", "default", "peer", "batch3d"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<int>(CopyKind::kBatch3D) + 1);
  return kNames[static_cast<int>(kind)];
}

MemoryKind MemoryKindOf(CUmemorytype type) {
  switch (type) {
    case CU_MEMORYTYPE_HOST:
      return MemoryKind::kHost;
    case CU_MEMORYTYPE_DEVICE:
      return MemoryKind::kDevice;
    case CU_MEMORYTYPE_ARRAY:
      return MemoryKind::kArray;
    case CU_MEMORYTYPE_UNIFIED:
      return MemoryKind::kUnified;
  }
  return MemoryKind::kUnknown;
}

CopyKind CopyKindOf(MemoryKind src, MemoryKind dst) {
  // kUnknown shares unified's row and column ("U").
  auto index = [](MemoryKind m) { return m == MemoryKind::kUnknown ? 3 : static_cast<int>(m); };
  return static_cast<CopyKind>(index(src) * 4 + index(dst));
}

uint64_t RegionExtent(uint64_t width, uint64_t rows, uint64_t pitch) {
  if (width == 0 || rows == 0) return 0;
  return Add(Mul(rows - 1, pitch), width);
}

CopyRanges LinearCopyRanges(CopyKind kind, uint64_t dst, uint64_t src, uint64_t bytes) {
  CopyRanges r;
  r.kind = kind;
  r.bytes = bytes;
  if (kind == CopyKind::kDefault) {
    r.dst.memory = r.src.memory = MemoryKind::kUnified;
  } else if (kind == CopyKind::kPeer) {
    r.dst.memory = r.src.memory = MemoryKind::kDevice;
  } else if (kind < CopyKind::kDefault) {
    const int k = static_cast<int>(kind);
    r.src.memory = static_cast<MemoryKind>(k / 4);
    r.dst.memory = static_cast<MemoryKind>(k % 4);
  }
  r.dst.start = dst;
  r.src.start = src;
  r.dst.extent = dst != 0 ? bytes : 0;
  r.src.extent = src != 0 ? bytes : 0;
  return r;
}

CopyRanges CopyRangesOf(const CUDA_MEMCPY2D& p) {
  CopyRanges r;
  r.kind = CopyKindOf(MemoryKindOf(p.srcMemoryType), MemoryKindOf(p.dstMemoryType));
  r.dst = Side(p.dstMemoryType, p.dstHost, p.dstDevice, p.dstXInBytes, p.dstY, 0, p.dstPitch, 0,
               RegionExtent(p.WidthInBytes, p.Height, p.dstPitch));
  r.src = Side(p.srcMemoryType, p.srcHost, p.srcDevice, p.srcXInBytes, p.srcY, 0, p.srcPitch, 0,
               RegionExtent(p.WidthInBytes, p.Height, p.srcPitch));
  r.bytes = Mul(p.WidthInBytes, p.Height);
  return r;
}

CopyRanges CopyRangesOf(const CUDA_MEMCPY3D& p) { return Of3D(p); }
CopyRanges CopyRangesOf(const CUDA_MEMCPY3D_PEER& p) { return Of3D(p); }

CopyRanges CopyRangesOf(const CUDA_MEMCPY3D_BATCH_OP& op) {
  CopyRanges r;
  r.kind = CopyKind::kBatch3D;
  r.dst = OperandSide(op.dst, op.extent);
  r.src = OperandSide(op.src, op.extent);
  r.bytes = Mul(Mul(op.extent.width, op.extent.height), op.extent.depth);
  return r;
}

MemsetRange MemsetRangeOf(uint64_t element_bytes, uint64_t width, uint64_t height, uint64_t pitch) {
  const uint64_t row = Mul(element_bytes, width);
  return {Mul(row, height), RegionExtent(row, height, pitch)};
}

}  // namespace stensor
