// JsonLine: builds one JSON object as a single line of text, for the access
// log. Keys are trusted identifiers; string values are escaped.
//
// Thread-safety: a JsonLine is used by one thread at a time.
#ifndef STENSOR_CORE_BASE_JSON_H_
#define STENSOR_CORE_BASE_JSON_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/types/span.h"

namespace stensor {

class JsonLine {
 public:
  JsonLine() : text_("{") {}

  JsonLine& Str(std::string_view key, std::string_view value);
  JsonLine& Int(std::string_view key, int64_t value);
  JsonLine& Uint(std::string_view key, uint64_t value);
  JsonLine& Double(std::string_view key, double value);
  JsonLine& Bool(std::string_view key, bool value);
  JsonLine& Uints(std::string_view key, absl::Span<const uint64_t> values);
  // `json` must already be valid JSON (an object, array or literal).
  JsonLine& Raw(std::string_view key, std::string_view json);

  // The finished object, without a trailing newline; call once.
  std::string Finish();

 private:
  void Key(std::string_view key);
  std::string text_;
};

// Appends `value` as a JSON string literal, quotes included. Control
// characters and DEL become \u escapes; invalid UTF-8 (a path or a kernel
// name may hold any bytes) becomes U+FFFD, so a line stays valid JSON.
void AppendJsonString(std::string* out, std::string_view value);

}  // namespace stensor

#endif  // STENSOR_CORE_BASE_JSON_H_
