// Pre-tokenization: splitting text into the pieces the reference regexes match, with hand-written
// scanners that reproduce the regexes' leftmost-alternative semantics (backtracking of
// `\s+(?!\S)` included) over the pinned Unicode tables of text/unicode.h:
//   gpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   cl100k  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//           (also LLaMA-3's)
//   megatron_v1, megatron_v2   Megatron's TikTokenizer PATTERN_TIKTOKEN and PATTERN_TIKTOKEN_V2
// Tested in tests/unit/text/test_pretokenize.cpp.
#pragma once

#include <cstddef>
#include <string_view>

namespace mt::text {

enum class PretokenizePattern { gpt2, cl100k, megatron_v1, megatron_v2 };

// The pattern whose regex source text is `regex` (as written in a tokenizer.json or Megatron),
// or throws mt::Error saying the pattern is not supported.
PretokenizePattern pattern_from_regex(std::string_view regex);
std::string_view pattern_regex(PretokenizePattern pattern);

// Calls piece(std::string_view) for each consecutive match over `text` (valid UTF-8; should it not
// be, each byte outside a well-formed sequence counts as one code point of no class, so nothing is
// read out of bounds); the pieces concatenate to the text.
template <class PieceFn>
void pretokenize(PretokenizePattern pattern, std::string_view text, PieceFn&& piece);

// The length in bytes of the match starting at text[pos] (pos < text.size()).
size_t next_piece_length(PretokenizePattern pattern, std::string_view text, size_t pos);

template <class PieceFn>
void pretokenize(PretokenizePattern pattern, std::string_view text, PieceFn&& piece) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t length = next_piece_length(pattern, text, pos);
    piece(text.substr(pos, length));
    pos += length;
  }
}

}  // namespace mt::text
