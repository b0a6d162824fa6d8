#include "tools/run_command.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stensor {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

std::string Error(const std::vector<std::string>& args) {
  absl::StatusOr<RunFlags> flags = ParseRunFlags(args);
  return flags.ok() ? "ok" : std::string(flags.status().message());
}

// A fresh directory under the test's temporary directory.
std::string TempDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(root != nullptr ? root : "/tmp", "/", name);
  mkdir(dir.c_str(), 0755);
  return dir;
}

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

TEST(RunCommandTest, FlagsBecomeTheLibrarysVariables) {
  absl::StatusOr<RunFlags> flags =
      ParseRunFlags({"--limit", "40%", "--host-limit=8GiB", "--policy", "lru", "--prefetch", "off",
                     "--log", "/tmp/a.%p.jsonl", "--stats", "--verify", "hash", "--library",
                     "/x/libstensor.so", "--", "train", "--limit", "3"});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_THAT(
      flags->settings,
      UnorderedElementsAre(Pair("STENSOR_MEMORY_LIMIT", "40%"), Pair("STENSOR_HOST_LIMIT", "8GiB"),
                           Pair("STENSOR_POLICY", "lru"), Pair("STENSOR_PREFETCH", "off"),
                           Pair("STENSOR_ACCESS_LOG", "/tmp/a.%p.jsonl"),
                           Pair("STENSOR_STATS", "1"), Pair("STENSOR_VERIFY", "hash")));
  EXPECT_EQ(flags->library, "/x/libstensor.so");
  EXPECT_FALSE(flags->help);
  // The command's own flags are its own.
  EXPECT_THAT(flags->command, ElementsAre("train", "--limit", "3"));
}

TEST(RunCommandTest, TheCommandStartsAtTheFirstArgumentThatIsNotAFlag) {
  absl::StatusOr<RunFlags> flags = ParseRunFlags({"--stats", "python", "-u", "--", "x.py"});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_THAT(flags->command, ElementsAre("python", "-u", "--", "x.py"));
  flags = ParseRunFlags({"--", "--help"});
  ASSERT_TRUE(flags.ok()) << flags.status();
  EXPECT_FALSE(flags->help);
  EXPECT_THAT(flags->command, ElementsAre("--help"));
  EXPECT_TRUE(flags->settings.empty());
}

TEST(RunCommandTest, HelpNeedsNoCommand) {
  for (const char* help : {"--help", "-h"}) {
    absl::StatusOr<RunFlags> flags = ParseRunFlags({"--limit", "1G", help});
    ASSERT_TRUE(flags.ok()) << flags.status();
    EXPECT_TRUE(flags->help);
  }
}

TEST(RunCommandTest, BadArgumentsAreOneLineNamingTheFlag) {
  EXPECT_EQ(Error({"--frobnicate", "--", "true"}),
            "stensor run: unknown flag --frobnicate (stensor run --help lists them)");
  EXPECT_EQ(Error({"-x", "true"}), "stensor run: unknown flag -x (stensor run --help lists them)");
  EXPECT_EQ(Error({"--limit=40%", "--polcy=lru", "true"}),
            "stensor run: unknown flag --polcy (stensor run --help lists them)");
  EXPECT_EQ(Error({"--limit"}), "stensor run: --limit needs a value");
  EXPECT_EQ(Error({"true", "--limit"}), "ok");  // the command's
  EXPECT_EQ(Error({"--limit", "", "true"}), "stensor run: --limit needs a value, not an empty one");
  EXPECT_EQ(Error({"--log=", "true"}), "stensor run: --log needs a value, not an empty one");
  EXPECT_EQ(Error({"--limit", "1G", "--limit=2G", "true"}), "stensor run: --limit given twice");
  EXPECT_EQ(Error({"--stats", "--stats", "true"}), "stensor run: --stats given twice");
  EXPECT_EQ(Error({"--library", "a", "--library", "b", "true"}),
            "stensor run: --library given twice");
  EXPECT_EQ(Error({"--stats=on", "true"}), "stensor run: --stats takes no value");
  EXPECT_EQ(Error({"--limit", "1G"}),
            "stensor run: no command given; usage: stensor run [flags] [--] CMD [ARGS...]");
  EXPECT_EQ(Error({"--limit", "1G", "--"}),
            "stensor run: no command given; usage: stensor run [flags] [--] CMD [ARGS...]");
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--frobnicate", "true"}, {"--limit"}, {}}) {
    EXPECT_FALSE(absl::StrContains(Error(args), "\n")) << Error(args);
  }
}

