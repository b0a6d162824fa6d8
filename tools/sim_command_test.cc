#include "tools/sim_command.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tools/test_log.h"

namespace stensor {
namespace {

TEST(SimCommandTest, ParsesLimits) {
  EXPECT_EQ(ParseLimit("33554432", 0).value(), 33554432u);
  EXPECT_EQ(ParseLimit("32MiB", 0).value(), 32u << 20);
  EXPECT_EQ(ParseLimit("2G", 0).value(), 2ull << 30);
  EXPECT_EQ(ParseLimit("40%", 1000).value(), 400u);
  EXPECT_EQ(ParseLimit("12.5%", 1000).value(), 125u);
  for (const char* bad : {"", "0", "-5", "1.5", "x%", "0%", "5TiB", "99999999999999999999"}) {
    absl::StatusOr<uint64_t> r = ParseLimit(bad, 1000);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(std::string(r.status().message()).find("--limit"), std::string::npos);
    }
  }
}

TEST(SimCommandTest, FlagErrorsNameFlagValueAndForms) {
  auto error = [](std::vector<std::string> args) {
    absl::StatusOr<SimFlags> f = ParseSimFlags(args);
    return f.ok() ? std::string("ok") : std::string(f.status().message());
  };
  EXPECT_EQ(error({"log", "--limit", "40%"}), "ok");
  EXPECT_NE(error({"log", "--limit", "40%", "--policy", "fifo"}).find("'fifo'"), std::string::npos);
  EXPECT_NE(error({"log", "--limit", "40%", "--prefetch", "yes"}).find("on or off"),
            std::string::npos);
  EXPECT_NE(error({"log", "--limit", "40%", "--pieces", "some"}).find("on or off"),
            std::string::npos);
  EXPECT_EQ(error({"log", "--limit", "40%", "--pieces", "off"}), "ok");
  EXPECT_NE(error({"log", "--limit", "40%", "--bandwidth", "0"}).find("--bandwidth"),
            std::string::npos);
  EXPECT_NE(error({"log", "--limit"}).find("needs a value"), std::string::npos);
  EXPECT_NE(error({"log"}).find("--limit is required"), std::string::npos);
  EXPECT_NE(error({"--limit", "1"}).find("no access log"), std::string::npos);
  EXPECT_NE(error({"a", "b", "--limit", "1"}).find("one log only"), std::string::npos);
  EXPECT_NE(error({"a", "--limit=1", "--frobnicate=2"}).find("unknown flag"), std::string::npos);
  absl::StatusOr<SimFlags> f =
      ParseSimFlags({"log", "--limit=1G", "--policy=belady", "--prefetch", "on", "--compare",
                     "--kernel-us", "20", "--bandwidth", "25", "--planned-evictions", "off"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->prefetch && f->compare && !f->planned_evictions);
  // The defaults are the library's: belady, prefetch on, with its evictions.
  absl::StatusOr<SimFlags> defaults = ParseSimFlags({"log", "--limit=1G"});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_TRUE(defaults->prefetch && defaults->planned_evictions);
  EXPECT_EQ(defaults->policy, "belady");
  EXPECT_EQ(f->policy, "belady");
  EXPECT_EQ(f->kernel_us, 20);
  EXPECT_EQ(f->bandwidth_gbps, 25);
  EXPECT_EQ(f->d2h_bandwidth_gbps, 25);
  // --link: each direction's own, as FAKECUDA_LINK.
  for (const char* bad : {"0", "1,0", "1,2,3", "fast", "1,", "-4"}) {
    EXPECT_NE(error({"log", "--limit", "40%", "--link", bad}).find("--link"), std::string::npos)
        << bad;
  }
  absl::StatusOr<SimFlags> link = ParseSimFlags({"log", "--limit=1G", "--link", "24,12.5"});
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(link->bandwidth_gbps, 24);
  EXPECT_EQ(link->d2h_bandwidth_gbps, 12.5);
  link = ParseSimFlags({"log", "--limit=1G", "--link", "8"});
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(link->d2h_bandwidth_gbps, 8);
}

TEST(SimCommandTest, EveryPolicyIsAvailable) {
  for (const char* name : {"lru", "version", "belady"}) {
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = MakeSimPolicy(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    EXPECT_EQ((*p)->name(), name);
  }
}

TEST(SimCommandTest, CompareTableHasEveryRowAndTheBound) {
  TestLog log;
  uint64_t a = log.Alloc(2 * TestLog::kMiB), b = log.Alloc(2 * TestLog::kMiB);
  for (int i = 0; i < 4; ++i) {
    log.Launch({}, {a});
    log.Launch({}, {b});
  }
  const std::string path = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                           "/sim_command_test.jsonl";
  std::ofstream(path) << log.Text();
  std::ostringstream out, err;
  ASSERT_EQ(RunSim({path, "--limit", "50%", "--compare"}, out, err), 0) << err.str();
  const std::string text = out.str();
  for (const char* row :
       {"lru      off", "lru      on", "version  off", "version  on", "belady   off", "belady   on",
        "oracle   off", "exact    -", "LP bound -", "the optimum moves", "x time",
        "x time: each run's modelled time", "exact, timed: its schedule drains at"}) {
    EXPECT_NE(text.find(row), std::string::npos) << row << " missing in\n" << text;
  }
  // One policy: its time against the bound. Each launch reads and writes
  // its buffer and the cap holds one. With serving, a launch may read the
  // other buffer over the link while it computes: the bound is the compute
  // of 8 launches of 100 us. Without, the second launch's room is the first
  // buffer's, free once that is written back, after the first launch; from
  // the third launch on the buffer comes in only after the launch before it
  // ended (the other one held the room) and before it starts: 100 us, then
  // 7 x (2 MiB at 16 GB/s + 100 us), the precedence the cap forces.
  std::ostringstream alone, alone_err;
  ASSERT_EQ(RunSim({path, "--limit", "50%"}, alone, alone_err), 0) << alone_err.str();
  EXPECT_NE(alone.str().find("time bound                 0.800 ms at least"), std::string::npos)
      << alone.str();
  std::ostringstream whole, whole_err;
  ASSERT_EQ(RunSim({path, "--limit", "50%", "--host-vmm", "off"}, whole, whole_err), 0)
      << whole_err.str();
  EXPECT_NE(whole.str().find("time bound                 1.718 ms at least"), std::string::npos)
      << whole.str();
  EXPECT_NE(whole.str().find("precedence 1.718 ms"), std::string::npos) << whole.str();
  EXPECT_NE(alone.str().find("x time bound"), std::string::npos) << alone.str();
  std::ostringstream out2, err2;
  // Too small, without host-located VMM: out of memory.
  EXPECT_EQ(RunSim({path, "--limit", "1MiB", "--host-vmm", "off"}, out2, err2), 1);
  EXPECT_NE(err2.str().find("out of memory"), std::string::npos) << err2.str();
  // With it (the default): both born in host memory and served there.
  std::ostringstream out4, err4;
  ASSERT_EQ(RunSim({path, "--limit", "1MiB"}, out4, err4), 0) << err4.str();
  EXPECT_NE(out4.str().find("served from host        16777216 bytes (16.0 MiB) over the link "
                            "in 8 buffer uses (0 by choice: where their room would displace "
                            "one needed no later or copy out a larger one nothing uses again or "
                            "they would be forced out again before their next use, or, "
                            "0 of them, pieces no pointer of a launch reached); 2 buffers born "
                            "in host memory (4.0 MiB)"),
            std::string::npos)
      << out4.str();
  std::ostringstream out3, err3;
  EXPECT_EQ(RunSim({path + ".missing", "--limit", "1MiB"}, out3, err3), 1);
  EXPECT_NE(err3.str().find("cannot open"), std::string::npos) << err3.str();
}

}  // namespace
}  // namespace stensor
