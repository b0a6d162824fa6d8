// report_main: `stensor report` alone, for the tests (tools/report_test.sh)
// until the command is part of tools/stensor_main.cc.
#include <iostream>
#include <string>
#include <vector>

#include "tools/report.h"

int main(int argc, char** argv) {
  return stensor::RunReport(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
