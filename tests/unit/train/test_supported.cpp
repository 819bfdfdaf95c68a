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
  for (const char* preset : {"tiny-gpt", "tiny-llama", "gpt2-124m", "llama3-8b", "mixtral-8x7b"}) {
    for (const ParallelConfig& parallel : layouts) {
      EXPECT_EQ(refusal(mt::model::preset(preset), parallel), "") << preset;
    }
  }
}

TEST(Supported, EachEntryIsRefusedByItsFlagAndValue) {
  const ModelConfig dense = mt::model::preset("tiny-llama");
  const ParallelConfig one_rank;
  // Mixture of experts runs on the CPU and on cuda, with expert parallelism.
  const ModelConfig mixtral = mt::model::preset("mixtral-8x7b");
  EXPECT_EQ(refusal(mixtral, one_rank), "");
  ParallelConfig experts;
  experts.expert_model_parallel_size = 8;
  experts.expert_tensor_parallel_size = 2;
  EXPECT_EQ(refusal(mixtral, experts), "");
  EXPECT_EQ(refusal(dense, experts), "");  // parallel::validate's to refuse (EP needs experts)
  EXPECT_NO_THROW(check_supported(mixtral, experts, mt::backend::Device::cuda));
  EXPECT_NO_THROW(check_supported(dense, one_rank, mt::backend::Device::cuda));
  // Values a preset or a JSON config may hold that the flags refuse while parsing.
  ModelConfig fp64 = mixtral;
  fp64.moe_router_dtype = mt::model::MoeRouterDtype::fp64;
  EXPECT_EQ(refusal(fp64, one_rank), "--moe-router-dtype fp64: not supported yet (mt-train routes in fp32)");
  ModelConfig flex = mixtral;
  flex.moe_token_dispatcher_type = mt::model::MoeDispatcher::flex;
  EXPECT_EQ(refusal(flex, one_rank),
            "--moe-token-dispatcher-type flex: not supported yet (mt-train runs the all-to-all dispatcher)");
  ModelConfig sinkhorn = mixtral;
  sinkhorn.moe_router_load_balancing_type = mt::model::MoeLoadBalancing::sinkhorn;
  EXPECT_EQ(refusal(sinkhorn, one_rank),
            "--moe-router-load-balancing-type sinkhorn: not supported yet (mt-train runs aux_loss, seq_aux_loss, "
            "global_aux_loss or none)");
  // global_aux_loss runs (issue 22), on both backends.
  ModelConfig global = mixtral;
  global.moe_router_load_balancing_type = mt::model::MoeLoadBalancing::global_aux_loss;
  EXPECT_EQ(refusal(global, one_rank), "");
  EXPECT_NO_THROW(check_supported(global, experts, mt::backend::Device::cuda));
  // YaRN (MLA's --rope-type yarn) runs on the CPU and on CUDA (kernels/cuda/elementwise.cu).
  ModelConfig yarn = mt::model::preset("tiny-deepseek");
  yarn.rope_type = mt::model::RopeType::yarn;
  EXPECT_EQ(refusal(yarn, one_rank), "");
  EXPECT_NO_THROW(check_supported(yarn, one_rank, mt::backend::Device::cuda));
  // Multi-latent attention runs, under context parallelism too (issue 22: ring attention over its
  // zero-padded heads).
  ModelConfig latent = dense;
  latent.multi_latent_attention = true;
  EXPECT_EQ(refusal(latent, one_rank), "");
  ParallelConfig context = one_rank;
  context.context_parallel_size = 2;
  EXPECT_EQ(refusal(latent, context), "");
  // Multi-token prediction runs (DeepSeek-V3 asks for it), under pipeline parallelism too (the
  // depths on the last stage) but not with a learned position table there, and under context
  // parallelism (the rolls cross the CP ranks), not on CUDA.
  ModelConfig mtp = dense;
  mtp.mtp_num_layers = 1;
  EXPECT_EQ(refusal(mtp, one_rank), "");
  EXPECT_EQ(refusal(mt::model::preset("deepseek-v3"), one_rank), "");
  EXPECT_EQ(refusal(mtp, context), "");
  ParallelConfig pipeline = one_rank;
  pipeline.pipeline_model_parallel_size = 2;
  EXPECT_EQ(refusal(mtp, pipeline), "");
  ModelConfig positions = mt::model::preset("tiny-gpt");
  positions.mtp_num_layers = 1;
  EXPECT_EQ(refusal(positions, one_rank), "");
  EXPECT_EQ(refusal(positions, pipeline)
                .rfind("--mtp-num-layers with --pipeline-model-parallel-size 2 and --position-embedding-type "
                       "learned_absolute: not supported yet",
                       0),
            0u);
  // On CUDA too (tests/gpu/test_cuda_training.cpp's CudaMtpTraining holds it to the CPU table).
  EXPECT_NO_THROW(check_supported(mtp, one_rank, mt::backend::Device::cuda));
  // BERT: on CUDA and under CP by name; on the CPU under TP (with and without SP), DP and PP.
  const ModelConfig bert = mt::model::preset("tiny-bert");
  const auto refusal_on = [&](const ParallelConfig& parallel, mt::backend::Device device) -> std::string {
    try {
      check_supported(bert, parallel, device);
    } catch (const mt::UsageError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refusal_on(one_rank, mt::backend::Device::cuda).rfind("--device cuda with BERT (--model tiny-bert)", 0), 0u);
  EXPECT_EQ(refusal_on(context, mt::backend::Device::cpu).rfind("--context-parallel-size 2 with BERT", 0), 0u);
  ParallelConfig sequence = one_rank;
  sequence.tensor_model_parallel_size = 2;
  EXPECT_EQ(refusal_on(sequence, mt::backend::Device::cpu), "");
  EXPECT_EQ(refusal_on(pipeline, mt::backend::Device::cpu), "");
  sequence.sequence_parallel = true;
  EXPECT_EQ(refusal_on(sequence, mt::backend::Device::cpu), "");
  EXPECT_EQ(refusal_on(one_rank, mt::backend::Device::cpu), "");
}

// BERT trains on BERT's masked samples only (a GPT sample source has no token types, key lengths
// or sentence-order targets), and not with --calculate-per-token-loss.
TEST(Supported, TheTrainerRefusesBertWithoutItsSamples) {
  const ModelConfig bert = mt::model::preset("tiny-bert");
  const auto data = mt::data::make_mock_data(bert.vocab_size, bert.seq_length, 1);
  mt::train::TrainConfig train;
  train.train_iters = 1;
  try {
    const mt::train::Trainer trainer(bert, train, *data, mt::backend::cpu_ops());
    FAIL() << "a BERT model was built by the Trainer on mock data";
  } catch (const mt::UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("data: BERT (model tiny-bert) trains on BERT's masked samples", 0), 0u)
        << e.what();
  }
}
