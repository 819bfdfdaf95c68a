// HuggingFaceTokenizer with DeepSeek-V3's pre-tokenizer (three Splits before ByteLevel,
// lib/text/split_pretokenizer.h) against the committed reference output of tests/golden/deepseek
// (made by make_deepseek_goldens.py with HF tokenizers over deepseek_v3_style_tokenizer.json; no
// Python needed here): the pre-tokenizer's pieces, the ids and decode, for the torture texts (in
// full), the 10,000 random strings of tests/golden/tokenizer and the demo corpora (count + FNV-1a 64).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "golden_records.h"
#include "text/split_pretokenizer.h"
#include "text/tokenizer.h"

using mt::text::Tokenizer;
using mt::text::TokenizerOptions;
using mt::testing::golden::encode;
using mt::testing::golden::ids_hash;
using mt::testing::golden::read_file;
using mt::testing::golden::read_jsonl;
using mt::testing::golden::strings_hash;
namespace fs = std::filesystem;

namespace {

const fs::path kGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/deepseek";

std::vector<std::string> pieces_of(const std::string& text) {
  std::vector<std::string> pieces;
  mt::text::deepseek_v3_pretokenize(text, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

std::unique_ptr<Tokenizer> load() {
  TokenizerOptions options;
  options.type = "HuggingFaceTokenizer";
  options.tokenizer_model = (kGoldenDir / "deepseek_v3_style_tokenizer.json").string();
  return Tokenizer::load(options);
}

TEST(DeepSeekGolden, TortureCorpusPiecesIdsAndDecode) {
  auto tokenizer = load();
  const auto records = read_jsonl(kGoldenDir / "torture.jsonl");
  ASSERT_GT(records.size(), 100u);
  for (const auto& record : records) {
    const std::string text = record["text"];
    const std::string where = record.value("name", record.value("source", std::string())) + " #" +
                              std::to_string(record.value("index", -1)) + " text " + nlohmann::json(text).dump();
    EXPECT_EQ(pieces_of(text), record["pieces"].get<std::vector<std::string>>()) << where;
    const auto ids = encode(*tokenizer, text, record.value("allow_special", false));
    EXPECT_EQ(ids, record["ids"].get<std::vector<int32_t>>()) << where;
    EXPECT_EQ(tokenizer->decode(ids), record["decoded"].get<std::string>()) << where;
  }
}

TEST(DeepSeekGolden, RandomUnicodeStrings) {
  auto tokenizer = load();
  const std::vector<std::string> texts = mt::testing::golden::random_texts();
  const auto records = read_jsonl(kGoldenDir / "random.jsonl");
  ASSERT_EQ(records.size(), texts.size());
  int failures = 0;
  for (size_t i = 0; i < texts.size() && failures < 10; ++i) {
    const bool ok = strings_hash(pieces_of(texts[i])) == records[i]["pieces"] &&
                    ids_hash(encode(*tokenizer, texts[i], false)) == records[i]["ids"];
    if (!ok) ++failures;
    EXPECT_TRUE(ok) << "random string " << i << " " << nlohmann::json(texts[i]).dump();
  }
}

TEST(DeepSeekGolden, DemoCorpora) {
  auto tokenizer = load();
  for (const auto& record : read_jsonl(kGoldenDir / "corpora.jsonl")) {
    const std::string text = read_file(fs::path(MT_SOURCE_DIR) / record["corpus"].get<std::string>());
    ASSERT_EQ(text.size(), record["bytes"].get<size_t>()) << record["corpus"];
    const auto ids = encode(*tokenizer, text, false);
    EXPECT_EQ(ids_hash(ids), record["ids"]) << record["corpus"];
    EXPECT_EQ(tokenizer->decode(ids), text) << record["corpus"];
  }
}

TEST(DeepSeekGolden, AnotherSplitRegexIsRefusedNamingIt) {
  auto root = nlohmann::json::parse(read_file(kGoldenDir / "deepseek_v3_style_tokenizer.json"));
  root["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}{1,4}";
  const fs::path path = fs::temp_directory_path() / ("mt_deepseek_other_regex_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << root.dump();
  TokenizerOptions options;
  options.type = "HuggingFaceTokenizer";
  options.tokenizer_model = path.string();
  try {
    Tokenizer::load(options);
    ADD_FAILURE() << "accepted a Split regex that is not DeepSeek-V3's";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("Split pre-tokenizer 1 of 3 has the regex \"\\\\p{N}{1,4}\""), std::string::npos)
        << e.what();
  }
  fs::remove(path);
}

}  // namespace
