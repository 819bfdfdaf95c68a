// Host-callable entry points of the CUDA compute kernels: one function per fused entry of the
// backend op table (lib/backend/ops.h), with the CPU kernel's signature (kernels/cpu/ops.h holds
// the contracts) plus the CUDA stream (a cudaStream_t as void*) the work is queued on. Pointers are
// device pointers; parameter structs (kernels/common/op_params.h) are passed by value to the
// kernels, and AttentionShape::dropout.row_ids is a device pointer. No CUDA headers here, so lib/
// compiles with the host compiler. Every function only queues work: it never copies to or from
// the host and never synchronises (the op harness checks it on the GPU); a launch error throws
// std::runtime_error naming the entry. Implementations: gemm.cu and elementwise.cu (GEMM,
// activations, RoPE, dropout, AdamW), norms.cu and loss.cu (norms, embedding, cross-entropy,
// reductions), attention.cu, and moe_router.cu, moe_experts.cu, moe_permute.cu (MoE). Tested on a
// GPU by the op harness (tests/gpu/test_cuda_op_harness.cpp, CTest label gpu) against the
// double-precision references every backend is held to.
#pragma once

#include <cstdint>

#include "kernels/common/moe_router_params.h"
#include "kernels/common/fp8.h"
#include "kernels/common/op_params.h"
#include "kernels/common/yarn_rope.h"

namespace mt::kernels::cuda {

// The element types the GEMM takes (core/dtype.h stays in lib).
enum class GemmOperand { f32, bf16, f16 };

// --- GEMM (gemm.cu): cuBLASLt, fp32 accumulation, TF32 never used for f32 operands -----------------
// C = alpha op(A) op(B) + beta C, row-major, as backend::Ops::gemm.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
          const void* b, int64_t ldb, float beta, float* c, int64_t ldc, GemmOperand operand, void* stream);
// The fused entries, as backend::Ops::gemm_bias and gemm_bias_gelu: cuBLASLt's BIAS and
// GELU_AUX(_BIAS) epilogues, or gemm then bias_add (then gelu_forward) where cuBLASLt turns the
// shape down (see gemm.cu).
void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b,
               int64_t ldb, const float* bias, float* c, GemmOperand operand, void* stream);
void gemm_bias_gelu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                    const void* b, int64_t ldb, const float* bias, float* pre, float* y, GemmOperand operand,
                    void* stream);
// How many gemm_bias / gemm_bias_gelu calls so far ran the unfused kernels instead of an epilogue.
int64_t gemm_epilogue_fallback_calls();

// --- activations, RoPE, elementwise, dropout, AdamW (elementwise.cu) -----------------------------
void gelu_forward(const float* x, float* y, int64_t n, void* stream);
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n, void* stream);
void gelu_erf_forward(const float* x, float* y, int64_t n, void* stream);
void gelu_erf_backward(const float* dy, const float* x, float* dx, int64_t n, void* stream);
void tanh_forward(const float* x, float* y, int64_t n, void* stream);
void tanh_backward(const float* dy, const float* y, float* dx, int64_t n, void* stream);
void swiglu_forward(const float* gate_up, float* y, int64_t rows, int ffn, void* stream);
void swiglu_backward(const float* dy, const float* gate_up, float* d_gate_up, int64_t rows, int ffn, void* stream);
void rope_forward(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, const int32_t* positions,
                  float base, void* stream);
void rope_backward(float* dx, int64_t rows, int64_t row_stride, int heads, int head_dim, const int32_t* positions,
                   float base, void* stream);
void rope_yarn_forward(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, const int32_t* positions,
                       const YarnRope& yarn, void* stream);
void rope_yarn_backward(float* dx, int64_t rows, int64_t row_stride, int heads, int head_dim,
                        const int32_t* positions, const YarnRope& yarn, void* stream);
void add_inplace(float* y, const float* x, int64_t n, void* stream);
void scale_inplace(float* x, int64_t n, float s, void* stream);
void bias_add(float* y, const float* bias, int64_t rows, int cols, void* stream);
void dropout_forward(float* x, int64_t rows, int cols, const int64_t* row_ids, int64_t col0, const DropoutKey& key,
                     void* stream);
