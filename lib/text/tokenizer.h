// Exact byte-level BPE tokenizers, Megatron's --tokenizer-type names:
//   GPT2BPETokenizer      --vocab-file encoder.json --merge-file vocab.bpe (GPT-2's two files);
//                         eod = "<|endoftext|>" (50256), vocab_size 50257
//   TikTokenizer          --tokenizer-model FILE, one of:
//                         - a tiktoken rank file (`base64 rank` lines); ids equal tiktoken's. The
//                           encoding is recognised by its rank count and rank 256:
//                             r50k_base   50256 ranks: gpt2 pattern, "<|endoftext|>" = 50256
//                             cl100k_base 100256 ranks: cl100k pattern, "<|endoftext|>" = 100257,
//                                         "<|fim_prefix|>" 100258, "<|fim_middle|>" 100259,
//                                         "<|fim_suffix|>" 100260, "<|endofprompt|>" 100276;
//                                         vocab_size 100277 (ids 100256, 100261..100275 unused)
//                             LLaMA-3     128000 ranks (tokenizer.model): cl100k pattern, Meta's 256
//                                         specials 128000..128255, eod "<|end_of_text|>" = 128001
//                           any other rank file: cl100k pattern, no special tokens, no eod,
//                           vocab_size = largest rank + 1. --tiktoken-pattern overrides the pattern.
//                         - Megatron's TikTokenizer JSON vocabulary (a list of {rank, token_bytes,
//                           token_str}; recognised by starting with '['), as CustomTikTokenizer in
//                           megatron/training/tokenizer/tokenizer.py: pattern v2 unless
//                           --tiktoken-pattern v1; --tiktoken-num-special-tokens N (>= 3) specials
//                           first: "<unk>" 0, "<s>" 1, "</s>" 2, "<SPECIAL_3>" .. "<SPECIAL_N-1>";
//                           rank r has id r + N; eod = "</s>" = 2; vocab_size = N + ranks (Megatron
//                           takes it from --vocab-size; we use the whole file).
//                         tiktoken_pattern accepts v1, v2 (Megatron's PATTERN_TIKTOKEN and
//                         PATTERN_TIKTOKEN_V2), gpt2 and cl100k.
//   HuggingFaceTokenizer  --tokenizer-model tokenizer.json of a byte-level BPE: model type "BPE"
//                         (or absent), no normalizer, pre_tokenizer ByteLevel (use_regex, no
//                         add_prefix_space) = gpt2 pattern, or Sequence[Split(Regex of a supported
//                         pattern, Isolated), ByteLevel(use_regex false)], or DeepSeek-V3's
//                         Sequence of three Splits (text/split_pretokenizer.h); merges as "a b" strings
//                         or [a, b] pairs; ignore_merges honoured. Anything else is an mt::Error.
//                         Every added token is a special token; eod is the first of
//                         "<|endoftext|>", "<|end_of_text|>", "</s>" among them (tokenizer.json
//                         does not name an eos); vocab_size = largest id + 1. The post-processor
//                         may be ByteLevel (ids unchanged), TemplateProcessing, or a Sequence of
//                         them (LLaMA-3's); the single-sequence template's special tokens are put
//                         around each sequence by encode_sequence (Megatron's HF tokenize, HF's
//                         add_special_tokens=True; LLaMA-3: BOS 128000 first) unless
//                         include_special_tokens is false (then the name ends ":no-special-tokens").
//                         A SentencePiece-style tokenizer.json (LLaMA-2's, Mistral's: a BPE model
//                         with a Metaspace pre-tokenizer or none, or with byte_fallback) is read by
//                         text/hf_sentencepiece.h instead, with the same post-processor and eod rule.
//   SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer
//                         --tokenizer-model tokenizer.model: a SentencePiece BPE model, ids equal
//                         sentencepiece's; eod = the model's eos piece, no BOS
//                         (text/sentencepiece_tokenizer.h).
// Each file is checked against what its type needs, and a file that is not is an mt::Error naming
// it: rank files have one `base64 rank` line per token with ranks 0..n-1, no hole, no repeat (a line
// cut short names its line), and a file that starts like r50k_base, cl100k_base or LLaMA-3 (the
// first 512 ranks) must have all of their ranks; GPT-2's encoder.json has ids 0..n-1 and every token
// is a byte, "<|endoftext|>" or made by a merge of vocab.bpe (so an empty or cut vocab.bpe is refused).
// Pre-tokenization follows each reference's regex exactly (text/pretokenize.h), merging stays
// O(n log n) on pathological pieces, whole pieces found in the vocabulary are taken as one token
// before merging where the reference does so (tiktoken, HF ignore_merges). Special tokens are
// recognised in text only when asked (allow_special); otherwise "<|endoftext|>" is plain text.
// (HF tokenizers itself always splits out added tokens: pass allow_special to match it.)
// Tested in tests/unit/text/test_tokenizer.cpp and tests/unit/text/test_tokenizer_golden.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mt::text {

