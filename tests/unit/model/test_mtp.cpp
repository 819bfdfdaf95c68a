// Multi-token prediction on stages (model/layers/mtp.h; its numbers against Megatron-Core are
// tests/unit/model/test_mtp_megatron.cpp): tensor parallelism of degree 2 (two ranks as two
// threads over an in-process communicator), with and without sequence parallelism, gives the
// one-rank losses and grads for GPT-2 (learned positions: the rolled positions are read) and
// LLaMA shapes with two depths and hidden dropout; the grads-ready signal names every layer id
// once, the depths after the first before the head (whose id depth 0 shares); a DeepSeek-V3-shaped
// model (MLA, MoE) runs its MTP depth's MoE layer, which the stage lists among its MoE layers; and
// an evaluation forward leaves the MTP sums alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "model/init.h"
#include "model/layers/moe_mlp.h"
#include "model/stage.h"
#include "../random_samples.h"
#include "../thread_communicator.h"
#include "../tiny_models.h"

using namespace mt;
using namespace mt::model;

namespace {

using mt::testing::make_samples;
using mt::testing::Samples;

ParamLayout rank_layout(const ModelConfig& c, int tp, int tp_rank, bool sequence_parallel) {
  parallel::ParallelConfig parallel;
  parallel.tensor_model_parallel_size = tp;
  parallel.sequence_parallel = sequence_parallel;
  parallel::RankCoordinates rank;
  rank.tp = tp_rank;
  return build_layout(c, parallel, rank, std::vector<ChunkSpec>{{0, c.num_layers, true, true}});
}

// One rank's whole model as one stage, with the MTP sums and grad scales of its micro-batch.
struct RankModel {
  RankModel(const ModelConfig& c, const ParamLayout& rank_layout, const ParallelContext& parallel, int batch)
      : config(c),
        layout(rank_layout),
        params(static_cast<size_t>(layout.total_elements)),
        grads(params.size(), 0.0f),
        weights(backend::cpu_ops(), Precision::fp32, layout.total_elements),
        stage(std::make_unique<Stage>(c, layout, 0, parallel, backend::cpu_ops(), weights,
                                      StageOptions{.micro_batch_size = batch, .seed = 5})),
        mtp_sums(static_cast<size_t>(2 * c.mtp_num_layers), 0.0) {
    initialize_parameters(layout, 11, params.data());
    weights.refresh(params.data());
    stage->bind(params.data(), grads.data());
    for (int k = 0; k < c.mtp_num_layers; ++k) mtp_scales.push_back(0.3f / static_cast<float>(k + 2));
  }
  LossSums forward(const Samples& s, int batch, bool training = true) {
    double sums[2] = {0, 0};
    MicroBatch micro{batch, config.seq_length, s.tokens.data(), s.labels.data(), s.mask.data(), s.positions.data(),
                     nullptr, s.row_ids.data(), sums};
    micro.mtp_loss_sums = mtp_sums.data();
    micro.mtp_loss_grad_scales = mtp_scales.data();
    stage->forward(0, micro, nullptr, ForwardPass{3, training});
    return LossSums{sums[0], sums[1]};
  }
  std::vector<float> grad_of(const std::string& name) const {
    const ParamEntry& e = layout.find(name);
    return {grads.begin() + e.offset, grads.begin() + e.offset + e.numel};
  }

