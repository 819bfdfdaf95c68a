// The MoE MLP in a stage (model/layers/moe_mlp.h): its backward against central differences of
// the stage's objective (LM loss + aux loss + z-loss, with shared experts), full recompute giving
// the same grads while counting tokens and logging losses once, and expert parallelism over
// thread ranks (tests/unit/thread_communicator.h): EP = 2, each rank its own micro-batch, equal
// to one rank running both micro-batches, also when one expert and then one whole EP rank gets
// no token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "model/init.h"
#include "model/layers/moe_mlp.h"
#include "model/stage.h"
#include "../thread_communicator.h"
#include "../tiny_models.h"
#include "reference_model.h"

using namespace mt;
using namespace mt::model;

namespace {

// Two MoE layers of 4 experts (top-2, width 8) and a shared expert of width 8, hidden 16,
// sequences of 9; aux loss and z-loss large enough to move the router's grads.
ModelConfig moe_model() {
  ModelConfig c = mt::testing::gradient_model(true, 2, 0.0f);
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 8;
  c.moe_shared_expert_intermediate_size = 8;
  c.moe_router_load_balancing_type = MoeLoadBalancing::aux_loss;
  c.moe_aux_loss_coeff = 0.3f;
  c.moe_z_loss_coeff = 0.05f;
  return c;
}

// Sample `sample` of `data` as a micro-batch of one sequence.
MicroBatch sample_batch(mt::testing::Data& data, int sample, int seq, double* sums) {
  const size_t at = static_cast<size_t>(sample) * static_cast<size_t>(seq);
  MicroBatch batch{1, seq, data.tokens.data() + at, data.labels.data() + at, data.mask.data() + at,
                   data.positions.data() + at, nullptr, data.row_ids.data() + at};
  batch.loss_sums = sums;
  return batch;
}

// One rank's model: its layout, parameters, grads and stage (chunk 0 of every layer).
struct RankModel {
  RankModel(const ModelConfig& c, const ParamLayout& l, const ParallelContext& parallel, RecomputeConfig recompute = {})
      : config(c),
        layout(l),
        params(static_cast<size_t>(layout.total_elements)),
        grads(params.size(), 0.0f),
        weights(backend::cpu_ops(), Precision::fp32, layout.total_elements),
        stage(config, layout, 0, parallel, backend::cpu_ops(), weights,
              StageOptions{.recompute = recompute, .micro_batch_size = 1, .seed = 3}) {
    initialize_parameters(layout, 11, params.data());
    stage.bind(params.data(), grads.data());
    weights.refresh(params.data());
    stage.set_aux_loss_grad_factor(1.0f);
  }
  // A training forward of `batch`: its LM loss sum plus the aux and z-loss values (coeff x the
  // logged value) of its MoE layers.
  double objective(const MicroBatch& micro_batch) {
    double sums[2] = {0, 0};
    MicroBatch batch = micro_batch;
    batch.loss_sums = sums;
    for (int i = 0; i < stage.moe_layer_count(); ++i) stage.moe_layer(i).clear_losses();
    stage.forward(0, batch, nullptr, ForwardPass{1, true});
    double total = sums[0];
    for (int i = 0; i < stage.moe_layer_count(); ++i) {
      const MoeLayerState& state = stage.moe_layer(i);
      for (double value : state.load_balancing) total += config.moe_aux_loss_coeff * value;
      for (double value : state.z_loss) total += config.moe_z_loss() * value;
    }
    return total;
  }
  double forward_backward(const MicroBatch& batch) {
    const double value = objective(batch);
    stage.backward(0, nullptr, 1.0f);
    return value;
  }
  std::vector<float> grad_of(const std::string& name) const {
    const ParamEntry& e = layout.find(name);
    return {grads.begin() + e.offset, grads.begin() + e.offset + e.numel};
  }

  ModelConfig config;
  ParamLayout layout;
  std::vector<float> params, grads;
  GemmWeights weights;
  Stage stage;
};

}  // namespace

