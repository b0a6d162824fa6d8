// The host twin of verify_kernels.cu for the fake driver: the same
// signature (so the same mangled name), the whole grid's work in one call.
// Built into a host-kernel module that libstensor.so embeds and loads with
// cuModuleLoadData when the driver rejects the fatbin.
#include "core/swap/verify_hash.h"
#include "tests/fakecuda/fake_kernel.h"

namespace stensor_verify {

FAKECUDA_KERNEL(hash_sum, const unsigned char* data, unsigned long long size,
                unsigned long long* sum) {
  u64 acc = 0;
  for (u64 i = 0; i < Words(size); ++i) acc += Term(Word(data, size, i), i);
  *sum += acc;
}

}  // namespace stensor_verify
