// DeepSeek-V3's pre-tokenizer: a tokenizer.json `Sequence` of three `Split` pre-tokenizers
// (behavior Isolated, invert false) before ByteLevel(use_regex false), as Hugging Face tokenizers
// runs it: the first Split cuts the text into its matches and the gaps between them, each piece is
// cut by the second, each of those by the third; the final pieces go to byte-level BPE. The three
// regexes are recognised by their exact strings, as DeepSeek-V3's tokenizer.json (Hugging Face,
// deepseek-ai/DeepSeek-V3, pre_tokenizer.pretokenizers[0..2].pattern.Regex, after JSON decoding;
// the same in DeepSeek-R1) writes them:
//   1  \p{N}{1,3}
//   2  [一-龥<U+3040>-ゟ゠-ヿ]+            (U+4E00..9FA5, U+3040..309F, U+30A0..30FF)
//   3  [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^<CR><LF>\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//       ?[\p{P}\p{S}]+[<CR><LF>]*|\s*[<CR><LF>]+|\s+(?!\S)|\s+
// (<CR><LF> are the characters themselves, as the JSON's "\r\n" escapes decode), and any other
// Split regex is refused naming it. Each regex is a hand-written scanner with Oniguruma's
// leftmost-alternative semantics over the Unicode 15.0 classes of text/unicode.h plus the P and S
// categories (text/punct_symbol_tables.inc from the UCD 15.0); code points assigned after 15.0 may
// split differently from tokenizers 0.23 (Unicode 16), as text/unicode.h says for the other patterns.
// Tested in tests/unit/text/test_split_pretokenizer.cpp and tests/unit/text/test_deepseek_golden.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace mt::text {

// The three Split regexes of DeepSeek-V3's tokenizer.json, in order.
const std::array<std::string_view, 3>& deepseek_v3_split_regexes();

// Calls piece(std::string_view) for each piece of `text` after DeepSeek-V3's three Splits (the
// pieces concatenate to the text). Bytes outside well-formed UTF-8 count as code points of no class.
template <class PieceFn>
void deepseek_v3_pretokenize(std::string_view text, PieceFn&& piece);

void deepseek_v3_pretokenize_into(std::string_view text, void (*sink)(void*, std::string_view), void* context);

template <class PieceFn>
void deepseek_v3_pretokenize(std::string_view text, PieceFn&& piece) {
  deepseek_v3_pretokenize_into(
      text, [](void* context, std::string_view p) { (*static_cast<std::remove_reference_t<PieceFn>*>(context))(p); },
      &piece);
}

}  // namespace mt::text
