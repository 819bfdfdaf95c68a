// SentencePiece-style Hugging Face tokenizer.json files (text/hf_sentencepiece.h) against the
// committed reference ids of tests/golden/sentencepiece (make_hf_goldens.py with tokenizers 0.20.3,
// transformers 4.46.3; nothing from Python is needed here). Three conversions of llama_style_2k.model:
// legacy (Prepend/Replace normalizers), metaspace (Metaspace prepend_scheme first, split false) and
// split (Metaspace always, split true, Metaspace decoder). Every id and decode equal on the edge cases
// and texts around special tokens (added tokens split out, as tokenizers does), the 10,000 random
// strings in blocks of 100 and the demo corpus line by line and whole (FNV-1a 64), the template's
// BOS, and decode of random id sequences; and the same ids when words are not cut before U+2581.
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

#include "../temp_dir.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using mt::text::Tokenizer;

namespace {

const fs::path kGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/sentencepiece";
const fs::path kTokenGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/tokenizer";
const fs::path kDataDir = fs::path(MT_SOURCE_DIR) / "data";
const char* const kFiles[] = {"llama_style_2k.legacy.json", "llama_style_2k.metaspace.json", "llama_style_2k.split.json"};

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

std::unique_ptr<Tokenizer> load(const std::string& file) {
  mt::text::TokenizerOptions options;
  options.type = "HuggingFaceTokenizer";
  options.tokenizer_model = (kGoldenDir / file).string();
  return Tokenizer::load(options);
}

const std::vector<nlohmann::json>& goldens() {
  static const std::vector<nlohmann::json> records = read_jsonl(kGoldenDir / "hf_goldens.jsonl");
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
    const std::string text = read_file(kDataDir / "demo" / set);
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
  return cache.emplace(set, read_file(kDataDir / "demo" / set)).first->second;
}

class HfSentencePieceGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(HfSentencePieceGolden, EdgeCasesEveryId) {
  auto tokenizer = load(GetParam());
  int checked = 0;
  for (const auto& record : goldens()) {
    if (record["model"] != GetParam() || record["set"] != "edge_cases") continue;
    const std::string text = record["text"];
    std::vector<int32_t> ids;
    tokenizer->encode(text, ids, /*allow_special=*/true);
    EXPECT_EQ(ids, record["ids"].get<std::vector<int32_t>>()) << "edge case " << record["index"] << ": " << text;
    EXPECT_EQ(tokenizer->decode(ids), record["decoded"].get<std::string>()) << "edge case " << record["index"];
    ++checked;
  }
  EXPECT_EQ(checked, 55);
}

TEST_P(HfSentencePieceGolden, SequenceTemplatePutsBosFirst) {
  auto tokenizer = load(GetParam());
  int checked = 0;
  for (const auto& record : goldens()) {
    if (record["model"] != GetParam() || record["set"] != "sequence") continue;
    std::vector<int32_t> ids;
    tokenizer->encode_sequence(record["text"].get<std::string>(), ids, /*allow_special=*/true);
    EXPECT_EQ(ids, record["ids"].get<std::vector<int32_t>>()) << "sequence " << record["index"];
    ++checked;
  }
  EXPECT_EQ(checked, 7);
  EXPECT_EQ(tokenizer->eod_id(), 2);
  EXPECT_EQ(tokenizer->vocab_size(), 2000);
}

TEST_P(HfSentencePieceGolden, RandomStringsAndDemoCorpusEveryId) {
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
      tokenizer->encode(text, ids, /*allow_special=*/true);
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
  EXPECT_EQ(wholes, 1);
  EXPECT_GT(blocks, 100);
}

TEST_P(HfSentencePieceGolden, DecodeRandomIds) {
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

// A vocab token with U+2581 after a letter (no merge makes it) turns off cutting words before
// U+2581, so the whole text is merged at once: the same ids, by the other path.
TEST(HfSentencePieceGoldenUncut, EdgeCasesAndDemoLinesEveryId) {
  nlohmann::json root = nlohmann::json::parse(read_file(kGoldenDir / "llama_style_2k.legacy.json"));
  root["model"]["vocab"]["a\u2581"] = 2000;
  mt::testing::TempDir dir("mt_hf_spm");
  const std::string path = dir.file("uncut.json");
  std::ofstream(path) << root.dump();
  mt::text::TokenizerOptions options;
  options.type = "HuggingFaceTokenizer";
  options.tokenizer_model = path;
  auto tokenizer = Tokenizer::load(options);
  int checked = 0;
  for (const auto& record : goldens()) {
    if (record["model"] != "llama_style_2k.legacy.json") continue;
    if (record["set"] == "edge_cases") {
      std::vector<int32_t> ids;
      tokenizer->encode(record["text"].get<std::string>(), ids, /*allow_special=*/true);
      EXPECT_EQ(ids, record["ids"].get<std::vector<int32_t>>()) << "edge case " << record["index"];
      ++checked;
    } else if (record["set"] == "tinyshakespeare.txt" && record["first"] == -1) {
      std::vector<int32_t> ids;
      tokenizer->encode(whole_file("tinyshakespeare.txt"), ids, /*allow_special=*/true);
      Fnv ids_hash;
      ids_hash.add_ids(ids);
      EXPECT_EQ(ids_hash.hex(), record["ids_fnv"].get<std::string>()) << "the demo corpus whole";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 56);
}

INSTANTIATE_TEST_SUITE_P(Files, HfSentencePieceGolden, ::testing::ValuesIn(kFiles),
                         [](const auto& info) {
                           std::string name = info.param;
                           return name.substr(15, name.find(".json") - 15);  // legacy, metaspace, split
                         });

}  // namespace