void dropout_backward(float* dx, int64_t rows, int cols, const int64_t* row_ids, int64_t col0, const DropoutKey& key,
                      void* stream);
void adamw_update(float* param, uint16_t* param_bf16, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWParams& params, void* stream);

// --- norms, embedding, cross-entropy, reductions (norms.cu, loss.cu) -----------------------------
void layernorm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean, float* rstd,
                       int64_t rows, int cols, float eps, void* stream);
void layernorm_backward(const float* dy, const float* x, const float* weight, const float* mean, const float* rstd,
                        float* dx, float* dweight, float* dbias, int64_t rows, int cols, void* stream);
void rmsnorm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int cols, float eps,
                     void* stream);
void rmsnorm_backward(const float* dy, const float* x, const float* weight, const float* rstd, float* dx,
                      float* dweight, int64_t rows, int cols, void* stream);
void bias_backward(const float* dy, float* dbias, int64_t rows, int cols, void* stream);
void embedding_forward(const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe, float* y,
                       int64_t rows, int cols, int64_t vocab_start, int64_t vocab_end, void* stream);
void embedding_backward(const int32_t* tokens, const int32_t* positions, const float* dy, float* dwte, float* dwpe,
                        int64_t rows, int cols, int64_t vocab_start, int64_t vocab_end, void* stream);
void xent_row_max(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols, float* row_max, void* stream);
void xent_row_sumexp(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols, const float* row_max,
                     float* row_sumexp, void* stream);
void xent_target_logit(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols, int64_t vocab_start,
                       const int32_t* targets, float* target_logit, void* stream);
void xent_backward(float* logits, int64_t rows, int64_t ld, int64_t valid_cols, int64_t vocab_start,
                   const int32_t* targets, const float* row_max, const float* row_sumexp, const float* dloss,
                   void* stream);
void xent_loss_sums(const float* row_max, const float* row_sumexp, const float* target_logit, const float* loss_mask,
                    int64_t rows, double* loss_sum, double* mask_sum, void* stream);
void sum_squares(const float* x, int64_t n, double* sum, void* stream);
void all_finite(const float* x, int64_t n, int32_t* finite, void* stream);

// --- attention (attention.cu): fused causal attention, GQA, document masks, lse, dropout ---------
void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                       const int32_t* doc_start, float* out, float* lse, void* stream);
void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                        const int32_t* doc_start, const float* out, const float* dout, const float* lse, float* dq,
                        float* dk, float* dv, void* stream);
void attention_merge(const AttentionShape& shape, float* out, float* lse, const float* part_out,
                     const float* part_lse, void* stream);

// --- MoE (issue 22): router (moe_router.cu), experts (moe_experts.cu), dispatcher (moe_permute.cu) --
// The contracts are kernels/cpu/moe_router.h, grouped_gemm.h, moe_expert_ops.h and moe_permute.h;
// the signatures those functions' plus the stream. The grouped GEMMs' counts (group_rows,
// group_depths) are host memory, read while the work is queued; every other pointer is device
// memory. The aux entries skip rows whose id lies outside the groups and record the first such
// id with the stream they were queued on; moe_router_take_deferred_error(stream), called after
// `stream` has drained (the backend's synchronize), throws that stream's record as the CPU's
// std::invalid_argument and clears it (another stream's record stays for its own synchronize).
void moe_router_topk(const float* logits, const float* expert_bias, int64_t rows, const MoeTopkParams& params,
                     int32_t* topk_indices, float* probs, uint8_t* routing_map, void* stream);
void moe_router_topk_backward(const float* logits, const int32_t* topk_indices, const float* dprobs,
                              const uint8_t* routing_map, int64_t rows, const MoeTopkParams& params, float* dlogits,
                              void* stream);
void moe_router_aux_sums(const float* logits, int64_t rows, int experts, int topk, MoeScoreFunction score_function,
                         const int64_t* row_ids, int64_t sequence_length, int64_t groups, float* counts,
                         float* prob_sums, void* stream);
void moe_router_aux_backward(const float* logits, int64_t rows, int experts, MoeScoreFunction score_function,
                             const int64_t* row_ids, int64_t sequence_length, int64_t groups, const float* weights,
                             float scale, float* dlogits, void* stream);
