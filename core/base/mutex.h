// stensor's mutex: absl::Mutex, except under ThreadSanitizer.
//
// Debian's abseil is a shared library built without TSan, so TSan cannot see
// absl::Mutex lock and unlock: every access the mutex guards would be
// reported as a race and nothing else would be found. Under TSan the same
// interface is built on std::mutex (pthread, which TSan intercepts), with the
// same lock annotations, so clang's thread-safety analysis checks one set of
// rules for both. Only what stensor uses is there: Lock/Unlock, ReaderLock
// (exclusive here: TSan builds check races, not throughput), Await and
// AwaitWithTimeout on an absl::Condition, MutexLock and ReaderMutexLock.
//
// StdMutex is that implementation, built everywhere (and tested); Mutex,
// MutexLock and ReaderMutexLock name the one this build uses.
//
// Thread-safety: a mutex, as absl::Mutex.
#ifndef STENSOR_CORE_BASE_MUTEX_H_
#define STENSOR_CORE_BASE_MUTEX_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#if defined(__SANITIZE_THREAD__)
#define STENSOR_STD_MUTEX 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STENSOR_STD_MUTEX 1
#endif
#endif

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/time/time.h"

namespace stensor {

// The std-based mutex, in every build (so that its tests run without TSan).
class ABSL_LOCKABLE StdMutex {
 public:
  StdMutex() = default;
  StdMutex(const StdMutex&) = delete;
  StdMutex& operator=(const StdMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Any change may make a waiter's condition true: every unlock wakes them.
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    changed_.notify_all();
    mu_.unlock();
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { Unlock(); }

  void Await(const absl::Condition& cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> held(mu_, std::adopt_lock);
    while (!cond.Eval()) {
      changed_.notify_all();  // what this thread changed before waiting
      changed_.wait(held);
    }
    held.release();
  }
  // True when `cond` holds at return, false when the time ran out first.
  bool AwaitWithTimeout(const absl::Condition& cond, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    std::unique_lock<std::mutex> held(mu_, std::adopt_lock);
    bool met = cond.Eval();
    while (!met) {
      changed_.notify_all();
      if (changed_.wait_until(held, deadline) == std::cv_status::timeout) {
        met = cond.Eval();
        break;
      }
      met = cond.Eval();
    }
    held.release();
    return met;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
};

class ABSL_SCOPED_LOCKABLE StdMutexLock {
 public:
  explicit StdMutexLock(StdMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~StdMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  StdMutexLock(const StdMutexLock&) = delete;
  StdMutexLock& operator=(const StdMutexLock&) = delete;

 private:
  StdMutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE StdReaderMutexLock {
 public:
  explicit StdReaderMutexLock(StdMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~StdReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  StdReaderMutexLock(const StdReaderMutexLock&) = delete;
  StdReaderMutexLock& operator=(const StdReaderMutexLock&) = delete;

 private:
  StdMutex* const mu_;
};

#ifdef STENSOR_STD_MUTEX
using Mutex = StdMutex;
using MutexLock = StdMutexLock;
using ReaderMutexLock = StdReaderMutexLock;
#else
using Mutex = absl::Mutex;
using MutexLock = absl::MutexLock;
using ReaderMutexLock = absl::ReaderMutexLock;
#endif

}  // namespace stensor

#endif  // STENSOR_CORE_BASE_MUTEX_H_
