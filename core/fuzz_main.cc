// Standalone driver for core/config_fuzz.cc where it is not linked with
// libFuzzer (the Bazel build, where //core:config_fuzz is a test):
//
//   config_fuzz                     the seeds, then deterministic mutations
//   config_fuzz FILE...             each file once, e.g. a libFuzzer crash
//   config_fuzz --write-seeds DIR   the seeds as files, a libFuzzer corpus
//
// Every seed runs once per option (the input's first byte picks the
// variable, see config_fuzz.cc), then mutants of the seeds follow. They come
// from a fixed-seed generator, so a failure reproduces on every run; the run
// stops after kMutations inputs or kTimeBudget, whichever comes first, which
// keeps it to a few seconds even under sanitizers. A failed check aborts.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

constexpr int kMutations = 200000;
constexpr std::chrono::seconds kTimeBudget(5);
constexpr size_t kMaxInputBytes = 4096;

// Values of every option, good and bad, and config file bodies. Each also
// runs as the other kind: a value as a file body, a file body as a value.
const std::vector<std::string>& Seeds() {
  static const auto* const seeds = new std::vector<std::string>{
      "8GiB",
      "512MiB",
      "1073741824",
      "8 gigs",
      "4kb",
      "16777215TiB",
      "16777216TiB",
      "99999999999999999999GiB",
      "18446744073709551615",
      "-1",
      "0",
      "75%",
      "37.5%",
      "0.000001%",
      "100.000001%",
      "12.3456789%",
      "75.%",
      "0=8GiB,1=4GiB",
      "1=50%, 0 = 8g",
      "0=1G,0=2G",
      "64=1G",
      "0=8GiB,",
      "lru",
      "version",
      "BELADY",
      "on",
      "off",
      "yes",
      "False",
      "1",
      "/tmp/log.%p.%r",
      "/tmp/100%%",
      "/tmp/bad%",
      "/tmp/%x",
      "trace",
      "critical",
      "signature",
      "conservative",
      "7",
      "\xc3\xa9 \xff\"\\\t\x7f",
      "STENSOR_POLICY=lru\n# comment\n\nSTENSOR_MEMORY_LIMIT = "
      "0=8GiB,1=50%\r\n",
      "STENSOR_ACCESS_LOG=/tmp/%p\nSTENSOR_HOST_LIMIT=25%\nSTENSOR_PREFETCH=no"
      "\nSTENSOR_LOG_LEVEL=debug\nSTENSOR_STATS=on\nSTENSOR_VERIFY=hash\n"
      "STENSOR_WRITE_INFERENCE=conservative\nSTENSOR_REAL_LIBCUDA=/l.so\n",
      "STENSOR_VERBOSE=1\n",
      "STENSOR_CONFIG=/etc/stensor.conf\n",
      "STENSOR_POLICY=lru\nSTENSOR_POLICY=lru\n",
      "no equals sign\n",
      std::string("STENSOR_ACCESS_LOG=/a\0b\n", 24),
  };
  return *seeds;
}

// Pieces the mutator inserts: unit and placeholder spellings, separators,
// boundary numbers and option names, which random bytes rarely hit.
const std::vector<std::string>& Tokens() {
  static const auto* const tokens = new std::vector<std::string>{
      "GiB",
      "MiB",
      "KiB",
      "TiB",
      "G",
      "kb",
      "%",
      "%%",
      "%p",
      "%r",
      "=",
      ",",
      ".",
      "-",
      " ",
      "\t",
      "\n",
      "\r\n",
      "#",
      std::string(1, '\0'),
      "\xff",
      "\xc3",
      "99999999999999999999",
      "18446744073709551616",
      "100",
      "63",
      "64",
      "0.",
      "STENSOR_MEMORY_LIMIT=",
      "STENSOR_POLICY=",
      "STENSOR_CONFIG=",
      "\nSTENSOR_HOST_LIMIT=",
  };
  return *tokens;
}

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()),
                         input.size());
}

// One to four random edits of `input`.
std::string Mutate(std::string input, std::mt19937_64& rng) {
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
        input.insert(at, Tokens()[rng() % Tokens().size()]);
        break;
      case 4:
        input.insert(at, input.substr(at, rng() % 16));
        break;
      case 5: {
        const std::string& other = Seeds()[rng() % Seeds().size()];
        input = input.substr(0, at) + other.substr(rng() % (other.size() + 1));
        break;
      }
    }
  }
  if (input.size() > kMaxInputBytes) input.resize(kMaxInputBytes);
  return input;
}

// The seeds, each behind every first byte that picks a different variable.
std::vector<std::string> SeedInputs() {
  std::vector<std::string> inputs;
  for (const std::string& seed : Seeds()) {
    for (size_t selector = 0; selector < stensor::Options().size();
         ++selector) {
      inputs.push_back(std::string(1, static_cast<char>(selector)) + seed);
    }
  }
  return inputs;
}

int WriteSeeds(const std::string& dir) {
  const std::vector<std::string> inputs = SeedInputs();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string path = absl::StrCat(dir, "/seed-", i);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << inputs[i];
    if (!out) {
      std::fprintf(stderr, "config_fuzz: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  std::printf("config_fuzz: wrote %zu seeds to %s\n", inputs.size(),
              dir.c_str());
  return 0;
}

int RunFiles(int count, char** paths) {
  for (int i = 0; i < count; ++i) {
    std::ifstream in(paths[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "config_fuzz: cannot read %s\n", paths[i]);
      return 1;
    }
    Run(std::string(std::istreambuf_iterator<char>(in), {}));
  }
  std::printf("config_fuzz: ran %d inputs\n", count);
  return 0;
}

int RunSeedsAndMutations() {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> seeds = SeedInputs();
  for (const std::string& seed : seeds) Run(seed);

  std::mt19937_64 rng(0x57e4503);
  int mutations = 0;
  while (mutations < kMutations &&
         std::chrono::steady_clock::now() - start < kTimeBudget) {
    // Check the clock every 256 inputs only: it is not free.
    for (int i = 0; i < 256 && mutations < kMutations; ++i, ++mutations) {
      Run(Mutate(seeds[rng() % seeds.size()], rng));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf(
      "config_fuzz: ran %zu inputs (%zu seeds, %d mutations) in %.1f s\n",
      seeds.size() + mutations, seeds.size(), mutations, seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--write-seeds") {
    return WriteSeeds(argv[2]);
  }
  if (argc > 1) return RunFiles(argc - 1, argv + 1);
  return RunSeedsAndMutations();
}
