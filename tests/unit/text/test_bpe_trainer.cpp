// BPE vocabulary training (lib/text/bpe_trainer.h): hand-checked merges on tiny corpora, GPT-2's
// byte order, agreement with a naive recount-everything trainer, independence from the order and
// grouping of documents, Hugging Face BpeTrainer's merges on tinyshakespeare at two vocabulary
// sizes (goldens in tests/golden/bpe), exact vocab_size, GPT-2 files that reload through
// Tokenizer::load and encode as the merges say, bad options refused with mt::UsageError. The
// benchmark is tests/bench/bench_bpe_train.cpp (run by tests/bench/bench_bpe_train.sh).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "core/error.h"
#include "text/bpe_trainer.h"
#include "text/pretokenize.h"
#include "text/tokenizer.h"

using namespace mt;
using namespace mt::text;
namespace fs = std::filesystem;

namespace {

class TempDir : public mt::testing::TempDir {
 public:
  TempDir() : mt::testing::TempDir("mt_test_bpe_trainer") {}
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const std::string& shakespeare() {
  static const std::string text = read_file(MT_SOURCE_DIR "/data/demo/tinyshakespeare.txt");
  return text;
}

std::vector<std::string> lines_of(std::string_view text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    end = end == std::string_view::npos ? text.size() : end + 1;
    lines.emplace_back(text.substr(start, end - start));
    start = end;
  }
  return lines;
}

BpeVocabulary train_on(const std::vector<std::string>& docs, BpeTrainerOptions options) {
  BpeTrainer trainer(std::move(options));
  for (const auto& doc : docs) trainer.add_text(doc);
  return trainer.train();
}

using Merges = std::vector<std::pair<std::string, std::string>>;

// The textbook algorithm: recount every pair after every merge; ties to the smallest ids.
Merges naive_merges(const std::vector<std::string>& docs, const BpeTrainerOptions& options) {
  std::map<std::string, int64_t> counts;
  for (const auto& doc : docs)
    pretokenize(options.pattern, doc, [&](std::string_view piece) { ++counts[std::string(piece)]; });
  std::vector<std::string> tokens;
  std::map<std::string, int32_t> ids;
  for (uint8_t b : byte_token_order()) {
    ids[std::string(1, char(b))] = int32_t(tokens.size());
    tokens.emplace_back(1, char(b));
  }
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (const auto& [piece, count] : counts) {
    std::vector<int32_t> symbols;
    for (char c : piece) symbols.push_back(ids.at(std::string(1, c)));
    words.emplace_back(symbols, count);
  }
  Merges merges;
  std::set<std::pair<int32_t, int32_t>> done;
  const int64_t target = options.vocab_size - int64_t(options.special_tokens.size());
  while (int64_t(tokens.size()) < target) {
    std::map<std::pair<int32_t, int32_t>, int64_t> pairs;
    for (const auto& [symbols, count] : words)
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pairs[{symbols[i], symbols[i + 1]}] += count;
    std::pair<int32_t, int32_t> best{-1, -1};
    int64_t best_count = 0;
    for (const auto& [pair, count] : pairs)
      if (count > best_count) best_count = count, best = pair;  // map order: smallest pair first
    if (best_count < options.min_frequency) break;
    std::string joined = tokens[best.first] + tokens[best.second];
    auto [it, is_new] = ids.try_emplace(joined, int32_t(tokens.size()));
    if (is_new) tokens.push_back(joined);
    if (done.insert(best).second) merges.emplace_back(tokens[best.first], tokens[best.second]);
    for (auto& [symbols, count] : words) {
      std::vector<int32_t> out;
      for (size_t i = 0; i < symbols.size();) {
        if (i + 1 < symbols.size() && symbols[i] == best.first && symbols[i + 1] == best.second) {
          out.push_back(it->second);
          i += 2;
        } else {
          out.push_back(symbols[i++]);
        }
      }
      symbols = std::move(out);
    }
  }
  return merges;
}

// GPT-2's bpe(): merge the lowest-ranked adjacent pair everywhere until none is ranked.
std::vector<int32_t> reference_encode(const BpeVocabulary& vocab, std::string_view text) {
  std::map<std::pair<std::string, std::string>, size_t> ranks;
  for (size_t r = 0; r < vocab.merges.size(); ++r) ranks.emplace(vocab.merges[r], r);
  std::map<std::string, int32_t> ids;
  for (size_t id = 0; id + size_t(vocab.num_special_tokens) < vocab.tokens.size(); ++id)
    ids[vocab.tokens[id]] = int32_t(id);
  std::vector<int32_t> out;
  pretokenize(PretokenizePattern::gpt2, text, [&](std::string_view piece) {
    std::vector<std::string> parts;
    for (char c : piece) parts.emplace_back(1, c);
    while (parts.size() > 1) {
      size_t best = SIZE_MAX;
      std::pair<std::string, std::string> best_pair;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        auto it = ranks.find({parts[i], parts[i + 1]});
        if (it != ranks.end() && it->second < best) best = it->second, best_pair = it->first;
      }
      if (best == SIZE_MAX) break;
      std::vector<std::string> merged;
      for (size_t i = 0; i < parts.size();) {
        if (i + 1 < parts.size() && parts[i] == best_pair.first && parts[i + 1] == best_pair.second) {
          merged.push_back(parts[i] + parts[i + 1]);
          i += 2;
        } else {
          merged.push_back(parts[i++]);
        }
      }
      parts = std::move(merged);
    }
    for (const auto& part : parts) out.push_back(ids.at(part));
  });
  return out;
}

