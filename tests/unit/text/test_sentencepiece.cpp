// SentencePiece BPE models (text/sentencepiece_tokenizer.h): what the loader refuses (truncated or
// corrupt files name the file and what is wrong), Megatron-Core's wrapper facts (eod = eos, no BOS),
// byte fallback, unknown runs, the nmt_nfkc charsmap, user-defined pieces, and decode. The ids
// asserted here are the reference's (python3-sentencepiece 0.1.97 on the committed test models);
// the full comparison is test_sentencepiece_golden.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "core/error.h"
#include "text/sentencepiece_model.h"
#include "text/tokenizer.h"

namespace fs = std::filesystem;
using mt::text::Tokenizer;

namespace {

const fs::path kModelDir = fs::path(MT_SOURCE_DIR) / "tests/golden/sentencepiece";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::unique_ptr<Tokenizer> load(const fs::path& path, const std::string& type = "SentencePieceTokenizer") {
  mt::text::TokenizerOptions options;
  options.type = type;
  options.tokenizer_model = path.string();
  return Tokenizer::load(options);
}

std::vector<int32_t> encode(const Tokenizer& tokenizer, const std::string& text) {
  std::vector<int32_t> ids;
  tokenizer.encode(text, ids);
  return ids;
}

// The message of the mt::Error loading `bytes` as a model throws ("" when it loads).
std::string load_error(const std::string& bytes) {
  mt::testing::TempDir dir;
  const fs::path path = dir.path() / "tokenizer.model";
  std::ofstream(path, std::ios::binary) << bytes;
  try {
    load(path);
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

TEST(SentencePiece, TruncatedModelsAreRefusedNamingTheFile) {
  const std::string model = read_file(kModelDir / "llama_style_2k.model");
  ASSERT_GT(model.size(), 20000u);
  for (size_t length : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{100}, size_t{1000}, model.size() / 2,
                        model.size() - 40, model.size() - 1}) {
    const std::string message = load_error(model.substr(0, length));
    EXPECT_NE(message, "") << "a model cut to " << length << " bytes loaded";
    EXPECT_TRUE(message.find("not a valid SentencePiece model") != std::string::npos ||
                message.find("cut short") != std::string::npos)
        << message;
  }
}

TEST(SentencePiece, CorruptModelsAreRefusedNamingWhatIsWrong) {
  EXPECT_NE(load_error("{\"model\": {\"type\": \"BPE\"}}").find("not a valid SentencePiece model"), std::string::npos);
  EXPECT_NE(load_error("").find("the file is empty"), std::string::npos);
  // A wire type 3 (a group) right at the start.
  EXPECT_NE(load_error(std::string("\x0b\x0c", 2)).find("wire type 3"), std::string::npos);
  // A piece whose length prefix (65,535 bytes) runs past the end of the file.
  EXPECT_NE(load_error(std::string("\x0a\xff\xff\x03", 4) + "abc").find("cut short"), std::string::npos);
  // Two pieces with the same text.
  const std::string unk = std::string("\x0a\x09\x0a\x05<unk>\x18\x02", 11);
  const std::string spec = std::string("\x12\x02\x18\x02", 4) + std::string("\x1a\x0a\x0a\x08identity", 12);
  EXPECT_NE(load_error(unk + unk + spec).find("is already defined"), std::string::npos);
  EXPECT_EQ(load_error(unk + spec), "");
}

// Random bytes overwritten anywhere in a model (its charsmap trie included): each copy loads and
// encodes, or is refused with an mt::Error; none crashes or reads out of bounds.
TEST(SentencePiece, CorruptedBytesNeverCrash) {
  const std::string model = read_file(kModelDir / "nfkc_4k.model");
  uint64_t state = 20261127;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  mt::testing::TempDir dir;
  const fs::path path = dir.path() / "corrupt.model";
  int refused = 0;
  for (int trial = 0; trial < 60; ++trial) {
    std::string copy = model;
    for (int k = 0; k < 8; ++k) copy[next() % copy.size()] = static_cast<char>(next());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << copy;
    try {
      auto tokenizer = load(path);
      std::vector<int32_t> ids;
      tokenizer->encode("Pierre said \xEF\xBD\x88\xC3\xA9llo, \xE2\x82\xAC 12\t\u3000ok", ids);
      tokenizer->decode(ids);
    } catch (const mt::Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
}

TEST(SentencePiece, ModelsOtherThanBpeAreRefusedByName) {
  // A piece list and a trainer_spec with model_type UNIGRAM (1) and an identity normalizer_spec.
  std::string unigram;
  const std::string piece = std::string("\x0a\x05<unk>\x18\x02", 9);
  unigram += "\x0a" + std::string(1, static_cast<char>(piece.size())) + piece;
  unigram += std::string("\x12\x02\x18\x01", 4);
  unigram += std::string("\x1a\x0a\x0a\x08identity", 12);
  EXPECT_NE(load_error(unigram).find("model_type UNIGRAM is not supported (only BPE)"), std::string::npos);
  std::string bpe = unigram;
  bpe[bpe.size() - 13] = '\x02';  // model_type BPE: loads
  EXPECT_EQ(load_error(bpe), "");
}

TEST(SentencePiece, MegatronWrapperFacts) {
  for (const char* type : {"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"}) {
    auto tokenizer = load(kModelDir / "llama_style_2k.model", type);
    EXPECT_EQ(tokenizer->name(), type);
    EXPECT_EQ(tokenizer->eod_id(), 2);  // </s>
    EXPECT_EQ(tokenizer->vocab_size(), 2000);
    EXPECT_TRUE(tokenizer->sequence_prefix().empty());  // no BOS in preprocessing
    EXPECT_EQ(tokenizer->special_token_id("[INST]"), 3);
    std::vector<int32_t> ids;
    EXPECT_THROW(tokenizer->encode("[INST] hi", ids, /*allow_special=*/true), mt::UsageError);
  }
}

TEST(SentencePiece, ByteFallbackAndUnknownRuns) {
  auto llama = load(kModelDir / "llama_style_2k.model");
  // "€" is not a piece: U+2581, then its UTF-8 bytes E2 82 AC as <0xE2> <0x82> <0xAC> (id 5 + byte).
  const auto ids = encode(*llama, "\xE2\x82\xAC");
  EXPECT_EQ(ids, (std::vector<int32_t>{1926, 231, 135, 177}));
  EXPECT_EQ(llama->token_bytes(ids[1]), "\xE2");
  EXPECT_EQ(ids[1], 5 + 0xE2);
  EXPECT_EQ(ids[2], 5 + 0x82);
  EXPECT_EQ(ids[3], 5 + 0xAC);
  EXPECT_EQ(llama->decode(ids), "\xE2\x82\xAC");
  // A lone continuation byte decodes to U+FFFD.
  EXPECT_EQ(llama->decode(std::vector<int32_t>{5 + 0x82}), "\xEF\xBF\xBD");
  // Without byte fallback a run of unknown characters is one unknown id, decoded as " ⁇ ".
  auto identity = load(kModelDir / "identity_1k.model");
  const auto unknown = encode(*identity, "\xE2\x82\xAC\xE2\x82\xAC\xE2\x82\xAC");
  EXPECT_EQ(unknown, (std::vector<int32_t>{926, 0}));
  EXPECT_EQ(encode(*identity, "a\xE2\x82\xAC\xE2\x82\xAC\xE2\x82\xAC" "b"), (std::vector<int32_t>{5, 0, 948}));
  EXPECT_EQ(identity->decode(unknown), " \xE2\x81\x87 ");
}

TEST(SentencePiece, PrecompiledCharsmapFoldsFullWidthAndWhitespace) {
  auto nfkc = load(kModelDir / "nfkc_4k.model");
  // NFKC: full-width letters are ASCII; extra spaces, tabs and newlines fold to one space.
  EXPECT_EQ(encode(*nfkc, "\xEF\xBD\x88\xEF\xBD\x85\xEF\xBD\x8C\xEF\xBD\x8C\xEF\xBD\x8F"), encode(*nfkc, "hello"));
  EXPECT_EQ(encode(*nfkc, "  the\t\tcat \n"), encode(*nfkc, "the cat"));
  // The identity model keeps the tab.
  auto identity = load(kModelDir / "identity_1k.model");
  EXPECT_NE(encode(*identity, "the\tcat"), encode(*identity, "the cat"));
  // User-defined pieces are whole pieces and are not normalized.
  EXPECT_EQ(encode(*nfkc, "<sep>Pierre"), (std::vector<int32_t>{3927, 3, 4}));  // U+2581, <sep>, Pierre
}

TEST(SentencePiece, DecodeDropsTheDummyPrefixAndControlPieces) {
  auto llama = load(kModelDir / "llama_style_2k.model");
  const auto ids = encode(*llama, "Hello world");
  EXPECT_EQ(ids, (std::vector<int32_t>{464, 293, 1929, 1197}));
  EXPECT_EQ(llama->decode(ids), "Hello world");
  std::vector<int32_t> with_controls = {1};
  with_controls.insert(with_controls.end(), ids.begin(), ids.end());
  with_controls.push_back(2);
  EXPECT_EQ(llama->decode(with_controls), "Hello world");  // <s> and </s> are invisible
  EXPECT_THROW(llama->decode(std::vector<int32_t>{2000}), mt::Error);
}

}  // namespace