TEST(MoeMlp, BackwardMatchesCentralDifferencesOfLmAuxAndZLoss) {
  const ModelConfig c = moe_model();
  const ParamLayout layout = build_layout(c);
  ParallelContext parallel;
  RankModel model(c, layout, parallel);
  mt::testing::Data data = mt::testing::make_data(c, 1, 5);
  double sums[2];
  const MicroBatch batch = sample_batch(data, 0, c.seq_length, sums);
  model.forward_backward(batch);
  ASSERT_EQ(model.stage.moe_layer(0).load_balancing.size(), 1u);
  ASSERT_EQ(model.stage.moe_layer(0).z_loss.size(), 1u);
  // Elements of the router, every expert's fc1 gate/up and fc2, the shared expert and attention.
  std::vector<std::string> names = {"decoder.layers.0.mlp.router.weight", "decoder.layers.1.mlp.router.weight",
                                    "decoder.layers.0.mlp.shared_experts.linear_fc1_up.weight",
                                    "decoder.layers.1.self_attention.linear_q.weight"};
  for (int e = 0; e < 4; ++e) {
    for (const char* tensor : {"linear_fc1_gate.weight", "linear_fc1_up.weight", "linear_fc2.weight"}) {
      names.push_back(expert_param_name(1, e, tensor));
    }
  }
  const double h = 5e-3;
  int checked = 0, nonzero = 0;
  for (const std::string& name : names) {
    const ParamEntry* entry = layout.try_find(name);
    if (!entry) continue;
    for (int64_t k = 0; k < entry->numel; k += std::max<int64_t>(1, entry->numel / 6)) {
      float& p = model.params[static_cast<size_t>(entry->offset + k)];
      const float saved = p;
      p = saved + static_cast<float>(h);
      model.weights.refresh(model.params.data());
      const double plus = model.objective(batch);
      p = saved - static_cast<float>(h);
      model.weights.refresh(model.params.data());
      const double minus = model.objective(batch);
      p = saved;
      const double numeric = (plus - minus) / (2 * h);
      const double analytic = model.grads[static_cast<size_t>(entry->offset + k)];
      EXPECT_NEAR(analytic, numeric, 2e-3 + 3e-2 * std::abs(numeric)) << name << "[" << k << "]";
      ++checked;
      nonzero += std::abs(analytic) > 1e-4 ? 1 : 0;
    }
  }
  EXPECT_GT(checked, 40);
  EXPECT_GT(nonzero, checked / 2);
}

TEST(MoeMlp, FullRecomputeGivesTheSameGradsAndCountsTokensOnce) {
  const ModelConfig c = moe_model();
  const ParamLayout layout = build_layout(c);
  ParallelContext parallel;
  RankModel plain(c, layout, parallel);
  RankModel recomputed(c, layout, parallel, {RecomputeGranularity::full, RecomputeMethod::uniform, 1});
  mt::testing::Data data = mt::testing::make_data(c, 1, 7);
  double sums[2];
  const MicroBatch batch = sample_batch(data, 0, c.seq_length, sums);
  EXPECT_EQ(plain.forward_backward(batch), recomputed.forward_backward(batch));
  EXPECT_EQ(plain.grads, recomputed.grads);
  for (int i = 0; i < 2; ++i) {
    const MoeLayerState& a = plain.stage.moe_layer(i);
    const MoeLayerState& b = recomputed.stage.moe_layer(i);
    EXPECT_EQ(b.load_balancing.size(), 1u);  // logged by the forward, not again by the rerun
    const std::vector<float> counts(a.tokens_per_expert.data(), a.tokens_per_expert.data() + 4);
    const std::vector<float> counts_recomputed(b.tokens_per_expert.data(), b.tokens_per_expert.data() + 4);
    EXPECT_EQ(counts, counts_recomputed);
    float total = 0;
    for (float n : counts) total += n;
    EXPECT_EQ(total, static_cast<float>(c.seq_length * c.moe_router_topk));  // dropless: every routed copy once
  }
}

