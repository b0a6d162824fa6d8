// stensor: the command line. `stensor run` runs a program under
// libstensor.so with the library's settings given as flags
// (tools/run_command.h); `stensor sim` replays an access log under a cap
// (tools/sim_command.h, docs/sim.md); `stensor trace` turns one into a
// Chrome trace (tools/chrome_trace.h, docs/trace.md); `stensor report` into
// an HTML page or SVG plot (tools/report.h, docs/report.md); `stensor
// version` prints the version
// and the CUDA toolkit the build used; `stensor help` lists the commands.
#include <cuda.h>

#include <iostream>
#include <string>
#include <vector>

#include "tools/chrome_trace.h"
#include "tools/report.h"
#include "tools/run_command.h"
#include "tools/sim_command.h"

namespace stensor {
namespace {

constexpr char kVersion[] = "0.10.0";

constexpr char kHelp[] =
    "usage: stensor COMMAND [ARGS...]\n"
    "\n"
    "Trains a CUDA program under a device-memory cap with libstensor.so.\n"
    "\n"
    "commands:\n"
    "  run [flags] [--] CMD [ARGS...]\n"
    "              run CMD under libstensor.so with a cap and the library's other\n"
    "              settings as flags (--limit, --host-limit, --policy, --prefetch,\n"
    "              --log, --stats, --verify, --library); `stensor run --help`\n"
    "  sim LOG --limit BYTES|N% [flags]\n"
    "              replay an access log under a cap with the library's policies and\n"
    "              bound it by the offline optimum; `stensor sim --help`\n"
    "  trace LOG -o FILE\n"
    "              an access log as a Chrome trace for Perfetto or chrome://tracing;\n"
    "              `stensor trace --help`\n"
    "  report LOG -o OUT.html|OUT.svg\n"
    "              a summary of a run and a plot of device memory against the cap,\n"
    "              with the swap traffic beneath; `stensor report --help`\n"
    "  version     print stensor's version and the CUDA toolkit it was built with\n"
    "  help [COMMAND]\n"
    "              print this help, or a command's\n"
    "\n"
    "Exit status 2 for an unknown command or bad arguments.\n";

int Version(std::ostream& out) {
  // CUDA_VERSION is major * 1000 + minor * 10.
  out << "stensor " << kVersion << " (CUDA toolkit " << CUDA_VERSION / 1000 << "."
      << CUDA_VERSION % 1000 / 10 << ", CUDA_VERSION " << CUDA_VERSION << ")\n";
  return 0;
}

int Help(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cout << kHelp;
    return 0;
  }
  if (args[0] == "run") return RunRun({"--help"}, std::cout, std::cerr);
  if (args[0] == "sim") return RunSim({"--help"}, std::cout, std::cerr);
  if (args[0] == "trace") return RunTrace({"--help"}, std::cout, std::cerr);
  if (args[0] == "report") return RunReport({"--help"}, std::cout, std::cerr);
  if (args[0] == "version" || args[0] == "help") {
    std::cout << kHelp;
    return 0;
  }
  std::cerr << "stensor: unknown command '" << args[0] << "' (stensor help lists them)\n";
  return 2;
}

int Main(std::vector<std::string> args) {
  if (args.empty()) {
    std::cerr << kHelp;
    return 2;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "--help" || command == "-h" || command == "help") return Help(args);
  if (command == "--version" || command == "version") return Version(std::cout);
  if (command == "run") return RunRun(args, std::cout, std::cerr);
  if (command == "sim") return RunSim(args, std::cout, std::cerr);
  if (command == "trace") return RunTrace(args, std::cout, std::cerr);
  if (command == "report") return RunReport(args, std::cout, std::cerr);
  std::cerr << "stensor: unknown command '" << command << "' (stensor help lists them)\n";
  return 2;
}

}  // namespace
}  // namespace stensor

int main(int argc, char** argv) {
  return stensor::Main(std::vector<std::string>(argv + 1, argv + argc));
}
