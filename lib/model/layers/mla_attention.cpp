// Multi-latent attention (see mla_attention.h).
#include "model/layers/mla_attention.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::model {

// Rows: N = pass.rows (every token of the micro-batch), R = pass.sequence_rows (this rank's SP
// rows; R = N without SP). hl = local heads, A = core head size.
struct MlaAttention::Saved : BlockBuffers {
  float* c_q = nullptr;        // (R, q_lora_rank) linear_q_down_proj's output; null without --q-lora-rank
  float* c_q_norm = nullptr;   // (R, q_lora_rank) q_layernorm's output; null without --qk-layernorm
  float* rstd_q = nullptr;     // (R)
  float* c_kv = nullptr;       // (R, kv_lora_rank) the latent part of linear_kv_down_proj's output
  float* c_kv_norm = nullptr;  // (R, kv_lora_rank) kv_layernorm's output; null without --qk-layernorm
  float* rstd_kv = nullptr;    // (R)
  float* q = nullptr;          // (N, hl, A) the core's q: [q_nope, rotated q_pe, zeros]
  float* k = nullptr;          // (N, hl, A) [k_nope, rotated k_pe, zeros]
  float* v = nullptr;          // (N, hl, A) [v, zeros]
  float* out = nullptr;        // (N, hl, A); null: selective recompute rebuilds the core
  float* lse = nullptr;        // (N * hl)
  float* attn = nullptr;       // (N, hl * d_v)
};

struct MlaAttention::Workspace : BlockBuffers {
  float* q_up = nullptr;       // (N, hl * (d_n + d_r)) the q projection's output
  float* kv_up = nullptr;      // (N, hl * (d_n + d_v)) linear_kv_up_proj's output
  float* kv_down = nullptr;    // (R, kv_lora_rank + d_r) linear_kv_down_proj's output
  float* k_pe_seq = nullptr;   // (R, d_r) its k_pe part
  float* k_pe_full = nullptr;  // (N, d_r) k_pe of every row (gathered under SP)
  float* k_pe = nullptr;       // (N, d_r) de-interleaved and rotated
  float* pe = nullptr;         // (N, hl, d_r) q_pe de-interleaved and rotated, then grads
  float* gathered = nullptr;   // (N, max latent) an up projection's input under SP
  float* d_full = nullptr;     // (N, max latent) its input grad before the reduce-scatter
  float* d_attn = nullptr;     // (N, hl * d_v)
  float* d_out = nullptr;      // (N, hl, A)
  float* dq = nullptr;         // (N, hl, A)
  float* dk = nullptr;         // (N, hl, A)
  float* dv = nullptr;         // (N, hl, A)
  float* d_q_up = nullptr;     // (N, hl * (d_n + d_r))
  float* d_kv_up = nullptr;    // (N, hl * (d_n + d_v))
  float* d_k_pe = nullptr;     // (N, d_r) summed over local heads, rotated back
  float* d_k_pe_full = nullptr;  // (N, d_r) in Megatron's (interleaved) order
  float* d_k_pe_seq = nullptr;   // (R, d_r) reduced over TP
  float* d_latent = nullptr;   // (R, max latent) an up projection's input grad
  float* d_latent_pre = nullptr;  // (R, max latent) through the latent norm
  float* d_kv_down = nullptr;  // (R, kv_lora_rank + d_r)
  float* dx_part = nullptr;    // (R, hidden) the q path's input grad
  float* out = nullptr;        // (N, hl, A) the rebuilt core (selective recompute)
  float* lse = nullptr;        // (N * hl)
  float* attn = nullptr;       // (N, hl * d_v)
};

namespace {

std::string name(int layer, const char* tensor) { return layer_prefix(layer) + "self_attention." + tensor; }

constexpr int64_t kFloat = static_cast<int64_t>(sizeof(float));

// dst[r * dst_pitch + c] = src[r * src_pitch + c] for c < width, r < rows (floats).
void copy_columns(const LayerContext& ctx, float* dst, int64_t dst_pitch, const float* src, int64_t src_pitch,
                  int64_t width, int64_t rows) {
  if (rows == 0 || width == 0) return;
  ctx.ops.copy_2d(dst, dst_pitch * kFloat, src, src_pitch * kFloat, width * kFloat, rows,
                  backend::CopyKind::device_to_device, ctx.stream);
}

}  // namespace

