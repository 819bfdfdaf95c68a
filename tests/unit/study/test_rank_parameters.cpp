// What one rank holds (lib/study/rank_parameters.h): rank by rank equal to the layout table
// mt-train allocates from, under every pipeline placement mt-train runs; experts over EP; and
// Megatron's vocabulary padding.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "model/layout.h"
#include "study/rank_parameters.h"

using namespace mt::study;
using mt::model::preset;

TEST(RankParameters, MegatronPadsTheVocabularyByTensorParallelSize) {
  const auto c = preset("gpt2-124m");  // 50257
  EXPECT_EQ(megatron_padded_vocab(c, 1), 50304);
  EXPECT_EQ(megatron_padded_vocab(c, 8), 51200);  // a multiple of 128 x 8
}

TEST(RankParameters, EveryRankMatchesItsLayoutTable) {
  // Every rank of every layout mt-train runs, its chunks placed by parallel::pipeline_layers:
  // even stages, virtual stages, uneven first/last stages and both together.
  struct Pipeline {
    int stages, virtual_stages, first, last;  // first/last 0: even
  };
  const Pipeline pipelines[] = {{1, 1, 0, 0}, {2, 1, 0, 0}, {4, 1, 0, 0}, {2, 2, 0, 0},
                                {4, 2, 0, 0}, {3, 1, 2, 2}, {3, 2, 2, 2}, {3, 2, 4, 0}};
  for (const char* name : {"tiny-gpt", "tiny-llama", "gpt2-124m", "tiny-bert"}) {
    auto c = preset(name);
    c.num_layers = 8;
    for (int tp : {1, 2, 4}) {
      mt::parallel::ParallelConfig parallel;
      parallel.tensor_model_parallel_size = tp;
      if (c.query_groups() % tp != 0) {
        // TP would cut a key/value head in two (tiny-llama has 2 query groups): no layout exists.
        EXPECT_THROW(mt::model::build_layout(c, parallel, {}, 0, c.num_layers), mt::UsageError) << name;
        continue;
      }
      for (const Pipeline& pipeline : pipelines) {
        parallel.pipeline_model_parallel_size = pipeline.stages;
        parallel.num_virtual_stages_per_pipeline_rank.reset();
        if (pipeline.virtual_stages > 1) parallel.num_virtual_stages_per_pipeline_rank = pipeline.virtual_stages;
        parallel.decoder_first_pipeline_num_layers.reset();
        parallel.decoder_last_pipeline_num_layers.reset();
        if (pipeline.first > 0) parallel.decoder_first_pipeline_num_layers = pipeline.first;
        if (pipeline.last > 0) parallel.decoder_last_pipeline_num_layers = pipeline.last;
        for (int stage = 0; stage < pipeline.stages; ++stage) {
          mt::parallel::RankCoordinates rank;
          rank.pp = stage;
          rank.tp = tp - 1;
          const auto layout = mt::model::build_layout(c, parallel, rank, mt::model::pipeline_chunks(c, parallel, stage));
          EXPECT_EQ(rank_parameter_count(c, c.padded_vocab_size(), parallel, stage), layout.parameter_elements())
              << name << " tp " << tp << " pp " << pipeline.stages << " vp " << pipeline.virtual_stages << " first "
              << pipeline.first << " last " << pipeline.last << " stage " << stage;
        }
      }
    }
  }
}

TEST(RankParameters, ExpertsSpreadOverExpertParallelRanks) {
  // Mixtral 8x7B at TP1 PP4 EP8 (Megatron's recommended layout): stage 0 holds 8 layers, each with
  // its attention, two norms, the router and 1 of the 8 experts, and the word embedding.
  const auto c = preset("mixtral-8x7b");
  mt::parallel::ParallelConfig parallel;
  parallel.pipeline_model_parallel_size = 4;
  parallel.expert_model_parallel_size = 8;
  const int64_t h = 4096;
  const int64_t per_layer = (h * 6144 + 4096 * h) + 2 * h + h * 8 + 3 * h * 14336;
  EXPECT_EQ(rank_parameter_count(c, 32000, parallel, 0), 8 * per_layer + 32000 * h);
  EXPECT_EQ(rank_parameter_count(c, 32000, parallel, 3), 8 * per_layer + 32000 * h + h);  // output layer, final norm
  parallel.expert_model_parallel_size = 3;
  EXPECT_THROW(rank_parameter_count(c, 32000, parallel, 0), mt::UsageError);
}
