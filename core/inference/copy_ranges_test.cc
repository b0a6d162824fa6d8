#include "core/inference/copy_ranges.h"

#include <cstdint>
#include <cstring>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace stensor {
namespace {

constexpr uint64_t kMax = UINT64_MAX;
constexpr CUdeviceptr kDev = 0x7f0000000000;
constexpr CUdeviceptr kDev2 = 0x7f1000000000;

uint64_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// A 2D copy from device to device: 3 rows of 100 bytes, the source rows
// 128 bytes apart, the destination rows 256.
CUDA_MEMCPY2D DeviceToDevice2D() {
  CUDA_MEMCPY2D p;
  std::memset(&p, 0, sizeof(p));
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = kDev;
  p.srcPitch = 128;
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = kDev2;
  p.dstPitch = 256;
  p.WidthInBytes = 100;
  p.Height = 3;
  return p;
}

CUDA_MEMCPY3D DeviceToDevice3D() {
  CUDA_MEMCPY3D p;
  std::memset(&p, 0, sizeof(p));
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = kDev;
  p.srcPitch = 128;
  p.srcHeight = 8;  // slices 8 rows apart
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = kDev2;
  p.dstPitch = 256;
  p.dstHeight = 4;
  p.WidthInBytes = 100;
  p.Height = 3;
  p.Depth = 2;
  return p;
}

CUDA_MEMCPY3D_BATCH_OP PointerOp(CUdeviceptr dst, CUdeviceptr src, size_t w, size_t h, size_t d) {
  CUDA_MEMCPY3D_BATCH_OP op;
  std::memset(&op, 0, sizeof(op));
  op.src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  op.src.op.ptr.ptr = src;
  op.dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  op.dst.op.ptr.ptr = dst;
  op.extent = {w, h, d};
  return op;
}

// --- Names: the access log's strings, one per kind ------------------------------

TEST(CopyKindTest, NamesAreTheAccessLogsStrings) {
  EXPECT_STREQ(CopyKindName(CopyKind::kHostToDevice), "HtoD");
  EXPECT_STREQ(CopyKindName(CopyKind::kDeviceToHost), "DtoH");
  EXPECT_STREQ(CopyKindName(CopyKind::kDeviceToDevice), "DtoD");
  EXPECT_STREQ(CopyKindName(CopyKind::kHostToHost), "HtoH");
  EXPECT_STREQ(CopyKindName(CopyKind::kDeviceToArray), "DtoA");
  EXPECT_STREQ(CopyKindName(CopyKind::kArrayToDevice), "AtoD");
  EXPECT_STREQ(CopyKindName(CopyKind::kUnifiedToHost), "UtoH");
  EXPECT_STREQ(CopyKindName(CopyKind::kHostToUnified), "HtoU");
  EXPECT_STREQ(CopyKindName(CopyKind::kDefault), "default");
  EXPECT_STREQ(CopyKindName(CopyKind::kPeer), "peer");
  EXPECT_STREQ(CopyKindName(CopyKind::kBatch3D), "batch3d");
}

TEST(CopyKindTest, EveryPairOfMemoryTypesHasItsOwnName) {
  const char* const kSide = "HDAU";
  const MemoryKind kinds[] = {MemoryKind::kHost, MemoryKind::kDevice, MemoryKind::kArray,
                              MemoryKind::kUnified};
  std::set<std::string> names;
  for (int s = 0; s < 4; ++s) {
    for (int d = 0; d < 4; ++d) {
      const std::string want = std::string(1, kSide[s]) + "to" + kSide[d];
      EXPECT_EQ(CopyKindName(CopyKindOf(kinds[s], kinds[d])), want);
      names.insert(want);
    }
  }
  EXPECT_EQ(names.size(), 16u);
  // An unknown memory type is named as unified ("U"), as before the enum.
  EXPECT_EQ(CopyKindOf(MemoryKind::kUnknown, MemoryKind::kHost), CopyKind::kUnifiedToHost);
  EXPECT_EQ(CopyKindOf(MemoryKind::kDevice, MemoryKind::kUnknown), CopyKind::kDeviceToUnified);
}

TEST(CopyKindTest, MemoryTypes) {
  EXPECT_EQ(MemoryKindOf(CU_MEMORYTYPE_HOST), MemoryKind::kHost);
  EXPECT_EQ(MemoryKindOf(CU_MEMORYTYPE_DEVICE), MemoryKind::kDevice);
  EXPECT_EQ(MemoryKindOf(CU_MEMORYTYPE_ARRAY), MemoryKind::kArray);
  EXPECT_EQ(MemoryKindOf(CU_MEMORYTYPE_UNIFIED), MemoryKind::kUnified);
  EXPECT_EQ(MemoryKindOf(static_cast<CUmemorytype>(0)), MemoryKind::kUnknown);
  EXPECT_EQ(MemoryKindOf(static_cast<CUmemorytype>(77)), MemoryKind::kUnknown);
}

// --- RegionExtent -------------------------------------------------------------------

TEST(RegionExtentTest, RowsPitchApart) {
  EXPECT_EQ(RegionExtent(100, 3, 128), 2 * 128 + 100u);
  EXPECT_EQ(RegionExtent(100, 1, 128), 100u);  // one row: the pitch does not count
  EXPECT_EQ(RegionExtent(128, 3, 128), 384u);  // width == pitch: contiguous
  EXPECT_EQ(RegionExtent(0, 3, 128), 0u);
  EXPECT_EQ(RegionExtent(100, 0, 128), 0u);
}

TEST(RegionExtentTest, OverflowSaturates) {
  EXPECT_EQ(RegionExtent(1, kMax, 2), kMax);         // rows * pitch
  EXPECT_EQ(RegionExtent(kMax, 2, kMax / 2), kMax);  // + width
  EXPECT_EQ(RegionExtent(kMax, 1, 0), kMax);         // exactly representable
}

// --- 1D copies ----------------------------------------------------------------------

TEST(LinearCopyRangesTest, SidesFollowTheKind) {
  CopyRanges r = LinearCopyRanges(CopyKind::kHostToDevice, kDev, 0x1000, 64);
  EXPECT_EQ(r.kind, CopyKind::kHostToDevice);
  EXPECT_EQ(r.src.memory, MemoryKind::kHost);
  EXPECT_EQ(r.dst.memory, MemoryKind::kDevice);
  EXPECT_EQ(r.dst.start, kDev);
  EXPECT_EQ(r.src.start, 0x1000u);
  EXPECT_EQ(r.dst.extent, 64u);
  EXPECT_EQ(r.src.extent, 64u);
  EXPECT_EQ(r.bytes, 64u);

  r = LinearCopyRanges(CopyKind::kDefault, kDev, kDev2, 8);
  EXPECT_EQ(r.src.memory, MemoryKind::kUnified);
  EXPECT_EQ(r.dst.memory, MemoryKind::kUnified);
  r = LinearCopyRanges(CopyKind::kPeer, kDev, kDev2, 8);
  EXPECT_EQ(r.src.memory, MemoryKind::kDevice);
  EXPECT_EQ(r.dst.memory, MemoryKind::kDevice);
}

TEST(LinearCopyRangesTest, AnArraySideHasNoLinearRange) {
  // cuMemcpyDtoA: the hook passes 0 for the array.
  CopyRanges r = LinearCopyRanges(CopyKind::kDeviceToArray, 0, kDev, 64);
  EXPECT_EQ(r.dst.memory, MemoryKind::kArray);
  EXPECT_EQ(r.dst.start, 0u);
  EXPECT_EQ(r.dst.extent, 0u);
  EXPECT_EQ(r.src.extent, 64u);
}

// --- 2D copies ----------------------------------------------------------------------

TEST(CopyRanges2DTest, PitchedRowsOnEachSide) {
  CopyRanges r = CopyRangesOf(DeviceToDevice2D());
  EXPECT_EQ(r.kind, CopyKind::kDeviceToDevice);
  EXPECT_EQ(r.src.start, kDev);
  EXPECT_EQ(r.src.extent, 2 * 128 + 100u);
  EXPECT_EQ(r.dst.start, kDev2);
  EXPECT_EQ(r.dst.extent, 2 * 256 + 100u);
  EXPECT_EQ(r.bytes, 300u);
}

TEST(CopyRanges2DTest, OffsetsMoveTheFirstByte) {
  CUDA_MEMCPY2D p = DeviceToDevice2D();
  p.srcXInBytes = 5;
  p.srcY = 2;
  p.dstXInBytes = 7;
  p.dstY = 1;
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.src.start, kDev + 2 * 128 + 5);
  EXPECT_EQ(r.dst.start, kDev2 + 256 + 7);
  // The extent counts from the first byte.
  EXPECT_EQ(r.src.extent, 2 * 128 + 100u);
  EXPECT_EQ(r.dst.extent, 2 * 256 + 100u);
}

