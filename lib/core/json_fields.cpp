// Strict JSON config reading (see json_fields.h).
#include "core/json_fields.h"

namespace mt {

JsonFields::JsonFields(const nlohmann::json& json, std::string what) : json_(json), what_(std::move(what)) {
  if (!json_.is_object()) throw UsageError(what_, "must be a JSON object");
}

const nlohmann::json* JsonFields::find(const std::string& key) {
  read_.insert(key);
  auto it = json_.find(key);
  return it == json_.end() || it->is_null() ? nullptr : &*it;
}

void JsonFields::finish() const {
  for (auto it = json_.begin(); it != json_.end(); ++it) {
    if (!read_.count(it.key())) fail(it.key(), "unknown key");
  }
}

void JsonFields::fail(const std::string& key, const std::string& why) const {
  throw UsageError(what_ + " " + key, why);
}

}  // namespace mt
