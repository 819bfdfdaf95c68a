// The data-parallel optimizer of one rank (Megatron's DistributedDataParallel grad buffers with
// its DistributedOptimizer, megatron-facts.md sec. 7): the one object that knows how parameters,
// grads and optimizer state are sharded over the reduction groups. The trainer, the layout, grad
// sync and checkpointing ask it; nothing else reads --use-distributed-optimizer.
//
// - Sharding strategy (Megatron-FSDP's names): no_shard is plain data parallelism (every rank
//   reduces and updates every parameter); optim is the distributed optimizer (ZeRO-1: each rank of
//   a reduction group owns an equal slice of every bucket of that group, reduce-scatters the grads
//   into it, keeps Adam's moments for it alone and all-gathers the updated parameters); optim_grads
//   (Megatron-FSDP, --use-megatron-fsdp, issue 25) also reduce-scatters each unit's grads after the
//   unit's backward on every micro-batch into a grad shard (optim/fsdp_grads.h; one bucket per
//   layer id); optim_grads_params also keeps only the parameter shard between uses, gathering each
//   unit before its forward and its backward (optim/fsdp_params.h). With releasable flat buffers
//   (backend/memory.h) the units' full-size grads and parameters go back to page pools when released.
// - Bucket options for the layout (bucket_options): Megatron's bucket size, and per reduction
//   group the multiple its bucket ends are padded to: lcm(group size, 128) elements when the
//   strategy needs equal slices, else the 16-element alignment.
// - Grad sync per bucket (optim/param_and_grad_buffer.h), overlapped with the last micro-batch's
//   backward on request.
// - AdamW (optim/adamw.h) over the owned ranges: the whole buffer unsharded, else the rank's slice
//   of every bucket.
// - The grad norm's local share: each tensor's primary copy (ParamEntry::primary) counted once,
//   on every rank for its slices when sharded, else on rank 0 of the tensor's reduction group.
// - Watching a run (issue 27): the parameters' sum of squares over the same pieces as the grad
//   norm (Megatron's calc_params_l2_norm: each tensor once over TP, PP, DP and the shards) queued
//   on the stream, and those pieces of the grads copied to the host for their zero count
//   (count_zeros_fp32); the step's parts under Megatron's optimizer timers (backend/step_timers.h).
// - After the step, the GEMM copy of the weights (model::GemmWeights): refreshed inside AdamW's
//   fused pass when the owned ranges cover every tensor, else after the parameters are gathered.
// - The parameter all-gather: blocking after the step, or with --overlap-param-gather started per
//   bucket after the step and waited (refreshing that bucket's GEMM copy) just before the
//   bucket's first use in the next forward, through wait_for_parameters (the stage's
//   before-forward signal), or for all buckets by finish_parameter_gather before anything else
//   reads the parameters (a checkpoint, a load).
// - Checkpoint runs: for each tensor, the runs of parameters and moments this rank reads (every
//   run of its owned ranges) and writes (the runs of primary copies it counts, as the grad norm).
// Tested in tests/unit/optim/test_distributed_optimizer.cpp (threads as ranks),
// tests/mpi/test_distributed_optimizer.cpp, and in training against one rank by
// tests/mpi/test_data_parallel.cpp and tests/tools/mt-train-mpi.bats.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "backend/step_timers.h"
#include "model/layout.h"
#include "model/precision_gemm.h"
#include "optim/adamw.h"
#include "optim/fsdp_grads.h"
#include "optim/fsdp_params.h"
#include "optim/param_and_grad_buffer.h"
#include "parallel/parallel_config.h"

