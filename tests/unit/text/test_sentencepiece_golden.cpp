// SentencePiece BPE models against the committed reference ids of tests/golden/sentencepiece
// (make_goldens.py with Debian's python3-sentencepiece 0.1.97; nothing from Python is needed here).
// Three models trained by make_models.py on the repository's corpus: llama_style_2k (identity
// normalizer, byte fallback, control pieces), nfkc_4k (nmt_nfkc precompiled charsmap, user-defined
// pieces, no byte fallback), identity_1k (identity, extra whitespace removed, no byte fallback).
// Every id equal on the tokenizer torture corpus (edge cases with full ids, 10,000 random Unicode
// strings in blocks of 100 as FNV-1a 64), on the corpus files line by line and whole; decode equal
// on the same texts and on random id sequences.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace fs = std::filesystem;
using mt::text::Tokenizer;

namespace {

const fs::path kGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/sentencepiece";
const fs::path kTokenGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/tokenizer";
const fs::path kDataDir = fs::path(MT_SOURCE_DIR) / "data";
const char* const kModels[] = {"llama_style_2k", "nfkc_4k", "identity_1k"};

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

class Fnv {
 public:
  void add(const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) state_ = (state_ ^ bytes[i]) * 0x100000001B3ull;
  }
  void add_ids(const std::vector<int32_t>& ids) {
    const auto count = static_cast<int32_t>(ids.size());
    add(&count, 4);  // little-endian host (x86-64, AArch64)
    add(ids.data(), ids.size() * 4);
  }
  std::string hex() const {
    char buffer[17];
    std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(state_));
    return buffer;
  }

 private:
  uint64_t state_ = 0xCBF29CE484222325ull;
};

std::unique_ptr<Tokenizer> load(const std::string& model) {
  mt::text::TokenizerOptions options;
  options.type = "Llama2Tokenizer";
  options.tokenizer_model = (kGoldenDir / (model + ".model")).string();
  return Tokenizer::load(options);
}

const std::vector<nlohmann::json>& goldens() {
  static const std::vector<nlohmann::json> records = read_jsonl(kGoldenDir / "goldens.jsonl");
  return records;
}

// The texts of a block record's set.
const std::vector<std::string>& texts_of(const std::string& set) {
  static std::map<std::string, std::vector<std::string>> cache;
  auto it = cache.find(set);
  if (it != cache.end()) return it->second;
  std::vector<std::string> texts;
  if (set.starts_with("random_")) {
    for (const auto& record : read_jsonl(kTokenGoldenDir / (set + ".jsonl"))) texts.push_back(record["text"]);
  } else {
    const fs::path path = set == "tinyshakespeare.txt" ? kDataDir / "demo" / set : kDataDir / "corpus" / set;
    const std::string text = read_file(path);
    size_t begin = 0;
    for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
      texts.push_back(text.substr(begin, end - begin));
    }
    texts.push_back(text.substr(begin));
  }
  return cache.emplace(set, std::move(texts)).first->second;
}

const std::string& whole_file(const std::string& set) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(set);
  if (it != cache.end()) return it->second;
  const fs::path path = set == "tinyshakespeare.txt" ? kDataDir / "demo" / set : kDataDir / "corpus" / set;
  return cache.emplace(set, read_file(path)).first->second;
}

class SentencePieceGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(SentencePieceGolden, EdgeCasesEveryId) {
  auto tokenizer = load(GetParam());
  int checked = 0;
  for (const auto& record : goldens()) {
    if (record["model"] != GetParam() || record["set"] != "edge_cases") continue;
    const std::string text = record["text"];
    std::vector<int32_t> ids;
    tokenizer->encode(text, ids);
    EXPECT_EQ(ids, record["ids"].get<std::vector<int32_t>>()) << "edge case " << record["index"] << ": " << text;
    EXPECT_EQ(tokenizer->decode(ids), record["decoded"].get<std::string>()) << "edge case " << record["index"];
    ++checked;
  }
  EXPECT_EQ(checked, 49);
}

TEST_P(SentencePieceGolden, RandomStringsAndCorporaEveryId) {
  auto tokenizer = load(GetParam());
  int blocks = 0, wholes = 0;
  for (const auto& record : goldens()) {
    if (record["model"] != GetParam() || !record.contains("ids_fnv")) continue;
    const std::string set = record["set"];
    const int64_t first = record["first"];
    std::vector<std::string> block;
    if (first < 0) {
      block.push_back(whole_file(set));
      ++wholes;
    } else {
      const auto& texts = texts_of(set);
      const auto count = record["count"].get<size_t>();
      ASSERT_LE(first + count, texts.size()) << set;
      block.assign(texts.begin() + first, texts.begin() + first + static_cast<int64_t>(count));
      ++blocks;
    }
    Fnv ids_hash, text_hash;
    int64_t tokens = 0;
    for (const std::string& text : block) {
      std::vector<int32_t> ids;
      tokenizer->encode(text, ids);
      tokens += static_cast<int64_t>(ids.size());
      ids_hash.add_ids(ids);
      const std::string decoded = tokenizer->decode(ids);
      text_hash.add(decoded.data(), decoded.size());
      text_hash.add("\xff", 1);
    }
    EXPECT_EQ(tokens, record["tokens"].get<int64_t>()) << set << " from " << first;
    EXPECT_EQ(ids_hash.hex(), record["ids_fnv"].get<std::string>()) << set << " from " << first;
    EXPECT_EQ(text_hash.hex(), record["decoded_fnv"].get<std::string>()) << set << " decoded, from " << first;
  }
  EXPECT_EQ(wholes, 2);
  EXPECT_GT(blocks, 200);
}

TEST_P(SentencePieceGolden, DecodeRandomIds) {
  auto tokenizer = load(GetParam());
  int checked = 0;
  for (const auto& record : goldens()) {
    if (record["model"] != GetParam() || record["set"] != "decode") continue;
    const auto ids = record["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer->decode(ids), record["decoded"].get<std::string>()) << "sequence " << record["index"];
    ++checked;
  }
  EXPECT_EQ(checked, 300);
}

INSTANTIATE_TEST_SUITE_P(Models, SentencePieceGolden, ::testing::ValuesIn(kModels));

}  // namespace
