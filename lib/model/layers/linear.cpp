// Column- and row-parallel linears (see linear.h).
#include "model/layers/linear.h"

namespace mt::model {

const float* ColumnParallelLinear::full_input(const LayerContext& ctx, const LayerPass& pass, const float* x_seq,
                                              const SequenceParallelBuffers& buffers) const {
  const ParallelContext& parallel = ctx.parallel;
  return parallel.sequence_parallel()
             ? parallel.gather_from_sequence_parallel_region(x_seq, buffers.gathered, pass.rows, p_.in_features)
             : parallel.copy_to_tensor_parallel_region(x_seq);
}

void ColumnParallelLinear::forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq,
                                   const SequenceParallelBuffers& buffers, float* y) const {
  const float* x = full_input(ctx, pass, x_seq, buffers);
  if (p_.bias >= 0) {
    ctx.gemm.linear_forward_bias(x, pass.rows, p_.in_features, p_.weight, p_.out_features, ctx.params + p_.bias, y);
  } else {
    ctx.gemm.linear_forward(x, pass.rows, p_.in_features, p_.weight, p_.out_features, y);
  }
}

void ColumnParallelLinear::forward_gelu(const LayerContext& ctx, const LayerPass& pass, const float* x_seq,
                                        const SequenceParallelBuffers& buffers, float* pre, float* y) const {
  ctx.gemm.linear_forward_bias_gelu(full_input(ctx, pass, x_seq, buffers), pass.rows, p_.in_features, p_.weight,
                                    p_.out_features, p_.bias >= 0 ? ctx.params + p_.bias : nullptr, pre, y);
}

void ColumnParallelLinear::backward(const LayerContext& ctx, const LayerPass& pass, const float* dy,
                                    const float* x_seq, const SequenceParallelBuffers& buffers, float* dx_seq) const {
  const ParallelContext& parallel = ctx.parallel;
  ctx.gemm.linear_backward_weight(dy, full_input(ctx, pass, x_seq, buffers), pass.rows, p_.out_features,
                                  p_.in_features, p_.weight);
  if (p_.bias >= 0) {
    ctx.ops.bias_backward(dy, ctx.grads + p_.bias, pass.rows, static_cast<int>(p_.out_features), ctx.stream);
  }
  const bool sequence_parallel = parallel.sequence_parallel();
  float* dx = sequence_parallel ? buffers.d_full : dx_seq;
  ctx.gemm.linear_backward_input(dy, pass.rows, p_.out_features, p_.weight, p_.in_features, dx);
  if (sequence_parallel) {
    parallel.gather_from_sequence_parallel_region_backward(dx, dx_seq, pass.rows, p_.in_features);
  } else {
    parallel.copy_to_tensor_parallel_region_backward(dx, pass.rows * p_.in_features);
  }
}

void RowParallelLinear::forward(const LayerContext& ctx, const LayerPass& pass, const float* x,
                                const SequenceParallelBuffers& buffers, float* y_seq) const {
  const ParallelContext& parallel = ctx.parallel;
  const bool sequence_parallel = parallel.sequence_parallel();
  float* partial = sequence_parallel ? buffers.partial : y_seq;
  ctx.gemm.linear_forward(x, pass.rows, p_.in_features, p_.weight, p_.out_features, partial);
  if (sequence_parallel) {
    parallel.reduce_scatter_to_sequence_parallel_region(partial, y_seq, pass.rows, p_.out_features);
  } else {
    parallel.reduce_from_tensor_parallel_region(partial, pass.rows * p_.out_features);
  }
  if (p_.bias >= 0) {
    ctx.ops.bias_add(y_seq, ctx.params + p_.bias, pass.sequence_rows, static_cast<int>(p_.out_features), ctx.stream);
  }
}

void RowParallelLinear::backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x,
                                 const SequenceParallelBuffers& buffers, float* dx) const {
  const ParallelContext& parallel = ctx.parallel;
  const float* dy =
      parallel.sequence_parallel()
          ? parallel.reduce_scatter_to_sequence_parallel_region_backward(dy_seq, buffers.gathered, pass.rows,
                                                                         p_.out_features)
          : parallel.reduce_from_tensor_parallel_region_backward(dy_seq);
  ctx.gemm.linear_backward_weight(dy, x, pass.rows, p_.out_features, p_.in_features, p_.weight);
  if (p_.bias >= 0) {
    ctx.ops.bias_backward(dy_seq, ctx.grads + p_.bias, pass.sequence_rows, static_cast<int>(p_.out_features),
                          ctx.stream);
  }
  ctx.gemm.linear_backward_input(dy, pass.rows, p_.out_features, p_.weight, p_.in_features, dx);
}

}  // namespace mt::model
