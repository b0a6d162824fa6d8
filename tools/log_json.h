// Access-log lines as JSON for the tools that read logs (`stensor sim`,
// `trace`, `report`): each line is read by nlohmann::json's SAX parser
// (Debian's nlohmann-json3-dev, iterative: no recursion into the text) into
// a DOM of bounded size. Records are flat, a few levels of objects and
// arrays, but one launch may list millions of buffer ids in `reads`: as a
// DOM (16 bytes and more a value), that is many times the line. So:
//
//   - nesting deeper than kMaxLogJsonDepth is an error (deeper text is not
//     stensor's, and would take nlohmann's recursive dump deep into the
//     stack);
//   - every array, and every object but the record itself, keeps its first
//     kMaxLogJsonElements elements; the rest are counted, per member of the
//     record (LogLine::left_out);
//   - a visitor sees every element of every array that is a member of the
//     record (the launch's `reads` and `writes`), kept or not, as it is
//     read: a caller that needs all the ids takes them there, in its own
//     compact form.
//
// So a parsed line takes the line's text plus a bounded DOM (an object of
// millions of members, which the library never writes, excepted: its
// members are all kept, about 8 times the text).
//
// Thread-safety: reentrant.
#ifndef STENSOR_TOOLS_LOG_JSON_H_
#define STENSOR_TOOLS_LOG_JSON_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace stensor {

inline constexpr int kMaxLogJsonDepth = 16;
inline constexpr size_t kMaxLogJsonElements = 1024;

// Why a line did not parse.
struct LogJsonError {
  enum class Kind {
    kTooDeep,     // nesting deeper than kMaxLogJsonDepth
    kSyntax,      // not JSON, or trailing text
    kOutOfRange,  // a number no double holds (1e999)
  };
  Kind kind = Kind::kSyntax;
  // nlohmann's message as its exception's what() gives it ("[json.exception.
  // parse_error.101] parse error at line 1, column 3: ..."); for kTooDeep,
  // "nesting deeper than 16 levels".
  std::string what;
  size_t offset = 0;  // the byte of the line where it broke

  // What broke without nlohmann's tag and one-line position: "syntax error
  // while parsing value - ...", "number overflow parsing '1e999'".
  std::string Reason() const;
  // "JSON: <Reason()> at offset N", as InvalidArgument.
  absl::Status ToStatus() const;
};

template <typename Json>
struct LogLine {
  Json record;  // the line's value (an object, for any access-log record)
  // Elements left out of arrays and nested objects, per member of the record
  // they are under, in text order of first loss.
  std::vector<std::pair<std::string, uint64_t>> left_out;
  std::optional<LogJsonError> error;  // set: `record` is not to be used
  bool ok() const { return !error.has_value(); }
};

// Called for each element of an array that is the value of a member of the
// record, in text order, whether the DOM keeps it or not: the member's name
// and the element (an array or object element comes as an empty one of its
// kind). Before the line is known to parse: a caller keeps what it takes
// until ParseLogLine returns ok.
template <typename Json>
using LogArrayVisitor = std::function<void(absl::string_view member, const Json& element)>;

// One line; `Json` is nlohmann::json or nlohmann::ordered_json (members in
// text order). A member named twice keeps its last value.
template <typename Json>
LogLine<Json> ParseLogLine(absl::string_view text, const LogArrayVisitor<Json>& visitor = nullptr);

extern template LogLine<nlohmann::json> ParseLogLine(absl::string_view,
                                                     const LogArrayVisitor<nlohmann::json>&);
extern template LogLine<nlohmann::ordered_json> ParseLogLine(
    absl::string_view, const LogArrayVisitor<nlohmann::ordered_json>&);

}  // namespace stensor

#endif  // STENSOR_TOOLS_LOG_JSON_H_
