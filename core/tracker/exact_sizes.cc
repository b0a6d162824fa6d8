#include "core/tracker/exact_sizes.h"

#include <cstring>
#include <optional>

namespace stensor {

ExactSizes::ExactSizes(const Driver* driver, const MemoryManager* memory)
    : driver_(driver), memory_(memory) {}

namespace {

// Ids stensor answers for CU_POINTER_ATTRIBUTE_BUFFER_ID: stable across
// swaps (the driver's id would change with each new physical memory), in a
// range apart from the driver's own counter.
constexpr unsigned long long kBufferIdBase = 1ull << 62;

// Bytes written for the attributes stensor answers itself; 0 for the rest,
// which the driver answers about the buffer's current mapping.
size_t OwnAttributeSize(CUpointer_attribute attribute) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      return sizeof(CUcontext);
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      return sizeof(void*);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      return sizeof(CUdeviceptr);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_MAPPED:
      return sizeof(unsigned int);
    default:
      return 0;
  }
}

template <typename T>
CUresult Put(void* data, T value) {
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(data, &value, sizeof(value));
  return CUDA_SUCCESS;
}

// One attribute of `ptr` in buffer `v`, as for a cuMemAlloc allocation of
// v.size bytes; `live` is false past that size or after cuMemFree, where the
// driver knows no allocation.
CUresult OwnAttribute(const MemoryManager::BufferView& v, bool live, CUdeviceptr ptr,
                      CUpointer_attribute attribute, void* data) {
  if (!live) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      return Put(data, v.context);
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      return Put(data, static_cast<unsigned int>(CU_MEMORYTYPE_DEVICE));
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      return Put(data, ptr);
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      return CUDA_ERROR_INVALID_VALUE;  // device memory
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      return Put(data, static_cast<unsigned long long>(kBufferIdBase | v.id));
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      return Put(data, 0u);
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      return Put(data, v.device);
    // The memory is VMM memory, which cuIpcGetMemHandle refuses: saying so
    // lets a program that asks first (NCCL does) take another path.
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      return Put(data, 0u);
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      return Put(data, v.base);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      return Put(data, static_cast<size_t>(v.size));
    // Always usable: a swapped-out buffer comes back before any use.
    case CU_POINTER_ATTRIBUTE_MAPPED:
      return Put(data, 1u);
    default:
      return CUDA_ERROR_NOT_SUPPORTED;  // not reached: OwnAttributeSize is 0
  }
}

}  // namespace

CUresult ExactSizes::CheckExtents(uint64_t dst, uint64_t dst_extent, uint64_t src,
                                  uint64_t src_extent) const {
  if (!memory_) return CUDA_SUCCESS;
  if (CUresult r = memory_->CheckRange(dst, dst_extent); r != CUDA_SUCCESS) return r;
  return memory_->CheckRange(src, src_extent);
}

CUresult ExactSizes::CheckUntypedCopy(uint64_t src, uint64_t dst) const {
  if (memory_ && (memory_->Find(src) || memory_->Find(dst))) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

bool ExactSizes::AddressRange(CUdeviceptr ptr, CUdeviceptr* base, size_t* size,
                              CUresult* result) const {
  if (!memory_) return false;
  std::optional<MemoryManager::BufferView> v = memory_->Find(ptr);
  if (!v) return false;
  if (v->freed || ptr - v->base >= v->size) {
    *result = CUDA_ERROR_NOT_FOUND;  // as past the end of a cuMemAlloc allocation
    return true;
  }
  if (base != nullptr) *base = v->base;
  if (size != nullptr) *size = v->size;
  *result = CUDA_SUCCESS;
  return true;
}

bool ExactSizes::PointerAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr,
                                  CUresult* result) const {
  if (!memory_ || OwnAttributeSize(attribute) == 0) return false;
  std::optional<MemoryManager::BufferView> v = memory_->Find(ptr);
  if (!v) return false;
  *result = OwnAttribute(*v, !v->freed && ptr - v->base < v->size, ptr, attribute, data);
  return true;
}

bool ExactSizes::PointerAttributes(unsigned int count, CUpointer_attribute* attributes, void** data,
                                   CUdeviceptr ptr, CUresult* result) const {
  // No attributes, or no arrays: the driver's error (count 0 is
  // CUDA_ERROR_INVALID_VALUE on a GPU).
  if (!memory_ || count == 0 || attributes == nullptr || data == nullptr) return false;
  std::optional<MemoryManager::BufferView> v = memory_->Find(ptr);
  if (!v) return false;
  bool live = !v->freed && ptr - v->base < v->size;
  for (unsigned int i = 0; i < count; ++i) {
    size_t bytes = OwnAttributeSize(attributes[i]);
    CUresult r;
    if (bytes == 0) {
      // Not answered here: the driver's answer about the current mapping.
      r = driver_->cuPointerGetAttributes != nullptr
              ? driver_->cuPointerGetAttributes(1, &attributes[i], &data[i], ptr)
              : CUDA_ERROR_NOT_SUPPORTED;
    } else if (data[i] == nullptr) {
      r = CUDA_ERROR_INVALID_VALUE;
    } else {
      r = OwnAttribute(*v, live, ptr, attributes[i], data[i]);
      // The plural form assigns "default NULL values" where the singular
      // one would fail on the pointer.
      if (r == CUDA_ERROR_INVALID_VALUE) {
        std::memset(data[i], 0, bytes);
        r = CUDA_SUCCESS;
      }
    }
    if (r != CUDA_SUCCESS) {
      *result = r;
      return true;
    }
  }
  *result = CUDA_SUCCESS;
  return true;
}

}  // namespace stensor
