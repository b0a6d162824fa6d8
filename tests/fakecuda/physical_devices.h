// What the fake driver and the fake NVML (tests/fakenvml) both say of the
// fake's physical devices: their UUIDs and PCI buses, and the byte counts
// their FAKECUDA_* options take. NVML numbers the physical devices and
// ignores CUDA_VISIBLE_DEVICES; the driver renumbers the visible ones.
//
// Thread-safety: pure functions.
#ifndef STENSOR_TESTS_FAKECUDA_PHYSICAL_DEVICES_H_
#define STENSOR_TESTS_FAKECUDA_PHYSICAL_DEVICES_H_

#include <cstddef>
#include <string>

namespace fakecuda {

// A positive byte count with an optional K|M|G or KiB|MiB|GiB suffix.
bool ParseSize(const char* text, size_t* out);

// Physical device `p`'s UUID: facecd1<p>-0000-0000-6661-6b6563756461
// ("fakecuda"), distinct per device from its eighth hex digit on.
void PhysicalUuid(int p, unsigned char bytes[16]);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it.
std::string UuidText(int p);

// Physical device `p` sits alone on this PCI bus of domain 0 (device 0,
// function 0).
inline unsigned PhysicalPciBus(int p) { return static_cast<unsigned>(p) + 1; }

}  // namespace fakecuda

#endif  // STENSOR_TESTS_FAKECUDA_PHYSICAL_DEVICES_H_
