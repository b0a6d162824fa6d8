#include "core/tracker/leaks.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace stensor {
namespace {

TEST(LeaksTest, NothingWhenEverythingWasFreed) {
  Leaks leaks;
  leaks.OnAlloc(1, "cuMemAlloc_v2", 100, 0);
  leaks.OnFree(1);
  EXPECT_TRUE(leaks.Report().empty());
}

// Largest first, with the allocating call and the first kernel that used
// each; the rest summed.
TEST(LeaksTest, ReportsTheLargestWithTheirCallAndFirstKernel) {
  Leaks leaks;
  leaks.OnAlloc(1, "cuMemAlloc_v2", 4096, 0);
  leaks.OnAlloc(2, "cuMemAllocAsync", 1 << 20, 1);
  leaks.OnAlloc(3, "cuMemAlloc_v2", 10, 0);
  leaks.OnAlloc(4, "cuMemAllocPitch_v2", 512, 0);
  leaks.OnAlloc(5, "cuMemAlloc_v2", 7, 0);
  leaks.OnLaunch("gemm(float const*, float*)", {2}, {1});
  leaks.OnLaunch("relu(float*)", {}, {1, 3});  // 1 was first used by gemm
  leaks.OnFree(5);
  EXPECT_EQ(leaks.Report(2),
            (std::vector<std::string>{
                "4 device buffers never freed, 1053194 bytes (1.0 MiB) in all; the 2 largest:",
                "  buffer 2: 1048576 bytes on device 1, from cuMemAllocAsync, first used by "
                "gemm(float const*, float*)",
                "  buffer 1: 4096 bytes on device 0, from cuMemAlloc_v2, first used by "
                "gemm(float const*, float*)",
                "  and 2 more, 522 bytes"}));
  EXPECT_EQ(leaks.Report(8).back(),
            "  buffer 3: 10 bytes on device 0, from cuMemAlloc_v2, first used by relu(float*)");
  EXPECT_EQ(leaks.Report(8)[3],
            "  buffer 4: 512 bytes on device 0, from cuMemAllocPitch_v2, first used by no kernel");
}

}  // namespace
}  // namespace stensor
