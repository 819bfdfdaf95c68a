// The data-parallel optimizer (see distributed_optimizer.h).
#include "optim/distributed_optimizer.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace mt::optim {
namespace {

// Megatron's distributed optimizer pads each bucket end to a multiple of lcm(group size, 128).
constexpr int64_t kEqualSlicePad = 128;

int64_t equal_slice_pad(int group_size) { return std::lcm<int64_t>(std::max(1, group_size), kEqualSlicePad); }

// Refuses the strategies and combinations not built (mt::UsageError naming them).
const DistributedOptimizerOptions& checked(const DistributedOptimizerOptions& options) {
  if (options.overlap_param_gather && options.sharding == ShardingStrategy::no_shard) {
    throw UsageError("--overlap-param-gather", "needs --use-distributed-optimizer");
  }
  return options;
}

}  // namespace

const char* sharding_strategy_name(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::no_shard: return "no_shard";
    case ShardingStrategy::optim: return "optim";
    case ShardingStrategy::optim_grads: return "optim_grads";
    case ShardingStrategy::optim_grads_params: return "optim_grads_params";
  }
  return "unknown";
}

ShardingStrategy DistributedOptimizer::sharding_strategy(const parallel::ParallelConfig& parallel) {
  if (!parallel.use_megatron_fsdp) {
    return parallel.use_distributed_optimizer ? ShardingStrategy::optim : ShardingStrategy::no_shard;
  }
  for (ShardingStrategy strategy : {ShardingStrategy::no_shard, ShardingStrategy::optim, ShardingStrategy::optim_grads,
                                    ShardingStrategy::optim_grads_params}) {
    if (parallel.data_parallel_sharding_strategy == sharding_strategy_name(strategy)) return strategy;
  }
  throw UsageError("--data-parallel-sharding-strategy " + parallel.data_parallel_sharding_strategy,
                   "must be one of no_shard, optim, optim_grads, optim_grads_params");
}

DistributedOptimizerOptions DistributedOptimizer::options(const parallel::ParallelConfig& parallel,
                                                          const AdamWConfig& adam) {
  DistributedOptimizerOptions options;
  options.sharding = sharding_strategy(parallel);
  options.overlap_grad_reduce = parallel.overlap_grad_reduce;
  options.overlap_param_gather = parallel.overlap_param_gather;
  options.fsdp_prefetch = !parallel.no_fsdp_prefetch;
  options.adam = adam;
  return options;
}

model::BucketOptions DistributedOptimizer::bucket_options(const parallel::ParallelConfig& parallel) {
  return bucket_options(sharding_strategy(parallel), parallel.bucket_size_elements(), parallel);
}

model::BucketOptions DistributedOptimizer::bucket_options(ShardingStrategy sharding, int64_t bucket_elements,
                                                          const parallel::ParallelConfig& parallel) {
  model::BucketOptions options;
  options.bucket_elements = bucket_elements;
  // FSDP's units (optim/fsdp_grads.h, optim/fsdp_params.h).
  options.bucket_per_layer =
      sharding == ShardingStrategy::optim_grads || sharding == ShardingStrategy::optim_grads_params;
  if (sharding != ShardingStrategy::no_shard) {
    options.pad(model::DataParallelGroup::dense) =
        equal_slice_pad(parallel.data_parallel_size * parallel.context_parallel_size);
    options.pad(model::DataParallelGroup::expert) = equal_slice_pad(parallel.expert_data_parallel_size());
  }
  return options;
}

