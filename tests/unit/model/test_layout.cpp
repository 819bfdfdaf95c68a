// The parameter layout table and counter-based initialisation: offsets, fused groups, TP shards,
// no-decay set, and the same global model from every layout.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "model/init.h"
#include "model/layout.h"

using namespace mt::model;

TEST(Layout, CoversEveryParameterOnce) {
  for (const char* name : {"tiny-gpt", "tiny-llama", "gpt2-124m"}) {
    const ModelConfig c = preset(name);
    const ParamLayout layout = build_layout(c);
    EXPECT_EQ(layout.parameter_elements(), parameter_count(c, true)) << name;
    int64_t end = 0;
    for (const auto& e : layout.entries) {
      EXPECT_GE(e.offset, end) << e.name;
      end = e.offset + e.numel;
    }
    EXPECT_LE(end, layout.total_elements);
    EXPECT_EQ(layout.total_elements % 16, 0);
  }
  // A dense layout of a MoE model would be silently wrong: refused by name.
  EXPECT_THROW(build_layout(preset("mixtral-8x7b")), mt::UsageError);
}

TEST(Layout, FusedGroupsAreContiguousAndGroupsAligned) {
  const ParamLayout layout = build_layout(preset("tiny-llama"));
  const auto& q = layout.find("decoder.layers.1.self_attention.linear_q.weight");
  const auto& k = layout.find("decoder.layers.1.self_attention.linear_k.weight");
  const auto& v = layout.find("decoder.layers.1.self_attention.linear_v.weight");
  EXPECT_EQ(q.offset % 16, 0);
  EXPECT_EQ(k.offset, q.offset + q.numel);
  EXPECT_EQ(v.offset, k.offset + k.numel);
  const auto& gate = layout.find("decoder.layers.0.mlp.linear_fc1_gate.weight");
  const auto& up = layout.find("decoder.layers.0.mlp.linear_fc1_up.weight");
  EXPECT_EQ(up.offset, gate.offset + gate.numel);
  EXPECT_EQ(layout.try_find("decoder.layers.0.self_attention.linear_q.bias"), nullptr);
  EXPECT_EQ(q.global_shape, (std::vector<int64_t>{64, 64}));   // 4 heads x 16
  EXPECT_EQ(k.global_shape, (std::vector<int64_t>{32, 64}));   // 2 groups x 16
}

TEST(Layout, NoDecayForBiasesAndNorms) {
  const ParamLayout layout = build_layout(preset("tiny-gpt"));
  EXPECT_TRUE(layout.find("embedding.word_embeddings.weight").weight_decay);
  EXPECT_TRUE(layout.find("decoder.layers.0.mlp.linear_fc1.weight").weight_decay);
  EXPECT_FALSE(layout.find("decoder.layers.0.mlp.linear_fc1.bias").weight_decay);
  EXPECT_FALSE(layout.find("decoder.final_layernorm.weight").weight_decay);
  EXPECT_EQ(layout.try_find("output_layer.weight"), nullptr);  // tied
}

