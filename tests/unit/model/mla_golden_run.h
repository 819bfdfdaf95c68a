// What the Megatron-Core MLA goldens share (tests/unit/model/test_mla_megatron.cpp and
// tests/unit/model/test_yarn.cpp, which are its tests): an aligned buffer for a block's
// BufferSource, the scaled elementwise comparison, the one-layer model config of a case, and one MlaAttention layer run forward and
// backward on a golden case's batch (its "batch", "seq", "x" and "dy") from weights already laid out.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "model/config.h"
#include "model/layers/mla_attention.h"
#include "model/layout.h"
#include "model/parallel_context.h"
#include "model/precision_gemm.h"

namespace mt::model::testing {

// A 64-byte aligned float buffer for a block's BufferSource.
struct Aligned {
  explicit Aligned(int64_t count) : storage(static_cast<size_t>(count + 16), 0.0f) {}
  float* data() {
    auto address = reinterpret_cast<uintptr_t>(storage.data());
    return storage.data() + (64 - address % 64) % 64 / sizeof(float);
  }
  std::vector<float> storage;
};

// |a - b| <= tol * (|b| + rms(b)), elementwise; the worst error is recorded as a test property.
inline void expect_close(const float* a, const std::vector<float>& b, double tol, const std::string& what) {
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

// The one-layer MLA model of a golden case (its "hidden", "heads", "seq" and MLA ranks and dims), as
// make_mla_goldens.py builds Megatron's; validated, so a caller that changes a field validates again.
inline ModelConfig mla_golden_config(const nlohmann::json& g) {
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

struct MlaRun {
  float softmax_scale = 0;
  std::vector<float> y, dx;  // (batch * seq, hidden) output and input grad
  std::vector<float> grads;  // the whole layout's grads
};

// Layer 0's MlaAttention of `config` over `params` (the whole `layout`), forward on g["x"] and
// backward from g["dy"], rows at positions 0..seq-1 per sample.
inline MlaRun run_mla_layer(const ModelConfig& config, const ParamLayout& layout, const std::vector<float>& params,
                            const nlohmann::json& g) {
  MlaRun run;
  run.grads.assign(params.size(), 0.0f);
  const backend::Ops& ops = backend::cpu_ops();
  GemmWeights weights(ops, Precision::fp32, layout.total_elements);
  weights.refresh(params.data());
  PrecisionGemm gemm(ops, weights);
  gemm.bind(params.data(), run.grads.data());
  const ParallelContext single;
  const LayerContext ctx{config, ops, ops.default_stream(), single, gemm, params.data(), run.grads.data(), 0, nullptr};

  MlaAttention mla(config, 0);
  mla.bind(layout);
  run.softmax_scale = mla.softmax_scale();
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
  run.y.resize(x.size());
  run.dx.resize(x.size());
  mla.forward(ctx, pass, x.data(), *saved, *workspace, SequenceParallelBuffers{}, run.y.data());
  mla.backward(ctx, pass, dy.data(), x.data(), *saved, *workspace, SequenceParallelBuffers{}, run.dx.data());
  return run;
}

}  // namespace mt::model::testing
