#include "tools/run_command.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>  // environ (_GNU_SOURCE), fork, execvpe

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/config.h"

namespace stensor {
namespace {

// A flag that sets one of the library's variables to its value.
struct ValueFlag {
  const char* flag;
  const char* variable;
  const char* value_name;  // for the help
};

constexpr ValueFlag kValueFlags[] = {
    {"--limit", "STENSOR_MEMORY_LIMIT", "SIZE"}, {"--host-limit", "STENSOR_HOST_LIMIT", "SIZE"},
    {"--policy", "STENSOR_POLICY", "P"},         {"--prefetch", "STENSOR_PREFETCH", "on|off"},
    {"--log", "STENSOR_ACCESS_LOG", "PATH"},     {"--verify", "STENSOR_VERIFY", "MODE"},
};

// --stats takes no value and sets this to "1".
constexpr char kStatsFlag[] = "--stats";
constexpr char kStatsVariable[] = "STENSOR_STATS";
constexpr char kLibraryFlag[] = "--library";
constexpr char kPreloadVariable[] = "LD_PRELOAD";
constexpr char kLibraryName[] = "libstensor.so";

constexpr char kUsageLine[] = "usage: stensor run [flags] [--] CMD [ARGS...]";

// Signals passed on to the command.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
constexpr int kForwardedCount = std::size(kForwardedSignals);

// Exit statuses of `stensor run` itself (the command's own otherwise).
constexpr int kBadArguments = 2;
constexpr int kCannotExecute = 126;
constexpr int kNotFound = 127;

const ValueFlag* FindValueFlag(absl::string_view flag) {
  for (const ValueFlag& f : kValueFlags) {
    if (flag == f.flag) return &f;
  }
  return nullptr;
}

// The flag that sets `variable`, for error messages.
std::string FlagFor(absl::string_view variable) {
  if (variable == kStatsVariable) return kStatsFlag;
  for (const ValueFlag& f : kValueFlags) {
    if (variable == f.variable) return f.flag;
  }
  return std::string(variable);
}

const OptionInfo* FindOption(absl::string_view variable) {
  for (const OptionInfo& option : Options()) {
    if (option.name == variable) return &option;
  }
  return nullptr;
}

// `text` as lines of at most `width` columns, each after `indent` spaces.
std::string Wrap(absl::string_view text, size_t indent, size_t width) {
  std::string wrapped;
  size_t column = 0;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (column > 0 && column + 1 + word.size() > width) {
      wrapped.append("\n");
      column = 0;
    }
    if (column == 0) {
      wrapped.append(indent, ' ');
      column = indent;
    } else {
      wrapped.append(" ");
      ++column;
    }
    absl::StrAppend(&wrapped, word);
    column += word.size();
  }
  wrapped.append("\n");
  return wrapped;
}

// "  --limit SIZE" padded to the description column, and the description.
std::string FlagHelp(absl::string_view flag, absl::string_view description) {
  constexpr size_t kColumn = 22;
  constexpr size_t kWidth = 79;
  std::string first = absl::StrCat("  ", flag);
  std::string text = Wrap(description, kColumn, kWidth);
  if (first.size() + 1 < kColumn) {
    // The flag goes in the first line's indentation.
    return first.append(text.substr(first.size()));
  }
  return absl::StrCat(first, "\n", text);
}

// Config::Parse's lines start "stensor: "; ours start "stensor run: ".
std::string WithoutPrefix(absl::string_view message) {
  return std::string(absl::StripPrefix(message, "stensor: "));
}

// The name of a NAME=value entry.
absl::string_view NameOf(absl::string_view entry) { return entry.substr(0, entry.find('=')); }

// The variables of `environment` (NAME=value entries) by name, each with
// the value getenv would find (its first entry).
std::map<std::string, std::string> ByName(const std::vector<std::string>& environment) {
  std::map<std::string, std::string> values;
  for (const std::string& entry : environment) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    values.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return values;
}

// `values` (by name) as getenv would answer for them.
EnvLookup LookupIn(const std::map<std::string, std::string>& values) {
  return [&values](const char* name) -> const char* {
    const auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  };
}

// Config::Parse over `environment`: OK when the library takes its values.
absl::Status CheckValues(const std::vector<std::string>& environment) {
  const std::map<std::string, std::string> values = ByName(environment);
  return Config::Parse(LookupIn(values)).status();
}

// OK when every STENSOR_* variable of `environment` is an option
// (CheckVariableNames): the library stops at start on any other.
absl::Status CheckNames(const std::vector<std::string>& environment) {
  const std::map<std::string, std::string> values = ByName(environment);
  std::vector<std::string> names;
  for (const auto& [name, value] : values) names.push_back(name);
  return CheckVariableNames(names, LookupIn(values));
}

bool SameFile(const std::string& a, const std::string& b) {
  if (a == b) return true;
  struct stat sa, sb;
  return stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string AbsolutePath(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) return path;
  return resolved;
}

// The running binary's path, or "" when /proc cannot tell.
std::string SelfExe() {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  return std::string(path, n);
}

// ---------------------------------------------------------------------------
// The command's process.

// The command's pid while stensor run waits for it (0 otherwise), for the
// signal handler.
std::atomic<pid_t> command_pid{0};
static_assert(std::atomic<pid_t>::is_always_lock_free);

void ForwardSignal(int signal, siginfo_t* info, void* /*context*/) {
  // A signal from the terminal (Ctrl-C, Ctrl-\, a hang-up) went to the whole
  // foreground process group, the command included: passing it on would
  // deliver it twice.
  if (info != nullptr && info->si_code == SI_KERNEL) return;
  const int saved_errno = errno;
  const pid_t pid = command_pid.load(std::memory_order_relaxed);
  if (pid > 0) kill(pid, signal);
  errno = saved_errno;
}

// Forwarding of kForwardedSignals while it lives; a signal ignored when it
// starts stays ignored (the command inherits that, as under `nohup`).
class SignalForwarding {
 public:
  SignalForwarding() {
    for (int i = 0; i < kForwardedCount; ++i) {
      sigaction(kForwardedSignals[i], nullptr, &previous_[i]);
      if (previous_[i].sa_handler == SIG_IGN) continue;
      struct sigaction forward {};
      forward.sa_sigaction = ForwardSignal;
      forward.sa_flags = SA_SIGINFO | SA_RESTART;
      sigfillset(&forward.sa_mask);
      sigaction(kForwardedSignals[i], &forward, nullptr);
    }
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;
  ~SignalForwarding() { Restore(); }

  // Puts the dispositions back as they were (also in a forked child before
  // exec, so that a signal there is not swallowed by a handler with no
  // command to forward to).
  void Restore() {
    for (int i = 0; i < kForwardedCount; ++i) {
      sigaction(kForwardedSignals[i], &previous_[i], nullptr);
    }
  }

 private:
  struct sigaction previous_[kForwardedCount];
};

// Runs `command` with `environment` (execvp's PATH lookup) and waits for it.
int Spawn(const std::vector<std::string>& command, const std::vector<std::string>& environment,
          std::ostream& err) {
  // Everything the child needs is built before fork.
  std::vector<char*> argv;
  for (const std::string& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& entry : environment) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);