TEST(CopyRanges2DTest, UnpitchedIsContiguous) {
  CUDA_MEMCPY2D p = DeviceToDevice2D();
  p.srcPitch = p.dstPitch = p.WidthInBytes;
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.src.extent, 300u);
  EXPECT_EQ(r.dst.extent, 300u);
  EXPECT_EQ(r.bytes, 300u);
}

TEST(CopyRanges2DTest, HeightOneAndZero) {
  CUDA_MEMCPY2D p = DeviceToDevice2D();
  p.Height = 1;
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.src.extent, 100u);
  EXPECT_EQ(r.dst.extent, 100u);
  EXPECT_EQ(r.bytes, 100u);
  p.Height = 0;
  r = CopyRangesOf(p);
  EXPECT_EQ(r.src.extent, 0u);
  EXPECT_EQ(r.dst.extent, 0u);
  EXPECT_EQ(r.bytes, 0u);
  EXPECT_EQ(r.src.start, kDev);  // still named, touching nothing
}

TEST(CopyRanges2DTest, HostDeviceArrayAndUnifiedSides) {
  char host[4096];
  CUDA_MEMCPY2D p = DeviceToDevice2D();
  p.srcMemoryType = CU_MEMORYTYPE_HOST;
  p.srcHost = host;
  p.srcDevice = kDev;  // ignored for a host side
  p.srcXInBytes = 3;
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.kind, CopyKind::kHostToDevice);
  EXPECT_EQ(r.src.memory, MemoryKind::kHost);
  EXPECT_EQ(r.src.start, Addr(host) + 3);

  p.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  p.dstArray = reinterpret_cast<CUarray>(0x1234);
  r = CopyRangesOf(p);
  EXPECT_EQ(r.kind, CopyKind::kHostToArray);
  EXPECT_EQ(r.dst.memory, MemoryKind::kArray);
  EXPECT_EQ(r.dst.start, 0u);
  EXPECT_EQ(r.dst.extent, 0u);

  p.dstMemoryType = CU_MEMORYTYPE_UNIFIED;  // a device pointer, read as such
  r = CopyRangesOf(p);
  EXPECT_EQ(r.kind, CopyKind::kHostToUnified);
  EXPECT_EQ(r.dst.start, kDev2);
  EXPECT_EQ(r.dst.extent, 2 * 256 + 100u);

  p.dstMemoryType = static_cast<CUmemorytype>(9);  // the driver refuses it
  r = CopyRangesOf(p);
  EXPECT_EQ(r.kind, CopyKind::kHostToUnified);
  EXPECT_EQ(r.dst.memory, MemoryKind::kUnknown);
  EXPECT_EQ(r.dst.start, 0u);
}

