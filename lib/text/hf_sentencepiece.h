// Hugging Face tokenizer.json files of SentencePiece-style BPE models (LLaMA-2, Mistral, as
// transformers' convert_slow_tokenizer writes them), --tokenizer-type HuggingFaceTokenizer; ids and
// decode exact against the `tokenizers` library (0.20), not sentencepiece (README, mt-tokenize):
// - normalizer: none, Prepend(p), Replace(String pattern, content), or a Sequence of them (the
//   "legacy" conversion: Prepend("▁") then Replace(" ", "▁"));
// - pre_tokenizer: none, or Metaspace(replacement, prepend_scheme always|first|never, split):
//   spaces become the replacement, which is put first (always; first: only in the text's first
//   part), and with split each replacement starts a new word (MergedWithNext);
// - model BPE: vocab, merges ("a b" or [a, b]) ranked by their line, unk_token, fuse_unk,
//   byte_fallback (an unknown character becomes its bytes' <0xNN> tokens), ignore_merges;
//   dropout, continuing_subword_prefix and end_of_word_suffix are refused by name;
// - added tokens: split out of the text first when encode is asked to (allow_special), leftmost
//   longest, as tokenizers always does; each remaining part is normalized and pre-tokenized alone
//   (so a Prepend normalizer puts "▁" after a special token: the legacy spacing);
// - decoder: Metaspace, or a Sequence of Replace(String), ByteFallback, Fuse, Strip, Metaspace;
//   decode keeps special tokens (tokenizers' skip_special_tokens=False, Megatron's detokenize).
// The <0xNN> byte-piece names and U+2581 are SentencePiece's (text/sentencepiece_model.h).
// Anything else in such a file is an mt::Error naming it.
// Tested in tests/unit/text/test_hf_sentencepiece_golden.cpp and tests/tools/mt-tokenize-hf-sentencepiece.bats.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/tokenizer.h"

namespace mt::text {

// Whether a tokenizer.json describes a SentencePiece-style model rather than a byte-level BPE: a
// BPE model (type "BPE" or none) with a Metaspace pre-tokenizer or none, or with byte_fallback.
bool is_hf_sentencepiece_json(const nlohmann::json& root);

// What the caller read from the file around the model: the post-processor's single-sequence ids,
// the reported name, the eod id and the hash.
struct HfSentencePieceFrame {
  std::vector<int32_t> sequence_prefix, sequence_suffix;
  std::string name;
  std::string hash;
};

// The tokenizer of a SentencePiece-style tokenizer.json (`path` names it in errors).
std::unique_ptr<Tokenizer> make_hf_sentencepiece_tokenizer(const nlohmann::json& root, const std::string& path,
                                                           HfSentencePieceFrame frame);

}  // namespace mt::text