TEST(RunCommandTest, ValuesAreCheckedByTheLibrarysParser) {
  RunFlags flags = *ParseRunFlags({"--limit", "12XB", "true"});
  absl::StatusOr<std::vector<std::string>> env = CommandEnvironment(flags, {}, "/l.so");
  ASSERT_FALSE(env.ok());
  const std::string message(env.status().message());
  EXPECT_TRUE(absl::StartsWith(
      message, "stensor run: --limit: invalid STENSOR_MEMORY_LIMIT=\"12XB\": expected a size"))
      << message;
  EXPECT_FALSE(absl::StrContains(message, "\n"));

  struct Case {
    std::vector<std::string> args;
    std::string start;
  };
  for (const Case& c : std::vector<Case>{
           {{"--host-limit", "101%"}, "stensor run: --host-limit: invalid STENSOR_HOST_LIMIT="},
           {{"--policy", "fifo"},
            "stensor run: --policy: invalid STENSOR_POLICY=\"fifo\": expected lru, version or "
            "belady"},
           {{"--prefetch", "maybe"}, "stensor run: --prefetch: invalid STENSOR_PREFETCH="},
           {{"--log", "/tmp/%q"}, "stensor run: --log: invalid STENSOR_ACCESS_LOG="},
           {{"--verify", "sha"}, "stensor run: --verify: invalid STENSOR_VERIFY=\"sha\""},
       }) {
    std::vector<std::string> args = c.args;
    args.push_back("true");
    RunFlags parsed = *ParseRunFlags(args);
    absl::StatusOr<std::vector<std::string>> result = CommandEnvironment(parsed, {}, "/l.so");
    ASSERT_FALSE(result.ok()) << c.args[0];
    EXPECT_TRUE(absl::StartsWith(result.status().message(), c.start)) << result.status();
  }

  // Every form the library accepts passes.
  flags = *ParseRunFlags({"--limit", "0=8GiB,1=37.5%", "--host-limit", "64g", "--policy", "BELADY",
                          "--prefetch", "yes", "--verify", "copy", "--log", "/tmp/a.%r.%p.jsonl",
                          "true"});
  EXPECT_TRUE(CommandEnvironment(flags, {}, "/l.so").ok());
}

TEST(RunCommandTest, TheEnvironmentHasTheSettingsAndThePreload) {
  RunFlags flags = *ParseRunFlags({"--limit", "40%", "--stats", "true"});
  absl::StatusOr<std::vector<std::string>> env =
      CommandEnvironment(flags,
                         {"PATH=/bin", "STENSOR_MEMORY_LIMIT=1G", "STENSOR_POLICY=lru",
                          "LD_PRELOAD=/a.so", "STENSOR_MEMORY_LIMIT=2G"},
                         "/lib/libstensor.so");
  ASSERT_TRUE(env.ok()) << env.status();
  // Inherited variables stay, those the flags set are replaced (every entry
  // of them), ours are added.
  EXPECT_THAT(*env,
              UnorderedElementsAre("PATH=/bin", "STENSOR_POLICY=lru", "STENSOR_MEMORY_LIMIT=40%",
                                   "STENSOR_STATS=1", "LD_PRELOAD=/a.so:/lib/libstensor.so"));
}

TEST(RunCommandTest, InheritedSettingsAreCheckedToo) {
  RunFlags flags = *ParseRunFlags({"--limit", "40%", "true"});
  absl::StatusOr<std::vector<std::string>> env =
      CommandEnvironment(flags, {"STENSOR_LOG_LEVEL=loud"}, "/l.so");
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(std::string(env.status().message()),
              HasSubstr("stensor run: from the environment: invalid STENSOR_LOG_LEVEL=\"loud\""));
  // A STENSOR_* variable that is not an option stops the library too.
  env = CommandEnvironment(flags, {"STENSOR_MEMRY_LIMIT=8MiB"}, "/l.so");
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(std::string(env.status().message()),
              HasSubstr("stensor run: unknown variable "
                        "STENSOR_MEMRY_LIMIT=\"8MiB\" in the environment: did you mean "
                        "STENSOR_MEMORY_LIMIT?"));
  // A flag wins over a bad inherited value of its variable.
  EXPECT_TRUE(CommandEnvironment(flags, {"STENSOR_MEMORY_LIMIT=lots"}, "/l.so").ok());
  // The file STENSOR_CONFIG names is read as the library would.
  env = CommandEnvironment(flags, {"STENSOR_CONFIG=/nonexistent/stensor.conf"}, "/l.so");
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(std::string(env.status().message()),
              HasSubstr("from the environment: cannot read STENSOR_CONFIG"));
}

