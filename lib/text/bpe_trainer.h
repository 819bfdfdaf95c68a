// Byte-level BPE vocabulary training (`mt-tokenize train`): texts are pre-tokenized with one of
// the reference regexes (text/pretokenize.h), unique pieces are counted, and pairs of adjacent
// tokens are merged greedily, most frequent first, with incremental pair counts, a lazily updated
// priority queue and a pair -> words index. The result is written in GPT-2's two-file format
// (encoder.json + vocab.bpe) that GPT2BPETokenizer (text/tokenizer.h) loads.
//
// The merges are those of Hugging Face tokenizers' BpeTrainer over a ByteLevel pre-tokenizer with
// initial_alphabet=ByteLevel.alphabet() at the same vocab_size, min_frequency and number of special
// tokens: ties between pairs of equal count go to the pair whose (left id, right id) is smallest,
// where the 256 byte tokens are numbered in GPT-2's order (the order of their bytes_to_unicode
// characters, as HF numbers its alphabet) and learned tokens in the order they were created; a
// merge whose result already exists reuses that token. The result depends only on the multiset
// of texts, not on the order or the grouping in which they were added.
//
// Typical use (one trainer per worker thread, merged before training):
//   BpeTrainer trainer({.vocab_size = 32000});
//   for (auto& doc : docs) trainer.add_text(doc);
//   BpeVocabulary vocab = trainer.train();
//   write_gpt2_files(vocab, "out-vocab.json", "out-merges.txt");
// Tested in tests/unit/text/test_bpe_trainer.cpp; compression against HF in
// tests/bench/bench_bpe_train.sh.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/pretokenize.h"

namespace mt::text {

struct BpeTrainerOptions {
  // Every id of the result: 256 byte tokens + learned tokens + special tokens. Training stops
  // earlier only when no pair occurs min_frequency times any more (BpeVocabulary::exhausted).
  int64_t vocab_size = 0;
  PretokenizePattern pattern = PretokenizePattern::gpt2;
  // A pair seen fewer times than this (over all texts) is never merged; HF's min_frequency.
  int64_t min_frequency = 2;
  // Appended after the learned tokens, in this order; "<|endoftext|>" is GPT-2's end of document.
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
};

// Throws mt::UsageError naming the option when vocab_size cannot hold the 256 byte tokens and the
// special tokens or exceeds 2^31 - 1, min_frequency < 1, or a special token is empty or repeated.
void validate(const BpeTrainerOptions& options);

struct BpeVocabulary {
  // id -> raw bytes: ids 0..255 are the single bytes in GPT-2's order (byte_token_order()), then
  // learned tokens, then the special tokens (their text).
  std::vector<std::string> tokens;
  // The merges in rank order, as raw bytes of the left and right token; each distinct pair once.
  std::vector<std::pair<std::string, std::string>> merges;
  int64_t num_special_tokens = 0;
  bool exhausted = false;  // stopped below vocab_size: no pair left with count >= min_frequency
};

// Accumulates the counts of pre-tokenized pieces, then learns merges from them. Not thread-safe:
// use one trainer per thread and merge() them.
class BpeTrainer {
 public:
  explicit BpeTrainer(BpeTrainerOptions options);  // validate()s the options

  // Counts the pieces of one document. Invalid UTF-8 is first replaced as sanitize_utf8 does.
  void add_text(std::string_view text);
  // Adds `count` occurrences of one pre-tokenized piece (e.g. counts computed elsewhere).
  void add_piece(std::string_view piece, int64_t count = 1);
  // Adds the counts of another trainer (a worker's); throws mt::UsageError when its pattern differs.
  void merge(const BpeTrainer& other);

  int64_t num_unique_pieces() const { return static_cast<int64_t>(counts_.size()); }
  int64_t num_pieces() const { return total_pieces_; }
  const BpeTrainerOptions& options() const { return options_; }

  // Learns the vocabulary from the counts so far (the counts are kept; train() may be called
  // again). `progress`, when given, is called now and then with (tokens so far, vocab_size).
  BpeVocabulary train(const std::function<void(int64_t, int64_t)>& progress = {}) const;

 private:
  struct PieceHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  BpeTrainerOptions options_;
  std::unordered_map<std::string, int64_t, PieceHash, std::equal_to<>> counts_;
  int64_t total_pieces_ = 0;
};

// GPT-2's bytes_to_unicode: the character standing for byte b in encoder.json and vocab.bpe.
char32_t gpt2_byte_char(uint8_t b);
// The bytes in GPT-2's id order: byte_token_order()[id] for id < 256.
const std::vector<uint8_t>& byte_token_order();
// Raw bytes -> their GPT-2 text (UTF-8 of gpt2_byte_char of each byte).
std::string gpt2_token_text(std::string_view bytes);

// Writes encoder.json (a JSON object GPT-2 text -> id in id order; special tokens as their text)
// and vocab.bpe ("#version: 0.2" then one "left right" line per merge in GPT-2 text), each to a
// temporary name in the same directory renamed into place. Throws mt::Error naming the file.
void write_gpt2_files(const BpeVocabulary& vocab, const std::string& encoder_json_path,
                      const std::string& vocab_bpe_path);

}  // namespace mt::text
