// The local experts of one MoE layer on one rank (facts note sec. 1.5 step 6; Megatron's
// experts.py): E_local SwiGLU experts, each holding this rank's F_local = F / ETP columns of
// fc1's gate and up (column-parallel over the expert-TP group) and of fc2's input (row-parallel),
// no biases. For row r of local expert e, with p_r its routing prob:
//   out_r = fc2_e( p_r * swiglu( fc1_e(x_r) ) )          (probs after the activation, before fc2)
// out is a partial sum over ETP (the dispatcher's combine reduce-scatters it). Two paths, chosen at
// construction, give the same numbers:
//   loop     Megatron's SequentialMLP: per local expert the run's precision GEMMs
//            (model/precision_gemm.h) on that expert's rows;
//   grouped  --moe-grouped-gemm: one grouped GEMM call (backend::Ops::grouped_gemm and
//            grouped_gemm_ragged_k) per product over all local experts.
// The elementwise steps (swiglu, the prob scaling and their backwards) run once over all R rows in
// both paths (they are row-wise, so per-expert calls would give the same bits). The grouped GEMM
// cuts each product into tiles by shape (kernels/cpu/grouped_gemm.h) where the loop calls one GEMM
// per expert, so the two paths agree within fp32 rounding, not bit for bit; the grouped path's
// results do not depend on the thread count.
//
// Weights: the flat parameter buffer (and the fp32 main grads, same offsets) holds local expert
// j's fc1 (2 F_local, C) = [gate rows (F_local, C); up rows (F_local, C)] at fc1_offset + j *
// fc1_stride and its fc2 (C, F_local) at fc2_offset + j * fc2_stride. The layout declares a
// rank's local experts' fc1 tensors as one fused group in expert order (e0 gate, e0 up, e1 gate,
// ...) and their fc2 as another, so fc1_stride = 2 F_local C and fc2_stride = C F_local (larger
// strides are accepted). The GEMMs read the run's GEMM copy of those weights (GemmWeights).
//
// Rows: x (R, C) grouped by local expert, tokens_per_local_expert[0] rows of local expert 0 first,
// then expert 1, ... (the dispatcher's local-expert-major order); counts are HOST int64 (the
// dispatcher's tokens_per_local_expert), 0 allowed, summing to R.
// FP8 (ctx.fp8 set, issue 23; Megatron's TEGroupedMLP): each local expert's fc1 and fc2 is an FP8
// linear of its own (TE's GroupedLinear keeps one FP8 state per GEMM; the state of fc1 is that of
// its gate weight, where the fused GEMM starts), run by PrecisionGemm's FP8 path one expert at a
// time in both paths (the grouped GEMM entries take no FP8 codes; TE's grouped GEMM is a loop of
// FP8 GEMMs too). Each expert's rows count as padded with zero rows to a multiple of 16 (TE's
// Fp8Padding; PrecisionGemm::set_fp8_rows_padded pads where a GEMM's depth is the rows). An expert
// without rows still quantizes its weights in the forward (their amaxes are recorded, as TE casts
// every expert's weight). The router is not FP8 (model/fp8_scaling.h). probs (R) fp32.
// Buffers are sized for a capacity of rows (the most rows a call may bring, e.g. the dispatcher's
// worst case) and reused by every call with R <= capacity:
//   saved (forward writes, backward reads):  fc1 (cap, 2 F_local) pre-activation [gate | up],
//                                             act (cap, F_local) = swiglu(fc1), before the prob
//   workspace (scratch of one call):         scaled (cap, F_local) = p * act, then its grad,
//                                             d_fc1 (cap, 2 F_local),
//                                             with bf16/fp16 two GEMM operand buffers of
//                                             cap * max(C, 2 F_local) floats each (none in fp32)
// saved_floats(cap) = 3 F_local cap and workspace_floats(cap, precision) give the floats (each
// piece rounded up to 64 bytes by BufferSource). Backward writes d_x (R, C) and d_probs (R) (this
// rank's F_local columns only: a partial sum over ETP, as out) and accumulates the weight grads;
// an expert with no rows leaves its grads as they were. Backends: the CPU and CUDA tables fill
// the entries this uses; on a table without them forward/backward throw mt::Error naming the
// entry. Tested in tests/unit/model/test_experts.cpp (against a double loop, finite
// differences, loop against grouped, empty experts) and tests/unit/model/test_fp8_experts.cpp (FP8).
#pragma once

#include <cstdint>

#include "backend/ops.h"
#include "core/dtype.h"
#include "model/layers/block.h"
#include "model/precision_gemm.h"

