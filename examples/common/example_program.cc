#include "examples/common/example_program.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace examples {
namespace {

// Set once by InitProgram, before any other thread exists.
const char* program_name = "example";
const char* program_usage = "";

}  // namespace

void InitProgram(const char* name, const char* usage) {
  program_name = name;
  program_usage = usage;
}

const char* ProgramName() { return program_name; }

void CheckCu(CUresult result, const char* function) {
  if (result == CUDA_SUCCESS) return;
  // Training threads may fail together: the first reports and exits, the
  // others wait here for the end of the process (exit must not run twice).
  // Never destroyed, so no thread can find it gone during exit.
  static std::mutex* const exiting = new std::mutex;
  exiting->lock();
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) {
    name = "unrecognised error";
  }
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s failed: %s (%d)\n", program_name, function, name,
               static_cast<int>(result));
  std::exit(1);
}

void UsageError(const char* format, ...) {
  std::fprintf(stderr, "%s: ", program_name);
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputs("\n", stderr);
  std::fputs(program_usage, stderr);
  std::exit(2);
}

long long ParseInteger(const std::string& flag, const std::string& text, long long min,
                       long long max) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < min || value > max) {
    UsageError("--%s=%s: expected an integer in [%lld, %lld]", flag.c_str(), text.c_str(), min,
               max);
  }
  return value;
}

int ParseInt(const std::string& flag, const std::string& text, int min, int max) {
  return static_cast<int>(ParseInteger(flag, text, min, max));
}

float ParseFloat(const std::string& flag, const std::string& text, float min, float max,
                 bool max_open) {
  errno = 0;
  char* end = nullptr;
  const float value = std::strtof(text.c_str(), &end);
  const bool in_range =
      std::isfinite(value) && value >= min && (max_open ? value < max : value <= max);
  if (text.empty() || *end != '\0' || errno != 0 || !in_range) {
    UsageError("--%s=%s: expected a number in [%g, %g%c", flag.c_str(), text.c_str(), min, max,
               max_open ? ')' : ']');
  }
  return value;
}

void CheckElementCounts(const long long* counts, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (counts[i] > INT_MAX) {
      UsageError("sizes too large: a buffer would hold %lld elements", counts[i]);
    }
  }
}

void ForEachFlag(
    int argc, char** argv, const std::vector<std::string>& switches,
    const std::function<void(const std::string& name, const std::string* value)>& on_flag) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(program_usage, stdout);
      std::exit(0);
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      UsageError("unexpected argument '%s'", arg.c_str());
    }
    std::string name = arg.substr(2);
    bool is_switch = false;
    for (const std::string& s : switches) is_switch |= name == s;
    if (is_switch) {
      on_flag(name, nullptr);
      continue;
    }
    std::string value;
    const size_t equals = name.find('=');
    if (equals != std::string::npos) {
      value = name.substr(equals + 1);
      name.resize(equals);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      UsageError("--%s needs a value", name.c_str());
    }
    on_flag(name, &value);
  }
}

std::string BesideBinary(const char* file) {
  char path[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) {
    std::fprintf(stderr, "%s: cannot read /proc/self/exe: %s\n", program_name,
                 std::strerror(errno));
    std::exit(1);
  }
  std::string exe(path, static_cast<size_t>(length));
  return exe.substr(0, exe.rfind('/') + 1) + file;
}

CUcontext UsePrimaryContext(CUdevice* device, int ordinal) {
  CU_CHECK(cuInit, 0);
  CU_CHECK(cuDeviceGet, device, ordinal);
  CUcontext context = nullptr;
  CU_CHECK(cuDevicePrimaryCtxRetain, &context, *device);
  CU_CHECK(cuCtxSetCurrent, context);
  return context;
}

CUmodule LoadModule(const std::string& path) {
  CUmodule module = nullptr;
  const CUresult result = cuModuleLoad(&module, path.c_str());
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: module %s:\n", program_name, path.c_str());
    CheckCu(result, "cuModuleLoad");
  }
  return module;
}

CUfunction GetKernel(CUmodule module, const char* name) {
  CUfunction function = nullptr;
  const CUresult result = cuModuleGetFunction(&function, module, name);
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: kernel %s:\n", program_name, name);
    CheckCu(result, "cuModuleGetFunction");
  }
  return function;
}

void LaunchPerElement(CUfunction function, const char* ns, const char* name, long long threads,
                      CUstream stream, void** args) {
  constexpr unsigned kBlock = 256;
  const long long blocks = (threads + kBlock - 1) / kBlock;
  const CUresult result = cuLaunchKernel(function, static_cast<unsigned>(blocks), 1, 1, kBlock, 1,
                                         1, 0, stream, args, nullptr);
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: launch of %s::%s:\n", program_name, ns, name);
    CheckCu(result, "cuLaunchKernel");
  }
}

}  // namespace examples
