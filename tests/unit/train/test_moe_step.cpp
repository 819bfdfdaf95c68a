// The trainer's once-per-global-batch MoE work (lib/train/moe_step.h) on one rank: the expert
// bias moves by rate * sign(mean - count) on the step's counts, the counts are zeroed, the logged
// losses are averaged over micro-batches and over the model's MoE layers under Megatron's names,
// and each layer's tokens per expert give min, max and the coefficient of variation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/memory.h"
#include "backend/registry.h"
#include "model/config.h"
#include "train/moe_step.h"
#include "../tiny_models.h"

namespace {

mt::model::ModelConfig moe_model() {
  mt::model::ModelConfig c = mt::testing::tiny_llama();
  c.num_layers = 3;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_layer_pattern = {0, 1, 1};  // layer 0 dense
  c.moe_router_score_function = mt::model::MoeScoreFunction::sigmoid;
  c.moe_router_enable_expert_bias = true;
  c.moe_router_bias_update_rate = 0.25f;
  c.moe_aux_loss_coeff = 1e-2f;
  c.moe_router_load_balancing_type = mt::model::MoeLoadBalancing::seq_aux_loss;
  c.moe_z_loss_coeff = 1e-3f;
  return c;
}

std::vector<float> read(const mt::backend::Ops& ops, const float* device, int n) {
  std::vector<float> host(static_cast<size_t>(n));
  ops.copy(host.data(), device, n * static_cast<int64_t>(sizeof(float)), mt::backend::CopyKind::device_to_host,
           ops.default_stream());
  ops.synchronize(ops.default_stream());
  return host;
}

}  // namespace

TEST(MoeStep, MovesTheBiasZeroesTheCountsAndAveragesTheLosses) {
  const mt::backend::Ops& ops = mt::backend::cpu_ops();
  const mt::model::ModelConfig model = moe_model();
  mt::backend::DeviceBuffer<float> counts(ops, 8, mt::backend::MemoryCategory::activations),
      bias(ops, 8, mt::backend::MemoryCategory::weights);
  const std::vector<float> counts_host{3, 1, 0, 4, 2, 2, 2, 2};  // layer 1 uneven, layer 2 balanced
  const std::vector<float> bias_host{0.5f, 0, 0, 0, 0, 0, 0, 0};
  ops.copy(counts.data(), counts_host.data(), 32, mt::backend::CopyKind::host_to_device, ops.default_stream());
  ops.copy(bias.data(), bias_host.data(), 32, mt::backend::CopyKind::host_to_device, ops.default_stream());
  // This rank's layers in any order; 4 micro-batches' logged values summed.
  std::vector<mt::train::MoeLayerStep> layers{{2, counts.data() + 4, bias.data() + 4, 4.0, 8.0},
                                              {1, counts.data(), bias.data(), 6.0, 2.0}};
  const mt::train::MoeStepStats stats =
      mt::train::finish_moe_step(model, ops, ops.default_stream(), {}, layers, 4, /*per_layer_logging=*/true);

  // mean 2: below it the bias rises, above it falls, at it stays.
  const std::vector<float> moved = read(ops, bias.data(), 8);
  EXPECT_EQ(moved, (std::vector<float>{0.25f, 0.25f, 0.25f, -0.25f, 0, 0, 0, 0}));
  EXPECT_EQ(read(ops, counts.data(), 8), std::vector<float>(8, 0.0f));

  EXPECT_EQ(stats.balancing_name, "seq_load_balancing_loss");
  EXPECT_TRUE(stats.per_layer_losses);
  ASSERT_EQ(stats.layers.size(), 2u);
  EXPECT_EQ(stats.layers[0].layer, 1);
  EXPECT_DOUBLE_EQ(stats.layers[0].load_balancing_loss, 1.5);
  EXPECT_DOUBLE_EQ(stats.layers[0].z_loss, 0.5);
  EXPECT_EQ(stats.layers[0].tokens_min, 0);
  EXPECT_EQ(stats.layers[0].tokens_max, 4);
  EXPECT_NEAR(stats.layers[0].tokens_cv, std::sqrt((1.0 + 1.0 + 4.0 + 4.0) / 4.0) / 2.0, 1e-12);
  EXPECT_EQ(stats.layers[1].layer, 2);
  EXPECT_EQ(stats.layers[1].tokens_min, 2);
  EXPECT_EQ(stats.layers[1].tokens_max, 2);
  EXPECT_EQ(stats.layers[1].tokens_cv, 0.0);
  EXPECT_DOUBLE_EQ(stats.balancing_loss, (1.5 + 1.0) / 2);
  ASSERT_TRUE(stats.z_loss.has_value());
  EXPECT_DOUBLE_EQ(*stats.z_loss, (0.5 + 2.0) / 2);
}

TEST(MoeStep, NamesTheLossesAsMegatronLogsThem) {
  mt::model::ModelConfig model = moe_model();
  model.moe_router_load_balancing_type = mt::model::MoeLoadBalancing::aux_loss;
  EXPECT_EQ(mt::train::moe_balancing_log_name(model), "load_balancing_loss");
  model.moe_router_load_balancing_type = mt::model::MoeLoadBalancing::global_aux_loss;
  EXPECT_EQ(mt::train::moe_balancing_log_name(model), "global_load_balancing_loss");
  model.moe_aux_loss_coeff = 0;  // no loss, nothing logged
  EXPECT_EQ(mt::train::moe_balancing_log_name(model), "");
  model.moe_aux_loss_coeff = 1e-2f;
  model.moe_router_load_balancing_type = mt::model::MoeLoadBalancing::none;
  EXPECT_EQ(mt::train::moe_balancing_log_name(model), "");
}

TEST(MoeStep, WithoutTheBiasTheCountsOnlyFeedTheFigures) {
  const mt::backend::Ops& ops = mt::backend::cpu_ops();
  mt::model::ModelConfig model = moe_model();
  model.moe_router_enable_expert_bias = false;
  model.moe_z_loss_coeff.reset();
  mt::backend::DeviceBuffer<float> counts(ops, 8, mt::backend::MemoryCategory::activations);
  const std::vector<float> counts_host{5, 1, 1, 1, 0, 0, 0, 0};
  ops.copy(counts.data(), counts_host.data(), 32, mt::backend::CopyKind::host_to_device, ops.default_stream());
  std::vector<mt::train::MoeLayerStep> layers{{1, counts.data(), nullptr, 2.0, 0.0},
                                              {2, counts.data() + 4, nullptr, 2.0, 0.0}};
  const mt::train::MoeStepStats stats = mt::train::finish_moe_step(model, ops, ops.default_stream(), {}, layers, 2, false);
  EXPECT_FALSE(stats.z_loss.has_value());
  EXPECT_FALSE(stats.per_layer_losses);
  EXPECT_EQ(stats.layers[0].tokens_max, 5);
  EXPECT_EQ(stats.layers[1].tokens_cv, 0.0);  // no token routed: 0, not NaN
  EXPECT_DOUBLE_EQ(stats.balancing_loss, 1.0);
}
