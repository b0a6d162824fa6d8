#include "core/log.h"

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
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kCritical: return spdlog::level::critical;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};

struct State {
  std::mutex mu;
  absl::flat_hash_map<std::string, uint64_t> counts;  // offered, by kind
  std::shared_ptr<spdlog::logger> logger;
};

// Leaked: messages may come from exit-time code and other threads' hooks.
State& GetState() {
  static State* state = [] {
    auto* s = new State;
    // Not registered by name: nothing else can reach or drop it.
    s->logger = std::make_shared<spdlog::logger>(
        "stensor", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    s->logger->set_pattern("stensor: %v");
    s->logger->set_level(spdlog::level::trace);  // filtered in Say
    return s;
  }();
  return *state;
}

// Counts the message; true when it should be written, with `note` set when
// it is the last one written for its kind.
bool Admit(absl::string_view kind, uint64_t limit, bool* last) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  const uint64_t n = ++s.counts[std::string(kind)];
  *last = n == limit;
  return n <= limit;
}

void Write(LogLevel level, absl::string_view message) {
  GetState().logger->log(SpdlogLevel(level), "{}", std::string(message));
}

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) {
  return level != LogLevel::kOff && static_cast<int>(level) >= g_level.load();
}

void Say(LogLevel level, absl::string_view kind, absl::string_view message) {
  bool last = false;
  if (!Admit(kind, kMaxMessagesPerKind, &last) || !LogEnabled(level)) return;
  if (!last) {
    Write(level, message);
    return;
  }
  Write(level, absl::StrCat(message, " (further messages of this kind are not shown)"));
}

void SayOnce(LogLevel level, absl::string_view kind, absl::string_view message) {
  bool last = false;
  if (!Admit(kind, 1, &last) || !LogEnabled(level)) return;
  Write(level, message);
}

uint64_t MessagesOfKind(absl::string_view kind) {
  State& s = GetState();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.counts.find(kind);
  return it == s.counts.end() ? 0 : it->second;
}

}  // namespace stensor