MlaAttention::MlaAttention(const ModelConfig& config, int layer)
    : layer_(layer),
      hidden_(config.hidden_size),
      heads_(config.num_attention_heads),
      q_lora_rank_(config.q_lora_rank),
      kv_lora_rank_(config.kv_lora_rank),
      d_nope_(config.qk_head_dim),
      d_rope_(config.qk_pos_emb_head_dim),
      d_v_(config.v_head_dim),
      q_dim_(config.qk_head_dim + config.qk_pos_emb_head_dim),
      kv_dim_(config.qk_head_dim + config.v_head_dim),
      core_dim_(std::max(config.qk_head_dim + config.qk_pos_emb_head_dim, config.v_head_dim)),
      qk_layernorm_(config.qk_layernorm),
      norm_eps_(config.norm_epsilon),
      bias_(config.add_bias_linear),
      init_std_(config.init_method_std),
      num_layers_(config.num_layers),
      attention_dropout_(config.attention_dropout),
      rotary_base_(config.rotary_base),
      yarn_(config.rope_type == RopeType::yarn),
      softmax_mscale_(kernels::yarn_mscale(config.rotary_scaling_factor, config.mscale_all_dim)) {
  if (d_rope_ % 2 != 0) throw UsageError("--qk-pos-emb-head-dim", "rotary embeddings need an even size");
  yarn_rope_.base = config.rotary_base;
  yarn_rope_.scaling_factor = config.rotary_scaling_factor;
  yarn_rope_.original_max_position_embeddings = config.original_max_position_embeddings;
  yarn_rope_.beta_fast = config.yarn_beta_fast;
  yarn_rope_.beta_slow = config.yarn_beta_slow;
  yarn_rope_.concentration =
      kernels::yarn_concentration(config.rotary_scaling_factor, config.mscale, config.mscale_all_dim);
}

void MlaAttention::declare(ParamDeclarations& declarations) const {
  const std::string heads = "--num-attention-heads " + std::to_string(heads_);
  const Init weight = Init::normal(init_std_);
  const Init output = Init::normal(init_std_ / std::sqrt(2.0 * num_layers_));
  const Init one = Init::constant(1.0f);
  using S = TensorSplit;
  if (q_lora_rank_ > 0) {
    declarations.add_single({name(layer_, "linear_q_down_proj.weight"), {q_lora_rank_, hidden_}, S::replicated,
                             layer_, weight});
    if (qk_layernorm_) {
      declarations.add_single({name(layer_, "q_layernorm.weight"), {q_lora_rank_}, S::replicated, layer_, one});
    }
    declarations.add_single({name(layer_, "linear_q_up_proj.weight"), {int64_t{heads_} * q_dim_, q_lora_rank_},
                             S::column_parallel, layer_, weight, q_dim_, heads});
  } else {
    declarations.add_single({name(layer_, "linear_q_proj.weight"), {int64_t{heads_} * q_dim_, hidden_},
                             S::column_parallel, layer_, weight, q_dim_, heads});
  }
  declarations.add_single({name(layer_, "linear_kv_down_proj.weight"), {kv_lora_rank_ + d_rope_, hidden_},
                           S::replicated, layer_, weight});
  if (qk_layernorm_) {
    declarations.add_single({name(layer_, "kv_layernorm.weight"), {kv_lora_rank_}, S::replicated, layer_, one});
  }
  declarations.add_single({name(layer_, "linear_kv_up_proj.weight"), {int64_t{heads_} * kv_dim_, kv_lora_rank_},
                           S::column_parallel, layer_, weight, kv_dim_, heads});
  declarations.add_single({name(layer_, "linear_proj.weight"), {hidden_, int64_t{heads_} * d_v_}, S::row_parallel,
                           layer_, output, d_v_, heads});
  if (bias_) {
    declarations.add_single({name(layer_, "linear_proj.bias"), {hidden_}, S::replicated, layer_,
                             Init::constant(0.0f)});
  }
}

