#include "core/base/log.h"

#include <pthread.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace stensor {
namespace {

spdlog::level::level_enum SpdlogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kCritical:
      return spdlog::level::critical;
    case LogLevel::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::warn;
}

std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};

struct State {
  std::mutex mu;
  absl::flat_hash_map<std::string, uint64_t> counts;  // offered, by kind
  std::shared_ptr<spdlog::logger> logger;
};

State* g_state = nullptr;

// fork(): no message is being written while the process forks (Write holds
// the mutex throughout), so the child's logger, its sink's lock included, is
// free; the child would otherwise block at its first message.
void LockForFork() { g_state->mu.lock(); }
void UnlockAfterFork() { g_state->mu.unlock(); }

// Leaked: messages may come from exit-time code and other threads' hooks.
State& GetState() {
  static State* state = [] {
    auto* s = new State;
    g_state = s;
    pthread_atfork(LockForFork, UnlockAfterFork, UnlockAfterFork);
    // Not registered by name: nothing else can reach or drop it.
    s->logger = std::make_shared<spdlog::logger>("stensor",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
    s->logger->set_pattern("stensor: %v");
    s->logger->set_level(spdlog::level::trace);  // filtered in Say
    return s;
  }();
  return *state;
}

// Counts the message (the caller holds s.mu); true when it should be
// written, with `last` set when it is the last one written for its kind.
bool Admit(State& s, absl::string_view kind, uint64_t limit, bool* last) {
  const uint64_t n = ++s.counts[std::string(kind)];
  *last = n == limit;
  return n <= limit;
}

// With s.mu held (see LockForFork).
void Write(State& s, LogLevel level, absl::string_view message) {
  s.logger->log(SpdlogLevel(level), "{}", std::string(message));
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) {
  return level != LogLevel::kOff && static_cast<int>(level) >= g_level.load();
}

void Say(LogLevel level, absl::string_view kind, absl::string_view message) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  bool last = false;
  if (!Admit(s, kind, kMaxMessagesPerKind, &last) || !LogEnabled(level)) return;
  if (!last) {
    Write(s, level, message);
    return;
  }
  Write(s, level, absl::StrCat(message, " (further messages of this kind are not shown)"));
}

void SayOnce(LogLevel level, absl::string_view kind, absl::string_view message) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  bool last = false;
  if (!Admit(s, kind, 1, &last) || !LogEnabled(level)) return;
  Write(s, level, message);
}

uint64_t MessagesOfKind(absl::string_view kind) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.counts.find(kind);
  return it == s.counts.end() ? 0 : it->second;
}

}  // namespace stensor
