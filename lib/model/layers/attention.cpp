// Self-attention (see attention.h).
#include "model/layers/attention.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::model {

struct SelfAttention::Saved : BlockBuffers {
  float* qkv = nullptr;   // (rows, qkv_width), q and k after RoPE
  float* attn = nullptr;  // (rows, attention_width); null: selective recompute rebuilds it
  float* lse = nullptr;   // (batch, q_heads, seq)
};

struct SelfAttention::Workspace : BlockBuffers {
  float* d_attn = nullptr;  // (rows, attention_width)
  float* d_qkv = nullptr;   // (rows, qkv_width)
  float* attn = nullptr;    // (rows, attention_width): the rebuilt core attention (selective recompute)
  float* lse = nullptr;     // (batch, q_heads, seq)
};

namespace {

std::string name(int layer, const char* tensor) { return layer_prefix(layer) + "self_attention." + tensor; }

}  // namespace

SelfAttention::SelfAttention(const ModelConfig& config, int layer, bool causal)
    : layer_(layer),
      hidden_(config.hidden_size),
      head_dim_(config.head_dim()),
      heads_(config.num_attention_heads),
      groups_(config.query_groups()),
      bias_(config.add_bias_linear),
      init_std_(config.init_method_std),
      num_layers_(config.num_layers),
      attention_dropout_(config.attention_dropout),
      rotary_base_(config.rotary_base),
      rope_(config.position_embedding == PositionEmbedding::rope),
      causal_(causal) {}

void SelfAttention::declare(ParamDeclarations& declarations) const {
  const int64_t d = head_dim_;
  const int64_t q_width = heads_ * d, kv_width = groups_ * d;
  const std::string heads = "--num-attention-heads " + std::to_string(heads_);
  const std::string groups = "--num-query-groups " + std::to_string(groups_);
  const Init weight = Init::normal(init_std_);
  const Init output = Init::normal(init_std_ / std::sqrt(2.0 * num_layers_));
  const Init zero = Init::constant(0.0f);
  using S = TensorSplit;
  declarations.begin_group();
  declarations.add({name(layer_, "linear_q.weight"), {q_width, hidden_}, S::column_parallel, layer_, weight, d, heads});
  declarations.add({name(layer_, "linear_k.weight"), {kv_width, hidden_}, S::column_parallel, layer_, weight, d, groups});
  declarations.add({name(layer_, "linear_v.weight"), {kv_width, hidden_}, S::column_parallel, layer_, weight, d, groups});
  if (bias_) {
    declarations.begin_group();
    declarations.add({name(layer_, "linear_q.bias"), {q_width}, S::column_parallel, layer_, zero, d, heads});
    declarations.add({name(layer_, "linear_k.bias"), {kv_width}, S::column_parallel, layer_, zero, d, groups});
    declarations.add({name(layer_, "linear_v.bias"), {kv_width}, S::column_parallel, layer_, zero, d, groups});
  }
  declarations.add_single({name(layer_, "linear_proj.weight"), {hidden_, q_width}, S::row_parallel, layer_, output, d,
                           heads});
  if (bias_) declarations.add_single({name(layer_, "linear_proj.bias"), {hidden_}, S::replicated, layer_, zero});
}

void SelfAttention::bind(const ParamLayout& layout) {
  const ParamEntry& q = layout.find(name(layer_, "linear_q.weight"));
  const ParamEntry& k = layout.find(name(layer_, "linear_k.weight"));
  const ParamEntry& v = layout.find(name(layer_, "linear_v.weight"));
  const ParamEntry& proj = layout.find(name(layer_, "linear_proj.weight"));
  q_heads_ = static_cast<int>(q.local_shape[0] / head_dim_);
  kv_heads_ = static_cast<int>(k.local_shape[0] / head_dim_);
  qkv_ = ColumnParallelLinear(LinearParams{q.offset, optional_param_offset(layout, name(layer_, "linear_q.bias")),
                                           hidden_, q.local_shape[0] + k.local_shape[0] + v.local_shape[0]});
  proj_ = RowParallelLinear(LinearParams{proj.offset, optional_param_offset(layout, name(layer_, "linear_proj.bias")),
                                         proj.local_shape[1], hidden_});
}

