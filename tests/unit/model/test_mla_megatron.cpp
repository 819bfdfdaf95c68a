// Multi-latent attention (model/layers/mla_attention.h) against Megatron-Core's own
// MLASelfAttention: tests/golden/mla/mla_goldens.json, written by
// tests/golden/mla/make_mla_goldens.py (megatron-core 0.16.1 and CPU torch in a venv outside the
// repository; tests/golden/mla/README.md). Each case loads Megatron's weights by their names under
// decoder.layers.0.self_attention. (every tensor Megatron has must exist in mt's layout, with its
// shape, and mt may have no other), runs the layer's forward and backward on Megatron's input and
// output grad, and compares the output, the input grad and every weight grad. A reference written
// from the same reading of Megatron would share its misreadings (the RoPE interleave, the norms'
// placement, the softmax scale); this one is Megatron's code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "model/layers/mla_attention.h"
#include "model/layout.h"
#include "model/parallel_context.h"
#include "model/precision_gemm.h"

using namespace mt;
using namespace mt::model;
using nlohmann::json;

namespace {

const json& goldens() {
  static const json data = [] {
    std::ifstream in(MT_SOURCE_DIR "/tests/golden/mla/mla_goldens.json");
    if (!in) throw std::runtime_error("tests/golden/mla/mla_goldens.json (written by make_mla_goldens.py)");
    return json::parse(in);
  }();
  return data;
}

ModelConfig config_of(const json& g) {
  ModelConfig c;
  c.num_layers = 1;
  c.hidden_size = g["hidden"];
  c.ffn_hidden_size = 8;
  c.num_attention_heads = g["heads"];
  c.num_query_groups = c.num_attention_heads;
  c.seq_length = g["seq"];
  c.max_position_embeddings = c.seq_length;
  c.vocab_size = 16;
  c.make_vocab_size_divisible_by = 16;
  c.swiglu = true;
  c.normalization = Normalization::rmsnorm;
  c.norm_epsilon = 1e-5f;
  c.position_embedding = PositionEmbedding::rope;
  c.rotary_base = 10000.0f;
  c.untie_embeddings_and_output_weights = true;
  c.add_bias_linear = false;
  c.multi_latent_attention = true;
  c.q_lora_rank = g["q_lora_rank"];
  c.kv_lora_rank = g["kv_lora_rank"];
  c.qk_head_dim = g["qk_head_dim"];
  c.qk_pos_emb_head_dim = g["qk_pos_emb_head_dim"];
  c.v_head_dim = g["v_head_dim"];
  c.qk_layernorm = g["qk_layernorm"];
  c.validate();
  return c;
}

// A 64-byte aligned float buffer for a block's BufferSource.
struct Aligned {
  explicit Aligned(int64_t count) : storage(static_cast<size_t>(count + 16), 0.0f) {}
  float* data() {
    auto address = reinterpret_cast<uintptr_t>(storage.data());
    return storage.data() + (64 - address % 64) % 64 / sizeof(float);
  }
  std::vector<float> storage;
};

// |a - b| <= tol * (|b| + rms(b)), elementwise.
void expect_close(const float* a, const std::vector<float>& b, double tol, const std::string& what) {
  double squares = 0;
  for (float v : b) squares += double(v) * v;
  const double scale = std::sqrt(squares / std::max<size_t>(1, b.size()));
  ASSERT_GT(scale, 0.0) << what;
  double worst = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double error = std::fabs(double(a[i]) - b[i]) / (std::fabs(b[i]) + scale);
    worst = std::max(worst, error);
    ASSERT_LE(error, tol) << what << "[" << i << "]: mt " << a[i] << ", Megatron " << b[i];
  }
  ::testing::Test::RecordProperty(what, std::to_string(worst));
}

