// libFuzzer target: the tokenizer-file loaders of text/tokenizer.h. The first byte picks the
// format, the rest is the file: 0 tokenizer.json (HuggingFaceTokenizer, byte-level or
// SentencePiece-style), 1 a tiktoken rank file or Megatron's JSON vocabulary (TikTokenizer), 2 a
// SentencePiece .model (SentencePieceTokenizer), 3 a WordPiece vocab.txt (BertWordPieceCase),
// 4 GPT-2's encoder.json and vocab.bpe (GPT2BPETokenizer; the two files split at the first NUL
// byte). A bad file is an mt::Error; a tokenizer that loads encodes and decodes a fixed text with
// every id in its vocabulary.
// Tested by the fuzz smoke runs and the replay tests of tests/fuzz/CMakeLists.txt.
#include <memory>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "text/tokenizer.h"

namespace {

using mt::text::TokenizerOptions;

TokenizerOptions options_for(uint8_t format, std::string_view file) {
  TokenizerOptions options;
  switch (format % 5) {
    case 0:
      options.type = "HuggingFaceTokenizer";
      options.tokenizer_model = mt::fuzz::write_scratch_file(file, ".json");
      break;
    case 1:
      options.type = "TikTokenizer";
      options.tokenizer_model = mt::fuzz::write_scratch_file(file, ".tiktoken");
      break;
    case 2:
      options.type = "SentencePieceTokenizer";
      options.tokenizer_model = mt::fuzz::write_scratch_file(file, ".model");
      break;
    case 3:
      options.type = "BertWordPieceCase";
      options.vocab_file = mt::fuzz::write_scratch_file(file, ".txt");
      break;
    default: {
      const size_t split = std::min(file.find('\0'), file.size());
      options.type = "GPT2BPETokenizer";
      options.vocab_file = mt::fuzz::write_scratch_file(file.substr(0, split), "-encoder.json");
      options.merge_file = mt::fuzz::write_scratch_file(file.substr(std::min(split + 1, file.size())), "-vocab.bpe");
    }
  }
  return options;
}

void use(const mt::text::Tokenizer& tokenizer) {
  static const std::string text = "Hello world, <|endoftext|> [CLS] caf\xc3\xa9 \xe2\x96\x81x 12345 \xff!";
  std::vector<int32_t> ids;
  tokenizer.encode_sequence(text, ids);
  for (const int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size());
  tokenizer.decode(ids);
  if (const auto eod = tokenizer.eod_id()) FUZZ_CHECK(*eod >= 0 && *eod < tokenizer.vocab_size());
  // Special-token text: some tokenizers refuse allow_special by name (SentencePiece).
  mt::fuzz::refusals_only([&] {
    std::vector<int32_t> with_specials;
    tokenizer.encode(text, with_specials, /*allow_special=*/true);
    for (const int32_t id : with_specials) FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size());
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const TokenizerOptions options = options_for(data[0], mt::fuzz::as_text(data + 1, size - 1));
  mt::fuzz::refusals_only([&] { use(*mt::text::Tokenizer::load(options)); });
  return 0;
}
