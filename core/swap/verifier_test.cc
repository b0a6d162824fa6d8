// Tests for core/verifier on the fake driver: the embedded host twin of the
// hash kernel computes exactly the host reference hash (the same definition,
// verify_hash.h, that the CUDA kernel uses), copy and hash checks find a
// changed byte with the host copy in host-located VMM memory or in pinned
// memory, and every driver call the verifier makes can fail without a
// mismatch going unseen: a hash that cannot be taken falls back to comparing
// bytes, and a comparison that cannot be made answers kError (the caller
// then copies). The embedded fatbin is checked for its sm_80/sm_90 cubins
// and PTX, and the fake must reject it and a cubin as invalid images.
#include "core/swap/verifier.h"

#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/base/config.h"
#include "core/driver/driver.h"
#include "core/swap/verify_hash.h"
#include "gtest/gtest.h"
#include "tests/fakecuda/fakecuda.h"

namespace stensor {
namespace {

#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS) << #expr

using Result = Verifier::Result;
constexpr uint64_t kGranule = uint64_t{2} << 20;

std::vector<unsigned char> Bytes(uint64_t size, uint64_t seed) {
  std::vector<unsigned char> bytes(size);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : bytes) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<unsigned char>(x);
  }
  return bytes;
}

class VerifierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    CUdevice dev;
    ASSERT_CU(cuDeviceGet(&dev, 0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, dev));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(handle, nullptr);
    ASSERT_GT(LoadDriver(handle, &dlsym, &driver_), 0);
    ASSERT_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING));
  }
  void TearDown() override {
    fakecuda_clear_failures();
    for (CUdeviceptr p : device_) cuMemFree_v2(p);
    for (void* p : pinned_) cuMemFreeHost(p);
    cuStreamDestroy_v2(stream_);
    cuDevicePrimaryCtxRelease_v2(0);
  }

  CUdeviceptr Device(const std::vector<unsigned char>& bytes) {
    CUdeviceptr p = 0;
    EXPECT_EQ(cuMemAlloc_v2(&p, std::max<size_t>(bytes.size(), 1)), CUDA_SUCCESS);
    if (!bytes.empty()) {
      EXPECT_EQ(cuMemcpyHtoD_v2(p, bytes.data(), bytes.size()), CUDA_SUCCESS);
    }
    device_.push_back(p);
    return p;
  }
  Verifier::HostCopy Pinned(const std::vector<unsigned char>& bytes) {
    void* p = nullptr;
    EXPECT_EQ(cuMemHostAlloc(&p, std::max<size_t>(bytes.size(), 1), 0), CUDA_SUCCESS);
    std::memcpy(p, bytes.data(), bytes.size());
    pinned_.push_back(p);
    return {0, p};
  }
  // Host-located VMM memory mapped at a device VA, as the swap path makes.
  Verifier::HostCopy HostVmm(const std::vector<unsigned char>& bytes) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    EXPECT_EQ(cuMemCreate(&h, kGranule, &prop, 0), CUDA_SUCCESS);
    EXPECT_EQ(cuMemAddressReserve(&va, kGranule, 0, 0, 0), CUDA_SUCCESS);
    EXPECT_EQ(cuMemMap(va, kGranule, 0, h, 0), CUDA_SUCCESS);
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    EXPECT_EQ(cuMemSetAccess(va, kGranule, &access, 1), CUDA_SUCCESS);
    EXPECT_EQ(cuMemcpyHtoD_v2(va, bytes.data(), bytes.size()), CUDA_SUCCESS);
    return {va, nullptr};
  }

  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  Driver driver_;
  std::vector<CUdeviceptr> device_;
  std::vector<void*> pinned_;
};

TEST_F(VerifierTest, HostTwinHashesExactlyAsTheHostReference) {
  Verifier verifier(VerifyMode::kHash, &driver_);
  for (uint64_t size : {uint64_t{1}, uint64_t{7}, uint64_t{8}, uint64_t{9}, uint64_t{4097},
                        kGranule, 3 * kGranule + 5}) {
    SCOPED_TRACE(size);
    std::vector<unsigned char> bytes = Bytes(size, size);
    absl::StatusOr<uint64_t> hash = verifier.DeviceHash(0, Device(bytes), size, stream_);
    ASSERT_TRUE(hash.ok()) << hash.status();
    EXPECT_EQ(*hash, stensor_verify::HashBytes(bytes.data(), size));
  }
  // The fake rejects the fatbin (a GPU image) and runs the host twin.
  EXPECT_STREQ(verifier.loaded_image(0), "host twin");
}

