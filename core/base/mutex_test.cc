// StdMutex, the mutex stensor uses under ThreadSanitizer: exclusion, Await
// on a condition another thread makes true, AwaitWithTimeout both ways, and
// a waiter woken by a change made by a thread that then awaits itself.
#include "core/base/mutex.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace stensor {
namespace {

TEST(StdMutexTest, ExcludesOtherThreads) {
  StdMutex mu;
  int counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        StdMutexLock lock(&mu);
        counter = counter + 1;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  StdReaderMutexLock lock(&mu);
  EXPECT_EQ(counter, 40000);
}

TEST(StdMutexTest, AwaitReturnsOnceAnotherThreadMakesTheConditionTrue) {
  StdMutex mu;
  bool ready = false;
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    StdMutexLock lock(&mu);
    ready = true;
  });
  {
    StdMutexLock lock(&mu);
    mu.Await(absl::Condition(&ready));
    EXPECT_TRUE(ready);
  }
  setter.join();
}

TEST(StdMutexTest, AwaitWithTimeoutSaysWhetherTheConditionHeld) {
  StdMutex mu;
  bool ready = false;
  {
    StdMutexLock lock(&mu);
    EXPECT_FALSE(mu.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(10)));
  }
  std::thread setter([&] {
    StdMutexLock lock(&mu);
    ready = true;
  });
  {
    StdMutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(30)));
  }
  setter.join();
}

// A queue with back-pressure, as the access log's: the producer changes the
// state and awaits room without unlocking in between; the consumer must
// still see the change and make room.
TEST(StdMutexTest, AChangeBeforeAnAwaitWakesTheOtherWaiter) {
  StdMutex mu;
  int queued = 0;
  bool done = false;
  std::thread consumer([&] {
    StdMutexLock lock(&mu);
    for (;;) {
      auto work = [&] { return queued > 0 || done; };
      mu.Await(absl::Condition(&work));
      if (queued == 0 && done) return;
      queued = 0;
    }
  });
  {
    StdMutexLock lock(&mu);
    for (int i = 0; i < 1000; ++i) {
      auto room = [&] { return queued < 1; };
      mu.Await(absl::Condition(&room));
      ++queued;
    }
    done = true;
  }
  consumer.join();
  EXPECT_EQ(queued, 0);
}

}  // namespace
}  // namespace stensor
