// Self-attention (Megatron's SelfAttention), the AttentionKind::self_attention variant: a
// column-parallel q/k/v projection (separate global tensors linear_q/k/v, adjacent locally so one
// GEMM covers them), RoPE on q and k (rotary models), causal attention with GQA and document masks
// (the fused kernel, which keeps the log-sum-exp), and a row-parallel output projection. Under
// context parallelism (the LayerContext carries a ring attention) the core attention runs over
// the CP group: this rank's queries against every rank's keys and values, on the global positions
// of its two sequence chunks. TP splits by whole heads / query groups: this rank runs q_heads()
// query heads over kv_heads() key/value heads, local head j reading kv head j / (q_heads /
// kv_heads) exactly as the global model does. Init: the projections N(0, init_method_std), the
// output projection N(0, init_method_std / sqrt(2 num_layers)), biases 0. Attention dropout
// (--attention-dropout, training passes only) runs inside the fused kernel, keyed by the global
// token ids of the micro-batch, the global head (TP rank * local heads + local head) and the
// iteration (kernels/common/op_params.h, AttentionDropout): no mask is stored, and a recomputed
// forward (selective or full recompute) and the backward draw the same mask. Non-causal (BERT):
// every query sees its sample's valid keys (the micro-batch's key_lengths), under CP too (the
// ring passes them on); refused with document masks. Tested through the
// model's finite differences, the PyTorch goldens, the TP = 2 stage test and, under CP, by
// tests/mpi/test_context_parallel_training.cpp.
#pragma once

#include "model/layers/decoder_layer.h"

namespace mt::model {

class SelfAttention : public AttentionVariant {
 public:
  // causal false: BERT's bidirectional attention, keys limited to each sample's valid tokens
  // (MicroBatch::key_lengths, Megatron's padding mask).
  SelfAttention(const ModelConfig& config, int layer, bool causal = true);

  void declare(ParamDeclarations& declarations) const override;
  void bind(const ParamLayout& layout) override;

  int q_heads() const { return q_heads_; }    // local
  int kv_heads() const { return kv_heads_; }  // local
  int64_t qkv_width() const { return qkv_.out_features(); }
  int64_t attention_width() const { return proj_.in_features(); }

  std::unique_ptr<BlockBuffers> lay_out_saved(BufferSource& source, const ActivationRows& rows,
                                              bool keep_core) const override;
  std::unique_ptr<BlockBuffers> lay_out_workspace(BufferSource& source, const ActivationRows& rows,
                                                  bool rebuild_core) const override;
  int64_t widest_gemm_operand() const override;
  kernels::AttentionShape core_shape(int batch, int seq) const override;

  // out_seq (sequence rows, hidden) = proj(attention(rope(qkv(x_seq)))) + bias, before dropout.
  void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, BlockBuffers& saved,
               BlockBuffers& workspace, const SequenceParallelBuffers& full_rows, float* out_seq) const override;
  // dx_seq (sequence rows, hidden) from dy_seq (sequence rows, hidden); rebuilds the core
  // attention first when the saved set does not keep it.
  void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                BlockBuffers& saved, BlockBuffers& workspace, const SequenceParallelBuffers& full_rows,
                float* dx_seq) const override;

 private:
  struct Saved;
  struct Workspace;
  // The core attention's outputs: kept in the saved set, or (selective recompute) the workspace's.
  struct Core {
    float* attn;  // (rows, attention_width)
    float* lse;   // (batch, q_heads, seq); under CP the ring's (batch, 2, q_heads, seq / 2)
  };
  static Core core_of(const Saved& saved, const Workspace& workspace);
  // The attention-probability dropout of this pass (p = 0 outside training).
  kernels::AttentionDropout dropout_of(const LayerContext& ctx, const LayerPass& pass) const;
  // Non-causal mode: mt::Error with document masks.
  void check_mask(const LayerPass& pass) const;
  // The core attention from the saved q/k/v into `core`.
  void core_forward(const LayerContext& ctx, const LayerPass& pass, const float* qkv, const Core& core) const;

  int layer_;
  int64_t hidden_;
  int head_dim_, heads_, groups_;  // global heads and query groups
  bool bias_;
  double init_std_;
  int num_layers_;                 // the output projection's init scale
  int q_heads_ = 0, kv_heads_ = 0; // local, from the layout
  float attention_dropout_;
  float rotary_base_;
  bool rope_;
  bool causal_;
  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
};

}  // namespace mt::model
