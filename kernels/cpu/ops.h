// The CPU op table: every fused, vectorised CPU kernel mt trains with, as one struct of function
// pointers. The implementations (cpu/impl/*.inc) are compiled once per ISA level
// (ops_x86_64_v2.cpp, ops_avx2.cpp, ops_avx512.cpp, each with its own -m flags) and the table
// for the active level is picked at run time (cpu/isa.h). lib reaches these kernels only through
// the backend op table (lib/backend/ops.h), which the CPU backend fills from this one; the op
// harness runs every entry of that table at every level the CPU has against double-precision
// reference loops (tests/unit/backend/test_op_harness.cpp).
//
// Conventions for every op:
//   - Row-major; `rows` is the number of tokens (B*T), `cols` the feature width.
//   - Backward ops WRITE input gradients (dx = ...) and ACCUMULATE parameter gradients
//     (dweight += ...), so micro-batches accumulate into the fp32 main grads.
//   - Threads: OpenMP over the process's threads; results do not depend on the thread count
//     unless noted (reductions over rows into parameter grads use a fixed row partition).
//   - No op allocates per call on the hot path beyond small per-thread scratch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/op_params.h"
#include "kernels/common/yarn_rope.h"
#include "kernels/cpu/isa.h"

namespace mt::kernels::cpu {

// The parameter structs live in kernels/common/op_params.h (shared with the CUDA kernels).
using kernels::AdamWParams;
using kernels::AttentionShape;
using kernels::DropoutKey;

struct CpuOps {
  // --- normalisation -------------------------------------------------------------------------
  // y = (x - mean) * rstd * weight + bias; mean, rstd (rows) saved for backward; bias nullable.
  void (*layernorm_forward)(const float* x, const float* weight, const float* bias, float* y, float* mean,
                            float* rstd, int64_t rows, int cols, float eps);
  // dx written; dweight, dbias (nullable) accumulated.
  void (*layernorm_backward)(const float* dy, const float* x, const float* weight, const float* mean,
                             const float* rstd, float* dx, float* dweight, float* dbias, int64_t rows, int cols);
  // y = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps) saved (rows).
  void (*rmsnorm_forward)(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int cols,
                          float eps);
  void (*rmsnorm_backward)(const float* dy, const float* x, const float* weight, const float* rstd, float* dx,
                           float* dweight, int64_t rows, int cols);

  // --- activations ---------------------------------------------------------------------------
  // GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  void (*gelu_forward)(const float* x, float* y, int64_t n);
  void (*gelu_backward)(const float* dy, const float* x, float* dx, int64_t n);
  // GELU, exact (erf) form (PyTorch's F.gelu, BERT's LM head): 0.5 x (1 + erf(x / sqrt(2))).
  void (*gelu_erf_forward)(const float* x, float* y, int64_t n);
  void (*gelu_erf_backward)(const float* dy, const float* x, float* dx, int64_t n);
  // y = tanh(x) (BERT's pooler); backward from the forward's output: dx = dy (1 - y^2).
  void (*tanh_forward)(const float* x, float* y, int64_t n);
  void (*tanh_backward)(const float* dy, const float* y, float* dx, int64_t n);
  // SwiGLU on a packed (rows, 2*ffn) input: gate = row[0:ffn], up = row[ffn:2 ffn];
  // y (rows, ffn) = silu(gate) * up. Backward writes d_gate_up (rows, 2*ffn).
  void (*swiglu_forward)(const float* gate_up, float* y, int64_t rows, int ffn);
  void (*swiglu_backward)(const float* dy, const float* gate_up, float* d_gate_up, int64_t rows, int ffn);

  // --- rotary position embedding (rotate-half layout, as Megatron/HF LLaMA) ----------------------
  // In place on `heads` heads of head_dim starting at x + row*row_stride: pairs (i, i + D/2) are
  // rotated by angle pos * base^(-2i/D), computed in fp32 as PyTorch does
  // (inv_freq = 1 / base^(2i/D) in fp32, angle = float(pos) * inv_freq). positions: (rows).
  void (*rope_forward)(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim,
                       const int32_t* positions, float base);
  // The transpose rotation (gradient of rope_forward), in place on dx.
  void (*rope_backward)(float* dx, int64_t rows, int64_t row_stride, int heads, int head_dim,
                        const int32_t* positions, float base);
  // YaRN's rotation (kernels/common/yarn_rope.h): the same layout and pairs, by angle
  // float(pos) * inv_j with YaRN's per-dimension inv_j (yarn_inv_freq), cos and sin multiplied by
  // yarn.concentration; backward is its transpose (the concentration scales it too).
  void (*rope_yarn_forward)(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim,
                            const int32_t* positions, const YarnRope& yarn);
  void (*rope_yarn_backward)(float* dx, int64_t rows, int64_t row_stride, int heads, int head_dim,
                             const int32_t* positions, const YarnRope& yarn);