  // The child reports a failed exec through the pipe (closed by a
  // successful one).
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    err << "stensor run: cannot create a pipe: " << std::strerror(errno) << "\n";
    return kCannotExecute;
  }

  // Forwarded signals are held until the command's pid is known.
  sigset_t forwarded, previous_mask;
  sigemptyset(&forwarded);
  for (int signal : kForwardedSignals) sigaddset(&forwarded, signal);
  sigprocmask(SIG_BLOCK, &forwarded, &previous_mask);
  SignalForwarding forwarding;

  const pid_t pid = fork();
  if (pid == 0) {
    forwarding.Restore();
    sigprocmask(SIG_SETMASK, &previous_mask, nullptr);
    close(report[0]);
    execvpe(argv[0], argv.data(), envp.data());
    const int error = errno;
    (void)!write(report[1], &error, sizeof(error));
    _exit(kNotFound);
  }
  const int fork_error = errno;
  close(report[1]);
  if (pid < 0) {
    sigprocmask(SIG_SETMASK, &previous_mask, nullptr);
    close(report[0]);
    err << "stensor run: cannot fork: " << std::strerror(fork_error) << "\n";
    return kCannotExecute;
  }
  command_pid.store(pid);
  sigprocmask(SIG_SETMASK, &previous_mask, nullptr);

  int exec_error = 0;
  ssize_t n;
  do {
    n = read(report[0], &exec_error, sizeof(exec_error));
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n != static_cast<ssize_t>(sizeof(exec_error))) exec_error = 0;