std::unique_ptr<Tokenizer> load_gpt2(const std::string& encoder_path, const std::string& merges_path) {
  TokenizerOptions options;
  options.type = "GPT2BPETokenizer";
  options.vocab_file = encoder_path;
  options.merge_file = merges_path;
  return Tokenizer::load(options);
}

int32_t byte_id(char c) {
  const auto& order = byte_token_order();
  return int32_t(std::find(order.begin(), order.end(), uint8_t(c)) - order.begin());
}

}  // namespace

TEST(BpeTrainer, GptTwoByteOrder) {
  const auto& order = byte_token_order();
  ASSERT_EQ(order.size(), 256u);
  EXPECT_EQ(order[0], '!');
  EXPECT_EQ(byte_id(' '), 220);   // GPT-2's "\u0120": 220
  EXPECT_EQ(byte_id('\n'), 198);  // "\u010a": 198
  EXPECT_EQ(byte_id('a'), 64);
  EXPECT_EQ(gpt2_byte_char(' '), U'\u0120');
  EXPECT_EQ(gpt2_byte_char('a'), U'a');
  EXPECT_EQ(gpt2_byte_char(0xAD), U'\u0143');
  EXPECT_EQ(gpt2_token_text(" the"), "\xc4\xa0the");
  for (int id = 1; id < 256; ++id) EXPECT_LT(gpt2_byte_char(order[id - 1]), gpt2_byte_char(order[id]));
}

TEST(BpeTrainer, HandCheckedMerges) {
  // Pieces "aaab" and " aaab": (a,a) 4, (a,b) 2, (' ',a) 1. Then (aa,a) and (a,b) tie at 2 and
  // (a,b) has the smaller ids; then (aa,ab) 2; (' ',aaab) 1 stays below min_frequency 2.
  BpeVocabulary vocab = train_on({"aaab aaab"}, {.vocab_size = 1000});
  Merges expected = {{"a", "a"}, {"a", "b"}, {"aa", "ab"}};
  EXPECT_EQ(vocab.merges, expected);
  EXPECT_TRUE(vocab.exhausted);
  ASSERT_EQ(vocab.tokens.size(), 256u + 3 + 1);
  EXPECT_EQ(vocab.tokens[256], "aa");
  EXPECT_EQ(vocab.tokens[257], "ab");
  EXPECT_EQ(vocab.tokens[258], "aaab");
  EXPECT_EQ(vocab.tokens[259], "<|endoftext|>");
  EXPECT_EQ(vocab.num_special_tokens, 1);

  // min_frequency 1 takes the last pair too; vocab_size 258 stops after one merge.
  EXPECT_EQ(train_on({"aaab aaab"}, {.vocab_size = 1000, .min_frequency = 1}).merges.size(), 4u);
  BpeVocabulary one = train_on({"aaab aaab"}, {.vocab_size = 258});
  EXPECT_EQ(one.merges, Merges({{"a", "a"}}));
  EXPECT_FALSE(one.exhausted);
  EXPECT_EQ(one.tokens.size(), 258u);
}

