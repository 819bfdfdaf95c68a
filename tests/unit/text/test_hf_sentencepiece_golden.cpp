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
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../temp_dir.h"
#include "golden_records.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using mt::text::Tokenizer;
namespace golden = mt::testing::golden;

namespace {

const fs::path kGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/sentencepiece";
const char* const kFiles[] = {"llama_style_2k.legacy.json", "llama_style_2k.metaspace.json", "llama_style_2k.split.json"};

std::unique_ptr<Tokenizer> load(const std::string& file) {
  mt::text::TokenizerOptions options;
  options.type = "HuggingFaceTokenizer";
  options.tokenizer_model = (kGoldenDir / file).string();
  return Tokenizer::load(options);
}

const std::vector<nlohmann::json>& goldens() {
  static const std::vector<nlohmann::json> records = golden::read_jsonl(kGoldenDir / "hf_goldens.jsonl");
  return records;
}

class HfSentencePieceGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(HfSentencePieceGolden, EdgeCasesEveryId) {
  EXPECT_EQ(golden::check_edge_cases(*load(GetParam()), goldens(), GetParam(), /*allow_special=*/true), 55);
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
  const auto counts = golden::check_hashed_blocks(*load(GetParam()), goldens(), GetParam(), /*allow_special=*/true);
  EXPECT_EQ(counts.wholes, 1);
  EXPECT_GT(counts.blocks, 100);
}

TEST_P(HfSentencePieceGolden, DecodeRandomIds) {
  EXPECT_EQ(golden::check_decodes(*load(GetParam()), goldens(), GetParam()), 300);
}

// A vocab token with U+2581 after a letter (no merge makes it) turns off cutting words before
// U+2581, so the whole text is merged at once: the same ids, by the other path.
TEST(HfSentencePieceGoldenUncut, EdgeCasesAndDemoLinesEveryId) {
  nlohmann::json root = nlohmann::json::parse(golden::read_file(kGoldenDir / "llama_style_2k.legacy.json"));
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
      const auto ids = golden::encode(*tokenizer, record["text"].get<std::string>(), /*allow_special=*/true);
      EXPECT_EQ(ids, record["ids"].get<std::vector<int32_t>>()) << "edge case " << record["index"];
      ++checked;
    } else if (record["set"] == "tinyshakespeare.txt" && record["first"] == -1) {
      golden::Fnv ids_hash;
      ids_hash.add_counted_ids(golden::encode(*tokenizer, golden::whole_file("tinyshakespeare.txt"), /*allow_special=*/true));
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
