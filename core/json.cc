#include "core/json.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stensor {

void AppendJsonString(std::string* out, std::string_view value) {
  out->push_back('"');
  for (char c : value) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

void JsonLine::Key(std::string_view key) {
  if (text_.size() > 1) text_.push_back(',');
  AppendJsonString(&text_, key);
  text_.push_back(':');
}

JsonLine& JsonLine::Str(std::string_view key, std::string_view value) {
  Key(key);
  AppendJsonString(&text_, value);
  return *this;
}

JsonLine& JsonLine::Int(std::string_view key, int64_t value) {
  Key(key);
  absl::StrAppend(&text_, value);
  return *this;
}

JsonLine& JsonLine::Uint(std::string_view key, uint64_t value) {
  Key(key);
  absl::StrAppend(&text_, value);
  return *this;
}

JsonLine& JsonLine::Double(std::string_view key, double value) {
  Key(key);
  if (std::isfinite(value)) {
    absl::StrAppendFormat(&text_, "%.9g", value);
  } else {
    text_.append("null");  // JSON has no infinities or NaN
  }
  return *this;
}

JsonLine& JsonLine::Bool(std::string_view key, bool value) {
  Key(key);
  text_.append(value ? "true" : "false");
  return *this;
}

JsonLine& JsonLine::Uints(std::string_view key,
                          absl::Span<const uint64_t> values) {
  Key(key);
  text_.push_back('[');
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) text_.push_back(',');
    absl::StrAppend(&text_, values[i]);
  }
  text_.push_back(']');
  return *this;
}

JsonLine& JsonLine::Raw(std::string_view key, std::string_view json) {
  Key(key);
  text_.append(json);
  return *this;
}

std::string JsonLine::Finish() {
  text_.push_back('}');
  return std::move(text_);
}

}  // namespace stensor
