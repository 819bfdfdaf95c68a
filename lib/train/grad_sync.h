// Data-parallel grad reduction over the buckets of a rank's layout (Megatron's
// DistributedDataParallel with finalize_model_grads, megatron-facts.md sec. 5 and 7). Per bucket,
// once its grads are final: the grads of tensors that sequence parallelism leaves partial on each
// TP rank (norms, row-parallel biases: ParamEntry::reduce_over_tensor_parallel) are all-reduced
// over TP, then the bucket is summed over the DP x CP group: an all-reduce, or with the
// distributed optimizer a reduce-scatter that leaves each DP rank the sum over its equal slice of
// the padded bucket (ParamLayout::bucket_shard). Grads are summed, never averaged: the trainer
// folds Megatron's 1/DP into the loss scale of backward.
//
// Without overlap every bucket is reduced by finish(), after the last micro-batch's backward.
// With overlap (--overlap-grad-reduce) the trainer arms the reducer, model chunk by model chunk,
// for the chunk's last micro-batch only (the earlier ones just accumulate, as Megatron's no_sync
// per chunk: the interleaved schedule finishes chunks at different times), and each bucket's
// reduction starts, non-blocking, from the stage's grads-ready signal for the bucket's first layer
// (backward signals layers in descending order, so the bucket's other layers are done); finish()
// waits for them.
// The distributed optimizer's parameter all-gather after its step is gather_parameters().
// Tested in tests/mpi/test_data_parallel.cpp (on its own, and in training against one rank) and
// through mt-train in tests/tools/mt-train-mpi.bats.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "model/layout.h"

namespace mt::train {

class GradSync {
 public:
  // `data_parallel` and `tensor_parallel` (either may be a group of one) must outlive this.
  GradSync(const model::ParamLayout& layout, comm::Communicator& data_parallel, comm::Communicator& tensor_parallel,
           bool distributed_optimizer, bool overlap);

  // The ranges of the flat buffers whose reduced grads this rank holds after finish() and whose
  // parameters it updates: the whole buffer, or its shard of every bucket.
  std::vector<model::FlatRange> owned_ranges() const;

  // Starts a step's grad sync: nothing is in flight and no bucket is reduced. `grads` is the
  // rank's flat grad buffer.
  void begin(float* grads);
  // Overlap only: from now on (the last micro-batch's backward of model chunk `chunk` of the
  // layout) a grads-ready signal starts the reduction of that chunk's buckets it completes.
  void arm(int chunk = 0);
  // The stage's grads-ready signal (model/stage.h).
  void layer_ready(int layer);
  // Reduces the buckets not yet started and waits for every reduction.
  void finish();
  // Buckets whose reduction has started this step.
  int started_buckets() const { return static_cast<int>(std::count(started_.begin(), started_.end(), true)); }

  // Distributed optimizer: every DP rank's updated shard of the parameters to every DP rank.
  void gather_parameters(float* params);

 private:
  void start_bucket(size_t bucket);

  const model::ParamLayout& layout_;
  comm::Communicator& data_parallel_;
  comm::Communicator& tensor_parallel_;
  bool distributed_optimizer_;
  bool overlap_;
  std::vector<bool> armed_;  // per model chunk
  float* grads_ = nullptr;
  std::vector<bool> started_;
  std::vector<std::unique_ptr<comm::Request>> in_flight_;
};

}  // namespace mt::train
