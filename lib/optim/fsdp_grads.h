// Megatron-FSDP's grad sharding (--data-parallel-sharding-strategy optim_grads and
// optim_grads_params, issue 25): grads reduce-scattered unit by unit after each unit's backward,
// on every micro-batch, as Megatron-FSDP's post-backward hook does for the grad-sharding
// strategies (megatron_fsdp.py _process_post_backward_gradients: grad_reduce_every_bprop for
// optim_grads and optim_grads_params; no_shard and optim wait for the last micro-batch). A unit is
// one transformer layer; the root unit holds the embedding and the head (the layout gives each
// layer id a bucket of its own: model::BucketOptions::bucket_per_layer), so a unit's buckets are
// those of its layer id and are final once backward signals that layer (model/stage.h). With MoE
// a layer id has a dense bucket and an expert bucket, each its own unit over its own reduction
// group (DP x CP; expert-DP for the experts): both reduced from the layer's signal, after its
// whole backward (both all-to-alls), dense first, in one order on every rank; a bucket is
// reduced whole, so an expert that received no token reduces its zero grads with its peers.
//
// The grad shard lives in place, in the owned slices of the flat grad buffer (the slices AdamW,
// the grad norm and the zero count read). Per micro-batch and unit: the sequence-parallel partial
// grads all-reduced over TP, the unit's buckets reduce-scattered in place over their reduction
// group (each rank's owned slice holds the shard accumulated so far plus this micro-batch's local
// grads, the other ranks' copies of that slice only their local grads, so the sum over the group
// is the new shard), then the rest of the unit's full-size grads released: with releasable grad
// memory (backend/memory.h) its whole pages go back to the buffer's page pool and read as zeros
// for the next micro-batch, else it is zeroed. Under TP, the owned part of a tensor reduced over TP is kept
// aside between reductions (an all-reduce over TP would otherwise add every TP rank's copy of the
// shard). Before a unit's backward (the stage's before-backward signal) its full-size pages are
// marked resident, so the ledger's grads follow the owned slices plus the units in backward.
// finish() refuses a step in which some unit was reduced a different number of times than another
// (a missed or repeated reduction).
//
// Overlap (--overlap-grad-reduce, as Megatron-FSDP's overlap_grad_reduce): a unit's reduce-scatter
// starts non-blocking when its backward is done and completes (waited, the rest released) when the
// next unit's grads are ready, so it runs during that unit's backward; at most one unit's is in
// flight, holding its full-size grads one unit longer. A unit whose grads are about to be written
// again (its before-backward signal: the next micro-batch, or the head writing the tied
// embedding's) and finish() complete what is in flight first. The numbers are the same either way.
// Timed as the gathers are: from start to done, and the rank's blocking on them.
// Sums, never averages (the trainer folds 1/DP into the loss scale). Tested in
// tests/mpi/test_fsdp.cpp (training against one rank at DP=2 and DP=4, with experts at EP=2 and
// EP=2 x expert-DP=2 and with idle experts, overlapped at DP=2, TP=2 x DP=2 and with experts,
// memory released) and tests/unit/backend/test_device_memory.cpp (the pages).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "model/layout.h"
#include "optim/param_and_grad_buffer.h"

namespace mt::optim {

// The buckets of the FSDP unit layer id `layer` begins: its own; the head's and, with them, the
// embedding's and the multi-token-prediction depths' (the root unit: the head's backward writes
// the tied embedding's grads, the head's forward reads it).
std::vector<size_t> unit_buckets(const model::ParamLayout& layout, int layer, int head_layer);

class UnitGradReducer {
 public:
  // Over `layout` (laid out with one bucket per layer id and equal-slice padding), the rank's
  // flat `grads` (its pages in `grad_pages` when releasable, else nullptr) and its reduction
  // groups; the TP side buffer reports to `ledger` (nullable) as grads. `head_layer` is the
  // model's head layer id. Everything must outlive the reducer.
  // `overlap` (--overlap-grad-reduce): a unit's reduce-scatter runs non-blocking during the next
  // unit's backward (see above).
  UnitGradReducer(const model::ParamLayout& layout, const ReductionGroups& groups, const backend::Ops& ops,
                  float* grads, backend::ReleasableMemory* grad_pages, int head_layer, backend::MemoryLedger* ledger,
                  bool overlap);

  // Before a step's first backward: the owned slices zeroed, the reduction counts cleared.
  void begin_step();
  // The stage's before-backward signal: the pages of the unit's full-size grads marked resident.
  void before_backward(int layer);
  // The stage's grads-ready signal: reduces the buckets whose units layer `layer` completes.
  void layer_ready(int layer);
  // After the step's last backward: the owned slices hold the step's reduced grads.
  void finish();
  // The slice of bucket `bucket` this rank owns (the same as ParamAndGradBuffer's when sharded).
  model::FlatRange owned_range(int bucket) const;
  // Elements of the grad shard (the owned slices together).
  int64_t shard_elements() const { return shard_elements_; }
  // Unit reductions run this step (every bucket once per micro-batch).
  int64_t reductions() const { return reductions_total_; }
  // Seconds of the reduce-scatters since construction from start to done, and of the rank's
  // blocking on them (in the call, or in the wait when overlapped); host clocks, as the gathers'.
  double reduce_seconds() const { return reduce_seconds_; }
  double reduce_wait_seconds() const { return reduce_wait_seconds_; }

 private:
  // The owned part of a tensor reduced over TP: flat elements [flat, flat + count), kept at
  // `side` of side_ between reductions.
  struct SidePiece {
    size_t bucket = 0;
    int64_t flat = 0, count = 0, side = 0;
  };
  void reduce_bucket(size_t bucket);
  // The bucket's reduce-scatter done (waited when in flight), the rest of its full-size grads released.
  void complete_bucket(size_t bucket);
  void complete_in_flight();
  void release_outside_shard(size_t bucket);
  void restore_side(size_t bucket);
  void keep_aside(size_t bucket);

  const model::ParamLayout& layout_;
  ReductionGroups groups_;
  const backend::Ops& ops_;
  float* grads_;
  backend::ReleasableMemory* grad_pages_;
  int head_layer_;
  int64_t shard_elements_ = 0;
  std::vector<SidePiece> side_pieces_;
  backend::DeviceBuffer<float> side_;  // TP > 1 only
  std::vector<int64_t> reductions_;    // per bucket, this step
  bool overlap_;
  std::vector<size_t> in_flight_;                         // buckets whose reduce-scatter is not completed
  std::vector<std::unique_ptr<comm::Request>> requests_;  // per bucket, overlapped only
  std::vector<std::chrono::steady_clock::time_point> started_;  // per bucket
  double reduce_seconds_ = 0;
  double reduce_wait_seconds_ = 0;
  int64_t reductions_total_ = 0;
};

}  // namespace mt::optim
