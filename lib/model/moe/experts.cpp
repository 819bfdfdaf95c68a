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

// The precision GEMMs of the loop path over this call's flat buffers and operand scratch.
PrecisionGemm loop_gemm(const ExpertsContext& ctx, const ExpertsWorkspace& workspace) {
  PrecisionGemm gemm(ctx.ops, ctx.weights);
  gemm.bind(ctx.params, ctx.grads);
  gemm.set_operand_buffers(workspace.operands[0], workspace.operands[1]);
  return gemm;
}

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
  const backend::Ops& ops = ctx.ops;
  const int64_t experts = shape_.num_local_experts, C = shape_.hidden, F = shape_.ffn, F2 = 2 * F, R = rows.rows;
  const int64_t* counts = rows.tokens_per_local_expert;
  const int ffn = static_cast<int>(F);
  if (path_ == ExpertGemmPath::grouped) {
    const DType type = ctx.weights.operand_type();
    const void* x = activation_operand(ctx, rows.x, R * C, workspace.operands[0]);
    ops.grouped_gemm(true, experts, counts, F2, C, 1.0f, x, C, ctx.weights.operand(ctx.params, shape_.fc1_offset), C,
                     shape_.fc1_stride, 0.0f, saved.fc1, F2, type, ctx.stream);
    ops.swiglu_forward(saved.fc1, saved.act, R, ffn, ctx.stream);
    ops.moe_scale_rows(saved.act, rows.probs, workspace.scaled, R, ffn, ctx.stream);
    const void* scaled = activation_operand(ctx, workspace.scaled, R * F, workspace.operands[0]);
    ops.grouped_gemm(true, experts, counts, C, F, 1.0f, scaled, F, ctx.weights.operand(ctx.params, shape_.fc2_offset),
                     F, shape_.fc2_stride, 0.0f, out, C, type, ctx.stream);
    return;
  }
  const PrecisionGemm gemm = loop_gemm(ctx, workspace);
  for (int64_t e = 0, row = 0; e < experts; row += counts[e], ++e) {
    if (counts[e] == 0) continue;  // its grads stay as they are (oneDNN refuses a GEMM of depth 0)
    gemm.linear_forward(rows.x + row * C, counts[e], C, shape_.fc1_offset + e * shape_.fc1_stride, F2,
                        saved.fc1 + row * F2);
  }
  ops.swiglu_forward(saved.fc1, saved.act, R, ffn, ctx.stream);
  ops.moe_scale_rows(saved.act, rows.probs, workspace.scaled, R, ffn, ctx.stream);
  for (int64_t e = 0, row = 0; e < experts; row += counts[e], ++e) {
    if (counts[e] == 0) continue;  // its grads stay as they are (oneDNN refuses a GEMM of depth 0)
    gemm.linear_forward(workspace.scaled + row * F, counts[e], F, shape_.fc2_offset + e * shape_.fc2_stride, C,
                        out + row * C);
  }
}

void LocalExperts::backward(const ExpertsContext& ctx, const ExpertRows& rows, const ExpertsSaved& saved,
                            const ExpertsWorkspace& workspace, const float* d_out, float* d_x, float* d_probs) const {
  check_call(ctx, rows, saved.capacity_rows, workspace.capacity_rows);
  const backend::Ops& ops = ctx.ops;
  const int64_t experts = shape_.num_local_experts, C = shape_.hidden, F = shape_.ffn, F2 = 2 * F, R = rows.rows;
  const int64_t* counts = rows.tokens_per_local_expert;
  const int ffn = static_cast<int>(F);
  float* scaled = workspace.scaled;  // (R, F): p * act, then d(p * act), then d(act)
  ops.moe_scale_rows(saved.act, rows.probs, scaled, R, ffn, ctx.stream);
  if (path_ == ExpertGemmPath::grouped) {
    const DType type = ctx.weights.operand_type();
    const void* dy = activation_operand(ctx, d_out, R * C, workspace.operands[0]);
    const void* s = activation_operand(ctx, scaled, R * F, workspace.operands[1]);
    ops.grouped_gemm_ragged_k(experts, counts, C, F, 1.0f, dy, C, s, F, 1.0f, ctx.grads + shape_.fc2_offset, F,
                              shape_.fc2_stride, type, ctx.stream);
    ops.grouped_gemm(false, experts, counts, F, C, 1.0f, dy, C, ctx.weights.operand(ctx.params, shape_.fc2_offset), F,
                     shape_.fc2_stride, 0.0f, scaled, F, type, ctx.stream);
    ops.moe_scale_rows_backward(scaled, saved.act, rows.probs, scaled, d_probs, R, ffn, ctx.stream);
    ops.swiglu_backward(scaled, saved.fc1, workspace.d_fc1, R, ffn, ctx.stream);
    const void* d_fc1 = activation_operand(ctx, workspace.d_fc1, R * F2, workspace.operands[0]);
    const void* x = activation_operand(ctx, rows.x, R * C, workspace.operands[1]);
    ops.grouped_gemm_ragged_k(experts, counts, F2, C, 1.0f, d_fc1, F2, x, C, 1.0f, ctx.grads + shape_.fc1_offset, C,
                              shape_.fc1_stride, type, ctx.stream);
    ops.grouped_gemm(false, experts, counts, C, F2, 1.0f, d_fc1, F2, ctx.weights.operand(ctx.params, shape_.fc1_offset),
                     C, shape_.fc1_stride, 0.0f, d_x, C, type, ctx.stream);
    return;
  }
  const PrecisionGemm gemm = loop_gemm(ctx, workspace);
  for (int64_t e = 0, row = 0; e < experts; row += counts[e], ++e) {
    if (counts[e] == 0) continue;  // its grads stay as they are (oneDNN refuses a GEMM of depth 0)
    const int64_t fc2 = shape_.fc2_offset + e * shape_.fc2_stride;
    gemm.linear_backward_weight(d_out + row * C, scaled + row * F, counts[e], C, F, fc2);
    gemm.linear_backward_input(d_out + row * C, counts[e], C, fc2, F, scaled + row * F);
  }
  ops.moe_scale_rows_backward(scaled, saved.act, rows.probs, scaled, d_probs, R, ffn, ctx.stream);
  ops.swiglu_backward(scaled, saved.fc1, workspace.d_fc1, R, ffn, ctx.stream);
  for (int64_t e = 0, row = 0; e < experts; row += counts[e], ++e) {
    if (counts[e] == 0) continue;  // its grads stay as they are (oneDNN refuses a GEMM of depth 0)
    const int64_t fc1 = shape_.fc1_offset + e * shape_.fc1_stride;
    gemm.linear_backward_weight(workspace.d_fc1 + row * F2, rows.x + row * C, counts[e], F2, C, fc1);
    gemm.linear_backward_input(workspace.d_fc1 + row * F2, counts[e], F2, fc1, C, d_x + row * C);
  }
}

}  // namespace mt::model
