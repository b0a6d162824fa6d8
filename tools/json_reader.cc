#include "tools/json_reader.h"

#include <string>
#include <utility>

#include "tools/log_json.h"

namespace stensor {
namespace {

JsonValue Convert(const nlohmann::ordered_json& j) {
  JsonValue v;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
    case nlohmann::ordered_json::value_t::discarded:
      break;
    case nlohmann::ordered_json::value_t::boolean:
      v.kind = JsonValue::Kind::kBool;
      v.boolean = j.get<bool>();
      break;
    case nlohmann::ordered_json::value_t::number_unsigned:
      v.kind = JsonValue::Kind::kNumber;
      v.uint = j.get<uint64_t>();  // exact, not through a double
      v.number = static_cast<double>(*v.uint);
      break;
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_float:
      v.kind = JsonValue::Kind::kNumber;
      v.number = j.get<double>();
      break;
    case nlohmann::ordered_json::value_t::string:
      v.kind = JsonValue::Kind::kString;
      v.string = j.get<std::string>();
      break;
    case nlohmann::ordered_json::value_t::array:
      v.kind = JsonValue::Kind::kArray;
      v.array.reserve(j.size());
      for (const auto& item : j) v.array.push_back(Convert(item));
      break;
    case nlohmann::ordered_json::value_t::object:
      v.kind = JsonValue::Kind::kObject;
      v.object.reserve(j.size());
      for (const auto& [key, item] : j.items()) v.object.emplace_back(key, Convert(item));
      break;
    case nlohmann::ordered_json::value_t::binary:  // never from text
      break;
  }
  return v;
}

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

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) {
  absl::StatusOr<nlohmann::ordered_json> parsed = ParseLogJson(text);
  if (!parsed.ok()) return parsed.status();
  return Convert(*parsed);
}

}  // namespace stensor
