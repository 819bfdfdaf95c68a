// text/jsonl.h: JSONL lines as Megatron's preprocess_data reads them: strings and lists of
// strings per key, JSON escapes, invalid UTF-8 and lone surrogates replaced by U+FFFD and
// counted, and one clear error for every kind of bad line.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "text/jsonl.h"

using mt::text::JsonlLineParser;
using mt::text::KeyTexts;

namespace {

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

std::string error_of(JsonlLineParser& parser, const std::string& line) {
  std::vector<KeyTexts> texts;
  try {
    parser.parse(line, texts);
  } catch (const mt::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Jsonl, StringsListsAndSeveralKeys) {
  JsonlLineParser parser({"text", "title"});
  std::vector<KeyTexts> texts;
  EXPECT_EQ(parser.parse(R"({"title": "T", "id": 3, "text": "a\nb \"q\" \u00e9\ud83d\ude00"})", texts), 0u);
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_EQ(texts[0], KeyTexts{"a\nb \"q\" \xC3\xA9\xF0\x9F\x98\x80"});
  EXPECT_EQ(texts[1], KeyTexts{"T"});
  EXPECT_EQ(parser.parse(R"({"text": ["one", "", "three"], "title": []})" "\r", texts), 0u);
  EXPECT_EQ(texts[0], (KeyTexts{"one", "", "three"}));
  EXPECT_TRUE(texts[1].empty());
}

TEST(Jsonl, InvalidUtf8AndLoneSurrogatesBecomeReplacementCharacters) {
  JsonlLineParser parser({"text"});
  std::vector<KeyTexts> texts;
  EXPECT_EQ(parser.parse("{\"text\": \"a\xFF" "b\xE2\x82\"}", texts), 2u);
  EXPECT_EQ(texts[0][0], "a" + kReplacement + "b" + kReplacement);
  EXPECT_EQ(parser.parse(R"({"text": "x\ud800y\udc00z\\ud800"})", texts), 2u);
  EXPECT_EQ(texts[0][0], "x" + kReplacement + "y" + kReplacement + "z\\ud800");
}

TEST(Jsonl, LoneSurrogateEscapesAreFoundOutsideEscapedBackslashes) {
  std::string out;
  EXPECT_EQ(mt::text::replace_lone_surrogate_escapes(R"(["\ud83d\ude00", "\\ud800", "\udfff\ud800"])", out), 2u);
  EXPECT_EQ(out, R"(["\ud83d\ude00", "\\ud800", "\ufffd\ufffd"])");
}

TEST(Jsonl, BadLinesSayWhatIsWrong) {
  JsonlLineParser parser({"text"});
  EXPECT_NE(error_of(parser, R"({"text": "a")").find("malformed JSON"), std::string::npos);
  EXPECT_NE(error_of(parser, "").find("malformed JSON"), std::string::npos);
  EXPECT_NE(error_of(parser, R"(["text"])").find("not an object"), std::string::npos);
  EXPECT_NE(error_of(parser, R"({"text": "a"} {"text": "b"})").find("malformed JSON"), std::string::npos);
  EXPECT_EQ(error_of(parser, R"({"body": "a"})"), "key 'text': missing");
  EXPECT_EQ(error_of(parser, R"({"text": 5})"), "key 'text': is a number, expected a string or a list of strings");
  EXPECT_EQ(error_of(parser, R"({"text": null})"), "key 'text': is null, expected a string or a list of strings");
  EXPECT_EQ(error_of(parser, R"({"text": ["a", {"b": 1}]})"), "key 'text': element 1 is an object, expected a string");
  EXPECT_THROW(JsonlLineParser({}), mt::UsageError);
}

}  // namespace
