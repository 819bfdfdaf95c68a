// BERT (ModelConfig::bert: model/layers/bert_head.h, the non-causal attention, the token-type
// embedding) against Megatron-Core's own BertModel: tests/golden/bert/bert_goldens.json, written by
// tests/golden/bert/make_bert_goldens.py (megatron-core 0.16.1 and CPU torch in a venv outside the
// repository; tests/golden/bert/README.md). Each case loads Megatron's weights by name into a
// one-rank layout (every tensor of mt's layout must be in the golden and the golden may have no
// other), runs a stage's forward and backward on Megatron's batch (padding, token types, masked
// positions, sentence order) with pretrain_bert.py's loss (lm loss = masked-token mean, plus the
// sop loss's sample mean with the binary head), and compares the lm and sop losses and every
// weight grad. Beside it: the presets' shapes and parameter counts, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "core/error.h"
#include "model/layout.h"
#include "model/stage.h"

using namespace mt;
using namespace mt::model;
using nlohmann::json;

namespace {

const json& goldens() {
  static const json data = [] {
    std::ifstream in(MT_SOURCE_DIR "/tests/golden/bert/bert_goldens.json");
    if (!in) throw std::runtime_error("tests/golden/bert/bert_goldens.json (written by make_bert_goldens.py)");
    return json::parse(in);
  }();
  return data;
}

const json& golden_case(const std::string& name) {
  for (const json& c : goldens()["cases"]) {
    if (c["name"] == name) return c;
  }
  throw std::runtime_error("no golden case " + name);
}

ModelConfig config_of(const json& g) {
  ModelConfig c = preset("tiny-bert");
  c.name = g["name"];
  c.num_layers = g["layers"];
  c.hidden_size = g["hidden"];
  c.ffn_hidden_size = g["ffn"];
  c.num_attention_heads = g["heads"];
  c.num_query_groups = c.num_attention_heads;
  c.seq_length = g["seq"];
  c.max_position_embeddings = g["max_pos"];
  c.vocab_size = g["vocab"];
  c.make_vocab_size_divisible_by = static_cast<int>(c.vocab_size);  // no padding columns
  c.norm_epsilon = 1e-5f;
  c.bert_binary_head = g["binary_head"];
  return c;
}

template <typename T>
std::vector<T> values(const json& array) {
  return array.get<std::vector<T>>();
}

// One golden case run through a one-rank stage.
struct BertRun {
  double lm_loss = 0, sop_loss = 0;
  ParamLayout layout;
  std::vector<float> grads;
  std::vector<float> grad_of(const std::string& name) const {
    const ParamEntry& e = layout.find(name);
    return {grads.begin() + e.offset, grads.begin() + e.offset + e.numel};
  }
};

BertRun run_golden(const json& g, const ModelConfig& config) {
  BertRun run;
  run.layout = build_layout(config);
  std::vector<float> params(static_cast<size_t>(run.layout.total_elements), 0.0f);
  run.grads.assign(params.size(), 0.0f);
  for (const ParamEntry& e : run.layout.entries) {
    if (!g["weights"].contains(e.name)) throw std::runtime_error("the golden has no " + e.name);
    const std::vector<float> w = values<float>(g["weights"][e.name]["values"]);
    if (static_cast<int64_t>(w.size()) != e.numel) throw std::runtime_error(e.name + ": golden size differs");
    std::copy(w.begin(), w.end(), params.begin() + e.offset);
  }
  EXPECT_EQ(g["weights"].size(), run.layout.entries.size()) << "the golden has tensors mt's layout has not";

  const int batch = static_cast<int>(g["lengths"].size()), seq = config.seq_length;
  const std::vector<int32_t> tokens = values<int32_t>(g["tokens"]), labels = values<int32_t>(g["labels"]);
  const std::vector<int32_t> types = values<int32_t>(g["token_types"]), order = values<int32_t>(g["is_random"]);
  const std::vector<float> loss_mask = values<float>(g["loss_mask"]);
  const std::vector<int32_t> key_lengths = values<int32_t>(g["lengths"]);
  std::vector<int32_t> positions;
  std::vector<int64_t> row_ids;
  for (int r = 0; r < batch * seq; ++r) {
    positions.push_back(r % seq);
    row_ids.push_back(r);
  }

  const backend::Ops& ops = backend::cpu_ops();
  GemmWeights weights(ops, Precision::fp32, run.layout.total_elements);
  weights.refresh(params.data());
  const ParallelContext single;
  StageOptions options;
  options.micro_batch_size = batch;
  Stage stage(config, run.layout, 0, single, ops, weights, options);
  stage.bind(params.data(), run.grads.data());
  double loss_sums[2] = {0, 0}, sop_sums[2] = {0, 0};  // the CPU table's device memory is the host's
  MicroBatch micro{batch, seq, tokens.data(), labels.data(), loss_mask.data(), positions.data(), nullptr,
                   row_ids.data(), loss_sums};
  micro.key_lengths = key_lengths.data();
  if (config.bert_binary_head) {
    micro.token_types = types.data();
    micro.sentence_order = order.data();
    micro.sop_sums = sop_sums;
  }
  stage.forward(0, micro, nullptr, ForwardPass{1, true});
  run.lm_loss = loss_sums[0] / loss_sums[1];
  run.sop_loss = config.bert_binary_head ? sop_sums[0] / sop_sums[1] : 0.0;
  stage.set_sop_loss_grad_factor(1.0f);  // d(lm + sop) / d sop
  stage.backward(0, nullptr, static_cast<float>(1.0 / loss_sums[1]));
  return run;
}

// max |actual - expected| <= tol max(max |expected|, floor).
void expect_close(const std::string& what, const std::vector<float>& actual, const std::vector<float>& expected,
                  double tol, double floor = 1e-3) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = floor, worst = 0;
  size_t at = 0;
  for (float e : expected) scale = std::max(scale, std::abs(double(e)));
  for (size_t i = 0; i < actual.size(); ++i) {
    const double d = std::abs(double(actual[i]) - expected[i]);
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  EXPECT_LE(worst, tol * scale) << what << "[" << at << "] = " << actual[at] << ", Megatron " << expected[at];
}

void expect_matches_megatron(const std::string& name) {
  const json& g = golden_case(name);
  const ModelConfig config = config_of(g);
  const BertRun run = run_golden(g, config);
  EXPECT_NEAR(run.lm_loss, g["lm_loss"].get<double>(), 1e-5 * g["lm_loss"].get<double>());
  if (config.bert_binary_head) {
    EXPECT_NEAR(run.sop_loss, g["sop_loss"].get<double>(), 1e-5 * g["sop_loss"].get<double>());
  }
  // Floor 1e-2: the key biases' grads vanish analytically (a softmax does not see a bias added to
  // every score of its row), so both sides hold rounding only.
  for (const ParamEntry& e : run.layout.entries) {
    expect_close(e.name + " grad", run.grad_of(e.name), values<float>(g["grads"][e.name]), 1e-4, 1e-2);
  }
}

TEST(BertMegatron, LossesAndEveryGradMatchMegatronCoreBertModelWithTheBinaryHead) {
  expect_matches_megatron("binary_head");
}

TEST(BertMegatron, LossesAndEveryGradMatchMegatronCoreBertModelWithoutTheBinaryHead) {
  expect_matches_megatron("no_binary_head");
}

TEST(BertConfig, PresetsHaveMegatronsShapesAndTheirParameterCountsAreTheLayouts) {
  const ModelConfig big = preset("bert-345m");
  EXPECT_TRUE(big.bert);
  EXPECT_TRUE(big.bert_binary_head);
  EXPECT_EQ(big.num_layers, 24);
  EXPECT_EQ(big.hidden_size, 1024);
  EXPECT_EQ(big.num_attention_heads, 16);
  EXPECT_EQ(big.ffn_hidden_size, 4096);
  EXPECT_EQ(big.seq_length, 512);
  EXPECT_EQ(big.max_position_embeddings, 512);
  EXPECT_EQ(big.padded_vocab_size(), 30592);  // the uncased WordPiece 30522, padded to 128
  for (bool binary : {true, false}) {
    ModelConfig c = preset("tiny-bert");
    c.bert_binary_head = binary;
    const ParamLayout layout = build_layout(c);
    int64_t elements = 0;
    for (const ParamEntry& e : layout.entries) elements += e.numel;
    EXPECT_EQ(parameter_count(c, true), elements) << "binary head " << binary;
  }
  // 336M: Megatron's "345M" (the published name) with the binary head.
  EXPECT_EQ(parameter_count(big, true), 336'297'858);
}

TEST(BertConfig, RefusesWhatMegatronsBertIsNot) {
  ModelConfig gpt = preset("tiny-gpt");
  gpt.bert_binary_head = false;
  EXPECT_THROW(gpt.validate(), UsageError);  // --bert-no-binary-head without BERT
  ModelConfig c = preset("tiny-bert");
  c.swiglu = true;
  EXPECT_THROW(c.validate(), UsageError);
  c = preset("tiny-bert");
  c.untie_embeddings_and_output_weights = true;
  EXPECT_THROW(c.validate(), UsageError);
  c = preset("tiny-bert");
  c.position_embedding = PositionEmbedding::rope;
  EXPECT_THROW(c.validate(), UsageError);
  EXPECT_NO_THROW(preset("tiny-bert").validate());
  EXPECT_NO_THROW(preset("bert-345m").validate());
}

}  // namespace
