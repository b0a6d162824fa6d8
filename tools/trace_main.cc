// `stensor trace` on its own (tools/chrome_trace.h): the arguments are those
// after `trace`. Only for tests until the `stensor` binary dispatches to it.
#include <iostream>
#include <string>
#include <vector>

#include "tools/chrome_trace.h"

int main(int argc, char** argv) {
  return stensor::RunTrace(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
