// The one list of what mt-train does not run yet (lib/train/supported.h): everything the engine
// runs is accepted, every entry is refused by its flag and value with "not supported yet", and
// the Trainer refuses through the list before it builds anything.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/sample_source.h"
#include "model/config.h"
#include "train/supported.h"
#include "train/trainer.h"
#include "../tiny_models.h"

using mt::model::ModelConfig;
using mt::parallel::ParallelConfig;
using mt::train::check_supported;

namespace {

// The message check_supported refuses with, or "" when it accepts.
std::string refusal(const ModelConfig& model, const ParallelConfig& parallel) {
  try {
    check_supported(model, parallel);
  } catch (const mt::UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Supported, EverythingTheEngineRunsIsAccepted) {
  std::vector<ParallelConfig> layouts(7);
  layouts[1].tensor_model_parallel_size = 2;
  layouts[1].sequence_parallel = true;
  layouts[2].context_parallel_size = 2;
  layouts[3].use_distributed_optimizer = true;
  layouts[3].overlap_grad_reduce = true;
  layouts[3].ddp_bucket_size = 1000;
  layouts[4].pipeline_model_parallel_size = 4;
  layouts[4].num_virtual_stages_per_pipeline_rank = 2;
  layouts[4].decoder_first_pipeline_num_layers = 2;
  layouts[4].decoder_last_pipeline_num_layers = 2;
  layouts[5].pipeline_model_parallel_size = 2;
  layouts[5].num_layers_per_virtual_pipeline_stage = 1;
  layouts[6].expert_tensor_parallel_size = 1;  // Megatron's spelling of the default
  for (const char* preset : {"tiny-gpt", "tiny-llama", "gpt2-124m", "llama3-8b"}) {
    for (const ParallelConfig& parallel : layouts) {
      EXPECT_EQ(refusal(mt::model::preset(preset), parallel), "") << preset;
    }
  }
}

TEST(Supported, EachEntryIsRefusedByItsFlagAndValue) {
  const ModelConfig dense = mt::model::preset("tiny-llama");
  std::vector<std::pair<ParallelConfig, std::string>> parallel_cases(2);
  parallel_cases[0].first.expert_model_parallel_size = 8;
  parallel_cases[0].second =
      "--expert-model-parallel-size 8: not supported yet (mt-train runs 1: MoE expert parallelism is not built yet)";
  parallel_cases[1].first.expert_tensor_parallel_size = 2;
  parallel_cases[1].second =
      "--expert-tensor-parallel-size 2: not supported yet (mt-train runs 1: MoE expert parallelism is not built yet)";
  for (const auto& [parallel, expected] : parallel_cases) EXPECT_EQ(refusal(dense, parallel), expected);

  const ParallelConfig one_rank;
  EXPECT_EQ(refusal(mt::model::preset("mixtral-8x7b"), one_rank),
            "--num-experts 8: not supported yet (mt-train builds dense MLPs only; mt-mfu and mt-memreport account "
            "for it)");
  ModelConfig latent = dense;
  latent.multi_latent_attention = true;
  EXPECT_EQ(refusal(latent, one_rank),
            "--multi-latent-attention: not supported yet (mt-train builds grouped-query attention only; mt-mfu and "
            "mt-memreport account for it)");
  ModelConfig mtp = dense;
  mtp.mtp_num_layers = 1;
  EXPECT_EQ(refusal(mtp, one_rank),
            "--mtp-num-layers 1: not supported yet (mt-train has no multi-token prediction; mt-mfu and mt-memreport "
            "account for it)");
  // DeepSeek-V3 asks for all three model features: the list names the first.
  EXPECT_EQ(refusal(mt::model::preset("deepseek-v3"), one_rank).rfind("--num-experts 256: not supported yet", 0), 0u);
}

TEST(Supported, TheTrainerRefusesThroughTheList) {
  ModelConfig mtp = mt::testing::tiny_llama();
  mtp.mtp_num_layers = 1;
  const auto data = mt::data::make_mock_data(mtp.vocab_size, mtp.seq_length, 1);
  mt::train::TrainConfig train;
  train.train_iters = 1;
  try {
    const mt::train::Trainer trainer(mtp, train, *data, mt::backend::cpu_ops());
    FAIL() << "a model with multi-token prediction was built";
  } catch (const mt::UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--mtp-num-layers 1: not supported yet", 0), 0u) << e.what();
  }
}
