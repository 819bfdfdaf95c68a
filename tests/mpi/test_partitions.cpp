// text/preprocess.h's preprocess_partitions under MPI: chunks go to whichever rank claims them
// first, so a rank whose tokenizer is slow (a node under load) tokenizes few of them and the
// others take the rest, and the output is still the bytes one process writes. Megatron's dealing,
// chunk boundaries and bad input are tested in tests/unit/text/test_preprocess.cpp (a world of
// one) and tests/tools/mt-tokenize-partitions.bats (mpirun, against Megatron's order).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../unit/temp_dir.h"
#include "../unit/text/byte_tokenizer.h"
#include "comm/communicator.h"
#include "tests/mpi/world.h"
#include "text/preprocess.h"

namespace {

using mt::mpi_test::world;

const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new mt::mpi_test::WorldEnvironment);

// Bytes as ids, counting the texts it encodes; `delay` per text stands for a slow node.
class CountingTokenizer : public mt::testing::ByteTokenizer {
 public:
  explicit CountingTokenizer(std::chrono::microseconds delay) : delay_(delay) {}
  void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const override {
    ++texts_;
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    ByteTokenizer::encode(text, out, allow_special);
  }
  int64_t texts() const { return texts_; }

 private:
  std::chrono::microseconds delay_;
  mutable std::atomic<int64_t> texts_{0};
};

std::string bytes_of(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Rank 0 writes `lines` lines, line(i) each, to corpus.jsonl in a directory of its own, which it
// returns (removed with it); `path`, on every rank, is that directory (every rank reads it: one
// filesystem).
std::unique_ptr<mt::testing::TempDir> corpus_on_rank_0(const std::string& name, int lines,
                                                       const std::function<std::string(int)>& line, std::string& path) {
  std::unique_ptr<mt::testing::TempDir> dir;
  if (world().rank() == 0) {
    dir = std::make_unique<mt::testing::TempDir>(name);
    path = dir->path().string();
    std::ofstream corpus(dir->file("corpus.jsonl"));
    for (int i = 0; i < lines; ++i) corpus << line(i) << '\n';
  }
  mt::comm::broadcast_text(world(), path, 0);
  return dir;
}

TEST(PartitionsUnderMpi, ASlowRankClaimsFewChunksAndTheOutputIsOneProcesssBytes) {
  ASSERT_EQ(world().size(), 2) << "run under mpirun -np 2";
  constexpr int kLines = 2000;
  std::string path;
  const auto dir = corpus_on_rank_0("mt_test_partitions_mpi", kLines,
                                    [](int i) { return R"({"text": "line )" + std::to_string(i) + R"( of the corpus"})"; }, path);

  mt::text::PreprocessOptions options;
  options.input.inputs = {path + "/corpus.jsonl"};
  options.input.batch_bytes = 512;  // many batches per chunk
  options.workers = 2;
  options.output_format = mt::data::TokenDatasetFormat::megatron;
  mt::text::PartitionOptions partitions;
  partitions.partitions = 2;
  // Rank 1 takes 2 ms a text: with chunks dealt by rank it would tokenize half of them.
  const CountingTokenizer tokenizer(std::chrono::microseconds(world().rank() == 1 ? 2000 : 0));
  options.output_prefix = path + "/two";
  const mt::text::PreprocessStats stats = mt::text::preprocess_partitions(tokenizer, options, partitions, world());
  EXPECT_EQ(stats.documents, kLines);
  if (world().rank() == 1) {
    EXPECT_LT(tokenizer.texts(), kLines / 4) << "the slow rank tokenized " << tokenizer.texts() << " of " << kLines;
  } else {
    EXPECT_GT(tokenizer.texts(), kLines * 3 / 4);
    const CountingTokenizer alone(std::chrono::microseconds(0));
    options.output_prefix = path + "/one";
    const auto one_process = mt::comm::make_single_communicator();
    mt::text::preprocess_partitions(alone, options, partitions, *one_process);
    for (const std::string ext : {".bin", ".idx"}) {
      EXPECT_EQ(bytes_of(path + "/two_text_document" + ext), bytes_of(path + "/one_text_document" + ext)) << ext;
    }
  }
  world().barrier();  // rank 0 removes the directory after every rank is done with it
}

// A tiny input (32 chunks, most of them empty, of 20 short lines) run again and again: whichever
// rank ends the last chunk, rank 0 writes the outputs only after every rank has said it is done
// (its tokens written), so every run ends and equals one process's bytes.
TEST(PartitionsUnderMpi, TinyInputsEndOnlyWhenEveryRankIsDone) {
  ASSERT_EQ(world().size(), 2) << "run under mpirun -np 2";
  std::string path;
  const auto dir = corpus_on_rank_0("mt_test_partitions_tiny", 20,
                                    [](int i) { return R"({"text": "l)" + std::to_string(i) + R"("})"; }, path);
  mt::text::PreprocessOptions options;
  options.input.inputs = {path + "/corpus.jsonl"};
  options.workers = 2;
  options.output_format = mt::data::TokenDatasetFormat::megatron;
  mt::text::PartitionOptions partitions;
  partitions.partitions = 2;
  const CountingTokenizer tokenizer(std::chrono::microseconds(0));
  if (world().rank() == 0) {
    options.output_prefix = path + "/one";
    const auto one_process = mt::comm::make_single_communicator();
    mt::text::preprocess_partitions(tokenizer, options, partitions, *one_process);
  }
  for (int run = 0; run < 24; ++run) {
    options.output_prefix = path + "/two" + std::to_string(run);
    const mt::text::PreprocessStats stats = mt::text::preprocess_partitions(tokenizer, options, partitions, world());
    if (world().rank() != 0) continue;
    EXPECT_EQ(stats.documents, 20);
    for (const std::string ext : {".bin", ".idx"}) {
      EXPECT_EQ(bytes_of(options.output_prefix + "_text_document" + ext), bytes_of(path + "/one_text_document" + ext))
          << "run " << run << ext;
    }
  }
  world().barrier();
}

}  // namespace
