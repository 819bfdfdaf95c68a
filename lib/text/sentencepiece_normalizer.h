// SentencePiece's normalizer (sentencepiece normalizer.cc), as its encoder runs it before BPE:
// - the precompiled charsmap of the model's NormalizerSpec: a darts-clone double-array trie over
//   UTF-8 byte strings whose values point into a table of NUL-terminated replacement strings; at
//   each position the longest match is replaced (nmt_nfkc, the trainer's default, is NFKC plus
//   control-character and whitespace folding). An empty charsmap is the identity rule (LLaMA-2,
//   Mistral). A malformed byte becomes U+FFFD, one byte at a time.
// - user-defined symbols pass through untouched (the longest one at each position);
// - with remove_extra_whitespaces: leading, trailing and repeated spaces dropped;
// - with add_dummy_prefix: one space in front; with escape_whitespaces: ' ' written as U+2581.
// Only the prefix form is built (treat_whitespace_as_suffix is refused by the loader).
// Tested in tests/unit/text/test_sentencepiece.cpp and tests/unit/text/test_sentencepiece_golden.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/sentencepiece_model.h"

namespace mt::text {

// The longest user-defined symbol starting a text (sentencepiece's PrefixMatcher).
class UserSymbolMatcher {
 public:
  explicit UserSymbolMatcher(const std::vector<std::string>& symbols);
  // Length in bytes of the longest symbol `text` starts with, 0 when none.
  size_t match(std::string_view text) const;
  bool empty() const { return count_ == 0; }

 private:
  std::array<std::vector<std::string>, 256> by_first_byte_;  // longest first
  size_t count_ = 0;
};

// The double-array trie and replacement strings of a precompiled charsmap.
class PrecompiledCharsmap {
 public:
  PrecompiledCharsmap() = default;
  // Checks the blob's layout; `path` names the model in errors.
  PrecompiledCharsmap(std::string_view blob, const std::string& path);
  bool empty() const { return units_.empty(); }
  // The longest rule matching a prefix of `text`: its length in bytes (0: none) and replacement.
  std::pair<size_t, std::string_view> longest_match(std::string_view text) const;

 private:
  std::vector<uint32_t> units_;
  std::string replacements_;
  std::string path_;
};

class SentencePieceNormalizer {
 public:
  SentencePieceNormalizer(const SentencePieceNormalizerSpec& spec, const std::vector<std::string>& user_symbols,
                          const std::string& path);
  // Appends the normalized form of `text` to `out` (which the caller clears).
  void normalize(std::string_view text, std::string& out) const;

 private:
  // One normalization step at the start of `text`: the bytes consumed and what they become.
  std::pair<size_t, std::string_view> normalize_prefix(std::string_view text) const;

  SentencePieceNormalizerSpec spec_;
  PrecompiledCharsmap charsmap_;
  UserSymbolMatcher user_symbols_;
};

// The length of the valid UTF-8 character starting `text` as sentencepiece's IsValidDecodeUTF8
// sees it (no surrogates, no overlong forms, at most U+10FFFF; a literal U+FFFD is valid), or 0
// when the first byte does not start one.
size_t valid_utf8_length(std::string_view text);

}  // namespace mt::text
