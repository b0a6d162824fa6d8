// An interposer of a C library function, as profilers and memory tools
// are: its getpid finds the real one with dlsym(RTLD_NEXT, ...). Preloaded
// after libstensor.so (which hooks dlsym), RTLD_NEXT must still mean "after
// this library": handed its own getpid back, it would recurse for ever, so
// it says so and exits 3 instead.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>

extern "C" pid_t getpid() {
  using Fn = pid_t (*)();
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "getpid"));
  if (real == &getpid || real == nullptr) {
    std::fprintf(stderr, "rtld_next_wrap: dlsym(RTLD_NEXT, \"getpid\") gave %s\n",
                 real == nullptr ? "nothing" : "this wrapper itself");
    _exit(3);
  }
  if (dlsym(RTLD_NEXT, "no_such_symbol_anywhere") != nullptr) {
    std::fprintf(stderr, "rtld_next_wrap: a symbol that exists nowhere was found\n");
    _exit(4);
  }
  return real();
}
