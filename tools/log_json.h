// Access-log lines as JSON for the tools that read logs (`stensor sim`,
// `trace`, `report`): parsed with nlohmann::json (Debian's
// nlohmann-json3-dev), nesting bounded first. Records are flat, a few levels
// of objects and arrays; deeper text is not stensor's, and would take
// nlohmann's recursive copy and dump deep into the stack.
//
// Thread-safety: reentrant.
#ifndef STENSOR_TOOLS_LOG_JSON_H_
#define STENSOR_TOOLS_LOG_JSON_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace stensor {

inline constexpr int kMaxLogJsonDepth = 16;

// Whether `text` nests objects and arrays deeper than `max_depth`, strings
// skipped. (A scan: a parser callback would slow every parse by a third.)
bool NestsTooDeep(absl::string_view text, int max_depth = kMaxLogJsonDepth);

// One JSON text, members in text order. Errors (a syntax error, a number
// out of range such as 1e999, nesting too deep) say what broke and, for a
// syntax error, at which byte offset.
absl::StatusOr<nlohmann::ordered_json> ParseLogJson(absl::string_view text);

}  // namespace stensor

#endif  // STENSOR_TOOLS_LOG_JSON_H_