void MlaAttention::bind(const ParamLayout& layout) {
  const ParamEntry& kv_up = layout.find(name(layer_, "linear_kv_up_proj.weight"));
  const ParamEntry& proj = layout.find(name(layer_, "linear_proj.weight"));
  heads_local_ = static_cast<int>(kv_up.local_shape[0] / kv_dim_);
  kv_down_ = layout.find(name(layer_, "linear_kv_down_proj.weight")).offset;
  kv_norm_ = optional_param_offset(layout, name(layer_, "kv_layernorm.weight"));
  if (q_lora_rank_ > 0) {
    q_down_ = layout.find(name(layer_, "linear_q_down_proj.weight")).offset;
    q_norm_ = optional_param_offset(layout, name(layer_, "q_layernorm.weight"));
    const ParamEntry& q_up = layout.find(name(layer_, "linear_q_up_proj.weight"));
    q_proj_ = ColumnParallelLinear(LinearParams{q_up.offset, -1, q_lora_rank_, q_up.local_shape[0]});
  } else {
    const ParamEntry& q = layout.find(name(layer_, "linear_q_proj.weight"));
    q_proj_ = ColumnParallelLinear(LinearParams{q.offset, -1, hidden_, q.local_shape[0]});
  }
  kv_up_ = ColumnParallelLinear(LinearParams{kv_up.offset, -1, kv_lora_rank_, kv_up.local_shape[0]});
  proj_ = RowParallelLinear(LinearParams{proj.offset, optional_param_offset(layout, name(layer_, "linear_proj.bias")),
                                         proj.local_shape[1], hidden_});
}

// Megatron's mscale * mscale / math.sqrt(q_head_dim) in double; mscale is 1 (no YaRN factor) in
// most runs, which keep the fp32 1/sqrt of before.
float MlaAttention::softmax_scale() const {
  if (softmax_mscale_ == 1.0) return 1.0f / std::sqrt(static_cast<float>(q_dim_));
  return static_cast<float>(softmax_mscale_ * softmax_mscale_ / std::sqrt(static_cast<double>(q_dim_)));
}

// RoPE or YaRN on `heads` rotary vectors of d_r per row (rows x row_stride floats), or their
// transposes for the grads.
void MlaAttention::rotate(const LayerContext& ctx, float* x, int64_t rows, int64_t row_stride, int heads,
                          const int32_t* positions, bool transpose) const {
  if (yarn_) {
    (transpose ? ctx.ops.rope_yarn_backward : ctx.ops.rope_yarn_forward)(x, rows, row_stride, heads, d_rope_, positions,
                                                                         yarn_rope_, ctx.stream);
  } else {
    (transpose ? ctx.ops.rope_backward : ctx.ops.rope_forward)(x, rows, row_stride, heads, d_rope_, positions,
                                                               rotary_base_, ctx.stream);
  }
}

std::unique_ptr<BlockBuffers> MlaAttention::lay_out_saved(BufferSource& source, const ActivationRows& rows,
                                                          bool keep_core) const {
  auto saved = std::make_unique<Saved>();
  const int64_t n = rows.rows, r = rows.sequence_rows, hl = heads_local_;
  if (q_lora_rank_ > 0) {
    saved->c_q = source.take(r * q_lora_rank_);
    if (qk_layernorm_) {
      saved->c_q_norm = source.take(r * q_lora_rank_);
      saved->rstd_q = source.take(r);
    }
  }
  saved->c_kv = source.take(r * kv_lora_rank_);
  if (qk_layernorm_) {
    saved->c_kv_norm = source.take(r * kv_lora_rank_);
    saved->rstd_kv = source.take(r);
  }
  saved->q = source.take(n * hl * core_dim_);
  saved->k = source.take(n * hl * core_dim_);
  saved->v = source.take(n * hl * core_dim_);
  if (keep_core) {
    saved->out = source.take(n * hl * core_dim_);
    saved->lse = source.take(n * hl);
    saved->attn = source.take(n * hl * d_v_);
  }
  return saved;
}

