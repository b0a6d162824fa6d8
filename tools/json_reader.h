// JsonValue and ParseJson: the access log's lines (one JSON object each;
// docs/access-log.md) as plain values for `stensor sim`, parsed by
// nlohmann::json (tools/log_json.h). Unsigned integers stay exact (buffer
// ids, byte counts); trailing garbage is rejected, so a truncated or corrupt
// line is an error naming where it broke.
//
// Thread-safety: values are plain data; ParseJson is reentrant.
#ifndef STENSOR_TOOLS_JSON_READER_H_
#define STENSOR_TOOLS_JSON_READER_H_

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace stensor {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  // Set when the number is a non-negative integer that fits: exact.
  std::optional<uint64_t> uint;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;  // in text order

  // The member named `key` of an object, or null when absent (or not an object).
  const JsonValue* Find(absl::string_view key) const;
  // Conveniences for the log's fields: the fallback when absent or of
  // another kind.
  absl::string_view StringOr(absl::string_view key, absl::string_view fallback) const;
  std::optional<uint64_t> Uint(absl::string_view key) const;
  bool BoolOr(absl::string_view key, bool fallback) const;
  std::optional<double> Number(absl::string_view key) const;
};

// Parses one JSON text. Errors say what was expected and at which offset.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

}  // namespace stensor

#endif  // STENSOR_TOOLS_JSON_READER_H_
