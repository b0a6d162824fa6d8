#include "core/base/log.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace stensor {
namespace {

// The lines written to stderr while `body` runs.
template <typename Body>
std::vector<std::string> Stderr(Body body) {
  const std::string path = absl::StrCat(testing::TempDir(), "/stderr.txt");
  std::fflush(stderr);
  const int saved = dup(2);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  EXPECT_GE(fd, 0);
  dup2(fd, 2);
  close(fd);
  body();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> lines = absl::StrSplit(text.str(), '\n', absl::SkipEmpty());
  return lines;
}

TEST(LogTest, OnePrefixAndTheLevelHonoured) {
  SetLogLevel(LogLevel::kWarn);
  const auto lines = Stderr([] {
    Say(LogLevel::kWarn, "a", "shown");
    Say(LogLevel::kInfo, "b", "below the level");
    Say(LogLevel::kError, "c", "an error");
  });
  EXPECT_EQ(lines, (std::vector<std::string>{"stensor: shown", "stensor: an error"}));
  SetLogLevel(LogLevel::kOff);
  EXPECT_TRUE(Stderr([] { Say(LogLevel::kCritical, "d", "off"); }).empty());
  SetLogLevel(LogLevel::kDebug);
  EXPECT_EQ(Stderr([] { Say(LogLevel::kDebug, "e", "debug"); }),
            (std::vector<std::string>{"stensor: debug"}));
  SetLogLevel(LogLevel::kWarn);
}

// A warning raised per buffer cannot flood a run: ten of a kind are
// written, the tenth saying so, and the rest only counted.
TEST(LogTest, EachKindIsRateLimited) {
  SetLogLevel(LogLevel::kWarn);
  const auto lines = Stderr([] {
    for (int i = 0; i < 25; ++i) Say(LogLevel::kWarn, "flood", absl::StrCat("message ", i));
    Say(LogLevel::kWarn, "other", "another kind");
  });
  ASSERT_EQ(lines.size(), static_cast<size_t>(kMaxMessagesPerKind) + 1);
  EXPECT_EQ(lines[0], "stensor: message 0");
  EXPECT_EQ(lines[kMaxMessagesPerKind - 1],
            absl::StrCat("stensor: message ", kMaxMessagesPerKind - 1,
                         " (further messages of this kind are not shown)"));
  EXPECT_EQ(lines.back(), "stensor: another kind");
  EXPECT_EQ(MessagesOfKind("flood"), 25u);
}

TEST(LogTest, OnceIsOnce) {
  SetLogLevel(LogLevel::kWarn);
  const auto lines = Stderr([] {
    for (int i = 0; i < 3; ++i) SayOnce(LogLevel::kWarn, "limitation", "said once");
  });
  EXPECT_EQ(lines, (std::vector<std::string>{"stensor: said once"}));
}

// A child forked while another thread keeps logging can log too: no lock of
// the logger is inherited held.
TEST(LogTest, AForkedChildLogs) {
  SetLogLevel(LogLevel::kWarn);
  std::atomic<bool> stop{false};
  std::thread chatter([&] {
    while (!stop.load()) Say(LogLevel::kDebug, "chatter", "filtered, but counted under the lock");
  });
  for (int i = 0; i < 50; ++i) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      SayOnce(LogLevel::kDebug, "child", "from the child");  // takes the lock
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  stop.store(true);
  chatter.join();
}

}  // namespace
}  // namespace stensor
