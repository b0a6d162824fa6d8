// NvmlDevices: which CUDA device an NVML device handle is, and what NVML
// should report of its memory under stensor's cap.
//
// NVML numbers every physical device and ignores CUDA_VISIBLE_DEVICES; CUDA
// numbers the visible ones in its own order. A handle is matched to a CUDA
// ordinal by UUID (nvmlDeviceGetUUID against cuDeviceGetUuid_v2), so a
// device CUDA does not see, and a MIG instance (whose CUDA UUID is the
// instance's, not the GPU's), matches nothing and NVML's answer stands.
//
// Nothing here loads NVML, initialises CUDA or builds stensor's state: a
// process that has not initialised CUDA (it may be about to fork workers
// that will) gets NVML's own answer.
//
// Thread-safety: any thread. CUDA's device list, read once after CUDA is
// initialised, is guarded by mu_.
#ifndef STENSOR_INTERPOSE_NVML_DEVICES_H_
#define STENSOR_INTERPOSE_NVML_DEVICES_H_

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/base/mutex.h"
#include "core/driver/driver.h"
#include "third_party/nvml/nvml_types.h"

namespace stensor {

class NvmlDevices {
 public:
  // The process's one instance.
  static NvmlDevices& Get();

  // The NVML entry point `name` of the libnvidia-ml.so.1 this process has
  // loaded (by the program, linked or dlopen'ed), or null when none is.
  static void* Real(const char* name);

  // A device under the cap, as cuMemGetInfo reports it: total the cap, used
  // what stensor charges to it.
  struct Capped {
    uint64_t total = 0;
    uint64_t used = 0;
  };
  // `device`'s memory under the cap, or nullopt where NVML's answer stands:
  // CUDA not in use, no cap on that device, or no CUDA device matches.
  std::optional<Capped> CappedMemory(nvmlDevice_t device) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Uuid = std::array<unsigned char, 16>;

  // The CUDA ordinal whose device has `uuid`, or -1.
  int OrdinalOf(const Driver& driver, const Uuid& uuid) ABSL_LOCKS_EXCLUDED(mu_);

  Mutex mu_;
  bool listed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Uuid> uuids_ ABSL_GUARDED_BY(mu_);  // by CUDA ordinal
};

}  // namespace stensor

#endif  // STENSOR_INTERPOSE_NVML_DEVICES_H_