TEST(Layout, TensorParallelShardsAreContiguousRanges) {
  const ModelConfig c = preset("tiny-gpt");
  mt::parallel::ParallelConfig tp2;
  tp2.tensor_model_parallel_size = 2;
  mt::parallel::RankCoordinates rank1;
  rank1.tp = 1;
  const ParamLayout layout = build_layout(c, tp2, rank1, 0, c.num_layers);
  const auto& fc1 = layout.find("decoder.layers.0.mlp.linear_fc1.weight");
  EXPECT_EQ(fc1.shard_dim, 0);
  EXPECT_EQ(fc1.shard_offset, 128);
  EXPECT_EQ(fc1.local_shape, (std::vector<int64_t>{128, 64}));
  const auto& fc2 = layout.find("decoder.layers.0.mlp.linear_fc2.weight");
  EXPECT_EQ(fc2.shard_dim, 1);
  EXPECT_EQ(fc2.local_shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(layout.find("decoder.layers.0.input_layernorm.weight").shard_dim, -1);
  mt::parallel::ParallelConfig tp3;
  tp3.tensor_model_parallel_size = 3;
  EXPECT_THROW(build_layout(c, tp3, {}, 0, c.num_layers), mt::UsageError);
}

TEST(Init, EveryLayoutStartsFromTheSameGlobalModel) {
  const ModelConfig c = preset("tiny-gpt");
  const ParamLayout whole = build_layout(c);
  std::vector<float> reference(static_cast<size_t>(whole.total_elements));
  initialize_parameters(c, whole, 42, reference.data());
  mt::parallel::ParallelConfig tp2;
  tp2.tensor_model_parallel_size = 2;
  for (int r = 0; r < 2; ++r) {
    mt::parallel::RankCoordinates rank;
    rank.tp = r;
    const ParamLayout shard = build_layout(c, tp2, rank, 0, c.num_layers);
    std::vector<float> local(static_cast<size_t>(shard.total_elements));
    initialize_parameters(c, shard, 42, local.data());
    for (const auto& e : shard.entries) {
      const auto& g = whole.find(e.name);
      if (e.local_shape.size() != 2) continue;
      for (int64_t i = 0; i < e.local_shape[0]; ++i)
        for (int64_t j = 0; j < e.local_shape[1]; ++j) {
          const int64_t gi = i + (e.shard_dim == 0 ? e.shard_offset : 0);
          const int64_t gj = j + (e.shard_dim == 1 ? e.shard_offset : 0);
          ASSERT_EQ(local[e.offset + i * e.local_shape[1] + j], reference[g.offset + gi * g.global_shape[1] + gj])
              << e.name;
        }
    }
  }
}

TEST(Init, MegatronScheme) {
  const ModelConfig c = preset("tiny-gpt");
  const ParamLayout layout = build_layout(c);
  std::vector<float> p(static_cast<size_t>(layout.total_elements));
  initialize_parameters(c, layout, 7, p.data());
  auto stddev = [&](const std::string& name) {
    const auto& e = layout.find(name);
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < e.numel; ++i) {
      sum += p[e.offset + i];
      sq += p[e.offset + i] * p[e.offset + i];
    }
    return std::sqrt(sq / e.numel - (sum / e.numel) * (sum / e.numel));
  };
  EXPECT_NEAR(stddev("decoder.layers.0.mlp.linear_fc1.weight"), 0.02, 0.001);
  EXPECT_NEAR(stddev("decoder.layers.0.mlp.linear_fc2.weight"), 0.02 / std::sqrt(4.0), 0.001);
  EXPECT_EQ(p[layout.find("decoder.layers.1.pre_mlp_layernorm.weight").offset], 1.0f);
  EXPECT_EQ(p[layout.find("decoder.layers.1.pre_mlp_layernorm.bias").offset], 0.0f);
  EXPECT_EQ(p[layout.find("decoder.layers.1.mlp.linear_fc1.bias").offset], 0.0f);
  std::vector<float> again(p.size());
  initialize_parameters(c, layout, 7, again.data());
  EXPECT_EQ(p, again);
  initialize_parameters(c, layout, 8, again.data());
  EXPECT_NE(p, again);
}

TEST(Tensor, LayoutViewsPointIntoTheFlatBuffer) {
  const ModelConfig c = preset("tiny-gpt");
  const ParamLayout layout = build_layout(c);
  std::vector<float> flat(static_cast<size_t>(layout.total_elements));
  const auto& entry = layout.find("decoder.layers.1.mlp.linear_fc2.weight");
  mt::Tensor w = layout.view(entry, flat.data());
  EXPECT_EQ(w.shape(), (std::vector<int64_t>{64, 256}));
  w.data<float>()[5] = 1.5f;
  EXPECT_EQ(flat[static_cast<size_t>(entry.offset + 5)], 1.5f);
}
