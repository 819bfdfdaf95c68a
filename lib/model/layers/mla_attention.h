// Multi-latent attention (DeepSeek-V2/V3; Megatron-Core's MLASelfAttention,
// megatron/core/transformer/multi_latent_attention.py), the AttentionKind::multi_latent variant.
// Per token x (hidden), n heads, d_n = --qk-head-dim, d_r = --qk-pos-emb-head-dim, d_v = --v-head-dim:
//   q           = linear_q_proj x, or with --q-lora-rank linear_q_up_proj q_layernorm(linear_q_down_proj x):
//                 (n, d_n + d_r), split into q_nope (d_n) and q_pe (d_r)
//   [c_kv|k_pe] = linear_kv_down_proj x (kv_lora_rank + d_r); k_pe is ONE head shared by all heads
//   [k_nope|v]  = linear_kv_up_proj kv_layernorm(c_kv): (n, d_n + d_v)
//   q_pe, k_pe are rotated with Megatron's MLA interleave: each vector's dims are gathered to
//   (even dims, odd dims) and rotated rotate-half (rope_utils.py _apply_rotary_pos_emb_bshd with
//   multi_latent_attention=True), the pairs (x0, x1), (x2, x3), ... of HF's DeepSeek-V3; the
//   result stays in that order, as Megatron's does (q and k alike, so q.k is the same)
//   out         = linear_proj attention([q_nope, q_pe], [k_nope, k_pe], v), softmax scale
//                 mscale^2 / sqrt(d_n + d_r), mscale = yarn_mscale(--rotary-scaling-factor,
//                 --mscale-all-dim) (1 at the defaults: 1/sqrt(d_n + d_r)), whatever --rope-type
// With --rope-type yarn q_pe and k_pe are rotated by YaRN (kernels/common/yarn_rope.h: per-dimension
// frequencies between RoPE's and RoPE's over the factor, cos/sin times the concentration factor),
// Megatron-Core's YarnRotaryEmbedding (tested in tests/unit/model/test_yarn.cpp, tests/golden/yarn).
// The latent norms (RMSNorm) exist only with --qk-layernorm, as in Megatron's layer specs (without
// it they are the identity). No biases but linear_proj's (--add-bias-linear), as in Megatron.
// The core attention is the existing fused op with one head size A = max(d_n + d_r, d_v): q and k
// are zero-padded past d_n + d_r and v past d_v (zeros add nothing to q.k, and the output columns
// past d_v are exactly zero), and the output is sliced to d_v per head before linear_proj. Only
// existing op-table entries are used (copy_2d moves the columns).
// TP splits whole heads: the up projections are column-parallel, linear_proj row-parallel, the
// down projections and latent norms replicated. Without SP they run on every row on every TP
// rank and the column-parallel up projections (and k_pe) all-reduce their input grads, so their
// grads are whole on every rank; under SP they run on this rank's sequence rows (as Megatron's
// duplicated TE linears) and their grads are summed over TP (the layout's rule for replicated
// tensors under SP); the latents enter the up projections through the SP all-gather, k_pe through
// its own. Under context parallelism the core runs the stage's ring attention
// (parallel/ring_attention.h) on the heads zero-padded to A, sized from core_shape. Init: every projection
// N(0, init_method_std), linear_proj N(0, init_method_std / sqrt(2 num_layers)), norms 1.
// Tested in tests/unit/model/test_mla.cpp (finite differences, recompute, TP = 2 with and without
// SP) and tests/unit/model/test_mla_megatron.cpp (Megatron-Core's forward and backward,
// tests/golden/mla).
#pragma once

#include "kernels/common/yarn_rope.h"
#include "model/layers/decoder_layer.h"

namespace mt::model {

class MlaAttention : public AttentionVariant {
 public:
  MlaAttention(const ModelConfig& config, int layer);

  void declare(ParamDeclarations& declarations) const override;
  void bind(const ParamLayout& layout) override;

  int q_heads() const { return heads_local_; }     // local
  int core_head_dim() const { return core_dim_; }  // A = max(d_n + d_r, d_v)
  float softmax_scale() const;                     // mscale^2 / sqrt(d_n + d_r)