DistributedOptimizer::DistributedOptimizer(const model::ParamLayout& layout, const DistributedOptimizerOptions& options,
                                           const ReductionGroups& groups, const backend::Ops& ops, float* params,
                                           float* grads, model::GemmWeights* gemm_weights,
                                           backend::MemoryLedger* ledger, backend::ReleasableMemory* param_pages,
                                           backend::ReleasableMemory* grad_pages)
    : layout_(layout),
      options_(checked(options)),
      ops_(ops),
      params_(params),
      grads_(grads),
      gemm_weights_(gemm_weights),
      buffer_(layout, groups, options.sharding != ShardingStrategy::no_shard, options.overlap_grad_reduce),
      adamw_(layout, owned_ranges_of(layout), options.adam, ops, ledger,
             [this](const model::ParamEntry& entry) { return counts(entry); }) {
  const bool units = options_.sharding == ShardingStrategy::optim_grads ||
                     options_.sharding == ShardingStrategy::optim_grads_params;
  // FSDP's root unit ends with the head, whose layer id closes the rank's layers (no PP under FSDP).
  const int head_layer = layout.last_layer;
  if (units) {
    unit_grads_ = std::make_unique<UnitGradReducer>(layout, groups, ops, grads, grad_pages, head_layer, ledger,
                                                    options_.overlap_grad_reduce);
  }
  if (options_.sharding == ShardingStrategy::optim_grads_params) {
    unit_params_ = std::make_unique<UnitParamGatherer>(layout, groups, ops, params, param_pages, gemm_weights,
                                                       head_layer, options_.fsdp_prefetch);
  }
  // optim_grads_params gathers each unit when it is used, not after the step.
  gathers_ = !unit_params_ && buffer_.gathers_any();
  collect_runs();
}

DistributedOptimizer::~DistributedOptimizer() = default;

bool DistributedOptimizer::counts(const model::ParamEntry& entry) const {
  if (!entry.primary()) return false;
  return options_.sharding != ShardingStrategy::no_shard || buffer_.groups().of(entry.data_parallel_group).rank() == 0;
}

std::vector<model::FlatRange> DistributedOptimizer::owned_ranges_of(const model::ParamLayout& layout) const {
  if (options_.sharding == ShardingStrategy::no_shard) return {model::FlatRange{0, layout.total_elements}};
  std::vector<model::FlatRange> ranges;
  for (size_t b = 0; b < layout.buckets.size(); ++b) ranges.push_back(buffer_.owned_range(static_cast<int>(b)));
  return ranges;
}

void DistributedOptimizer::collect_runs() {
  int64_t state = 0;
  for (const model::FlatRange& range : owned_ranges()) {
    for (size_t i = 0; i < layout_.entries.size(); ++i) {
      const model::ParamEntry& entry = layout_.entries[i];
      const int64_t begin = std::max(range.begin, entry.offset);
      const int64_t end = std::min(range.end, entry.offset + entry.numel);
      if (begin >= end) continue;
      const TensorRun run{i, begin - entry.offset, end - entry.offset, begin, state + (begin - range.begin)};
      state_runs_.push_back(run);
      if (counts(entry)) {
        checkpoint_runs_.push_back(run);
        counted_elements_ += run.end - run.begin;
      }
    }
    state += range.end - range.begin;
  }
}

void DistributedOptimizer::begin_grad_sync() {
  buffer_.begin_grad_sync(grads_);
  if (unit_grads_) {
    unit_grads_->begin_step();  // only the owned slices: the units' grads were released as zeros
  } else {
    ops_.zero(grads_, layout_.total_elements * static_cast<int64_t>(sizeof(float)), ops_.default_stream());
  }
}

void DistributedOptimizer::grads_ready(int layer) {
  if (!unit_grads_) {
    buffer_.layer_ready(layer);
    return;
  }
  unit_grads_->layer_ready(layer);
  if (unit_params_) unit_params_->after_backward(layer);
}

void DistributedOptimizer::after_forward(int layer) {
  if (unit_params_) unit_params_->after_forward(layer);
}

void DistributedOptimizer::before_backward(int layer) {
  if (unit_grads_) unit_grads_->before_backward(layer);
  if (unit_params_) unit_params_->before_backward(layer);
}

