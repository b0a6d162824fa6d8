#include "core/tracker/access_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/status/status.h"
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

// Another open log of the same path (another process's, or here another
// open file description) is neither truncated nor written: the second Open
// is AlreadyExists until the first is closed.
TEST(AccessLogTest, PathInUseIsLeftAlone) {
  const std::string path = testing::TempDir() + "/shared.jsonl";
  auto first = AccessLog::Open(path);
  ASSERT_TRUE(first.ok()) << first.status();
  (*first)->Close([](uint64_t) { return std::string(R"({"old":1})"); });
  first = AccessLog::Open(path);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Slurp(path), "");  // truncated once held
  (*first)->Append(R"({"n":1})");
  auto second = AccessLog::Open(path);
  EXPECT_TRUE(absl::IsAlreadyExists(second.status())) << second.status();
  EXPECT_NE(second.status().message().find("being written by another process"), std::string::npos);
  (*first)->Close([](uint64_t) { return std::string(R"({"end":1})"); });
  EXPECT_EQ(Slurp(path), "{\"n\":1}\n{\"end\":1}\n");
  first->reset();
  second = AccessLog::Open(path);
  ASSERT_TRUE(second.ok()) << second.status();
  (*second)->Close([](uint64_t) { return std::string(R"({"again":1})"); });
  EXPECT_EQ(Slurp(path), "{\"again\":1}\n");
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
  while ((*log)->queued() < AccessLog::kMaxQueued && std::chrono::steady_clock::now() < deadline) {
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

// A full disk loses every record; the log says how many and why, once.
TEST(AccessLogTest, AFullDiskIsReportedWithTheRecordsLost) {
  auto log = AccessLog::Open("/dev/full");
  ASSERT_TRUE(log.ok()) << log.status();
  for (int i = 0; i < 100; ++i) (*log)->Append(absl::StrCat(R"({"i":)", i, "}"));
  (*log)->Close([](uint64_t) { return std::string(R"({"type":"end"})"); });
  EXPECT_EQ((*log)->dropped(), 101u);
  EXPECT_EQ((*log)->LossReport(),
            "stensor: the access log \"/dev/full\" (STENSOR_ACCESS_LOG) lost 101 of 101 "
            "records: No space left on device");
}

// Deleted while written: the writes succeed into a file nobody can read.
TEST(AccessLogTest, AFileDeletedWhileWrittenIsReported) {
  const std::string path = testing::TempDir() + "/deleted.jsonl";
  auto log = AccessLog::Open(path);
  ASSERT_TRUE(log.ok()) << log.status();
  (*log)->Append(R"({"type":"a"})");
  ASSERT_EQ(unlink(path.c_str()), 0);
  (*log)->Append(R"({"type":"b"})");
  (*log)->Close([](uint64_t) { return std::string(R"({"type":"end"})"); });
  EXPECT_EQ((*log)->LossReport(),
            absl::StrCat("stensor: the access log \"", path,
                         "\" (STENSOR_ACCESS_LOG) was deleted while it was written: its 3 "
                         "records are lost"));
}

TEST(AccessLogTest, AWholeLogReportsNothing) {
  const std::string path = testing::TempDir() + "/whole.jsonl";
  auto log = AccessLog::Open(path);
  ASSERT_TRUE(log.ok()) << log.status();
  (*log)->Append(R"({"type":"a"})");
  (*log)->Close([](uint64_t) { return std::string(R"({"type":"end"})"); });
  EXPECT_EQ((*log)->LossReport(), "");
}

}  // namespace
}  // namespace stensor