std::unique_ptr<BlockBuffers> MlaAttention::lay_out_workspace(BufferSource& source, const ActivationRows& rows,
                                                              bool rebuild_core) const {
  auto w = std::make_unique<Workspace>();
  const int64_t n = rows.rows, r = rows.sequence_rows, hl = heads_local_;
  const int64_t latent = std::max(q_lora_rank_, kv_lora_rank_);
  w->q_up = source.take(n * hl * q_dim_);
  w->kv_up = source.take(n * hl * kv_dim_);
  w->kv_down = source.take(r * (kv_lora_rank_ + d_rope_));
  w->k_pe_seq = source.take(r * d_rope_);
  w->k_pe_full = source.take(n * d_rope_);
  w->k_pe = source.take(n * d_rope_);
  w->pe = source.take(n * hl * d_rope_);
  w->gathered = source.take(n * latent);
  w->d_full = source.take(n * latent);
  w->d_attn = source.take(n * hl * d_v_);
  w->d_out = source.take(n * hl * core_dim_);
  w->dq = source.take(n * hl * core_dim_);
  w->dk = source.take(n * hl * core_dim_);
  w->dv = source.take(n * hl * core_dim_);
  w->d_q_up = source.take(n * hl * q_dim_);
  w->d_kv_up = source.take(n * hl * kv_dim_);
  w->d_k_pe = source.take(n * d_rope_);
  w->d_k_pe_full = source.take(n * d_rope_);
  w->d_k_pe_seq = source.take(r * d_rope_);
  w->d_latent = source.take(r * latent);
  w->d_latent_pre = source.take(r * latent);
  w->d_kv_down = source.take(r * (kv_lora_rank_ + d_rope_));
  w->dx_part = source.take(r * hidden_);
  if (rebuild_core) {
    w->out = source.take(n * hl * core_dim_);
    w->lse = source.take(n * hl);
    w->attn = source.take(n * hl * d_v_);
  }
  return w;
}

int64_t MlaAttention::widest_gemm_operand() const {
  return std::max({hidden_, int64_t{q_lora_rank_}, int64_t{kv_lora_rank_} + d_rope_, q_proj_.out_features(),
                   kv_up_.out_features(), proj_.in_features()});
}

kernels::AttentionShape MlaAttention::core_shape(int batch, int seq) const {
  kernels::AttentionShape shape;
  shape.batch = batch;
  shape.q_len = shape.kv_len = seq;
  shape.q_heads = shape.kv_heads = heads_local_;
  shape.head_dim = core_dim_;
  shape.q_stride = shape.k_stride = shape.v_stride = shape.o_stride = int64_t{heads_local_} * core_dim_;
  shape.scale = softmax_scale();
  return shape;
}

MlaAttention::Core MlaAttention::core_of(const Saved& saved, const Workspace& workspace) {
  if (saved.out) return Core{saved.out, saved.lse, saved.attn};
  return Core{workspace.out, workspace.lse, workspace.attn};
}

kernels::AttentionDropout MlaAttention::dropout_of(const LayerContext& ctx, const LayerPass& pass) const {
  kernels::AttentionDropout dropout;
  if (!pass.training || attention_dropout_ <= 0.0f) return dropout;
  if (pass.batch.row_ids == nullptr) {
    throw Error("--attention-dropout", "a training pass without global row ids to key the mask");
  }
  dropout.key = kernels::DropoutKey{ctx.seed, dropout_stream("attention-probs", layer_), pass.iteration,
                                    attention_dropout_};
  dropout.row_ids = pass.batch.row_ids;
  dropout.q_head0 = ctx.parallel.tensor_parallel_rank() * heads_local_;  // TP splits whole heads in order
  dropout.q_heads_total = heads_;
  return dropout;
}

SequenceParallelBuffers MlaAttention::latent_buffers(const Workspace& w) const {
  return SequenceParallelBuffers{w.gathered, nullptr, w.d_full};
}

void MlaAttention::deinterleave(const LayerContext& ctx, const float* in, int64_t stride, int64_t count,
                                float* out) const {
  const int half = d_rope_ / 2;
  for (int i = 0; i < half; ++i) {
    copy_columns(ctx, out + i, d_rope_, in + 2 * i, stride, 1, count);
    copy_columns(ctx, out + half + i, d_rope_, in + 2 * i + 1, stride, 1, count);
  }
}

void MlaAttention::interleave(const LayerContext& ctx, const float* in, int64_t count, float* out,
                              int64_t stride) const {
  const int half = d_rope_ / 2;
  for (int i = 0; i < half; ++i) {
    copy_columns(ctx, out + 2 * i, stride, in + i, d_rope_, 1, count);
    copy_columns(ctx, out + 2 * i + 1, stride, in + half + i, d_rope_, 1, count);
  }
}