void moe_router_take_deferred_error(void* stream);
// *sum = the sum over rows of logsumexp^2 (written, in row order in double).
void moe_router_z_loss_sum(const float* logits, int64_t rows, int experts, double* sum, void* stream);
void moe_router_z_loss_backward(const float* logits, int64_t rows, int experts, float scale, float* dlogits,
                                void* stream);
void moe_router_capacity_drop(float* probs, uint8_t* routing_map, int64_t rows, int experts, int64_t capacity,
                              MoeDropPolicy policy, bool pad_to_capacity, void* stream);
void moe_router_tokens_per_expert(const uint8_t* routing_map, int64_t rows, int experts, float* counts, void* stream);
void moe_router_expert_bias_update(float* bias, const float* counts, int experts, float rate, void* stream);
void grouped_gemm(bool trans_b, int64_t groups, const int64_t* group_rows, int64_t n, int64_t k, float alpha,
                  const void* a, int64_t lda, const void* b, int64_t ldb, int64_t b_group_stride, float beta, float* c,
                  int64_t ldc, GemmOperand operand, void* stream);
void grouped_gemm_ragged_k(int64_t groups, const int64_t* group_depths, int64_t m, int64_t n, float alpha,
                           const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c, int64_t ldc,
                           int64_t c_group_stride, GemmOperand operand, void* stream);
void moe_scale_rows(const float* x, const float* scale, float* y, int64_t rows, int cols, void* stream);
void moe_scale_rows_backward(const float* dy, const float* x, const float* scale, float* dx, float* d_scale,
                             int64_t rows, int cols, void* stream);
void moe_expert_counts(const uint8_t* routing_map, int64_t tokens, int experts, int64_t* counts, void* stream);
void moe_route_index(const uint8_t* routing_map, const float* probs, int64_t tokens, int experts, int32_t* row_token,
                     float* row_probs, void* stream);
void moe_permute_rows(const float* in, const int32_t* row_index, int64_t rows, int64_t cols, float* out, void* stream);
void moe_unpermute_rows(const float* in, const int32_t* row_index, int64_t rows, int64_t cols, float* out,
                        int64_t out_rows, void* stream);
void moe_unroute_probs(const float* row_grads, const int32_t* row_token, const int64_t* expert_rows, int64_t tokens,
                       int experts, float* dprobs, void* stream);
void moe_sort_chunks(const float* in, int64_t cols, const int64_t* chunk_rows, const int32_t* order, int chunks,
                     float* out, void* stream);
// --- end of MoE
// --- FP8 (fp8.cu): quantise with amax, byte transpose, cuBLASLt FP8 GEMM, delayed scaling ------
// Contracts: lib/backend/ops.h (family "fp8"); tested in tests/gpu/test_cuda_fp8.cpp. The GEMM needs compute capability 8.9 or newer and
// throws std::runtime_error naming the device below it; its argument refusals are
// std::invalid_argument, as the CPU entry's.
void fp8_quantize(const float* x, int64_t n, const float* scale, Fp8Type type, uint8_t* out, float* amax,
                  void* stream);
void fp8_transpose(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out, void* stream);
void gemm_fp8(int64_t m, int64_t n, int64_t k, float alpha, const uint8_t* a, Fp8Type a_type,
              const float* a_scale_inv, int64_t lda, const uint8_t* b, Fp8Type b_type, const float* b_scale_inv,
              int64_t ldb, float beta, float* c, int64_t ldc, void* stream);
void fp8_update_scales(float* amax, float* amax_history, float* scale, float* scale_inv, int64_t tensors,
                       const Fp8ScalingParams& params, void* stream);
// How many gemm_fp8 calls so far took the plain kernel because cuBLASLt turned their shape down.
int64_t gemm_fp8_fallback_calls();
// That plain kernel on its own (gemm_fp8's arguments, unchecked; any device, slow): one thread per
// element of C, the exact products added in order in fp32.
void gemm_fp8_plain(int64_t m, int64_t n, int64_t k, float alpha, const uint8_t* a, Fp8Type a_type,
                    const float* a_scale_inv, int64_t lda, const uint8_t* b, Fp8Type b_type, const float* b_scale_inv,
                    int64_t ldb, float beta, float* c, int64_t ldc, void* stream);

}  // namespace mt::kernels::cuda
