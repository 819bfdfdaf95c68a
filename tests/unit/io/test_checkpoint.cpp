// Checkpoint writer/reader: global tensors round-trip, shards land at their hyperslab, a failed
// write (mid-file, at the rename, or in a missing directory) leaves no file and no temporary and
// never replaces a good checkpoint, wrong files are refused with the tensor named.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "../temp_dir.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "model/init.h"

using namespace mt;

namespace {
std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("mt_ckpt_") + std::to_string(getpid()) + name)).string();
}
}  // namespace

TEST(Checkpoint, RoundTripsAndShardsReadTheirSlices) {
  const model::ModelConfig c = model::preset("tiny-llama");
  const model::ParamLayout layout = model::build_layout(c);
  std::vector<float> params(static_cast<size_t>(layout.total_elements));
  model::initialize_parameters(c, layout, 3, params.data());
  const std::string path = temp_path("a.h5");
  io::CheckpointInfo info;
  info.iteration = 7;
  info.consumed_samples = 28;
  info.config_json = R"({"name":"tiny-llama"})";
  io::write_parameters(path, layout, params.data(), info);
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::temp_directory_path())) {
    EXPECT_EQ(entry.path().string().find(path + ".tmp"), std::string::npos) << "temporary left behind";
  }
  std::vector<float> back(params.size(), -1.0f);
  const io::CheckpointInfo read = io::read_parameters(path, layout, back.data());
  EXPECT_EQ(read.iteration, 7);
  EXPECT_EQ(read.consumed_samples, 28);
  EXPECT_EQ(read.config_json, info.config_json);
  for (const auto& e : layout.entries) {
    for (int64_t i = 0; i < e.numel; ++i) ASSERT_EQ(back[e.offset + i], params[e.offset + i]) << e.name;
  }
  // A TP=2 rank reads exactly its slice of the global tensors.
  parallel::ParallelConfig tp2;
  tp2.tensor_model_parallel_size = 2;
  parallel::RankCoordinates rank;
  rank.tp = 1;
  const model::ParamLayout shard = model::build_layout(c, tp2, rank, 0, c.num_layers);
  std::vector<float> local(static_cast<size_t>(shard.total_elements));
  io::read_parameters(path, shard, local.data());
  std::vector<float> expected(local.size());
  model::initialize_parameters(c, shard, 3, expected.data());
  for (const auto& e : shard.entries) {
    for (int64_t i = 0; i < e.numel; ++i) ASSERT_EQ(local[e.offset + i], expected[e.offset + i]) << e.name;
  }
  std::remove(path.c_str());
}

TEST(Checkpoint, RefusesOtherModelsAndNonCheckpoints) {
  const model::ModelConfig small = model::preset("tiny-gpt");
  const model::ParamLayout layout = model::build_layout(small);
  std::vector<float> params(static_cast<size_t>(layout.total_elements));
  const std::string path = temp_path("b.h5");
  io::write_parameters(path, layout, params.data(), {});
  model::ModelConfig wider = small;
  wider.hidden_size = 128;
  const model::ParamLayout other = model::build_layout(wider);
  std::vector<float> buffer(static_cast<size_t>(other.total_elements));
  EXPECT_THROW(io::read_parameters(path, other, buffer.data()), Error);
  std::remove(path.c_str());
  const std::string text = temp_path("c.h5");
  std::FILE* f = std::fopen(text.c_str(), "w");
  std::fputs("not hdf5", f);
  std::fclose(f);
  EXPECT_THROW(io::read_parameters(text, layout, params.data()), Error);
  std::remove(text.c_str());
}

TEST(Checkpoint, AFailedWriteLeavesNoFileAndKeepsTheGoodOne) {
  mt::testing::TempDir dir("mt_test_checkpoint");
  const model::ModelConfig c = model::preset("tiny-gpt");
  const model::ParamLayout layout = model::build_layout(c);
  std::vector<float> params(static_cast<size_t>(layout.total_elements));
  model::initialize_parameters(c, layout, 5, params.data());
  // The last tensor's name puts it in a group that does not exist: HDF5 refuses that dataset
  // after every other tensor has been written to the temporary file.
  model::ParamLayout unwritable = layout;
  unwritable.entries.back().name = "no/such/group";

  const std::string fresh = dir.file("fresh.h5");
  EXPECT_THROW(io::write_parameters(fresh, unwritable, params.data(), {}), Error);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{}) << "the directory after a failed write";

  const std::string good = dir.file("good.h5");
  io::CheckpointInfo info;
  info.iteration = 3;
  io::write_parameters(good, layout, params.data(), info);
  std::vector<float> other(params.size(), 0.5f);
  EXPECT_THROW(io::write_parameters(good, unwritable, other.data(), {}), Error);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"good.h5"}) << "the directory after a failed write";
  std::vector<float> back(params.size(), -1.0f);
  EXPECT_EQ(io::read_parameters(good, layout, back.data()).iteration, 3);
  for (const auto& e : layout.entries) {
    for (int64_t i = 0; i < e.numel; ++i) ASSERT_EQ(back[e.offset + i], params[e.offset + i]) << e.name;
  }

  // The rename fails (the target is a non-empty directory): the temporary goes, the directory stays.
  std::filesystem::create_directories(dir.path() / "taken" / "inside");
  EXPECT_THROW(io::write_parameters(dir.file("taken"), layout, params.data(), {}), Error);
  EXPECT_EQ(dir.entries().size(), 2u) << "a failed rename left its temporary behind";
  EXPECT_TRUE(std::filesystem::is_directory(dir.path() / "taken" / "inside"));

  // A missing directory: nothing can be created, and nothing is.
  EXPECT_THROW(io::write_parameters(dir.file("missing/x.h5"), layout, params.data(), {}), Error);
  EXPECT_EQ(dir.entry_count(), 3u);
}
