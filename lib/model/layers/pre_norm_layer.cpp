// The pre-norm decoder layer (see pre_norm_layer.h).
#include "model/layers/pre_norm_layer.h"

#include <algorithm>

namespace mt::model {

// What backward needs besides the layer's input (S sequence rows).
struct PreNormLayer::Saved : BlockBuffers {
  float* norm1 = nullptr;  // (S, C)
  Norm::Statistics statistics1;
  float* x_mid = nullptr;  // (S, C) residual after attention
  float* norm2 = nullptr;  // (S, C)
  Norm::Statistics statistics2;
  std::unique_ptr<BlockBuffers> attention;
  std::unique_ptr<BlockBuffers> mlp;
};

struct PreNormLayer::Workspace : BlockBuffers {
  std::unique_ptr<BlockBuffers> attention;
  std::unique_ptr<BlockBuffers> mlp;
};

PreNormLayer::PreNormLayer(const ModelConfig& config, int layer, std::unique_ptr<AttentionVariant> attention,
                           std::unique_ptr<MlpVariant> mlp)
    : DecoderLayer(layer),
      hidden_(config.hidden_size),
      hidden_dropout_(config.hidden_dropout),
      norm1_(config, layer_prefix(layer) + "input_layernorm", layer),
      attention_(std::move(attention)),
      norm2_(config, layer_prefix(layer) + "pre_mlp_layernorm", layer),
      mlp_(std::move(mlp)) {}

void PreNormLayer::declare(ParamDeclarations& declarations) const {
  norm1_.declare(declarations);
  attention_->declare(declarations);
  norm2_.declare(declarations);
  mlp_->declare(declarations);
}

void PreNormLayer::bind(const ParamLayout& layout) {
  norm1_.bind(layout);
  attention_->bind(layout);
  norm2_.bind(layout);
  mlp_->bind(layout);
}

std::unique_ptr<BlockBuffers> PreNormLayer::lay_out_saved(BufferSource& source, const ActivationRows& rows,
                                                          bool keep_core) const {
  auto saved = std::make_unique<Saved>();
  const int64_t s = rows.sequence_rows, c = hidden_;
  saved->norm1 = source.take(s * c);
  saved->statistics1 = norm1_.lay_out_statistics(source, s);
  saved->attention = attention_->lay_out_saved(source, rows, keep_core);
  saved->x_mid = source.take(s * c);
  saved->norm2 = source.take(s * c);
  saved->statistics2 = norm2_.lay_out_statistics(source, s);
  saved->mlp = mlp_->lay_out_saved(source, rows);
  return saved;
}

std::unique_ptr<BlockBuffers> PreNormLayer::lay_out_workspace(BufferSource& source, const ActivationRows& rows,
                                                              bool rebuild_core) const {
  auto workspace = std::make_unique<Workspace>();
  workspace->attention = attention_->lay_out_workspace(source, rows, rebuild_core);
  workspace->mlp = mlp_->lay_out_workspace(source, rows);
  return workspace;
}

int64_t PreNormLayer::widest_gemm_operand() const {
  return std::max({hidden_, attention_->widest_gemm_operand(), mlp_->widest_gemm_operand()});
}

std::optional<kernels::AttentionShape> PreNormLayer::attention_core_shape(int batch, int seq) const {
  return attention_->core_shape(batch, seq);
}

kernels::DropoutKey PreNormLayer::dropout_key(const LayerContext& ctx, const LayerPass& pass, const char* site) const {
  return kernels::DropoutKey{ctx.seed, dropout_stream(site, layer()), pass.iteration, hidden_dropout_};
}

void PreNormLayer::forward(const LayerContext& ctx, const LayerPass& pass, const float* x_in, float* x_out,
                           BlockBuffers& saved, BlockBuffers& workspace, const LayerTemporaries& t) const {
  Saved& a = static_cast<Saved&>(saved);
  Workspace& w = static_cast<Workspace&>(workspace);
  const backend::Ops& ops = ctx.ops;
  const int64_t s = pass.sequence_rows, c = hidden_;
  const int64_t bytes = static_cast<int64_t>(sizeof(float)) * s * c;
  norm1_.forward(ctx, x_in, a.norm1, a.statistics1.mean, a.statistics1.rstd, s);
  attention_->forward(ctx, pass, a.norm1, *a.attention, *w.attention, t.sequence_parallel, t.tmp);
  kernels::DropoutKey key = dropout_key(ctx, pass, "attention-output");
  if (pass.training && key.p > 0) {
    ops.dropout_forward(t.tmp, s, static_cast<int>(c), pass.sequence_row_ids, 0, key, ctx.stream);
  }
  ops.copy(a.x_mid, x_in, bytes, backend::CopyKind::device_to_device, ctx.stream);
  ops.add_inplace(a.x_mid, t.tmp, s * c, ctx.stream);

  norm2_.forward(ctx, a.x_mid, a.norm2, a.statistics2.mean, a.statistics2.rstd, s);
  mlp_->forward(ctx, pass, a.norm2, *a.mlp, *w.mlp, t.sequence_parallel, t.tmp);
  key = dropout_key(ctx, pass, "mlp-output");
  if (pass.training && key.p > 0) {
    ops.dropout_forward(t.tmp, s, static_cast<int>(c), pass.sequence_row_ids, 0, key, ctx.stream);
  }
  ops.copy(x_out, a.x_mid, bytes, backend::CopyKind::device_to_device, ctx.stream);
  ops.add_inplace(x_out, t.tmp, s * c, ctx.stream);
}

void PreNormLayer::backward(const LayerContext& ctx, const LayerPass& pass, const float* x_in, const float* d_out,
                            float* d_in, BlockBuffers& saved, BlockBuffers& workspace,
                            const LayerTemporaries& t) const {
  Saved& a = static_cast<Saved&>(saved);
  Workspace& w = static_cast<Workspace&>(workspace);
  const backend::Ops& ops = ctx.ops;
  const int64_t s = pass.sequence_rows, c = hidden_;
  const int64_t bytes = static_cast<int64_t>(sizeof(float)) * s * c;
  kernels::DropoutKey key = dropout_key(ctx, pass, "mlp-output");

  // MLP branch: x_out = x_mid + dropout(mlp(norm2(x_mid))).
  ops.copy(t.tmp, d_out, bytes, backend::CopyKind::device_to_device, ctx.stream);
  if (key.p > 0) ops.dropout_backward(t.tmp, s, static_cast<int>(c), pass.sequence_row_ids, 0, key, ctx.stream);
  mlp_->backward(ctx, pass, t.tmp, a.norm2, *a.mlp, *w.mlp, t.sequence_parallel, t.d_norm);
  norm2_.backward(ctx, t.d_norm, a.x_mid, a.statistics2.mean, a.statistics2.rstd, t.d_part, s);
  ops.copy(t.d_mid, d_out, bytes, backend::CopyKind::device_to_device, ctx.stream);
  ops.add_inplace(t.d_mid, t.d_part, s * c, ctx.stream);

  // Attention branch: x_mid = x_in + dropout(attention(norm1(x_in))).
  ops.copy(t.tmp, t.d_mid, bytes, backend::CopyKind::device_to_device, ctx.stream);
  key = dropout_key(ctx, pass, "attention-output");
  if (key.p > 0) ops.dropout_backward(t.tmp, s, static_cast<int>(c), pass.sequence_row_ids, 0, key, ctx.stream);
  attention_->backward(ctx, pass, t.tmp, a.norm1, *a.attention, *w.attention, t.sequence_parallel, t.d_norm);
  norm1_.backward(ctx, t.d_norm, x_in, a.statistics1.mean, a.statistics1.rstd, t.d_part, s);
  ops.copy(d_in, t.d_mid, bytes, backend::CopyKind::device_to_device, ctx.stream);
  ops.add_inplace(d_in, t.d_part, s * c, ctx.stream);
}

}  // namespace mt::model
