// FuzzTarget: what one fuzz target (a file defining LLVMFuzzerTestOneInput)
// gives the standalone driver tests/support/fuzz_main.cc: its name, its seeds and
// the tokens the driver's mutator splices in. Under libFuzzer
// (scripts/fuzz.sh) only LLVMFuzzerTestOneInput is used; the driver itself
// is linked only to write the seeds as the starting corpus.
//
// Each target defines stensor::fuzz::Target() once; it is called from the
// driver's thread only.
#ifndef STENSOR_TESTS_SUPPORT_FUZZ_TARGET_H_
#define STENSOR_TESTS_SUPPORT_FUZZ_TARGET_H_

#include <cstddef>
#include <string>
#include <vector>

namespace stensor {
namespace fuzz {

struct FuzzTarget {
  // For messages and seed files: "config_fuzz".
  std::string name;
  // Inputs run first, as they are, and the starting points of mutations.
  std::vector<std::string> seeds;
  // Pieces the mutator inserts: spellings that random bytes rarely hit.
  std::vector<std::string> tokens;
  // Mutants are cut to this length.
  size_t max_input_bytes = 4096;
  // The stack of the thread that runs the inputs: a bound the target must
  // stay under (a stack overflow is a crash). 0: the main thread's.
  size_t stack_bytes = 0;
};

// Defined by each fuzz target.
const FuzzTarget& Target();

}  // namespace fuzz
}  // namespace stensor

#endif  // STENSOR_TESTS_SUPPORT_FUZZ_TARGET_H_