namespace mt::model {

// How the local experts run their GEMMs: Megatron's SequentialMLP loop or --moe-grouped-gemm.
enum class ExpertGemmPath { loop, grouped };
const char* expert_gemm_path_name(ExpertGemmPath path);  // "loop", "grouped"

// This rank's local experts of one layer: sizes and where their weights are in the flat buffers.
struct LocalExpertsShape {
  int64_t num_local_experts = 0;  // E_local = E / EP
  int64_t hidden = 0;             // C
  int64_t ffn = 0;                // F_local = --moe-ffn-hidden-size / ETP
  int64_t fc1_offset = 0;         // local expert 0's fc1 (2 F_local, C): gate rows then up rows
  int64_t fc1_stride = 0;         // between experts' fc1 (>= 2 F_local C; the layout gives equality)
  int64_t fc2_offset = 0;         // local expert 0's fc2 (C, F_local)
  int64_t fc2_stride = 0;         // between experts' fc2 (>= C F_local)
};

// What a call runs on: the backend, the run's GEMM copy of the weights and the flat buffers.
// A layer makes it from its LayerContext: {ctx.ops, ctx.stream, ctx.gemm.weights(), ctx.params, ctx.grads}.
struct ExpertsContext {
  const backend::Ops& ops;
  backend::Stream stream;
  const GemmWeights& weights;  // precision and GEMM operand copy of `params`
  const float* params = nullptr;  // flat fp32 parameters
  float* grads = nullptr;         // flat fp32 main grads (weight grads accumulate here)
  Fp8Scaling* fp8 = nullptr;      // --fp8-format: the run's FP8 state (null: no FP8)
};

// The rows of one call, grouped by local expert.
struct ExpertRows {
  const float* x = nullptr;                          // (rows, C)
  const float* probs = nullptr;                      // (rows) fp32
  const int64_t* tokens_per_local_expert = nullptr;  // (E_local) HOST counts, summing to rows
  int64_t rows = 0;                                  // R
};

// Forward's saved set (device buffers of `capacity_rows` rows), read by backward.
struct ExpertsSaved {
  int64_t capacity_rows = 0;
  float* fc1 = nullptr;  // (capacity, 2 F_local) pre-activation [gate | up]
  float* act = nullptr;  // (capacity, F_local) swiglu output, before the prob
};

// A call's scratch (device buffers of `capacity_rows` rows).
struct ExpertsWorkspace {
  int64_t capacity_rows = 0;
  float* scaled = nullptr;                // (capacity, F_local): p * act, in backward its grad
  float* d_fc1 = nullptr;                 // (capacity, 2 F_local)
  float* operands[2] = {nullptr, nullptr};  // bf16/fp16: capacity * max(C, 2 F_local) each; fp32: null
};

class LocalExperts {
 public:
  // Throws mt::Error for a shape that cannot hold (non-positive widths or experts, strides
  // smaller than a weight).
  LocalExperts(const LocalExpertsShape& shape, ExpertGemmPath path);

  const LocalExpertsShape& shape() const { return shape_; }
  ExpertGemmPath path() const { return path_; }

  // Floats of each set for `capacity_rows` rows, BufferSource's 64-byte rounding included.
  int64_t saved_floats(int64_t capacity_rows) const;
  int64_t workspace_floats(int64_t capacity_rows, Precision precision) const;
  // The sets carved from `source` (a counting BufferSource gives null pointers and counts).
  ExpertsSaved lay_out_saved(BufferSource& source, int64_t capacity_rows) const;
  ExpertsWorkspace lay_out_workspace(BufferSource& source, int64_t capacity_rows, Precision precision) const;

  // out (R, C) = fc2_e(p * swiglu(fc1_e(x))) per row's expert; fills `saved`. Throws mt::Error when
  // the counts are negative, do not sum to rows.rows, or rows exceed the buffers' capacity.
  void forward(const ExpertsContext& ctx, const ExpertRows& rows, const ExpertsSaved& saved,
               const ExpertsWorkspace& workspace, float* out) const;
  // From d_out (R, C) and the same rows and saved set as the forward: writes d_x (R, C) and
  // d_probs (R), accumulates the experts' fc1 and fc2 weight grads into ctx.grads.
  void backward(const ExpertsContext& ctx, const ExpertRows& rows, const ExpertsSaved& saved,
                const ExpertsWorkspace& workspace, const float* d_out, float* d_x, float* d_probs) const;

 private:
  void check_call(const ExpertsContext& ctx, const ExpertRows& rows, int64_t saved_capacity,
                  int64_t workspace_capacity) const;

  LocalExpertsShape shape_;
  ExpertGemmPath path_;
};

}  // namespace mt::model
