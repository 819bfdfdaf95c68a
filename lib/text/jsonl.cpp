// JSONL line parsing with simdjson (see jsonl.h). Tested in tests/unit/text/test_jsonl.cpp.
#include "text/jsonl.h"

#include <simdjson.h>

#include <utility>

#include "core/error.h"
#include "text/unicode.h"

namespace mt::text {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The code unit of a \uXXXX escape starting at json[pos] (pointing at the backslash), or -1.
int escape_code_unit(std::string_view json, size_t pos) {
  if (pos + 6 > json.size() || json[pos] != '\\' || json[pos + 1] != 'u') return -1;
  int value = 0;
  for (size_t i = pos + 2; i < pos + 6; ++i) {
    const int digit = hex_value(json[i]);
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

const char* type_name(simdjson::dom::element_type type) {
  switch (type) {
    case simdjson::dom::element_type::ARRAY: return "a list";
    case simdjson::dom::element_type::OBJECT: return "an object";
    case simdjson::dom::element_type::INT64:
    case simdjson::dom::element_type::UINT64:
    case simdjson::dom::element_type::DOUBLE: return "a number";
    case simdjson::dom::element_type::STRING: return "a string";
    case simdjson::dom::element_type::BOOL: return "a boolean";
    case simdjson::dom::element_type::NULL_VALUE: return "null";
  }
  return "a value";
}

}  // namespace

size_t replace_lone_surrogate_escapes(std::string_view json, std::string& out) {
  out.clear();
  out.reserve(json.size());
  size_t replaced = 0;
  size_t pos = 0;
  while (pos < json.size()) {
    const char c = json[pos];
    if (c != '\\' || pos + 1 >= json.size()) {
      out.push_back(c);
      ++pos;
      continue;
    }
    const int unit = escape_code_unit(json, pos);
    if (unit < 0) {  // another escape (\\, \", \n, ...): copy both characters
      out.append(json.substr(pos, 2));
      pos += 2;
      continue;
    }
    const bool high = unit >= 0xD800 && unit <= 0xDBFF;
    const bool low = unit >= 0xDC00 && unit <= 0xDFFF;
    if (high) {
      const int next = escape_code_unit(json, pos + 6);
      if (next >= 0xDC00 && next <= 0xDFFF) {  // a valid pair
        out.append(json.substr(pos, 12));
        pos += 12;
        continue;
      }
    }
    if (high || low) {
      out += "\\ufffd";
      ++replaced;
    } else {
      out.append(json.substr(pos, 6));
    }
    pos += 6;
  }
  return replaced;
}

struct JsonlLineParser::State {
  std::vector<std::string> keys;
  simdjson::dom::parser parser;
  std::string sanitized;  // the line with invalid UTF-8 replaced
  std::string escaped;    // the line with lone surrogate escapes replaced
};

JsonlLineParser::JsonlLineParser(std::vector<std::string> keys) : state_(std::make_unique<State>()) {
  if (keys.empty()) throw UsageError("--json-keys", "at least one key is needed");
  state_->keys = std::move(keys);
}
JsonlLineParser::~JsonlLineParser() = default;
JsonlLineParser::JsonlLineParser(JsonlLineParser&&) noexcept = default;
JsonlLineParser& JsonlLineParser::operator=(JsonlLineParser&&) noexcept = default;

const std::vector<std::string>& JsonlLineParser::keys() const { return state_->keys; }

size_t JsonlLineParser::parse(std::string_view line, std::vector<KeyTexts>& texts) {
  State& s = *state_;
  size_t replaced = 0;
  std::string_view json = line;
  if (!is_valid_utf8(json)) {
    replaced += sanitize_utf8(json, s.sanitized);
    json = s.sanitized;
  }
  simdjson::dom::element root;
  auto error = s.parser.parse(json.data(), json.size()).get(root);
  if (error == simdjson::STRING_ERROR) {
    // The one string error JSON allows us to repair: a lone surrogate escape.
    const size_t surrogates = replace_lone_surrogate_escapes(json, s.escaped);
    if (surrogates > 0) {
      replaced += surrogates;
      error = s.parser.parse(s.escaped.data(), s.escaped.size()).get(root);
    }
  }
  if (error) throw Error("malformed JSON", simdjson::error_message(error));
  simdjson::dom::object object;
  if (root.get(object)) throw Error("malformed JSON", std::string("the line is ") + type_name(root.type()) + ", not an object");

  texts.resize(s.keys.size());
  for (size_t k = 0; k < s.keys.size(); ++k) {
    KeyTexts& out = texts[k];
    simdjson::dom::element value;
    if (object[s.keys[k]].get(value)) throw Error("key '" + s.keys[k] + "'", "missing");
    std::string_view text;
    if (!value.get(text)) {
      out.resize(1);
      out[0].assign(text);
      continue;
    }
    simdjson::dom::array list;
    if (value.get(list)) {
      throw Error("key '" + s.keys[k] + "'", std::string("is ") + type_name(value.type()) +
                                                 ", expected a string or a list of strings");
    }
    out.resize(list.size());
    size_t i = 0;
    for (simdjson::dom::element element : list) {
      if (element.get(text)) {
        throw Error("key '" + s.keys[k] + "'", "element " + std::to_string(i) + " is " + type_name(element.type()) +
                                                   ", expected a string");
      }
      out[i++].assign(text);
    }
  }
  return replaced;
}

}  // namespace mt::text
