// Self-attention (see attention.h).
#include "model/layers/attention.h"

#include <cmath>

namespace mt::model {
namespace {

std::string name(int layer, const char* tensor) { return layer_prefix(layer) + "self_attention." + tensor; }

}  // namespace

void SelfAttention::declare(ParamDeclarations& declarations, const ModelConfig& config, int layer) {
  const int64_t d = config.head_dim(), hidden = config.hidden_size;
  const int64_t q_width = static_cast<int64_t>(config.num_attention_heads) * d;
  const int64_t kv_width = static_cast<int64_t>(config.query_groups()) * d;
  const std::string heads = "--num-attention-heads " + std::to_string(config.num_attention_heads);
  const std::string groups = "--num-query-groups " + std::to_string(config.query_groups());
  using S = TensorSplit;
  declarations.begin_group();
  declarations.add(name(layer, "linear_q.weight"), {q_width, hidden}, S::column_parallel, layer, d, heads);
  declarations.add(name(layer, "linear_k.weight"), {kv_width, hidden}, S::column_parallel, layer, d, groups);
  declarations.add(name(layer, "linear_v.weight"), {kv_width, hidden}, S::column_parallel, layer, d, groups);
  if (config.add_bias_linear) {
    declarations.begin_group();
    declarations.add(name(layer, "linear_q.bias"), {q_width}, S::column_parallel, layer, d, heads);
    declarations.add(name(layer, "linear_k.bias"), {kv_width}, S::column_parallel, layer, d, groups);
    declarations.add(name(layer, "linear_v.bias"), {kv_width}, S::column_parallel, layer, d, groups);
  }
  declarations.add_single(name(layer, "linear_proj.weight"), {hidden, q_width}, S::row_parallel, layer, d, heads);
  if (config.add_bias_linear) declarations.add_single(name(layer, "linear_proj.bias"), {hidden}, S::replicated, layer);
}

namespace {

LinearParams qkv_params(const ModelConfig& config, const ParamLayout& layout, int layer) {
  const ParamEntry& q = layout.find(name(layer, "linear_q.weight"));
  const ParamEntry& k = layout.find(name(layer, "linear_k.weight"));
  const ParamEntry& v = layout.find(name(layer, "linear_v.weight"));
  return LinearParams{q.offset, optional_param_offset(layout, name(layer, "linear_q.bias")), config.hidden_size,
                      q.local_shape[0] + k.local_shape[0] + v.local_shape[0]};
}

LinearParams proj_params(const ModelConfig& config, const ParamLayout& layout, int layer) {
  const ParamEntry& proj = layout.find(name(layer, "linear_proj.weight"));
  return LinearParams{proj.offset, optional_param_offset(layout, name(layer, "linear_proj.bias")),
                      proj.local_shape[1], config.hidden_size};
}

}  // namespace

SelfAttention::SelfAttention(const ModelConfig& config, const ParamLayout& layout, int layer)
    : head_dim_(config.head_dim()),
      q_heads_(static_cast<int>(layout.find(name(layer, "linear_q.weight")).local_shape[0] / config.head_dim())),
      kv_heads_(static_cast<int>(layout.find(name(layer, "linear_k.weight")).local_shape[0] / config.head_dim())),
      rotary_base_(config.rotary_base),
      rope_(config.position_embedding == PositionEmbedding::rope),
      qkv_(qkv_params(config, layout, layer)),
      proj_(proj_params(config, layout, layer)) {}

kernels::AttentionShape SelfAttention::attention_shape(int batch, int seq) const {
  kernels::AttentionShape shape;
  shape.batch = batch;
  shape.q_len = shape.kv_len = seq;
  shape.q_heads = q_heads_;
  shape.kv_heads = kv_heads_;
  shape.head_dim = head_dim_;
  shape.q_stride = shape.k_stride = shape.v_stride = qkv_width();
  shape.o_stride = attention_width();
  shape.scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  return shape;
}

void SelfAttention::core_forward(const LayerContext& ctx, const LayerPass& pass, Saved& saved) const {
  const int64_t q = static_cast<int64_t>(q_heads_) * head_dim_, kv = static_cast<int64_t>(kv_heads_) * head_dim_;
  if (ctx.ring_attention) {
    ctx.ring_attention->set_batch(pass.batch.batch);
    ctx.ring_attention->forward(saved.qkv, saved.qkv + q, saved.qkv + q + kv, pass.batch.doc_start, saved.attn,
                                saved.lse);
    return;
  }
  ctx.ops.attention_forward(attention_shape(pass.batch.batch, pass.batch.seq), saved.qkv, saved.qkv + q,
                            saved.qkv + q + kv, pass.batch.doc_start, saved.attn, saved.lse, ctx.stream);
}

void SelfAttention::forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, Saved& saved,
                            const Buffers& buffers, float* out_seq) const {
  qkv_.forward(ctx, pass, x_seq, buffers.sequence_parallel, saved.qkv);
  if (rope_) {
    const int64_t width = qkv_width(), q = static_cast<int64_t>(q_heads_) * head_dim_;
    ctx.ops.rope_forward(saved.qkv, pass.rows, width, q_heads_, head_dim_, pass.batch.positions, rotary_base_,
                         ctx.stream);
    ctx.ops.rope_forward(saved.qkv + q, pass.rows, width, kv_heads_, head_dim_, pass.batch.positions, rotary_base_,
                         ctx.stream);
  }
  core_forward(ctx, pass, saved);
  proj_.forward(ctx, pass, saved.attn, buffers.sequence_parallel, out_seq);
}

void SelfAttention::backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                             const Saved& saved, const Buffers& buffers, float* dx_seq) const {
  const int64_t q = static_cast<int64_t>(q_heads_) * head_dim_, kv = static_cast<int64_t>(kv_heads_) * head_dim_;
  proj_.backward(ctx, pass, dy_seq, saved.attn, buffers.sequence_parallel, buffers.d_attn);
  if (ctx.ring_attention) {
    ctx.ring_attention->set_batch(pass.batch.batch);
    ctx.ring_attention->backward(saved.qkv, saved.qkv + q, saved.qkv + q + kv, pass.batch.doc_start, saved.attn,
                                 buffers.d_attn, saved.lse, buffers.d_qkv, buffers.d_qkv + q, buffers.d_qkv + q + kv);
  } else {
    ctx.ops.attention_backward(attention_shape(pass.batch.batch, pass.batch.seq), saved.qkv, saved.qkv + q,
                               saved.qkv + q + kv, pass.batch.doc_start, saved.attn, buffers.d_attn, saved.lse,
                               buffers.d_qkv, buffers.d_qkv + q, buffers.d_qkv + q + kv, ctx.stream);
  }
  if (rope_) {
    const int64_t width = qkv_width();
    ctx.ops.rope_backward(buffers.d_qkv, pass.rows, width, q_heads_, head_dim_, pass.batch.positions, rotary_base_,
                          ctx.stream);
    ctx.ops.rope_backward(buffers.d_qkv + q, pass.rows, width, kv_heads_, head_dim_, pass.batch.positions,
                          rotary_base_, ctx.stream);
  }
  qkv_.backward(ctx, pass, buffers.d_qkv, x_seq, buffers.sequence_parallel, dx_seq);
}

}  // namespace mt::model