void MlaAttention::project(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, const Saved& saved,
                           const Workspace& w, const SequenceParallelBuffers& full_rows) const {
  const ParallelContext& parallel = ctx.parallel;
  const int64_t r = pass.sequence_rows, n = pass.rows;
  // The query path.
  if (q_lora_rank_ > 0) {
    ctx.gemm.linear_forward(x_seq, r, hidden_, q_down_, q_lora_rank_, saved.c_q);  // (R, q_lora_rank)
    const float* latent = saved.c_q;
    if (qk_layernorm_) {
      ctx.ops.rmsnorm_forward(saved.c_q, ctx.params + q_norm_, saved.c_q_norm, saved.rstd_q, r, q_lora_rank_,
                              norm_eps_, ctx.stream);
      latent = saved.c_q_norm;
    }
    q_proj_.forward(ctx, pass, latent, latent_buffers(w), w.q_up);  // (N, hl * (d_n + d_r))
  } else {
    q_proj_.forward(ctx, pass, x_seq, full_rows, w.q_up);
  }
  // The key/value path: the latent and the shared rotary key of this rank's rows.
  const int64_t down_width = kv_lora_rank_ + d_rope_;
  ctx.gemm.linear_forward(x_seq, r, hidden_, kv_down_, down_width, w.kv_down);  // (R, kv_lora_rank + d_r)
  copy_columns(ctx, saved.c_kv, kv_lora_rank_, w.kv_down, down_width, kv_lora_rank_, r);
  copy_columns(ctx, w.k_pe_seq, d_rope_, w.kv_down + kv_lora_rank_, down_width, d_rope_, r);
  const float* latent = saved.c_kv;
  if (qk_layernorm_) {
    ctx.ops.rmsnorm_forward(saved.c_kv, ctx.params + kv_norm_, saved.c_kv_norm, saved.rstd_kv, r, kv_lora_rank_,
                            norm_eps_, ctx.stream);
    latent = saved.c_kv_norm;
  }
  kv_up_.forward(ctx, pass, latent, latent_buffers(w), w.kv_up);  // (N, hl * (d_n + d_v))
  if (parallel.sequence_parallel()) {
    parallel.gather_from_sequence_parallel_region(w.k_pe_seq, w.k_pe_full, n, d_rope_);
  } else {
    copy_columns(ctx, w.k_pe_full, d_rope_, w.k_pe_seq, d_rope_, d_rope_, n);
  }
}

void MlaAttention::assemble_qkv(const LayerContext& ctx, const LayerPass& pass, const Saved& saved,
                                const Workspace& w) const {
  const int64_t n = pass.rows, hl = heads_local_, a = core_dim_;
  const int64_t vectors = n * hl;  // (row, head) pairs
  if (a > q_dim_) {
    ctx.ops.zero(saved.q, vectors * a * kFloat, ctx.stream);
    ctx.ops.zero(saved.k, vectors * a * kFloat, ctx.stream);
  }
  if (a > d_v_) ctx.ops.zero(saved.v, vectors * a * kFloat, ctx.stream);
  // q = [q_nope, rope(q_pe)]
  copy_columns(ctx, saved.q, a, w.q_up, q_dim_, d_nope_, vectors);
  deinterleave(ctx, w.q_up + d_nope_, q_dim_, vectors, w.pe);  // (N, hl, d_r)
  rotate(ctx, w.pe, n, hl * d_rope_, static_cast<int>(hl), pass.batch.positions, false);
  copy_columns(ctx, saved.q + d_nope_, a, w.pe, d_rope_, d_rope_, vectors);
  // k = [k_nope, rope(k_pe) for every head]
  copy_columns(ctx, saved.k, a, w.kv_up, kv_dim_, d_nope_, vectors);
  deinterleave(ctx, w.k_pe_full, d_rope_, n, w.k_pe);  // (N, d_r)
  rotate(ctx, w.k_pe, n, d_rope_, 1, pass.batch.positions, false);
  for (int64_t h = 0; h < hl; ++h) copy_columns(ctx, saved.k + h * a + d_nope_, hl * a, w.k_pe, d_rope_, d_rope_, n);
  // v
  copy_columns(ctx, saved.v, a, w.kv_up + d_nope_, kv_dim_, d_v_, vectors);
}

