// The model's explicit backward (one stage of pre-norm decoder layers): every gradient element
// against central differences of a double-precision reference of the same model (GPT-2 and LLaMA
// flavours), bit-identical grads across recompute policies with ordered activation memory that
// equals the planned bytes, linear activation memory in T, and layout-independent dropout (hidden
// and attention dropout: the same masks under recompute and any batching).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "model/init.h"
#include "model/stage.h"
#include "../tiny_models.h"
#include "reference_model.h"

using namespace mt;
using namespace mt::model;
using mt::testing::Data;
using mt::testing::make_data;
using mt::testing::WholeModel;

namespace {

ModelConfig tiny(bool llama) { return mt::testing::gradient_model(llama, 2, 0.0f); }

std::vector<float> grads_for(const ModelConfig& c, RecomputeConfig recompute, Data& data, int batch,
                             int64_t* activation_bytes = nullptr, Precision precision = Precision::fp32) {
  const ParamLayout layout = build_layout(c);
  std::vector<float> params(static_cast<size_t>(layout.total_elements)), grads(params.size(), 0.0f);
  initialize_parameters(layout, 11, params.data());
  WholeModel model(c, layout, precision, recompute, batch, 5);
  model.bind(params.data(), grads.data());
  model.forward_backward(data.batch(batch, c.seq_length), 1.0f, 1);
  if (activation_bytes) *activation_bytes = model.activation_bytes();
  return grads;
}

void check_gradients_against_double_reference(bool llama) {
  const ModelConfig c = tiny(llama);
  mt::testing::check_gradients_against_double_reference(c, build_layout(c), 2);
}

}  // namespace

TEST(Transformer, GptGradientsMatchADoublePrecisionReference) { check_gradients_against_double_reference(false); }
TEST(Transformer, LlamaGradientsMatchADoublePrecisionReference) { check_gradients_against_double_reference(true); }

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
    EXPECT_EQ(none_bytes, WholeModel::planned_activation_bytes(c, Precision::fp32, {}, 2, c.num_layers));
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

namespace {

// The grads of the first two samples of `data` run as two micro-batches of one sample each.
std::vector<float> grads_one_sample_at_a_time(const ModelConfig& c, Data& data) {
  const ParamLayout layout = build_layout(c);
  std::vector<float> params(static_cast<size_t>(layout.total_elements)), grads(params.size(), 0.0f);
  initialize_parameters(layout, 11, params.data());
  WholeModel model(c, layout, Precision::fp32, {}, 1, 5);
  model.bind(params.data(), grads.data());
  const int t = c.seq_length;
  for (int b = 0; b < 2; ++b) {
    MicroBatch one{1, t, data.tokens.data() + b * t, data.labels.data() + b * t, data.mask.data() + b * t,
                   data.positions.data() + b * t, nullptr, data.row_ids.data() + b * t};
    model.forward_backward(one, 1.0f, 1);
  }
  return grads;
}

}  // namespace

TEST(Transformer, DropoutDoesNotDependOnHowSamplesAreBatched) {
  ModelConfig c = tiny(false);
  c.hidden_dropout = 0.3f;
  Data data = make_data(c, 2, 6);
  const auto together = grads_for(c, {}, data, 2);
  // The same two samples as two micro-batches of one: same dropout masks (keyed by global row).
  const std::vector<float> grads = grads_one_sample_at_a_time(c, data);
  for (size_t i = 0; i < grads.size(); ++i) ASSERT_NEAR(grads[i], together[i], 1e-5 + 1e-4 * std::fabs(together[i])) << i;
  // and dropout is active: other grads than without it
  c.hidden_dropout = 0.0f;
  EXPECT_NE(grads_for(c, {}, data, 2), together);
}

// Attention dropout (drawn inside the attention kernel, never stored): selective and full
// recompute draw the same mask again (bit-identical grads), samples batched differently keep
// their masks (keyed by global token), GPT and LLaMA (GQA); and it is active.
TEST(Transformer, AttentionDropoutIsTheSameUnderRecomputeAndBatching) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt");
    ModelConfig c = tiny(llama);
    c.attention_dropout = 0.3f;
    Data data = make_data(c, 2, 6);
    const auto none = grads_for(c, {}, data, 2);
    EXPECT_EQ(none, grads_for(c, {RecomputeGranularity::selective, RecomputeMethod::uniform, 1}, data, 2));
    EXPECT_EQ(none, grads_for(c, {RecomputeGranularity::full, RecomputeMethod::uniform, 1}, data, 2));
    const std::vector<float> grads = grads_one_sample_at_a_time(c, data);
    for (size_t i = 0; i < grads.size(); ++i) ASSERT_NEAR(grads[i], none[i], 1e-5 + 1e-4 * std::fabs(none[i])) << i;
    c.attention_dropout = 0.0f;
    EXPECT_NE(grads_for(c, {}, data, 2), none);
  }
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
