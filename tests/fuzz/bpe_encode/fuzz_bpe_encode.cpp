// libFuzzer target: the pre-tokenizers and byte-level BPE encode of the repository's tokenizers
// (GPT-2's encoder.json/vocab.bpe with the gpt2 pattern, cl100k_base's tiktoken file with the cl100k
// pattern, the DeepSeek-V3-style tokenizer.json with its three Splits). The first byte picks the
// tokenizer, the rest is the text. Invariants: every id is in the vocabulary, the ids' bytes give
// the text back (text/tokenizer.h: invalid UTF-8 too), decode never throws on encode's ids, and
// allow_special encodes without a finding.
// Tested by the fuzz smoke runs and the replay tests of tests/fuzz/CMakeLists.txt.
#include <memory>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "text/tokenizer.h"

namespace {

using mt::text::Tokenizer;
using mt::text::TokenizerOptions;

std::vector<std::unique_ptr<Tokenizer>> load_tokenizers_once() {
  std::vector<std::unique_ptr<Tokenizer>> tokenizers;
  TokenizerOptions gpt2;
  gpt2.type = "GPT2BPETokenizer";
  gpt2.vocab_file = mt::fuzz::source_path("data/tokenizers/gpt2/encoder.json");
  gpt2.merge_file = mt::fuzz::source_path("data/tokenizers/gpt2/vocab.bpe");
  tokenizers.push_back(Tokenizer::load(gpt2));
  TokenizerOptions cl100k;
  cl100k.type = "TikTokenizer";
  cl100k.tokenizer_model = mt::fuzz::source_path("data/tokenizers/cl100k_base/cl100k_base.tiktoken");
  tokenizers.push_back(Tokenizer::load(cl100k));
  TokenizerOptions deepseek;
  deepseek.type = "HuggingFaceTokenizer";
  deepseek.tokenizer_model = mt::fuzz::source_path("tests/golden/deepseek/deepseek_v3_style_tokenizer.json");
  tokenizers.push_back(Tokenizer::load(deepseek));
  return tokenizers;
}

void check_encoding(const Tokenizer& tokenizer, std::string_view text) {
  std::vector<int32_t> ids;
  tokenizer.encode(text, ids);
  std::string bytes;
  for (const int32_t id : ids) {
    FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size());
    bytes += tokenizer.token_bytes(id);
  }
  FUZZ_CHECK(bytes == text);
  tokenizer.decode(ids);
  std::vector<int32_t> with_specials;
  tokenizer.encode(text, with_specials, /*allow_special=*/true);
  for (const int32_t id : with_specials) FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size());
}

// The three tokenizers, loaded on the first call (seconds under the sanitizers).
const std::vector<std::unique_ptr<Tokenizer>>& tokenizers() {
  static const std::vector<std::unique_ptr<Tokenizer>> loaded = load_tokenizers_once();
  return loaded;
}

}  // namespace

// libFuzzer calls this once before its per-input timer starts: the loading is not an input's time.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Tokenizer& tokenizer = *tokenizers()[data[0] % tokenizers().size()];
  check_encoding(tokenizer, mt::fuzz::as_text(data + 1, size - 1));
  return 0;
}
