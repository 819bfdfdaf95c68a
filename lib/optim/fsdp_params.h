// Megatron-FSDP's parameter sharding (--data-parallel-sharding-strategy optim_grads_params, issue
// 25): between uses each rank keeps only its shard of every unit's parameters (its owned slice of
// each bucket, in place in the flat parameter buffer, where AdamW updates it); a unit's
// parameters are all-gathered into the unit's region of the flat buffer before its forward and
// released after it, gathered again before its backward and released once its grads are reduced
// (Megatron-FSDP's pre-forward / post-forward / pre-backward / post-backward hooks,
// megatron_fsdp.py). Units are those of optim/fsdp_grads.h: one per transformer layer, and the
// root unit (the embedding, the head and the multi-token-prediction depths), which stays gathered
// from the embedding's forward to the embedding's backward (the head reads the tied embedding in
// its forward and backward; a forward-only pass leaves it gathered until the next step or
// checkpoint releases every unit, since the optimizer updates only the shard). A MoE layer's
// experts are a unit of their own, sharded and gathered over expert-DP with the layer's signals.
// Released, a unit's parameters outside the shard read as zeros: with releasable memory
// (backend/memory.h) their whole pages go back to the buffer's page pool, else they are zeroed, so
// a missed gather computes with zeros and fails the equivalence tests. A gather takes pool pages
// unzeroed: it overwrites the whole bucket. Each gather refreshes the unit's range of
// the GEMM weight copy (model::GemmWeights).
//
// Prefetch: with `prefetch`, gathering a unit also starts (non-blocking) the gather of the unit
// that will be used next in the same direction (forward: the next layer, backward: the previous
// one), so its communication overlaps this unit's compute; the next use waits for it. Without it
// every gather blocks. The numbers are the same either way.
//
// Overlap, measured: per gather the host time from its start to when the rank has the unit
// (gather_seconds) and the part of it the rank spent blocked, in the starting call and in the
// wait (gather_wait_seconds); 1 - wait / gather is the share hidden behind compute. A blocking
// gather is all wait, the moments between its starting call and its wait included (a loaded
// machine may deschedule the rank there: counted apart, they made a blocking gather look 20%
// hidden in one CI run). Host clocks: this times the gather only where waiting blocks the host (the
// CPU's synchronous table, the only one FSDP's strategies run on).
// Tested in tests/mpi/test_fsdp.cpp (training against one rank at DP=2 and DP=4, with and without
// prefetch, memory released, the gathers' hidden share with and without prefetch).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "model/layout.h"
#include "model/precision_gemm.h"
#include "optim/param_and_grad_buffer.h"

namespace mt::optim {

class UnitParamGatherer {
 public:
  // Over `layout` (one bucket per layer id, equal-slice padding), the rank's flat `params` (its
  // pages in `param_pages` when releasable, else nullptr; the owned slices hold this rank's shard)
  // and reduction groups; `gemm_weights` (nullable) is refreshed per gathered unit. `head_layer` is
  // the model's head layer id. Releases every unit's parameters outside the shard. Everything must
  // outlive the gatherer.
  UnitParamGatherer(const model::ParamLayout& layout, const ReductionGroups& groups, const backend::Ops& ops,
                    float* params, backend::ReleasableMemory* param_pages, model::GemmWeights* gemm_weights,
                    int head_layer, bool prefetch);
  ~UnitParamGatherer();
  UnitParamGatherer(const UnitParamGatherer&) = delete;
  UnitParamGatherer& operator=(const UnitParamGatherer&) = delete;

  // The stage's signals: before a layer's forward, after it, before its backward and once its
  // grads are reduced.
  void before_forward(int layer);
  void after_forward(int layer);
  void before_backward(int layer);
  void after_backward(int layer);
  // Every unit released (what a step, a checkpoint or a load leaves behind: a load writes whole
  // tensors, this hands back what is outside the shards).
  void release_all();

  // Unit gathers run (blocking or prefetched) since construction, and those prefetched.
  int64_t gathers() const { return gathers_; }
  int64_t prefetched() const { return prefetched_; }
  // Seconds of those gathers from start to done, and of the rank's blocking on them (see above).
  double gather_seconds() const { return gather_seconds_; }
  double gather_wait_seconds() const { return gather_wait_seconds_; }
  // Buckets whose parameters are whole now.
  int resident_buckets() const;

 private:
  enum class State { released, in_flight, gathered };
  void gather(int layer, bool wait);
  void start_bucket(size_t bucket);
  // `blocked_throughout`: started by the same blocking gather, so all its time counts as wait.
  void finish_bucket(size_t bucket, bool blocked_throughout);
  void release_bucket(size_t bucket, bool force);
  // The unit used after `layer` in forward (+1) or backward (-1) order; none: no_unit.
  int next_unit(int layer, int direction) const;
  static constexpr int kNoUnit = -1000000;

  const model::ParamLayout& layout_;
  ReductionGroups groups_;
  const backend::Ops& ops_;
  float* params_;
  backend::ReleasableMemory* param_pages_;
  model::GemmWeights* gemm_weights_;
  int head_layer_;
  bool prefetch_;
  int first_layer_, last_layer_;  // the transformer layers this rank holds: [first, last)
  std::vector<State> state_;      // per bucket
  std::vector<std::unique_ptr<comm::Request>> requests_;  // per bucket, in flight
  std::vector<std::chrono::steady_clock::time_point> started_;  // per bucket, its gather's start
  std::vector<double> start_call_seconds_;  // per bucket, the starting call's blocking time
  int64_t gathers_ = 0;
  int64_t prefetched_ = 0;
  double gather_seconds_ = 0;
  double gather_wait_seconds_ = 0;
};

}  // namespace mt::optim
