// `stensor sim`, `trace` and `report` on logs of scale, made by
// tools/log_generator.h, each run as its own process: a training log of
// 70,000 records replayed with the exact optimum on an ordinary stack,
// 100,000 buffers live at once, and one launch listing ten million reads,
// whose peak memory each command keeps within the bound docs/sim.md,
// trace.md and report.md give. Speed is guarded by the test's size (its
// timeout), not by timed assertions; docs/sim.md has the measured times and
// the commands that measure them.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "tools/log_generator.h"

namespace stensor {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

std::string TempPath(absl::string_view name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

// Writes the log as it is generated: the test never holds its text.
std::string WriteLog(const GeneratedLog& spec, absl::string_view name) {
  const std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  WriteGeneratedLog(spec, out);
  out.close();
  EXPECT_TRUE(out.good()) << path;
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Outcome {
  int status = -1;    // as wait4 gives it
  uint64_t peak = 0;  // bytes resident at most
  std::string out, err;
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

// Runs `stensor ARGS...` as its own process, with the 8 MiB stack a Linux
// main thread gets by default (ulimit -s), whatever the machine running the
// test allows: a recursion as deep as a long log overflows it.
Outcome Stensor(const std::vector<std::string>& args) {
  Outcome run;
  const char* binary = std::getenv("STENSOR_BINARY");
  EXPECT_NE(binary, nullptr) << "STENSOR_BINARY (tools/BUILD) names the stensor binary";
  if (binary == nullptr) return run;
  std::vector<char*> argv = {const_cast<char*>(binary)};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string out = TempPath("stensor.out"), err = TempPath("stensor.err");
  const pid_t pid = fork();
  if (pid == 0) {
    const struct rlimit stack = {8 * kMiB, 8 * kMiB};
    if (setrlimit(RLIMIT_STACK, &stack) != 0 ||
        dup2(open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1) < 0 ||
        dup2(open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2) < 0) {
      _exit(126);
    }
    execv(binary, argv.data());
    _exit(127);
  }
  struct rusage usage = {};
  EXPECT_EQ(wait4(pid, &run.status, 0, &usage), pid);
  run.peak = static_cast<uint64_t>(usage.ru_maxrss) * 1024;
  run.out = ReadFile(out);
  run.err = ReadFile(err);
  return run;
}

// The byte count of the output line starting with `label` ("moved", ...).
uint64_t BytesOn(const std::string& out, absl::string_view label) {
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.compare(0, label.size(), label.data(), label.size()) != 0) continue;
    std::istringstream words(line.substr(label.size()));
    std::string word;
    while (words >> word) {
      uint64_t bytes = 0;
      if (absl::SimpleAtoi(word, &bytes)) return bytes;
    }
  }
  ADD_FAILURE() << "no '" << label << "' line in:\n" << out;
  return 0;
}

// mlp_train's loop for 3,200 steps: 70,000 records, whose LP bound once
// recursed a call per node of each augmenting path (one node per
// operation) and overflowed an 8 MiB stack past 66,000. The exact optimum
// is the bound's own schedule here, proven without a search.
TEST(ScaleTest, LongTrainingLogOnAnOrdinaryStack) {
  GeneratedLog spec;
  spec.shape = GeneratedLog::Shape::kMlp;
  spec.steps = 3200;
  const std::string path = WriteLog(spec, "mlp3200.jsonl");
  const Outcome sim = Stensor({"sim", path, "--limit", "40%", "--exact-seconds", "20"});
  ASSERT_EQ(sim.exit_code(), 0) << "status " << sim.status << ": " << sim.err;
  const std::string& out = sim.out;
  // "log  PATH: N operations, ..."
  uint64_t operations = 0;
  const size_t from = out.find(path + ": ");
  ASSERT_NE(from, std::string::npos) << out;
  const size_t start = from + path.size() + 2;
  ASSERT_TRUE(absl::SimpleAtoi(out.substr(start, out.find(' ', start) - start), &operations))
      << out;
  EXPECT_GT(operations, 70000u);
  const uint64_t bound = BytesOn(out, "optimum");
  EXPECT_GT(bound, 0u);
  EXPECT_NE(out.find(absl::StrCat("exact: the optimum moves ", bound, " bytes")), std::string::npos)
      << out;
  EXPECT_GE(BytesOn(out, "moved"), bound);
}

// 100,000 buffers of a granule live at once under half their charge: each
// one is written once, by the launch before the one that reads it, and
// never used again, so every buffer beyond what fits (50,000) is written
// back once and nothing is copied in. Finding the buffer to evict once
// looked at every resident one: quadratic, minutes here.
TEST(ScaleTest, HundredThousandLiveBuffers) {
  GeneratedLog spec;
  spec.shape = GeneratedLog::Shape::kLive;
  spec.buffers = 100000;
  spec.steps = 1;
  const std::string path = WriteLog(spec, "live100k.jsonl");
  const Outcome sim = Stensor({"sim", path, "--limit", "50%"});
  ASSERT_EQ(sim.exit_code(), 0) << "status " << sim.status << ": " << sim.err;
  const std::string& out = sim.out;
  const uint64_t written_back = 50000 * 2 * kMiB;
  EXPECT_EQ(BytesOn(out, "optimum"), written_back) << out;
  EXPECT_GE(BytesOn(out, "moved"), written_back) << out;
  EXPECT_GE(BytesOn(out, "device->host"), written_back) << out;

  // Under a cap of one buffer, every allocation evicts the one before;
  // the first launch, which needs two, is out of memory (without
  // host-located VMM: with it, one of the two would be served from host).
  const Outcome tight = Stensor({"sim", path, "--limit", "3MiB", "--host-vmm", "off"});
  ASSERT_EQ(tight.exit_code(), 1) << "status " << tight.status << ": " << tight.err;
  EXPECT_NE(tight.err.find("out of memory at log line 100002:"), std::string::npos) << tight.err;
}

// One launch listing ten million reads (of 16 buffers): a line of 24 MB.
// Each command holds at most three times the longest line plus 64 MiB
// (docs/sim.md, trace.md, report.md); as DOMs and copies of the list they
// once took 1.5 GB, 640 MB and 390 MB.
TEST(ScaleTest, WideRecordInBoundedMemory) {
  GeneratedLog spec;
  spec.shape = GeneratedLog::Shape::kWide;
  spec.buffers = 16;
  spec.reads = 10000000;
  const std::string path = WriteLog(spec, "wide.jsonl");
  uint64_t longest = 0;
  {
    std::ifstream in(path, std::ios::binary);
    for (std::string line; std::getline(in, line);) {
      longest = std::max<uint64_t>(longest, line.size());
    }
  }
  ASSERT_GT(longest, 20 * kMiB);
  const uint64_t bound = 3 * longest + 64 * kMiB;
  const std::vector<std::vector<std::string>> commands = {
      {"sim", path, "--limit", "100%"},
      {"trace", path, "-o", TempPath("wide.trace.json")},
      {"report", path, "-o", TempPath("wide.html")},
  };
  for (const std::vector<std::string>& command : commands) {
    const Outcome run = Stensor(command);
    EXPECT_EQ(run.exit_code(), 0) << command[0] << ": status " << run.status << ": " << run.err;
    EXPECT_LE(run.peak, bound) << command[0] << " peaked at " << run.peak / kMiB << " MiB, over "
                               << bound / kMiB << " MiB for a line of " << longest / kMiB << " MiB";
  }
}

}  // namespace
}  // namespace stensor
