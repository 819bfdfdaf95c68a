// DeepSeek-V3's Split sequence (lib/text/split_pretokenizer.h) on hand-worked cases of each regex
// and of the sequence (a later Split sees only the pieces of the earlier ones); the comparison with
// HF tokenizers on the torture corpus is test_deepseek_golden.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "text/split_pretokenizer.h"

namespace {

using Pieces = std::vector<std::string>;

Pieces pieces(const std::string& text) {
  Pieces out;
  mt::text::deepseek_v3_pretokenize(text, [&](std::string_view piece) { out.emplace_back(piece); });
  return out;
}

TEST(DeepSeekV3Splits, NumbersComeInRunsOfAtMostThree) {
  EXPECT_EQ(pieces("12345 x"), (Pieces{"123", "45", " x"}));
  EXPECT_EQ(pieces("1abc"), (Pieces{"1", "abc"})) << "the digit is a match of Split 1, the letters a gap";
  EXPECT_EQ(pieces("½²①٣"), (Pieces{"½²①", "٣"})) << "\\p{N}, not only ASCII digits";
}

TEST(DeepSeekV3Splits, HanAndKanaRunsAreIsolated) {
  EXPECT_EQ(pieces("我想apple工作"), (Pieces{"我想", "apple", "工作"}));
  EXPECT_EQ(pieces("ひらがなカタカナ"), (Pieces{"ひらがなカタカナ"}));
  EXPECT_EQ(pieces("龦x"), (Pieces{"龦x"})) << "U+9FA6 is past the range's U+9FA5";
}

TEST(DeepSeekV3Splits, WordsPunctuationAndWhitespaceFollowTheThirdRegex) {
  EXPECT_EQ(pieces("'s $foo"), (Pieces{"'s", " $", "foo"}));
  EXPECT_EQ(pieces("a  b"), (Pieces{"a", " ", " b"})) << "\\s+(?!\\S) leaves the last space to the word";
  EXPECT_EQ(pieces("x\r\n\r\n y"), (Pieces{"x", "\r\n\r\n", " y"})) << "\\s*[\\r\\n]+ ends at the last newline";
  EXPECT_EQ(pieces("!!!\n\n ??"), (Pieces{"!!!\n\n", " ??"}));
  EXPECT_EQ(pieces(" \u0301a"), (Pieces{" \u0301a"})) << "one optional non-letter, then letters and marks";
  EXPECT_EQ(pieces("a\x01" "b"), (Pieces{"a", "\x01" "b"})) << "a control is the optional character before letters";
  EXPECT_EQ(pieces("a\x01"), (Pieces{"a", "\x01"})) << "alone it matches nothing: a gap of its own";
  EXPECT_EQ(pieces("end  "), (Pieces{"end", "  "}));
}

TEST(DeepSeekV3Splits, PiecesConcatenateToTheText) {
  const std::string text = "Hello, 世界! 2024年10月\r\n\tcafé ½ — «x» \xff\xfe end";
  std::string joined;
  for (const auto& piece : pieces(text)) joined += piece;
  EXPECT_EQ(joined, text);
}

}  // namespace