namespace {

// Runs micro-batches 0 and 1 of `data`: on one rank one after the other, and under EP = 2 on two
// thread ranks (rank r runs micro-batch r); `bias` (per expert) is written into every MoE layer's
// expert bias first. Checks the summed losses, every dense grad summed over the ranks and every
// expert grad against the one-rank run within 1e-5, and returns the one rank's tokens per expert
// of layer 0 and its grads.
std::vector<float> check_expert_parallel_equals_one_rank(const ModelConfig& c, const std::vector<float>& bias) {
  mt::testing::Data data = mt::testing::make_data(c, 2, 9);
  auto set_bias = [&](RankModel& model) {
    for (int i = 0; i < model.stage.moe_layer_count() && !bias.empty(); ++i) {
      std::copy(bias.begin(), bias.end(), model.stage.moe_layer(i).expert_bias.data());
    }
  };
  const ParamLayout one_layout = build_layout(c);
  ParallelContext one_parallel;
  RankModel one(c, one_layout, one_parallel);
  set_bias(one);
  double sums[2];
  double one_loss = 0;
  for (int mb = 0; mb < 2; ++mb) one_loss += one.forward_backward(sample_batch(data, mb, c.seq_length, sums));

  parallel::ParallelConfig p;
  p.expert_model_parallel_size = 2;
  p.expert_tensor_parallel_size = 1;
  mt::testing::ThreadGroup ep_group(2), world(2);
  std::vector<std::unique_ptr<RankModel>> ranks(2);
  std::vector<std::unique_ptr<ParallelContext>> contexts(2);
  std::vector<double> rank_loss(2, 0.0);
  mt::testing::run_ranks(2, [&](int r) {
    mt::testing::ThreadCommunicator ep(ep_group, r), expert_tp_ep(world, r);
    parallel::RankCoordinates rank;
    rank.ep = r;
    rank.dp = r;
    auto context = std::make_unique<ParallelContext>();
    context->set_expert_groups(ExpertGroups{.expert_parallel = 2, .ep_rank = r, .ep = &ep, .expert_tp_ep = &expert_tp_ep});
    auto model = std::make_unique<RankModel>(c, build_layout(c, p, rank, 0, c.num_layers), *context);
    set_bias(*model);
    double rank_sums[2];
    rank_loss[static_cast<size_t>(r)] = model->forward_backward(sample_batch(data, r, c.seq_length, rank_sums));
    ranks[static_cast<size_t>(r)] = std::move(model);
    contexts[static_cast<size_t>(r)] = std::move(context);
  });
  EXPECT_NEAR(rank_loss[0] + rank_loss[1], one_loss, 1e-5 * std::abs(one_loss));
  for (const ParamEntry& entry : one_layout.entries) {
    const std::vector<float> expected = one.grad_of(entry.name);
    std::vector<float> got(expected.size(), 0.0f);
    int holders = 0;
    for (const auto& rank : ranks) {
      if (!rank->layout.try_find(entry.name)) continue;
      ++holders;
      const std::vector<float> part = rank->grad_of(entry.name);
      for (size_t i = 0; i < got.size(); ++i) got[i] += part[i];  // dense: the DP sum; experts: one holder
    }
    EXPECT_EQ(holders, entry.data_parallel_group == DataParallelGroup::expert ? 1 : 2) << entry.name;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::abs(got[i] - expected[i]) > 1e-5 * (1 + std::abs(expected[i]))) {
        ADD_FAILURE() << entry.name << "[" << i << "]: " << got[i] << " under EP 2, " << expected[i] << " on one rank";
        break;  // one message per tensor
      }
    }
  }
  const MoeLayerState& state = one.stage.moe_layer(0);
  std::vector<float> result(state.tokens_per_expert.data(), state.tokens_per_expert.data() + c.num_experts);
  result.insert(result.end(), one.grads.begin(), one.grads.end());
  return result;
}

}  // namespace

TEST(MoeMlp, ExpertParallelTwoEqualsOneRank) {
  const std::vector<float> out = check_expert_parallel_equals_one_rank(moe_model(), {});
  for (int e = 0; e < 4; ++e) EXPECT_GT(out[static_cast<size_t>(e)], 0) << "expert " << e << " got no token";
}

TEST(MoeMlp, AnExpertAndAWholeExpertParallelRankWithNoTokens) {
  // Sigmoid routing with the expert bias choosing: a bias of -100 keeps an expert out.
  ModelConfig c = moe_model();
  c.moe_router_score_function = MoeScoreFunction::sigmoid;
  c.moe_router_enable_expert_bias = true;
  const std::vector<float> one_empty = check_expert_parallel_equals_one_rank(c, {0, 0, 0, -100});
  EXPECT_EQ(one_empty[3], 0.0f);
  EXPECT_GT(one_empty[0], 0.0f);
  // Experts 2 and 3 are EP rank 1's: it receives no token, takes part in every collective, and
  // its experts' grads stay zero.
  const std::vector<float> rank_empty = check_expert_parallel_equals_one_rank(c, {0, 0, -100, -100});
  EXPECT_EQ(rank_empty[2], 0.0f);
  EXPECT_EQ(rank_empty[3], 0.0f);
  EXPECT_EQ(rank_empty[0] + rank_empty[1], static_cast<float>(2 * c.seq_length * c.moe_router_topk));
}