  ModelConfig config;
  ParamLayout layout;
  std::vector<float> params, grads;
  GemmWeights weights;
  std::unique_ptr<Stage> stage;
  std::vector<double> mtp_sums;
  std::vector<float> mtp_scales;
};

ModelConfig mtp_model(bool llama) {
  ModelConfig c = mt::testing::gradient_model(llama, 2, 0.1f);
  c.vocab_size = 45;  // the padded 48 splits 24 + 24: rank 1 holds 21 real columns and 3 of padding
  c.mtp_num_layers = 2;
  return c;
}

// |a - b| <= 1e-4 (|b| + rms(b)) + absolute, elementwise.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double absolute, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double squares = 0;
  for (float v : b) squares += double(v) * v;
  const double scale = std::sqrt(squares / std::max<size_t>(1, b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_LE(std::fabs(double(a[i]) - b[i]), 1e-4 * (std::fabs(b[i]) + scale) + absolute) << what << "[" << i << "]";
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

void expect_tensor_parallel_matches_single_rank(bool llama, bool sequence_parallel) {
  const ModelConfig c = mtp_model(llama);
  const Samples samples = make_samples(c, 2, 6);
  const ParallelContext single;
  RankModel reference(c, rank_layout(c, 1, 0, false), single, 2);
  const LossSums expected = reference.forward(samples, 2);
  reference.stage->backward(0, nullptr, 1.0f / 16);

  mt::testing::ThreadGroup group(2);
  LossSums losses[2];
  std::vector<std::unique_ptr<RankModel>> ranks(2);
  std::vector<std::thread> threads;
  std::exception_ptr failures[2];
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        mt::testing::ThreadCommunicator tensor_group(group, r);
        const ParallelContext parallel(&tensor_group, sequence_parallel);
        auto& rank = ranks[static_cast<size_t>(r)];
        rank = std::make_unique<RankModel>(c, rank_layout(c, 2, r, sequence_parallel), parallel, 2);
        losses[r] = rank->forward(samples, 2);
        rank->stage->backward(0, nullptr, 1.0f / 16);
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
  for (int r = 0; r < 2; ++r) {
    const RankModel& rank = *ranks[static_cast<size_t>(r)];
    EXPECT_NEAR(losses[r].loss, expected.loss, 1e-5 * std::fabs(expected.loss));
    for (size_t i = 0; i < rank.mtp_sums.size(); ++i) {
      EXPECT_NEAR(rank.mtp_sums[i], reference.mtp_sums[i], 1e-5 * std::fabs(reference.mtp_sums[i])) << i;
    }
    for (const ParamEntry& e : rank.layout.entries) {
      std::vector<float> local = rank.grad_of(e.name);
      if (e.reduce_over_tensor_parallel) {
        const std::vector<float> other = ranks[static_cast<size_t>(1 - r)]->grad_of(e.name);
        for (size_t i = 0; i < local.size(); ++i) local[i] += other[i];
      }
      // The key bias's grad is analytically zero (it shifts every score of a row alike): both
      // sides hold round-off only, compared in absolute terms.
      const bool zero_gradient = e.name.find("linear_k.bias") != std::string::npos;
      expect_close(local, shard_of(e, reference.layout.find(e.name), reference.grads), zero_gradient ? 1e-7 : 0.0,
                   "rank " + std::to_string(r) + " " + e.name);
    }
  }
}

}  // namespace

TEST(Mtp, TensorParallelOverTwoRanksMatchesOneRank) {
  for (bool llama : {false, true}) {
    for (bool sequence_parallel : {false, true}) {
      SCOPED_TRACE(std::string(llama ? "llama" : "gpt") + (sequence_parallel ? " sp" : ""));
      expect_tensor_parallel_matches_single_rank(llama, sequence_parallel);
    }
  }
}

TEST(Mtp, GradsReadyNamesEveryLayerOnceDepthsBeforeTheHead) {
  const ModelConfig c = mtp_model(true);
  const Samples samples = make_samples(c, 1, 7);
  const ParallelContext single;
  RankModel model(c, rank_layout(c, 1, 0, false), single, 1);
  std::vector<int> before, ready;
  model.stage->on_before_forward([&](int layer) { before.push_back(layer); });
  model.stage->on_grads_ready([&](int layer) { ready.push_back(layer); });
  model.forward(samples, 1);
  model.stage->backward(0, nullptr, 0.1f);
  EXPECT_EQ(before, (std::vector<int>{kEmbeddingLayer, 0, 1, 2, 3}));
  EXPECT_EQ(ready, (std::vector<int>{3, 2, 1, 0, kEmbeddingLayer}));
  // An evaluation forward runs no MTP depth: the sums stay as they were.
  const std::vector<double> after_training = model.mtp_sums;
  EXPECT_GT(after_training[1], 0);
  model.forward(samples, 1, false);
  EXPECT_EQ(model.mtp_sums, after_training);
}

TEST(Mtp, ADeepSeekShapedDepthRunsItsMoeLayer) {
  ModelConfig c = preset("tiny-deepseek");
  c.seq_length = 8;
  c.max_position_embeddings = 8;
  c.mtp_num_layers = 1;
  const Samples samples = make_samples(c, 1, 8);
  const ParallelContext single;
  RankModel model(c, rank_layout(c, 1, 0, false), single, 1);
  ASSERT_EQ(model.stage->moe_layer_count(), 2);
  EXPECT_EQ(model.stage->moe_layer(1).layer, c.num_layers);  // the MTP depth's, after the decoder's
  model.forward(samples, 1);
  model.stage->backward(0, nullptr, 0.1f);
  EXPECT_TRUE(std::isfinite(model.mtp_sums[0]));
  EXPECT_EQ(model.mtp_sums[1], 6);  // 8 tokens rolled once, the mask's zero at row 3
  const std::vector<float> router = model.grad_of("decoder.layers.2.mlp.router.weight");
  EXPECT_TRUE(std::any_of(router.begin(), router.end(), [](float g) { return g != 0.0f; }));
  const std::vector<float> kv = model.grad_of("decoder.layers.2.self_attention.linear_kv_down_proj.weight");
  EXPECT_TRUE(std::any_of(kv.begin(), kv.end(), [](float g) { return g != 0.0f; }));
}
