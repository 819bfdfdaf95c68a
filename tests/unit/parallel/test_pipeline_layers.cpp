// Pipeline layer assignment against hand-computed tables of Megatron's placement: even stages,
// interleaved (virtual) chunks, uneven first/last stages, and both; every layer is built exactly
// once, and the order (chunk-major, then stage) walks the layers from 0 to L-1.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "parallel/pipeline_layers.h"

namespace {

using mt::parallel::LayerRange;
using mt::parallel::ParallelConfig;
using Table = std::vector<std::vector<LayerRange>>;

ParallelConfig stages(int pp) {
  ParallelConfig c;
  c.pipeline_model_parallel_size = pp;
  return c;
}

// Chunk c of every stage, then chunk c+1: the order activations flow; it must tile [0, L).
void expect_tiles_all_layers(const Table& table, int num_layers) {
  int next = 0;
  const size_t chunks = table.front().size();
  for (size_t c = 0; c < chunks; ++c) {
    for (size_t r = 0; r < table.size(); ++r) {
      EXPECT_EQ(table[r][c].first, next) << "stage " << r << " chunk " << c;
      next = table[r][c].end();
    }
  }
  EXPECT_EQ(next, num_layers);
}

TEST(PipelineLayers, OneStageHoldsEverything) {
  const Table table = mt::parallel::pipeline_layer_table(stages(1), 12);
  EXPECT_EQ(table, (Table{{{0, 12}}}));
}

TEST(PipelineLayers, EvenStagesHoldContiguousRanges) {
  const Table table = mt::parallel::pipeline_layer_table(stages(4), 12);
  EXPECT_EQ(table, (Table{{{0, 3}}, {{3, 3}}, {{6, 3}}, {{9, 3}}}));
  expect_tiles_all_layers(table, 12);
}

TEST(PipelineLayers, VirtualChunksInterleaveAcrossStages) {
  // Megatron's comment in get_num_layers_to_build: 8 layers, 2 stages, 4 chunks of 1 layer:
  // stage 0 holds [0] [2] [4] [6], stage 1 holds [1] [3] [5] [7].
  ParallelConfig c = stages(2);
  c.num_layers_per_virtual_pipeline_stage = 1;
  Table table = mt::parallel::pipeline_layer_table(c, 8);
  EXPECT_EQ(table, (Table{{{0, 1}, {2, 1}, {4, 1}, {6, 1}}, {{1, 1}, {3, 1}, {5, 1}, {7, 1}}}));
  // ... and with 2 chunks of 2 layers: stage 0 [0, 1] [4, 5], stage 1 [2, 3] [6, 7].
  c.num_layers_per_virtual_pipeline_stage.reset();
  c.num_virtual_stages_per_pipeline_rank = 2;
  table = mt::parallel::pipeline_layer_table(c, 8);
  EXPECT_EQ(table, (Table{{{0, 2}, {4, 2}}, {{2, 2}, {6, 2}}}));
  expect_tiles_all_layers(table, 8);
}

TEST(PipelineLayers, UnevenFirstAndLastStages) {
  ParallelConfig c = stages(4);
  c.decoder_first_pipeline_num_layers = 1;
  c.decoder_last_pipeline_num_layers = 3;
  Table table = mt::parallel::pipeline_layer_table(c, 10);  // middle stages split 6 layers
  EXPECT_EQ(table, (Table{{{0, 1}}, {{1, 3}}, {{4, 3}}, {{7, 3}}}));
  expect_tiles_all_layers(table, 10);
  // Only the last stage given: the first is a middle stage.
  c.decoder_first_pipeline_num_layers.reset();
  c.decoder_last_pipeline_num_layers = 1;
  table = mt::parallel::pipeline_layer_table(c, 10);
  EXPECT_EQ(table, (Table{{{0, 3}}, {{3, 3}}, {{6, 3}}, {{9, 1}}}));
  // Only the first: the last is a middle stage.
  c.decoder_first_pipeline_num_layers = 4;
  c.decoder_last_pipeline_num_layers.reset();
  table = mt::parallel::pipeline_layer_table(c, 10);
  EXPECT_EQ(table, (Table{{{0, 4}}, {{4, 2}}, {{6, 2}}, {{8, 2}}}));
  // Two stages, both given: no middle.
  ParallelConfig two = stages(2);
  two.decoder_first_pipeline_num_layers = 3;
  two.decoder_last_pipeline_num_layers = 5;
  EXPECT_EQ(mt::parallel::pipeline_layer_table(two, 8), (Table{{{0, 3}}, {{3, 5}}}));
}

TEST(PipelineLayers, UnevenStagesWithVirtualChunks) {
  // 16 layers, 4 stages, 2 chunks; first and last stages 2 layers (1 per chunk), the middle
  // stages 6 (3 per chunk). Each chunk spans 8 layers over the stages: 1 + 3 + 3 + 1.
  ParallelConfig c = stages(4);
  c.decoder_first_pipeline_num_layers = 2;
  c.decoder_last_pipeline_num_layers = 2;
  c.num_virtual_stages_per_pipeline_rank = 2;
  const Table table = mt::parallel::pipeline_layer_table(c, 16);
  EXPECT_EQ(table, (Table{{{0, 1}, {8, 1}}, {{1, 3}, {9, 3}}, {{4, 3}, {12, 3}}, {{7, 1}, {15, 1}}}));
  expect_tiles_all_layers(table, 16);
}

TEST(PipelineLayers, OutOfRangeStageOrChunkIsAnError) {
  ParallelConfig c = stages(2);
  EXPECT_THROW(mt::parallel::pipeline_layers(c, 8, 2, 0), mt::Error);
  EXPECT_THROW(mt::parallel::pipeline_layers(c, 8, 0, 1), mt::Error);
}

}  // namespace
