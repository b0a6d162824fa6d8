#include "core/base/json.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stensor {

void AppendJsonString(std::string* out, std::string_view text) {
  out->push_back('"');
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = text[i];
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
      ++i;
      continue;
    }
    if (c < 0x20 || c == 0x7f) {
      absl::StrAppendFormat(out, "\\u%04x", static_cast<int>(c));
      ++i;
      continue;
    }
    if (c < 0x80) {
      out->push_back(c);
      ++i;
      continue;
    }
    // The length of the UTF-8 sequence led by `c` and the range its second
    // byte must fall in (RFC 3629: no overlong forms, no surrogates, nothing
    // above U+10FFFF).
    size_t length = 0;
    unsigned char low = 0x80, high = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      length = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      length = 3;
      if (c == 0xe0) low = 0xa0;
      if (c == 0xed) high = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      length = 4;
      if (c == 0xf0) low = 0x90;
      if (c == 0xf4) high = 0x8f;
    }
    bool valid = length > 0 && i + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k) {
      const unsigned char next = text[i + k];
      valid = k == 1 ? next >= low && next <= high : next >= 0x80 && next <= 0xbf;
    }
    if (valid) {
      out->append(text.data() + i, length);
      i += length;
    } else {
      out->append("\\ufffd");
      ++i;
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

JsonLine& JsonLine::Uints(std::string_view key, absl::Span<const uint64_t> values) {
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
