// The transformer's explicit backward: finite differences through the whole model (GPT-2 and
// LLaMA flavours), bit-identical grads across recompute policies with ordered activation memory,
// linear activation memory in T, and layout-independent dropout.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/init.h"
#include "model/stage.h"

using namespace mt;
using namespace mt::model;

namespace {

// The whole model on one rank as one stage (model/stage.h), with its GEMM weight copy: the
// interface these tests drive (forward and backward of one micro-batch, loss only).
class Transformer {
 public:
  Transformer(const ModelConfig& config, const ParamLayout& layout, Precision precision, RecomputeConfig recompute,
              int micro_batch_size, uint64_t seed)
      : weights_(backend::cpu_ops(), precision, layout.total_elements),
        stage_(config, layout, 0, parallel_, backend::cpu_ops(), weights_,
               StageOptions{.precision = precision, .recompute = recompute, .micro_batch_size = micro_batch_size,
                            .seed = seed}) {}
  void bind(const float* params, float* grads) {
    params_ = params;
    stage_.bind(params, grads);
    refresh_gemm_weights();
  }
  void refresh_gemm_weights() { weights_.refresh(params_); }
  LossSums forward_backward(const MicroBatch& batch, float dloss_scale, uint64_t iteration) {
    const LossSums sums = stage_.forward(0, batch, nullptr, ForwardPass{iteration, true}).loss;
    stage_.backward(0, nullptr, dloss_scale);
    return sums;
  }
  LossSums forward_loss(const MicroBatch& batch) {
    return stage_.forward(0, batch, nullptr, ForwardPass{0, false}).loss;
  }
  int64_t activation_bytes() const { return stage_.activation_bytes(); }
  static int64_t planned_activation_bytes(const ModelConfig& config, Precision precision, RecomputeConfig recompute,
                                          int micro_batch_size, int layers) {
    return model::planned_activation_bytes(config, precision, recompute, micro_batch_size, layers);
  }

