#include "tools/json_reader.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stensor {
namespace {

// Deep nesting would recurse without bound on hostile input.
constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> Document() {
    JsonValue v;
    if (!Value(&v, 0)) return Error();
    SkipSpace();
    if (pos_ != text_.size()) {
      error_ = "trailing characters after the value";
      return Error();
    }
    return v;
  }

 private:
  absl::Status Error() const {
    return absl::InvalidArgumentError(absl::StrCat("JSON: ", error_, " at offset ", pos_));
  }
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Fail(const char* what) {
    error_ = what;
    return false;
  }
  bool Literal(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return Fail("unknown literal");
    pos_ += word.size();
    return true;
  }

  bool Value(JsonValue* v, int depth) {
    if (depth > kMaxDepth) return Fail("nesting too deep");
    SkipSpace();
    if (pos_ >= text_.size()) return Fail("unexpected end of text");
    char c = text_[pos_];
    switch (c) {
      case '{': return Object(v, depth);
      case '[': return Array(v, depth);
      case '"':
        v->kind = JsonValue::Kind::kString;
        return String(&v->string);
      case 't':
        v->kind = JsonValue::Kind::kBool;
        v->boolean = true;
        return Literal("true");
      case 'f':
        v->kind = JsonValue::Kind::kBool;
        return Literal("false");
      case 'n':
        v->kind = JsonValue::Kind::kNull;
        return Literal("null");
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return Number(v);
        return Fail("expected a value");
    }
  }

  bool Object(JsonValue* v, int depth) {
    v->kind = JsonValue::Kind::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return true;
    }
    for (;;) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Fail("expected a member name");
      std::string key;
      if (!String(&key)) return false;
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != ':') return Fail("expected ':'");
      ++pos_;
      JsonValue member;
      if (!Value(&member, depth + 1)) return false;
      v->object.emplace_back(std::move(key), std::move(member));
      SkipSpace();
      if (pos_ >= text_.size()) return Fail("unterminated object");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or '}'");
    }
  }

  bool Array(JsonValue* v, int depth) {
    v->kind = JsonValue::Kind::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return true;
    }
    for (;;) {
      JsonValue element;
      if (!Value(&element, depth + 1)) return false;
      v->array.push_back(std::move(element));
      SkipSpace();
      if (pos_ >= text_.size()) return Fail("unterminated array");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or ']'");
    }
  }

  static int Hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  bool Hex4(uint32_t* cp) {
    if (pos_ + 4 > text_.size()) return Fail("truncated \\u escape");
    *cp = 0;
    for (int i = 0; i < 4; ++i) {
      int h = Hex(text_[pos_ + i]);
      if (h < 0) return Fail("bad \\u escape");
      *cp = *cp * 16 + static_cast<uint32_t>(h);
    }
    pos_ += 4;
    return true;
  }

  bool String(std::string* out) {
    ++pos_;  // '"'
    while (pos_ < text_.size()) {
      char c = text_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) break;
      char e = text_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && text_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            uint32_t low = 0;
            if (!Hex4(&low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) return Fail("bad surrogate pair");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default: return Fail("bad escape");
      }
    }
    return Fail("unterminated string");
  }

  bool Number(JsonValue* v) {
    v->kind = JsonValue::Kind::kNumber;
    size_t start = pos_;
    bool negative = text_[pos_] == '-';
    if (negative) ++pos_;
    size_t digits = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    if (pos_ == digits) return Fail("expected digits");
    bool integer = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integer = false;
      ++pos_;
      size_t frac = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      if (pos_ == frac) return Fail("expected digits after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integer = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      size_t exp = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      if (pos_ == exp) return Fail("expected exponent digits");
    }
    std::string literal(text_.substr(start, pos_ - start));
    v->number = std::strtod(literal.c_str(), nullptr);
    if (integer && !negative) {
      uint64_t u = 0;
      bool fits = true;
      for (size_t i = digits; i < pos_; ++i) {
        uint64_t d = static_cast<uint64_t>(text_[i] - '0');
        if (u > (UINT64_MAX - d) / 10) {
          fits = false;
          break;
        }
        u = u * 10 + d;
      }
      if (fits) v->uint = u;
    }
    return true;
  }

  absl::string_view text_;
  size_t pos_ = 0;
  const char* error_ = "";
};

}  // namespace

const JsonValue* JsonValue::Find(absl::string_view key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const auto& [name, value] : object) {
    if (name == key) return &value;
  }
  return nullptr;
}

absl::string_view JsonValue::StringOr(absl::string_view key, absl::string_view fallback) const {
  const JsonValue* v = Find(key);
  return v != nullptr && v->kind == Kind::kString ? absl::string_view(v->string) : fallback;
}

std::optional<uint64_t> JsonValue::Uint(absl::string_view key) const {
  const JsonValue* v = Find(key);
  if (v == nullptr || v->kind != Kind::kNumber) return std::nullopt;
  return v->uint;
}

bool JsonValue::BoolOr(absl::string_view key, bool fallback) const {
  const JsonValue* v = Find(key);
  return v != nullptr && v->kind == Kind::kBool ? v->boolean : fallback;
}

std::optional<double> JsonValue::Number(absl::string_view key) const {
  const JsonValue* v = Find(key);
  if (v == nullptr || v->kind != Kind::kNumber) return std::nullopt;
  return v->number;
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) { return Parser(text).Document(); }

}  // namespace stensor
