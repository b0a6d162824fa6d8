// The fake driver's environment: host-located VMM switched off, failures
// armed from FAKECUDA_FAIL, malformed values rejected by name, and
// CUDA_VISIBLE_DEVICES. The BUILD target sets FAKECUDA_HOST_VMM=0 and
// FAKECUDA_FAIL for this binary.
#include <cuda.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

#define ASSERT_CU(expr) ASSERT_EQ((expr), CUDA_SUCCESS) << #expr

class FakeCudaEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_CU(cuInit(0));
    ASSERT_CU(cuDevicePrimaryCtxRetain(&ctx_, 0));
    ASSERT_CU(cuCtxSetCurrent(ctx_));
  }
  CUcontext ctx_ = nullptr;
};

TEST_F(FakeCudaEnvTest, HostVmmOffIsReportedAndRefused) {
  int supported = -1;
  ASSERT_CU(cuDeviceGetAttribute(&supported,
                                 CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  EXPECT_EQ(supported, 0);
  ASSERT_CU(
      cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  EXPECT_EQ(supported, 1);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
  CUmemGenericAllocationHandle h;
  EXPECT_EQ(cuMemCreate(&h, 2u << 20, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
  size_t granularity = 0;
  EXPECT_EQ(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_ERROR_NOT_SUPPORTED);
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  ASSERT_CU(cuMemCreate(&h, 2u << 20, &prop, 0));
  ASSERT_CU(cuMemRelease(h));
}

// FAKECUDA_FAIL=cuMemAlloc_v2:2:2 in BUILD: the second call, counted from
// cuInit, is out of memory (error 2); the rule fires once.
TEST_F(FakeCudaEnvTest, FailuresArmedFromTheEnvironment) {
  CUdeviceptr a, b, c;
  ASSERT_CU(cuMemAlloc_v2(&a, 64));
  EXPECT_EQ(cuMemAlloc_v2(&b, 64), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_CU(cuMemAlloc_v2(&c, 64));
  ASSERT_CU(cuMemFree_v2(a));
  ASSERT_CU(cuMemFree_v2(c));
}

TEST(FakeCudaEnvDeathTest, MalformedValuesStopTheProgramNamingTheVariable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Each child re-runs only this test, so the options are read afresh there.
  EXPECT_EXIT(
      {
        setenv("FAKECUDA_DEVICE_MEMORY", "lots", 1);
        cuInit(0);
      },
      ::testing::ExitedWithCode(2),
      "FAKECUDA_DEVICE_MEMORY=\"lots\"; expected a positive byte count");
  EXPECT_EXIT(
      {
        setenv("FAKECUDA_DEVICES", "0", 1);
        cuInit(0);
      },
      ::testing::ExitedWithCode(2), "FAKECUDA_DEVICES=\"0\"; expected an integer from 1 to 16");
  EXPECT_EXIT(
      {
        setenv("FAKECUDA_FAIL", "cuMemAlloc_v2", 1);
        cuInit(0);
      },
      ::testing::ExitedWithCode(2), "FAKECUDA_FAIL=\"cuMemAlloc_v2\"; expected");
}

// In a child (options are read once per process): FAKECUDA_DEVICES=4,
// CUDA_VISIBLE_DEVICES=`visible` (unset when null), then prints what the
// driver enumerates, "devices:" and per device its physical index (from the
// UUID's fourth byte, 0x10 + index) and PCI bus id (which
// cuDeviceGetByPCIBusId and the PCI_BUS_ID attribute must agree with), or "cuInit N" when
// cuInit fails, and exits 0.
[[noreturn]] void Enumerate(const char* visible) {
  setenv("FAKECUDA_DEVICES", "4", 1);
  if (visible == nullptr) {
    unsetenv("CUDA_VISIBLE_DEVICES");
  } else {
    setenv("CUDA_VISIBLE_DEVICES", visible, 1);
  }
  const CUresult init = cuInit(0);
  if (init != CUDA_SUCCESS) {
    int count = -1;
    std::fprintf(stderr, "cuInit %d, count %d\n", static_cast<int>(init),
                 static_cast<int>(cuDeviceGetCount(&count)));
    std::exit(0);
  }
  int count = 0;
  if (cuDeviceGetCount(&count) != CUDA_SUCCESS) std::exit(1);
  std::string out = "devices:";
  for (int d = 0; d < count; ++d) {
    CUdevice dev;
    CUuuid uuid, uuid_v1;
    char bus[32] = "";
    CUdevice by_bus = -1;
    int bus_attribute = -1;
    if (cuDeviceGet(&dev, d) != CUDA_SUCCESS || cuDeviceGetUuid_v2(&uuid, dev) != CUDA_SUCCESS ||
        cuDeviceGetUuid(&uuid_v1, dev) != CUDA_SUCCESS ||
        std::memcmp(uuid.bytes, uuid_v1.bytes, sizeof(uuid.bytes)) != 0 ||
        cuDeviceGetPCIBusId(bus, sizeof(bus), dev) != CUDA_SUCCESS ||
        cuDeviceGetByPCIBusId(&by_bus, bus) != CUDA_SUCCESS || by_bus != dev ||
        cuDeviceGetAttribute(&bus_attribute, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev) != CUDA_SUCCESS ||
        bus_attribute != std::strtol(bus + 5, nullptr, 16)) {
      std::exit(1);
    }
    char entry[64];
    std::snprintf(entry, sizeof(entry), " %d@%s", static_cast<unsigned char>(uuid.bytes[3]) - 0x10,
                  bus);
    out += entry;
  }
  std::fprintf(stderr, "%s.\n", out.c_str());
  std::exit(0);
}

struct VisibleCase {
  const char* visible;  // nullptr: unset
  const char* enumerated;
};

// Four devices in the machine. The forms and rules are the CUDA
// Programming Guide's ("CUDA_VISIBLE_DEVICES"); the corner cases (a
// duplicate leaves none, "1gpu" reads as 1, the first entry sets the kind)
// as PyTorch's torch.cuda._parse_visible_devices models the driver.
const VisibleCase kVisibleCases[] = {
    {nullptr, "devices: 0@0000:01:00.0 1@0000:02:00.0 2@0000:03:00.0 3@0000:04:00.0\\."},
    {"2", "devices: 2@0000:03:00.0\\."},
    {"3,1", "devices: 3@0000:04:00.0 1@0000:02:00.0\\."},
    {" 2 , 0 ", "devices: 2@0000:03:00.0 0@0000:01:00.0\\."},
    // An invalid entry ends the list: entries after it are ignored.
    {"0,2,-1,1", "devices: 0@0000:01:00.0 2@0000:03:00.0\\."},
    {"1,4,0", "devices: 1@0000:02:00.0\\."},
    {"3,two,1", "devices: 3@0000:04:00.0\\."},
    {"1gpu,2x", "devices: 1@0000:02:00.0 2@0000:03:00.0\\."},
    {"+2,-0", "devices: 2@0000:03:00.0 0@0000:01:00.0\\."},
    // UUIDs, whole or a unique prefix; an unknown or ambiguous one ends the
    // list, as does an ordinal after them.
    {"GPU-facecd12-0000-0000-6661-6b6563756461,GPU-FACECD10",
     "devices: 2@0000:03:00.0 0@0000:01:00.0\\."},
    {"GPU-facecd13,GPU-facecd1,GPU-facecd10", "devices: 3@0000:04:00.0\\."},
    {"GPU-facecd11,2", "devices: 1@0000:02:00.0\\."},
    {"0,GPU-facecd11", "devices: 0@0000:01:00.0\\."},
    // No device at all.
    {"", "cuInit 100, count 3"},
    {"-1", "cuInit 100, count 3"},
    {"4", "cuInit 100, count 3"},
    {"GPU-00000000", "cuInit 100, count 3"},
    {"MIG-facecd10/1/0", "cuInit 100, count 3"},
    {"0,1,0", "cuInit 100, count 3"},
};

TEST(FakeCudaVisibleDevicesDeathTest, EnumeratesTheListedDevicesInOrder) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const VisibleCase& c : kVisibleCases) {
    SCOPED_TRACE(c.visible == nullptr ? "(unset)" : c.visible);
    EXPECT_EXIT(Enumerate(c.visible), ::testing::ExitedWithCode(0), c.enumerated);
  }
}

}  // namespace