  // Waits without reaping first, so that the pid stays the command's (and
  // cannot be reused by another process) until forwarding has stopped.
  siginfo_t info;
  while (waitid(P_PID, pid, &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
  }
  command_pid.store(0);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }

  if (exec_error != 0) {
    err << "stensor run: cannot run '" << command[0] << "': " << std::strerror(exec_error) << "\n";
    return exec_error == ENOENT ? kNotFound : kCannotExecute;
  }
  return ExitStatusOf(status);
}

}  // namespace

std::string RunHelp() {
  std::string help = absl::StrCat(
      kUsageLine, "\n\n",
      Wrap("Runs CMD under libstensor.so: sets the library's STENSOR_* variables the flags "
           "name, adds the library to LD_PRELOAD (after any preload already there) and "
           "returns CMD's exit status. Variables no flag sets are inherited (STENSOR_CONFIG "
           "and the file it names too). All are checked as the library checks them at start "
           "(core/base/config.h: a value it would refuse, a STENSOR_* variable that is not an "
           "option) before CMD starts, so a mistake stops nothing but stensor run. "
           "SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to stensor run are "
           "passed on to CMD (not those from the terminal, which CMD gets itself). Flags "
           "end at `--` or at the first argument that is not one; --name=value also works.",
           0, 79),
      "\nflags:\n");
  for (const ValueFlag& flag : kValueFlags) {
    const OptionInfo* option = FindOption(flag.variable);
    std::string description = absl::StrCat("Sets ", flag.variable, ".");
    if (option != nullptr) {
      absl::StrAppend(
          &description, " ", option->help, " Accepts ", option->accepted_forms,
          ". Default: ", option->default_value.empty() ? "unset" : option->default_value, ".");
    }
    help += FlagHelp(absl::StrCat(flag.flag, " ", flag.value_name), description);
  }
  help += FlagHelp(kStatsFlag, absl::StrCat("Sets ", kStatsVariable,
                                            "=1: swap and memory statistics on stderr when "
                                            "CMD exits."));
  help +=
      FlagHelp(absl::StrCat(kLibraryFlag, " PATH"),
               absl::StrCat("The ", kLibraryName, " to preload. Default: the one beside stensor, ",
                            "../interpose/", kLibraryName, " (bazel-bin) or ./", kLibraryName,
                            " (a bundle), relative to the directory of the stensor binary."));
  help += FlagHelp("-h, --help", "Prints this help.");
  help += absl::StrCat(
      "\nexit status:\n",
      Wrap("CMD's; 128+N when signal N ends CMD; 2 for a bad flag or value, or when "
           "libstensor.so is not found (CMD is not run); 126 when CMD cannot be "
           "executed, 127 when it is not found.",
           2, 79),
      "\nexample:\n", "  stensor run --limit 40% --stats -- python train.py\n",
      "  stensor run --limit 0=8GiB,1=75% --policy lru --log /tmp/a.%r.jsonl -- torchrun ...\n",
      "\nThe README's Configuration section lists every STENSOR_* variable.\n");
  return help;
}

absl::StatusOr<RunFlags> ParseRunFlags(const std::vector<std::string>& args) {
  RunFlags flags;
  bool library_given = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      flags.help = true;
      return flags;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the command
    std::string name = arg;
    std::optional<std::string> value;
    if (absl::StartsWith(arg, "--")) {
      if (const size_t eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
      }
    }
    const ValueFlag* value_flag = FindValueFlag(name);
    if (value_flag == nullptr && name != kLibraryFlag && name != kStatsFlag) {
      return absl::InvalidArgumentError(
          absl::StrCat("stensor run: unknown flag ", name, " (stensor run --help lists them)"));
    }
    if (name == kStatsFlag) {
      if (value) {
        return absl::InvalidArgumentError(
            absl::StrCat("stensor run: ", kStatsFlag, " takes no value"));
      }
      if (!flags.settings.emplace(kStatsVariable, "1").second) {
        return absl::InvalidArgumentError(
            absl::StrCat("stensor run: ", kStatsFlag, " given twice"));
      }
      continue;
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("stensor run: ", name, " needs a value"));
      }
      value = args[++i];
    }
    if (value->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stensor run: ", name, " needs a value, not an empty one"));
    }
    const bool first = value_flag != nullptr
                           ? flags.settings.emplace(value_flag->variable, *value).second
                           : !std::exchange(library_given, true);
    if (!first) {
      return absl::InvalidArgumentError(absl::StrCat("stensor run: ", name, " given twice"));
    }
    if (value_flag == nullptr) flags.library = *value;
  }
  flags.command.assign(args.begin() + i, args.end());
  if (flags.command.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("stensor run: no command given; ", kUsageLine));
  }
  return flags;
}