void check_case(const json& g) {
  const ModelConfig c = config_of(g);
  const ParamLayout layout = build_layout(c);
  const std::string prefix = layer_prefix(0) + "self_attention.";
  std::vector<float> params(static_cast<size_t>(layout.total_elements), 0.0f), grads(params.size(), 0.0f);
  for (const auto& [name, tensor] : g["weights"].items()) {
    const ParamEntry* entry = layout.try_find(prefix + name);
    ASSERT_NE(entry, nullptr) << "Megatron's " << name << " has no tensor of that name in mt";
    EXPECT_EQ(entry->global_shape, tensor["shape"].get<std::vector<int64_t>>()) << name;
    const std::vector<float> values = tensor["values"].get<std::vector<float>>();
    ASSERT_EQ(static_cast<int64_t>(values.size()), entry->numel) << name;
    std::copy(values.begin(), values.end(), params.begin() + entry->offset);
  }
  int mt_tensors = 0;
  for (const ParamEntry& e : layout.entries) mt_tensors += e.name.rfind(prefix, 0) == 0 ? 1 : 0;
  EXPECT_EQ(mt_tensors, static_cast<int>(g["weights"].size())) << "mt has tensors Megatron's MLA has not";

  const backend::Ops& ops = backend::cpu_ops();
  GemmWeights weights(ops, Precision::fp32, layout.total_elements);
  weights.refresh(params.data());
  PrecisionGemm gemm(ops, weights);
  gemm.bind(params.data(), grads.data());
  const ParallelContext single;
  const LayerContext ctx{c, ops, ops.default_stream(), single, gemm, params.data(), grads.data(), 0, nullptr};

  MlaAttention mla(c, 0);
  mla.bind(layout);
  EXPECT_FLOAT_EQ(mla.softmax_scale(), static_cast<float>(g["softmax_scale"].get<double>()));
  const int batch = g["batch"], seq = g["seq"];
  const int64_t rows = int64_t{batch} * seq;
  std::vector<int32_t> positions;
  std::vector<int64_t> row_ids;
  for (int64_t r = 0; r < rows; ++r) {
    positions.push_back(static_cast<int32_t>(r % seq));
    row_ids.push_back(r);
  }
  const MicroBatch micro{batch, seq, nullptr, nullptr, nullptr, positions.data(), nullptr, row_ids.data()};
  const LayerPass pass{micro, rows, rows, row_ids.data(), 0, true};
  const ActivationRows activation_rows{rows, rows};
  BufferSource count_saved, count_workspace;
  mla.lay_out_saved(count_saved, activation_rows, true);
  mla.lay_out_workspace(count_workspace, activation_rows, false);
  Aligned saved_block(count_saved.floats()), workspace_block(count_workspace.floats());
  BufferSource saved_source(saved_block.data()), workspace_source(workspace_block.data());
  auto saved = mla.lay_out_saved(saved_source, activation_rows, true);
  auto workspace = mla.lay_out_workspace(workspace_source, activation_rows, false);

  const std::vector<float> x = g["x"].get<std::vector<float>>(), dy = g["dy"].get<std::vector<float>>();
  std::vector<float> y(x.size()), dx(x.size());
  mla.forward(ctx, pass, x.data(), *saved, *workspace, SequenceParallelBuffers{}, y.data());
  mla.backward(ctx, pass, dy.data(), x.data(), *saved, *workspace, SequenceParallelBuffers{}, dx.data());

  const double tol = 1e-5;
  expect_close(y.data(), g["y"].get<std::vector<float>>(), tol, "output");
  expect_close(dx.data(), g["dx"].get<std::vector<float>>(), tol, "input grad");
  for (const auto& [name, values] : g["grads"].items()) {
    const ParamEntry& entry = layout.find(prefix + name);
    expect_close(grads.data() + entry.offset, values.get<std::vector<float>>(), tol, "grad of " + name);
  }
}

}  // namespace

TEST(MlaMegatron, GoldensNameTheirGenerator) {
  const json& generator = goldens()["generator"];
  EXPECT_EQ(generator["megatron_core"], "0.16.1");
  EXPECT_EQ(goldens()["cases"].size(), 2u);
}

TEST(MlaMegatron, ForwardAndBackwardMatchMegatronCore) {
  for (const json& g : goldens()["cases"]) {
    SCOPED_TRACE(g["name"].get<std::string>());
    check_case(g);
  }
}
