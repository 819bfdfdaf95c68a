// The collectives the layers run, placed where Megatron places them (tensor_parallel/mappings.py,
// megatron-facts.md sec. 5): each region is a conjugate pair, a forward and its backward, named
// after the region the data moves into or out of. Layers call both halves at Megatron's sites;
// with no tensor-parallel group (degree 1) every one is an identity that moves no data.
//
//   region                                  forward                    backward
//   copy_to_tensor_parallel_region          identity                   all-reduce of the grad
//   reduce_from_tensor_parallel_region      all-reduce                 identity
//   scatter_to_sequence_parallel_region     keep this rank's rows      all-gather the grad rows
//   gather_from_sequence_parallel_region    all-gather rows            reduce-scatter the grad rows
//   reduce_scatter_to_sequence_parallel_region  reduce-scatter rows    all-gather the grad rows
//
// Activations are (rows, cols) with rows = tokens of the micro-batch (sample-major). Under
// sequence parallelism the rows are cut into TP contiguous blocks of rows / TP: norms, dropout
// and residual adds only need each token once, and dropout stays keyed by global row ids, so any
// block of tokens works (Megatron cuts its sequence-first [s, b, h] the same way along dim 0).
// The vocab-parallel cross-entropy's three small all-reduces (row max, sum of exps, target logit)
// are here too. The context-parallel group (nullable or size 1: no CP) is carried here for the
// attention core, which runs ring attention over it (parallel/ring_attention.h) when it has more
// than one rank; the DP x CP grad reduction is not a layer collective (the grads-ready hook of
// model/stage.h carries it).
// Tested in tests/unit/model/test_stage.cpp (degree 1 and TP = 2 over threads).
#pragma once

#include <cstdint>

#include "comm/communicator.h"

namespace mt::model {

// The expert grid's groups and this rank's place in it, for MoE layers (parallel/rank_grid.h):
// null communicators (or size 1) are no parallelism on that dimension.
struct ExpertGroups {
  int expert_parallel = 1;         // EP
  int expert_tensor_parallel = 1;  // ETP
  int ep_rank = 0, etp_rank = 0;
  comm::Communicator* ep = nullptr;            // the token dispatcher's all-to-alls
  comm::Communicator* expert_tp = nullptr;     // its ETP all-gather / reduce-scatter
  comm::Communicator* expert_tp_ep = nullptr;  // its count all-gather (rank etp + ETP ep)
  comm::Communicator* tp_cp = nullptr;         // aux_loss, seq_aux_loss and z-loss reductions
  comm::Communicator* tp_dp_cp = nullptr;      // global_aux_loss (and the trainer's expert-bias counts)
};

class ParallelContext {
 public:
  // Degree 1: every region is an identity.
  ParallelContext() = default;
  // `tensor_group`: this rank's TP group (nullable or size 1 for degree 1), kept by the caller.
  // Sequence parallelism is on only with a group of more than one rank (Megatron warns and turns
  // it off at TP = 1).
  // `context_group`: this rank's CP group (nullable or size 1: no context parallelism).
  ParallelContext(comm::Communicator* tensor_group, bool sequence_parallel,
                  comm::Communicator* context_group = nullptr);

  // MoE: the expert grid's groups (default: one rank, no expert parallelism).
  void set_expert_groups(const ExpertGroups& groups) { expert_groups_ = groups; }
  const ExpertGroups& expert_groups() const { return expert_groups_; }

  int tensor_parallel_size() const { return tp_size_; }
  int tensor_parallel_rank() const { return tp_rank_; }
  bool sequence_parallel() const { return sequence_parallel_; }
  int context_parallel_size() const { return context_group_ ? context_group_->size() : 1; }
  // The CP group; only when context_parallel_size() > 1.
  comm::Communicator& context_group() const;
  // Rows of the sequence-parallel region for a micro-batch of `rows` tokens (rows / TP under
  // SP, else rows), and the first of them on this rank.
  int64_t sequence_rows(int64_t rows) const;
  int64_t sequence_row_offset(int64_t rows) const;

  // copy_to_tensor_parallel_region: the input of a column-parallel layer (no SP).
  const float* copy_to_tensor_parallel_region(const float* x) const { return x; }
  void copy_to_tensor_parallel_region_backward(float* grad, int64_t count) const;

  // reduce_from_tensor_parallel_region: partial sums of a row-parallel layer (no SP), in place.
  void reduce_from_tensor_parallel_region(float* partial, int64_t count) const;
  const float* reduce_from_tensor_parallel_region_backward(const float* grad) const { return grad; }

  // The sequence-parallel regions move rows between the full (rows, cols) and this rank's block
  // (rows / TP, cols). Each returns where its result is: in the buffer it was given when data
  // moves, else (SP off) the input itself, untouched.

  // scatter_to_sequence_parallel_region: full rows in, this rank's block out (a view).
  const float* scatter_to_sequence_parallel_region(const float* full, int64_t rows, int64_t cols) const;
  const float* scatter_to_sequence_parallel_region_backward(const float* grad_local, float* full_buffer,
                                                            int64_t rows, int64_t cols) const;

  // gather_from_sequence_parallel_region: the input of a column-parallel layer under SP.
  const float* gather_from_sequence_parallel_region(const float* local, float* full_buffer, int64_t rows,
                                                    int64_t cols) const;
  float* gather_from_sequence_parallel_region_backward(float* grad_full, float* local_buffer, int64_t rows,
                                                       int64_t cols) const;

  // reduce_scatter_to_sequence_parallel_region: the partial sums of a row-parallel layer under SP.
  float* reduce_scatter_to_sequence_parallel_region(float* partial, float* local_buffer, int64_t rows,
                                                    int64_t cols) const;
  const float* reduce_scatter_to_sequence_parallel_region_backward(const float* grad_local, float* full_buffer,
                                                                   int64_t rows, int64_t cols) const;

  // Vocab-parallel cross-entropy (megatron-facts.md sec. 5), in place on (count) values.
  void all_reduce_max_over_tensor_parallel(float* values, int64_t count) const;
  void all_reduce_sum_over_tensor_parallel(float* values, int64_t count) const;

 private:
  comm::Communicator* tensor_group_ = nullptr;
  int tp_size_ = 1;
  int tp_rank_ = 0;
  bool sequence_parallel_ = false;
  comm::Communicator* context_group_ = nullptr;
  ExpertGroups expert_groups_;
};

}  // namespace mt::model