void DistributedOptimizer::finish_grad_sync() {
  if (unit_grads_) {
    unit_grads_->finish();
  } else {
    buffer_.finish_grad_sync();
  }
}

void DistributedOptimizer::copy_counted_grads(float* host) const {
  int64_t at = 0;
  for (const TensorRun& run : checkpoint_runs_) {
    const int64_t n = run.end - run.begin;
    ops_.copy(host + at, grads_ + run.flat, n * static_cast<int64_t>(sizeof(float)), backend::CopyKind::device_to_host,
              ops_.default_stream());
    at += n;
  }
}

void DistributedOptimizer::step(double lr, double grad_scale, backend::StepTimers* timers) {
  using backend::StepTimer;
  using backend::TimerScope;
  finish_parameter_gather();  // a gather still in flight would overwrite this step's update
  if (unit_params_) {
    // Only the shards are held: each unit's GEMM copy is refreshed when it is next gathered.
    {
      TimerScope inner(timers, StepTimer::optimizer_inner_step);
      adamw_.step(params_, nullptr, grads_, lr, grad_scale);
    }
    TimerScope copy(timers, StepTimer::optimizer_copy_main_to_model_params);
    TimerScope gather(timers, StepTimer::params_all_gather);
    return;
  }
  // The fused pass refreshes the GEMM copy of what it updates: all of it when nothing is gathered.
  uint16_t* fused_copy = !gathers_ && gemm_weights_ ? gemm_weights_->bf16_bits() : nullptr;
  {
    TimerScope inner(timers, StepTimer::optimizer_inner_step);
    adamw_.step(params_, fused_copy, grads_, lr, grad_scale);
  }
  if (!gathers_) {
    {
      TimerScope copy(timers, StepTimer::optimizer_copy_main_to_model_params);
      if (!fused_copy && gemm_weights_) gemm_weights_->refresh(params_);
    }
    // Nothing to gather: timed all the same, as Megatron's, so every rank starts the same timers.
    TimerScope gather(timers, StepTimer::params_all_gather);
    return;
  }
  if (!options_.overlap_param_gather) {
    {
      TimerScope gather(timers, StepTimer::params_all_gather);
      buffer_.gather_parameters(params_);
    }
    TimerScope copy(timers, StepTimer::optimizer_copy_main_to_model_params);
    if (gemm_weights_) gemm_weights_->refresh(params_);
    return;
  }
  {
    TimerScope copy(timers, StepTimer::optimizer_copy_main_to_model_params);
    for (size_t b = 0; b < layout_.buckets.size(); ++b) {
      if (!buffer_.gathers(static_cast<int>(b))) refresh_gemm_copy(static_cast<int>(b));
    }
  }
  TimerScope gather(timers, StepTimer::params_all_gather);
  buffer_.start_parameter_gather(params_);
}

void DistributedOptimizer::wait_for_parameters(int chunk, int layer) {
  if (unit_params_) unit_params_->before_forward(layer);
  if (!buffer_.parameter_gather_in_flight()) return;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const model::GradBucket& bucket = layout_.buckets[b];
    if (bucket.chunk != chunk || layer < bucket.first_layer || layer > bucket.last_layer) continue;
    if (buffer_.finish_parameter_gather(static_cast<int>(b))) refresh_gemm_copy(static_cast<int>(b));
  }
}

void DistributedOptimizer::finish_parameter_gather() {
  if (unit_params_) unit_params_->release_all();
  if (!buffer_.parameter_gather_in_flight()) return;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    if (buffer_.finish_parameter_gather(static_cast<int>(b))) refresh_gemm_copy(static_cast<int>(b));
  }
}

void DistributedOptimizer::refresh_gemm_copy(int bucket) {
  if (!gemm_weights_) return;
  const model::GradBucket& b = layout_.buckets.at(static_cast<size_t>(bucket));
  gemm_weights_->refresh(params_, b.begin, b.padded_end);
}

}  // namespace mt::optim