TEST_F(VerifierTest, HashSeesEveryByteAndItsPosition) {
  std::vector<unsigned char> bytes = Bytes(4096 + 3, 7);
  const uint64_t base = stensor_verify::HashBytes(bytes.data(), bytes.size());
  for (size_t i : {size_t{0}, size_t{5}, size_t{4096}, bytes.size() - 1}) {
    std::vector<unsigned char> changed = bytes;
    changed[i] ^= 1;
    EXPECT_NE(stensor_verify::HashBytes(changed.data(), changed.size()), base) << i;
  }
  std::vector<unsigned char> swapped = bytes;
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  EXPECT_NE(stensor_verify::HashBytes(swapped.data(), swapped.size()), base);
  // A trailing zero byte is not the same buffer.
  std::vector<unsigned char> longer = bytes;
  longer.push_back(0);
  EXPECT_NE(stensor_verify::HashBytes(longer.data(), longer.size()), base);
}

TEST_F(VerifierTest, CopyAndHashFindAChangedByteWithEitherKindOfHostCopy) {
  const uint64_t size = kGranule - 24;
  std::vector<unsigned char> bytes = Bytes(size, 3);
  for (VerifyMode mode : {VerifyMode::kCopy, VerifyMode::kHash}) {
    for (bool vmm : {true, false}) {
      SCOPED_TRACE(testing::Message() << "hash " << (mode == VerifyMode::kHash) << " vmm " << vmm);
      Verifier verifier(mode, &driver_);
      CUdeviceptr d = Device(bytes);
      Verifier::HostCopy host = vmm ? HostVmm(bytes) : Pinned(bytes);
      std::optional<uint64_t> recorded = verifier.RecordHash(0, d, size, stream_);
      EXPECT_EQ(recorded.has_value(), mode == VerifyMode::kHash);
      EXPECT_EQ(verifier.Check(0, d, size, host, recorded, stream_), Result::kMatch);
      // A write access inference did not see, in the last byte.
      unsigned char last = bytes[size - 1] ^ 0x80;
      ASSERT_CU(cuMemcpyHtoD_v2(d + size - 1, &last, 1));
      EXPECT_EQ(verifier.Check(0, d, size, host, recorded, stream_), Result::kMismatch);
    }
  }
}

TEST_F(VerifierTest, WithoutAHashKernelHashModeComparesBytes) {
  std::vector<unsigned char> bytes = Bytes(4096, 11);
  // No image at all, then images the fake rejects.
  const char junk[64] = "not a module";
  for (std::vector<Verifier::Image> images :
       {std::vector<Verifier::Image>{},
        std::vector<Verifier::Image>{{junk, sizeof(junk), "junk"}, {junk, 0, "empty"}}}) {
    Verifier verifier(VerifyMode::kHash, &driver_, images);
    CUdeviceptr d = Device(bytes);
    Verifier::HostCopy host = Pinned(bytes);
    EXPECT_FALSE(verifier.DeviceHash(0, d, bytes.size(), stream_).ok());
    EXPECT_EQ(verifier.RecordHash(0, d, bytes.size(), stream_), std::nullopt);
    EXPECT_EQ(verifier.Check(0, d, bytes.size(), host, std::nullopt, stream_), Result::kMatch);
    // Even with a recorded hash it cannot check, bytes decide.
    EXPECT_EQ(verifier.Check(0, d, bytes.size(), host, uint64_t{42}, stream_), Result::kMatch);
    unsigned char x = bytes[0] ^ 1;
    ASSERT_CU(cuMemcpyHtoD_v2(d, &x, 1));
    EXPECT_EQ(verifier.Check(0, d, bytes.size(), host, uint64_t{42}, stream_), Result::kMismatch);
    EXPECT_STREQ(verifier.loaded_image(0), "");
  }
}

