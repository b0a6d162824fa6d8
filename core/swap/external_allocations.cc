#include "core/swap/external_allocations.h"

#include <cstdint>
#include <optional>

namespace stensor {

std::optional<uint64_t> PitchAllocationCharge(uint64_t width, uint64_t height) {
  uint64_t charge;
  if (width > UINT64_MAX - 511 ||
      __builtin_mul_overflow((width + 511) / 512 * 512, height, &charge)) {
    return std::nullopt;
  }
  return charge;
}

void CappedMemInfo(MemoryManager& memory, const Driver& driver, size_t* free_bytes, size_t* total) {
  // The manager exists only where the driver has cuCtxGetDevice
  // (MemoryManager::MissingEntryPoints).
  CUdevice device = 0;
  if (driver.cuCtxGetDevice(&device) != CUDA_SUCCESS) return;
  memory.MemInfo(device, free_bytes, total);
}

}  // namespace stensor