std::string PreloadWith(absl::string_view existing, absl::string_view library) {
  const std::string ours(library);
  for (absl::string_view entry :
       absl::StrSplit(existing, absl::ByAnyChar(": "), absl::SkipEmpty())) {
    if (SameFile(std::string(entry), ours)) return std::string(existing);
  }
  if (absl::StripAsciiWhitespace(existing).empty()) return ours;
  return absl::StrCat(existing, ":", ours);
}

absl::StatusOr<std::string> FindLibrary(absl::string_view override_path,
                                        absl::string_view self_exe) {
  if (!override_path.empty()) {
    const std::string path(override_path);
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return absl::NotFoundError(
          absl::StrCat("stensor run: ", kLibraryFlag, " ", path, ": ", std::strerror(errno)));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::NotFoundError(
          absl::StrCat("stensor run: ", kLibraryFlag, " ", path, ": not a regular file"));
    }
    return AbsolutePath(path);
  }
  const size_t slash = self_exe.rfind('/');
  const std::string dir =
      slash == absl::string_view::npos ? "." : std::string(self_exe.substr(0, slash));
  const std::string candidates[] = {
      absl::StrCat(dir, "/../interpose/", kLibraryName),
      absl::StrCat(dir, "/", kLibraryName),
  };
  for (const std::string& candidate : candidates) {
    if (IsRegularFile(candidate)) return AbsolutePath(candidate);
  }
  return absl::NotFoundError(absl::StrCat(
      "stensor run: ", kLibraryName, " not found beside stensor (looked for ", candidates[0],
      " and ", candidates[1], "); build it (bazel build //interpose:libstensor.so) or pass ",
      kLibraryFlag, " PATH"));
}

absl::StatusOr<std::vector<std::string>> CommandEnvironment(
    const RunFlags& flags, const std::vector<std::string>& environment, absl::string_view library) {
  // Each flag alone first, so that its error names the flag.
  for (const auto& [variable, value] : flags.settings) {
    const std::vector<std::string> alone = {absl::StrCat(variable, "=", value)};
    if (absl::Status status = CheckValues(alone); !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("stensor run: ", FlagFor(variable), ": ", WithoutPrefix(status.message())));
    }
  }

  const std::map<std::string, std::string> inherited = ByName(environment);
  const auto preload = inherited.find(kPreloadVariable);
  std::vector<std::string> result;
  for (const std::string& entry : environment) {
    const absl::string_view name = NameOf(entry);
    if (name == kPreloadVariable || flags.settings.count(std::string(name)) > 0) continue;
    result.push_back(entry);
  }
  for (const auto& [variable, value] : flags.settings) {
    result.push_back(absl::StrCat(variable, "=", value));
  }
  result.push_back(
      absl::StrCat(kPreloadVariable, "=",
                   PreloadWith(preload != inherited.end() ? preload->second : "", library)));

  // Then everything the command starts with.
  if (absl::Status status = CheckNames(result); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stensor run: ", WithoutPrefix(status.message())));
  }
  if (absl::Status status = CheckValues(result); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stensor run: from the environment: ", WithoutPrefix(status.message())));
  }
  return result;
}

int ExitStatusOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return kCannotExecute;  // not reached for a reaped process
}

int RunRun(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<RunFlags> flags = ParseRunFlags(args);
  if (!flags.ok()) {
    err << flags.status().message() << "\n";
    return kBadArguments;
  }
  if (flags->help) {
    out << RunHelp();
    return 0;
  }
  absl::StatusOr<std::string> library = FindLibrary(flags->library, SelfExe());
  if (!library.ok()) {
    err << library.status().message() << "\n";
    return kBadArguments;
  }
  std::vector<std::string> inherited;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    inherited.emplace_back(*entry);
  }
  absl::StatusOr<std::vector<std::string>> environment =
      CommandEnvironment(*flags, inherited, *library);
  if (!environment.ok()) {
    err << environment.status().message() << "\n";
    return kBadArguments;
  }
  out.flush();
  err.flush();
  return Spawn(flags->command, *environment, err);
}

}  // namespace stensor