TEST_F(VerifierTest, TheFakeRejectsTheFatbinAndACubin) {
  std::vector<Verifier::Image> images = Verifier::EmbeddedImages();
  ASSERT_EQ(images.size(), 2u);
  CUmodule m = nullptr;
  if (images[0].size > 0) {
    uint32_t magic;
    std::memcpy(&magic, images[0].data, sizeof(magic));
    EXPECT_EQ(magic, 0xBA55ED50u) << "not a fatbin";
    EXPECT_EQ(cuModuleLoadData(&m, images[0].data), CUDA_ERROR_INVALID_IMAGE);
  }
  // An ELF header for EM_CUDA (190), as a cubin starts.
  unsigned char cubin[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
  cubin[16] = 2;    // ET_EXEC
  cubin[18] = 190;  // EM_CUDA
  EXPECT_EQ(cuModuleLoadData(&m, cubin), CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(cuModuleLoadData(&m, nullptr), CUDA_ERROR_INVALID_VALUE);
  ASSERT_CU(cuModuleLoadData(&m, images[1].data));
  CUfunction f = nullptr;
  ASSERT_CU(cuModuleGetFunction(&f, m, "_ZN14stensor_verify8hash_sumEPKhyPy"));
  ASSERT_CU(cuModuleUnload(m));
}

// The fatbin nvcc built holds cubins for sm_80 and sm_90 and PTX for
// compute_90, each with the kernel the verifier looks up. Where nvcc was
// absent at build time the fatbin is empty and this says so.
TEST_F(VerifierTest, FatbinHoldsSm80AndSm90CubinsAndPtx) {
  Verifier::Image fatbin = Verifier::EmbeddedImages()[0];
  if (fatbin.size == 0) GTEST_SKIP() << "built without nvcc: no fatbin";
  const auto* bytes = static_cast<const unsigned char*>(fatbin.data);
  auto u16 = [&](size_t at) {
    uint16_t v;
    std::memcpy(&v, bytes + at, 2);
    return v;
  };
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, bytes + at, 4);
    return v;
  };
  auto u64 = [&](size_t at) {
    uint64_t v;
    std::memcpy(&v, bytes + at, 8);
    return v;
  };
  // Header: magic, version, header size, size of the entries.
  ASSERT_EQ(u32(0), 0xBA55ED50u);
  const size_t header = u16(6);
  ASSERT_EQ(header + u64(8), fatbin.size);
  std::set<std::pair<int, int>> entries;  // (kind: 1 PTX, 2 ELF; sm)
  for (size_t at = header; at < fatbin.size;) {
    const uint16_t kind = u16(at);
    const uint32_t entry_header = u32(at + 4);
    const uint64_t payload = u64(at + 8);
    entries.insert({kind, static_cast<int>(u32(at + 28))});
    if (kind == 2) {
      std::string cubin(reinterpret_cast<const char*>(bytes + at + entry_header), payload);
      EXPECT_NE(cubin.find("_ZN14stensor_verify8hash_sumEPKhyPy"), std::string::npos);
    }
    at += entry_header + payload;
  }
  EXPECT_EQ(entries, (std::set<std::pair<int, int>>{{2, 80}, {2, 90}, {1, 90}}));
}

// Each driver call of a hash check fails once: the check still finds the
// mismatch (bytes compared instead) or, when the comparison itself cannot
// be made, answers kError; never kMatch for a changed buffer.
TEST_F(VerifierTest, EveryDriverCallCanFail) {
  std::vector<unsigned char> bytes = Bytes(kGranule, 5);
  const char* kCalls[] = {"cuModuleLoadData", "cuModuleGetFunction", "cuMemAlloc_v2",
                          "cuMemsetD8Async",  "cuLaunchKernel",      "cuMemcpyDtoHAsync_v2",
                          "cuEventCreate",    "cuEventRecord",       "cuEventSynchronize"};
  for (const char* call : kCalls) {
    for (int nth = 1; nth <= 3; ++nth) {
      SCOPED_TRACE(testing::Message() << call << " #" << nth);
      Verifier verifier(VerifyMode::kHash, &driver_);
      CUdeviceptr d = Device(bytes);
      Verifier::HostCopy host = HostVmm(bytes);
      std::optional<uint64_t> recorded = verifier.RecordHash(0, d, bytes.size(), stream_);
      unsigned char x = bytes[100] ^ 4;
      ASSERT_CU(cuMemcpyHtoD_v2(d + 100, &x, 1));
      fakecuda_fail_call(call, nth, CUDA_ERROR_UNKNOWN);
      Result r = verifier.Check(0, d, bytes.size(), host, recorded, stream_);
      EXPECT_NE(r, Result::kMatch);
      fakecuda_clear_failures();
      // A retry after the failure sees the truth.
      EXPECT_EQ(verifier.Check(0, d, bytes.size(), host, recorded, stream_), Result::kMismatch);
      ASSERT_CU(cuMemcpyHtoD_v2(d + 100, &bytes[100], 1));
      EXPECT_EQ(verifier.Check(0, d, bytes.size(), host, recorded, stream_), Result::kMatch);
    }
  }
}

// A failure while the hash is recorded leaves no hash: the drop is then
// checked byte by byte.
TEST_F(VerifierTest, AFailedRecordLeavesNoHash) {
  std::vector<unsigned char> bytes = Bytes(4096, 9);
  Verifier verifier(VerifyMode::kHash, &driver_);
  CUdeviceptr d = Device(bytes);
  ASSERT_TRUE(verifier.RecordHash(0, d, bytes.size(), stream_).has_value());  // loads the kernel
  fakecuda_fail_call("cuLaunchKernel", 1, CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(verifier.RecordHash(0, d, bytes.size(), stream_), std::nullopt);
}

}  // namespace
}  // namespace stensor