TEST(CopyRanges2DTest, NullHostPointerHasNoRange) {
  CUDA_MEMCPY2D p = DeviceToDevice2D();
  p.srcMemoryType = CU_MEMORYTYPE_HOST;
  p.srcHost = nullptr;
  p.srcY = 1;
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.src.start, 0u);  // not 0 + 128, which could be anything
  EXPECT_EQ(r.src.extent, 0u);
}

TEST(CopyRanges2DTest, OverflowNeverWrapsIntoASmallRange) {
  CUDA_MEMCPY2D p = DeviceToDevice2D();
  p.WidthInBytes = size_t{1} << 40;
  p.Height = size_t{1} << 30;
  p.srcPitch = p.dstPitch = size_t{1} << 40;
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.bytes, kMax);
  EXPECT_EQ(r.src.extent, kMax);
  EXPECT_EQ(r.dst.extent, kMax);
  // An offset past the end of the address space.
  p = DeviceToDevice2D();
  p.srcY = kMax / 64;
  r = CopyRangesOf(p);
  EXPECT_EQ(r.src.start, kMax);
  p = DeviceToDevice2D();
  p.srcXInBytes = kMax - 10;
  r = CopyRangesOf(p);
  EXPECT_EQ(r.src.start, kMax);
}

// --- 3D copies ----------------------------------------------------------------------

