#include "tests/fakecuda/physical_devices.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fakecuda {

bool ParseSize(const char* text, size_t* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || errno != 0 || text[0] == '-') return false;
  std::string unit(end);
  unsigned shift = 0;
  if (unit.empty() || unit == "B")
    shift = 0;
  else if (unit == "K" || unit == "KiB")
    shift = 10;
  else if (unit == "M" || unit == "MiB")
    shift = 20;
  else if (unit == "G" || unit == "GiB")
    shift = 30;
  else
    return false;
  if (shift != 0 && v > (~0ull >> shift)) return false;
  *out = static_cast<size_t>(v << shift);
  return *out > 0;
}

void PhysicalUuid(int p, unsigned char bytes[16]) {
  static constexpr unsigned char kUuid[16] = {0xfa, 0xce, 0xcd, 0x10, 0,   0,   0,   0,
                                              'f',  'a',  'k',  'e',  'c', 'u', 'd', 'a'};
  std::memcpy(bytes, kUuid, 16);
  bytes[3] = static_cast<unsigned char>(0x10 + p);
}

std::string UuidText(int p) {
  unsigned char b[16];
  PhysicalUuid(p, b);
  char text[41];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
                "%02x%02x%02x%02x%02x%02x",
                b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
                b[13], b[14], b[15]);
  return text;
}

}  // namespace fakecuda
