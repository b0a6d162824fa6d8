// make_log: writes a generated access log (tools/log_generator.h) to a file,
// for measuring `stensor sim`, `trace` and `report` on logs of any length
// and width (docs/sim.md, Scale):
//
//   make_log --shape mlp|live|wide [--steps N] [--buffers N] [--reads N]
//            [--layers N] [--shards N] OUT
//
// OUT is a path, or - for standard output. Exit status 2 for bad arguments,
// 1 when OUT cannot be written.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "tools/log_generator.h"

namespace {

constexpr char kUsage[] =
    "usage: make_log --shape mlp|live|wide [--steps N] [--buffers N] [--reads N]\n"
    "                [--layers N] [--shards N] OUT\n";

int Usage(const std::string& why) {
  std::cerr << "make_log: " << why << "\n" << kUsage;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  stensor::GeneratedLog spec;
  std::string out_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      return 0;
    }
    if (arg.rfind("--", 0) != 0) {
      if (!out_path.empty()) return Usage("one output only");
      out_path = arg;
      continue;
    }
    if (i + 1 >= argc) return Usage(arg + " needs a value");
    const std::string value = argv[++i];
    uint64_t n = 0;
    if (arg == "--shape") {
      absl::StatusOr<stensor::GeneratedLog::Shape> shape = stensor::ParseLogShape(value);
      if (!shape.ok()) return Usage(std::string(shape.status().message()));
      spec.shape = *shape;
    } else if (!absl::SimpleAtoi(value, &n) || n == 0 || n > (uint64_t{1} << 40)) {
      return Usage(arg + " '" + value + "' is not a count from 1 to 2^40");
    } else if (arg == "--steps") {
      spec.steps = n;
    } else if (arg == "--buffers") {
      spec.buffers = n;
    } else if (arg == "--reads") {
      spec.reads = n;
    } else if (arg == "--layers" && n <= 64) {
      spec.layers = static_cast<int>(n);
    } else if (arg == "--shards" && n <= 4096) {
      spec.shards = static_cast<int>(n);
    } else {
      return Usage("unknown flag or value out of range: " + arg + " " + value);
    }
  }
  if (out_path.empty()) return Usage("no output given");
  if (out_path == "-") {
    stensor::WriteGeneratedLog(spec, std::cout);
    std::cout.flush();
    return std::cout ? 0 : 1;
  }
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  if (out) stensor::WriteGeneratedLog(spec, out);
  out.close();
  if (!out) {
    std::cerr << "make_log: cannot write " << out_path << "\n";
    return 1;
  }
  return 0;
}
