// The backend op table: every kernel lib/model and lib/optim run, as one struct of function
// pointers that a backend fills (the CPU backend in cpu_backend.cpp from kernels/cpu; a CUDA
// backend from kernels/cuda). Signatures hold raw pointers, sizes, the plain parameter structs of
// kernels/common/op_params.h and a stream handle, never std:: containers, so a device backend can
// fill every entry. Pointers are device pointers of the backend (host memory on the CPU); only the
// `host` side of a copy is on the host: the reductions (sum_squares, all_finite, xent_loss_sums)
// write device memory too, so no entry but synchronize, synchronize_event and a wait on the
// host's behalf makes the host wait for the stream (the trainer reads a step's loss, grad norm
// and finiteness with one copy and one synchronize). Tables are filled with designated initialisers.
//
// Contracts of the fused kernels (row-major, backward ops write input grads and accumulate
// parameter grads, results independent of the thread count) are those of kernels/cpu/ops.h; this
// file documents the entries the backend adds: memory, streams, stream order (host functions and
// events), copies, conversions and GEMM. On an asynchronous backend an entry returns once its
// work is queued on its stream; the host reads what that work wrote (a device_to_host copy's
// destination included) only after synchronizing the stream or an event recorded after it.
// Each backend also says which entries run on which element types (supports, with the entries
// listed as OpId in backend/op_list.h). Tested in tests/unit/backend/test_op_harness.cpp: the op
// harness (tests/harness/) runs every entry of every filled table against double-precision
// reference loops and prints each backend's coverage; stream order on an asynchronous table in
// tests/unit/backend/test_async_cpu_ops.cpp.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "backend/op_list.h"
#include "kernels/common/fp8.h"
#include "kernels/common/moe_router_params.h"
#include "kernels/common/op_params.h"
#include "kernels/common/yarn_rope.h"

namespace mt::backend {

using kernels::AdamWParams;
using kernels::AttentionShape;
using kernels::DropoutKey;

// The devices a backend runs on (backend/registry.h gives each one's table).
enum class Device { cpu, cuda };

// A queue of work on the backend's device (a CUDA stream): ops issued on one stream run in order.
// The CPU backend runs every op to completion on the calling thread's OpenMP team, so its handle is
// null and synchronize returns at once.
struct Stream {
  void* handle = nullptr;
};

// ---- stream order: host functions and events (see the entries of the same name below) ----------
// A marker in a stream's order (a CUDA event), made by create_event and freed by destroy_event.
struct Event {
  void* handle = nullptr;
};
// Host work run in a stream's order (cudaLaunchHostFunc's callback). An asynchronous backend runs
// it on a host thread of its own once the work issued before it has finished; it must not call
// the table (a CUDA callback may not call CUDA) and must not touch device memory.
using HostFunction = void (*)(void* argument);
// ---- end of stream order -------------------------------------------------------------------------

// What a buffer holds, for the memory records (DESIGN.md sec. 4); see memory.h.
enum class MemoryCategory { weights, grads, optimizer, activations, comm_buffers };
inline constexpr int kMemoryCategories = 5;
const char* memory_category_name(MemoryCategory category);

enum class CopyKind { device_to_device, host_to_device, device_to_host };

struct Ops {
  const char* name = nullptr;  // "cpu"
  Device device = Device::cpu;
  // Stream order: true when every entry has finished its work (and thrown any error) when it
  // returns, as on the CPU: stream order is then program order, so stream-ordered host work may
  // run at once instead of being queued (comm/stream_communicator.h relies on it).
  bool synchronous = false;

  // --- what this backend runs (for the op harness and start-up checks; never on the hot path) -
  // Whether entry `op` runs on elements of `dtype`: gemm on its operand type; convert and
  // round_through on the 16-bit side (bf16, f16) of a conversion with f32; fill and the fused
  // kernels on the f32 they compute in (the indices, masks and bf16 copies their signatures name
  // beside it included); entries that move bytes or answer queries (memory, streams, copy,
  // copy_2d, zero, gemm_operand_type) on every dtype. gemm, convert and round_through called on a
  // dtype they do not support throw std::invalid_argument naming it.
  bool (*supports)(OpId op, DType dtype);

