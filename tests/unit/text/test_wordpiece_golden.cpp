// mt's BertWordPiece tokenizers against the committed reference output of tests/golden/wordpiece
// (made by make_wordpiece_goldens.py with HF tokenizers' BertWordPieceTokenizer over the two
// vocabularies trained there; nothing from Python is needed here): for every text of the tokenizer
// torture corpus (edge cases, llama.cpp's test vectors, cases of ours, 10,000 random Unicode
// strings) and the demo corpora, the words of the basic tokenizer, the ids, and the decoded text
// (full in torture.jsonl, count + FNV-1a 64 elsewhere), plus vocabulary size, special ids and the
// [CLS] ... [SEP] sequence.
//   BertWordPieceLowerCase vocab-uncased.txt == "uncased"
//   BertWordPieceCase      vocab-cased.txt   == "cased" (with Megatron-Core's 100 <extra_id_N>)
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "golden_records.h"
#include "text/tokenizer.h"
#include "text/wordpiece.h"

using mt::text::BertBasicTokenizer;
using mt::text::Tokenizer;
using mt::text::TokenizerOptions;
using mt::testing::golden::encode;
using mt::testing::golden::ids_hash;
using mt::testing::golden::read_file;
using mt::testing::golden::read_jsonl;
using mt::testing::golden::strings_hash;
using mt::testing::golden::text_fnv;
namespace fs = std::filesystem;

namespace {

const fs::path kGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/wordpiece";

std::vector<std::string> words_of(const BertBasicTokenizer& basic, const std::string& text) {
  std::vector<std::string> words;
  basic.split(text, [&](std::string_view word, size_t) { words.emplace_back(word); });
  return words;
}

struct Config {
  const char* key;
  const char* type;
  const char* vocab;
  bool lower_case;
};
constexpr Config kConfigs[] = {{"uncased", "BertWordPieceLowerCase", "vocab-uncased.txt", true},
                               {"cased", "BertWordPieceCase", "vocab-cased.txt", false}};

std::unique_ptr<Tokenizer> load(const Config& config, bool include_special_tokens = true) {
  TokenizerOptions options;
  options.type = config.type;
  options.vocab_file = (kGoldenDir / config.vocab).string();
  options.include_special_tokens = include_special_tokens;
  return Tokenizer::load(options);
}

class WordPieceGolden : public ::testing::TestWithParam<Config> {};

TEST_P(WordPieceGolden, TortureCorpusWordsIdsAndDecode) {
  const Config& config = GetParam();
  auto tokenizer = load(config);
  BertBasicTokenizer basic(config.lower_case);
  const auto records = read_jsonl(kGoldenDir / "torture.jsonl");
  ASSERT_GT(records.size(), 100u);
  for (const auto& record : records) {
    const std::string text = record["text"];
    const std::string where = record.value("name", record.value("source", std::string())) + " #" +
                              std::to_string(record.value("index", -1)) + " text " + nlohmann::json(text).dump();
    EXPECT_EQ(words_of(basic, text), record[std::string(config.key) + "_words"].get<std::vector<std::string>>())
        << where;
    const auto ids = encode(*tokenizer, text, record.value("allow_special", false));
    EXPECT_EQ(ids, record[config.key].get<std::vector<int32_t>>()) << where;
    EXPECT_EQ(tokenizer->decode(ids), record[std::string(config.key) + "_decoded"].get<std::string>()) << where;
  }
}

TEST_P(WordPieceGolden, RandomUnicodeStrings) {
  const Config& config = GetParam();
  auto tokenizer = load(config);
  BertBasicTokenizer basic(config.lower_case);
  const std::vector<std::string> texts = mt::testing::golden::random_texts();
  const auto records = read_jsonl(kGoldenDir / "random.jsonl");
  ASSERT_EQ(records.size(), texts.size());
  int failures = 0;
  for (size_t i = 0; i < texts.size() && failures < 10; ++i) {
    const std::string where = "random string " + std::to_string(i) + " " + nlohmann::json(texts[i]).dump();
    const auto words = words_of(basic, texts[i]);
    const auto ids = encode(*tokenizer, texts[i], false);
    bool ok = strings_hash(words) == records[i][std::string(config.key) + "_words"];
    ok = ok && ids_hash(ids) == records[i][config.key];
    ok = ok && text_fnv(tokenizer->decode(ids)) == records[i][std::string(config.key) + "_decoded"];
    if (!ok) ++failures;
    EXPECT_TRUE(ok) << where;
  }
}

TEST_P(WordPieceGolden, DemoCorpora) {
  const Config& config = GetParam();
  auto tokenizer = load(config);
  BertBasicTokenizer basic(config.lower_case);
  for (const auto& record : read_jsonl(kGoldenDir / "corpora.jsonl")) {
    const std::string text = read_file(fs::path(MT_SOURCE_DIR) / record["corpus"].get<std::string>());
    ASSERT_EQ(text.size(), record["bytes"].get<size_t>()) << record["corpus"];
    EXPECT_EQ(strings_hash(words_of(basic, text)), record[std::string(config.key) + "_words"]) << record["corpus"];
    const auto ids = encode(*tokenizer, text, false);
    EXPECT_EQ(ids_hash(ids), record[config.key]) << record["corpus"];
    EXPECT_EQ(text_fnv(tokenizer->decode(ids)), record[std::string(config.key) + "_decoded"]) << record["corpus"];
  }
}

TEST_P(WordPieceGolden, VocabularySpecialIdsAndSequence) {
  const Config& config = GetParam();
  auto tokenizer = load(config);
  const auto meta = nlohmann::json::parse(read_file(kGoldenDir / "meta.json"))[config.key];
  EXPECT_EQ(tokenizer->vocab_size(), meta["vocab_size"].get<int64_t>());
  for (const auto& [token, id] : meta["special_ids"].items()) {
    EXPECT_EQ(tokenizer->special_token_id(token), id.get<int32_t>()) << token;
  }
  EXPECT_EQ(tokenizer->eod_id(), meta["special_ids"]["[SEP]"].get<int32_t>());
  const auto& sequence = meta["with_special_tokens"];
  std::vector<int32_t> ids;
  tokenizer->encode_sequence(sequence["text"].get<std::string>(), ids);
  EXPECT_EQ(ids, sequence["ids"].get<std::vector<int32_t>>());
  auto plain = load(config, /*include_special_tokens=*/false);
  ids.clear();
  plain->encode_sequence(sequence["text"].get<std::string>(), ids);
  const auto expected = sequence["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids, std::vector<int32_t>(expected.begin() + 1, expected.end() - 1));
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, WordPieceGolden, ::testing::ValuesIn(kConfigs),
                         [](const auto& info) { return std::string(info.param.key); });

}  // namespace
