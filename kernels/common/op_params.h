// Parameter structs of the fused ops, shared by every backend's kernels (CPU now, CUDA later) and
// by the backend op table (lib/backend/ops.h): plain values and device pointers, no pointers to
// host-only state.
// The ops that take them are documented in kernels/cpu/ops.h.
#pragma once

#include <cstdint>

namespace mt::kernels {

// Dropout keys: every element's keep decision is a pure function of (seed, stream, iteration,
// global row id, global column), never of rank, micro-batch or local offset (DESIGN.md sec. 3).
struct DropoutKey {
  uint64_t seed = 0;
  uint64_t stream = 0;     // stream_id of the dropout site mixed with the global layer index
  uint64_t iteration = 0;
  float p = 0;             // drop probability
};

// Dropout on the attention probabilities (Megatron's attention_dropout), inside the fused kernel:
// P (the softmax) becomes P * keep / (1 - p), where keep(query, key) is drawn from
// keyed_uniform(seed, stream, iteration, row, key position) (kernels/common/philox.h) with
// row = row_ids[query] * q_heads_total + q_head0 + h: the global token id of the query (global
// sample * seq + position), its global head, and the key's global position, so every layout
// (TP heads, CP chunks, PP, DP, recompute) draws the same mask. key.p = 0: no dropout, row_ids
// may be null. The lse stays that of the undropped scores.
struct AttentionDropout {
  DropoutKey key;                    // key.p in [0, 1)
  const int64_t* row_ids = nullptr;  // (batch, q_len) device: global token id of each query row
  int q_head0 = 0;                   // global index of local query head 0 (TP)
  int q_heads_total = 1;             // query heads of the whole model
};

// Causal attention over one block of queries and keys (the whole sequence, or one context-
// parallel block). Query token t of sample b sits at global position q_pos0 + t; key s at
// kv_pos0 + s. A query attends key s iff kv_pos0+s <= q_pos0+t and, when doc_start is given,
// kv_pos0+s >= doc_start[b*q_len+t] (the first position of the query's document).
// Query head h reads kv head h / (q_heads / kv_heads) (GQA; MHA when equal).
// Element (b, t, h, d) of Q is q[(b*q_len + t)*q_stride + h*head_dim + d]; K, V likewise with
// kv_len, k_stride/v_stride and kv heads; O with o_stride and q heads.
// lse is (batch, q_heads, q_len): the log-sum-exp of the scaled scores of each query row,
// -inf (and an all-zero output row) when a query sees no key.
// Backward writes dq, dk, dv, or adds to them with accumulate_grads (context parallelism sums the
// grads of a query block over the key blocks it meets, and of a key block over the query blocks).
// Non-causal mode (causal = false, BERT's bidirectional padding mask): query t of sample b sees
// every key s with kv_pos0+s < key_lengths[b] (the sample's valid tokens, padding after them, as
// Megatron's padding_mask; null key_lengths: every key), doc_start must be null. Padded query rows
// attend the valid keys like any other row (Megatron masks them whole; neither reaches a loss).
// The CPU kernels run it (the ring attention, CP, block by block); the CUDA entries refuse it.
struct AttentionShape {
  int batch = 1;
  int q_len = 0;
  int kv_len = 0;
  int q_heads = 1;
  int kv_heads = 1;
  int head_dim = 0;
  int64_t q_stride = 0;
  int64_t k_stride = 0;
  int64_t v_stride = 0;
  int64_t o_stride = 0;
  int64_t q_pos0 = 0;
  int64_t kv_pos0 = 0;
  float scale = 1.0f;
  bool accumulate_grads = false;
  AttentionDropout dropout;  // none by default
  bool causal = true;
  const int32_t* key_lengths = nullptr;  // (batch) device: non-causal only, valid keys per sample
};

struct AdamWParams {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0;
  float bias_correction1 = 1;  // 1 - beta1^step
  float bias_correction2 = 1;  // 1 - beta2^step
  float grad_scale = 1;        // grads are multiplied by this first (clipping, loss-scale unscale)
};

}  // namespace mt::kernels
