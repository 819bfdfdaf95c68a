// The local experts of a MoE layer (see experts.h): the loop over experts and the grouped path.
#include "model/moe/experts.h"

#include <algorithm>
#include <climits>
#include <string>

#include "core/error.h"

namespace mt::model {

const char* expert_gemm_path_name(ExpertGemmPath path) { return path == ExpertGemmPath::grouped ? "grouped" : "loop"; }

namespace {

const char* const kWhat = "MoE local experts";

std::string text(int64_t value) { return std::to_string(value); }

// The table entries a call needs, or an error naming the first one the backend lacks.
void require_entries(const backend::Ops& ops, ExpertGemmPath path) {
  const backend::OpId needed[] = {backend::OpId::moe_scale_rows, backend::OpId::moe_scale_rows_backward,
                                  backend::OpId::grouped_gemm, backend::OpId::grouped_gemm_ragged_k};
  const int count = path == ExpertGemmPath::grouped ? 4 : 2;
  for (int i = 0; i < count; ++i) {
    if (!backend::op_entry(ops, needed[i])) {
      throw Error(kWhat, std::string("the ") + ops.name + " backend has no " + backend::op_name(needed[i]) +
                             " entry (MoE experts run on the CPU backend in this version)");
    }
  }
}

// An activation as the GEMM takes it for the run's precision: x itself in fp32, else x converted
// (bf16 bits) or rounded (fp32 values) into `scratch`, as PrecisionGemm does.
const void* activation_operand(const ExpertsContext& ctx, const float* x, int64_t count, float* scratch) {
  const Precision precision = ctx.weights.precision();
  if (precision == Precision::fp32) return x;
  if (ctx.weights.operand_type() == DType::f32) {
    ctx.ops.round_through(x, scratch, count, precision_dtype(precision), ctx.stream);
  } else {
    ctx.ops.convert(x, DType::f32, scratch, ctx.weights.operand_type(), count, ctx.stream);
  }
  return scratch;
}

// One linear of every local expert: W_e (out, in) at offset + e * stride in the flat buffers.
struct ExpertLinear {
  int64_t offset, stride, in, out;
};

// fc1 (2 F, C): [gate | up] out of the hidden rows; fc2 (C, F): back to the hidden width.
ExpertLinear fc1_linear(const LocalExpertsShape& s) { return {s.fc1_offset, s.fc1_stride, s.hidden, 2 * s.ffn}; }
ExpertLinear fc2_linear(const LocalExpertsShape& s) { return {s.fc2_offset, s.fc2_stride, s.ffn, s.hidden}; }

// What a linear's GEMMs of one call run on: the path, the rows per expert and the operand scratch.
struct ExpertGemms {
  const ExpertsContext& ctx;
  ExpertGemmPath path;
  const int64_t* counts;
  int64_t experts, rows;
  const ExpertsWorkspace& workspace;

  // The precision GEMMs of the loop path over this call's flat buffers and operand scratch.
  PrecisionGemm loop_gemm() const {
    PrecisionGemm gemm(ctx.ops, ctx.weights);
    gemm.bind(ctx.params, ctx.grads);
    gemm.set_operand_buffers(workspace.operands[0], workspace.operands[1]);
    gemm.set_fp8(ctx.fp8);
    gemm.set_fp8_rows_padded(true);  // TE's Fp8Padding (see experts.h)
    return gemm;
  }

  // y (rows, out) = x (rows, in) W_e^T, each expert on its rows.
  void forward(const ExpertLinear& w, const float* x, float* y) const {
    if (path == ExpertGemmPath::grouped && !ctx.fp8) {
      const void* x_operand = activation_operand(ctx, x, rows * w.in, workspace.operands[0]);
      ctx.ops.grouped_gemm(true, experts, counts, w.out, w.in, 1.0f, x_operand, w.in,
                           ctx.weights.operand(ctx.params, w.offset), w.in, w.stride, 0.0f, y, w.out,
                           ctx.weights.operand_type(), ctx.stream);
      return;
    }
    const PrecisionGemm gemm = loop_gemm();
    for (int64_t e = 0, row = 0; e < experts; row += counts[e], ++e) {
      if (counts[e] == 0 && !ctx.fp8) continue;  // FP8: a forward of 0 rows still quantizes the weight
      gemm.linear_forward(x + row * w.in, counts[e], w.in, w.offset + e * w.stride, w.out, y + row * w.out);
    }
  }

