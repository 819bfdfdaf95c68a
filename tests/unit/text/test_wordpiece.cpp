// BertWordPiece tokenizers (lib/text/wordpiece.h) on a hand-made vocabulary: the basic tokenizer's
// words (cleaning, CJK, punctuation, accent strip and lower-casing only when uncased, canonical
// ordering of marks), greedy longest-match-first with ## pieces and [UNK], the decoder's cleanup,
// special tokens and Megatron-Core's extra ids, end-of-document and [CLS]/[SEP], and every way a
// vocab.txt is refused (naming the file and the line). The reference comparison is
// test_wordpiece_golden.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "core/error.h"
#include "text/tokenizer.h"
#include "text/wordpiece.h"

using mt::text::BertBasicTokenizer;
using mt::text::Tokenizer;
using mt::text::TokenizerOptions;

namespace {

const std::vector<std::string> kVocab = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able",
                                         "aff", "##a", "hello", "world", ",", "!", ".", "'", "s", "cafe", "Hello",
                                         "##s", "中", "do", "not", "n", "##'", "##t", "a"};

std::string write_vocab(const mt::testing::TempDir& dir, const std::string& text, const std::string& name = "vocab.txt") {
  const std::string path = dir.file(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string vocab_text(const std::vector<std::string>& tokens) {
  std::string text;
  for (const auto& token : tokens) text += token + "\n";
  return text;
}

std::unique_ptr<Tokenizer> load(const std::string& type, const std::string& path, bool include_special = true) {
  TokenizerOptions options;
  options.type = type;
  options.vocab_file = path;
  options.include_special_tokens = include_special;
  return Tokenizer::load(options);
}

std::vector<std::string> words(bool lower_case, const std::string& text) {
  std::vector<std::string> out;
  BertBasicTokenizer(lower_case).split(text, [&](std::string_view word, size_t) { out.emplace_back(word); });
  return out;
}

std::vector<int32_t> encode(const Tokenizer& tokenizer, const std::string& text, bool allow_special = false) {
  std::vector<int32_t> ids;
  tokenizer.encode(text, ids, allow_special);
  return ids;
}

using Words = std::vector<std::string>;

TEST(BertBasicTokenizer, SplitsOnWhitespaceAndIsolatesPunctuation) {
  EXPECT_EQ(words(true, "Hello, World!  a$b\tc\r\nd"), (Words{"hello", ",", "world", "!", "a", "$", "b", "c", "d"}));
  EXPECT_EQ(words(false, "Hello, World!"), (Words{"Hello", ",", "World", "!"}));
  EXPECT_EQ(words(false, "«x»—y"), (Words{"«", "x", "»", "—", "y"}));
  EXPECT_EQ(words(false, "a©b"), (Words{"a©b"})) << "symbols other than ASCII punctuation stay in the word";
}

TEST(BertBasicTokenizer, CleansControlsAndIsolatesCjk) {
  EXPECT_EQ(words(false, std::string("a\0b\x01" "c\u00ad" "d\ufffde", 12)), (Words{"abcde"}));
  EXPECT_EQ(words(false, "x\u00a0y\u3000z"), (Words{"x", "y", "z"}));
  EXPECT_EQ(words(false, "ab中文cd"), (Words{"ab", "中", "文", "cd"}));
  EXPECT_EQ(words(false, "a\xff" "b"), (Words{"ab"})) << "an ill-formed byte is U+FFFD, which is removed";
}

TEST(BertBasicTokenizer, StripsAccentsAndLowerCasesOnlyWhenUncased) {
  EXPECT_EQ(words(true, "ÉCOLE Café İ straße 각"), (Words{"ecole", "cafe", "i", "straße", "\u1100\u1161\u11a8"}));
  EXPECT_EQ(words(false, "ÉCOLE Café"), (Words{"ÉCOLE", "Café"}));
  // Canonical ordering before the strip: U+1E011 (class 230, kept: not Mn for the reference)
  // moves after U+1D171 (class 216), across a removed U+200B.
  EXPECT_EQ(words(true, "1\U0001E011\u200b\U0001D171"), (Words{"1\U0001D171\U0001E011"}));
  EXPECT_EQ(words(false, "1\U0001E011\U0001D171"), (Words{"1\U0001E011\U0001D171"}));
}

TEST(WordPiece, GreedyLongestMatchFirstWithContinuationPieces) {
  mt::testing::TempDir dir;
  auto tokenizer = load("BertWordPieceLowerCase", write_vocab(dir, vocab_text(kVocab)));
  EXPECT_EQ(encode(*tokenizer, "unaffable"), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(encode(*tokenizer, "Hello, world!"), (std::vector<int32_t>{10, 12, 11, 13}));
  EXPECT_EQ(encode(*tokenizer, "affa unx"), (std::vector<int32_t>{8, 9, 1})) << "no piece covers 'x': the word is [UNK]";
  EXPECT_EQ(encode(*tokenizer, "Café"), (std::vector<int32_t>{17}));
  EXPECT_EQ(encode(*tokenizer, std::string(100, 'a')).size(), 100u) << "a ##a ##a ...";
  EXPECT_EQ(encode(*tokenizer, std::string(101, 'a')), (std::vector<int32_t>{1})) << "over 100 code points: [UNK]";
}

TEST(WordPiece, DecodeJoinsPiecesAndCleansUpLikeTheReference) {
  mt::testing::TempDir dir;
  auto tokenizer = load("BertWordPieceCase", write_vocab(dir, vocab_text(kVocab)));
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{18, 12, 11, 13}), "Hello, world!");
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{5, 6, 7, 14}), "unaffable.");
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{6, 5}), "##aff un") << "the first token keeps its ##";
  // The cleanup runs on each token with its leading space, as the reference's does: " '" alone
  // is not " ' ", so "' s" stays apart.
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{21, 22, 15, 16}), "do not ' s");
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{2, 10, 3}), "[CLS] hello [SEP]");
  EXPECT_THROW(tokenizer->decode(std::vector<int32_t>{static_cast<int32_t>(tokenizer->vocab_size())}), mt::Error);
}

