// SentencePiece BPE tokenizers (Megatron's --tokenizer-type SentencePieceTokenizer,
// GPTSentencePieceTokenizer and Llama2Tokenizer, --tokenizer-model tokenizer.model), exact against
// sentencepiece 0.1.97 (Debian's python3-sentencepiece and spm_encode):
// - the model file is read by text/sentencepiece_model.h; model_type must be BPE, a denormalizer,
//   treat_whitespace_as_suffix and a normalization_rule_tsv are refused by name; the normalizer is
//   text/sentencepiece_normalizer.h (identity or a precompiled charsmap such as nmt_nfkc);
// - BPE as sentencepiece's bpe_model.cc: the text split into characters (user-defined pieces kept
//   whole), then the adjacent pair whose concatenation is the highest-scoring piece merged first
//   (ties: the leftmost), UNUSED pieces split back into the pair that made them;
// - an unknown character becomes its UTF-8 bytes' <0xNN> pieces with byte_fallback, else the
//   unknown id, a run of unknown pieces giving one id (sentencepiece's PopulateSentencePieceText);
// - decode as sentencepiece's Decode: control pieces vanish, U+2581 becomes a space, the first
//   piece's leading one is dropped (the dummy prefix), runs of <0xNN> pieces are UTF-8 with each
//   malformed byte U+FFFD, the unknown id is the model's unk_surface (" ⁇ " by default).
// Megatron-Core maps the three type names to one wrapper: no BOS in preprocessing, eod = the
// model's eos piece (a control piece; </s> = 2 for LLaMA-2 and Mistral). Control-piece text in the
// input stays text (sentencepiece never matches it), so encode refuses allow_special.
// Speed: the normalized text is cut before each U+2581 that follows another character when no piece
// spans such a cut (checked at load; LLaMA-2 and the trainer's pieces never do), and each part's ids
// are cached per thread, which gives the same ids as BPE over the whole text.
// Tested in tests/unit/text/test_sentencepiece.cpp and tests/unit/text/test_sentencepiece_golden.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "text/tokenizer.h"

namespace mt::text {

// The tokenizer of a .model file's bytes; `type` is the --tokenizer-type name it is reported as,
// `path` names the file in errors, `hash` is the caller's hash of the file and options.
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& type, const std::string& path,
                                                        std::string_view bytes, const std::string& hash);

// Megatron's names for a SentencePiece model.
bool is_sentencepiece_type(std::string_view type);

}  // namespace mt::text
