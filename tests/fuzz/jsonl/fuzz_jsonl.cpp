// libFuzzer target: mt-tokenize's JSONL line reader (text/jsonl.h) with the keys "text" and
// ["text", "title"], and the lone-surrogate rewrite before it. A malformed line is an mt::Error;
// every text it gives is valid UTF-8 (invalid input becomes U+FFFD) and one entry per key.
// Tested by the fuzz smoke runs and the replay tests of tests/fuzz/CMakeLists.txt.
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "text/jsonl.h"
#include "text/unicode.h"

namespace {

void parse_with(mt::text::JsonlLineParser& parser, std::string_view line) {
  std::vector<mt::text::KeyTexts> texts;
  mt::fuzz::refusals_only([&] {
    parser.parse(line, texts);
    FUZZ_CHECK(texts.size() == parser.keys().size());
    for (const auto& key_texts : texts)
      for (const auto& text : key_texts) FUZZ_CHECK(mt::text::is_valid_utf8(text));
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mt::text::JsonlLineParser text_only({"text"});
  static mt::text::JsonlLineParser text_and_title({"text", "title"});
  const std::string_view line = mt::fuzz::as_text(data, size);
  parse_with(text_only, line);
  parse_with(text_and_title, line);
  std::string rewritten;
  mt::text::replace_lone_surrogate_escapes(line, rewritten);
  parse_with(text_only, rewritten);
  return 0;
}
