// Nothing: a library for stensor_run_test to preload as a program's own, to
// check that `stensor run` keeps an LD_PRELOAD already set.
extern "C" int stensor_run_test_preload() { return 0; }
