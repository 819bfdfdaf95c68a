// Multi-token prediction (model/layers/mtp.h) against Megatron-Core's own GPTModel with its MTP
// block: tests/golden/mtp/mtp_goldens.json, written by tests/golden/mtp/make_mtp_goldens.py
// (megatron-core 0.16.1 and CPU torch in a venv outside the repository; tests/golden/mtp/README.md).
// Each case loads Megatron's weights (under mt's names: every tensor mt's layout has must be in the
// golden, and no other), runs one training forward and backward of the whole model as one stage on
// Megatron's batch, with the LM loss's mean and lambda / D times each depth's mean as the
// objective (Megatron's backward for one micro-batch), and compares the LM loss, each depth's MTP
// loss and every parameter's grad. A reference written from the same reading of Megatron would
// share its misreadings (which way the tokens and labels roll, the concatenation order, where
// h comes from); this one is Megatron's code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "model/layout.h"
#include "model/stage.h"

using namespace mt;
using namespace mt::model;
using nlohmann::json;

namespace {

const json& goldens() {
  static const json data = [] {
    std::ifstream in(MT_SOURCE_DIR "/tests/golden/mtp/mtp_goldens.json");
    if (!in) throw std::runtime_error("tests/golden/mtp/mtp_goldens.json (written by make_mtp_goldens.py)");
    return json::parse(in);
  }();
  return data;
}

ModelConfig config_of(const json& g) {
  ModelConfig c;
  c.num_layers = g["num_layers"];
  c.hidden_size = g["hidden"];
  c.ffn_hidden_size = g["ffn"];
  c.num_attention_heads = g["heads"];
  c.num_query_groups = g["query_groups"];
  c.seq_length = g["seq"];
  c.max_position_embeddings = c.seq_length;
  c.vocab_size = g["vocab"];
  c.make_vocab_size_divisible_by = 16;
  c.swiglu = true;
  c.normalization = Normalization::rmsnorm;
  c.norm_epsilon = 1e-5f;
  c.position_embedding = PositionEmbedding::rope;
  c.rotary_base = 10000.0f;
  c.untie_embeddings_and_output_weights = g["untie"];
  c.add_bias_linear = false;
  c.mtp_num_layers = g["mtp_num_layers"];
  c.mtp_loss_scaling_factor = g["mtp_loss_scaling_factor"];
  c.validate();
  return c;
}

struct Result {
  double lm_loss = 0;
  std::vector<double> mtp_losses;
  std::vector<float> grads;
};

// One training forward and backward of the case on mt's stage.
Result run(const ModelConfig& c, const ParamLayout& layout, const json& g) {
  const backend::Ops& ops = backend::cpu_ops();
  const int batch = g["batch"], seq = g["seq"], depths = c.mtp_num_layers;
  std::vector<float> params(static_cast<size_t>(layout.total_elements), 0.0f), grads(params.size(), 0.0f);
  for (const ParamEntry& entry : layout.entries) {
    const json& tensor = g["weights"].at(entry.name);
    std::vector<int64_t> shape = tensor["shape"];
    EXPECT_EQ(shape, entry.global_shape) << entry.name;
    const std::vector<float> values = tensor["values"];
    std::copy(values.begin(), values.end(), params.begin() + entry.offset);
  }
  EXPECT_EQ(layout.entries.size(), g["weights"].size()) << "Megatron has tensors mt's layout has not";

  std::vector<int32_t> tokens = g["tokens"], labels = g["labels"], positions;
  std::vector<float> mask = g["loss_mask"];
  std::vector<int64_t> row_ids;
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq; ++t) {
      positions.push_back(t);
      row_ids.push_back(static_cast<int64_t>(b) * seq + t);
    }
  }
  double sums[2] = {0, 0};
  std::vector<double> mtp_sums(static_cast<size_t>(2 * depths), 0.0);
  MicroBatch micro{batch, seq, tokens.data(), labels.data(), mask.data(), positions.data(), nullptr, row_ids.data(),
                   sums};
  micro.mtp_loss_sums = mtp_sums.data();
  // Each depth's tokens: the mask rolled left k + 1 times per sample.
  std::vector<float> mtp_scales;
  for (int k = 0; k < depths; ++k) {
    double counted = 0;
    for (int b = 0; b < batch; ++b) {
      for (int t = k + 1; t < seq; ++t) counted += mask[static_cast<size_t>(b * seq + t)];
    }
    mtp_scales.push_back(static_cast<float>(c.mtp_loss_scaling_factor / depths / counted));
  }
  micro.mtp_loss_grad_scales = mtp_scales.data();

  ParallelContext parallel;
  GemmWeights weights(ops, Precision::fp32, layout.total_elements);
  Stage stage(c, layout, 0, parallel, ops, weights, StageOptions{.micro_batch_size = batch, .seed = 1});
  stage.bind(params.data(), grads.data());
  weights.refresh(params.data());
  stage.forward(0, micro, nullptr, ForwardPass{1, true});
  stage.backward(0, nullptr, static_cast<float>(1.0 / sums[1]));

  Result result;
  result.lm_loss = sums[0] / sums[1];
  for (int k = 0; k < depths; ++k) result.mtp_losses.push_back(mtp_sums[2 * k] / mtp_sums[2 * k + 1]);
  result.grads = std::move(grads);
  return result;
}

void expect_case(const json& g) {
  SCOPED_TRACE(g["name"].get<std::string>());
  const ModelConfig c = config_of(g);
  const ParamLayout layout = build_layout(c);
  const Result r = run(c, layout, g);
  EXPECT_NEAR(r.lm_loss, g["lm_loss"].get<double>(), 1e-5);
  const std::vector<double> mtp = g["mtp_losses"];
  ASSERT_EQ(r.mtp_losses.size(), mtp.size());
  for (size_t k = 0; k < mtp.size(); ++k) EXPECT_NEAR(r.mtp_losses[k], mtp[k], 1e-5) << "mtp_" << k + 1 << " loss";
  for (const ParamEntry& entry : layout.entries) {
    const std::vector<float> expected = g["grads"].at(entry.name);
    float scale = 0;
    for (float v : expected) scale = std::max(scale, std::abs(v));
    int wrong = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      const float got = r.grads[static_cast<size_t>(entry.offset) + i];
      if (std::abs(got - expected[i]) > 1e-5f * std::max(scale, 1.0f)) ++wrong;
    }
    EXPECT_EQ(wrong, 0) << entry.name << " (largest |grad| " << scale << ")";
  }
}

}  // namespace

TEST(MtpMegatron, TwoDepthsOfALlamaShapedModelMatchMegatronCore) { expect_case(goldens()["cases"][0]); }
TEST(MtpMegatron, OneDepthWithAnUntiedOutputLayerMatchesMegatronCore) { expect_case(goldens()["cases"][1]); }