namespace mt::optim {

// How data parallelism shards a model's state (Megatron-FSDP's --data-parallel-sharding-strategy).
enum class ShardingStrategy {
  no_shard,            // plain DP: grads all-reduced, every rank updates everything
  optim,               // the distributed optimizer: optimizer state and the update sharded
  optim_grads,         // + grads, reduce-scattered per unit every micro-batch (optim/fsdp_grads.h)
  optim_grads_params,  // + parameters, gathered per unit for its forward and backward (optim/fsdp_params.h)
};
const char* sharding_strategy_name(ShardingStrategy strategy);

struct DistributedOptimizerOptions {
  ShardingStrategy sharding = ShardingStrategy::no_shard;
  bool overlap_grad_reduce = false;   // --overlap-grad-reduce
  bool overlap_param_gather = false;  // --overlap-param-gather
  bool fsdp_prefetch = true;          // optim_grads_params: the next unit's gather started early (--no-fsdp-prefetch)
  AdamWConfig adam;
};

// A run of one tensor in a rank's owned ranges: elements [begin, end) of the tensor's local shard
// (row-major over ParamEntry::local_shape), its parameters at `flat` in the rank's flat buffers and
// its moments at `state` in exp_avg() / exp_avg_sq().
struct TensorRun {
  size_t entry = 0;  // index into the layout's entries
  int64_t begin = 0, end = 0;
  int64_t flat = 0;
  int64_t state = 0;
};

class DistributedOptimizer {
 public:
  // The strategy and options Megatron's flags choose (--use-distributed-optimizer,
  // --overlap-grad-reduce, --overlap-param-gather).
  static ShardingStrategy sharding_strategy(const parallel::ParallelConfig& parallel);
  static DistributedOptimizerOptions options(const parallel::ParallelConfig& parallel, const AdamWConfig& adam);
  // The layout's bucket options for `parallel` (validated: data_parallel_size set): buckets of
  // --ddp-bucket-size only with --overlap-grad-reduce, else one per chunk and group; padding per group.
  static model::BucketOptions bucket_options(const parallel::ParallelConfig& parallel);
  static model::BucketOptions bucket_options(ShardingStrategy sharding, int64_t bucket_elements,
                                             const parallel::ParallelConfig& parallel);

  // Over `layout` (laid out with bucket_options for the same strategy) and the rank's flat
  // `params` and `grads`; `gemm_weights` (nullable: no copy to refresh) is the rank's GEMM copy of
  // the parameters. Everything must outlive the optimizer. Moments report to `ledger` (nullable).
  // `param_pages` / `grad_pages` (nullable): the pages of releasable flat buffers, handed back to
  // the OS as the FSDP strategies release units (else released units are zeroed).
  DistributedOptimizer(const model::ParamLayout& layout, const DistributedOptimizerOptions& options,
                       const ReductionGroups& groups, const backend::Ops& ops, float* params, float* grads,
                       model::GemmWeights* gemm_weights, backend::MemoryLedger* ledger = nullptr,
                       backend::ReleasableMemory* param_pages = nullptr, backend::ReleasableMemory* grad_pages = nullptr);
  ~DistributedOptimizer();
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  ShardingStrategy sharding() const { return options_.sharding; }
  // The flat ranges this rank updates (AdamW's ranges): after finish_grad_sync() their grads are
  // reduced over the ranks of their groups.
  const std::vector<model::FlatRange>& owned_ranges() const { return adamw_.ranges(); }

  // One step's grads: begin_grad_sync zeroes the grad buffer (nothing may be in flight);
  // arm_grad_sync(chunk) before the chunk's last backward; grads_ready(layer) is the stage's
  // grads-ready signal; finish_grad_sync reduces what has not started and waits for everything.
  void begin_grad_sync();
  void arm_grad_sync(int chunk) { buffer_.arm(chunk); }
  // optim_grads: every micro-batch's grads-ready signal reduce-scatters the units it completes
  // (optim/fsdp_grads.h), and finish_grad_sync puts the step's shard in the owned ranges.
  void grads_ready(int layer);
  void finish_grad_sync();
  int started_grad_buckets() const { return buffer_.started_buckets(); }
  // optim_grads(_params): the unit reductions run since begin_grad_sync (buckets x micro-batches); 0 otherwise.
  int64_t unit_grad_reductions() const { return unit_grads_ ? unit_grads_->reductions() : 0; }
  // optim_grads_params: the parameter shard's gathers (optim/fsdp_params.h), null otherwise.
  const UnitParamGatherer* unit_params() const { return unit_params_.get(); }
  // optim_grads(_params): the unit grad reductions (optim/fsdp_grads.h), null otherwise.
  const UnitGradReducer* unit_grads() const { return unit_grads_.get(); }
  // The stage's after-forward and before-backward signals (FSDP's units: their parameters
  // released after a forward and gathered for a backward, their grad pages marked resident).
  void after_forward(int layer);
  void before_backward(int layer);

