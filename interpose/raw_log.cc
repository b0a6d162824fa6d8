#include "interpose/raw_log.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace stensor {

void RawLog(const char* format, ...) {
  static thread_local bool busy = false;
  if (busy) return;
  busy = true;
  char buffer[1024];
  int n = std::snprintf(buffer, sizeof(buffer), "stensor: ");
  va_list args;
  va_start(args, format);
  int m = std::vsnprintf(buffer + n, sizeof(buffer) - static_cast<size_t>(n) - 1, format, args);
  va_end(args);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > sizeof(buffer) - 2) len = sizeof(buffer) - 2;
  // One prefix: messages made by core/ (a Config error) carry theirs.
  const size_t prefix = static_cast<size_t>(n);
  if (len >= 2 * prefix && std::memcmp(buffer, buffer + prefix, prefix) == 0) {
    std::memmove(buffer, buffer + prefix, len - prefix);
    len -= prefix;
  }
  buffer[len++] = '\n';
  ssize_t ignored = write(2, buffer, len);
  (void)ignored;
  busy = false;
}

}  // namespace stensor