void MlaAttention::core_forward(const LayerContext& ctx, const LayerPass& pass, const Saved& saved,
                                const Core& core) const {
  if (ctx.ring_attention) {
    // Context parallelism: the ring over the CP group with the zero-padded heads of size A (the
    // stage sized it from core_shape), so q/k and v widths that differ travel as one.
    ctx.ring_attention->set_batch(pass.batch.batch);
    ctx.ring_attention->set_dropout(dropout_of(ctx, pass));
    ctx.ring_attention->forward(saved.q, saved.k, saved.v, pass.batch.doc_start, core.out, core.lse);
  } else {
    kernels::AttentionShape shape = core_shape(pass.batch.batch, pass.batch.seq);
    shape.dropout = dropout_of(ctx, pass);
    ctx.ops.attention_forward(shape, saved.q, saved.k, saved.v, pass.batch.doc_start, core.out, core.lse, ctx.stream);
  }
  copy_columns(ctx, core.attn, d_v_, core.out, core_dim_, d_v_, pass.rows * heads_local_);
}

void MlaAttention::forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq,
                           BlockBuffers& saved_buffers, BlockBuffers& workspace_buffers,
                           const SequenceParallelBuffers& full_rows, float* out_seq) const {
  const Saved& saved = static_cast<const Saved&>(saved_buffers);
  const Workspace& w = static_cast<const Workspace&>(workspace_buffers);
  const Core core = core_of(saved, w);
  project(ctx, pass, x_seq, saved, w, full_rows);
  assemble_qkv(ctx, pass, saved, w);
  core_forward(ctx, pass, saved, core);
  proj_.forward(ctx, pass, core.attn, full_rows, out_seq);
}

void MlaAttention::disassemble_grads(const LayerContext& ctx, const LayerPass& pass, const Workspace& w) const {
  const int64_t n = pass.rows, hl = heads_local_, a = core_dim_;
  const int64_t vectors = n * hl;
  // d q_up = [dq_nope, interleave(rope^T(dq_pe))]
  copy_columns(ctx, w.d_q_up, q_dim_, w.dq, a, d_nope_, vectors);
  copy_columns(ctx, w.pe, d_rope_, w.dq + d_nope_, a, d_rope_, vectors);
  rotate(ctx, w.pe, n, hl * d_rope_, static_cast<int>(hl), pass.batch.positions, true);
  interleave(ctx, w.pe, vectors, w.d_q_up + d_nope_, q_dim_);
  // d kv_up = [dk_nope, dv]
  copy_columns(ctx, w.d_kv_up, kv_dim_, w.dk, a, d_nope_, vectors);
  copy_columns(ctx, w.d_kv_up + d_nope_, kv_dim_, w.dv, a, d_v_, vectors);
  // d k_pe = sum over the local heads of dk_pe, rotated back and interleaved (partial over TP)
  copy_columns(ctx, w.d_k_pe, d_rope_, w.dk + d_nope_, hl * a, d_rope_, n);
  for (int64_t h = 1; h < hl; ++h) {
    copy_columns(ctx, w.k_pe, d_rope_, w.dk + h * a + d_nope_, hl * a, d_rope_, n);
    ctx.ops.add_inplace(w.d_k_pe, w.k_pe, n * d_rope_, ctx.stream);
  }
  rotate(ctx, w.d_k_pe, n, d_rope_, 1, pass.batch.positions, true);
  interleave(ctx, w.d_k_pe, n, w.d_k_pe_full, d_rope_);
}

