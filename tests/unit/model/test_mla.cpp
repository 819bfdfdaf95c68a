// Multi-latent attention in a stage (model/layers/mla_attention.h): its backward against central
// differences of a tiny MLA model's loss (with and without --q-lora-rank, latent norms, and a
// value head wider than the query/key head, which pads q and k), selective and full recompute
// giving the same grads as none, and tensor parallelism of degree 2 over thread ranks, with and
// without sequence parallelism, equal to one rank (replicated down projections and norms summed
// over TP under SP, as the layout says); the config refusals MLA brings, and the tiny-deepseek preset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "model/init.h"
#include "model/layers/mla_attention.h"
#include "model/stage.h"
#include "../random_samples.h"
#include "../thread_communicator.h"
#include "../tiny_models.h"

using namespace mt;
using namespace mt::model;

namespace {

using mt::testing::make_samples;
using mt::testing::Samples;

// Two MLA layers on the LLaMA-shaped gradient model (hidden 16, 4 heads, sequences of 9).
// `wide_values`: no --q-lora-rank and d_v = 6 > d_n + d_r = 4 (q and k padded); else q-lora rank 6,
// d_n 3 + d_r 4 = 7 > d_v 5 (v padded), with the latent norms.
ModelConfig mla_model(bool wide_values) {
  ModelConfig c = mt::testing::gradient_model(true, 2, 0.0f);
  c.num_query_groups = c.num_attention_heads;
  c.multi_latent_attention = true;
  if (wide_values) {
    c.q_lora_rank = 0;
    c.kv_lora_rank = 5;
    c.qk_head_dim = 2;
    c.qk_pos_emb_head_dim = 2;
    c.v_head_dim = 6;
  } else {
    c.q_lora_rank = 6;
    c.kv_lora_rank = 5;
    c.qk_head_dim = 3;
    c.qk_pos_emb_head_dim = 4;
    c.v_head_dim = 5;
    c.qk_layernorm = true;
  }
  c.validate();
  return c;
}

ParamLayout layout_of(const ModelConfig& c, int tp = 1, int tp_rank = 0, bool sequence_parallel = false) {
  parallel::ParallelConfig parallel;
  parallel.tensor_model_parallel_size = tp;
  parallel.sequence_parallel = sequence_parallel;
  parallel::RankCoordinates rank;
  rank.tp = tp_rank;
  return build_layout(c, parallel, rank, {{0, c.num_layers, true, true}});
}

// One rank's model: layout, parameters, grads and one stage of every layer.
struct RankModel {
  RankModel(const ModelConfig& c, const ParamLayout& l, const ParallelContext& parallel, RecomputeConfig recompute = {})
      : layout(l),
        params(static_cast<size_t>(layout.total_elements)),
        grads(params.size(), 0.0f),
        weights(backend::cpu_ops(), Precision::fp32, layout.total_elements),
        stage(std::make_unique<Stage>(c, layout, 0, parallel, backend::cpu_ops(), weights,
                                      StageOptions{.recompute = recompute, .micro_batch_size = 2, .seed = 3})) {
    initialize_parameters(layout, 11, params.data());
    stage->bind(params.data(), grads.data());
    weights.refresh(params.data());
  }
  // The loss sum of a training forward.
  double objective(const MicroBatch& micro_batch) {
    double sums[2] = {0, 0};
    MicroBatch batch = micro_batch;
    batch.loss_sums = sums;
    stage->forward(0, batch, nullptr, ForwardPass{1, true});
    return sums[0];
  }
  double forward_backward(const MicroBatch& batch) {
    const double value = objective(batch);
    stage->backward(0, nullptr, 1.0f);
    return value;
  }
  std::vector<float> grad_of(const std::string& name) const {
    const ParamEntry& e = layout.find(name);
    return {grads.begin() + e.offset, grads.begin() + e.offset + e.numel};
  }

  ParamLayout layout;
  std::vector<float> params, grads;
  GemmWeights weights;
  std::unique_ptr<Stage> stage;
};

const char* const kMlaTensors[] = {"linear_q_proj.weight",      "linear_q_down_proj.weight", "q_layernorm.weight",
                                   "linear_q_up_proj.weight",   "linear_kv_down_proj.weight", "kv_layernorm.weight",
                                   "linear_kv_up_proj.weight",  "linear_proj.weight",        "linear_proj.bias"};

}  // namespace

