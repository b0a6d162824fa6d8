#include "tools/log_json.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace stensor {

namespace {

// Where the nesting first goes deeper than `max_depth`, or npos.
size_t TooDeepAt(absl::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::string_view::npos;
}

// nlohmann's message without its "[json.exception.x.n] " tag and the line
// and column of a one-line text.
absl::string_view Reason(absl::string_view what) {
  if (size_t tag = what.find("] "); absl::StartsWith(what, "[json.exception.") && tag != what.npos) {
    what.remove_prefix(tag + 2);
  }
  if (absl::StartsWith(what, "parse error at line ")) {
    if (size_t colon = what.find(": "); colon != what.npos) what.remove_prefix(colon + 2);
  }
  return what;
}

}  // namespace

bool NestsTooDeep(absl::string_view text, int max_depth) {
  return TooDeepAt(text, max_depth) != absl::string_view::npos;
}

absl::StatusOr<nlohmann::ordered_json> ParseLogJson(absl::string_view text) {
  auto error = [text](absl::string_view why, size_t offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON: ", why, " at offset ", std::min(offset, text.size())));
  };
  if (size_t at = TooDeepAt(text, kMaxLogJsonDepth); at != absl::string_view::npos) {
    return error(absl::StrCat("nesting deeper than ", kMaxLogJsonDepth, " levels"), at);
  }
  try {
    return nlohmann::ordered_json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    return error(Reason(e.what()), e.byte == 0 ? 0 : e.byte - 1);
  } catch (const nlohmann::json::exception& e) {
    // out_of_range (a number like 1e999): no position given; the number
    // is quoted in the message.
    const absl::string_view what = Reason(e.what());
    size_t offset = 0;
    if (size_t q = what.find('\''); q != what.npos) {
      const absl::string_view rest = what.substr(q + 1);
      offset = text.find(rest.substr(0, rest.find('\'')));
      if (offset == absl::string_view::npos) offset = 0;
    }
    return error(what, offset);
  }
}

}  // namespace stensor