  // --- memory --------------------------------------------------------------------------------
  // `bytes` of device memory, 64-byte aligned and zero-filled; throws std::bad_alloc when it
  // cannot. The category lets a backend pick a pool (e.g. pinned host memory for comm buffers);
  // the byte accounting is done once for every backend by backend::DeviceBuffer (memory.h).
  void* (*allocate)(int64_t bytes, MemoryCategory category);
  void (*release)(void* data, int64_t bytes, MemoryCategory category);

  // --- streams -------------------------------------------------------------------------------
  Stream (*default_stream)();
  // Blocks the host until every op issued on `stream` has finished. An asynchronous backend
  // rethrows here the first error its queued work on `stream` raised since the last synchronize.
  void (*synchronize)(Stream stream);

  // --- stream order: host functions and events -----------------------------------------------
  // Runs `function(argument)` once the work issued on `stream` before it has finished, and before
  // any work issued after it starts (cudaLaunchHostFunc). The CPU calls it at once, on the calling
  // thread (an exception propagates from here); an asynchronous backend returns at once, and an
  // exception `function` throws is rethrown by the next synchronize of `stream`.
  void (*launch_host_function)(Stream stream, HostFunction function, void* argument);
  // Events time and order stream work without reading a host clock around queued work: record
  // one before and one after, synchronize the later, read the seconds between them.
  Event (*create_event)();
  void (*destroy_event)(Event event);
  // Marks the point of `stream` after every op issued so far (cudaEventRecord). The CPU, whose ops
  // have finished by then, records the host clock now.
  void (*record_event)(Event event, Stream stream);
  // Blocks the host until the work before the event's last record has finished.
  void (*synchronize_event)(Event event);
  // Seconds from `start`'s last record to `end`'s (cudaEventElapsedTime); both must have been
  // recorded and completed (synchronize_event on the later), else it throws std::logic_error.
  double (*elapsed_seconds)(Event start, Event end);

  // --- copies, fills, conversions ------------------------------------------------------------
  void (*copy)(void* dst, const void* src, int64_t bytes, CopyKind kind, Stream stream);
  // `rows` rows of `width_bytes`, rows `src_pitch` / `dst_pitch` bytes apart (cudaMemcpy2D).
  void (*copy_2d)(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width_bytes, int64_t rows,
                  CopyKind kind, Stream stream);
  void (*fill)(float* x, int64_t n, float value, Stream stream);
  void (*zero)(void* x, int64_t bytes, Stream stream);
  // Element conversion between f32 and the bits of bf16 or f16 (round to nearest even, as
  // kernels/common/half.h); throws std::invalid_argument for any other pair.
  void (*convert)(const void* in, DType in_type, void* out, DType out_type, int64_t n, Stream stream);
  // fp32 values rounded to the nearest value of `through` (bf16 or f16), kept in fp32 storage.
  void (*round_through)(const float* in, float* out, int64_t n, DType through, Stream stream);