TEST(RunCommandTest, PreloadKeepsWhatIsThereAndAddsOursOnce) {
  EXPECT_EQ(PreloadWith("", "/l/libstensor.so"), "/l/libstensor.so");
  EXPECT_EQ(PreloadWith("  ", "/l/libstensor.so"), "/l/libstensor.so");
  EXPECT_EQ(PreloadWith("/a.so", "/l/libstensor.so"), "/a.so:/l/libstensor.so");
  EXPECT_EQ(PreloadWith("/a.so /b.so", "/l/libstensor.so"), "/a.so /b.so:/l/libstensor.so");
  EXPECT_EQ(PreloadWith("/a.so:/l/libstensor.so", "/l/libstensor.so"), "/a.so:/l/libstensor.so");
  EXPECT_EQ(PreloadWith("/l/libstensor.so /a.so", "/l/libstensor.so"), "/l/libstensor.so /a.so");

  // The same file by another path counts as ours.
  const std::string dir = TempDir("preload");
  Touch(dir + "/libstensor.so");
  const std::string link = dir + "/link.so";
  unlink(link.c_str());
  ASSERT_EQ(symlink((dir + "/libstensor.so").c_str(), link.c_str()), 0);
  EXPECT_EQ(PreloadWith(link, dir + "/libstensor.so"), link);
}

TEST(RunCommandTest, TheLibraryIsFoundBesideTheBinary) {
  // bazel-bin: tools/stensor and interpose/libstensor.so.
  const std::string tree = TempDir("tree");
  TempDir("tree/tools");
  TempDir("tree/interpose");
  Touch(tree + "/interpose/libstensor.so");
  absl::StatusOr<std::string> found = FindLibrary("", tree + "/tools/stensor");
  ASSERT_TRUE(found.ok()) << found.status();
  char real[PATH_MAX];
  ASSERT_NE(realpath((tree + "/interpose/libstensor.so").c_str(), real), nullptr);
  EXPECT_EQ(*found, real);

  // A bundle: both in one directory.
  const std::string bundle = TempDir("bundle");
  Touch(bundle + "/libstensor.so");
  found = FindLibrary("", bundle + "/stensor");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_TRUE(absl::EndsWith(*found, "/bundle/libstensor.so")) << *found;

  // Neither: the error says where it looked.
  const std::string empty = TempDir("empty");
  found = FindLibrary("", empty + "/stensor");
  ASSERT_FALSE(found.ok());
  EXPECT_THAT(std::string(found.status().message()),
              HasSubstr(absl::StrCat("looked for ", empty, "/../interpose/libstensor.so and ",
                                     empty, "/libstensor.so")));

  // --library wins, and must exist.
  found = FindLibrary(bundle + "/libstensor.so", tree + "/tools/stensor");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_TRUE(absl::EndsWith(*found, "/bundle/libstensor.so")) << *found;
  found = FindLibrary(empty + "/nothing.so", tree + "/tools/stensor");
  ASSERT_FALSE(found.ok());
  EXPECT_THAT(std::string(found.status().message()),
              HasSubstr("--library " + empty + "/nothing.so: No such file or directory"));
  found = FindLibrary(empty, tree + "/tools/stensor");
  ASSERT_FALSE(found.ok());
  EXPECT_THAT(std::string(found.status().message()), HasSubstr("not a regular file"));
}

TEST(RunCommandTest, ExitStatusIsTheShells) {
  EXPECT_EQ(ExitStatusOf(W_EXITCODE(0, 0)), 0);
  EXPECT_EQ(ExitStatusOf(W_EXITCODE(3, 0)), 3);
  EXPECT_EQ(ExitStatusOf(W_EXITCODE(255, 0)), 255);
  EXPECT_EQ(ExitStatusOf(W_EXITCODE(0, SIGKILL)), 128 + SIGKILL);
  EXPECT_EQ(ExitStatusOf(W_EXITCODE(0, SIGSEGV) | WCOREFLAG), 128 + SIGSEGV);
}

TEST(RunCommandTest, HelpNamesEveryFlagAndVariable) {
  const std::string help = RunHelp();
  for (const char* text : {"usage: stensor run",
                           "--limit SIZE",
                           "--host-limit SIZE",
                           "--policy P",
                           "--prefetch on|off",
                           "--log PATH",
                           "--stats",
                           "--verify MODE",
                           "--library PATH",
                           "--help",
                           "STENSOR_MEMORY_LIMIT",
                           "STENSOR_HOST_LIMIT",
                           "STENSOR_POLICY",
                           "STENSOR_PREFETCH",
                           "STENSOR_ACCESS_LOG",
                           "STENSOR_STATS",
                           "STENSOR_VERIFY",
                           "lru, version or belady",
                           "exit status",
                           "128+N"}) {
    EXPECT_THAT(help, HasSubstr(text));
  }
  for (absl::string_view line : absl::StrSplit(help, '\n')) {
    EXPECT_LE(line.size(), 90u) << line;
  }
}

}  // namespace
}  // namespace stensor
