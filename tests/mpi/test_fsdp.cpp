// Megatron-FSDP (issue 25) in training against the single-rank run (tests/mpi/training_equivalence.h:
// the same tiny models, seed, data and schedule as tests/mpi/test_data_parallel.cpp, 10 steps,
// loss, grad norm and evaluation loss within the fp32 equivalence bound): --use-megatron-fsdp with
// --data-parallel-sharding-strategy optim_grads at DP=2 (2 ranks; tiny GPT, whose tied embedding's
// grads complete only after the embedding's backward, and tiny LLaMA, untied), DP=4 (tiny GPT) and
// TP=2 SP x DP=2 (tiny LLaMA) at 4 ranks, EOD-masked loss and hidden dropout 0.1, micro-batches
// accumulated (2 per DP rank at DP=2). Also: the unit grad reductions run on every micro-batch
// (Megatron-FSDP's grad_reduce_every_bprop), one per unit each; the strategies the flags choose;
// and the refusals by name (optim_grads_params, PP and MoE with grad sharding, hybrid sharding).
// Run under mpirun at 2 and 4 ranks (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/sample_source.h"
#include "optim/distributed_optimizer.h"
#include "parallel/process_groups.h"
#include "parallel/rank_grid.h"
#include "train/trainer.h"
#include "../unit/tiny_models.h"
#include "training_equivalence.h"

using namespace mt;

namespace {

const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new equivalence::WorldEnvironment);

struct FsdpLayout {
  std::string name;
  int tp = 1;
  bool sequence_parallel = false;
  std::string strategy = "optim_grads";
  std::vector<bool> llama_models{false, true};  // tiny GPT (tied embedding) and tiny LLaMA
};

parallel::ParallelConfig fsdp_config(const FsdpLayout& layout, const model::ModelConfig& model,
                                     const train::TrainConfig& config) {
  parallel::ParallelConfig parallel;
  parallel.tensor_model_parallel_size = layout.tp;
  parallel.sequence_parallel = layout.sequence_parallel;
  parallel.use_megatron_fsdp = true;
  parallel.data_parallel_sharding_strategy = layout.strategy;
  parallel::ModelDimensions dimensions{model.num_layers, model.num_attention_heads, model.query_groups(),
                                       model.ffn_hidden_size, model.padded_vocab_size(), model.seq_length, 0};
  parallel::validate(parallel, dimensions, {config.micro_batch_size, config.global_batch_size},
                     equivalence::world().size());
  return parallel;
}

// Mock data with documents (token 0 ends one) and Megatron's EOD-masked loss.
data::LoaderOptions eod_masked() {
  data::LoaderOptions options;
  options.eod_mask_loss = true;
  return options;
}

std::vector<FsdpLayout> layouts_for_world(int world) {
  if (world == 2) return {{"FSDP=2 optim_grads"}};
  // At 4 ranks one model each (CI time): GPT's tied embedding at FSDP=4, LLaMA under TP=2 + SP.
  if (world == 4) {
    return {{"FSDP=4 optim_grads", 1, false, "optim_grads", {false}},
            {"TP=2 SP x FSDP=2 optim_grads", 2, true, "optim_grads", {true}}};
  }
  return {};
}

}  // namespace

TEST(MegatronFsdp, OptimGradsMatchesOneRankInFp32) {
  ASSERT_FALSE(layouts_for_world(equivalence::world().size()).empty()) << "no FSDP layouts at this world size";
  for (const FsdpLayout& layout : layouts_for_world(equivalence::world().size())) {
    for (bool llama : layout.llama_models) {
      SCOPED_TRACE(layout.name + (llama ? ", tiny-llama" : ", tiny-gpt"));
      model::ModelConfig model = mt::testing::trainer_model(llama, 0.1f);
      const train::TrainConfig config = equivalence::ten_step_config();
      const equivalence::DocumentMockData data(model.vocab_size, model.seq_length, 7, eod_masked());
      const parallel::ParallelConfig parallel = fsdp_config(layout, model, config);
      const parallel::ProcessGroups groups(equivalence::world(), parallel::RankGrid(parallel), backend::cpu_ops(),
                                           backend::cpu_ops().default_stream());
      const equivalence::RunNumbers reference = equivalence::one_rank_numbers(model, config, data);
      const equivalence::RunNumbers run = equivalence::train_numbers(model, config, data, &groups);
      equivalence::expect_same_numbers(run, reference, config);
      EXPECT_EQ(run.eval_loss.size(), 2u);
    }
  }
}

