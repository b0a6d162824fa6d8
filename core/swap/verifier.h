// Verifier: STENSOR_VERIFY's check of a clean drop. Version control drops a
// buffer's device copy without a transfer when its host copy is current
// (host version == device version); that is only right if access inference
// saw every write. Before such a drop the MemoryManager asks the Verifier
// whether the device contents still equal the host copy:
//   copy: both are read back to the host in chunks and compared byte by
//         byte (a device-to-host transfer of the buffer: for testing);
//   hash: a hash kernel reads the device buffer, and its hash is compared
//         with the one RecordHash took when the host copy was made (a read
//         of device memory instead of a transfer).
// The hash kernel (verify_kernels.cu) is embedded as a fatbin; its host twin
// (verify_kernels_host.cc) is embedded as a host-kernel module for the fake
// driver, loaded when the driver rejects the fatbin. When neither loads, or
// a hash cannot be taken, the check falls back to comparing bytes (logged
// once): never to an unchecked drop. Every driver call is checked; a check
// that cannot be made answers kError, and the caller copies instead.
//
// The host copy is either host-located VMM memory mapped at a device VA
// (readable by the device) or pinned host memory.
//
// Thread-safety: not thread-safe; the MemoryManager calls it under its lock.
// The driver's context for `device` must be current.
#ifndef STENSOR_CORE_SWAP_VERIFIER_H_
#define STENSOR_CORE_SWAP_VERIFIER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/base/config.h"
#include "core/driver/driver.h"

namespace stensor {

class Verifier {
 public:
  // A module image to try with cuModuleLoadData.
  struct Image {
    const void* data;
    size_t size;  // 0: absent (nvcc was not there at build time)
    const char* what;
  };
  // The embedded images in the order tried: the fatbin, the host twin.
  static std::vector<Image> EmbeddedImages();

  // The host copy of a buffer: exactly one of the two is set.
  struct HostCopy {
    CUdeviceptr va = 0;         // host-located VMM memory mapped here
    const void* ptr = nullptr;  // pinned host memory
  };

  enum class Result { kMatch, kMismatch, kError };

  // `mode` is kCopy or kHash; `driver` outlives the verifier.
  Verifier(VerifyMode mode, const Driver* driver, std::vector<Image> images = EmbeddedImages());
  ~Verifier();
  Verifier(const Verifier&) = delete;
  Verifier& operator=(const Verifier&) = delete;

  VerifyMode mode() const { return mode_; }

  // Hash mode, when a host copy of [va, va+size) was just made: the hash to
  // keep with it. nullopt in copy mode or when no hash could be taken (the
  // drop is then checked byte by byte).
  std::optional<uint64_t> RecordHash(int device, CUdeviceptr va, uint64_t size, CUstream stream);

  // Before a clean drop of [va, va+size), whose host copy is `host` and
  // whose hash (hash mode) is `recorded`. Work runs on `stream` and is
  // waited for.
  Result Check(int device, CUdeviceptr va, uint64_t size, const HostCopy& host,
               std::optional<uint64_t> recorded, CUstream stream);

  // The parts, for tests. Hash of the device range by the hash kernel.
  absl::StatusOr<uint64_t> DeviceHash(int device, CUdeviceptr va, uint64_t size, CUstream stream);
  // Whether the device range equals the host copy, byte for byte.
  absl::StatusOr<bool> CompareBytes(CUdeviceptr va, uint64_t size, const HostCopy& host,
                                    CUstream stream);

  // Which image the hash kernel came from on `device` ("" before the first
  // hash, or when none loaded).
  const char* loaded_image(int device) const;

 private:
  struct Kernel {
    bool tried = false;
    CUmodule module = nullptr;  // null: none loaded
    CUfunction function = nullptr;
    CUdeviceptr sum = 0;  // the kernel's 8-byte result
    const char* image = "";
  };

  // The hash kernel on `device`, loaded on first use; null when it cannot be.
  const Kernel* KernelFor(int device);
  // Waits on the host for the work queued on `stream` so far.
  absl::Status Wait(CUstream stream);
  // Logs once that hashing is off and bytes are compared instead.
  void WarnFallback(const absl::Status& why);

  const VerifyMode mode_;
  const Driver* const driver_;
  const std::vector<Image> images_;
  std::map<int, Kernel> kernels_;
  CUevent event_ = nullptr;
  bool warned_ = false;
  // Staging for CompareBytes, one chunk per side.
  std::vector<unsigned char> device_chunk_, host_chunk_;
};

}  // namespace stensor

#endif  // STENSOR_CORE_SWAP_VERIFIER_H_
