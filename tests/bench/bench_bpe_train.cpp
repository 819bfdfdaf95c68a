// The mt half of tests/bench/bench_bpe_train.sh: trains a BPE vocabulary on one file (one
// document), writes GPT-2 vocab.json / merges.txt, encodes a held-out file through
// Tokenizer::load and prints one JSON line with the sizes, timings and tokens per byte. A
// benchmark, not a test: the trainer's correctness is tests/unit/text/test_bpe_trainer.cpp, and
// the script compares the files with Hugging Face's encoder.
// Usage: mt_bench_bpe_train TRAIN_FILE HELDOUT_FILE VOCAB_SIZE OUTPUT_PREFIX [MIN_FREQUENCY]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/bpe_trainer.h"
#include "text/tokenizer.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw mt::Error(path, "cannot open");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || argc > 6) {
    std::fprintf(stderr, "usage: %s TRAIN_FILE HELDOUT_FILE VOCAB_SIZE OUTPUT_PREFIX [MIN_FREQUENCY]\n", argv[0]);
    return 2;
  }
  try {
    using clock = std::chrono::steady_clock;
    const std::string text = read_file(argv[1]), held_out = read_file(argv[2]);
    const auto start = clock::now();
    mt::text::BpeTrainer trainer({.vocab_size = std::stoll(argv[3]), .min_frequency = argc > 5 ? std::stoll(argv[5]) : 2});
    trainer.add_text(text);
    const auto counted = clock::now();
    const mt::text::BpeVocabulary vocab = trainer.train();
    const auto trained = clock::now();
    const std::string encoder_path = std::string(argv[4]) + "-vocab.json";
    const std::string merges_path = std::string(argv[4]) + "-merges.txt";
    mt::text::write_gpt2_files(vocab, encoder_path, merges_path);
    mt::text::TokenizerOptions options;
    options.type = "GPT2BPETokenizer";
    options.vocab_file = encoder_path;
    options.merge_file = merges_path;
    std::vector<int32_t> ids;
    mt::text::Tokenizer::load(options)->encode(held_out, ids);
    const nlohmann::json record = {
        {"vocab_size", vocab.tokens.size()},
        {"merges", vocab.merges.size()},
        {"unique_pieces", trainer.num_unique_pieces()},
        {"count_s", std::chrono::duration<double>(counted - start).count()},
        {"train_s", std::chrono::duration<double>(trained - start).count()},
        {"heldout_bytes", held_out.size()},
        {"heldout_tokens", ids.size()},
        {"tokens_per_byte", held_out.empty() ? nlohmann::json() : nlohmann::json(double(ids.size()) / double(held_out.size()))},
    };
    std::printf("%s\n", record.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mt_bench_bpe_train: error: %s\n", e.what());
    return 1;
  }
}
