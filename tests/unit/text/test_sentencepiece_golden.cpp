// SentencePiece BPE models against the committed reference ids of tests/golden/sentencepiece
// (make_goldens.py with Debian's python3-sentencepiece 0.1.97; nothing from Python is needed here).
// Three models trained by make_models.py on the repository's corpus: llama_style_2k (identity
// normalizer, byte fallback, control pieces), nfkc_4k (nmt_nfkc precompiled charsmap, user-defined
// pieces, no byte fallback), identity_1k (identity, extra whitespace removed, no byte fallback).
// Every id equal on the tokenizer torture corpus (edge cases with full ids, 10,000 random Unicode
// strings in blocks of 100 as FNV-1a 64), on the corpus files line by line and whole; decode equal
// on the same texts and on random id sequences.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "golden_records.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using mt::text::Tokenizer;
namespace golden = mt::testing::golden;

namespace {

const fs::path kGoldenDir = fs::path(MT_SOURCE_DIR) / "tests/golden/sentencepiece";
const char* const kModels[] = {"llama_style_2k", "nfkc_4k", "identity_1k"};

std::unique_ptr<Tokenizer> load(const std::string& model) {
  mt::text::TokenizerOptions options;
  options.type = "Llama2Tokenizer";
  options.tokenizer_model = (kGoldenDir / (model + ".model")).string();
  return Tokenizer::load(options);
}

const std::vector<nlohmann::json>& goldens() {
  static const std::vector<nlohmann::json> records = golden::read_jsonl(kGoldenDir / "goldens.jsonl");
  return records;
}

class SentencePieceGolden : public ::testing::TestWithParam<const char*> {};

TEST_P(SentencePieceGolden, EdgeCasesEveryId) {
  EXPECT_EQ(golden::check_edge_cases(*load(GetParam()), goldens(), GetParam(), /*allow_special=*/false), 49);
}

TEST_P(SentencePieceGolden, RandomStringsAndCorporaEveryId) {
  const auto counts = golden::check_hashed_blocks(*load(GetParam()), goldens(), GetParam(), /*allow_special=*/false);
  EXPECT_EQ(counts.wholes, 2);
  EXPECT_GT(counts.blocks, 200);
}

TEST_P(SentencePieceGolden, DecodeRandomIds) {
  EXPECT_EQ(golden::check_decodes(*load(GetParam()), goldens(), GetParam()), 300);
}

INSTANTIATE_TEST_SUITE_P(Models, SentencePieceGolden, ::testing::ValuesIn(kModels));

}  // namespace