TEST(CopyRanges3DTest, SlicesTheirHeightApart) {
  CopyRanges r = CopyRangesOf(DeviceToDevice3D());
  EXPECT_EQ(r.kind, CopyKind::kDeviceToDevice);
  // Last byte: row (2 - 1) * 8 + 3 - 1 = 10 of the source.
  EXPECT_EQ(r.src.extent, 10 * 128 + 100u);
  // Row (2 - 1) * 4 + 3 - 1 = 6 of the destination.
  EXPECT_EQ(r.dst.extent, 6 * 256 + 100u);
  EXPECT_EQ(r.bytes, 600u);
}

TEST(CopyRanges3DTest, ZeroSliceHeight) {
  // Allowed when Depth is 1: the start is the documented
  // (srcZ * srcHeight + srcY) * srcPitch + srcXInBytes, so Z moves nothing.
  CUDA_MEMCPY3D p = DeviceToDevice3D();
  p.Depth = 1;
  p.srcHeight = 0;
  p.srcZ = 1;
  p.srcY = 1;
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.src.start, kDev + 128);
  EXPECT_EQ(r.src.extent, 2 * 128 + 100u);
  // With Depth 2 the driver refuses it; the extent still spans both slices
  // of Height rows.
  p.Depth = 2;
  r = CopyRangesOf(p);
  EXPECT_EQ(r.src.extent, (1 * 3 + 2) * 128 + 100u);
}

TEST(CopyRanges3DTest, OffsetsInAllThreeDimensions) {
  CUDA_MEMCPY3D p = DeviceToDevice3D();
  p.srcXInBytes = 4;
  p.srcY = 1;
  p.srcZ = 2;
  p.dstXInBytes = 8;
  p.dstY = 2;
  p.dstZ = 1;
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.src.start, kDev + (2 * 8 + 1) * 128 + 4);
  EXPECT_EQ(r.dst.start, kDev2 + (1 * 4 + 2) * 256 + 8);
}

TEST(CopyRanges3DTest, DepthAndHeightOneAndZero) {
  CUDA_MEMCPY3D p = DeviceToDevice3D();
  p.Depth = 1;  // a 2D copy: the slice height does not count
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.src.extent, 2 * 128 + 100u);
  EXPECT_EQ(r.bytes, 300u);
  p.Height = 1;
  r = CopyRangesOf(p);
  EXPECT_EQ(r.src.extent, 100u);
  p = DeviceToDevice3D();
  p.Depth = 0;
  r = CopyRangesOf(p);
  EXPECT_EQ(r.src.extent, 0u);
  EXPECT_EQ(r.dst.extent, 0u);
  EXPECT_EQ(r.bytes, 0u);
  p = DeviceToDevice3D();
  p.Height = 0;
  r = CopyRangesOf(p);
  EXPECT_EQ(r.src.extent, 0u);
  EXPECT_EQ(r.bytes, 0u);
}

TEST(CopyRanges3DTest, HostAndArraySides) {
  char host[64];
  CUDA_MEMCPY3D p = DeviceToDevice3D();
  p.dstMemoryType = CU_MEMORYTYPE_HOST;
  p.dstHost = host;
  p.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.kind, CopyKind::kArrayToHost);
  EXPECT_EQ(r.dst.start, Addr(host));
  EXPECT_EQ(r.src.start, 0u);
  EXPECT_EQ(r.src.extent, 0u);
}

