// One decoder layer (see transformer_layer.h).
#include "model/layers/transformer_layer.h"

namespace mt::model {

void TransformerLayer::declare(ParamDeclarations& declarations, const ModelConfig& config, int layer) {
  const std::string prefix = layer_prefix(layer);
  Norm::declare(declarations, config, prefix + "input_layernorm", layer);
  SelfAttention::declare(declarations, config, layer);
  Norm::declare(declarations, config, prefix + "pre_mlp_layernorm", layer);
  Mlp::declare(declarations, config, layer);
}

TransformerLayer::TransformerLayer(const ModelConfig& config, const ParamLayout& layout, int layer)
    : layer_(layer),
      hidden_dropout_(config.hidden_dropout),
      norm1_(config, layout, layer_prefix(layer) + "input_layernorm"),
      attention_(config, layout, layer),
      norm2_(config, layout, layer_prefix(layer) + "pre_mlp_layernorm"),
      mlp_(config, layout, layer) {}

SelfAttention::Saved TransformerLayer::attention_saved(LayerActivations& acts, const LayerWorkspace& work) const {
  if (acts.attn) return SelfAttention::Saved{acts.qkv, acts.attn, acts.lse};
  return SelfAttention::Saved{acts.qkv, work.attn, work.lse};
}

kernels::DropoutKey TransformerLayer::dropout_key(const LayerContext& ctx, const LayerPass& pass,
                                                  const char* site) const {
  return kernels::DropoutKey{ctx.seed, dropout_stream(site, layer_), pass.iteration, hidden_dropout_};
}

void TransformerLayer::forward(const LayerContext& ctx, const LayerPass& pass, LayerActivations& a, const float* x_in,
                               float* x_out, const LayerWorkspace& w) const {
  const backend::Ops& ops = ctx.ops;
  const int64_t s = pass.sequence_rows, c = ctx.config.hidden_size;
  const int64_t bytes = static_cast<int64_t>(sizeof(float)) * s * c;
  if (a.x_in != x_in) ops.copy(a.x_in, x_in, bytes, backend::CopyKind::device_to_device, ctx.stream);
  norm1_.forward(ctx, a.x_in, a.norm1, a.mean1, a.rstd1, s);
  SelfAttention::Saved saved = attention_saved(a, w);
  attention_.forward(ctx, pass, a.norm1, saved, w.attention, w.tmp);
  kernels::DropoutKey key = dropout_key(ctx, pass, "attention-output");
  if (pass.training && key.p > 0) {
    ops.dropout_forward(w.tmp, s, static_cast<int>(c), pass.sequence_row_ids, 0, key, ctx.stream);
  }
  ops.copy(a.x_mid, a.x_in, bytes, backend::CopyKind::device_to_device, ctx.stream);
  ops.add_inplace(a.x_mid, w.tmp, s * c, ctx.stream);

  norm2_.forward(ctx, a.x_mid, a.norm2, a.mean2, a.rstd2, s);
  mlp_.forward(ctx, pass, a.norm2, Mlp::Saved{a.fc1, a.act}, w.mlp, w.tmp);
  key = dropout_key(ctx, pass, "mlp-output");
  if (pass.training && key.p > 0) {
    ops.dropout_forward(w.tmp, s, static_cast<int>(c), pass.sequence_row_ids, 0, key, ctx.stream);
  }
  ops.copy(x_out, a.x_mid, bytes, backend::CopyKind::device_to_device, ctx.stream);
  ops.add_inplace(x_out, w.tmp, s * c, ctx.stream);
}

void TransformerLayer::backward(const LayerContext& ctx, const LayerPass& pass, LayerActivations& a,
                                const float* d_out, float* d_in, const LayerWorkspace& w) const {
  const backend::Ops& ops = ctx.ops;
  const int64_t s = pass.sequence_rows, c = ctx.config.hidden_size;
  const int64_t bytes = static_cast<int64_t>(sizeof(float)) * s * c;
  kernels::DropoutKey key = dropout_key(ctx, pass, "mlp-output");

  // MLP branch: x_out = x_mid + dropout(fc2(act(fc1(norm2(x_mid))))).
  ops.copy(w.tmp, d_out, bytes, backend::CopyKind::device_to_device, ctx.stream);
  if (key.p > 0) ops.dropout_backward(w.tmp, s, static_cast<int>(c), pass.sequence_row_ids, 0, key, ctx.stream);
  mlp_.backward(ctx, pass, w.tmp, a.norm2, Mlp::Saved{a.fc1, a.act}, w.mlp, w.d_norm);
  norm2_.backward(ctx, w.d_norm, a.x_mid, a.mean2, a.rstd2, w.d_part, s);
  ops.copy(w.d_mid, d_out, bytes, backend::CopyKind::device_to_device, ctx.stream);
  ops.add_inplace(w.d_mid, w.d_part, s * c, ctx.stream);

  // Attention branch: x_mid = x_in + dropout(proj(attention(rope(qkv(norm1(x_in)))))).
  SelfAttention::Saved saved = attention_saved(a, w);
  if (!a.attn) attention_.core_forward(ctx, pass, saved);  // selective recompute of the core attention
  ops.copy(w.tmp, w.d_mid, bytes, backend::CopyKind::device_to_device, ctx.stream);
  key = dropout_key(ctx, pass, "attention-output");
  if (key.p > 0) ops.dropout_backward(w.tmp, s, static_cast<int>(c), pass.sequence_row_ids, 0, key, ctx.stream);
  attention_.backward(ctx, pass, w.tmp, a.norm1, saved, w.attention, w.d_norm);
  norm1_.backward(ctx, w.d_norm, a.x_in, a.mean1, a.rstd1, w.d_part, s);
  ops.copy(d_in, w.d_mid, bytes, backend::CopyKind::device_to_device, ctx.stream);
  ops.add_inplace(d_in, w.d_part, s * c, ctx.stream);
}

}  // namespace mt::model
