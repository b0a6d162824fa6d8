// `stensor run`: runs a command under libstensor.so. The flags become the
// library's STENSOR_* variables (checked with the library's own parser,
// core/base/config.h, before anything runs), the library is added to LD_PRELOAD
// after any preload already there, and the command's exit status is
// returned, 128+N when signal N ends it, as shells report it. Ending
// signals sent to `stensor run` are passed on to the command.
//
// Thread-safety: the parsing and environment functions are pure and
// reentrant. RunRun forks and installs signal handlers for the time the
// command runs: call it from one thread of a single-threaded process (the
// `stensor` binary's main).
#ifndef STENSOR_TOOLS_RUN_COMMAND_H_
#define STENSOR_TOOLS_RUN_COMMAND_H_

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stensor {

struct RunFlags {
  // The library's settings the flags make, by variable name
  // (STENSOR_MEMORY_LIMIT -> "40%"), values as given.
  std::map<std::string, std::string> settings;
  // --library: the libstensor.so to preload; "" = found beside `stensor`.
  std::string library;
  // --help: print the help and run nothing.
  bool help = false;
  // The command and its arguments: everything after `--`, or from the
  // first argument that is not a flag.
  std::vector<std::string> command;
};

// The help of `stensor run`: every flag with its variable, meaning, accepted
// forms and default (taken from the library's option table).
std::string RunHelp();

// Parses the arguments after `run`. Errors are one line naming the flag (an
// unknown flag, a missing or empty value, a flag given twice, no command).
// Values are not checked here: CommandEnvironment does that.
absl::StatusOr<RunFlags> ParseRunFlags(const std::vector<std::string>& args);

// `existing` (an LD_PRELOAD value: paths separated by colons or spaces)
// with `library` appended after a colon, unless it names that file already.
std::string PreloadWith(absl::string_view existing, absl::string_view library);

// The absolute path of the libstensor.so to preload: `override_path`
// (--library) when given, else the first of
// `<dir>/../interpose/libstensor.so` (the Bazel tree: bazel-bin/tools/stensor
// and bazel-bin/interpose/libstensor.so) and `<dir>/libstensor.so` (a bundle)
// that exists, `<dir>` being the directory of `self_exe`. The error says
// where it looked.
absl::StatusOr<std::string> FindLibrary(absl::string_view override_path,
                                        absl::string_view self_exe);

// The command's environment: `environment` (NAME=value entries, as in
// environ) with the flags' settings set and `library` added to LD_PRELOAD.
// Fails, with one line, when a flag's value is one the library would refuse
// (the line names the flag, the variable, the value and the accepted forms),
// or when the settings the command would start with (inherited STENSOR_*
// variables and the file named by STENSOR_CONFIG included) would stop the
// library at start.
absl::StatusOr<std::vector<std::string>> CommandEnvironment(
    const RunFlags& flags, const std::vector<std::string>& environment, absl::string_view library);

// A status from waitpid as a shell reports it: the exit code, or 128+N for
// a process ended by signal N.
int ExitStatusOf(int wait_status);

// Runs `stensor run ARGS`: returns the command's exit status (ExitStatusOf),
// 0 after --help, 2 for bad arguments or values and when libstensor.so is
// not found (nothing run), 126 when the command cannot be executed and 127
// when it is not found. Errors go to `err` as one line; the help to `out`.
int RunRun(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace stensor

#endif  // STENSOR_TOOLS_RUN_COMMAND_H_