  // --- attention (shape and masking: kernels/common/op_params.h) ------------------------------
  // Works in tiles of at most 64 queries and 64 keys (online softmax): memory does not grow with
  // T^2. With shape.dropout.key.p > 0 the probabilities are dropped inside (AttentionDropout):
  // the backward draws the forward's mask again from the same keys, nothing is stored.
  void (*attention_forward)(const AttentionShape& shape, const float* q, const float* k, const float* v,
                            const int32_t* doc_start, float* out, float* lse);
  // dq, dk, dv written, or added to with shape.accumulate_grads (same strides as q, k, v); out
  // and lse are the forward's results: over every key block when the keys came in blocks.
  void (*attention_backward)(const AttentionShape& shape, const float* q, const float* k, const float* v,
                             const int32_t* doc_start, const float* out, const float* dout, const float* lse,
                             float* dq, float* dk, float* dv);
  // Merges the result of one more key block into a running result (ring attention): with
  // l = log(exp(lse) + exp(part_lse)), out = exp(lse - l) out + exp(part_lse - l) part_out and
  // lse = l, per query row and head. Layouts as the forward's (out, part_out with o_stride); a
  // part with lse -inf leaves the running result as it is, a running row with lse -inf becomes
  // the part (its out is not read, so it may start uninitialised).
  void (*attention_merge)(const AttentionShape& shape, float* out, float* lse, const float* part_out,
                          const float* part_lse);

  // --- embedding -----------------------------------------------------------------------------
  // y[r] = wte[tokens[r] - vocab_start] (+ wpe[positions[r]] when wpe is given); tokens outside
  // [vocab_start, vocab_end) give a zero row (vocab-parallel shard). wte: (vocab_end-vocab_start, cols).
  void (*embedding_forward)(const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe,
                            float* y, int64_t rows, int cols, int64_t vocab_start, int64_t vocab_end);
  // Sparse: only the rows of dwte that tokens touch are accumulated (+=); dwpe (nullable) likewise.
  // Deterministic: the result does not depend on the thread count.
  void (*embedding_backward)(const int32_t* tokens, const int32_t* positions, const float* dy, float* dwte,
                             float* dwpe, int64_t rows, int cols, int64_t vocab_start, int64_t vocab_end);

  // --- cross-entropy on a stored logits block (the vocab-parallel steps of Megatron) ----------
  // logits: (rows, ld), of which columns [0, valid_cols) are real vocabulary (global ids
  // vocab_start + c); padded columns never enter the softmax.
  void (*xent_row_max)(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols, float* row_max);
  // row_sumexp[r] = sum_c exp(logits[r,c] - row_max[r]) over the valid columns.
  void (*xent_row_sumexp)(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols,
                          const float* row_max, float* row_sumexp);
  // target_logit[r] = logits[r, targets[r] - vocab_start] when that column is in this block's
  // valid range, else 0.
  void (*xent_target_logit)(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols, int64_t vocab_start,
                            const int32_t* targets, float* target_logit);
  // In place: logits -> dlogits = dloss[r] * (softmax - onehot(target)); padded columns -> 0.
  // row_max/row_sumexp are the global (all-shard) values.
  void (*xent_backward)(float* logits, int64_t rows, int64_t ld, int64_t valid_cols, int64_t vocab_start,
                        const int32_t* targets, const float* row_max, const float* row_sumexp, const float* dloss);
  // The loss from the global steps, summed on the host in fp64 in row order (deterministic):
  // *loss_sum = sum_r mask[r] * (log(row_sumexp[r]) + row_max[r] - target_logit[r]) and
  // *mask_sum = sum_r mask[r]; loss_mask nullable (every row counts 1).
  void (*xent_loss_sums)(const float* row_max, const float* row_sumexp, const float* target_logit,
                         const float* loss_mask, int64_t rows, double* loss_sum, double* mask_sum);

  // --- elementwise, bias, reductions ------------------------------------------------------------
  void (*add_inplace)(float* y, const float* x, int64_t n);            // y += x
  void (*scale_inplace)(float* x, int64_t n, float s);                 // x *= s
  void (*bias_add)(float* y, const float* bias, int64_t rows, int cols);       // y[r,:] += bias
  void (*bias_backward)(const float* dy, float* dbias, int64_t rows, int cols);  // dbias += sum_r dy[r,:]
  double (*sum_squares)(const float* x, int64_t n);                    // fp64 accumulation
  bool (*all_finite)(const float* x, int64_t n);

  // --- dropout (in place; the mask is regenerated from the key in backward, never stored) ------
  // row_ids: (rows) global token ids (global sample * seq_length + position); col0: global column
  // of column 0. Kept elements are scaled by 1/(1-p).
  void (*dropout_forward)(float* x, int64_t rows, int cols, const int64_t* row_ids, int64_t col0,
                          const DropoutKey& key);
  void (*dropout_backward)(float* dx, int64_t rows, int cols, const int64_t* row_ids, int64_t col0,
                           const DropoutKey& key);

  // --- optimizer -----------------------------------------------------------------------------
  // One pass of AdamW (PyTorch's formula: decoupled decay p *= 1 - lr*wd, then the Adam step
  // with bias corrections) over n elements; refreshes the bf16 copy when param_bf16 is given.
  void (*adamw_update)(float* param, uint16_t* param_bf16, const float* grad, float* exp_avg, float* exp_avg_sq,
                       int64_t n, const AdamWParams& params);
};

// The table for a given level (at or below detected_isa()); cpu_ops() uses active_isa().
const CpuOps& cpu_ops(CpuIsa isa);
const CpuOps& cpu_ops();

}  // namespace mt::kernels::cpu
