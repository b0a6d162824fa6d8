// What the example training programs (examples/mlp/mlp_train.cc,
// examples/transformer/transformer_train.cc) share around their training
// loops: the program's name in every message, checked driver calls, flag
// parsing with usage errors, loading the kernel module and its kernels,
// launches of one thread per element, and the checksum of the result.
//
// Every failure prints one line naming the program and what failed, and
// exits: status 1 for a failed driver call, 2 for a bad flag.
//
// Thread-safety: InitProgram must run first, on one thread; everything else
// may be called from any thread (CheckCu lets the first failing thread
// report and exit while the others wait).
#ifndef STENSOR_EXAMPLES_COMMON_EXAMPLE_PROGRAM_H_
#define STENSOR_EXAMPLES_COMMON_EXAMPLE_PROGRAM_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

// Every driver call goes through CU_CHECK so that a failure names the
// function (the name as written, before cuda.h maps it to a _v2 symbol).
#define CU_CHECK(fn, ...) ::examples::CheckCu(fn(__VA_ARGS__), #fn)

namespace examples {

// `name` prefixes every message ("mlp_train: ..."); `usage` is printed after
// a flag error and for --help. Both must outlive the program.
void InitProgram(const char* name, const char* usage);
const char* ProgramName();

// Exits with status 1, naming `function` and the error, unless `result` is
// CUDA_SUCCESS.
void CheckCu(CUresult result, const char* function);

// Prints the message, then the usage, and exits with status 2.
[[noreturn]] __attribute__((format(printf, 1, 2))) void UsageError(const char* format, ...);

// The value of --`flag`, `text`, as an integer in [min, max], or a usage
// error.
long long ParseInteger(const std::string& flag, const std::string& text, long long min,
                       long long max);
int ParseInt(const std::string& flag, const std::string& text, int min, int max);
// As a finite number in [min, max], or [min, max) when max_open.
float ParseFloat(const std::string& flag, const std::string& text, float min, float max,
                 bool max_open = false);

// A usage error unless every count (of a buffer's elements, or of a launch's
// threads) fits the kernels' int parameters.
void CheckElementCounts(const long long* counts, size_t n);
template <size_t N>
void CheckElementCounts(const long long (&counts)[N]) {
  CheckElementCounts(counts, N);
}

// Walks argv: --help or -h prints the usage and exits 0; a name in
// `switches` (written exactly `--name`) calls on_flag(name, nullptr);
// `--name=value` and `--name value` call on_flag(name, &value); anything
// else is a usage error. on_flag reports unknown names itself.
void ForEachFlag(
    int argc, char** argv, const std::vector<std::string>& switches,
    const std::function<void(const std::string& name, const std::string* value)>& on_flag);

// The path of `file` in the directory of the running binary.
std::string BesideBinary(const char* file);

// cuInit, then the primary context of device `ordinal` (0 unless given)
// retained and made current on this thread; sets `*device` (for the release
// at the end) and returns the context.
CUcontext UsePrimaryContext(CUdevice* device, int ordinal = 0);

// The module at `path`, loaded into the current context; exits naming the
// path when the driver refuses it.
CUmodule LoadModule(const std::string& path);

// The kernel of `module` with the mangled `name`; exits naming it when the
// module has none.
CUfunction GetKernel(CUmodule module, const char* name);

// Launches `function` (named `ns`::`name` in messages) on `stream` with one
// thread per element of `threads`, in blocks of 256; the kernels guard the
// surplus threads of the last block.
void LaunchPerElement(CUfunction function, const char* ns, const char* name, long long threads,
                      CUstream stream, void** args);

// FNV-1a, 64 bits, over bytes: the checksum the programs print.
class Fnv1a64 {
 public:
  void Update(const void* data, size_t size) {
    const unsigned char* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) {
      hash_ = (hash_ ^ bytes[i]) * 0x100000001b3ull;
    }
  }
  uint64_t hash() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

}  // namespace examples

#endif  // STENSOR_EXAMPLES_COMMON_EXAMPLE_PROGRAM_H_