  // This rank's share of the grad norm's sum of squares (fp64, unscaled): the ranks' shares over
  // the world add up to each tensor's global sum of squares once.
  // add_grad_sum_squares adds it to a device double on the table's stream (no host wait);
  // grad_sum_squares reads it on the host (a synchronize: tests).
  void add_grad_sum_squares(double* sum) const { adamw_.add_grad_sum_squares(grads_, sum); }
  double grad_sum_squares() const { return adamw_.grad_sum_squares(grads_); }
  // The same share of the parameters' sum of squares (the params norm's), added to a device
  // double on the stream.
  void add_param_sum_squares(double* sum) const { adamw_.add_grad_sum_squares(params_, sum); }
  // The grads of the pieces the grad norm counts: how many elements, and a device-to-host copy of
  // them queued on the stream into `host` (counted_elements() floats; read it after a synchronize).
  int64_t counted_elements() const { return counted_elements_; }
  void copy_counted_grads(float* host) const;

  // AdamW over the owned ranges (grads multiplied by grad_scale: unscaling and clipping folded
  // in), then the parameters gathered (blocking, or started with --overlap-param-gather) and the
  // GEMM copy refreshed (in the fused pass, after the gather, or per bucket as it lands).
  // `timers` (nullable) times the parts: optimizer-inner-step, optimizer-copy-main-to-model-params
  // (the GEMM copy's refresh outside the fused pass) and params-all-gather (the gather, or its start).
  void step(double lr, double grad_scale, backend::StepTimers* timers = nullptr);
  // Before the forward of layer `layer` (model/layout.h ids) of model chunk `chunk`: waits for the
  // gathers of the chunk's buckets holding it and refreshes their GEMM copy (optim_grads_params:
  // gathers the layer's unit). Free when nothing is in flight.
  void wait_for_parameters(int chunk, int layer);
  // Waits for every gather in flight (refreshing the GEMM copy as each lands): call before
  // reading or writing the parameters outside a forward. optim_grads_params: every unit
  // released, so only the shards are left (call it again after writing whole tensors).
  void finish_parameter_gather();

  // Checkpoints: the runs of the owned ranges (every tensor this rank updates, copies included: the
  // moments it reads back), and those it writes, parameters and moments alike (the primary copies
  // it counts in the grad norm).
  const std::vector<TensorRun>& state_runs() const { return state_runs_; }
  const std::vector<TensorRun>& checkpoint_runs() const { return checkpoint_runs_; }
  int64_t steps() const { return adamw_.steps(); }
  void set_steps(int64_t steps) { adamw_.set_steps(steps); }
  float* exp_avg() { return adamw_.exp_avg(); }
  float* exp_avg_sq() { return adamw_.exp_avg_sq(); }
  int64_t state_bytes() const { return adamw_.state_bytes(); }

 private:
  // Whether this rank holds the copy of `entry`'s owned runs that counts (grad norm, checkpoint).
  bool counts(const model::ParamEntry& entry) const;
  std::vector<model::FlatRange> owned_ranges_of(const model::ParamLayout& layout) const;
  void collect_runs();
  void refresh_gemm_copy(int bucket);

  const model::ParamLayout& layout_;
  DistributedOptimizerOptions options_;
  const backend::Ops& ops_;
  float* params_;
  float* grads_;
  model::GemmWeights* gemm_weights_;
  ParamAndGradBuffer buffer_;
  std::unique_ptr<UnitGradReducer> unit_grads_;     // optim_grads and optim_grads_params
  std::unique_ptr<UnitParamGatherer> unit_params_;  // optim_grads_params only
  AdamW adamw_;
  bool gathers_ = false;  // a step gathers some bucket's parameters
  std::vector<TensorRun> state_runs_, checkpoint_runs_;
  int64_t counted_elements_ = 0;  // over checkpoint_runs_: the pieces the grad norm counts
};

}  // namespace mt::optim
