// Log: what stensor says to the person running the program, on stderr.
// One path for every message of the library (warnings, fallbacks,
// limitations, errors that do not stop the program), through one spdlog
// logger: it honours STENSOR_LOG_LEVEL, every line starts "stensor: ", and
// each kind of message is rate-limited, so a warning raised per buffer or per
// launch cannot flood a long run. What the user asked for explicitly
// (STENSOR_STATS) and the fatal start-up errors written before the library
// is set up (interpose/raw_log.h) are not log messages.
//
// Thread-safety: every function may be called from any thread.
#ifndef STENSOR_CORE_BASE_LOG_H_
#define STENSOR_CORE_BASE_LOG_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "core/base/config.h"

namespace stensor {

// Messages below `level` are not written. Default: LogLevel::kWarn.
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);

// Messages of one `kind` (a short name, e.g. "pin") written at most, after
// which one line says the rest are only counted.
inline constexpr int kMaxMessagesPerKind = 10;

// Writes `message` (one line, no prefix) at `level` unless filtered out or
// past kMaxMessagesPerKind for `kind`.
void Say(LogLevel level, absl::string_view kind, absl::string_view message);
// At most once per `kind` for the life of the process (a limitation or a
// fallback that holds from then on).
void SayOnce(LogLevel level, absl::string_view kind, absl::string_view message);

// Messages of `kind` offered so far, written or not (for tests and stats).
uint64_t MessagesOfKind(absl::string_view kind);

}  // namespace stensor

#endif  // STENSOR_CORE_BASE_LOG_H_