TEST(MlaAttention, DeclaresMegatronsTensorsAndShapes) {
  const ModelConfig c = mla_model(false);
  const ParamLayout layout = layout_of(c);
  const std::string p = "decoder.layers.1.self_attention.";
  EXPECT_EQ(layout.find(p + "linear_q_down_proj.weight").global_shape, (std::vector<int64_t>{6, 16}));
  EXPECT_EQ(layout.find(p + "q_layernorm.weight").global_shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(layout.find(p + "linear_q_up_proj.weight").global_shape, (std::vector<int64_t>{4 * 7, 6}));
  EXPECT_EQ(layout.find(p + "linear_kv_down_proj.weight").global_shape, (std::vector<int64_t>{5 + 4, 16}));
  EXPECT_EQ(layout.find(p + "kv_layernorm.weight").global_shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(layout.find(p + "linear_kv_up_proj.weight").global_shape, (std::vector<int64_t>{4 * 8, 5}));
  EXPECT_EQ(layout.find(p + "linear_proj.weight").global_shape, (std::vector<int64_t>{16, 4 * 5}));
  EXPECT_EQ(layout.try_find(p + "linear_q_proj.weight"), nullptr);
  EXPECT_EQ(layout.try_find(p + "linear_q.weight"), nullptr);
  int64_t elements = 0;
  for (const ParamEntry& e : layout.entries) elements += e.numel;
  EXPECT_EQ(elements, parameter_count(c, true));
  const MlaAttention mla(c, 0);
  EXPECT_FLOAT_EQ(mla.softmax_scale(), 1.0f / std::sqrt(7.0f));
}

TEST(MlaAttention, BackwardMatchesCentralDifferences) {
  for (bool wide_values : {false, true}) {
    SCOPED_TRACE(wide_values ? "no q-lora, v wider than q/k" : "q-lora, latent norms");
    const ModelConfig c = mla_model(wide_values);
    const ParallelContext single;
    RankModel model(c, layout_of(c), single);
    const Samples samples = make_samples(c, 2, 5);
    const MicroBatch batch = samples.micro_batch(0, 2, c.seq_length);
    model.forward_backward(batch);
    const double h = 5e-3;
    int checked = 0;
    for (int layer = 0; layer < 2; ++layer) {
      for (const char* tensor : kMlaTensors) {
        const ParamEntry* entry = model.layout.try_find(layer_prefix(layer) + "self_attention." + tensor);
        if (!entry) continue;
        for (int64_t k = 0; k < entry->numel; k += std::max<int64_t>(1, entry->numel / 7)) {
          float& p = model.params[static_cast<size_t>(entry->offset + k)];
          const float saved = p;
          p = saved + static_cast<float>(h);
          model.weights.refresh(model.params.data());
          const double plus = model.objective(batch);
          p = saved - static_cast<float>(h);
          model.weights.refresh(model.params.data());
          const double minus = model.objective(batch);
          p = saved;
          model.weights.refresh(model.params.data());
          const double numeric = (plus - minus) / (2 * h);
          const double analytic = model.grads[static_cast<size_t>(entry->offset + k)];
          EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::abs(numeric)) << entry->name << "[" << k << "]";
          ++checked;
        }
      }
    }
    EXPECT_GT(checked, 50);
  }
}

TEST(MlaAttention, RecomputeGivesTheSameGrads) {
  const ModelConfig c = mla_model(false);
  const Samples samples = make_samples(c, 2, 7);
  const MicroBatch batch = samples.micro_batch(0, 2, c.seq_length);
  const ParallelContext single;
  RankModel plain(c, layout_of(c), single);
  const double loss = plain.forward_backward(batch);
  for (const RecomputeConfig& recompute : {RecomputeConfig{RecomputeGranularity::selective, RecomputeMethod::uniform, 1},
                                           RecomputeConfig{RecomputeGranularity::full, RecomputeMethod::uniform, 1}}) {
    RankModel again(c, layout_of(c), single, recompute);
    EXPECT_EQ(again.forward_backward(batch), loss);
    EXPECT_EQ(again.grads, plain.grads) << static_cast<int>(recompute.granularity);
  }
}

// --- tensor parallelism over threads ------------------------------------------------------------

namespace {

using mt::testing::ThreadCommunicator;
using mt::testing::ThreadGroup;

// |a - b| <= tol * (|b| + rms(b)), elementwise.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double squares = 0;
  for (float v : b) squares += double(v) * v;
  const double scale = std::sqrt(squares / std::max<size_t>(1, b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_LE(std::fabs(double(a[i]) - b[i]), tol * (std::fabs(b[i]) + scale)) << what << "[" << i << "]";
  }
}

// This rank's slice of a whole (single-rank) tensor: rows or columns of its shard.
std::vector<float> shard_of(const ParamEntry& shard, const ParamEntry& whole, const std::vector<float>& buffer) {
  std::vector<float> slice;
  const int64_t cols = whole.global_shape.size() == 2 ? whole.global_shape[1] : 1;
  const int64_t local_cols = shard.local_shape.size() == 2 ? shard.local_shape[1] : 1;
  for (int64_t i = 0; i < shard.numel; ++i) {
    const int64_t row = i / local_cols + (shard.shard_dim == 0 ? shard.shard_offset : 0);
    const int64_t col = i % local_cols + (shard.shard_dim == 1 ? shard.shard_offset : 0);
    slice.push_back(buffer[static_cast<size_t>(whole.offset + row * cols + col)]);
  }
  return slice;
}

void expect_tensor_parallel_matches_single_rank(bool wide_values, bool sequence_parallel, RecomputeConfig recompute) {
  ModelConfig c = mla_model(wide_values);
  c.vocab_size = 45;
  const Samples samples = make_samples(c, 2, 6);
  const MicroBatch batch = samples.micro_batch(0, 2, c.seq_length);
  const ParallelContext single;
  RankModel reference(c, layout_of(c), single, recompute);
  const double expected = reference.forward_backward(batch);

  ThreadGroup group(2);
  double losses[2] = {0, 0};
  std::vector<std::unique_ptr<RankModel>> ranks(2);
  std::vector<std::thread> threads;
  std::exception_ptr failures[2];
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadCommunicator tensor_group(group, r);
        const ParallelContext parallel(&tensor_group, sequence_parallel);
        auto& rank = ranks[static_cast<size_t>(r)];
        rank = std::make_unique<RankModel>(c, layout_of(c, 2, r, sequence_parallel), parallel, recompute);
        losses[r] = rank->forward_backward(batch);
        rank->stage.reset();  // before the context goes
      } catch (...) {
        failures[r] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  int mla_tensors = 0;
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(losses[r], expected, 1e-5 * std::fabs(expected));
    const RankModel& rank = *ranks[static_cast<size_t>(r)];
    for (const ParamEntry& e : rank.layout.entries) {
      std::vector<float> local = rank.grad_of(e.name);
      if (e.reduce_over_tensor_parallel) {
        const std::vector<float> other = ranks[static_cast<size_t>(1 - r)]->grad_of(e.name);
        for (size_t i = 0; i < local.size(); ++i) local[i] += other[i];
      }
      if (e.name.find("self_attention.") != std::string::npos) ++mla_tensors;
      expect_close(local, shard_of(e, reference.layout.find(e.name), reference.grads), 1e-4,
                   "rank " + std::to_string(r) + " " + e.name);
    }
  }
  EXPECT_GE(mla_tensors, 2 * 2 * 4);
}

}  // namespace

