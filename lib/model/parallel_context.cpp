// Megatron's tensor- and sequence-parallel regions over the TP communicator (see parallel_context.h).
#include "model/parallel_context.h"

#include "core/error.h"

namespace mt::model {

ParallelContext::ParallelContext(comm::Communicator* tensor_group, bool sequence_parallel,
                                 comm::Communicator* context_group) {
  if (context_group && context_group->size() > 1) context_group_ = context_group;
  if (tensor_group && tensor_group->size() > 1) {
    tensor_group_ = tensor_group;
    tp_size_ = tensor_group->size();
    tp_rank_ = tensor_group->rank();
    sequence_parallel_ = sequence_parallel;
  }
}

comm::Communicator& ParallelContext::context_group() const {
  if (!context_group_) throw Error("parallel context", "no context-parallel group (--context-parallel-size 1)");
  return *context_group_;
}

int64_t ParallelContext::sequence_rows(int64_t rows) const {
  if (!sequence_parallel_) return rows;
  if (rows % tp_size_ != 0) {
    throw Error("--sequence-parallel", "a micro-batch of " + std::to_string(rows) +
                                           " tokens does not split over --tensor-model-parallel-size " +
                                           std::to_string(tp_size_));
  }
  return rows / tp_size_;
}

int64_t ParallelContext::sequence_row_offset(int64_t rows) const {
  return sequence_parallel_ ? sequence_rows(rows) * tp_rank_ : 0;
}

void ParallelContext::copy_to_tensor_parallel_region_backward(float* grad, int64_t count) const {
  if (tensor_group_) tensor_group_->all_reduce(grad, count, DType::f32, comm::ReduceOp::sum);
}

void ParallelContext::reduce_from_tensor_parallel_region(float* partial, int64_t count) const {
  if (tensor_group_) tensor_group_->all_reduce(partial, count, DType::f32, comm::ReduceOp::sum);
}

const float* ParallelContext::scatter_to_sequence_parallel_region(const float* full, int64_t rows,
                                                                  int64_t cols) const {
  return full + sequence_row_offset(rows) * cols;
}

const float* ParallelContext::scatter_to_sequence_parallel_region_backward(const float* grad_local, float* full_buffer,
                                                                           int64_t rows, int64_t cols) const {
  return gather_from_sequence_parallel_region(grad_local, full_buffer, rows, cols);
}

const float* ParallelContext::gather_from_sequence_parallel_region(const float* local, float* full_buffer,
                                                                   int64_t rows, int64_t cols) const {
  if (!sequence_parallel_) return local;
  tensor_group_->all_gather(local, full_buffer, sequence_rows(rows) * cols, DType::f32);
  return full_buffer;
}

float* ParallelContext::gather_from_sequence_parallel_region_backward(float* grad_full, float* local_buffer,
                                                                      int64_t rows, int64_t cols) const {
  return reduce_scatter_to_sequence_parallel_region(grad_full, local_buffer, rows, cols);
}

float* ParallelContext::reduce_scatter_to_sequence_parallel_region(float* partial, float* local_buffer, int64_t rows,
                                                                   int64_t cols) const {
  if (!sequence_parallel_) return partial;
  tensor_group_->reduce_scatter(partial, local_buffer, sequence_rows(rows) * cols, DType::f32, comm::ReduceOp::sum);
  return local_buffer;
}

const float* ParallelContext::reduce_scatter_to_sequence_parallel_region_backward(const float* grad_local,
                                                                                  float* full_buffer, int64_t rows,
                                                                                  int64_t cols) const {
  return gather_from_sequence_parallel_region(grad_local, full_buffer, rows, cols);
}

void ParallelContext::all_reduce_max_over_tensor_parallel(float* values, int64_t count) const {
  if (tensor_group_) tensor_group_->all_reduce(values, count, DType::f32, comm::ReduceOp::max);
}

void ParallelContext::all_reduce_sum_over_tensor_parallel(float* values, int64_t count) const {
  if (tensor_group_) tensor_group_->all_reduce(values, count, DType::f32, comm::ReduceOp::sum);
}

}  // namespace mt::model
