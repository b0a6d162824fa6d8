#include "core/access_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace stensor {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A process that is killed never reaches Close: what it logged must be in
// the file already (within the flush interval), not in a stdio buffer.
TEST(AccessLogTest, LinesReachTheFileWithoutClose) {
  const std::string path = testing::TempDir() + "/unclosed.jsonl";
  auto log = AccessLog::Open(path);
  ASSERT_TRUE(log.ok()) << log.status();
  (*log)->Append(R"({"type":"a"})");
  (*log)->Append(R"({"type":"b"})");
  const std::string want = "{\"type\":\"a\"}\n{\"type\":\"b\"}\n";
  // Waits for an event, bounded; not a measurement of speed.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Slurp(path) != want && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Slurp(path), want);
  (*log)->Close([](uint64_t dropped) { return absl::StrCat(R"({"dropped":)", dropped, "}"); });
  EXPECT_EQ(Slurp(path), want + "{\"dropped\":0}\n");
}

// A writer that cannot keep up (here: a pipe nobody reads yet) holds the
// appenders back instead of letting the queue grow; nothing is lost.
TEST(AccessLogTest, QueueIsBoundedAndLosesNothing) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  auto log = AccessLog::Open(absl::StrCat("/proc/self/fd/", fds[1]));
  ASSERT_TRUE(log.ok()) << log.status();
  close(fds[1]);  // the log holds its own descriptor
  const size_t lines = 3 * AccessLog::kMaxQueued;
  std::thread appender([&] {
    for (size_t i = 0; i < lines; ++i) (*log)->Append(absl::StrCat(i));
  });
  // Until the pipe is read, the writer is stuck: the queue fills to its
  // bound and the appender waits there.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((*log)->queued() < AccessLog::kMaxQueued &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ((*log)->queued(), AccessLog::kMaxQueued);
  std::string text;
  std::thread reader([&] {
    char buffer[1 << 16];
    ssize_t n;
    while ((n = read(fds[0], buffer, sizeof(buffer))) > 0) text.append(buffer, n);
  });
  appender.join();
  EXPECT_LE((*log)->queued(), AccessLog::kMaxQueued);
  (*log)->Close([](uint64_t dropped) { return absl::StrCat("end ", dropped); });
  log->reset();  // closes the write end: the reader sees EOF
  reader.join();
  close(fds[0]);
  std::string want;
  for (size_t i = 0; i < lines; ++i) absl::StrAppend(&want, i, "\n");
  EXPECT_EQ(text, want + "end 0\n");
}

}  // namespace
}  // namespace stensor
