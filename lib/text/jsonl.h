// Reading JSONL input for tokenization (Megatron's preprocess_data semantics): each line is one
// JSON object; for every requested key the value is either a string (one text) or a list of
// strings (pre-split sentences). Parsed with simdjson (fully validated, as Python's json.loads).
// Text that is not valid UTF-8 becomes U+FFFD per maximal subpart (Python's 'replace'), and a
// lone UTF-16 surrogate escape (\ud800) becomes U+FFFD (as tiktoken does); both are counted.
// Tested in tests/unit/text/test_jsonl.cpp.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mt::text {

// The strings of one key of one line: one entry for a string value, one per element for a list.
using KeyTexts = std::vector<std::string>;

class JsonlLineParser {
 public:
  explicit JsonlLineParser(std::vector<std::string> keys);
  ~JsonlLineParser();
  JsonlLineParser(JsonlLineParser&&) noexcept;
  JsonlLineParser& operator=(JsonlLineParser&&) noexcept;

  // Parses one line (without its '\n'; a trailing '\r' is JSON whitespace) into texts[k] for
  // keys[k] (texts is resized to the key count; strings keep their capacity between calls).
  // Returns the number of U+FFFD replacements made. Throws mt::Error with the reason (no line
  // number: the caller knows it) for malformed JSON, a missing key, or a value that is neither a
  // string nor a list of strings.
  size_t parse(std::string_view line, std::vector<KeyTexts>& texts);
  const std::vector<std::string>& keys() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Replaces every \uXXXX escape of a lone UTF-16 surrogate in JSON text by \ufffd; returns the
// count. Escaped backslashes (\\u...) are left alone.
size_t replace_lone_surrogate_escapes(std::string_view json, std::string& out);

}  // namespace mt::text