  // dW_e += dy_e^T x_e into the grads, then dx (rows, in) = dy W_e (dx may be x: each expert's
  // rows are read before they are written). An expert without rows leaves its grads as they are
  // (the loop skips it: oneDNN refuses a GEMM of depth 0).
  void backward(const ExpertLinear& w, const float* dy, const float* x, float* dx) const {
    if (path == ExpertGemmPath::grouped && !ctx.fp8) {
      const DType type = ctx.weights.operand_type();
      const void* dy_operand = activation_operand(ctx, dy, rows * w.out, workspace.operands[0]);
      const void* x_operand = activation_operand(ctx, x, rows * w.in, workspace.operands[1]);
      ctx.ops.grouped_gemm_ragged_k(experts, counts, w.out, w.in, 1.0f, dy_operand, w.out, x_operand, w.in, 1.0f,
                                    ctx.grads + w.offset, w.in, w.stride, type, ctx.stream);
      ctx.ops.grouped_gemm(false, experts, counts, w.in, w.out, 1.0f, dy_operand, w.out,
                           ctx.weights.operand(ctx.params, w.offset), w.in, w.stride, 0.0f, dx, w.in, type, ctx.stream);
      return;
    }
    const PrecisionGemm gemm = loop_gemm();
    for (int64_t e = 0, row = 0; e < experts; row += counts[e], ++e) {
      if (counts[e] == 0) continue;
      gemm.linear_backward_weight(dy + row * w.out, x + row * w.in, counts[e], w.out, w.in, w.offset + e * w.stride);
      gemm.linear_backward_input(dy + row * w.out, counts[e], w.out, w.offset + e * w.stride, w.in, dx + row * w.in);
    }
  }
};

}  // namespace

LocalExperts::LocalExperts(const LocalExpertsShape& shape, ExpertGemmPath path) : shape_(shape), path_(path) {
  if (shape.num_local_experts <= 0 || shape.hidden <= 0 || shape.ffn <= 0) {
    throw Error(kWhat, "needs at least one expert and positive widths (got " + text(shape.num_local_experts) +
                           " experts, hidden " + text(shape.hidden) + ", ffn " + text(shape.ffn) + ")");
  }
  if (2 * shape.ffn > INT_MAX) throw Error(kWhat, "ffn " + text(shape.ffn) + " is wider than the kernels take");
  if (shape.fc1_offset < 0 || shape.fc2_offset < 0) throw Error(kWhat, "negative weight offset");
  if (shape.fc1_stride < 2 * shape.ffn * shape.hidden) {
    throw Error(kWhat, "fc1 stride " + text(shape.fc1_stride) + " is smaller than an expert's fc1 (" +
                           text(2 * shape.ffn * shape.hidden) + " elements)");
  }
  if (shape.fc2_stride < shape.ffn * shape.hidden) {
    throw Error(kWhat, "fc2 stride " + text(shape.fc2_stride) + " is smaller than an expert's fc2 (" +
                           text(shape.ffn * shape.hidden) + " elements)");
  }
}

ExpertsSaved LocalExperts::lay_out_saved(BufferSource& source, int64_t capacity_rows) const {
  ExpertsSaved saved;
  saved.capacity_rows = capacity_rows;
  saved.fc1 = source.take(capacity_rows * 2 * shape_.ffn);
  saved.act = source.take(capacity_rows * shape_.ffn);
  return saved;
}

ExpertsWorkspace LocalExperts::lay_out_workspace(BufferSource& source, int64_t capacity_rows,
                                                 Precision precision) const {
  ExpertsWorkspace workspace;
  workspace.capacity_rows = capacity_rows;
  workspace.scaled = source.take(capacity_rows * shape_.ffn);
  workspace.d_fc1 = source.take(capacity_rows * 2 * shape_.ffn);
  const int64_t operand =
      PrecisionGemm::operand_elements(precision, capacity_rows * std::max(shape_.hidden, 2 * shape_.ffn));
  workspace.operands[0] = source.take(operand);
  workspace.operands[1] = source.take(operand);
  return workspace;
}

int64_t LocalExperts::saved_floats(int64_t capacity_rows) const {
  BufferSource counting;
  lay_out_saved(counting, capacity_rows);
  return counting.floats();
}

int64_t LocalExperts::workspace_floats(int64_t capacity_rows, Precision precision) const {
  BufferSource counting;
  lay_out_workspace(counting, capacity_rows, precision);
  return counting.floats();
}

void LocalExperts::check_call(const ExpertsContext& ctx, const ExpertRows& rows, int64_t saved_capacity,
                              int64_t workspace_capacity) const {
  require_entries(ctx.ops, path_);
  if (!rows.tokens_per_local_expert) throw Error(kWhat, "no tokens_per_local_expert counts");
  int64_t total = 0;
  for (int64_t e = 0; e < shape_.num_local_experts; ++e) {
    const int64_t count = rows.tokens_per_local_expert[e];
    if (count < 0) throw Error(kWhat, "local expert " + text(e) + " has a negative token count " + text(count));
    total += count;
  }
  if (total != rows.rows) {
    throw Error(kWhat, "tokens_per_local_expert sum to " + text(total) + ", but " + text(rows.rows) + " rows came");
  }
  const int64_t capacity = std::min(saved_capacity, workspace_capacity);
  if (rows.rows > capacity) {
    throw Error(kWhat, text(rows.rows) + " rows exceed the buffers' capacity of " + text(capacity) + " rows");
  }
}

void LocalExperts::forward(const ExpertsContext& ctx, const ExpertRows& rows, const ExpertsSaved& saved,
                           const ExpertsWorkspace& workspace, float* out) const {
  check_call(ctx, rows, saved.capacity_rows, workspace.capacity_rows);
  const ExpertGemms gemms{ctx, path_, rows.tokens_per_local_expert, shape_.num_local_experts, rows.rows, workspace};
  if (rows.rows == 0) {  // no token reached these experts: nothing to write
    if (ctx.fp8) {       // but FP8 casts every expert's weights (GEMMs of 0 rows, see experts.h)
      gemms.forward(fc1_linear(shape_), rows.x, saved.fc1);
      gemms.forward(fc2_linear(shape_), workspace.scaled, out);
    }
    return;
  }
  const int ffn = static_cast<int>(shape_.ffn);
  gemms.forward(fc1_linear(shape_), rows.x, saved.fc1);
  ctx.ops.swiglu_forward(saved.fc1, saved.act, rows.rows, ffn, ctx.stream);
  ctx.ops.moe_scale_rows(saved.act, rows.probs, workspace.scaled, rows.rows, ffn, ctx.stream);
  gemms.forward(fc2_linear(shape_), workspace.scaled, out);
}

void LocalExperts::backward(const ExpertsContext& ctx, const ExpertRows& rows, const ExpertsSaved& saved,
                            const ExpertsWorkspace& workspace, const float* d_out, float* d_x, float* d_probs) const {
  check_call(ctx, rows, saved.capacity_rows, workspace.capacity_rows);
  if (rows.rows == 0) return;  // no token reached these experts: nothing to write, grads unchanged
  const ExpertGemms gemms{ctx, path_, rows.tokens_per_local_expert, shape_.num_local_experts, rows.rows, workspace};
  const int ffn = static_cast<int>(shape_.ffn);
  float* scaled = workspace.scaled;  // (R, F): p * act, then its grad, then act's grad
  ctx.ops.moe_scale_rows(saved.act, rows.probs, scaled, rows.rows, ffn, ctx.stream);
  gemms.backward(fc2_linear(shape_), d_out, scaled, scaled);
  ctx.ops.moe_scale_rows_backward(scaled, saved.act, rows.probs, scaled, d_probs, rows.rows, ffn, ctx.stream);
  ctx.ops.swiglu_backward(scaled, saved.fc1, workspace.d_fc1, rows.rows, ffn, ctx.stream);
  gemms.backward(fc1_linear(shape_), workspace.d_fc1, rows.x, d_x);
}

}  // namespace mt::model