TEST(CopyRanges3DTest, OverflowOfWidthHeightDepthSaturates) {
  CUDA_MEMCPY3D p = DeviceToDevice3D();
  p.WidthInBytes = size_t{1} << 30;
  p.Height = size_t{1} << 20;
  p.Depth = size_t{1} << 20;  // 2^70 bytes
  p.srcPitch = p.dstPitch = size_t{1} << 30;
  p.srcHeight = p.dstHeight = size_t{1} << 20;
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.bytes, kMax);
  EXPECT_EQ(r.src.extent, kMax);
  EXPECT_EQ(r.dst.extent, kMax);
  // Depth * slice height alone overflowing.
  p = DeviceToDevice3D();
  p.Depth = kMax / 2;
  p.srcHeight = 4;
  r = CopyRangesOf(p);
  EXPECT_EQ(r.src.extent, kMax);
  // A slice offset past the address space.
  p = DeviceToDevice3D();
  p.srcZ = kMax / 4;
  r = CopyRangesOf(p);
  EXPECT_EQ(r.src.start, kMax);
}

TEST(CopyRanges3DTest, PeerCopiesAreNamedByTheirMemoryTypes) {
  CUDA_MEMCPY3D_PEER p;
  std::memset(&p, 0, sizeof(p));
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = kDev;
  p.srcPitch = 64;
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = kDev2;
  p.dstPitch = 64;
  p.dstY = 1;
  p.WidthInBytes = 64;
  p.Height = 2;
  p.Depth = 3;
  CopyRanges r = CopyRangesOf(p);
  EXPECT_EQ(r.kind, CopyKind::kDeviceToDevice);
  EXPECT_EQ(r.src.extent, 6 * 64u);  // packed
  EXPECT_EQ(r.dst.start, kDev2 + 64);
  EXPECT_EQ(r.bytes, 384u);
}

// --- Batch operations ---------------------------------------------------------------

TEST(CopyRangesBatchTest, PackedPointerOperands) {
  CopyRanges r = CopyRangesOf(PointerOp(kDev2, kDev, 100, 3, 2));
  EXPECT_EQ(r.kind, CopyKind::kBatch3D);
  EXPECT_EQ(r.src.memory, MemoryKind::kUnified);
  EXPECT_EQ(r.src.start, kDev);
  EXPECT_EQ(r.dst.start, kDev2);
  EXPECT_EQ(r.src.extent, 600u);
  EXPECT_EQ(r.dst.extent, 600u);
  EXPECT_EQ(r.bytes, 600u);
}

TEST(CopyRangesBatchTest, RowLengthAndLayerHeight) {
  CUDA_MEMCPY3D_BATCH_OP op = PointerOp(kDev2, kDev, 100, 3, 2);
  op.src.op.ptr.rowLength = 128;
  op.src.op.ptr.layerHeight = 8;
  op.dst.op.ptr.rowLength = 256;  // layers packed: 3 rows apart
  CopyRanges r = CopyRangesOf(op);
  EXPECT_EQ(r.src.extent, ((2 - 1) * 8 + 3 - 1) * 128 + 100u);
  EXPECT_EQ(r.dst.extent, ((2 - 1) * 3 + 3 - 1) * 256 + 100u);
  EXPECT_EQ(r.bytes, 600u);
}

TEST(CopyRangesBatchTest, ZeroExtentsTouchNothing) {
  for (const CUextent3D& e : {CUextent3D{0, 3, 2}, CUextent3D{100, 0, 2}, CUextent3D{100, 3, 0}}) {
    CUDA_MEMCPY3D_BATCH_OP op = PointerOp(kDev2, kDev, e.width, e.height, e.depth);
    CopyRanges r = CopyRangesOf(op);
    EXPECT_EQ(r.src.extent, 0u);
    EXPECT_EQ(r.dst.extent, 0u);
    EXPECT_EQ(r.bytes, 0u);
  }
}

