// Megatron-FSDP's grad sharding (--data-parallel-sharding-strategy optim_grads, issue 25): grads
// reduce-scattered unit by unit after each unit's backward, on every micro-batch, as
// Megatron-FSDP's post-backward hook does for the grad-sharding strategies
// (megatron_fsdp.py _process_post_backward_gradients: grad_reduce_every_bprop for optim_grads
// and optim_grads_params; no_shard and optim wait for the last micro-batch). A unit is one
// transformer layer; the root unit holds the embedding and the head (the layout gives each layer
// id a bucket of its own: model::BucketOptions::bucket_per_layer), so a unit's buckets are those
// of its layer id and are final once backward signals that layer (model/stage.h).
//
// Per micro-batch and unit: the sequence-parallel partial grads all-reduced over TP, the unit's
// buckets reduce-scattered over their reduction group (each rank the sum over its equal slice),
// the slice added to the rank's grad shard (shard_elements() floats: the only grads kept between
// micro-batches) and the unit's full-size grads zeroed for the next micro-batch. finish() copies
// the shard into the owned slices of the flat grad buffer, where AdamW, the grad norm and the
// zero count read it; it refuses a step in which some unit was reduced a different number of
// times than another (a missed or repeated reduction). Sums, never averages (the trainer folds
// 1/DP into the loss scale). The flat grad buffer keeps its full size: mt's layers write grads
// at their offset of one flat buffer, so the unit's full-size grads are zeroed, not released.
// Tested in tests/mpi/test_fsdp.cpp (training against one rank at DP=2 and DP=4).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "model/layout.h"
#include "optim/param_and_grad_buffer.h"

namespace mt::optim {

class UnitGradReducer {
 public:
  // Over `layout` (laid out with one bucket per layer id and equal-slice padding), the rank's
  // flat `grads` and its reduction groups; the shard reports to `ledger` (nullable) as grads.
  // Everything must outlive the reducer.
  UnitGradReducer(const model::ParamLayout& layout, const ReductionGroups& groups, const backend::Ops& ops,
                  float* grads, backend::MemoryLedger* ledger);

  // Before a step's first backward: the shard zeroed, the reduction counts cleared.
  void begin_step();
  // The stage's grads-ready signal: reduces the buckets whose units layer `layer` completes.
  void layer_ready(int layer);
  // After the step's last backward: the shard copied into the owned slices of the grad buffer.
  void finish();
  // The slice of bucket `bucket` this rank owns (the same as ParamAndGradBuffer's when sharded).
  model::FlatRange owned_range(int bucket) const;
  int64_t shard_elements() const { return shard_.size(); }
  // Unit reductions run this step (every bucket once per micro-batch).
  int64_t reductions() const { return reductions_total_; }

 private:
  void reduce_bucket(size_t bucket);

  const model::ParamLayout& layout_;
  ReductionGroups groups_;
  const backend::Ops& ops_;
  float* grads_;
  std::vector<int64_t> shard_offset_;  // per bucket: where its slice sits in shard_
  backend::DeviceBuffer<float> shard_;
  std::vector<int64_t> reductions_;  // per bucket, this step
  int64_t reductions_total_ = 0;
};

}  // namespace mt::optim