TEST(WordPiece, SpecialTokensExtraIdsEndOfDocumentAndSequence) {
  mt::testing::TempDir dir;
  const std::string path = write_vocab(dir, vocab_text(kVocab));
  auto uncased = load("BertWordPieceLowerCase", path);
  auto cased = load("BertWordPieceCase", path);
  const int32_t n = static_cast<int32_t>(kVocab.size());
  EXPECT_EQ(uncased->vocab_size(), n);
  EXPECT_EQ(cased->vocab_size(), n + 100);
  EXPECT_EQ(cased->special_token_id("<extra_id_0>"), n);
  EXPECT_EQ(cased->special_token_id("<extra_id_99>"), n + 99);
  EXPECT_EQ(uncased->special_token_id("<extra_id_0>"), std::nullopt);
  EXPECT_EQ(uncased->eod_id(), 3);
  EXPECT_EQ(encode(*cased, "hello<extra_id_7>[SEP]", true), (std::vector<int32_t>{10, n + 7, 3}));
  EXPECT_NE(encode(*cased, "[SEP]", false), (std::vector<int32_t>{3})) << "special text is text without allow_special";
  std::vector<int32_t> ids;
  uncased->encode_sequence("hello", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 10, 3}));
  ids.clear();
  load("BertWordPieceLowerCase", path, false)->encode_sequence("hello", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{10}));
}

void expect_refused(const std::string& text, const std::string& needle) {
  mt::testing::TempDir dir;
  const std::string path = write_vocab(dir, text);
  try {
    load("BertWordPieceLowerCase", path);
    ADD_FAILURE() << "accepted a vocab.txt that should fail with: " << needle;
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(WordPiece, CorruptVocabularyIsRefusedNamingFileAndLine) {
  const std::string good = vocab_text(kVocab);
  expect_refused("", "holds no tokens");
  expect_refused(good + "x\n\ny\n", "line " + std::to_string(kVocab.size() + 2) + ": is empty");
  expect_refused(good + "hello\n", "line " + std::to_string(kVocab.size() + 1) + ": repeats the token \"hello\" of line 11");
  expect_refused(good + "ab\xc3\n", "line " + std::to_string(kVocab.size() + 1) + ": is not valid UTF-8");
  expect_refused(good + " x\n", "surrounding whitespace");
  expect_refused("[PAD]\n[CLS]\n[SEP]\n[MASK]\nhello\n", "has no [UNK] token");
  expect_refused(good.substr(0, good.size() / 2) + "\xe4\xb8", "is not valid UTF-8");  // cut inside a character
  mt::testing::TempDir dir;
  EXPECT_THROW(load("BertWordPieceLowerCase", dir.file("missing.txt")), mt::Error);
  TokenizerOptions options;
  options.type = "BertWordPieceCase";
  EXPECT_THROW(Tokenizer::load(options), mt::UsageError) << "--vocab-file is required";
}

}  // namespace