  // --- GEMM ----------------------------------------------------------------------------------
  // The element type this backend's GEMM takes for a training precision: f32 (fp32, and the
  // precisions it runs as fp32 GEMMs over rounded values) or bf16 / f16 bits (native products).
  DType (*gemm_operand_type)(Precision precision);
  // C = alpha op(A) op(B) + beta C, row-major, op = transpose or not; A and B of `operand_type`
  // (f32 values or bf16/f16 bits), C fp32 with fp32 accumulation.
  void (*gemm)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
               const void* b, int64_t ldb, float beta, float* c, int64_t ldc, DType operand_type, Stream stream);
  // GEMMs with the linear layers' epilogues fused (CUDA: cuBLASLt's BIAS and GELU_AUX(_BIAS)
  // epilogues where its heuristic offers an algorithm, else gemm, bias_add and gelu_forward; the
  // CPU: those three entries one after another, so its numbers are theirs bit for bit). Operands
  // and operand types as gemm's, alpha 1, beta 0 (outputs written, their old values not read);
  // outputs fp32, contiguous (leading dimension n); bias (n) fp32, added to every row.
  // C (m, n) = op(A) op(B) + bias; bias not null.
  void (*gemm_bias)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                    const void* b, int64_t ldb, const float* bias, float* c, DType operand_type, Stream stream);
  // pre (m, n) = op(A) op(B) + bias (null bias: none), y (m, n) = gelu(pre): gelu_forward's tanh
  // approximation; pre is the input gelu_backward takes. pre and y do not overlap.
  void (*gemm_bias_gelu)(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                         const void* b, int64_t ldb, const float* bias, float* pre, float* y, DType operand_type,
                         Stream stream);

  // --- fused kernels (contracts: kernels/cpu/ops.h) ------------------------------------------
  void (*layernorm_forward)(const float* x, const float* weight, const float* bias, float* y, float* mean,
                            float* rstd, int64_t rows, int cols, float eps, Stream stream);
  void (*layernorm_backward)(const float* dy, const float* x, const float* weight, const float* mean,
                             const float* rstd, float* dx, float* dweight, float* dbias, int64_t rows, int cols,
                             Stream stream);
  void (*rmsnorm_forward)(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int cols,
                          float eps, Stream stream);
  void (*rmsnorm_backward)(const float* dy, const float* x, const float* weight, const float* rstd, float* dx,
                           float* dweight, int64_t rows, int cols, Stream stream);
  void (*gelu_forward)(const float* x, float* y, int64_t n, Stream stream);
  void (*gelu_backward)(const float* dy, const float* x, float* dx, int64_t n, Stream stream);
  void (*gelu_erf_forward)(const float* x, float* y, int64_t n, Stream stream);
  void (*gelu_erf_backward)(const float* dy, const float* x, float* dx, int64_t n, Stream stream);
  void (*tanh_forward)(const float* x, float* y, int64_t n, Stream stream);
  void (*tanh_backward)(const float* dy, const float* y, float* dx, int64_t n, Stream stream);
  void (*swiglu_forward)(const float* gate_up, float* y, int64_t rows, int ffn, Stream stream);
  void (*swiglu_backward)(const float* dy, const float* gate_up, float* d_gate_up, int64_t rows, int ffn,
                          Stream stream);
  void (*rope_forward)(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, const int32_t* positions,
                       float base, Stream stream);
  void (*rope_backward)(float* dx, int64_t rows, int64_t row_stride, int heads, int head_dim,
                        const int32_t* positions, float base, Stream stream);
  // YaRN RoPE (issue 22, multi-latent attention's --rope-type yarn; kernels/common/yarn_rope.h).
  void (*rope_yarn_forward)(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim,
                            const int32_t* positions, const kernels::YarnRope& yarn, Stream stream);
  void (*rope_yarn_backward)(float* dx, int64_t rows, int64_t row_stride, int heads, int head_dim,
                             const int32_t* positions, const kernels::YarnRope& yarn, Stream stream);
  void (*attention_forward)(const AttentionShape& shape, const float* q, const float* k, const float* v,
                            const int32_t* doc_start, float* out, float* lse, Stream stream);
  void (*attention_backward)(const AttentionShape& shape, const float* q, const float* k, const float* v,
                             const int32_t* doc_start, const float* out, const float* dout, const float* lse,
                             float* dq, float* dk, float* dv, Stream stream);
  void (*attention_merge)(const AttentionShape& shape, float* out, float* lse, const float* part_out,
                          const float* part_lse, Stream stream);
  void (*embedding_forward)(const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe,
                            float* y, int64_t rows, int cols, int64_t vocab_start, int64_t vocab_end, Stream stream);
  void (*embedding_backward)(const int32_t* tokens, const int32_t* positions, const float* dy, float* dwte,
                             float* dwpe, int64_t rows, int cols, int64_t vocab_start, int64_t vocab_end,
                             Stream stream);
  void (*xent_row_max)(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols, float* row_max,
                       Stream stream);
  void (*xent_row_sumexp)(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols, const float* row_max,
                          float* row_sumexp, Stream stream);
  void (*xent_target_logit)(const float* logits, int64_t rows, int64_t ld, int64_t valid_cols, int64_t vocab_start,
                            const int32_t* targets, float* target_logit, Stream stream);
  void (*xent_backward)(float* logits, int64_t rows, int64_t ld, int64_t valid_cols, int64_t vocab_start,
                        const int32_t* targets, const float* row_max, const float* row_sumexp, const float* dloss,
                        Stream stream);
  // Adds the rows' loss sum (sum of mask[r] * loss[r], accumulated in double from zero as the
  // kernel does) to *loss_sum and the mask's sum to *mask_sum: device doubles, so the losses of a
  // step's micro-batches accumulate on the device in micro-batch order without a host wait.
  void (*xent_loss_sums)(const float* row_max, const float* row_sumexp, const float* target_logit,
                         const float* loss_mask, int64_t rows, double* loss_sum, double* mask_sum, Stream stream);
  void (*add_inplace)(float* y, const float* x, int64_t n, Stream stream);
  void (*scale_inplace)(float* x, int64_t n, float s, Stream stream);
  void (*bias_add)(float* y, const float* bias, int64_t rows, int cols, Stream stream);
  void (*bias_backward)(const float* dy, float* dbias, int64_t rows, int cols, Stream stream);
  // Adds sum_i x[i]^2 (accumulated in double from zero as the kernel does) to the device double
  // *sum: pieces added one call after another sum in call order.
  void (*sum_squares)(const float* x, int64_t n, double* sum, Stream stream);
  // Sets the device int *finite to 0 when an element of x is NaN or +-Inf (leaves it otherwise).
  void (*all_finite)(const float* x, int64_t n, int32_t* finite, Stream stream);
  void (*dropout_forward)(float* x, int64_t rows, int cols, const int64_t* row_ids, int64_t col0,
                          const DropoutKey& key, Stream stream);
  void (*dropout_backward)(float* dx, int64_t rows, int cols, const int64_t* row_ids, int64_t col0,
                           const DropoutKey& key, Stream stream);
  void (*adamw_update)(float* param, uint16_t* param_bf16, const float* grad, float* exp_avg, float* exp_avg_sq,
                       int64_t n, const AdamWParams& params, Stream stream);

  // --- MoE router (issue 22; contracts: kernels/cpu/moe_router.h, composed by model/moe/router.h)
  void (*moe_router_topk)(const float* logits, const float* expert_bias, int64_t rows,
                          const kernels::MoeTopkParams& params, int32_t* topk_indices, float* probs,
                          uint8_t* routing_map, Stream stream);
  void (*moe_router_topk_backward)(const float* logits, const int32_t* topk_indices, const float* dprobs,
                                   const uint8_t* routing_map, int64_t rows, const kernels::MoeTopkParams& params,
                                   float* dlogits, Stream stream);
  void (*moe_router_aux_sums)(const float* logits, int64_t rows, int experts, int topk,
                              kernels::MoeScoreFunction score_function, const int64_t* row_ids,
                              int64_t sequence_length, int64_t groups, float* counts, float* prob_sums,
                              Stream stream);
  void (*moe_router_aux_backward)(const float* logits, int64_t rows, int experts,
                                  kernels::MoeScoreFunction score_function, const int64_t* row_ids,
                                  int64_t sequence_length, int64_t groups, const float* weights, float scale,
                                  float* dlogits, Stream stream);
  // Writes the sum over rows of logsumexp^2 to the device double *sum.
  void (*moe_router_z_loss_sum)(const float* logits, int64_t rows, int experts, double* sum, Stream stream);
  void (*moe_router_z_loss_backward)(const float* logits, int64_t rows, int experts, float scale, float* dlogits,
                                     Stream stream);
  void (*moe_router_capacity_drop)(float* probs, uint8_t* routing_map, int64_t rows, int experts, int64_t capacity,
                                   kernels::MoeDropPolicy policy, bool pad_to_capacity, Stream stream);
  void (*moe_router_tokens_per_expert)(const uint8_t* routing_map, int64_t rows, int experts, float* counts,
                                       Stream stream);
  void (*moe_router_expert_bias_update)(float* bias, const float* counts, int experts, float rate, Stream stream);
  // --- end of MoE router
  // --- MoE experts (issue 22, part X: model/moe/experts.h; contracts kernels/cpu/grouped_gemm.h
  // and kernels/cpu/moe_expert_ops.h) ----------------------------------------------------------
  // Grouped GEMMs over a rank's local experts, one call for every group. The counts
  // (`group_rows`, `group_depths`: `groups` int64, 0 allowed) are HOST memory, read during the
  // call (an asynchronous backend copies them before returning); every other pointer is a device
  // pointer. Operands as gemm's (f32 values or bf16 bits of `operand_type`), C fp32 with fp32
  // accumulation; an unsupported operand type throws std::invalid_argument naming it.
  // Ragged rows (forward and data-grad products): group g's rows start at r_g = sum of the counts
  // before it; C_g (m_g, n) = alpha A_g op(B_g) + beta C_g with A_g = a + r_g lda (m_g, k),
  // B_g = b + g b_group_stride ((n, k) with trans_b, else (k, n)), C_g = c + r_g ldc.
  void (*grouped_gemm)(bool trans_b, int64_t groups, const int64_t* group_rows, int64_t n, int64_t k, float alpha,
                       const void* a, int64_t lda, const void* b, int64_t ldb, int64_t b_group_stride, float beta,
                       float* c, int64_t ldc, DType operand_type, Stream stream);
  // Ragged depth (weight grads, dW_g = dY_g^T X_g): C_g (m, n) = alpha A_g^T B_g + beta C_g with
  // A_g = a + r_g lda (k_g, m), B_g = b + r_g ldb (k_g, n), C_g = c + g c_group_stride (ldc);
  // a group of depth 0 gives C_g = beta C_g (beta = 0 writes zeros, beta = 1 leaves it).
  void (*grouped_gemm_ragged_k)(int64_t groups, const int64_t* group_depths, int64_t m, int64_t n, float alpha,
                                const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c,
                                int64_t ldc, int64_t c_group_stride, DType operand_type, Stream stream);
  // y (rows, cols) = scale[r] x (rows, cols) (the routing probs on the experts' activations);
  // y may be x.
  void (*moe_scale_rows)(const float* x, const float* scale, float* y, int64_t rows, int cols, Stream stream);
  // Its backward: d_scale[r] = sum_c dy[r, c] x[r, c] (written; summed in double, in column order),
  // dx[r, c] = scale[r] dy[r, c] (written; dx may be dy).
  void (*moe_scale_rows_backward)(const float* dy, const float* x, const float* scale, float* dx, float* d_scale,
                                  int64_t rows, int cols, Stream stream);
  // --- end of MoE experts
  // --- MoE token dispatcher (model/moe/token_dispatcher.h; contracts: kernels/cpu/moe_permute.h) -
  // Row moves of fp32 rows by int32 row indices and int64 counts, all device memory.
  void (*moe_expert_counts)(const uint8_t* routing_map, int64_t tokens, int experts, int64_t* counts, Stream stream);
  void (*moe_route_index)(const uint8_t* routing_map, const float* probs, int64_t tokens, int experts,
                          int32_t* row_token, float* row_probs, Stream stream);
  void (*moe_permute_rows)(const float* in, const int32_t* row_index, int64_t rows, int64_t cols, float* out,
                           Stream stream);
  void (*moe_unpermute_rows)(const float* in, const int32_t* row_index, int64_t rows, int64_t cols, float* out,
                             int64_t out_rows, Stream stream);
  void (*moe_unroute_probs)(const float* row_grads, const int32_t* row_token, const int64_t* expert_rows,
                            int64_t tokens, int experts, float* dprobs, Stream stream);
  void (*moe_sort_chunks)(const float* in, int64_t cols, const int64_t* chunk_rows, const int32_t* order, int chunks,
                          float* out, Stream stream);
  // --- FP8 (issue 23; arithmetic: kernels/common/fp8.h, the CPU twin kernels/cpu/fp8.h) --------
  // Delayed scaling as Transformer Engine: each FP8 tensor has an fp32 scale, scale_inv = 1/scale
  // and an amax; values are stored as fp32_to_fp8(x * scale) and mean code * scale_inv. Every
  // pointer is device memory (scales and amaxes too), so no entry makes the host wait.
  // out[i] = fp32_to_fp8(x[i] * *scale, type) (the fp32 product, then the conversion);
  // *amax = max(*amax, max_i |x[i]|) over the unscaled x (accumulated, so micro-batches and the
  // pieces of a tensor add up by calling it again; a NaN in x makes *amax NaN). n may be 0.
  void (*fp8_quantize)(const float* x, int64_t n, const float* scale, kernels::Fp8Type type, uint8_t* out,
                       float* amax, Stream stream);
  // out (cols, rows) = in (rows, cols)^T, bytes; out must not overlap in.
  void (*fp8_transpose)(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out, Stream stream);
  // C (m, n) = alpha * (*a_scale_inv) * (*b_scale_inv) * A (m, k) . B (n, k)^T + beta C, row-major:
  // A and B are fp8 codes of a_type / b_type, both k-contiguous (row r of A at a + r lda, of B at
  // b + r ldb: the only FP8 layout cuBLASLt takes on sm_90, so callers transpose with
  // fp8_transpose), C fp32 (ldc), fp32 accumulation (cuBLASLt: fast accumulation off); beta = 0
  // ignores C's old values. k, lda and ldb not multiples of 16, and e5m2 x e5m2, throw
  // std::invalid_argument naming them (as cuBLASLt refuses them); m, n may be any >= 1.
  void (*gemm_fp8)(int64_t m, int64_t n, int64_t k, float alpha, const uint8_t* a, kernels::Fp8Type a_type,
                   const float* a_scale_inv, int64_t lda, const uint8_t* b, kernels::Fp8Type b_type,
                   const float* b_scale_inv, int64_t ldb, float beta, float* c, int64_t ldc, Stream stream);
  // Delayed-scaling update of `tensors` tensors of one recipe group (one FP8 type): for each t,
  // kernels::fp8_update_scale(amax + t, amax_history + t * params.history_len, scale + t,
  // scale_inv + t, params): amax[t] is this step's amax, already reduced over micro-batches and
  // ranks; the history row (history_len floats, newest first) takes it; scale and scale_inv are
  // rewritten from the row; amax[t] is zeroed for the next step. tensors may be 0.
  void (*fp8_update_scales)(float* amax, float* amax_history, float* scale, float* scale_inv, int64_t tensors,
                            const kernels::Fp8ScalingParams& params, Stream stream);
  // --- end of FP8
};

// The entry `op` of `ops` as an untyped pointer: null when the backend left it unfilled.
const void* op_entry(const Ops& ops, OpId op);

// The CPU backend: kernels/cpu at the active ISA level (looked up at each call, so MT_CPU_ISA and
// kernels::set_active_isa apply), oneDNN GEMMs, host memory.
const Ops& cpu_ops();

// The CUDA backend (cuda_backend.cpp, in mt_cuda only: backend/cuda_link.h): kernels/cuda on the device
// registry.h's select_cuda_device chose, stream-ordered memory from a caching pool, one
// non-blocking default stream per process. Ask backend/registry.h for it: that checks a device is
// usable first.
const Ops& cuda_ops();

}  // namespace mt::backend