TEST(MlaAttention, TensorParallelOverTwoRanksMatchesOneRank) {
  for (bool wide_values : {false, true}) {
    for (bool sequence_parallel : {false, true}) {
      for (RecomputeGranularity granularity : {RecomputeGranularity::none, RecomputeGranularity::selective}) {
        SCOPED_TRACE(std::string(wide_values ? "wide values" : "q-lora") + (sequence_parallel ? " sp" : "") +
                     (granularity == RecomputeGranularity::selective ? " selective recompute" : ""));
        expect_tensor_parallel_matches_single_rank(wide_values, sequence_parallel,
                                                   RecomputeConfig{granularity, RecomputeMethod::uniform, 1});
      }
    }
  }
}

TEST(MlaAttention, ConfigRefusesWhatMlaExcludesByFlag) {
  const auto refusal = [](const ModelConfig& c) {
    try {
      c.validate();
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  ModelConfig norms_without_mla = preset("tiny-llama");
  norms_without_mla.qk_layernorm = true;
  EXPECT_EQ(refusal(norms_without_mla).rfind("--qk-layernorm", 0), 0u) << refusal(norms_without_mla);
  ModelConfig learned = mla_model(false);
  learned.position_embedding = PositionEmbedding::learned_absolute;
  EXPECT_NE(refusal(learned).find("--position-embedding-type rope"), std::string::npos) << refusal(learned);
  ModelConfig grouped = mla_model(false);
  grouped.num_query_groups = 2;
  EXPECT_NE(refusal(grouped).find("--num-query-groups"), std::string::npos) << refusal(grouped);
  ModelConfig layernorm = mla_model(false);
  layernorm.normalization = Normalization::layernorm;
  EXPECT_EQ(refusal(layernorm).rfind("--qk-layernorm", 0), 0u) << refusal(layernorm);
  ModelConfig odd = mla_model(false);
  odd.qk_pos_emb_head_dim = 3;
  EXPECT_EQ(refusal(odd).rfind("--qk-pos-emb-head-dim", 0), 0u) << refusal(odd);
}

TEST(MlaAttention, TinyDeepseekIsDeepseekV3Shaped) {
  const ModelConfig c = preset("tiny-deepseek");
  EXPECT_NO_THROW(c.validate());
  EXPECT_TRUE(c.multi_latent_attention && c.qk_layernorm);
  EXPECT_FALSE(c.is_moe_layer(0));  // the first layer dense, as DeepSeek-V3's first three
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_EQ(c.moe_router_score_function, MoeScoreFunction::sigmoid);
  EXPECT_TRUE(c.moe_router_enable_expert_bias);
  EXPECT_EQ(c.moe_router_num_groups, 4);
  EXPECT_EQ(c.moe_router_group_topk, 2);
  EXPECT_GT(c.moe_shared_expert_intermediate_size, 0);
  EXPECT_EQ(c.mtp_num_layers, 0);
  const ParamLayout layout = layout_of(c);
  EXPECT_NE(layout.try_find("decoder.layers.0.self_attention.linear_kv_down_proj.weight"), nullptr);
  EXPECT_NE(layout.try_find("decoder.layers.1.mlp.router.weight"), nullptr);
  EXPECT_EQ(layout.try_find("decoder.layers.0.mlp.router.weight"), nullptr);
  // DeepSeek-V3's preset: Megatron's recipe sets --qk-layernorm.
  EXPECT_TRUE(preset("deepseek-v3").qk_layernorm);
}