// Megatron-FSDP reduce-scatters a grad-sharding strategy's grads after every micro-batch's
// backward: per step, every bucket (one per unit) once per micro-batch of this rank.
TEST(MegatronFsdp, OptimGradsReducesEveryUnitOncePerMicroBatch) {
  const FsdpLayout layout = layouts_for_world(equivalence::world().size()).front();
  const model::ModelConfig model = mt::testing::trainer_model(false);
  const train::TrainConfig config = equivalence::ten_step_config();
  const auto data = data::make_mock_data(model.vocab_size, model.seq_length, 77);
  const parallel::ParallelConfig parallel = fsdp_config(layout, model, config);
  const parallel::ProcessGroups groups(equivalence::world(), parallel::RankGrid(parallel), backend::cpu_ops(),
                                       backend::cpu_ops().default_stream());
  train::Trainer trainer(model, config, *data, backend::cpu_ops(), &groups);
  ASSERT_EQ(trainer.optimizer().sharding(), optim::ShardingStrategy::optim_grads);
  trainer.train_step();
  const int micro_batches = config.global_batch_size / (config.micro_batch_size * parallel.data_parallel_size);
  // Units: the embedding, each layer, the head: one bucket per layer id.
  const int units = model.num_layers + 2;
  EXPECT_EQ(trainer.layout().buckets.size(), static_cast<size_t>(units));
  EXPECT_EQ(trainer.optimizer().unit_grad_reductions(), int64_t{units} * micro_batches);
}

TEST(MegatronFsdp, FlagsChooseTheStrategyAndRefuseWhatIsNotBuilt) {
  const model::ModelConfig model = mt::testing::trainer_model(false);
  const parallel::ModelDimensions dimensions{model.num_layers, model.num_attention_heads, model.query_groups(),
                                             model.ffn_hidden_size, model.padded_vocab_size(), model.seq_length, 0};
  const int world = equivalence::world().size();
  auto validated = [&](parallel::ParallelConfig parallel, const parallel::ModelDimensions& dims) {
    std::vector<std::string> warnings = parallel::validate(parallel, dims, {2, 8}, world);
    return std::make_pair(parallel, warnings);
  };
  parallel::ParallelConfig alias;
  alias.use_custom_fsdp = true;
  const auto [folded, warnings] = validated(alias, dimensions);
  EXPECT_TRUE(folded.use_megatron_fsdp);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("--use-custom-fsdp is deprecated"), std::string::npos) << warnings[0];
  EXPECT_EQ(optim::DistributedOptimizer::sharding_strategy(folded), optim::ShardingStrategy::optim_grads_params);
  for (const char* name : {"no_shard", "optim", "optim_grads"}) {
    parallel::ParallelConfig c;
    c.use_megatron_fsdp = true;
    c.data_parallel_sharding_strategy = name;
    EXPECT_STREQ(optim::sharding_strategy_name(optim::DistributedOptimizer::sharding_strategy(c)), name);
  }
  auto refusal = [&](parallel::ParallelConfig c, const parallel::ModelDimensions& dims) -> std::string {
    try {
      validated(c, dims);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  parallel::ParallelConfig hybrid;
  hybrid.use_megatron_fsdp = true;
  hybrid.num_distributed_optimizer_instances = 2;
  EXPECT_NE(refusal(hybrid, dimensions).find("--num-distributed-optimizer-instances 2"), std::string::npos);
  parallel::ParallelConfig outer;
  outer.use_megatron_fsdp = true;
  outer.outer_dp_sharding_strategy = "optim";
  EXPECT_NE(refusal(outer, dimensions).find("--outer-dp-sharding-strategy optim"), std::string::npos);
  parallel::ParallelConfig pipelined;
  pipelined.use_megatron_fsdp = true;
  pipelined.data_parallel_sharding_strategy = "optim_grads";
  pipelined.pipeline_model_parallel_size = 2;
  EXPECT_NE(refusal(pipelined, dimensions).find("--pipeline-model-parallel-size 2"), std::string::npos);
  parallel::ModelDimensions experts = dimensions;
  experts.num_experts = 4;
  parallel::ParallelConfig moe;
  moe.use_megatron_fsdp = true;
  moe.data_parallel_sharding_strategy = "optim_grads";
  EXPECT_NE(refusal(moe, experts).find("--num-experts 4"), std::string::npos);
  parallel::ParallelConfig bad;
  bad.use_megatron_fsdp = true;
  bad.data_parallel_sharding_strategy = "zero3";
  EXPECT_NE(refusal(bad, dimensions).find("--data-parallel-sharding-strategy zero3"), std::string::npos);
}