TEST(BpeTrainer, OverlappingAndRepeatedPairs) {
  // "aaaa" merges to (aa)(aa): (a,a) counts 3 per word, then (aa,aa).
  BpeVocabulary vocab = train_on({"aaaa aaaa"}, {.vocab_size = 259, .min_frequency = 1, .special_tokens = {}});
  EXPECT_EQ(vocab.merges, Merges({{"a", "a"}, {"aa", "aa"}, {" ", "aaaa"}}));
  // "ababab": (a,b) 3, then (ab,ab) 2 beats (b,a) which is gone.
  BpeVocabulary abab = train_on({"ababab"}, {.vocab_size = 258, .min_frequency = 1, .special_tokens = {}});
  EXPECT_EQ(abab.merges, Merges({{"a", "b"}, {"ab", "ab"}}));
}

TEST(BpeTrainer, MatchesNaiveTrainerOnRandomSmallCorpora) {
  // Few letters, many repeats: overlapping pairs, ties and merges into existing strings abound.
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> docs(1 + rng() % 3);
    for (auto& doc : docs)
      for (int i = 0, n = 5 + int(rng() % 60); i < n; ++i) doc += "aab  c"[rng() % 6];
    BpeTrainerOptions options{.vocab_size = 256 + 1 + int64_t(rng() % 30), .min_frequency = 1 + int64_t(rng() % 2)};
    BpeVocabulary vocab = train_on(docs, options);
    ASSERT_EQ(vocab.merges, naive_merges(docs, options)) << "trial " << trial;
    std::set<std::string> unique(vocab.tokens.begin(), vocab.tokens.end());
    EXPECT_EQ(unique.size(), vocab.tokens.size());
  }
}

TEST(BpeTrainer, MatchesNaiveTrainer) {
  std::vector<std::string> docs = lines_of(std::string_view(shakespeare()).substr(0, 30000));
  for (int64_t min_frequency : {1, 2, 5}) {
    BpeTrainerOptions options{.vocab_size = 700, .min_frequency = min_frequency};
    BpeVocabulary vocab = train_on(docs, options);
    EXPECT_EQ(vocab.merges, naive_merges(docs, options)) << "min_frequency " << min_frequency;
  }
  BpeTrainerOptions cl100k{.vocab_size = 600, .pattern = PretokenizePattern::cl100k};
  EXPECT_EQ(train_on(docs, cl100k).merges, naive_merges(docs, cl100k));
}

