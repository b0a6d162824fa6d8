// stensor: the command line. `stensor sim` replays an access log under a
// cap (tools/sim_command.h, docs/sim.md); the other commands of the design
// (run, trace, report) are not in this build.
#include <iostream>
#include <string>
#include <vector>

#include "tools/sim_command.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cerr << "usage: stensor sim LOG --limit BYTES|N% [options]   (see docs/sim.md)\n";
    return args.empty() ? 2 : 0;
  }
  if (args[0] != "sim") {
    std::cerr << "stensor: unknown command '" << args[0]
              << "'; this build has 'sim' (run, trace and report are not implemented yet)\n";
    return 2;
  }
  args.erase(args.begin());
  return stensor::RunSim(args, std::cout, std::cerr);
}
