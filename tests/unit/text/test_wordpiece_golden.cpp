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
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"
#include "text/wordpiece.h"

using mt::text::BertBasicTokenizer;
using mt::text::Tokenizer;
using mt::text::TokenizerOptions;
namespace fs = std::filesystem;

namespace {

const fs::path kGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/wordpiece";
const fs::path kTokenizerGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/tokenizer";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<nlohmann::json> read_jsonl(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::vector<nlohmann::json> records;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  }
  return records;
}

class Fnv1a64 {
 public:
  void add(const void* data, size_t size) {
    for (size_t i = 0; i < size; ++i) {
      state_ ^= static_cast<const unsigned char*>(data)[i];
      state_ *= 0x100000001B3ull;
    }
  }
  std::string hex() const {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(state_));
    return text;
  }

 private:
  uint64_t state_ = 0xCBF29CE484222325ull;
};

nlohmann::json ids_hash(const std::vector<int32_t>& ids) {
  Fnv1a64 hash;
  for (int32_t id : ids) {
    unsigned char bytes[4] = {static_cast<unsigned char>(id), static_cast<unsigned char>(id >> 8),
                              static_cast<unsigned char>(id >> 16), static_cast<unsigned char>(id >> 24)};
    hash.add(bytes, 4);
  }
  return nlohmann::json::array({ids.size(), hash.hex()});
}

std::string text_hash(const std::string& text) {
  Fnv1a64 hash;
  hash.add(text.data(), text.size());
  return hash.hex();
}

std::vector<std::string> words_of(const BertBasicTokenizer& basic, const std::string& text) {
  std::vector<std::string> words;
  basic.split(text, [&](std::string_view word, size_t) { words.emplace_back(word); });
  return words;
}

nlohmann::json words_hash(const std::vector<std::string>& words) {
  Fnv1a64 hash;
  for (const std::string& word : words) hash.add(word.c_str(), word.size() + 1);  // with its zero byte
  return nlohmann::json::array({words.size(), hash.hex()});
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

std::vector<int32_t> encode(const Tokenizer& tokenizer, const std::string& text, bool allow_special) {
  std::vector<int32_t> ids;
  tokenizer.encode(text, ids, allow_special);
  return ids;
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
  std::vector<std::string> texts;
  for (int part = 0; part < 4; ++part) {
    char name[32];
    std::snprintf(name, sizeof name, "random_%02d.jsonl", part);
    for (const auto& record : read_jsonl(kTokenizerGoldenDir / name)) texts.push_back(record["text"]);
  }
  const auto records = read_jsonl(kGoldenDir / "random.jsonl");
  ASSERT_EQ(records.size(), texts.size());
  int failures = 0;
  for (size_t i = 0; i < texts.size() && failures < 10; ++i) {
    const std::string where = "random string " + std::to_string(i) + " " + nlohmann::json(texts[i]).dump();
    const auto words = words_of(basic, texts[i]);
    const auto ids = encode(*tokenizer, texts[i], false);
    bool ok = words_hash(words) == records[i][std::string(config.key) + "_words"];
    ok = ok && ids_hash(ids) == records[i][config.key];
    ok = ok && text_hash(tokenizer->decode(ids)) == records[i][std::string(config.key) + "_decoded"];
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
    EXPECT_EQ(words_hash(words_of(basic, text)), record[std::string(config.key) + "_words"]) << record["corpus"];
    const auto ids = encode(*tokenizer, text, false);
    EXPECT_EQ(ids_hash(ids), record[config.key]) << record["corpus"];
    EXPECT_EQ(text_hash(tokenizer->decode(ids)), record[std::string(config.key) + "_decoded"]) << record["corpus"];
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
