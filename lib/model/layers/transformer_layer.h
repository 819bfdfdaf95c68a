// One decoder layer (Megatron's TransformerLayer, pre-norm):
//   x_mid = x_in + dropout(attention(input_layernorm(x_in)))
//   x_out = x_mid + dropout(mlp(pre_mlp_layernorm(x_mid)))
// on the rows of the sequence-parallel region, the sublayers' collectives placed by their
// linears. What it keeps between forward and backward (LayerActivations) is owned by the stage's
// activation pool, by recompute policy. Tested through the model's finite differences, recompute
// equivalence and the PyTorch goldens (tests/unit/model/test_transformer.cpp, tests/golden/).
#pragma once

#include "model/layers/attention.h"
#include "model/layers/layer_context.h"
#include "model/layers/mlp.h"
#include "model/layers/norm.h"

namespace mt::model {

// What one layer keeps between forward and backward; sequence rows S, rows N. Pointers either
// own a per-layer buffer or share a workspace buffer, by recompute policy.
struct LayerActivations {
  float* x_in = nullptr;    // (S, C) layer input (residual stream)
  float* norm1 = nullptr;   // (S, C)
  float* mean1 = nullptr;   // (S), LayerNorm only
  float* rstd1 = nullptr;   // (S)
  float* qkv = nullptr;     // (N, qkv width), q and k after RoPE
  float* attn = nullptr;    // (N, attention width); null: selective recompute rebuilds it
  float* lse = nullptr;     // (B, local heads, T)
  float* x_mid = nullptr;   // (S, C) residual after attention
  float* norm2 = nullptr;   // (S, C)
  float* mean2 = nullptr;   // (S)
  float* rstd2 = nullptr;   // (S)
  float* fc1 = nullptr;     // (N, fc1 width): pre-activation
  float* act = nullptr;     // (N, ffn)
};

// Temporaries of one pass, shared by every layer of a stage.
struct LayerWorkspace {
  float* tmp = nullptr;       // (S, C) branch outputs and their grads
  float* d_mid = nullptr;     // (S, C)
  float* d_norm = nullptr;    // (S, C)
  float* d_part = nullptr;    // (S, C)
  float* attn = nullptr;      // (N, attention width): selectively recomputed core attention
  float* lse = nullptr;       // (B, local heads, T)
  SelfAttention::Buffers attention;
  Mlp::Buffers mlp;
};

class TransformerLayer {
 public:
  static void declare(ParamDeclarations& declarations, const ModelConfig& config, int layer);
  TransformerLayer(const ModelConfig& config, const ParamLayout& layout, int layer);

  int layer() const { return layer_; }
  const SelfAttention& attention() const { return attention_; }
  const Mlp& mlp() const { return mlp_; }
  bool layernorm() const { return norm1_.has_mean(); }

  // x_out (S, C) from x_in (S, C); `acts` receives what backward needs (acts.x_in is filled from
  // x_in unless they are the same buffer).
  void forward(const LayerContext& ctx, const LayerPass& pass, LayerActivations& acts, const float* x_in,
               float* x_out, const LayerWorkspace& work) const;
  // d_in (S, C) from d_out (S, C); parameter grads accumulate.
  void backward(const LayerContext& ctx, const LayerPass& pass, LayerActivations& acts, const float* d_out,
                float* d_in, const LayerWorkspace& work) const;

 private:
  SelfAttention::Saved attention_saved(LayerActivations& acts, const LayerWorkspace& work) const;
  kernels::DropoutKey dropout_key(const LayerContext& ctx, const LayerPass& pass, const char* site) const;

  int layer_;
  float hidden_dropout_;
  Norm norm1_;
  SelfAttention attention_;
  Norm norm2_;
  Mlp mlp_;
};

}  // namespace mt::model