void MlaAttention::project_backward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq,
                                    const Saved& saved, const Workspace& w, const SequenceParallelBuffers& full_rows,
                                    float* dx_seq) const {
  const ParallelContext& parallel = ctx.parallel;
  const int64_t r = pass.sequence_rows, n = pass.rows;
  const int64_t down_width = kv_lora_rank_ + d_rope_;
  // The key/value path: d c_kv from linear_kv_up_proj (reduced over TP), d k_pe reduced over TP.
  kv_up_.backward(ctx, pass, w.d_kv_up, qk_layernorm_ ? saved.c_kv_norm : saved.c_kv, latent_buffers(w), w.d_latent);
  const float* d_c_kv = w.d_latent;
  if (qk_layernorm_) {
    ctx.ops.rmsnorm_backward(w.d_latent, saved.c_kv, ctx.params + kv_norm_, saved.rstd_kv, w.d_latent_pre,
                             ctx.grads + kv_norm_, r, kv_lora_rank_, ctx.stream);
    d_c_kv = w.d_latent_pre;
  }
  const float* d_k_pe = w.d_k_pe_full;
  if (parallel.sequence_parallel()) {
    d_k_pe = parallel.gather_from_sequence_parallel_region_backward(w.d_k_pe_full, w.d_k_pe_seq, n, d_rope_);
  } else {
    parallel.copy_to_tensor_parallel_region_backward(w.d_k_pe_full, n * d_rope_);
  }
  copy_columns(ctx, w.d_kv_down, down_width, d_c_kv, kv_lora_rank_, kv_lora_rank_, r);
  copy_columns(ctx, w.d_kv_down + kv_lora_rank_, down_width, d_k_pe, d_rope_, d_rope_, r);
  ctx.gemm.linear_backward_weight(w.d_kv_down, x_seq, r, down_width, hidden_, kv_down_);
  ctx.gemm.linear_backward_input(w.d_kv_down, r, down_width, kv_down_, hidden_, dx_seq);
  // The query path.
  if (q_lora_rank_ > 0) {
    q_proj_.backward(ctx, pass, w.d_q_up, qk_layernorm_ ? saved.c_q_norm : saved.c_q, latent_buffers(w),
                     w.d_latent);
    const float* d_c_q = w.d_latent;
    if (qk_layernorm_) {
      ctx.ops.rmsnorm_backward(w.d_latent, saved.c_q, ctx.params + q_norm_, saved.rstd_q, w.d_latent_pre,
                               ctx.grads + q_norm_, r, q_lora_rank_, ctx.stream);
      d_c_q = w.d_latent_pre;
    }
    ctx.gemm.linear_backward_weight(d_c_q, x_seq, r, q_lora_rank_, hidden_, q_down_);
    ctx.gemm.linear_backward_input(d_c_q, r, q_lora_rank_, q_down_, hidden_, w.dx_part);
  } else {
    q_proj_.backward(ctx, pass, w.d_q_up, x_seq, full_rows, w.dx_part);
  }
  ctx.ops.add_inplace(dx_seq, w.dx_part, r * hidden_, ctx.stream);
}

void MlaAttention::backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                            BlockBuffers& saved_buffers, BlockBuffers& workspace_buffers,
                            const SequenceParallelBuffers& full_rows, float* dx_seq) const {
  const Saved& saved = static_cast<const Saved&>(saved_buffers);
  const Workspace& w = static_cast<const Workspace&>(workspace_buffers);
  const Core core = core_of(saved, w);
  if (!saved.out) core_forward(ctx, pass, saved, core);  // selective recompute of the core attention
  const int64_t vectors = pass.rows * heads_local_;
  proj_.backward(ctx, pass, dy_seq, core.attn, full_rows, w.d_attn);
  if (core_dim_ > d_v_) ctx.ops.zero(w.d_out, vectors * core_dim_ * kFloat, ctx.stream);
  copy_columns(ctx, w.d_out, core_dim_, w.d_attn, d_v_, d_v_, vectors);
  if (ctx.ring_attention) {
    ctx.ring_attention->set_batch(pass.batch.batch);
    ctx.ring_attention->set_dropout(dropout_of(ctx, pass));
    ctx.ring_attention->backward(saved.q, saved.k, saved.v, pass.batch.doc_start, core.out, w.d_out, core.lse, w.dq,
                                 w.dk, w.dv);
  } else {
    kernels::AttentionShape shape = core_shape(pass.batch.batch, pass.batch.seq);
    shape.dropout = dropout_of(ctx, pass);
    ctx.ops.attention_backward(shape, saved.q, saved.k, saved.v, pass.batch.doc_start, core.out, w.d_out, core.lse,
                               w.dq, w.dk, w.dv, ctx.stream);
  }
  disassemble_grads(ctx, pass, w);
  project_backward(ctx, pass, x_seq, saved, w, full_rows, dx_seq);
}

}  // namespace mt::model
