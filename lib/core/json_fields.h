// Configs as JSON, each config's fields listed once: a config defines
//   template <typename Visit, typename Config> void visit_fields(Visit& visit, Config& config)
// calling visit("key", config.field) per field (visit("key", config.enum_field, names) for a named
// enum), and that one list serves JsonWriter (to JSON) and JsonFields (back, strictly: every key
// known, every value of the field's type and within its C++ type's range, missing or null keys
// keeping the default; errors are mt::UsageError naming the key). Fields are numbers, bools,
// strings, std::optional of those (null is Megatron's None) and std::vector of those.
// Tested in tests/unit/core/test_json_fields.cpp and the round trips of each config.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mt {

// The names of an enum's values, each once, for JSON: {{Enum::a, "a"}, ...}.
template <typename Enum, size_t N>
using EnumNames = std::pair<Enum, const char*>[N];

namespace json_detail {
template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};
template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};
}  // namespace json_detail

class JsonWriter {
 public:
  template <typename T>
  void operator()(const std::string& key, const T& value) {
    if constexpr (json_detail::IsOptional<T>::value) {
      json_[key] = value ? nlohmann::ordered_json(*value) : nlohmann::ordered_json(nullptr);
    } else {
      json_[key] = value;
    }
  }
  // A named enum; a value without a name is written as null.
  template <typename Enum, size_t N>
  void operator()(const std::string& key, const Enum& value, const EnumNames<Enum, N>& names) {
    json_[key] = nullptr;
    for (const auto& [candidate, name] : names) {
      if (candidate == value) json_[key] = name;
    }
  }
  nlohmann::ordered_json& json() { return json_; }

 private:
  nlohmann::ordered_json json_ = nlohmann::ordered_json::object();
};

class JsonFields {
 public:
  // `what` names the config in errors ("model config").
  JsonFields(const nlohmann::json& json, std::string what);

  // Reads `key` into `target` when present and not null; returns whether it was.
  template <typename T>
  bool operator()(const std::string& key, T& target) {
    const nlohmann::json* value = find(key);
    if (value == nullptr) return false;
    read_value(key, *value, target);
    return true;
  }

  // A named enum: "must be one of ... (got ...)" for another name.
  template <typename Enum, size_t N>
  bool operator()(const std::string& key, Enum& target, const EnumNames<Enum, N>& names) {
    std::string text;
    if (!(*this)(key, text)) return false;
    std::string known;
    for (const auto& [value, name] : names) {
      if (text == name) {
        target = value;
        return true;
      }
      known += (known.empty() ? "" : ", ") + std::string(name);
    }
    fail(key, "must be one of " + known + " (got " + text + ")");
  }

  // Refuses keys nobody read.
  void finish() const;
  [[noreturn]] void fail(const std::string& key, const std::string& why) const;

 private:
  const nlohmann::json* find(const std::string& key);

  template <typename T>
  void read_value(const std::string& key, const nlohmann::json& value, T& target) {
    if constexpr (json_detail::IsOptional<T>::value) {
      typename T::value_type inner{};
      read_value(key, value, inner);
      target = inner;
    } else if constexpr (json_detail::IsVector<T>::value) {
      if (!value.is_array()) fail(key, "must be a list");
      target.clear();
      for (const auto& item : value) {
        typename T::value_type element{};
        read_value(key, item, element);
        target.push_back(element);
      }
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!value.is_boolean()) fail(key, "must be true or false");
      target = value.get<bool>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!value.is_string()) fail(key, "must be a string");
      target = value.get<std::string>();
    } else if constexpr (std::is_integral_v<T>) {
      if (!value.is_number_integer()) fail(key, "must be an integer");
      const bool fits =
          value.is_number_unsigned()
              ? value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
              : value.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::lowest()) &&
                    (value.get<int64_t>() < 0 ||
                     static_cast<uint64_t>(value.get<int64_t>()) <= static_cast<uint64_t>(std::numeric_limits<T>::max()));
      if (!fits) fail(key, "out of range: " + value.dump());
      target = value.get<T>();
    } else {
      static_assert(std::is_floating_point_v<T>, "JSON config fields are bools, strings, integers or reals");
      if (!value.is_number()) fail(key, "must be a number");
      target = value.get<T>();
    }
  }

  const nlohmann::json& json_;
  std::string what_;
  std::set<std::string> read_;
};

}  // namespace mt
