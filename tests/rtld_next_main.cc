// Calls getpid (interposed by rtld_next_wrap.so in tests/rtld_next_test.sh)
// and prints it.
#include <unistd.h>

#include <cstdio>

int main() {
  std::printf("pid %d\n", static_cast<int>(getpid()));
  return 0;
}
