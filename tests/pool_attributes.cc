// The default stream-ordered pool's answers through libstensor.so, for
// tests/pool_attributes_test.sh. Buffers from cuMemAllocAsync (under a cap,
// those from half a granule up are stensor's, swappable; smaller ones the
// driver's) are written and read back whole; the default pool's
// USED_MEM_CURRENT/RESERVED_MEM_CURRENT and their _HIGH marks are checked
// against what the program allocated (under a cap: requested bytes and whole
// granules for stensor's buffers, the fake's 4 KiB pages for the driver's;
// uncapped: the fake's pages for all) before and after frees and a stream
// synchronisation, after a reset of the marks, and after cuMemPoolTrimTo,
// which under a cap also hands stensor's idle chunks back (the fake's device
// usage drops). An explicit pool stays the driver's. Prints `ok` when every
// check held.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tests/driver_check.h"

namespace {

using stensor_tests::failures;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

cuuint64_t Attr(CUmemoryPool pool, CUmemPool_attribute a) {
  cuuint64_t v = 0;
  CHECK(cuMemPoolGetAttribute(pool, a, &v));
  return v;
}

uint8_t Pattern(size_t buffer, size_t i) { return static_cast<uint8_t>(buffer * 31 + i * 7 + 1); }

}  // namespace

int main() {
  CUdevice dev = stensor_tests::StartOnDevice0();
  const bool capped = std::getenv("STENSOR_MEMORY_LIMIT") != nullptr;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  size_t g = 0;
  CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  // The fake's device usage, when the driver is the fake.
  auto used_bytes = reinterpret_cast<size_t (*)(int)>(dlsym(RTLD_DEFAULT, "fakecuda_used_bytes"));
  CUmemoryPool pool = nullptr;
  CHECK(cuDeviceGetDefaultMemPool(&pool, dev));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

  const std::vector<size_t> sizes = {g / 2, g, 2 * g + 12345, 3 * g, g / 2 + 1, 4096, 100000};
  auto served = [&](size_t n) { return capped && n >= g / 2; };
  auto used_of = [&](size_t n) { return served(n) ? n : AlignUp(n, 4096); };
  auto reserved_of = [&](size_t n) { return served(n) ? AlignUp(n, g) : AlignUp(n, 4096); };
  std::vector<CUdeviceptr> p(sizes.size());
  std::vector<std::vector<uint8_t>> host(sizes.size());
  uint64_t used = 0, reserved = 0;
  for (size_t b = 0; b < sizes.size(); ++b) {
    CHECK(cuMemAllocAsync(&p[b], sizes[b], s));
    host[b].resize(sizes[b]);
    for (size_t i = 0; i < sizes[b]; ++i) host[b][i] = Pattern(b, i);
    CHECK(cuMemcpyHtoDAsync(p[b], host[b].data(), sizes[b], s));
    used += used_of(sizes[b]);
    reserved += reserved_of(sizes[b]);
  }
  auto verify = [&](const char* when) {
    CHECK(cuStreamSynchronize(s));
    for (size_t b = 0; b < sizes.size(); ++b) {
      if (p[b] == 0) continue;
      std::vector<uint8_t> got(sizes[b]);
      CHECK(cuMemcpyDtoH(got.data(), p[b], sizes[b]));
      if (got != host[b]) {
        std::fprintf(stderr, "%s: buffer %zu differs\n", when, b);
        ++failures;
      }
    }
  };
  auto expect = [&](const char* when, uint64_t u, uint64_t r, uint64_t uh, uint64_t rh) {
    cuuint64_t gu = Attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    cuuint64_t gr = Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    cuuint64_t guh = Attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH);
    cuuint64_t grh = Attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
    std::printf("%s: used %llu reserved %llu used_high %llu reserved_high %llu\n", when,
                (unsigned long long)gu, (unsigned long long)gr, (unsigned long long)guh,
                (unsigned long long)grh);
    if (gu != u || gr != r || guh != uh || grh != rh) {
      std::fprintf(stderr, "%s: want used %llu reserved %llu used_high %llu reserved_high %llu\n",
                   when, (unsigned long long)u, (unsigned long long)r, (unsigned long long)uh,
                   (unsigned long long)rh);
      ++failures;
    }
  };
  verify("allocated");
  expect("allocated", used, reserved, used, reserved);
  const uint64_t peak_used = used, peak_reserved = reserved;

  // Free some (stensor's and a driver's), then synchronise: the fake's pool
  // releases its freed pages (release threshold 0), stensor's freed buffers
  // leave the pool's answers.
  for (size_t b : {0, 2, 4, 5}) {
    CHECK(cuMemFreeAsync(p[b], s));
    used -= used_of(sizes[b]);
    reserved -= reserved_of(sizes[b]);
    p[b] = 0;
  }
  CHECK(cuStreamSynchronize(s));
  expect("freed", used, reserved, peak_used, peak_reserved);
  // The marks reset only to 0, to the current values.
  cuuint64_t zero = 0, one = 1;
  EXPECT_TRUE(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &one) ==
              CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
  CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero));
  expect("reset", used, reserved, used, reserved);
  // Trim: under a cap, stensor's idle chunks of the freed buffers go back.
  size_t before = used_bytes ? used_bytes(0) : 0;
  CHECK(cuMemPoolTrimTo(pool, 0));
  size_t after = used_bytes ? used_bytes(0) : 0;
  std::printf("trim: device 0 used %zu -> %zu\n", before, after);
  EXPECT_TRUE(after <= before);
  if (capped && used_bytes) EXPECT_TRUE(after < before);
  expect("trimmed", used, reserved, used, reserved);
  verify("trimmed");

  // An explicit pool is the driver's alone (pages), also under a cap.
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemoryPool own = nullptr;
  CHECK(cuMemPoolCreate(&own, &props));
  CUdeviceptr q = 0;
  CHECK(cuMemAllocFromPoolAsync(&q, g + 1, own, s));
  EXPECT_TRUE(Attr(own, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == AlignUp(g + 1, 4096));
  expect("explicit", used, reserved, used, reserved);
  CHECK(cuMemFreeAsync(q, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemPoolDestroy(own));

  for (size_t b = 0; b < sizes.size(); ++b) {
    if (p[b] != 0) CHECK(cuMemFreeAsync(p[b], s));
  }
  CHECK(cuStreamSynchronize(s));
  expect("all freed", 0, 0, used, reserved);
  CHECK(cuStreamDestroy(s));
  if (failures == 0) std::printf("ok\n");
  return failures == 0 ? 0 : 1;
}