  std::unique_ptr<BlockBuffers> lay_out_saved(BufferSource& source, const ActivationRows& rows,
                                              bool keep_core) const override;
  std::unique_ptr<BlockBuffers> lay_out_workspace(BufferSource& source, const ActivationRows& rows,
                                                  bool rebuild_core) const override;
  int64_t widest_gemm_operand() const override;
  kernels::AttentionShape core_shape(int batch, int seq) const override;

  // out_seq (sequence rows, hidden) = linear_proj(attention(q, k, v)) + bias, before dropout.
  void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, BlockBuffers& saved,
               BlockBuffers& workspace, const SequenceParallelBuffers& full_rows, float* out_seq) const override;
  // dx_seq (sequence rows, hidden) written from dy_seq; parameter grads accumulate.
  void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                BlockBuffers& saved, BlockBuffers& workspace, const SequenceParallelBuffers& full_rows,
                float* dx_seq) const override;

 private:
  struct Saved;
  struct Workspace;
  // The core attention's results: kept in the saved set, or (selective recompute) the workspace's.
  struct Core {
    float* out;   // (rows, heads, A)
    float* lse;   // (batch, heads, seq)
    float* attn;  // (rows, heads * d_v): the output sliced, linear_proj's input
  };
  static Core core_of(const Saved& saved, const Workspace& workspace);
  kernels::AttentionDropout dropout_of(const LayerContext& ctx, const LayerPass& pass) const;
  void core_forward(const LayerContext& ctx, const LayerPass& pass, const Saved& saved, const Core& core) const;

  // The latents of this rank's sequence rows (normed), k_pe of every row, and the up projections.
  void project(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, const Saved& saved,
               const Workspace& w, const SequenceParallelBuffers& full_rows) const;
  // q, k, v of the core attention from the up projections and k_pe.
  void assemble_qkv(const LayerContext& ctx, const LayerPass& pass, const Saved& saved, const Workspace& w) const;
  // The grads of the up projections' outputs and of k_pe (every row) from those of q, k, v.
  void disassemble_grads(const LayerContext& ctx, const LayerPass& pass, const Workspace& w) const;
  // From the up projections' output grads back to dx_seq (written).
  void project_backward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, const Saved& saved,
                        const Workspace& w, const SequenceParallelBuffers& full_rows, float* dx_seq) const;

  // RoPE or YaRN in place on `heads` d_r vectors per row; transpose: the grads' rotation.
  void rotate(const LayerContext& ctx, float* x, int64_t rows, int64_t row_stride, int heads, const int32_t* positions,
              bool transpose) const;
  // Megatron's MLA interleave on `count` vectors of d_r floats `stride` floats apart: (even dims,
  // odd dims) into `out` (d_r per vector, contiguous); interleave is its inverse.
  void deinterleave(const LayerContext& ctx, const float* in, int64_t stride, int64_t count, float* out) const;
  void interleave(const LayerContext& ctx, const float* in, int64_t count, float* out, int64_t stride) const;
  // The SP buffers of an up projection's latent input (its own: the stage's are hidden wide).
  SequenceParallelBuffers latent_buffers(const Workspace& w) const;

  int layer_;
  int64_t hidden_;
  int heads_;
  int q_lora_rank_, kv_lora_rank_, d_nope_, d_rope_, d_v_;
  int q_dim_;     // d_n + d_r
  int kv_dim_;    // d_n + d_v
  int core_dim_;  // A = max(q_dim_, d_v)
  bool qk_layernorm_;
  float norm_eps_;
  bool bias_;
  double init_std_;
  int num_layers_;
  float attention_dropout_;
  float rotary_base_;
  bool yarn_;                    // --rope-type yarn
  kernels::YarnRope yarn_rope_;  // its settings
  double softmax_mscale_;        // yarn_mscale(factor, mscale_all_dim)
  int heads_local_ = 0;  // from the layout
  int64_t q_down_ = -1, kv_down_ = -1, q_norm_ = -1, kv_norm_ = -1;  // offsets of the replicated tensors
  ColumnParallelLinear q_proj_;  // linear_q_proj, or linear_q_up_proj with --q-lora-rank
  ColumnParallelLinear kv_up_;
  RowParallelLinear proj_;
};

}  // namespace mt::model
