#include "tools/log_json.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace stensor {
namespace {

// Where the nesting first goes deeper than `max_depth`, or npos. A scan
// before the parse: the SAX events carry no position.
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

// nlohmann's SAX events into a DOM of bounded size (log_json.h): every
// container but a top-level object keeps kMaxLogJsonElements elements, the
// rest are counted; elements of the record's array members go to the
// visitor as they come.
template <typename Json>
class BoundedDom {
 public:
  using number_integer_t = typename Json::number_integer_t;
  using number_unsigned_t = typename Json::number_unsigned_t;
  using number_float_t = typename Json::number_float_t;
  using string_t = typename Json::string_t;
  using binary_t = typename Json::binary_t;

  BoundedDom(absl::string_view text, LogLine<Json>* line, const LogArrayVisitor<Json>& visitor)
      : text_(text), line_(line), visitor_(visitor) {}

  bool null() { return Scalar(Json(nullptr)); }
  bool boolean(bool value) { return Scalar(Json(value)); }
  bool number_integer(number_integer_t value) { return Scalar(Json(value)); }
  bool number_unsigned(number_unsigned_t value) { return Scalar(Json(value)); }
  bool number_float(number_float_t value, const string_t&) { return Scalar(Json(value)); }
  bool string(string_t& value) { return Scalar(Json(std::move(value))); }
  bool binary(binary_t&) { return true; }  // never in JSON text
  bool start_object(std::size_t) { return Open(Json::value_t::object); }
  bool start_array(std::size_t) { return Open(Json::value_t::array); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(string_t& key) {
    key_ = std::move(key);
    if (frames_.size() == 1) member_ = key_;
    return true;
  }

  bool parse_error(std::size_t position, const std::string& token,
                   const nlohmann::detail::exception& e) {
    LogJsonError error;
    error.what = e.what();
    if (e.id >= 400 && e.id < 500) {
      // A number out of range: the position is past its token.
      error.kind = LogJsonError::Kind::kOutOfRange;
      error.offset = position >= token.size() ? position - token.size() : 0;
    } else {
      error.kind = LogJsonError::Kind::kSyntax;
      error.offset = position == 0 ? 0 : position - 1;
    }
    error.offset = std::min(error.offset, text_.size());
    line_->error = std::move(error);
    return false;
  }

 private:
  // Whether values arriving now are elements of an array member of the
  // record.
  bool Visiting() const {
    return visitor_ && frames_.size() == 2 && frames_[0] != nullptr && frames_[0]->is_object() &&
           frames_[1] != nullptr && frames_[1]->is_array();
  }

  void LeftOut() {
    std::vector<std::pair<std::string, uint64_t>>& counts = line_->left_out;
    const std::string& member = frames_[0]->is_object() ? member_ : std::string();
    if (counts.empty() || counts.back().first != member) {
      auto it = std::find_if(counts.begin(), counts.end(),
                             [&](const auto& c) { return c.first == member; });
      if (it == counts.end()) {
        counts.emplace_back(member, 0);
        it = counts.end() - 1;
      }
      ++it->second;
      return;
    }
    ++counts.back().second;
  }

  // Where the next value goes, or null when it is left out. Values inside
  // something left out are skipped, not counted.
  Json* Slot() {
    if (frames_.empty()) return &line_->record;
    Json* container = frames_.back();
    if (container == nullptr) return nullptr;
    const bool record = frames_.size() == 1;
    if (container->is_object()) {
      if (!record && container->size() >= kMaxLogJsonElements && !container->contains(key_)) {
        LeftOut();
        return nullptr;
      }
      return &(*container)[key_];
    }
    if (container->size() >= kMaxLogJsonElements) {
      LeftOut();
      return nullptr;
    }
    container->push_back(Json());
    return &container->back();
  }

  bool Scalar(Json value) {
    if (Visiting()) visitor_(member_, value);
    if (Json* slot = Slot(); slot != nullptr) *slot = std::move(value);
    return true;
  }

  // Pointers into the DOM stay valid: a container only grows while it is
  // the innermost one open.
  bool Open(typename Json::value_t kind) {
    if (Visiting()) visitor_(member_, Json(kind));
    Json* slot = Slot();
    if (slot != nullptr) *slot = Json(kind);
    frames_.push_back(slot);
    return true;
  }

  bool Close() {
    frames_.pop_back();
    return true;
  }

  const absl::string_view text_;
  LogLine<Json>* const line_;
  const LogArrayVisitor<Json>& visitor_;
  std::vector<Json*> frames_;  // open containers, outermost first; null: left out
  string_t key_;               // of the value to come, in an object
  std::string member_;         // the record's member being read
};

}  // namespace

std::string LogJsonError::Reason() const {
  absl::string_view reason = what;
  if (size_t tag = reason.find("] ");
      absl::StartsWith(reason, "[json.exception.") && tag != reason.npos) {
    reason.remove_prefix(tag + 2);
  }
  if (absl::StartsWith(reason, "parse error at line ")) {
    if (size_t colon = reason.find(": "); colon != reason.npos) reason.remove_prefix(colon + 2);
  }
  return std::string(reason);
}

absl::Status LogJsonError::ToStatus() const {
  return absl::InvalidArgumentError(absl::StrCat("JSON: ", Reason(), " at offset ", offset));
}

template <typename Json>
LogLine<Json> ParseLogLine(absl::string_view text, const LogArrayVisitor<Json>& visitor) {
  LogLine<Json> line;
  if (size_t at = TooDeepAt(text, kMaxLogJsonDepth); at != absl::string_view::npos) {
    LogJsonError error;
    error.kind = LogJsonError::Kind::kTooDeep;
    error.what = absl::StrCat("nesting deeper than ", kMaxLogJsonDepth, " levels");
    error.offset = at;
    line.error = std::move(error);
    return line;
  }
  BoundedDom<Json> dom(text, &line, visitor);
  if (!Json::sax_parse(text.data(), text.data() + text.size(), &dom) && line.ok()) {
    LogJsonError error;  // not reached: the builder stops only on an error
    error.what = "the parse stopped";
    line.error = std::move(error);
  }
  if (!line.ok()) line.record = Json();
  return line;
}

template LogLine<nlohmann::json> ParseLogLine(absl::string_view,
                                              const LogArrayVisitor<nlohmann::json>&);
template LogLine<nlohmann::ordered_json> ParseLogLine(
    absl::string_view, const LogArrayVisitor<nlohmann::ordered_json>&);

}  // namespace stensor
