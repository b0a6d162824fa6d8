// A pointer table uploaded from the host, then cleared by a memset, then
// reached by a kernel through a pointer-to-pointer parameter. A memset that
// sets every byte of its extent (cuMemsetD8, or a 2D one whose rows leave no
// gaps) clears the table exactly; one whose rows leave gaps leaves what lies
// between them, which the launch must still find (tests/memset_table_test.sh
// compares what stensor reads back and what the launch reaches).
//
//   memset_table MODULE.so --memset d8|rows|gapped
// rows: cuMemsetD2D8 with width == pitch; gapped: width < pitch, which
// leaves the last entry of each row. The kernel is given a count of 0 (the
// cleared entries are null): only what stensor reads of the table happens.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/driver_check.h"

int main(int argc, char** argv) {
  if (argc != 4 || std::strcmp(argv[2], "--memset") != 0) {
    std::fprintf(stderr, "usage: memset_table MODULE.so --memset d8|rows|gapped\n");
    return 2;
  }
  const std::string mode = argv[3];
  if (mode != "d8" && mode != "rows" && mode != "gapped") {
    std::fprintf(stderr, "memset_table: --memset '%s': expected d8, rows or gapped\n", argv[3]);
    return 2;
  }
  stensor_tests::StartOnDevice0();
  CUmodule m;
  CHECK(cuModuleLoad(&m, argv[1]));
  CUfunction sum;
  CHECK(cuModuleGetFunction(&sum, m, "_ZN6tables3sumEPKPKfPfii"));

  constexpr size_t kBuf = 2u << 20;  // one VMM granule each
  CUdeviceptr data, out, table;
  CHECK(cuMemAlloc(&data, kBuf));
  CHECK(cuMemAlloc(&out, kBuf));
  CHECK(cuMemAlloc(&table, kBuf));
  CHECK(cuMemsetD8(data, 0, kBuf));
  CHECK(cuMemsetD8(out, 0, kBuf));

  // 64 entries, every one pointing into `data`, uploaded from the host.
  constexpr size_t kEntries = 64, kPitch = 128;  // 4 rows of 128 bytes
  std::vector<uint64_t> entries(kEntries);
  for (size_t i = 0; i < kEntries; ++i) entries[i] = data + i * 1024;
  CHECK(cuMemcpyHtoD(table, entries.data(), kEntries * sizeof(uint64_t)));

  if (mode == "d8") {
    CHECK(cuMemsetD8(table, 0, kEntries * sizeof(uint64_t)));
  } else if (mode == "rows") {
    CHECK(cuMemsetD2D8(table, kPitch, 0, kPitch, kEntries * sizeof(uint64_t) / kPitch));
  } else {
    // Rows of 120 bytes every 128: the last word of each row is left.
    CHECK(cuMemsetD2D8(table, kPitch, 0, kPitch - 8, kEntries * sizeof(uint64_t) / kPitch));
  }

  int n = 16, count = 0;
  void* params[] = {&table, &out, &n, &count};
  CHECK(cuLaunchKernel(sum, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr));
  CHECK(cuCtxSynchronize());
  std::printf("ok\n");
  return stensor_tests::failures == 0 ? 0 : 1;
}