// Hugging Face tokenizers' BpeTrainer on the whole of tinyshakespeare.txt as one document, at two
// vocabulary sizes (tests/golden/bpe/make_bpe_goldens.sh): mt must learn the same merges in the
// same order.
TEST(BpeTrainer, MatchesHuggingFaceMerges) {
  for (const int64_t vocab_size : {500, 2000}) {
    SCOPED_TRACE("vocab_size " + std::to_string(vocab_size));
    const std::string path =
        MT_SOURCE_DIR "/tests/golden/bpe/tinyshakespeare-" + std::to_string(vocab_size) + "-merges.txt";
    std::istringstream golden(read_file(path));
    std::string line;
    ASSERT_TRUE(std::getline(golden, line) && line == "#version: 0.2") << path;
    std::vector<std::string> expected;
    while (std::getline(golden, line)) expected.push_back(line);
    ASSERT_EQ(static_cast<int64_t>(expected.size()), vocab_size - 256 - 1) << path;

    BpeTrainer trainer({.vocab_size = vocab_size});
    trainer.add_text(shakespeare());
    const BpeVocabulary vocab = trainer.train();
    ASSERT_EQ(vocab.merges.size(), expected.size());
    int mismatches = 0;
    for (size_t rank = 0; rank < expected.size(); ++rank) {
      const std::string merge = gpt2_token_text(vocab.merges[rank].first) + " " + gpt2_token_text(vocab.merges[rank].second);
      if (merge != expected[rank] && ++mismatches <= 3) {
        ADD_FAILURE() << "merge " << rank << ": mt '" << merge << "', Hugging Face '" << expected[rank] << "'";
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(BpeTrainer, IndependentOfDocumentOrderAndGrouping) {
  std::vector<std::string> docs = lines_of(std::string_view(shakespeare()).substr(0, 200000));
  BpeTrainerOptions options{.vocab_size = 2000};
  BpeVocabulary first = train_on(docs, options);
  BpeVocabulary again = train_on(docs, options);
  EXPECT_EQ(first.merges, again.merges);
  EXPECT_EQ(first.tokens, again.tokens);

  BpeTrainer even(options), odd(options), merged(options);
  for (size_t i = docs.size(); i-- > 0;) (i % 2 ? odd : even).add_text(docs[i]);
  merged.merge(odd);
  merged.merge(even);
  EXPECT_EQ(merged.num_pieces(), even.num_pieces() + odd.num_pieces());
  BpeVocabulary reordered = merged.train();
  EXPECT_EQ(first.merges, reordered.merges);
  EXPECT_EQ(first.tokens, reordered.tokens);
  // train() keeps the counts: a second call gives the same vocabulary.
  EXPECT_EQ(merged.train().tokens, reordered.tokens);

  BpeTrainer other_pattern({.vocab_size = 2000, .pattern = PretokenizePattern::cl100k});
  EXPECT_THROW(merged.merge(other_pattern), UsageError);
}

TEST(BpeTrainer, VocabSizeIsExact) {
  for (int64_t size : {257, 258, 1000, 4000}) {
    BpeVocabulary vocab = train_on({shakespeare()}, {.vocab_size = size});
    EXPECT_EQ(int64_t(vocab.tokens.size()), size);
    EXPECT_FALSE(vocab.exhausted);
    EXPECT_EQ(vocab.tokens.back(), "<|endoftext|>");
    EXPECT_GE(vocab.merges.size(), size_t(size - 257));
  }
  BpeTrainer trainer({.vocab_size = 3000});
  trainer.add_text(shakespeare());
  std::vector<std::pair<int64_t, int64_t>> calls;
  trainer.train([&](int64_t done, int64_t total) { calls.emplace_back(done, total); });
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.front(), std::make_pair(int64_t(1000), int64_t(3000)));
  EXPECT_EQ(calls.back(), std::make_pair(int64_t(3000), int64_t(3000)));

  BpeVocabulary specials =
      train_on({shakespeare()}, {.vocab_size = 500, .special_tokens = {"<|endoftext|>", "<|pad|>", "<|x|>"}});
  ASSERT_EQ(specials.tokens.size(), 500u);
  EXPECT_EQ(specials.num_special_tokens, 3);
  EXPECT_EQ(specials.tokens[497], "<|endoftext|>");
  EXPECT_EQ(specials.tokens[499], "<|x|>");
}

TEST(BpeTrainer, BadOptionsAreUsageErrors) {
  EXPECT_THROW(BpeTrainer({.vocab_size = 256}), UsageError);
  EXPECT_THROW(BpeTrainer({.vocab_size = 0}), UsageError);
  EXPECT_NO_THROW(BpeTrainer({.vocab_size = 257}));
  EXPECT_NO_THROW(BpeTrainer({.vocab_size = 256, .special_tokens = {}}));
  EXPECT_THROW(BpeTrainer({.vocab_size = 257, .special_tokens = {"<a>", "<b>"}}), UsageError);
  EXPECT_THROW(BpeTrainer({.vocab_size = int64_t(1) << 31}), UsageError);
  EXPECT_THROW(BpeTrainer({.vocab_size = 1000, .min_frequency = 0}), UsageError);
  EXPECT_THROW(BpeTrainer({.vocab_size = 1000, .special_tokens = {""}}), UsageError);
  EXPECT_THROW(BpeTrainer({.vocab_size = 1000, .special_tokens = {"<s>", "<s>"}}), UsageError);
  // A special token spelled like a learned token would make encoder.json ambiguous.
  BpeTrainer clash({.vocab_size = 1000, .special_tokens = {"aa"}});
  clash.add_text("aaaa aaaa");
  EXPECT_THROW(clash.train(), UsageError);
}

TEST(BpeTrainer, InvalidUtf8IsReplaced) {
  BpeTrainer trainer({.vocab_size = 300, .min_frequency = 1});
  trainer.add_text("ab\xff" "ab\xc3");
  BpeVocabulary vocab = trainer.train();
  // U+FFFD is EF BF BD: its bytes are merged, the raw 0xFF and 0xC3 never appear.
  for (const auto& [left, right] : vocab.merges) {
    EXPECT_EQ((left + right).find('\xff'), std::string::npos);
    EXPECT_EQ((left + right).find('\xc3'), std::string::npos);
  }
  EXPECT_NE(std::find(vocab.tokens.begin(), vocab.tokens.end(), "\xef\xbf\xbd"), vocab.tokens.end());
}

TEST(BpeTrainer, GptTwoFilesReloadAndEncode) {
  TempDir dir;
  const std::string text = shakespeare();
  const size_t split = text.find('\n', text.size() * 9 / 10) + 1;
  BpeVocabulary vocab = train_on({text.substr(0, split)}, {.vocab_size = 3000});
  const std::string encoder_path = dir.file("vocab.json"), merges_path = dir.file("merges.txt");
  write_gpt2_files(vocab, encoder_path, merges_path);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);

  nlohmann::ordered_json encoder = nlohmann::ordered_json::parse(read_file(encoder_path));
  ASSERT_EQ(encoder.size(), 3000u);
  int32_t expected_id = 0;
  for (const auto& [key, value] : encoder.items()) EXPECT_EQ(value.get<int32_t>(), expected_id++) << key;
  EXPECT_EQ(encoder["!"], 0);
  EXPECT_EQ(encoder["\xc4\xa0"], 220);
  EXPECT_EQ(encoder["<|endoftext|>"], 2999);
  EXPECT_EQ(encoder[gpt2_token_text(vocab.tokens[256])], 256);
  std::istringstream merges(read_file(merges_path));
  std::string line;
  std::getline(merges, line);
  EXPECT_EQ(line, "#version: 0.2");
  size_t rank = 0;
  while (std::getline(merges, line)) {
    ASSERT_LT(rank, vocab.merges.size());
    EXPECT_EQ(line, gpt2_token_text(vocab.merges[rank].first) + " " + gpt2_token_text(vocab.merges[rank].second));
    ++rank;
  }
  EXPECT_EQ(rank, vocab.merges.size());

  auto tokenizer = load_gpt2(encoder_path, merges_path);
  EXPECT_EQ(tokenizer->vocab_size(), 3000);
  EXPECT_EQ(tokenizer->eod_id(), std::optional<int32_t>(2999));
  const std::string held_out = text.substr(split) + " caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 12345\t\r\n";
  std::vector<int32_t> ids;
  tokenizer->encode(held_out, ids);
  EXPECT_EQ(ids, reference_encode(vocab, held_out));
  EXPECT_LT(double(ids.size()) / double(held_out.size()), 0.45);
  EXPECT_EQ(tokenizer->decode(ids), held_out);
  for (int32_t id : {0, 220, 256, 2998}) EXPECT_EQ(tokenizer->token_bytes(id), vocab.tokens[id]);

  // Overwriting goes through temporary names; an unwritable place is an mt::Error naming it.
  write_gpt2_files(vocab, encoder_path, merges_path);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);
  EXPECT_THROW(write_gpt2_files(vocab, dir.file("missing/vocab.json"), merges_path), Error);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 2);
}