std::unique_ptr<BlockBuffers> SelfAttention::lay_out_saved(BufferSource& source, const ActivationRows& rows,
                                                           bool keep_core) const {
  auto saved = std::make_unique<Saved>();
  const int64_t n = rows.rows;
  saved->qkv = source.take(n * qkv_width());
  if (keep_core) {
    saved->attn = source.take(n * attention_width());
    saved->lse = source.take(n * q_heads_);
  }
  return saved;
}

std::unique_ptr<BlockBuffers> SelfAttention::lay_out_workspace(BufferSource& source, const ActivationRows& rows,
                                                               bool rebuild_core) const {
  auto workspace = std::make_unique<Workspace>();
  const int64_t n = rows.rows;
  if (rebuild_core) {
    workspace->attn = source.take(n * attention_width());
    workspace->lse = source.take(n * q_heads_);
  }
  workspace->d_attn = source.take(n * attention_width());
  workspace->d_qkv = source.take(n * qkv_width());
  return workspace;
}

int64_t SelfAttention::widest_gemm_operand() const {
  return std::max({qkv_.in_features(), qkv_.out_features(), proj_.in_features(), proj_.out_features()});
}

kernels::AttentionShape SelfAttention::core_shape(int batch, int seq) const {
  kernels::AttentionShape shape;
  shape.batch = batch;
  shape.q_len = shape.kv_len = seq;
  shape.q_heads = q_heads_;
  shape.kv_heads = kv_heads_;
  shape.head_dim = head_dim_;
  shape.q_stride = shape.k_stride = shape.v_stride = qkv_width();
  shape.o_stride = attention_width();
  shape.scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  shape.causal = causal_;
  return shape;
}

SelfAttention::Core SelfAttention::core_of(const Saved& saved, const Workspace& workspace) {
  if (saved.attn) return Core{saved.attn, saved.lse};
  return Core{workspace.attn, workspace.lse};
}

kernels::AttentionDropout SelfAttention::dropout_of(const LayerContext& ctx, const LayerPass& pass) const {
  kernels::AttentionDropout dropout;
  if (!pass.training || attention_dropout_ <= 0.0f) return dropout;
  if (pass.batch.row_ids == nullptr) {
    throw Error("--attention-dropout", "a training pass without global row ids to key the mask");
  }
  dropout.key = kernels::DropoutKey{ctx.seed, dropout_stream("attention-probs", layer_), pass.iteration,
                                    attention_dropout_};
  dropout.row_ids = pass.batch.row_ids;
  dropout.q_head0 = ctx.parallel.tensor_parallel_rank() * q_heads_;  // TP splits whole heads in order
  dropout.q_heads_total = heads_;
  return dropout;
}

void SelfAttention::check_mask(const LayerPass& pass) const {
  if (causal_) return;
  if (pass.batch.doc_start) throw Error("BERT's bidirectional attention", "takes no document masks");
}

void SelfAttention::core_forward(const LayerContext& ctx, const LayerPass& pass, const float* qkv,
                                 const Core& core) const {
  const int64_t q = static_cast<int64_t>(q_heads_) * head_dim_, kv = static_cast<int64_t>(kv_heads_) * head_dim_;
  check_mask(pass);
  if (ctx.ring_attention) {
    ctx.ring_attention->set_batch(pass.batch.batch);
    ctx.ring_attention->set_dropout(dropout_of(ctx, pass));
    ctx.ring_attention->set_key_lengths(causal_ ? nullptr : pass.batch.key_lengths);
    ctx.ring_attention->forward(qkv, qkv + q, qkv + q + kv, pass.batch.doc_start, core.attn, core.lse);
    return;
  }
  kernels::AttentionShape shape = core_shape(pass.batch.batch, pass.batch.seq);
  shape.dropout = dropout_of(ctx, pass);
  shape.key_lengths = causal_ ? nullptr : pass.batch.key_lengths;
  ctx.ops.attention_forward(shape, qkv, qkv + q, qkv + q + kv, pass.batch.doc_start, core.attn, core.lse, ctx.stream);
}

