// The fake driver's environment: host-located VMM switched off, failures
// armed from FAKECUDA_FAIL, and malformed values rejected by name. The BUILD
// target sets FAKECUDA_HOST_VMM=0 and FAKECUDA_FAIL for this binary.
#include <cstdlib>

#include <cuda.h>
#include <gtest/gtest.h>

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
  ASSERT_CU(cuDeviceGetAttribute(
      &supported, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  EXPECT_EQ(supported, 0);
  ASSERT_CU(cuDeviceGetAttribute(
      &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  EXPECT_EQ(supported, 1);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
  CUmemGenericAllocationHandle h;
  EXPECT_EQ(cuMemCreate(&h, 2u << 20, &prop, 0), CUDA_ERROR_NOT_SUPPORTED);
  size_t granularity = 0;
  EXPECT_EQ(cuMemGetAllocationGranularity(&granularity, &prop,
                                          CU_MEM_ALLOC_GRANULARITY_MINIMUM),
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

}  // namespace