 private:
  ParallelContext parallel_;
  GemmWeights weights_;
  Stage stage_;
  const float* params_ = nullptr;
};

ModelConfig tiny(bool llama) {
  ModelConfig c = preset(llama ? "tiny-llama" : "tiny-gpt");
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = llama ? 2 : 4;
  c.ffn_hidden_size = 24;
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 8;
  c.seq_length = 9;
  c.max_position_embeddings = 9;
  c.init_method_std = 0.2f;  // large enough that every path carries gradient
  c.hidden_dropout = 0.0f;
  return c;
}

struct Data {
  std::vector<int32_t> tokens, labels, positions;
  std::vector<float> mask;
  std::vector<int64_t> row_ids;
  MicroBatch batch(int b, int t) {
    return MicroBatch{b, t, tokens.data(), labels.data(), mask.data(), positions.data(), nullptr, row_ids.data()};
  }
};

Data make_data(const ModelConfig& c, int batch, uint32_t seed) {
  std::mt19937 rng(seed);
  Data d;
  const int n = batch * c.seq_length;
  for (int r = 0; r < n; ++r) {
    d.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
    d.labels.push_back(static_cast<int32_t>(rng() % c.vocab_size));
    d.positions.push_back(r % c.seq_length);
    d.mask.push_back(r % 5 == 3 ? 0.0f : 1.0f);
    d.row_ids.push_back(r);
  }
  return d;
}

std::vector<float> grads_for(const ModelConfig& c, RecomputeConfig recompute, Data& data, int batch,
                             int64_t* activation_bytes = nullptr, Precision precision = Precision::fp32) {
  const ParamLayout layout = build_layout(c);
  std::vector<float> params(static_cast<size_t>(layout.total_elements)), grads(params.size(), 0.0f);
  initialize_parameters(c, layout, 11, params.data());
  Transformer model(c, layout, precision, recompute, batch, 5);
  model.bind(params.data(), grads.data());
  model.forward_backward(data.batch(batch, c.seq_length), 1.0f, 1);
  if (activation_bytes) *activation_bytes = model.activation_bytes();
  return grads;
}

void check_finite_differences(bool llama) {
  const ModelConfig c = tiny(llama);
  const int batch = 2;
  Data data = make_data(c, batch, 3);
  const ParamLayout layout = build_layout(c);
  std::vector<float> params(static_cast<size_t>(layout.total_elements)), grads(params.size(), 0.0f);
  initialize_parameters(c, layout, 11, params.data());
  Transformer model(c, layout, Precision::fp32, {}, batch, 5);
  model.bind(params.data(), grads.data());
  const MicroBatch mb = data.batch(batch, c.seq_length);
  model.forward_backward(mb, 1.0f, 1);
  auto loss_at = [&]() {
    model.refresh_gemm_weights();
    return model.forward_loss(mb).loss;
  };
  std::mt19937 rng(9);
  for (const auto& entry : layout.entries) {
    // a few elements of every tensor (the vocabulary rows the batch touches for the embedding)
    for (int trial = 0; trial < 4; ++trial) {
      int64_t i = static_cast<int64_t>(rng() % entry.numel);
      if (entry.name.find("word_embeddings") != std::string::npos || entry.name == "output_layer.weight") {
        i = static_cast<int64_t>(data.tokens[trial] * c.hidden_size + trial % c.hidden_size);
        if (entry.name == "output_layer.weight") i = static_cast<int64_t>(data.labels[trial] * c.hidden_size + 1);
      }
      float& p = params[static_cast<size_t>(entry.offset + i)];
      const float saved = p;
      const float h = 1e-2f * std::max(1.0f, std::fabs(saved));
      p = saved + h;
      const double up = loss_at();
      p = saved - h;
      const double down = loss_at();
      p = saved;
      const double numeric = (up - down) / (2.0 * h);
      const double analytic = grads[static_cast<size_t>(entry.offset + i)];
      EXPECT_NEAR(analytic, numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << entry.name << "[" << i << "]";
    }
  }
}

}  // namespace

TEST(Transformer, GptGradientsMatchFiniteDifferences) { check_finite_differences(false); }
TEST(Transformer, LlamaGradientsMatchFiniteDifferences) { check_finite_differences(true); }

TEST(Transformer, RecomputeGivesBitIdenticalGradsAndOrderedMemory) {
  for (bool llama : {false, true}) {
    ModelConfig c = tiny(llama);
    c.num_layers = 4;
    Data data = make_data(c, 2, 4);
    int64_t none_bytes = 0, selective_bytes = 0, full_bytes = 0, chunk_bytes = 0, block_bytes = 0;
    const auto none = grads_for(c, {}, data, 2, &none_bytes);
    const auto selective = grads_for(c, {RecomputeGranularity::selective, RecomputeMethod::uniform, 1}, data, 2,
                                     &selective_bytes);
    const auto full = grads_for(c, {RecomputeGranularity::full, RecomputeMethod::uniform, 1}, data, 2, &full_bytes);
    const auto chunk = grads_for(c, {RecomputeGranularity::full, RecomputeMethod::uniform, 2}, data, 2, &chunk_bytes);
    const auto block = grads_for(c, {RecomputeGranularity::full, RecomputeMethod::block, 2}, data, 2, &block_bytes);
    EXPECT_EQ(none, selective);
    EXPECT_EQ(none, full);
    EXPECT_EQ(none, chunk);
    EXPECT_EQ(none, block);
    EXPECT_LT(full_bytes, selective_bytes);
    EXPECT_LT(selective_bytes, none_bytes);
    EXPECT_LT(chunk_bytes, none_bytes);
    EXPECT_LT(block_bytes, none_bytes);
    EXPECT_EQ(none_bytes, Transformer::planned_activation_bytes(c, Precision::fp32, {}, 2, c.num_layers));
  }
}

TEST(Transformer, ActivationMemoryGrowsLinearlyInSequenceLength) {
  ModelConfig c = tiny(true);
  c.num_layers = 1;
  c.vocab_size = 8;
  c.seq_length = 2048;
  c.max_position_embeddings = 4096;
  Data short_data = make_data(c, 1, 1);
  int64_t short_bytes = 0, long_bytes = 0;
  grads_for(c, {}, short_data, 1, &short_bytes);
  c.seq_length = 4096;
  Data long_data = make_data(c, 1, 1);
  const auto grads = grads_for(c, {}, long_data, 1, &long_bytes);  // a real T=4096 step
  for (float g : grads) ASSERT_TRUE(std::isfinite(g));
  EXPECT_NEAR(static_cast<double>(long_bytes) / static_cast<double>(short_bytes), 2.0, 0.01);
}

TEST(Transformer, DropoutDoesNotDependOnHowSamplesAreBatched) {
  ModelConfig c = tiny(false);
  c.hidden_dropout = 0.3f;
  Data data = make_data(c, 2, 6);
  const auto together = grads_for(c, {}, data, 2);
  // The same two samples as two micro-batches of one: same dropout masks (keyed by global row).
  const ParamLayout layout = build_layout(c);
  std::vector<float> params(static_cast<size_t>(layout.total_elements)), grads(params.size(), 0.0f);
  initialize_parameters(c, layout, 11, params.data());
  Transformer model(c, layout, Precision::fp32, {}, 1, 5);
  model.bind(params.data(), grads.data());
  const int t = c.seq_length;
  for (int b = 0; b < 2; ++b) {
    MicroBatch one{1, t, data.tokens.data() + b * t, data.labels.data() + b * t, data.mask.data() + b * t,
                   data.positions.data() + b * t, nullptr, data.row_ids.data() + b * t};
    model.forward_backward(one, 1.0f, 1);
  }
  for (size_t i = 0; i < grads.size(); ++i) ASSERT_NEAR(grads[i], together[i], 1e-5 + 1e-4 * std::fabs(together[i])) << i;
  // and dropout is active: other grads than without it
  c.hidden_dropout = 0.0f;
  EXPECT_NE(grads_for(c, {}, data, 2), together);
}

TEST(Transformer, Bf16StaysCloseToFp32) {
  const ModelConfig c = tiny(true);
  Data data = make_data(c, 2, 8);
  const auto fp32 = grads_for(c, {}, data, 2);
  const auto bf16 = grads_for(c, {}, data, 2, nullptr, Precision::bf16);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < fp32.size(); ++i) {
    diff += (fp32[i] - bf16[i]) * (fp32[i] - bf16[i]);
    norm += fp32[i] * fp32[i];
  }
  EXPECT_GT(diff, 0.0);                       // bf16 rounding is really applied
  EXPECT_LT(std::sqrt(diff / norm), 0.05);    // and stays within 5% of fp32 in norm
}