void SelfAttention::forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq,
                            BlockBuffers& saved_buffers, BlockBuffers& workspace_buffers,
                            const SequenceParallelBuffers& full_rows, float* out_seq) const {
  const Saved& saved = static_cast<const Saved&>(saved_buffers);
  const Core core = core_of(saved, static_cast<const Workspace&>(workspace_buffers));
  qkv_.forward(ctx, pass, x_seq, full_rows, saved.qkv);
  if (rope_) {
    const int64_t width = qkv_width(), q = static_cast<int64_t>(q_heads_) * head_dim_;
    ctx.ops.rope_forward(saved.qkv, pass.rows, width, q_heads_, head_dim_, pass.batch.positions, rotary_base_,
                         ctx.stream);
    ctx.ops.rope_forward(saved.qkv + q, pass.rows, width, kv_heads_, head_dim_, pass.batch.positions, rotary_base_,
                         ctx.stream);
  }
  core_forward(ctx, pass, saved.qkv, core);
  proj_.forward(ctx, pass, core.attn, full_rows, out_seq);
}

void SelfAttention::backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                             BlockBuffers& saved_buffers, BlockBuffers& workspace_buffers,
                             const SequenceParallelBuffers& full_rows, float* dx_seq) const {
  const Saved& saved = static_cast<const Saved&>(saved_buffers);
  const Workspace& w = static_cast<const Workspace&>(workspace_buffers);
  const Core core = core_of(saved, w);
  if (!saved.attn) core_forward(ctx, pass, saved.qkv, core);  // selective recompute of the core attention
  const int64_t q = static_cast<int64_t>(q_heads_) * head_dim_, kv = static_cast<int64_t>(kv_heads_) * head_dim_;
  proj_.backward(ctx, pass, dy_seq, core.attn, full_rows, w.d_attn);
  if (ctx.ring_attention) {
    ctx.ring_attention->set_batch(pass.batch.batch);
    ctx.ring_attention->set_dropout(dropout_of(ctx, pass));
    ctx.ring_attention->set_key_lengths(causal_ ? nullptr : pass.batch.key_lengths);
    ctx.ring_attention->backward(saved.qkv, saved.qkv + q, saved.qkv + q + kv, pass.batch.doc_start, core.attn,
                                 w.d_attn, core.lse, w.d_qkv, w.d_qkv + q, w.d_qkv + q + kv);
  } else {
    kernels::AttentionShape shape = core_shape(pass.batch.batch, pass.batch.seq);
    shape.dropout = dropout_of(ctx, pass);
    shape.key_lengths = causal_ ? nullptr : pass.batch.key_lengths;
    ctx.ops.attention_backward(shape, saved.qkv, saved.qkv + q, saved.qkv + q + kv, pass.batch.doc_start, core.attn,
                               w.d_attn, core.lse, w.d_qkv, w.d_qkv + q, w.d_qkv + q + kv, ctx.stream);
  }
  if (rope_) {
    const int64_t width = qkv_width();
    ctx.ops.rope_backward(w.d_qkv, pass.rows, width, q_heads_, head_dim_, pass.batch.positions, rotary_base_,
                          ctx.stream);
    ctx.ops.rope_backward(w.d_qkv + q, pass.rows, width, kv_heads_, head_dim_, pass.batch.positions, rotary_base_,
                          ctx.stream);
  }
  qkv_.backward(ctx, pass, w.d_qkv, x_seq, full_rows, dx_seq);
}

}  // namespace mt::model
