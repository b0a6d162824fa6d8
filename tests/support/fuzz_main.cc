// Standalone driver for the fuzz targets (config_fuzz.cc, kernel_signature_fuzz.cc,
// tools/log_fuzz.cc) where they are not linked with libFuzzer: the Bazel
// build, where each is a test. Each target supplies its seeds and tokens
// (tests/support/fuzz_target.h); this file is shared.
//
//   NAME                     the seeds, then deterministic mutations
//   NAME FILE...             each file once, e.g. a libFuzzer crash
//   NAME --write-seeds DIR   the seeds as files, a libFuzzer corpus
//
// Every seed runs once as it is, then mutants of the seeds follow. They come
// from a fixed-seed generator, so a failure reproduces on every run; the run
// stops after kMutations inputs or kTimeBudget, whichever comes first, which
// keeps it to a few seconds even under sanitizers. A failed check aborts.
// Inputs run on a thread with the target's stack size, so a target that
// promises bounded stack use is held to it.
#include <pthread.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/support/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace stensor {
namespace fuzz {
namespace {

constexpr int kMutations = 200000;
constexpr std::chrono::seconds kTimeBudget(5);

const char* Name() { return Target().name.c_str(); }

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

// One to four random edits of `input`.
std::string Mutate(std::string input, std::mt19937_64& rng) {
  const FuzzTarget& target = Target();
  const int edits = 1 + rng() % 4;
  for (int i = 0; i < edits; ++i) {
    const size_t at = rng() % (input.size() + 1);
    switch (rng() % 6) {
      case 0:
        if (at < input.size()) input[at] = static_cast<char>(rng());
        break;
      case 1:
        input.insert(at, 1, static_cast<char>(rng()));
        break;
      case 2:
        input.erase(at, rng() % 8);
        break;
      case 3:
        if (!target.tokens.empty()) {
          input.insert(at, target.tokens[rng() % target.tokens.size()]);
        }
        break;
      case 4:
        input.insert(at, input.substr(at, rng() % 16));
        break;
      case 5: {
        const std::string& other = target.seeds[rng() % target.seeds.size()];
        input = input.substr(0, at) + other.substr(rng() % (other.size() + 1));
        break;
      }
    }
  }
  if (input.size() > target.max_input_bytes) {
    input.resize(target.max_input_bytes);
  }
  return input;
}

int WriteSeeds(const std::string& dir) {
  const std::vector<std::string>& seeds = Target().seeds;
  for (size_t i = 0; i < seeds.size(); ++i) {
    const std::string path = absl::StrCat(dir, "/seed-", i);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << seeds[i];
    if (!out) {
      std::fprintf(stderr, "%s: cannot write %s\n", Name(), path.c_str());
      return 1;
    }
  }
  std::printf("%s: wrote %zu seeds to %s\n", Name(), seeds.size(), dir.c_str());
  return 0;
}

int RunFiles(int count, char** paths) {
  for (int i = 0; i < count; ++i) {
    std::ifstream in(paths[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s: cannot read %s\n", Name(), paths[i]);
      return 1;
    }
    Run(std::string(std::istreambuf_iterator<char>(in), {}));
  }
  std::printf("%s: ran %d inputs\n", Name(), count);
  return 0;
}

int RunSeedsAndMutations() {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string>& seeds = Target().seeds;
  if (seeds.empty()) {
    std::fprintf(stderr, "%s: no seeds\n", Name());
    return 1;
  }
  for (const std::string& seed : seeds) Run(seed);

  std::mt19937_64 rng(0x57e4503);
  int mutations = 0;
  while (mutations < kMutations && std::chrono::steady_clock::now() - start < kTimeBudget) {
    // Check the clock every 256 inputs only: it is not free.
    for (int i = 0; i < 256 && mutations < kMutations; ++i, ++mutations) {
      Run(Mutate(seeds[rng() % seeds.size()], rng));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: ran %zu inputs (%zu seeds, %d mutations) in %.1f s\n", Name(),
              seeds.size() + mutations, seeds.size(), mutations, seconds);
  return 0;
}

// Runs `body` on a thread with `stack_bytes` of stack (0: on this thread).
int OnStack(size_t stack_bytes, const std::function<int()>& body) {
  if (stack_bytes == 0) return body();
  struct Call {
    const std::function<int()>* body;
    int rc;
  } call{&body, 1};
  pthread_attr_t attr;
  pthread_t thread;
  int err = pthread_attr_init(&attr);
  if (err == 0) err = pthread_attr_setstacksize(&attr, stack_bytes);
  if (err == 0) {
    err = pthread_create(
        &thread, &attr,
        [](void* arg) -> void* {
          auto* c = static_cast<Call*>(arg);
          c->rc = (*c->body)();
          return nullptr;
        },
        &call);
  }
  pthread_attr_destroy(&attr);
  if (err == 0) err = pthread_join(thread, nullptr);
  if (err != 0) {
    std::fprintf(stderr, "%s: cannot start the fuzzing thread: %s\n", Name(), std::strerror(err));
    return 1;
  }
  return call.rc;
}

}  // namespace
}  // namespace fuzz
}  // namespace stensor

int main(int argc, char** argv) {
  using namespace stensor::fuzz;  // NOLINT: the driver's own functions
  if (argc == 3 && std::string(argv[1]) == "--write-seeds") {
    return WriteSeeds(argv[2]);
  }
  size_t stack = Target().stack_bytes;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Sanitizers grow every frame several times over; the bound is for the
  // optimised build.
  if (stack != 0) stack *= 8;
#endif
  return OnStack(stack, [&] {
    if (argc > 1) return RunFiles(argc - 1, argv + 1);
    return RunSeedsAndMutations();
  });
}
