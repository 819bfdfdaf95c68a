// Pre-tokenization (lib/text/pretokenize.h): for each pattern (gpt2, cl100k, Megatron v1/v2), inputs
// that exercise each alternative, with the pieces the reference regex gives; pattern lookup by
// regex text; coverage of random text; linear time on long runs.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/pretokenize.h"
#include "text/unicode.h"

using namespace mt::text;

namespace {

struct PieceCase {
  const char* name;  // "<pattern>/<what it exercises>"
  const char* text;
  std::vector<std::string> pieces;
};

PretokenizePattern pattern_of_case(const std::string& name) {
  std::string prefix = name.substr(0, name.find('/'));
  if (prefix == "gpt2") return PretokenizePattern::gpt2;
  if (prefix == "cl100k") return PretokenizePattern::cl100k;
  if (prefix == "v1") return PretokenizePattern::megatron_v1;
  return PretokenizePattern::megatron_v2;
}

std::vector<std::string> split(PretokenizePattern pattern, std::string_view text) {
  std::vector<std::string> pieces;
  pretokenize(pattern, text, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

const PretokenizePattern kAllPatterns[] = {PretokenizePattern::gpt2, PretokenizePattern::cl100k,
                                           PretokenizePattern::megatron_v1, PretokenizePattern::megatron_v2};

}  // namespace

// Expected pieces computed with Python's `regex` module (2026.5.9) findall() over each pattern's
// source text (pattern_regex); the same scanners were also checked against `regex` and against
// Hugging Face tokenizers' Oniguruma Split on 20,000 random strings of tricky code points, with
// no difference.
TEST(Pretokenize, EachAlternativeMatchesTheReferenceRegex) {
  // clang-format off
  const std::vector<PieceCase> cases = {
    {"gpt2/contractions", "it's they're we've I'm you'll he'd don't",
     {"it", "'s", " they", "'re", " we", "'ve", " I", "'m", " you", "'ll", " he", "'d", " don", "'t"}},
    {"gpt2/contractions_are_case_sensitive", "IT'S 'Re 'LL",
     {"IT", "'", "S", " '", "Re", " '", "LL"}},
    {"gpt2/contraction_long_s_not_folded", "'\305\277",
     {"'", "\305\277"}},
    {"gpt2/apostrophe_runs", "''s ' x 'x",
     {"''", "s", " '", " x", " '", "x"}},
    {"gpt2/space_letters", "Hello world \303\251t\303\251 \344\270\226\347\225\214",
     {"Hello", " world", " \303\251t\303\251", " \344\270\226\347\225\214"}},
    {"gpt2/space_numbers", "a 123 4567 \302\275\302\262",
     {"a", " 123", " 4567", " \302\275\302\262"}},
    {"gpt2/space_others", "a !?! ... --",
     {"a", " !?!", " ...", " --"}},
    {"gpt2/marks_are_not_letters", "e\314\201t cafe\314\201",
     {"e", "\314\201", "t", " cafe", "\314\201"}},
    {"gpt2/trailing_spaces", "Hello   ",
     {"Hello", "   "}},
    {"gpt2/spaces_before_word", "a    b",
     {"a", "   ", " b"}},
    {"gpt2/tab_before_word", "a\011b \011\011c",
     {"a", "\011", "b", " \011", "\011", "c"}},
    {"gpt2/newlines", "a\012\012b\015\012 c",
     {"a", "\012", "\012", "b", "\015\012", " c"}},
    {"gpt2/unicode_spaces", "a\302\240b\343\200\200\343\200\200c\302\205d\342\200\250e",
     {"a", "\302\240", "b", "\343\200\200", "\343\200\200", "c", "\302\205", "d", "\342\200\250", "e"}},
    {"gpt2/not_spaces", "a\342\200\213b\034c\357\273\277d",
     {"a", "\342\200\213", "b", "\034", "c", "\357\273\277", "d"}},
    {"gpt2/single_space_before_newline", "a \012b",
     {"a", " ", "\012", "b"}},
    {"gpt2/only_spaces", "   ",
     {"   "}},
    {"cl100k/contractions_case_insensitive", "IT'S 'Re 'LL we'D 'M 'T 'VE",
     {"IT", "'S", " '", "Re", " '", "LL", " we", "'D", " '", "M", " '", "T", " '", "VE"}},
    {"cl100k/contraction_long_s_and_kelvin", "'\305\277 '\305\277x 'S '\342\204\252",
     {"'\305\277", " '", "\305\277x", " '", "S", " '", "\342\204\252"}},
    {"cl100k/apostrophe_not_contraction", "'x ''s",
     {"'x", " ''", "s"}},
    {"cl100k/prefixed_letters", "Hello (world \011Tab \343\200\200wide 1a",
     {"Hello", " (", "world", " ", "\011Tab", " ", "\343\200\200wide", " ", "1", "a"}},
    {"cl100k/no_newline_prefix", "\012word \015word",
     {"\012", "word", " \015", "word"}},
    {"cl100k/digits_in_threes", "1234567 12 \331\243\331\244\331\245\331\246",
     {"123", "456", "7", " ", "12", " ", "\331\243\331\244\331\245", "\331\246"}},
    {"cl100k/space_others_and_newlines", "a !?\012\012b ...\015\012",
     {"a", " !?\012\012", "b", " ...\015\012"}},
    {"cl100k/others_then_newlines", "x;\012\012\011y",
     {"x", ";\012\012", "\011y"}},
    {"cl100k/spaces_then_newlines", "a  \012 \012  b",
     {"a", "  \012 \012", " ", " b"}},
    {"cl100k/space_tail", "a    b   ",
     {"a", "   ", " b", "   "}},
    {"cl100k/space_before_digit", "a  1",
     {"a", " ", " ", "1"}},
    {"cl100k/unicode_spaces", "a\302\240b\342\200\211\342\200\211c\302\205d",
     {"a", "\302\240b", "\342\200\211", "\342\200\211c", "\302\205d"}},
    {"cl100k/marks", "e\314\201t \340\244\250\340\244\256\340\244\270\340\245\215\340\244\244\340\245\207",
     {"e", "\314\201t", " \340\244\250\340\244\256\340\244\270", "\340\245\215\340\244\244", "\340\245\207"}},
    {"cl100k/emoji", "\360\237\221\215\360\237\217\275 ok \342\235\244\357\270\217",
     {"\360\237\221\215\360\237\217\275", " ok", " \342\235\244\357\270\217"}},
    {"v1/prefixed_letters", "Hello (world \011Tab",
     {"Hello", " (", "world", " ", "\011Tab"}},
    {"v1/single_digits", "2024 x1",
     {"2", "0", "2", "4", " x", "1"}},
    {"v1/others", " !?\012\012/path",
     {" !?\012\012", "/path"}},
    {"v1/spaces_then_one_newline", "a \012\012  b",
     {"a", " \012\012", " ", " b"}},
    {"v1/space_tail", "a   b  ",
     {"a", "  ", " b", "  "}},
    {"v1/no_contractions", "it's",
     {"it", "'s"}},
    {"v2/camel_case", "HelloWorld XMLHttpRequest iPhone",
     {"Hello", "World", " XMLHttp", "Request", " i", "Phone"}},
    {"v2/upper_run_then_lower", "ABCdef ABC",
     {"ABCdef", " ABC"}},
    {"v2/titlecase_and_modifier", "\307\205a \312\260b A\312\260",
     {"\307\205a", " \312\260b", " A\312\260"}},
    {"v2/mark_prefix_and_marks", "\314\201a e\314\201 \314\201\314\201 A\314\201B",
     {"\314\201a", " e\314\201", " \314\201\314\201", " A\314\201", "B"}},
    {"v2/prefix_before_upper", "(Abc) \011XYZ",
     {"(Abc", ")", " ", "\011XYZ"}},
    {"v2/single_digits", "123",
     {"1", "2", "3"}},
    {"v2/others_with_slashes", "a://b/ !!/\012",
     {"a", "://", "b", "/", " !!/\012"}},
    {"v2/newlines", "a \012\012  b",
     {"a", " \012\012", " ", " b"}},
    {"v2/space_tail", "a   b  ",
     {"a", "  ", " b", "  "}},
    {"v2/cjk", "\344\270\226\347\225\214abc",
     {"\344\270\226\347\225\214abc"}},
  };
  // clang-format on
  for (const PieceCase& c : cases) {
    EXPECT_EQ(split(pattern_of_case(c.name), c.text), c.pieces) << c.name;
  }
}

TEST(Pretokenize, PatternsAreFoundByTheirRegexText) {
  for (PretokenizePattern pattern : kAllPatterns) {
    EXPECT_EQ(pattern_from_regex(pattern_regex(pattern)), pattern);
  }
  // As written in Llama 3's tokenizer.json.
  const std::string llama3_split = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|)"
                                   R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(pattern_from_regex(llama3_split), PretokenizePattern::cl100k);
  EXPECT_THROW(pattern_from_regex(R"(\w+|\s+)"), mt::Error);
  EXPECT_THROW(pattern_from_regex(""), mt::Error);
}

TEST(Pretokenize, PiecesCoverRandomTextExactly) {
  const std::vector<char32_t> alphabet = {'a',    'Z',    '0',    ' ',    '\'',   '\t',    '\n',   '\r',   '!',
                                          '/',    's',    'T',    0x017F, 0x212A, 0x0085,  0x00A0, 0x3000, 0x200B,
                                          0x0301, 0x00BD, 0x01C5, 0x02B0, 0x4E00, 0x1F600, 0x0378, 0xFEFF};
  std::mt19937 rng(42);
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<int> length(0, 30);
  for (int i = 0; i < 2000; ++i) {
    std::string text;
    for (int n = length(rng); n > 0; --n) append_utf8(text, alphabet[pick(rng)]);
    for (PretokenizePattern pattern : kAllPatterns) {
      std::string joined;
      size_t count = 0;
      pretokenize(pattern, text, [&](std::string_view piece) {
        ASSERT_FALSE(piece.empty());
        ASSERT_TRUE(is_valid_utf8(piece));
        joined += piece;
        ++count;
      });
      ASSERT_EQ(joined, text);
    }
  }
}

TEST(Pretokenize, InvalidUtf8IsCoveredWithoutReadingPastTheEnd) {
  for (std::string text :
       {std::string("ab\xF0"), std::string("\xE2\x82"), std::string("'\xC5"), std::string("x \x80\xFFy"),
        std::string("\xED\xA0\x80 a"), std::string("1\xF4\x90\x80\x80")}) {
    for (PretokenizePattern pattern : kAllPatterns) {
      std::string joined;
      for (const std::string& piece : split(pattern, text)) joined += piece;
      EXPECT_EQ(joined, text);
    }
  }
}

// A million-character run is one piece (or two); a quadratic scanner would run into the suite's
// CTest timeout.
TEST(Pretokenize, LongRunsAreFewPieces) {
  const size_t n = 1000000;
  for (PretokenizePattern pattern : kAllPatterns) {
    for (char c : {'a', 'A', ' ', '\n', '!'}) {
      std::string text(n, c);
      text += "x";
      EXPECT_LE(split(pattern, text).size(), 3u) << c;
    }
  }
  std::string digits(n, '7');
  EXPECT_EQ(split(PretokenizePattern::cl100k, digits).size(), (n + 2) / 3);
  EXPECT_EQ(split(PretokenizePattern::gpt2, digits).size(), 1u);
}
