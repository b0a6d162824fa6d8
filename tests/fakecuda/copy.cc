// Fake driver: copies and memsets, synchronous and stream-ordered.
//
// Every copy runs on a stream worker, in stream order. Synchronous calls use
// the legacy stream (or the per-thread stream for _ptds entry points) and
// wait. Asynchronous copies follow the real driver's rules for pageable host
// memory: a pageable source is read before the call returns, and a copy into
// pageable memory has completed when it returns. A copy between host and
// device memory runs on its direction's copy engine (the time model,
// FAKECUDA_LINK); device<->device copies, host<->host copies and memsets do
// not cross the link.
#include <cstring>
#include <memory>
#include <vector>

#include "tests/fakecuda/internal.h"

namespace fakecuda {
namespace {

// One side of a copy: a base address with a row pitch and a slice height.
struct Side {
  unsigned char* base = nullptr;
  size_t pitch = 0;   // bytes between rows
  size_t height = 0;  // rows between slices
  bool device = false;
};

struct Shape {
  size_t width = 0;  // bytes per row
  size_t rows = 1;
  size_t slices = 1;
};

unsigned char* RowAt(const Side& s, size_t row, size_t slice) {
  return s.base + (slice * s.height + row) * s.pitch;
}

// Bytes from a side's first byte to its last, or false on overflow.
bool Extent(const Side& s, const Shape& shape, size_t* out) {
  size_t rows, bytes;
  return !__builtin_mul_overflow(shape.slices - 1, s.height, &rows) &&
         !__builtin_add_overflow(rows, shape.rows - 1, &rows) &&
         !__builtin_mul_overflow(rows, s.pitch, &bytes) &&
         !__builtin_add_overflow(bytes, shape.width, out) &&
         reinterpret_cast<uintptr_t>(s.base) + *out >= *out;
}

CUresult CheckSide(const Side& s, const Shape& shape) {
  size_t extent;
  if (!Extent(s, shape, &extent)) return CUDA_ERROR_INVALID_VALUE;
  if (s.device && !IsDeviceRange(reinterpret_cast<CUdeviceptr>(s.base), extent)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

void CopyRows(const Side& dst, const Side& src, const Shape& shape) {
  for (size_t z = 0; z < shape.slices; ++z) {
    for (size_t y = 0; y < shape.rows; ++y) {
      std::memmove(RowAt(dst, y, z), RowAt(src, y, z), shape.width);
    }
  }
}

bool Pageable(const Side& s, const Shape& shape) {
  size_t extent = 0;
  Extent(s, shape, &extent);  // checked by CheckSide already
  return !s.device && !IsPinnedHost(s.base, extent);
}

// Where a side's memory physically is: a device-side pointer may be
// host-located VMM memory, which is host memory mapped for the device.
bool OnDevice(const Side& s) { return s.device && !IsPinnedHost(s.base, 1); }

Link LinkOf(const Side& dst, const Side& src) {
  bool d = OnDevice(dst), s = OnDevice(src);
  if (d && !s) return Link::kHostToDevice;
  if (s && !d) return Link::kDeviceToHost;
  return Link::kNone;
}

// The work a stream runs to copy `shape` from `src` to `dst`: on the copy
// engine of the stream's device when the copy crosses the link.
std::function<void()> CopyWork(Stream* s, Side dst, Side src, Shape shape) {
  auto move = [=] { CopyRows(dst, src, shape); };
  // Untimed (the default): no lookup of where the memory lives.
  if (!LinkTimed(Link::kHostToDevice) && !LinkTimed(Link::kDeviceToHost)) {
    return move;
  }
  Link link = LinkOf(dst, src);
  if (!LinkTimed(link)) return move;
  int device = s->context()->device;
  size_t bytes = shape.width * shape.rows * shape.slices;  // bounded by Extent
  // A GPU's transfer reads its source and writes its destination all
  // through its window: work that touches either meanwhile races with it.
  // So that such a race shows, the destination holds garbage from the
  // window's start and the source is read at its end.
  // (Pageable host memory is written from a staging buffer once the
  // transfer is done: it keeps what it held until then.)
  const bool staged = Pageable(dst, shape);
  auto garbage = [=] {
    if (staged) return;
    for (size_t z = 0; z < shape.slices; ++z) {
      for (size_t y = 0; y < shape.rows; ++y) std::memset(RowAt(dst, y, z), 0xA5, shape.width);
    }
  };
  return [=] { RunOnCopyEngine(device, link, bytes, move, {}, garbage); };
}

// What a copy is, for the trace: its direction as the call names it.
OpLabel CopyLabel(const Side& dst, const Side& src, const Shape& shape) {
  OpLabel label{OpKind::kCopy};
  label.dir = src.device ? (dst.device ? CopyDir::kDtoD : CopyDir::kDtoH)
                         : (dst.device ? CopyDir::kHtoD : CopyDir::kHtoH);
  label.bytes = shape.width * shape.rows * shape.slices;  // bounded by Extent
  return label;
}

// Fills in the pitches of linear copies and checks both sides.
CUresult PrepareCopy(Side* dst, Side* src, const Shape& shape) {
  // Linear copies come without pitches: one packed row.
  for (Side* side : {dst, src}) {
    if (side->pitch == 0 && shape.rows == 1 && shape.slices == 1) {
      side->pitch = shape.width;
    }
    if (side->height == 0 && shape.slices == 1) side->height = shape.rows;
  }
  if (dst->base == nullptr || src->base == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckSide(*dst, shape); r != CUDA_SUCCESS) return r;
  return CheckSide(*src, shape);
}

// A prepared copy as a graph node, described as a 3D copy from and to each
// side's first byte (device memory as CU_MEMORYTYPE_DEVICE, any other as
// CU_MEMORYTYPE_HOST).
NodeSpec CopyNode(const Side& dst, const Side& src, const Shape& shape) {
  NodeSpec node;
  node.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  CUDA_MEMCPY3D& d = node.copy;
  d.srcMemoryType = src.device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  if (src.device) {
    d.srcDevice = reinterpret_cast<CUdeviceptr>(src.base);
  } else {
    d.srcHost = src.base;
  }
  d.srcPitch = src.pitch;
  d.srcHeight = src.height;
  d.dstMemoryType = dst.device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  if (dst.device) {
    d.dstDevice = reinterpret_cast<CUdeviceptr>(dst.base);
  } else {
    d.dstHost = dst.base;
  }
  d.dstPitch = dst.pitch;
  d.dstHeight = dst.height;
  d.WidthInBytes = shape.width;
  d.Height = shape.rows;
  d.Depth = shape.slices;
  node.run = [dst, src, shape](Stream* s) { CopyWork(s, dst, src, shape)(); };
  node.label = CopyLabel(dst, src, shape);
  return node;
}

CUresult Copy(Side dst, Side src, Shape shape, CUstream h, bool async, bool per_thread) {
  // A synchronous copy is a potentially unsafe call during stream capture.
  if (!async) {
    if (CUresult r = CheckUnsafeCall(); r != CUDA_SUCCESS) return r;
  }
  if (shape.width == 0 || shape.rows == 0 || shape.slices == 0) {
    return CUDA_SUCCESS;
  }
  if (CUresult r = PrepareCopy(&dst, &src, shape); r != CUDA_SUCCESS) return r;
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, per_thread, &s); r != CUDA_SUCCESS) return r;
  bool capturing = false;
  if (CUresult r = CaptureCheck(s, &capturing, !async); r != CUDA_SUCCESS) {
    return r;
  }
  if (capturing) {
    NodeSpec node = CopyNode(dst, src, shape);
    node.ctx = s->context();
    return CaptureAdd(s, std::move(node));
  }
  const OpLabel label = CopyLabel(dst, src, shape);
  // The driver's documented host-side behaviour ("API synchronization
  // behavior"): synchronous copies between device ranges do not block the
  // host; any other synchronous copy, and an asynchronous one between two
  // host ranges, completes before the call returns.
  if (!async || (!src.device && !dst.device)) {
    if (src.device && dst.device) {
      Submit(s, CopyWork(s, dst, src, shape), {}, label);
    } else {
      SubmitAndWait(s, CopyWork(s, dst, src, shape), label);
    }
    return CUDA_SUCCESS;
  }
  if (Pageable(src, shape)) {
    // Staged: the source is read now, the destination written in order
    // (the transfer from the staging buffer is what crosses the link).
    auto staged =
        std::make_shared<std::vector<unsigned char>>(shape.width * shape.rows * shape.slices);
    Side packed{staged->data(), shape.width, shape.rows, false};
    CopyRows(packed, src, shape);
    auto work = CopyWork(s, dst, packed, shape);
    Submit(
        s, [work, staged] { work(); }, {}, label);
  } else if (Pageable(dst, shape)) {
    SubmitAndWait(s, CopyWork(s, dst, src, shape), label);
  } else {
    Submit(s, CopyWork(s, dst, src, shape), {}, label);
  }
  return CUDA_SUCCESS;
}

Side Host(const void* p) {
  return Side{static_cast<unsigned char*>(const_cast<void*>(p)), 0, 0, false};
}
Side Dev(CUdeviceptr p) { return Side{reinterpret_cast<unsigned char*>(p), 0, 0, true}; }
// Unified addressing: a pointer is device memory when the driver knows it.
Side Unified(CUdeviceptr p) {
  return Side{reinterpret_cast<unsigned char*>(p), 0, 0, IsDevicePointer(p)};
}
Shape Linear(size_t n) { return Shape{n, 1, 1}; }

// A context a peer copy accepts: a live one, or none (driver 580 on an H200
// copies between two pointers given null contexts: with unified addressing
// the pointers name their memory).
bool PeerContext(CUcontext ctx) {
  return ctx == nullptr || IsLiveContext(reinterpret_cast<Context*>(ctx));
}

CUresult SideOf(CUmemorytype type, const void* host, CUdeviceptr device, CUarray array, Side* out) {
  switch (type) {
    case CU_MEMORYTYPE_HOST:
      *out = Host(host);
      return CUDA_SUCCESS;
    case CU_MEMORYTYPE_DEVICE:
      *out = Dev(device);
      return CUDA_SUCCESS;
    case CU_MEMORYTYPE_UNIFIED:
      *out = Unified(device);
      return CUDA_SUCCESS;
    case CU_MEMORYTYPE_ARRAY:
      // No array is CUDA_ERROR_INVALID_VALUE (driver 580 on an H200); CUDA
      // arrays themselves are not modelled.
      return array == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
    case 0:
      // No type: driver 580 on an H200 refused it for cuMemAlloc memory and
      // made the copy for VMM memory, taking the pointer as a device one.
      if (InVmmMapping(device)) {
        *out = Dev(device);
        return CUDA_SUCCESS;
      }
      return CUDA_ERROR_INVALID_VALUE;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// (z * height + y) * pitch + x, or false on overflow.
bool Offset(size_t z, size_t height, size_t y, size_t pitch, size_t x, size_t* out) {
  size_t rows, bytes;
  return !__builtin_mul_overflow(z, height, &rows) && !__builtin_add_overflow(rows, y, &rows) &&
         !__builtin_mul_overflow(rows, pitch, &bytes) && !__builtin_add_overflow(bytes, x, out);
}

// The sides and shape of a copy described as in cuMemcpy3D.
CUresult Resolve3D(const CUDA_MEMCPY3D* p, Side* out_dst, Side* out_src, Shape* out_shape) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Side src, dst;
  if (CUresult r = SideOf(p->srcMemoryType, p->srcHost, p->srcDevice, p->srcArray, &src);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (CUresult r = SideOf(p->dstMemoryType, p->dstHost, p->dstDevice, p->dstArray, &dst);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (p->srcLOD != 0 || p->dstLOD != 0) return CUDA_ERROR_INVALID_VALUE;
  // "srcPitch must be greater than or equal to WidthInBytes + srcXInBytes",
  // and likewise dstPitch; the heights bound the Y offsets of 3D copies.
  size_t src_row, dst_row;
  if (__builtin_add_overflow(p->WidthInBytes, p->srcXInBytes, &src_row) ||
      __builtin_add_overflow(p->WidthInBytes, p->dstXInBytes, &dst_row) || p->srcPitch < src_row ||
      p->dstPitch < dst_row) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  src.pitch = p->srcPitch;
  dst.pitch = p->dstPitch;
  // The first byte is at (Z * height + Y) * pitch + X with the height as
  // given (the driver's documented start), also for one slice at Z > 0.
  src.height = p->Depth > 1 || p->srcZ > 0 ? p->srcHeight : p->Height + p->srcY;
  dst.height = p->Depth > 1 || p->dstZ > 0 ? p->dstHeight : p->Height + p->dstY;
  if (p->Depth > 1 && (p->srcHeight < p->Height + p->srcY || p->dstHeight < p->Height + p->dstY)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t src_off, dst_off;
  if (!Offset(p->srcZ, src.height, p->srcY, src.pitch, p->srcXInBytes, &src_off) ||
      !Offset(p->dstZ, dst.height, p->dstY, dst.pitch, p->dstXInBytes, &dst_off)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  src.base += src_off;
  dst.base += dst_off;
  *out_dst = dst;
  *out_src = src;
  *out_shape = Shape{p->WidthInBytes, p->Height, p->Depth};
  return CUDA_SUCCESS;
}

CUresult Copy3D(const CUDA_MEMCPY3D* p, CUstream h, bool async, bool pt) {
  if (!async) {
    if (CUresult r = CheckUnsafeCall(); r != CUDA_SUCCESS) return r;
  }
  Side dst, src;
  Shape shape;
  if (CUresult r = Resolve3D(p, &dst, &src, &shape); r != CUDA_SUCCESS) return r;
  return Copy(dst, src, shape, h, async, pt);
}

CUresult Copy2D(const CUDA_MEMCPY2D* p, CUstream h, bool async, bool pt) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_MEMCPY3D q{};
  q.srcXInBytes = p->srcXInBytes;
  q.srcY = p->srcY;
  q.srcMemoryType = p->srcMemoryType;
  q.srcHost = p->srcHost;
  q.srcDevice = p->srcDevice;
  q.srcArray = p->srcArray;
  q.srcPitch = p->srcPitch;
  q.srcHeight = p->Height;
  q.dstXInBytes = p->dstXInBytes;
  q.dstY = p->dstY;
  q.dstMemoryType = p->dstMemoryType;
  q.dstHost = p->dstHost;
  q.dstDevice = p->dstDevice;
  q.dstArray = p->dstArray;
  q.dstPitch = p->dstPitch;
  q.dstHeight = p->Height;
  q.WidthInBytes = p->WidthInBytes;
  q.Height = p->Height;
  q.Depth = 1;
  return Copy3D(&q, h, async, pt);
}

// Memset of `rows` rows of `width` elements of `elem` bytes each, as a
// graph node; false in *empty when there is nothing to set.
CUresult MemsetNode(CUdeviceptr dst, size_t pitch, unsigned value, size_t elem, size_t width,
                    size_t rows, NodeSpec* node) {
  if (dst % elem != 0) return CUDA_ERROR_INVALID_VALUE;
  size_t row_bytes, extent;
  if (__builtin_mul_overflow(width, elem, &row_bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (rows > 1 && pitch < row_bytes) return CUDA_ERROR_INVALID_VALUE;
  if (rows == 1 && pitch < row_bytes) pitch = row_bytes;
  if (__builtin_mul_overflow(rows - 1, pitch, &extent) ||
      __builtin_add_overflow(extent, row_bytes, &extent) || !IsDeviceRange(dst, extent)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  node->type = CU_GRAPH_NODE_TYPE_MEMSET;
  node->memset.dst = dst;
  node->memset.pitch = pitch;
  node->memset.value = value;
  node->memset.elementSize = static_cast<unsigned>(elem);
  node->memset.width = width;
  node->memset.height = rows;
  node->run = [=](Stream*) {
    for (size_t y = 0; y < rows; ++y) {
      auto* row = reinterpret_cast<unsigned char*>(dst + y * pitch);
      if (elem == 1) {
        std::memset(row, static_cast<int>(value & 0xff), width);
        continue;
      }
      for (size_t x = 0; x < width; ++x) {
        std::memcpy(row + x * elem, &value, elem);  // little-endian low bytes
      }
    }
  };
  node->label = OpLabel{OpKind::kMemset};
  node->label.bytes = row_bytes * rows;  // at most extent
  return CUDA_SUCCESS;
}

CUresult Memset(CUdeviceptr dst, size_t pitch, unsigned value, size_t elem, size_t width,
                size_t rows, CUstream h, bool async, bool pt) {
  // A synchronous memset is a potentially unsafe call during stream capture.
  if (!async) {
    if (CUresult r = CheckUnsafeCall(); r != CUDA_SUCCESS) return r;
  }
  if (width == 0 || rows == 0) return CUDA_SUCCESS;
  if (rows == 1) pitch = 0;
  NodeSpec node;
  if (CUresult r = MemsetNode(dst, pitch, value, elem, width, rows, &node); r != CUDA_SUCCESS) {
    return r;
  }
  Stream* s = nullptr;
  if (CUresult r = ResolveStream(h, pt, &s); r != CUDA_SUCCESS) return r;
  bool capturing = false;
  if (CUresult r = CaptureCheck(s, &capturing, !async); r != CUDA_SUCCESS) {
    return r;
  }
  node.ctx = s->context();
  if (capturing) return CaptureAdd(s, std::move(node));
  // Synchronous memsets of device memory do not block the host either.
  Submit(
      s, [run = std::move(node.run), s] { run(s); }, {}, node.label);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult MakeCopyNode(const CUDA_MEMCPY3D* p, NodeSpec* out) {
  Side dst, src;
  Shape shape;
  if (CUresult r = Resolve3D(p, &dst, &src, &shape); r != CUDA_SUCCESS) return r;
  if (shape.width == 0 || shape.rows == 0 || shape.slices == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = PrepareCopy(&dst, &src, shape); r != CUDA_SUCCESS) return r;
  *out = CopyNode(dst, src, shape);
  out->copy = *p;  // read back as given
  return CUDA_SUCCESS;
}

CUresult MakeMemsetNode(const CUDA_MEMSET_NODE_PARAMS* p, NodeSpec* out) {
  if (p == nullptr || p->width == 0 || p->height == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return MemsetNode(p->dst, p->height == 1 ? 0 : p->pitch, p->value, p->elementSize, p->width,
                    p->height, out);
}

}  // namespace fakecuda

using namespace fakecuda;  // NOLINT: the exported C API below

// Synchronous entry points come as a legacy name and a _ptds twin;
// asynchronous ones as a legacy name and a _ptsz twin.
#define FAKECUDA_SYNC(name, params, ...)        \
  FAKECUDA_EXPORT CUresult name params {        \
    FAKECUDA_ENTER(#name);                      \
    constexpr bool kPerThread = false;          \
    return __VA_ARGS__;                         \
  }                                             \
  FAKECUDA_EXPORT CUresult name##_ptds params { \
    FAKECUDA_ENTER(#name "_ptds");              \
    constexpr bool kPerThread = true;           \
    return __VA_ARGS__;                         \
  }
#define FAKECUDA_ASYNC(name, params, ...)       \
  FAKECUDA_EXPORT CUresult name params {        \
    FAKECUDA_ENTER(#name);                      \
    constexpr bool kPerThread = false;          \
    return __VA_ARGS__;                         \
  }                                             \
  FAKECUDA_EXPORT CUresult name##_ptsz params { \
    FAKECUDA_ENTER(#name "_ptsz");              \
    constexpr bool kPerThread = true;           \
    return __VA_ARGS__;                         \
  }

FAKECUDA_SYNC(cuMemcpyHtoD_v2, (CUdeviceptr dst, const void* src, size_t n),
              Copy(Dev(dst), Host(src), Linear(n), nullptr, false, kPerThread))
FAKECUDA_SYNC(cuMemcpyDtoH_v2, (void* dst, CUdeviceptr src, size_t n),
              Copy(Host(dst), Dev(src), Linear(n), nullptr, false, kPerThread))
FAKECUDA_SYNC(cuMemcpyDtoD_v2, (CUdeviceptr dst, CUdeviceptr src, size_t n),
              Copy(Dev(dst), Dev(src), Linear(n), nullptr, false, kPerThread))
FAKECUDA_SYNC(cuMemcpy, (CUdeviceptr dst, CUdeviceptr src, size_t n),
              Copy(Unified(dst), Unified(src), Linear(n), nullptr, false, kPerThread))
FAKECUDA_SYNC(cuMemcpyPeer,
              (CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n),
              (PeerContext(dst_ctx) && PeerContext(src_ctx))
                  ? Copy(Dev(dst), Dev(src), Linear(n), nullptr, false, kPerThread)
                  : CUDA_ERROR_INVALID_CONTEXT)
FAKECUDA_SYNC(cuMemcpy2D_v2, (const CUDA_MEMCPY2D* p), Copy2D(p, nullptr, false, kPerThread))
FAKECUDA_SYNC(cuMemcpy2DUnaligned_v2, (const CUDA_MEMCPY2D* p),
              Copy2D(p, nullptr, false, kPerThread))
FAKECUDA_SYNC(cuMemcpy3D_v2, (const CUDA_MEMCPY3D* p), Copy3D(p, nullptr, false, kPerThread))

FAKECUDA_ASYNC(cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void* src, size_t n, CUstream s),
               Copy(Dev(dst), Host(src), Linear(n), s, true, kPerThread))
FAKECUDA_ASYNC(cuMemcpyDtoHAsync_v2, (void* dst, CUdeviceptr src, size_t n, CUstream s),
               Copy(Host(dst), Dev(src), Linear(n), s, true, kPerThread))
FAKECUDA_ASYNC(cuMemcpyDtoDAsync_v2, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s),
               Copy(Dev(dst), Dev(src), Linear(n), s, true, kPerThread))
FAKECUDA_ASYNC(cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s),
               Copy(Unified(dst), Unified(src), Linear(n), s, true, kPerThread))
FAKECUDA_ASYNC(cuMemcpyPeerAsync,
               (CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                CUstream s),
               (PeerContext(dst_ctx) && PeerContext(src_ctx))
                   ? Copy(Dev(dst), Dev(src), Linear(n), s, true, kPerThread)
                   : CUDA_ERROR_INVALID_CONTEXT)
FAKECUDA_ASYNC(cuMemcpy2DAsync_v2, (const CUDA_MEMCPY2D* p, CUstream s),
               Copy2D(p, s, true, kPerThread))
FAKECUDA_ASYNC(cuMemcpy3DAsync_v2, (const CUDA_MEMCPY3D* p, CUstream s),
               Copy3D(p, s, true, kPerThread))

FAKECUDA_SYNC(cuMemsetD8_v2, (CUdeviceptr d, unsigned char v, size_t n),
              Memset(d, 0, v, 1, n, 1, nullptr, false, kPerThread))
FAKECUDA_SYNC(cuMemsetD16_v2, (CUdeviceptr d, unsigned short v, size_t n),
              Memset(d, 0, v, 2, n, 1, nullptr, false, kPerThread))
FAKECUDA_SYNC(cuMemsetD32_v2, (CUdeviceptr d, unsigned int v, size_t n),
              Memset(d, 0, v, 4, n, 1, nullptr, false, kPerThread))
FAKECUDA_SYNC(cuMemsetD2D8_v2, (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h),
              Memset(d, pitch, v, 1, w, h, nullptr, false, kPerThread))
FAKECUDA_SYNC(cuMemsetD2D16_v2, (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h),
              Memset(d, pitch, v, 2, w, h, nullptr, false, kPerThread))
FAKECUDA_SYNC(cuMemsetD2D32_v2, (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h),
              Memset(d, pitch, v, 4, w, h, nullptr, false, kPerThread))

FAKECUDA_ASYNC(cuMemsetD8Async, (CUdeviceptr d, unsigned char v, size_t n, CUstream s),
               Memset(d, 0, v, 1, n, 1, s, true, kPerThread))
FAKECUDA_ASYNC(cuMemsetD16Async, (CUdeviceptr d, unsigned short v, size_t n, CUstream s),
               Memset(d, 0, v, 2, n, 1, s, true, kPerThread))
FAKECUDA_ASYNC(cuMemsetD32Async, (CUdeviceptr d, unsigned int v, size_t n, CUstream s),
               Memset(d, 0, v, 4, n, 1, s, true, kPerThread))
FAKECUDA_ASYNC(cuMemsetD2D8Async,
               (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s),
               Memset(d, pitch, v, 1, w, h, s, true, kPerThread))
FAKECUDA_ASYNC(cuMemsetD2D16Async,
               (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s),
               Memset(d, pitch, v, 2, w, h, s, true, kPerThread))
FAKECUDA_ASYNC(cuMemsetD2D32Async,
               (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s),
               Memset(d, pitch, v, 4, w, h, s, true, kPerThread))
