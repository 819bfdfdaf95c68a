// Self-attention (Megatron's SelfAttention): a column-parallel q/k/v projection (separate global
// tensors linear_q/k/v, adjacent locally so one GEMM covers them), RoPE on q and k, causal
// attention with GQA and document masks (the fused kernel, which keeps the log-sum-exp), and a
// row-parallel output projection. Under context parallelism (the LayerContext carries a ring
// attention) the core attention runs over the CP group: this rank's queries against every rank's
// keys and values, on the global positions of its two sequence chunks. TP splits by whole heads /
// query groups: this rank runs q_heads() query heads over kv_heads() key/value heads, local head j
// reading kv head j / (q_heads / kv_heads) exactly as the global model does. Tested through the
// model's finite differences, the PyTorch goldens, the TP = 2 stage test and, under CP, by
// tests/mpi/test_context_parallel_training.cpp.
#pragma once

#include "model/layers/layer_context.h"
#include "model/layers/linear.h"

namespace mt::model {

class SelfAttention {
 public:
  // What backward needs. attn and lse may be shared by several layers (selective recompute).
  struct Saved {
    float* qkv = nullptr;   // (rows, qkv_width), q and k after RoPE
    float* attn = nullptr;  // (rows, attention_width)
    float* lse = nullptr;   // (batch, q_heads, seq); under CP the ring's (batch, 2, q_heads, seq / 2)
  };
  // Workspace of one pass (shared by the layers of a stage).
  struct Buffers {
    SequenceParallelBuffers sequence_parallel;
    float* d_attn = nullptr;    // (rows, attention_width)
    float* d_qkv = nullptr;     // (rows, qkv_width)
  };

  static void declare(ParamDeclarations& declarations, const ModelConfig& config, int layer);
  SelfAttention(const ModelConfig& config, const ParamLayout& layout, int layer);

  int q_heads() const { return q_heads_; }
  int kv_heads() const { return kv_heads_; }
  int64_t qkv_width() const { return qkv_.out_features(); }
  int64_t attention_width() const { return proj_.in_features(); }
  // The core attention's shape for `batch` samples of `seq` tokens on this rank.
  kernels::AttentionShape attention_shape(int batch, int seq) const;

  // out_seq (sequence rows, hidden) = proj(attention(rope(qkv(x_seq)))) + bias, before dropout.
  void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, Saved& saved,
               const Buffers& buffers, float* out_seq) const;
  // The core attention alone, from saved.qkv (selective recompute rebuilds attn and lse).
  void core_forward(const LayerContext& ctx, const LayerPass& pass, Saved& saved) const;
  // dx_seq (sequence rows, hidden) from dy_seq (sequence rows, hidden); parameter grads accumulate.
  void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                const Saved& saved, const Buffers& buffers, float* dx_seq) const;

 private:

  int head_dim_, q_heads_, kv_heads_;
  float rotary_base_;
  bool rope_;
  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
};

}  // namespace mt::model
