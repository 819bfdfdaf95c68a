// The op harness's reference loops: what every backend op table entry must compute, written as
// plain loops in double precision (inputs widened from the fp32 the entries see), plus the inputs'
// generator and central differences for the grad mode. No backend code here: the references
// follow the contracts of kernels/cpu/ops.h and backend/ops.h, not any kernel.
// Tested in tests/unit/backend/test_op_harness.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/common/op_params.h"

namespace mt::harness {

using kernels::AttentionShape;

// n values uniform in [low, high) from std::mt19937(seed): every case's inputs are reproducible.
std::vector<float> random_floats(size_t n, uint32_t seed, float low = -1.0f, float high = 1.0f);
std::vector<double> to_double(const std::vector<float>& values);
double rms(const std::vector<double>& values);

// Gradient of sum(dy * f(at)) with respect to `at`, by central differences in double (step
// 1e-6 max(1, |x|)).
std::vector<double> numeric_gradient(const std::function<std::vector<double>(const std::vector<double>&)>& f,
                                     std::vector<double> at, const std::vector<double>& dy);

// The same for a function applied to each of `rows` rows of `cols` separately (a norm's x): only
// the perturbed row is recomputed, since the others' differences are exactly 0.
std::vector<double> numeric_gradient_by_row(const std::function<std::vector<double>(const std::vector<double>&)>& f_row,
                                            const std::vector<double>& at, const std::vector<double>& dy, int64_t rows,
                                            int cols);

// --- normalisation ------------------------------------------------------------------------------
struct NormReference {
  std::vector<double> y, mean, rstd;
};
NormReference ref_layernorm(const std::vector<double>& x, const std::vector<double>& weight,
                            const std::vector<double>* bias, int64_t rows, int cols, double eps);
NormReference ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& weight, int64_t rows, int cols,
                          double eps);

// LayerNorm's analytic backward (xhat = (x - mean) rstd, g = dy w:
// dx = rstd (g - mean(g) - xhat mean(g xhat)), dweight = sum_r dy xhat, dbias = sum_r dy) and
// dx_terms = rstd g, the size of the terms dx is a difference of.
struct LayerNormGrads {
  std::vector<double> dx, dweight, dbias, dx_terms;
};
LayerNormGrads ref_layernorm_backward(const std::vector<float>& x, const std::vector<float>& weight,
                                      const std::vector<float>& dy, int64_t rows, int cols, double eps);

// --- activations --------------------------------------------------------------------------------
double ref_gelu(double x);             // tanh approximation
double ref_gelu_derivative(double x);  // d gelu / dx
std::vector<double> ref_gelu_all(const std::vector<double>& x);
std::vector<double> ref_gelu_erf_all(const std::vector<double>& x);  // exact: 0.5 x (1 + erf(x / sqrt 2))
double ref_silu(double x);
// y (rows, ffn) = silu(gate) * up over packed (rows, 2 ffn) gate | up rows.
std::vector<double> ref_swiglu(const std::vector<double>& gate_up, int64_t rows, int ffn);
// d_gate_up (rows, 2 ffn) from dy (rows, ffn).
std::vector<double> ref_swiglu_backward(const std::vector<float>& dy, const std::vector<float>& gate_up, int64_t rows,
                                        int ffn);

// --- rotary embedding ---------------------------------------------------------------------------
// RoPE (rotate-half) in double on fp32 angles computed as PyTorch does; `transpose` rotates back.
std::vector<double> ref_rope(const std::vector<double>& x, int64_t rows, int64_t row_stride, int heads, int head_dim,
                             const std::vector<int32_t>& positions, float base, bool transpose);
// YaRN's rotation in double on fp32 angles float(position) * inv_freq[i] (inv_freq: head_dim/2,
// kernels::yarn_inv_freq's), cos and sin times `concentration`; `transpose`: its transpose.
std::vector<double> ref_rope_yarn(const std::vector<double>& x, int64_t rows, int64_t row_stride, int heads,
                                  int head_dim, const std::vector<int32_t>& positions,
                                  const std::vector<float>& inv_freq, double concentration, bool transpose);

// --- cross-entropy ------------------------------------------------------------------------------
// Per-row max, sum of exp, target logit and loss log(sum exp) + max - target over the valid
// columns of (rows, ld) logits, and the gradient dloss (softmax - onehot), 0 in padded columns.
struct XentReference {
  std::vector<double> max, sumexp, target_logit, loss, grad;
};
XentReference ref_xent(const std::vector<double>& logits, int64_t rows, int64_t ld, int64_t valid_cols,
                       int64_t vocab_start, const std::vector<int32_t>& targets, const std::vector<double>& dloss);

// --- attention ----------------------------------------------------------------------------------
// Where Q, K and V sit in one input buffer (three compact blocks, or columns of one packed row).
struct AttentionLayout {
  AttentionShape shape;
  size_t q_offset = 0, k_offset = 0, v_offset = 0;
};
// Naive masked softmax attention and its analytic gradients (dP = dout . v,
// dS = P (dP - sum P dP), dq = scale dS k, dk = scale dS q, dv = P dout). Results compact: out, dq
// (batch, q_len, heads, dim); dk, dv (batch, kv_len, kv_heads, dim); lse (batch, heads, q_len),
// -inf where a query sees no key. dout is read with o_stride; doc_start empty for no documents.
// With shape.dropout.key.p > 0 the probabilities are dropped by double loops drawing each pair's
// keep decision from kernels::keyed_uniform (kernels/common/philox.h) at (row_ids[query] * total
// heads + global head, global key position): out = (P Z) V, dP = (dout . v) Z, dv = (P Z)^T dout.
// Non-causal shapes (shape.causal false): query t sees key j iff kv_pos0 + j < key_lengths[b]
// (host values; empty: every key), whatever t.
struct AttentionReference {
  std::vector<double> out, lse, dq, dk, dv;
};
AttentionReference ref_attention(const AttentionLayout& layout, const std::vector<double>& inputs,
                                 const std::vector<float>& dout, const std::vector<int32_t>& doc_start,
                                 const std::vector<int64_t>& row_ids = {},
                                 const std::vector<int32_t>& key_lengths = {});

// --- GEMM ---------------------------------------------------------------------------------------
// C (m, n) = alpha op(A) op(B) + beta C0, row-major with leading dimensions; a, b are the values
// the GEMM multiplies (bf16/f16 operands: their rounded values).
std::vector<double> ref_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                             const std::vector<float>& a, int64_t lda, const std::vector<float>& b, int64_t ldb,
                             double beta, const std::vector<float>& c0, int64_t ldc);

// --- AdamW --------------------------------------------------------------------------------------
// One step of PyTorch's AdamW on (param, exp_avg, exp_avg_sq) in double: p *= 1 - lr wd, then
// the Adam step with bias corrections, grads scaled by grad_scale first.
void ref_adamw_step(std::vector<double>& param, std::vector<double>& exp_avg, std::vector<double>& exp_avg_sq,
                    const std::vector<float>& grad, const kernels::AdamWParams& params);

}  // namespace mt::harness