TEST(CopyRangesBatchTest, ArrayOperandsAndMixedKinds) {
  CUDA_MEMCPY3D_BATCH_OP ops[3] = {PointerOp(kDev2, kDev, 16, 1, 1),
                                   PointerOp(kDev2, kDev, 16, 4, 1),
                                   PointerOp(kDev2, kDev, 16, 4, 1)};
  ops[1].src.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;  // array -> pointer
  ops[2].dst.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;  // pointer -> array
  CopyRanges r0 = CopyRangesOf(ops[0]);
  CopyRanges r1 = CopyRangesOf(ops[1]);
  CopyRanges r2 = CopyRangesOf(ops[2]);
  EXPECT_EQ(r0.src.extent, 16u);
  EXPECT_EQ(r1.src.memory, MemoryKind::kArray);
  EXPECT_EQ(r1.src.start, 0u);
  EXPECT_EQ(r1.src.extent, 0u);
  EXPECT_EQ(r1.dst.start, kDev2);
  EXPECT_EQ(r1.dst.extent, 64u);
  EXPECT_EQ(r2.dst.memory, MemoryKind::kArray);
  EXPECT_EQ(r2.dst.start, 0u);
  EXPECT_EQ(r2.src.extent, 64u);
  for (const CopyRanges& r : {r0, r1, r2}) EXPECT_EQ(r.kind, CopyKind::kBatch3D);
}

TEST(CopyRangesBatchTest, OverflowSaturates) {
  CUDA_MEMCPY3D_BATCH_OP op = PointerOp(kDev2, kDev, size_t{1} << 32, size_t{1} << 32, 2);
  CopyRanges r = CopyRangesOf(op);
  EXPECT_EQ(r.bytes, kMax);
  EXPECT_EQ(r.src.extent, kMax);
  op = PointerOp(kDev2, kDev, 16, 2, kMax);
  op.src.op.ptr.layerHeight = 4;
  r = CopyRangesOf(op);
  EXPECT_EQ(r.src.extent, kMax);
}

// --- Memsets ------------------------------------------------------------------------

TEST(MemsetRangeTest, OneAndTwoDimensional) {
  MemsetRange m = MemsetRangeOf(4, 10, 1, 0);  // cuMemsetD32(10)
  EXPECT_EQ(m.bytes, 40u);
  EXPECT_EQ(m.extent, 40u);
  m = MemsetRangeOf(2, 10, 3, 64);  // cuMemsetD2D16: 3 rows of 20 bytes
  EXPECT_EQ(m.bytes, 60u);
  EXPECT_EQ(m.extent, 2 * 64 + 20u);
  m = MemsetRangeOf(1, 64, 3, 64);  // width == pitch
  EXPECT_EQ(m.extent, 192u);
  m = MemsetRangeOf(1, 64, 0, 64);
  EXPECT_EQ(m.bytes, 0u);
  EXPECT_EQ(m.extent, 0u);
}

// Linear: every byte of the extent set, so the pointer tables it overwrote
// are cleared exactly; rows with gaps leave the tables they reach stale.
TEST(MemsetRangeTest, LinearWhenNoByteOfTheExtentIsSkipped) {
  EXPECT_TRUE(MemsetRangeOf(4, 10, 1, 0).linear());            // cuMemsetD32
  EXPECT_TRUE(MemsetRangeOf(1, 64, 3, 64).linear());           // rows without gaps
  EXPECT_TRUE(MemsetRangeOf(2, 10, 1, 64).linear());           // one row
  EXPECT_FALSE(MemsetRangeOf(2, 10, 3, 64).linear());          // gaps between rows
  EXPECT_FALSE(MemsetRangeOf(1, 16, kMax, 1 << 20).linear());  // saturated
}

TEST(MemsetRangeTest, OverflowSaturates) {
  MemsetRange m = MemsetRangeOf(4, kMax / 2, 1, 0);
  EXPECT_EQ(m.bytes, kMax);
  EXPECT_EQ(m.extent, kMax);
  m = MemsetRangeOf(1, 16, kMax, 1 << 20);
  EXPECT_EQ(m.bytes, kMax);
  EXPECT_EQ(m.extent, kMax);
}

}  // namespace
}  // namespace stensor
