// The collectives of a rank's flat parameter and grad buffers, bucket by bucket (Megatron's
// _ParamAndGradBuffer and its buckets, megatron-facts.md sec. 7), for the distributed optimizer
// (optim/distributed_optimizer.h). Every bucket of the layout belongs to one reduction group
// (model::DataParallelGroup), mapped to its communicator: dense buckets to the DP x CP group,
// expert buckets to the expert-DP group.
//
// Grads, per bucket once they are final: the grads of tensors that sequence parallelism leaves
// partial on each TP rank (norms, row-parallel biases: ParamEntry::reduce_over_tensor_parallel)
// are all-reduced over TP, then the bucket is summed over its group: an all-reduce, or, sharded, a
// reduce-scatter that leaves each rank of the group the sum over its equal slice of the padded
// bucket (ParamLayout::bucket_shard). Grads are summed, never averaged: the trainer folds
// Megatron's 1/DP into the loss scale of backward. Without overlap every bucket is reduced by
// finish_grad_sync(), after the last micro-batch's backward. With overlap (--overlap-grad-reduce)
// the caller arms the buffer, model chunk by model chunk, for the chunk's last micro-batch only
// (the earlier ones just accumulate, as Megatron's no_sync per chunk: the interleaved schedule
// finishes chunks at different times), and each bucket's reduction starts, non-blocking, from the
// stage's grads-ready signal for the bucket's first layer (backward signals layers in descending
// order, so the bucket's other layers are done); finish_grad_sync() waits for them.
//
// Parameters, sharded: every rank's updated slice of each bucket goes to the bucket's group by an
// all-gather, all buckets at once and blocking, or started bucket by bucket without blocking and
// waited per bucket (--overlap-param-gather).
// Tested in tests/unit/optim/test_distributed_optimizer.cpp (threads as ranks) and
// tests/mpi/test_distributed_optimizer.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/layout.h"
#include "parallel/process_groups.h"

namespace mt::optim {

// The communicators a rank reduces grads over: one per reduction group, and the TP group for
// sequence parallelism's partial grads. They must outlive whoever uses them.
struct ReductionGroups {
  comm::Communicator* dense = nullptr;            // DP x CP (parallel::GroupKind::dp_cp)
  comm::Communicator* expert = nullptr;           // expert-DP (parallel::GroupKind::expert_dp)
  comm::Communicator* tensor_parallel = nullptr;  // TP (parallel::GroupKind::tp)

  comm::Communicator& of(model::DataParallelGroup group) const;
  // A rank's data groups (bound to the backend's stream) among its process groups.
  static ReductionGroups of(const parallel::ProcessGroups& groups);
  // One communicator in every role (a single rank: a group of one).
  static ReductionGroups single(comm::Communicator& only);
};

class ParamAndGradBuffer {
 public:
  // `layout` and the groups' communicators must outlive the buffer. `shard`: reduce-scatter the
  // grads and gather the parameters (buckets padded for equal slices of their groups), else
  // all-reduce.
  ParamAndGradBuffer(const model::ParamLayout& layout, const ReductionGroups& groups, bool shard,
                     bool overlap_grad_reduce);
  ~ParamAndGradBuffer();
  ParamAndGradBuffer(const ParamAndGradBuffer&) = delete;
  ParamAndGradBuffer& operator=(const ParamAndGradBuffer&) = delete;

  const ReductionGroups& groups() const { return groups_; }
  // The communicator of bucket `bucket`'s reduction group.
  comm::Communicator& group(int bucket) const;
  // The part of bucket `bucket` whose reduced grads this rank holds after finish_grad_sync() and
  // whose parameters it updates: its equal slice of the padded bucket when sharded, else all of it.
  model::FlatRange owned_range(int bucket) const;
  // Whether bucket `bucket`'s parameters are gathered after a step (sharded over several ranks).
  bool gathers(int bucket) const;
  bool gathers_any() const;

  // Starts a step's grad sync over `grads` (the rank's flat grad buffer): nothing may be in flight.
  void begin_grad_sync(float* grads);
  // Overlap only: from now on (the last micro-batch's backward of model chunk `chunk`) a
  // grads-ready signal starts the reduction of that chunk's buckets it completes.
  void arm(int chunk);
  // The stage's grads-ready signal (model/stage.h).
  void layer_ready(int layer);
  // Reduces the buckets not yet started and waits for every reduction.
  void finish_grad_sync();
  // Buckets whose reduction has started this step.
  int started_buckets() const;

  // Every rank's updated slice of every gathered bucket of `params` to every rank of its group,
  // blocking.
  void gather_parameters(float* params);
  // The same, started without blocking, bucket by bucket in layout (forward) order.
  void start_parameter_gather(float* params);
  // Waits for bucket `bucket`'s gather; false when none was in flight.
  bool finish_parameter_gather(int bucket);
  bool parameter_gather_in_flight() const { return gathers_in_flight_ > 0; }

 private:
  void start_bucket(size_t bucket);

  const model::ParamLayout& layout_;
  ReductionGroups groups_;
  bool shard_;
  bool overlap_;
  std::vector<bool> armed_;  // per model chunk
  float* grads_ = nullptr;
  std::vector<bool> started_;
  std::vector<std::unique_ptr<comm::Request>> reductions_;  // in flight
  std::vector<std::unique_ptr<comm::Request>> gathers_;     // per bucket, null when none in flight
  int gathers_in_flight_ = 0;
};

}  // namespace mt::optim
