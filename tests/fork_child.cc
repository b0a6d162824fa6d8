// fork() under stensor: the parent allocates and copies (so stensor's state,
// its access log and, under a cap, its memory manager exist), then forks
// twice while a second thread keeps copying:
//   - child 1 makes no CUDA call and leaves through exit(), so every atexit
//     handler it inherited runs;
//   - child 2 calls the driver, which in a child of an initialised parent
//     answers CUDA_ERROR_NOT_INITIALIZED to everything, cuInit included.
//     Its stderr goes to the file named by argv[1].
// The parent then goes on copying and frees. Prints "ok" when every result
// was as the driver documents; the test script checks the logs.
//
// --quiet-fork: the copying thread pauses around the forks. For
// AddressSanitizer builds: GCC 12's ASan runtime does not lock its
// allocator at fork, so a child forked while another thread is inside
// malloc can block for ever in the child's first malloc (seen, in ASan's
// SizeClassAllocator64::GetFromAllocator), whatever the program does.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/driver_check.h"

namespace {

constexpr size_t kBytes = 4 << 20;

int Child2(const char* err_path) {
  const int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || dup2(fd, 2) < 0) return 10;
  if (cuInit(0) != CUDA_ERROR_NOT_INITIALIZED) return 11;
  CUdeviceptr p = 0;
  if (cuMemAlloc(&p, kBytes) != CUDA_ERROR_NOT_INITIALIZED) return 12;
  int count = -1;
  if (cuDeviceGetCount(&count) != CUDA_ERROR_NOT_INITIALIZED) return 13;
  return 0;
}

int Wait(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quiet_fork = argc == 3 && std::strcmp(argv[2], "--quiet-fork") == 0;
  if (argc != 2 && !quiet_fork) {
    std::fprintf(stderr, "usage: fork_child CHILD_STDERR [--quiet-fork]\n");
    return 2;
  }
  stensor_tests::StartOnDevice0();
  CUcontext ctx = nullptr;
  CHECK(cuCtxGetCurrent(&ctx));
  std::vector<CUdeviceptr> bufs(4);
  std::vector<unsigned char> host(kBytes, 7), back(kBytes);
  for (CUdeviceptr& b : bufs) {
    CHECK(cuMemAlloc(&b, kBytes));
    CHECK(cuMemcpyHtoD(b, host.data(), kBytes));
  }
  // Copies on another thread while the parent forks: its log records and
  // locks are in flight at the fork.
  std::atomic<bool> stop{false}, pause{quiet_fork}, paused{false};
  std::thread copier([&] {
    CHECK(cuCtxSetCurrent(ctx));
    std::vector<unsigned char> h(kBytes);
    CHECK(cuMemcpyDtoH(h.data(), bufs[0], kBytes));
    while (!stop.load()) {
      if (pause.load()) {
        paused.store(true);
        while (pause.load()) std::this_thread::yield();
        paused.store(false);
      }
      CHECK(cuMemcpyDtoH(h.data(), bufs[0], kBytes));
    }
  });
  while (quiet_fork && !paused.load()) std::this_thread::yield();
  const pid_t c1 = fork();
  if (c1 == 0) std::exit(0);
  const pid_t c2 = fork();
  if (c2 == 0) std::exit(Child2(argv[1]));
  pause.store(false);
  const int r1 = Wait(c1), r2 = Wait(c2);
  stop.store(true);
  copier.join();
  for (CUdeviceptr b : bufs) {
    CHECK(cuMemcpyDtoH(back.data(), b, kBytes));
    if (std::memcmp(back.data(), host.data(), kBytes) != 0) {
      std::fprintf(stderr, "fork_child: a buffer changed\n");
      return 1;
    }
    CHECK(cuMemFree(b));
  }
  if (r1 != 0 || r2 != 0) {
    std::fprintf(stderr, "fork_child: child 1 exited %d, child 2 %d\n", r1, r2);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
