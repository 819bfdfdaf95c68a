// ParallelConfig and validate(): DP derived from the world (EP never multiplied in), one test per
// rule with the error naming the flags that break it, the warnings for settings Megatron
// corrects or ignores, and the derived sizes (virtual stages, buckets, expert DP).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/parallel_config.h"

namespace {

using mt::parallel::BatchDimensions;
using mt::parallel::ModelDimensions;
using mt::parallel::ParallelConfig;

// A small model and batch every rule below breaks one field of.
struct Case {
  ParallelConfig parallel;
  ModelDimensions model{8, 8, 4, 256, 512, 64, 0};  // layers, heads, groups, ffn, vocab, seq, experts
  BatchDimensions batch{2, 16};
  int world = 8;

  Case() {
    parallel.tensor_model_parallel_size = 2;
    parallel.pipeline_model_parallel_size = 2;
  }
  std::vector<std::string> validate() { return mt::parallel::validate(parallel, model, batch, world); }
  // The UsageError message, or "accepted".
  std::string error() {
    try {
      validate();
    } catch (const mt::UsageError& e) {
      return e.what();
    }
    return "accepted";
  }
};

// Every name in `names` appears in `message`.
::testing::AssertionResult names_all(const std::string& message, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (message.find(name) == std::string::npos) {
      return ::testing::AssertionFailure() << "\"" << message << "\" does not name " << name;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(ParallelConfig, DataParallelComesFromTheWorldAndExpertsFoldIntoIt) {
  Case s;
  s.parallel.expert_model_parallel_size = 4;
  s.parallel.expert_tensor_parallel_size = 1;
  s.parallel.sequence_parallel = true;
  s.model.num_experts = 8;
  s.world = 16;
  EXPECT_TRUE(s.validate().empty());
  EXPECT_EQ(s.parallel.data_parallel_size, 4);
  EXPECT_EQ(s.parallel.world_size(), 16);  // TP x CP x DP x PP: EP is folded in, not multiplied
  EXPECT_EQ(s.parallel.expert_data_parallel_size(), 16 / (1 * 4 * 2));
  ParallelConfig defaults;
  EXPECT_EQ(defaults.expert_tensor_parallel(), 1);
  defaults.tensor_model_parallel_size = 4;
  EXPECT_EQ(defaults.expert_tensor_parallel(), 4);  // expert TP defaults to TP
}

TEST(ParallelConfig, WorldMustHoldWholeModelReplicas) {
  Case s;
  s.world = 6;
  EXPECT_TRUE(names_all(s.error(), {"world size 6", "--tensor-model-parallel-size 2", "--context-parallel-size 1",
                                    "--pipeline-model-parallel-size 2"}));
}

TEST(ParallelConfig, DegreesMustBePositive) {
  Case s;
  s.parallel.context_parallel_size = 0;
  EXPECT_EQ(s.error(), "--context-parallel-size 0: must be at least 1");
  Case t;
  t.parallel.num_virtual_stages_per_pipeline_rank = 0;
  EXPECT_EQ(t.error(), "--num-virtual-stages-per-pipeline-rank 0: must be at least 1");
  Case u;
  u.batch.micro_batch_size = 0;
  EXPECT_EQ(u.error(), "--micro-batch-size 0: must be at least 1");
}

TEST(ParallelConfig, HeadsSplitWholeAcrossTensorParallelRanks) {
  Case s;
  s.parallel.tensor_model_parallel_size = 4;
  s.parallel.pipeline_model_parallel_size = 1;
  s.model.num_attention_heads = 6;
  s.model.num_query_groups = 6;
  EXPECT_TRUE(names_all(s.error(), {"--num-attention-heads 6", "--tensor-model-parallel-size 4", "whole heads"}));
}

TEST(ParallelConfig, QueryGroupsSplitWholeAcrossTensorParallelRanks) {
  Case s;
  s.parallel.tensor_model_parallel_size = 4;
  s.parallel.pipeline_model_parallel_size = 1;
  s.model.num_query_groups = 2;  // 8 heads divide by 4, 2 key/value heads do not
  EXPECT_TRUE(names_all(s.error(), {"--num-query-groups 2", "--tensor-model-parallel-size 4"}));
}

TEST(ParallelConfig, FfnAndPaddedVocabularySplitAcrossTensorParallelRanks) {
  Case s;
  s.model.ffn_hidden_size = 255;
  EXPECT_TRUE(names_all(s.error(), {"--ffn-hidden-size 255", "--tensor-model-parallel-size 2"}));
  Case t;
  t.model.padded_vocab_size = 511;
  EXPECT_TRUE(names_all(t.error(), {"padded vocabulary size 511", "--tensor-model-parallel-size 2",
                                    "--make-vocab-size-divisible-by"}));
}

TEST(ParallelConfig, TheTensorParallelRuleStandsAloneForTheLayout) {
  // The rule validate() applies, exported for lib/model's layout: whole heads and query groups,
  // ffn columns and vocabulary rows per TP rank; nothing else of the config is read.
  const ModelDimensions model{8, 8, 4, 256, 512, 64, 0};
  EXPECT_NO_THROW(mt::parallel::check_tensor_parallel_split(4, model));
  try {
    mt::parallel::check_tensor_parallel_split(8, model);
    ADD_FAILURE() << "TP 8 over 4 query groups was accepted";
  } catch (const mt::UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--num-query-groups 4: not divisible by --tensor-model-parallel-size 8 (each tensor-parallel rank holds "
              "whole query groups (key/value heads))");
  }
  EXPECT_THROW(mt::parallel::check_tensor_parallel_split(0, model), mt::UsageError);
  ModelDimensions odd_vocab = model;
  odd_vocab.padded_vocab_size = 510;
  EXPECT_THROW(mt::parallel::check_tensor_parallel_split(4, odd_vocab), mt::UsageError);
}

TEST(ParallelConfig, LayersSplitEvenlyAcrossPipelineStages) {
  Case s;
  s.model.num_layers = 9;
  EXPECT_TRUE(names_all(s.error(), {"--num-layers 9", "--pipeline-model-parallel-size 2"}));
}

TEST(ParallelConfig, UnevenStagesLeaveWholeMiddleStages) {
  Case s;  // 9 layers, 4 stages: 2 first, 2 last, 5 for 2 middle stages
  s.parallel.pipeline_model_parallel_size = 4;
  s.parallel.tensor_model_parallel_size = 1;
  s.model.num_layers = 9;
  s.parallel.decoder_first_pipeline_num_layers = 2;
  s.parallel.decoder_last_pipeline_num_layers = 2;
  EXPECT_TRUE(names_all(s.error(), {"--num-layers 9", "--decoder-first-pipeline-num-layers 2",
                                    "--decoder-last-pipeline-num-layers 2", "5 layers left",
                                    "the 2 stages between the first and the last"}));
  s.model.num_layers = 10;
  EXPECT_EQ(s.error(), "accepted");
  Case t;  // 2 stages, both given: the layers must add up
  t.parallel.decoder_first_pipeline_num_layers = 3;
  t.parallel.decoder_last_pipeline_num_layers = 3;
  EXPECT_TRUE(names_all(t.error(), {"--decoder-first-pipeline-num-layers 3", "--decoder-last-pipeline-num-layers 3",
                                    "leaves 2 layers for no stage between the first and the last"}));
  // Probe case U12: PP 2 has no middle stage; the last stage is the one left without layers.
  Case v;
  v.model.num_layers = 2;
  v.parallel.decoder_first_pipeline_num_layers = 2;
  EXPECT_TRUE(names_all(v.error(), {"--decoder-first-pipeline-num-layers 2",
                                    "leaves 0 layers for 1 stage after the first (every stage needs at least one layer)"}))
      << v.error();
  Case u;
  u.parallel.pipeline_model_parallel_size = 1;
  u.world = 2;
  u.parallel.decoder_last_pipeline_num_layers = 2;
  EXPECT_EQ(u.error(), "--decoder-last-pipeline-num-layers 2: needs --pipeline-model-parallel-size > 1");
}

TEST(ParallelConfig, VirtualStagesAreGivenOneWay) {
  Case s;
  s.parallel.num_layers_per_virtual_pipeline_stage = 2;
  s.parallel.num_virtual_stages_per_pipeline_rank = 2;
  EXPECT_TRUE(names_all(s.error(), {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                                    "at most one"}));
  Case t;  // uneven first/last stages take only --num-virtual-stages-per-pipeline-rank
  t.parallel.pipeline_model_parallel_size = 4;
  t.parallel.tensor_model_parallel_size = 1;
  t.model.num_layers = 10;
  t.parallel.decoder_first_pipeline_num_layers = 2;
  t.parallel.decoder_last_pipeline_num_layers = 2;
  t.parallel.num_layers_per_virtual_pipeline_stage = 1;
  EXPECT_TRUE(names_all(t.error(), {"--num-layers-per-virtual-pipeline-stage 1", "--num-virtual-stages-per-pipeline-rank"}));
}

TEST(ParallelConfig, VirtualStagesDivideEachStagesLayers) {
  Case s;  // 8 layers on 2 stages: 4 per stage
  s.parallel.num_layers_per_virtual_pipeline_stage = 3;
  EXPECT_TRUE(names_all(s.error(), {"--num-layers 8", "4 layers per stage", "--num-layers-per-virtual-pipeline-stage 3"}));
  Case t;
  t.parallel.num_virtual_stages_per_pipeline_rank = 3;
  EXPECT_TRUE(names_all(t.error(), {"4 layers per stage", "--num-virtual-stages-per-pipeline-rank 3"}));
  Case u;  // uneven: first, last and each middle stage divide by the virtual stages
  u.parallel.pipeline_model_parallel_size = 4;
  u.parallel.tensor_model_parallel_size = 1;
  u.model.num_layers = 16;
  u.parallel.decoder_first_pipeline_num_layers = 3;
  u.parallel.decoder_last_pipeline_num_layers = 1;
  u.parallel.num_virtual_stages_per_pipeline_rank = 2;
  u.batch = {1, 16};
  EXPECT_TRUE(names_all(u.error(), {"--decoder-first-pipeline-num-layers 3", "--num-virtual-stages-per-pipeline-rank 2"}));
  u.parallel.decoder_first_pipeline_num_layers = 2;
  u.model.num_layers = 15;  // 12 middle layers, 6 per middle stage; the last stage's 1 does not split
  EXPECT_TRUE(names_all(u.error(), {"--decoder-last-pipeline-num-layers 1", "--num-virtual-stages-per-pipeline-rank 2"}));
  u.model.num_layers = 16;
  u.parallel.decoder_last_pipeline_num_layers = 4;  // 10 middle layers: 5 per middle stage
  EXPECT_TRUE(names_all(u.error(), {"5 layers per middle stage", "--num-virtual-stages-per-pipeline-rank 2"}));
  u.parallel.decoder_last_pipeline_num_layers = 2;
  EXPECT_EQ(u.error(), "accepted");
}

TEST(ParallelConfig, VirtualStagesNeedAPipeline) {
  Case s;
  s.parallel.pipeline_model_parallel_size = 1;
  s.world = 2;
  s.parallel.num_layers_per_virtual_pipeline_stage = 2;  // 8 layers -> 4 chunks on one stage
  EXPECT_TRUE(names_all(s.error(), {"4 virtual pipeline stages", "--pipeline-model-parallel-size > 1"}));
}

TEST(ParallelConfig, GlobalBatchIsMicroBatchTimesDataParallelTimesMicroBatches) {
  Case s;  // DP 2, micro-batch 2: the global batch must be a multiple of 4
  s.batch.global_batch_size = 10;
  EXPECT_TRUE(names_all(s.error(), {"--global-batch-size 10", "--micro-batch-size 2", "data-parallel size 2"}));
}

TEST(ParallelConfig, InterleavedScheduleGroupsMicroBatches) {
  Case s;  // PP 2, DP 2, 2 virtual stages; micro-batch 1
  s.parallel.num_virtual_stages_per_pipeline_rank = 2;
  s.batch = {1, 10};  // 5 micro-batches per step
  s.parallel.microbatch_group_size_per_virtual_pipeline_stage = 3;  // Megatron's example: m=5, G=3
  EXPECT_EQ(s.error(), "accepted");
  s.parallel.microbatch_group_size_per_virtual_pipeline_stage = 4;  // 5 mod 4 = 1 < PP
  EXPECT_TRUE(names_all(s.error(), {"--microbatch-group-size-per-virtual-pipeline-stage 4", "5 micro-batches",
                                    "last group of 1", "--pipeline-model-parallel-size 2"}));
  s.parallel.microbatch_group_size_per_virtual_pipeline_stage = 6;  // more than m
  EXPECT_TRUE(names_all(s.error(), {"--microbatch-group-size-per-virtual-pipeline-stage 6", "5 micro-batches", "must lie in"}));
  s.parallel.microbatch_group_size_per_virtual_pipeline_stage = 1;  // fewer than PP
  EXPECT_TRUE(names_all(s.error(), {"--microbatch-group-size-per-virtual-pipeline-stage 1", "--pipeline-model-parallel-size 2"}));
  s.parallel.microbatch_group_size_per_virtual_pipeline_stage.reset();  // default G = PP = 2: 5 mod 2 = 1 < 2
  EXPECT_TRUE(names_all(s.error(), {"--microbatch-group-size-per-virtual-pipeline-stage 2 (default: PP)", "last group of 1"}));
  s.batch = {1, 2};  // one micro-batch: fewer than PP
  EXPECT_TRUE(names_all(s.error(), {"(default: PP)", "1 micro-batches per step", "must lie in"}));
}

TEST(ParallelConfig, ContextParallelNeedsTwoChunksPerRank) {
  Case s;
  s.parallel.context_parallel_size = 2;
  s.parallel.pipeline_model_parallel_size = 1;
  s.model.seq_length = 66;  // not divisible by 2 x 2
  EXPECT_TRUE(names_all(s.error(), {"--seq-length 66", "2 x --context-parallel-size 2"}));
  s.model.seq_length = 68;
  EXPECT_EQ(s.error(), "accepted");
}

TEST(ParallelConfig, SequenceParallelSplitsEachContextRanksTokens) {
  Case s;  // CP 2 x TP 4: 68 tokens -> 34 per CP rank, not divisible by 4
  s.parallel.context_parallel_size = 2;
  s.parallel.tensor_model_parallel_size = 4;
  s.parallel.pipeline_model_parallel_size = 1;
  s.parallel.sequence_parallel = true;
  s.model.seq_length = 68;
  EXPECT_TRUE(names_all(s.error(), {"--seq-length 68 with --sequence-parallel", "--tensor-model-parallel-size 4", "34 tokens"}));
  s.model.seq_length = 72;
  EXPECT_EQ(s.error(), "accepted");
  EXPECT_TRUE(s.parallel.sequence_parallel);
}

TEST(ParallelConfig, SequenceParallelAtTensorParallelOneIsAWarningAndOff) {
  Case s;
  s.parallel.tensor_model_parallel_size = 1;
  s.parallel.sequence_parallel = true;
  s.model.seq_length = 63;  // would not split, but SP is off
  const auto warnings = s.validate();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "--sequence-parallel: disabled because --tensor-model-parallel-size is 1");
  EXPECT_FALSE(s.parallel.sequence_parallel);
}

TEST(ParallelConfig, ExpertsFoldIntoOnePipelineStagesRanks) {
  Case s;  // TP 2 x DP 2 = 4 ranks per stage
  s.model.num_experts = 8;
  s.parallel.expert_model_parallel_size = 4;  // x expert TP 2 (the default: TP) = 8
  EXPECT_TRUE(names_all(s.error(), {"--expert-model-parallel-size 4", "expert tensor-parallel size 2", "TP x CP x DP = 4"}));
  s.parallel.expert_tensor_parallel_size = 1;
  EXPECT_EQ(s.error(), "accepted");
  EXPECT_EQ(s.validate(), (std::vector<std::string>{"--expert-model-parallel-size 4 with --tensor-model-parallel-size 2: "
                                                    "Megatron expects --sequence-parallel"}));
  s.parallel.sequence_parallel = true;
  EXPECT_TRUE(s.validate().empty());
  s.model.num_experts = 6;
  EXPECT_TRUE(names_all(s.error(), {"--num-experts 6", "--expert-model-parallel-size 4"}));
  s.model.num_experts = 0;
  EXPECT_EQ(s.error(), "--expert-model-parallel-size 4: needs --num-experts");
}

TEST(ParallelConfig, OverlappedParamGatherNeedsTheDistributedOptimizerAndGradOverlap) {
  Case s;
  s.parallel.overlap_param_gather = true;
  s.parallel.overlap_grad_reduce = true;
  EXPECT_EQ(s.error(), "--overlap-param-gather: needs --use-distributed-optimizer");
  s.parallel.use_distributed_optimizer = true;
  s.parallel.overlap_grad_reduce = false;
  EXPECT_EQ(s.error(), "--overlap-param-gather: needs --overlap-grad-reduce");
  s.parallel.overlap_grad_reduce = true;
  EXPECT_EQ(s.error(), "accepted");
}

TEST(ParallelConfig, SettingsWithoutEffectAreWarnings) {
  Case s;
  s.parallel.ddp_bucket_size = 1000;
  s.parallel.microbatch_group_size_per_virtual_pipeline_stage = 2;
  const auto warnings = s.validate();
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_TRUE(names_all(warnings[0], {"--microbatch-group-size-per-virtual-pipeline-stage 2", "without virtual pipeline"}));
  EXPECT_TRUE(names_all(warnings[1], {"--ddp-bucket-size 1000", "without --overlap-grad-reduce"}));
}

TEST(ParallelConfig, BucketSizesFollowMegatronsDefaults) {
  ParallelConfig c;
  c.data_parallel_size = 64;
  EXPECT_EQ(c.bucket_size_elements(), 0);  // no overlap: one bucket
  c.overlap_grad_reduce = true;
  EXPECT_EQ(c.bucket_size_elements(), 64'000'000);  // max(40M, 1M x DP)
  c.data_parallel_size = 8;
  EXPECT_EQ(c.bucket_size_elements(), 40'000'000);
  c.ddp_bucket_size = 1234;
  EXPECT_EQ(c.bucket_size_elements(), 1234);
}

TEST(ParallelConfig, VirtualPipelineSizeFromEitherFlag) {
  ParallelConfig c;
  c.pipeline_model_parallel_size = 2;
  EXPECT_EQ(c.virtual_pipeline_size(8), 1);
  c.num_layers_per_virtual_pipeline_stage = 1;
  EXPECT_EQ(c.virtual_pipeline_size(8), 4);
  c.num_layers_per_virtual_pipeline_stage.reset();
  c.num_virtual_stages_per_pipeline_rank = 2;
  EXPECT_EQ(c.virtual_pipeline_size(8), 2);
  EXPECT_EQ(c.microbatch_group_size(), 2);  // defaults to PP
}

}  // namespace

// JSON: a round trip keeps every field, None (std::nullopt) as null; bad values are usage errors
// naming the key.
TEST(ParallelConfigJson, RoundTripKeepsEveryField) {
  ParallelConfig c;
  c.tensor_model_parallel_size = 4;
  c.pipeline_model_parallel_size = 2;
  c.data_parallel_size = 3;
  c.context_parallel_size = 2;
  c.expert_model_parallel_size = 8;
  c.expert_tensor_parallel_size = 1;
  c.sequence_parallel = true;
  c.num_virtual_stages_per_pipeline_rank = 2;
  c.decoder_last_pipeline_num_layers = 3;
  c.use_distributed_optimizer = true;
  c.overlap_grad_reduce = true;
  c.ddp_bucket_size = int64_t{50'000'000};
  const nlohmann::ordered_json json = mt::parallel::to_json(c);
  EXPECT_EQ(mt::parallel::to_json(mt::parallel::parallel_config_from_json(json)), json);
  EXPECT_EQ(json["pipeline_model_parallel_size"], 2);
  EXPECT_TRUE(json["num_layers_per_virtual_pipeline_stage"].is_null());
  EXPECT_EQ(json["ddp_bucket_size"], 50000000);
  const ParallelConfig back = mt::parallel::parallel_config_from_json(json);
  EXPECT_EQ(back.expert_tensor_parallel_size, 1);
  EXPECT_FALSE(back.num_layers_per_virtual_pipeline_stage.has_value());
}

TEST(ParallelConfigJson, RefusesBadDegreesWrongTypesAndUnknownKeys) {
  EXPECT_THROW(mt::parallel::parallel_config_from_json({{"tensor_model_parallel_size", 0}}), mt::UsageError);
  EXPECT_THROW(mt::parallel::parallel_config_from_json({{"decoder_first_pipeline_num_layers", 0}}), mt::UsageError);
  EXPECT_THROW(mt::parallel::parallel_config_from_json({{"tensor_model_parallel_size", "2"}}), mt::UsageError);
  EXPECT_THROW(mt::parallel::parallel_config_from_json({{"tensor_parallel", 2}}), mt::UsageError);
  EXPECT_EQ(mt::parallel::parallel_config_from_json(nlohmann::json::object()).data_parallel_size, 1);
}