struct TokenizerOptions {
  std::string type;             // GPT2BPETokenizer | TikTokenizer | HuggingFaceTokenizer | the SentencePiece
                                // names | BertWordPieceLowerCase | BertWordPieceCase (text/wordpiece.h)
  std::string vocab_file;       // GPT2BPETokenizer: encoder.json; BertWordPiece*: vocab.txt
  std::string merge_file;       // GPT2BPETokenizer: vocab.bpe
  std::string tokenizer_model;  // TikTokenizer / HuggingFaceTokenizer / SentencePiece .model
  std::string tiktoken_pattern;             // "" = the file's own (or v2 for Megatron's JSON); v1|v2
  int tiktoken_num_special_tokens = 1000;   // Megatron's JSON layout only
  // HuggingFaceTokenizer: apply the post-processor's template in encode_sequence (Megatron's
  // default; --tokenizer-hf-no-include-special-tokens clears it); BertWordPiece*: [CLS] ... [SEP].
  bool include_special_tokens = true;
};

class Tokenizer {
 public:
  // Throws mt::UsageError for a bad combination of options (missing file flag, unknown type or
  // pattern) and mt::Error naming the file for unreadable or malformed tokenizer files.
  static std::unique_ptr<Tokenizer> load(const TokenizerOptions& options);
  virtual ~Tokenizer() = default;

  // Appends the ids of `text` (valid UTF-8: sanitize first; invalid bytes are still encoded, as
  // bytes of no Unicode class, so the ids' bytes give the input back) to `out`. With allow_special, the
  // tokenizer's special-token strings in the text become their ids. Thread-safe (any cache is
  // per thread).
  virtual void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special = false) const = 0;
  // Megatron's tokenize(): sequence_prefix(), the ids of encode(), sequence_suffix(). This is what a
  // document's sequence holds in a token dataset.
  void encode_sequence(std::string_view text, std::vector<int32_t>& out, bool allow_special = false) const;
  // The special ids a post-processor's template puts before and after a sequence (empty without
  // one, or with TokenizerOptions::include_special_tokens false).
  virtual std::span<const int32_t> sequence_prefix() const { return {}; }
  virtual std::span<const int32_t> sequence_suffix() const { return {}; }
  // Whether raw text cut where text/preprocess.h's split_points_for_parallel_encoding says gives,
  // part by part, the ids of the whole. False where the start of a text is special (SentencePiece's
  // dummy prefix, a Prepend normalizer, Metaspace's prepended "▁"): such text is encoded whole.
  virtual bool encodes_parts_alike() const { return true; }
  // The bytes of the ids concatenated, as UTF-8 with invalid sequences replaced (Python's
  // 'replace'); throws mt::Error for an id outside [0, vocab_size).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The raw bytes of one id (special tokens: their text).
  virtual std::string token_bytes(int32_t id) const = 0;

  virtual int64_t vocab_size() const = 0;  // every id, special tokens included (Megatron's vocab_size)
  virtual std::optional<int32_t> eod_id() const = 0;
  virtual std::optional<int32_t> special_token_id(std::string_view text) const = 0;
  virtual std::string name() const = 0;  // e.g. "GPT2BPETokenizer", "TikTokenizer:cl100k_base"
  virtual std::string hash() const = 0;  // "fnv1a64:<16 hex digits>" over the files' bytes and options
};

}  // namespace mt::text
