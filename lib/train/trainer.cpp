// The training loop (see trainer.h).
#include "train/trainer.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <utility>

#include "comm/stream_communicator.h"
#include "core/error.h"
#include "core/stop_request.h"
#include "core/threads.h"
#include "data/gpt_dataset.h"
#include "model/init.h"
#include "model/layers/moe_mlp.h"
#include "parallel/context_parallel.h"
#include "perf/memory.h"
#include "train/moe_step.h"
#include "train/mtp_step.h"
#include "train/supported.h"

namespace mt::train {

using backend::StepTimer;
using backend::TimerScope;

namespace {

// Iteration counts become sample counts (x the global batch) in 64 bits: a product past them would
// wrap (2^62 + 1 iterations of 4 samples is 4 samples) and is refused naming the flag (W7, U7).
void check_sample_counts_fit(const TrainConfig& c, int64_t global) {
  const std::pair<const char*, int64_t> counts[] = {
      {"--train-iters", c.train_iters}, {"--lr-decay-iters", c.lr_decay_iters}, {"--lr-warmup-iters", c.lr_warmup_iters}};
  for (const auto& [flag, iterations] : counts) {
    int64_t samples = 0;
    if (__builtin_mul_overflow(iterations, global, &samples)) {
      throw UsageError(std::string(flag) + " " + std::to_string(iterations),
                       "x --global-batch-size " + std::to_string(global) +
                           " samples does not fit in 64 bits (at most " +
                           std::to_string(std::numeric_limits<int64_t>::max() / global) + " iterations)");
    }
  }
  if (c.lr_decay_iters < 0) throw UsageError("--lr-decay-iters", "must be at least 0");
  if (c.lr_decay_samples < 0) throw UsageError("--lr-decay-samples", "must be at least 0");
  if (c.lr_warmup_iters < 0) throw UsageError("--lr-warmup-iters", "must be at least 0");
  if (c.lr_warmup_samples < 0) throw UsageError("--lr-warmup-samples", "must be at least 0");
}

}  // namespace

void validate_train_config(const TrainConfig& c) {
  if (c.micro_batch_size <= 0) throw UsageError("--micro-batch-size", "must be at least 1");
  if (c.global_batch_size < 0) throw UsageError("--global-batch-size", "must be at least 1");
  const int global = c.global_batch_size > 0 ? c.global_batch_size : c.micro_batch_size;
  if (global % c.micro_batch_size != 0) {
    throw UsageError("--global-batch-size " + std::to_string(global),
                     "not divisible by --micro-batch-size " + std::to_string(c.micro_batch_size));
  }
  if (c.train_iters < 0) throw UsageError("--train-iters", "must be positive");
  if (c.train_samples < 0) throw UsageError("--train-samples", "must be positive");
  if ((c.train_iters > 0) == (c.train_samples > 0)) {
    throw UsageError("--train-iters/--train-samples", "give exactly one of them");
  }
  check_sample_counts_fit(c, global);
  // Comparisons are written so that NaN fails them.
  if (!(c.lr >= 0 && c.min_lr >= 0 && c.min_lr <= c.lr) || std::isinf(c.lr)) {
    throw UsageError("--lr/--min-lr", "need 0 <= min-lr <= lr, finite");
  }
  if (c.lr_warmup_fraction >= 0 && (c.lr_warmup_iters > 0 || c.lr_warmup_samples > 0)) {
    throw UsageError("--lr-warmup-fraction", "conflicts with --lr-warmup-iters/--lr-warmup-samples");
  }
  if (!(c.lr_warmup_fraction < 0 || c.lr_warmup_fraction <= 1)) {
    throw UsageError("--lr-warmup-fraction", "must be in [0, 1]");
  }
  if (!(c.clip_grad >= 0) || std::isinf(c.clip_grad)) throw UsageError("--clip-grad", "must be at least 0");
  if (c.log_interval <= 0) throw UsageError("--log-interval", "must be at least 1");
  if (c.eval_interval <= 0) throw UsageError("--eval-interval", "must be at least 1");
  if (c.eval_iters < 0) throw UsageError("--eval-iters", "must be at least 0");
  if (!(c.adam.beta1 >= 0 && c.adam.beta1 < 1 && c.adam.beta2 >= 0 && c.adam.beta2 < 1)) {
    throw UsageError("--adam-beta1/--adam-beta2", "must be in [0, 1)");
  }
  if (!(c.adam.eps > 0) || std::isinf(c.adam.eps)) throw UsageError("--adam-eps", "must be positive");
  if (!(c.adam.weight_decay >= 0) || std::isinf(c.adam.weight_decay)) {
    throw UsageError("--weight-decay", "must be at least 0");
  }
  if (c.recompute.num_layers <= 0) throw UsageError("--recompute-num-layers", "must be at least 1");
  if (!(c.loss_scale >= 0) || std::isinf(c.loss_scale)) throw UsageError("--loss-scale", "must be positive");
  if (c.loss_scale > 0 && c.precision != Precision::fp16) throw UsageError("--loss-scale", "applies to --fp16 only");
  if (!(c.initial_loss_scale > 0) || std::isinf(c.initial_loss_scale)) {
    throw UsageError("--initial-loss-scale", "must be positive");
  }
  // A scale below 1 only pushes fp16 grads toward underflow (1e-30: every grad 0, nothing trains).
  const char* below_one = "must be at least 1: a loss scale below 1 flushes fp16 gradients to zero";
  if (c.loss_scale > 0 && c.loss_scale < 1) throw UsageError("--loss-scale", below_one);
  if (c.initial_loss_scale < 1) throw UsageError("--initial-loss-scale", below_one);
  if (c.max_consecutive_skipped_iters < 0) throw UsageError("--max-consecutive-skipped-iters", "must be at least 0");
  if (!(c.min_loss_scale > 0) || std::isinf(c.min_loss_scale)) throw UsageError("--min-loss-scale", "must be positive");
  if (c.loss_scale_window <= 0) throw UsageError("--loss-scale-window", "must be at least 1");
  if (c.hysteresis <= 0) throw UsageError("--hysteresis", "must be at least 1");
  if (c.seed > 4294967295ULL) throw UsageError("--seed", "must be in [0, 4294967295]");
  if (c.timing_log_level < 0 || c.timing_log_level > 2) throw UsageError("--timing-log-level", "must be 0, 1 or 2");
}

Trainer::Trainer(const model::ModelConfig& model, const TrainConfig& train, const data::SampleSource& data,
                 const backend::Ops& ops, const parallel::ProcessGroups* groups)
    : model_config_(model), config_(train), data_(data), ops_(ops) {
  model_config_.validate();
  validate_train_config(config_);
  const parallel::RankCoordinates coordinates = connect_groups(groups);
  check_supported(model_config_, parallel_config_, ops_.device);
  check_bert_supported();
  check_fp8_supported();
  check_batch_shape();
  check_memory(groups ? local_rank_count() : 1);  // before anything large exists
  build_layout_and_schedules(coordinates);
  build_parameters();
  build_stages_and_pipeline();
  build_optimizer(groups);
  initialize_parameters();  // after the optimizer: under FSDP's optim_grads_params only the shard is written
  build_loss_scaler();
  build_lr_schedule();
  check_data_covers_run();
  allocate_staging();
}

parallel::RankCoordinates Trainer::connect_groups(const parallel::ProcessGroups* groups) {
  parallel::RankCoordinates coordinates;
  single_ = comm::make_single_communicator();
  single_data_ = comm::make_stream_communicator(comm::make_single_communicator(), ops_, ops_.default_stream());
  world_ = data_parallel_control_ = context_control_ = pipeline_control_ = single_.get();
  data_world_ = tensor_group_ = data_parallel_group_ = context_group_ = pipeline_group_ = single_data_.get();
  if (groups) {
    if (&groups->ops() != &ops_) {
      throw Error("trainer", std::string("the process groups' data communicators are bound to the ") +
                                 groups->ops().name + " backend, the trainer runs on " + ops_.name);
    }
    parallel_config_ = groups->grid().config();
    coordinates = groups->coordinates();
    world_ = &groups->world();
    data_world_ = &groups->data_world();
    tensor_group_ = &groups->data(parallel::GroupKind::tp);
    data_parallel_group_ = &groups->data(parallel::GroupKind::dp_cp);
    data_parallel_control_ = &groups->control(parallel::GroupKind::dp_cp);
    context_group_ = &groups->data(parallel::GroupKind::cp);
    context_control_ = &groups->control(parallel::GroupKind::cp);
    pipeline_group_ = &groups->data(parallel::GroupKind::pp);
    pipeline_control_ = &groups->control(parallel::GroupKind::pp);
    if (groups->has(parallel::GroupKind::embedding)) embedding_group_ = &groups->data(parallel::GroupKind::embedding);
    connect_expert_groups(*groups);
  }
  writes_expert_biases_ = coordinates.tp == 0 && coordinates.dp == 0 && coordinates.cp == 0;
  writes_expert_fp8_state_ = coordinates.expert_tp == 0 && coordinates.expert_dp == 0;
  data_parallel_coordinate_ = coordinates.dp;
  data_parallel_size_ = parallel_config_.data_parallel_size;
  return coordinates;
}

void Trainer::connect_expert_groups(const parallel::ProcessGroups& groups) {
  const parallel::RankCoordinates& coordinates = groups.coordinates();
  expert_groups_.expert_parallel = parallel_config_.expert_model_parallel_size;
  expert_groups_.expert_tensor_parallel = parallel_config_.expert_tensor_parallel();
  expert_groups_.ep_rank = coordinates.ep;
  expert_groups_.etp_rank = coordinates.expert_tp;
  expert_groups_.ep = &groups.data(parallel::GroupKind::ep);
  expert_groups_.expert_tp = &groups.data(parallel::GroupKind::expert_tp);
  expert_groups_.expert_tp_ep = &groups.data(parallel::GroupKind::expert_tp_ep);
  expert_groups_.tp_cp = &groups.data(parallel::GroupKind::tp_cp);
  expert_groups_.tp_dp_cp = &groups.data(parallel::GroupKind::tp_dp_cp);
  expert_data_parallel_group_ = &groups.data(parallel::GroupKind::expert_dp);
}

void Trainer::check_batch_shape() {
  const int dp = data_parallel_size_;
  if (data_.vocab_size() > model_config_.vocab_size) {
    throw UsageError("--vocab-size " + std::to_string(model_config_.vocab_size),
                     "smaller than the data's vocabulary (" + std::to_string(data_.vocab_size()) + ")");
  }
  if (config_.global_batch_size <= 0) config_.global_batch_size = config_.micro_batch_size * dp;
  if (config_.global_batch_size % (config_.micro_batch_size * dp) != 0) {
    throw UsageError("--global-batch-size " + std::to_string(config_.global_batch_size),
                     "not divisible by --micro-batch-size " + std::to_string(config_.micro_batch_size) +
                         " x data-parallel size " + std::to_string(dp));
  }
  // A recompute chunk (or block) longer than the model is the whole model, as in Megatron.
  config_.recompute.num_layers = std::min(config_.recompute.num_layers, model_config_.num_layers);
}

perf::MemoryOptions training_memory_options(const TrainConfig& config, const parallel::ParallelConfig& parallel,
                                            int ranks_per_node, const backend::Ops& ops) {
  const int dp = parallel.data_parallel_size;
  const int global = config.global_batch_size > 0 ? config.global_batch_size : config.micro_batch_size * dp;
  perf::MemoryOptions memory;
  memory.precision = config.precision;
  memory.recompute = config.recompute;
  memory.micro_batch_size = config.micro_batch_size;
  memory.staged_samples = global / dp;
  memory.parallel = parallel;
  memory.ranks_per_node = ranks_per_node;
  memory.ops = &ops;
  return memory;
}

void Trainer::check_memory(int ranks_per_node) const {
  perf::check_training_memory(model_config_, training_memory_options(config_, parallel_config_, ranks_per_node, ops_),
                              perf::available_memory_bytes());
}

void Trainer::build_layout_and_schedules(const parallel::RankCoordinates& coordinates) {
  // This rank's model chunks (model::pipeline_chunks).
  layout_ = model::build_layout(model_config_, parallel_config_, coordinates,
                                model::pipeline_chunks(model_config_, parallel_config_, coordinates.pp),
                                optim::DistributedOptimizer::bucket_options(parallel_config_));
  // The schedules of a training step and of an evaluation step over this rank's micro-batches.
  const int num_micro = config_.global_batch_size / (config_.micro_batch_size * data_parallel_size_);
  train_actions_ = parallel::pipeline_actions(
      parallel::pipeline_shape(parallel_config_, model_config_.num_layers, num_micro), coordinates.pp);
  eval_actions_ = parallel::pipeline_actions(
      parallel::pipeline_shape(parallel_config_, model_config_.num_layers, num_micro, true), coordinates.pp);
  parallel_ = model::ParallelContext(tensor_group_, parallel_config_.sequence_parallel, context_group_);
  parallel_.set_expert_groups(expert_groups_);
}

void Trainer::build_parameters() {
  // Megatron-FSDP's sharded units hand their full-size pages back as they are released
  // (backend/memory.h, optim/fsdp_grads.h, optim/fsdp_params.h).
  const bool shards_params = parallel_config_.shards_grads() &&
                             parallel_config_.data_parallel_sharding_strategy == "optim_grads_params";
  const auto residency = [](bool releasable) {
    return releasable ? backend::Residency::releasable : backend::Residency::whole;
  };
  params_ = backend::DeviceBuffer<float>(ops_, layout_.total_elements, backend::MemoryCategory::weights, &memory_,
                                         residency(shards_params));
  grads_ = backend::DeviceBuffer<float>(ops_, layout_.total_elements, backend::MemoryCategory::grads, &memory_,
                                        residency(parallel_config_.shards_grads()));
  gemm_weights_ = std::make_unique<model::GemmWeights>(ops_, config_.precision, layout_.total_elements, &memory_);
  if (config_.fp8.enabled) {
    fp8_ = std::make_unique<model::Fp8Scaling>(ops_, config_.fp8, layout_, model_config_.num_layers, &memory_);
    fp8_->set_amax_reduction([this](float* amaxes, int64_t count) { reduce_fp8_amaxes(amaxes, count); });
  }
}

// What FP8 runs in this version: a dense or MoE model, its MTP depths too, in bf16 or fp16 (the
// layers outside FP8 run in it, as Megatron's; the experts' FP8 GEMMs: model/moe/experts.h).
void Trainer::check_fp8_supported() const {
  if (!config_.fp8.enabled) return;
  if (config_.precision == Precision::fp32) {
    throw UsageError("--fp8-format", "needs --bf16 or --fp16 (the layers outside FP8 run in it, as Megatron's)");
  }
  // Megatron's bound on --first-last-layers-bf16: each count at most the layers of a pipeline stage.
  const int stage_layers = model_config_.num_layers / parallel_config_.pipeline_model_parallel_size;
  const std::pair<const char*, int> bf16_layers[] = {
      {"--num-layers-at-start-in-bf16", config_.fp8.num_layers_at_start_in_bf16},
      {"--num-layers-at-end-in-bf16", config_.fp8.num_layers_at_end_in_bf16}};
  for (const auto& [flag, count] : bf16_layers) {
    if (config_.fp8.first_last_layers_bf16 && (count < 0 || count > stage_layers)) {
      throw UsageError(flag, std::to_string(count) + " is not between 0 and the " + std::to_string(stage_layers) +
                                 " layers of a pipeline stage");
    }
  }
}

// A micro-batch's forward or backward amaxes (Fp8Scaling calls it before each group's update, as
// TE at fp8_autocast exit and at the end of the backward) reduced as Megatron's amax reduction
// group does, over TP x DP x CP (not PP: stages hold separate linears): a max over TP, then over
// DP x CP, gives the same values.
void Trainer::reduce_fp8_amaxes(float* amaxes, int64_t count) {
  tensor_group_->all_reduce(amaxes, count, DType::f32, comm::ReduceOp::max);
  data_parallel_group_->all_reduce(amaxes, count, DType::f32, comm::ReduceOp::max);
}

void Trainer::build_stages_and_pipeline() {
  const int cp = parallel_config_.context_parallel_size;
  model::StageOptions stage_options;
  stage_options.precision = config_.precision;
  stage_options.recompute = config_.recompute;
  stage_options.micro_batch_size = config_.micro_batch_size;
  stage_options.sequence_length = model_config_.seq_length / cp;
  stage_options.seed = config_.seed;
  const size_t chunk_count = layout_.chunks.size();
  std::vector<int> slot_pool_of_chunk(chunk_count, 0);
  const std::vector<std::vector<float*>> chunk_slot_blocks = lay_out_activation_slots(stage_options, slot_pool_of_chunk);
  std::vector<model::Stage*> stage_pointers;
  for (size_t chunk = 0; chunk < chunk_count; ++chunk) {
    stage_options.slot_blocks = chunk_slot_blocks[chunk];
    stage_options.fp8 = fp8_.get();
    stages_.push_back(std::make_unique<model::Stage>(model_config_, layout_, static_cast<int>(chunk), parallel_, ops_,
                                                     *gemm_weights_, stage_options, &memory_));
    stages_.back()->bind(params_.data(), grads_.data());
    // The optimizer reduces a bucket's grads once backward is done with it, and has a bucket's
    // gathered parameters arrive before forward reads them.
    stages_.back()->on_grads_ready([this](int layer) { optimizer_->grads_ready(layer); });
    stages_.back()->on_before_forward([this, chunk](int layer) {
      optimizer_->wait_for_parameters(static_cast<int>(chunk), layer);
    });
    // Megatron-FSDP's units: parameters released after a forward, gathered again for the backward.
    stages_.back()->on_after_forward([this](int layer) { optimizer_->after_forward(layer); });
    stages_.back()->on_before_backward([this](int layer) { optimizer_->before_backward(layer); });
    stage_pointers.push_back(stages_.back().get());
  }
  pipeline_ = std::make_unique<PipelineEngine>(std::move(stage_pointers), *pipeline_group_, parallel_, ops_,
                                               model_config_.hidden_size,
                                               static_cast<int64_t>(config_.micro_batch_size) * model_config_.seq_length / cp,
                                               &memory_, std::move(slot_pool_of_chunk));
}

std::vector<std::vector<float*>> Trainer::lay_out_activation_slots(const model::StageOptions& stage_options,
                                                                   std::vector<int>& slot_pool_of_chunk) {
  // The chunks' activation slots, in pools shared by chunks (as many slots as the schedule keeps
  // the pool's micro-batches in flight at once: a rank's interleaved chunks share one pool rather
  // than each holding its own peak), laid out in blocks the stages share.
  const size_t chunk_count = layout_.chunks.size();
  std::vector<int64_t> chunk_slot_floats;
  for (size_t chunk = 0; chunk < chunk_count; ++chunk) {
    chunk_slot_floats.push_back(
        model::activation_slot_floats(model_config_, layout_, static_cast<int>(chunk), parallel_, stage_options));
  }
  std::vector<std::vector<float*>> chunk_slot_blocks(chunk_count);
  const std::vector<parallel::ActivationSlotPool> slot_pools = parallel::pipeline_slot_pools(train_actions_, chunk_slot_floats);
  for (size_t pool = 0; pool < slot_pools.size(); ++pool) {
    std::vector<float*> blocks;
    for (int slot = 0; slot < std::max(slot_pools[pool].slots, 1); ++slot) {
      slot_blocks_.emplace_back(ops_, slot_pools[pool].slot_floats, backend::MemoryCategory::activations, &memory_);
      blocks.push_back(slot_blocks_.back().data());
    }
    for (int chunk : slot_pools[pool].chunks) {
      chunk_slot_blocks[static_cast<size_t>(chunk)] = blocks;
      slot_pool_of_chunk[static_cast<size_t>(chunk)] = static_cast<int>(pool);
    }
  }
  return chunk_slot_blocks;
}

void Trainer::build_loss_scaler() {
  scaler_ = config_.precision != Precision::fp16 ? optim::LossScaler::fixed(1.0)
            : config_.loss_scale > 0
                ? optim::LossScaler::fixed(config_.loss_scale)
                : optim::LossScaler::dynamic(config_.initial_loss_scale, config_.min_loss_scale,
                                             config_.loss_scale_window, config_.hysteresis);
}

int64_t total_samples_of(const TrainConfig& config) {
  const int64_t global = config.global_batch_size > 0 ? config.global_batch_size : config.micro_batch_size;
  return config.train_iters > 0 ? config.train_iters * global : config.train_samples / global * global;
}

optim::LrSchedule lr_schedule_of(const TrainConfig& config) {
  const int64_t global = config.global_batch_size > 0 ? config.global_batch_size : config.micro_batch_size;
  optim::LrSchedule schedule;
  schedule.max_lr = config.lr;
  schedule.min_lr = config.min_lr;
  schedule.style = config.lr_decay_style;
  schedule.decay_samples = config.lr_decay_samples > 0 ? config.lr_decay_samples
                           : config.lr_decay_iters > 0 ? config.lr_decay_iters * global
                                                       : total_samples_of(config);
  if (config.lr_warmup_fraction >= 0) {
    schedule.warmup_samples = static_cast<int64_t>(config.lr_warmup_fraction * schedule.decay_samples);
  } else {
    schedule.warmup_samples = config.lr_warmup_samples > 0 ? config.lr_warmup_samples : config.lr_warmup_iters * global;
  }
  if (schedule.style != optim::LrDecayStyle::constant && schedule.warmup_samples >= schedule.decay_samples) {
    throw UsageError("--lr-warmup-*", "warm-up must end before the decay does (--lr-decay-iters/--lr-decay-samples)");
  }
  return schedule;
}

void Trainer::build_lr_schedule() {
  const int64_t global = config_.global_batch_size;
  total_iters_ = config_.train_iters > 0 ? config_.train_iters : config_.train_samples / global;
  if (total_iters_ <= 0) throw UsageError("--train-samples", "fewer than one global batch");
  schedule_ = lr_schedule_of(config_);
  flops_per_token_ = perf::flops_per_token(model_config_, config_.flops_convention);
  step_timer_ = std::make_unique<backend::StreamTimer>(ops_, ops_.default_stream());
}

void Trainer::adopt_lr_schedule(const optim::LrSchedule& schedule) {
  schedule_ = schedule;
  config_.lr = schedule.max_lr;
  config_.min_lr = schedule.min_lr;
  config_.lr_decay_style = schedule.style;
  config_.lr_warmup_iters = 0;
  config_.lr_warmup_fraction = -1;
  config_.lr_warmup_samples = schedule.warmup_samples;
  config_.lr_decay_iters = 0;
  config_.lr_decay_samples = schedule.decay_samples;
}

void Trainer::check_data_covers_run() const {
  const int64_t global = config_.global_batch_size;
  const int64_t total_samples = total_iters_ * global;
  // A bounded source (a sample index) must hold every sample the run will read.
  const int64_t train_available = data_.split_size(data::Split::train);
  if (train_available >= 0 && train_available < total_samples) {
    throw Error("data", "the training split holds " + std::to_string(train_available) + " samples, the run needs " +
                            std::to_string(total_samples) + " (rebuild the sample index for this run)");
  }
  const int64_t valid_available = data_.split_size(data::Split::valid);
  if (config_.eval_iters > 0 && valid_available > 0) {
    const int64_t evaluations = total_iters_ / config_.eval_interval + (total_iters_ % config_.eval_interval ? 1 : 0);
    const int64_t needed = evaluations * config_.eval_iters * global;
    if (valid_available < needed) {
      throw Error("data", "the validation split holds " + std::to_string(valid_available) +
                              " samples, the run's evaluations need " + std::to_string(needed) +
                              " (rebuild the sample index for this run)");
    }
  }
}

void Trainer::allocate_staging() {
  const int64_t rows = static_cast<int64_t>(config_.global_batch_size) / data_parallel_size_ * model_config_.seq_length /
                       parallel_config_.context_parallel_size;
  const bool bert = model_config_.bert;
  const int64_t samples = static_cast<int64_t>(config_.global_batch_size) / data_parallel_size_;
  sample_rows_.allocate(model_config_.seq_length, 1, bert);
  staged_.allocate(rows, samples, bert);
  device_rows_.allocate(ops_, rows, samples, bert);
  if (bert) {
    const int64_t micro_batches = samples / config_.micro_batch_size * (1 + config_.eval_iters);
    bert_sums_ = backend::DeviceBuffer<double>(ops_, kBertSumsPerMicroBatch * micro_batches,
                                               backend::MemoryCategory::activations);
    bert_sums_host_.assign(static_cast<size_t>(kBertSumsPerMicroBatch * micro_batches), 0.0);
  }
  step_sums_ = backend::DeviceBuffer<double>(ops_, 3, backend::MemoryCategory::activations);
  if (model_config_.mtp_num_layers > 0) {
    const int64_t micro_depths = static_cast<int64_t>(config_.global_batch_size) / data_parallel_size_ /
                                 config_.micro_batch_size * model_config_.mtp_num_layers;
    mtp_sums_ = backend::DeviceBuffer<double>(ops_, 2 * micro_depths, backend::MemoryCategory::activations);
    mtp_sums_host_.assign(static_cast<size_t>(2 * micro_depths), 0.0);
  }
  eval_sums_ = backend::DeviceBuffer<double>(ops_, 2 * config_.eval_iters, backend::MemoryCategory::activations);
  eval_sums_host_.assign(static_cast<size_t>(2 * config_.eval_iters), 0.0);
  // What watching the run needs: the timers, the zero count's host copy, the params norm's sum.
  if (config_.timing_log_level > 0) {
    std::function<void()> barrier;
    if (config_.barrier_with_level1_timing && world_->size() > 1) barrier = [this] { world_->barrier(); };
    timers_ = std::make_unique<backend::StepTimers>(ops_, ops_.default_stream(), config_.timing_log_level,
                                                    std::move(barrier));
  }
  if (config_.log_num_zeros_in_grad) counted_grads_host_.assign(static_cast<size_t>(optimizer_->counted_elements()), 0.0f);
  if (config_.log_params_norm) params_sum_squares_ = backend::DeviceBuffer<double>(ops_, 1, backend::MemoryCategory::optimizer);
}

void Trainer::initialize_parameters() {
  int64_t largest = 0;
  for (const model::ParamEntry& entry : layout_.entries) largest = std::max(largest, entry.numel);
  std::vector<float> host(static_cast<size_t>(largest));
  // Under FSDP's optim_grads_params the rank holds only its shard: the runs it updates.
  std::vector<std::vector<optim::TensorRun>> shard_runs;
  if (optimizer_->unit_params()) {
    shard_runs.resize(layout_.entries.size());
    for (const optim::TensorRun& run : optimizer_->state_runs()) shard_runs[run.entry].push_back(run);
  }
  for (size_t i = 0; i < layout_.entries.size(); ++i) {
    const model::ParamEntry& entry = layout_.entries[i];
    model::initialize_entry(entry, config_.seed, host.data());
    const std::vector<optim::TensorRun> whole{optim::TensorRun{i, 0, entry.numel, entry.offset, 0}};
    for (const optim::TensorRun& run : shard_runs.empty() ? whole : shard_runs[i]) {
      ops_.copy(params_.data() + run.flat, host.data() + run.begin, (run.end - run.begin) * static_cast<int64_t>(sizeof(float)),
                backend::CopyKind::host_to_device, ops_.default_stream());
    }
    ops_.synchronize(ops_.default_stream());  // the copy has read `host` before the next tensor
  }
  gemm_weights_->refresh(params_.data());
}

void Trainer::TokenRows::allocate(int64_t rows, int64_t samples, bool bert) {
  const auto size = static_cast<size_t>(rows);
  token_types.assign(bert ? size : 0, 0);
  key_lengths.assign(bert ? static_cast<size_t>(samples) : 0, 0);
  sentence_order.assign(bert ? static_cast<size_t>(samples) : 0, 0);
  tokens.assign(size, 0);
  labels.assign(size, 0);
  positions.assign(size, 0);
  doc_start.assign(size, 0);
  loss_mask.assign(size, 0.0f);
  row_ids.assign(size, 0);
}

void Trainer::DeviceRows::allocate(const backend::Ops& ops, int64_t rows, int64_t samples, bool bert) {
  if (bert) {
    token_types = backend::DeviceBuffer<int32_t>(ops, rows, backend::MemoryCategory::activations);
    key_lengths = backend::DeviceBuffer<int32_t>(ops, samples, backend::MemoryCategory::activations);
    sentence_order = backend::DeviceBuffer<int32_t>(ops, samples, backend::MemoryCategory::activations);
  }
  // Not in the memory records: the step's input rows, as their host staging.
  tokens = backend::DeviceBuffer<int32_t>(ops, rows, backend::MemoryCategory::activations);
  labels = backend::DeviceBuffer<int32_t>(ops, rows, backend::MemoryCategory::activations);
  positions = backend::DeviceBuffer<int32_t>(ops, rows, backend::MemoryCategory::activations);
  doc_start = backend::DeviceBuffer<int32_t>(ops, rows, backend::MemoryCategory::activations);
  loss_mask = backend::DeviceBuffer<float>(ops, rows, backend::MemoryCategory::activations);
  row_ids = backend::DeviceBuffer<int64_t>(ops, rows, backend::MemoryCategory::activations);
}

void Trainer::build_optimizer(const parallel::ProcessGroups* groups) {
  const optim::ReductionGroups reduction =
      groups ? optim::ReductionGroups::of(*groups) : optim::ReductionGroups::single(*single_data_);
  optimizer_ = std::make_unique<optim::DistributedOptimizer>(
      layout_, optim::DistributedOptimizer::options(parallel_config_, config_.adam), reduction, ops_, params_.data(),
      grads_.data(), gemm_weights_.get(), &memory_, params_.releasable(), grads_.releasable());
}

Trainer::~Trainer() = default;

float* Trainer::parameters() {
  optimizer_->finish_parameter_gather();
  return params_.data();
}

std::vector<Trainer::ExpertBias> Trainer::expert_biases() const {
  std::vector<ExpertBias> biases;
  for (const auto& stage : stages_) {
    for (int i = 0; i < stage->moe_layer_count(); ++i) {
      model::MoeLayerState& state = stage->moe_layer(i);
      if (!state.expert_bias.empty()) biases.push_back(ExpertBias{state.layer, state.expert_bias.data()});
    }
  }
  return biases;
}

void Trainer::parameters_changed() {
  optimizer_->finish_parameter_gather();
  gemm_weights_->refresh(params_.data());
}

TrainerState Trainer::checkpoint_state() const {
  return TrainerState{iteration_, consumed_samples_, consumed_valid_samples_, skipped_iters_, nan_iters_,
                      scaler_.state(), counters_origin_};
}

void Trainer::restore(const TrainerState& state) {
  iteration_ = state.iteration;
  consumed_samples_ = state.consumed_samples;
  consumed_valid_samples_ = state.consumed_valid_samples;
  skipped_iters_ = state.skipped_iters;
  nan_iters_ = state.nan_iters;
  counters_origin_ = state.counters_origin;
  scaler_.restore(state.loss_scaler);
}

double Trainer::fill_samples(data::Split split, int64_t first_sample, int count, int slot) {
  const int seq = model_config_.seq_length;
  const int cp = context_group_->size(), cp_rank = context_group_->rank();
  const int64_t local_seq = seq / cp;
  const int64_t vocab = model_config_.vocab_size;
  TokenRows& whole = sample_rows_;
  wait_for_staging();
  double counted = 0;
  for (int b = 0; b < count; ++b) {
    // The whole sample first: document starts and positions are computed on the whole sequence
    // and keep their global values in every CP rank's part.
    const int64_t sample = first_sample + b;
    data::SampleRows rows{whole.tokens.data(), whole.labels.data(), whole.loss_mask.data(), whole.positions.data(),
                          whole.doc_start.data()};
    if (model_config_.bert) {
      // BERT (no CP): the sample's token types, key length and sentence order at its slot.
      rows.token_types = staged_.token_types.data() + (slot + b) * local_seq;
      rows.key_length = staged_.key_lengths.data() + slot + b;
      rows.sentence_order = staged_.sentence_order.data() + slot + b;
    }
    data_.rows(split, sample, seq, rows);
    for (int t = 0; t < seq; ++t) {
      if (whole.tokens[t] < 0 || whole.tokens[t] >= vocab || whole.labels[t] < 0 || whole.labels[t] >= vocab) {
        const int32_t bad = whole.tokens[t] < 0 || whole.tokens[t] >= vocab ? whole.tokens[t] : whole.labels[t];
        throw Error("sample " + std::to_string(sample), "token id " + std::to_string(bad) +
                                                            " outside the model's vocabulary of " +
                                                            std::to_string(vocab) + " (set --vocab-size)");
      }
      whole.row_ids[t] = sample * seq + t;  // dropout keys: global coordinates
    }
    const int64_t row0 = (slot + b) * local_seq;
    const auto split_rows = [&](const auto& from, auto& to) {
      parallel::split_for_context_parallel(from.data(), to.data() + row0, 1, seq, 1, cp, cp_rank);
    };
    split_rows(whole.tokens, staged_.tokens);
    split_rows(whole.labels, staged_.labels);
    split_rows(whole.loss_mask, staged_.loss_mask);
    split_rows(whole.positions, staged_.positions);
    split_rows(whole.doc_start, staged_.doc_start);
    split_rows(whole.row_ids, staged_.row_ids);
    for (int64_t t = 0; t < local_seq; ++t) counted += staged_.loss_mask[row0 + t];
  }
  return counted;
}

void Trainer::upload_staged(int samples) {
  const int64_t rows = static_cast<int64_t>(samples) * (model_config_.seq_length / context_group_->size());
  const backend::Stream stream = ops_.default_stream();
  const auto upload = [&](auto& device, const auto& host) {
    ops_.copy(device.data(), host.data(), rows * static_cast<int64_t>(sizeof(host[0])),
              backend::CopyKind::host_to_device, stream);
  };
  upload(device_rows_.tokens, staged_.tokens);
  upload(device_rows_.labels, staged_.labels);
  upload(device_rows_.loss_mask, staged_.loss_mask);
  upload(device_rows_.positions, staged_.positions);
  upload(device_rows_.doc_start, staged_.doc_start);
  upload(device_rows_.row_ids, staged_.row_ids);
  if (model_config_.bert) {
    upload(device_rows_.token_types, staged_.token_types);
    ops_.copy(device_rows_.key_lengths.data(), staged_.key_lengths.data(), samples * static_cast<int64_t>(sizeof(int32_t)),
              backend::CopyKind::host_to_device, stream);
    ops_.copy(device_rows_.sentence_order.data(), staged_.sentence_order.data(),
              samples * static_cast<int64_t>(sizeof(int32_t)), backend::CopyKind::host_to_device, stream);
  }
  staging_in_flight_ = !ops_.synchronous;
}

void Trainer::wait_for_staging() {
  if (!staging_in_flight_) return;
  ops_.synchronize(ops_.default_stream());
  staging_in_flight_ = false;
}

model::MicroBatch Trainer::staged_batch(int count, int slot, double* loss_sums, double* sop_sums) const {
  const int local_seq = model_config_.seq_length / context_group_->size();
  const int64_t row0 = static_cast<int64_t>(slot) * local_seq;
  const DeviceRows& rows = device_rows_;
  model::MicroBatch batch{count,
                          local_seq,
                          rows.tokens.data() + row0,
                          rows.labels.data() + row0,
                          rows.loss_mask.data() + row0,
                          rows.positions.data() + row0,
                          data_.document_attention() ? rows.doc_start.data() + row0 : nullptr,
                          rows.row_ids.data() + row0,
                          loss_sums};
  if (model_config_.bert) {
    batch.key_lengths = rows.key_lengths.data() + slot;
    if (model_config_.bert_binary_head) {
      batch.token_types = rows.token_types.data() + row0;
      batch.sentence_order = rows.sentence_order.data() + slot;
      batch.sop_sums = sop_sums;
    }
  }
  return batch;
}

StepStats Trainer::train_step() {
  step_timer_->start();
  if (timers_) timers_->reset();
  const double wait_before = communicator_wait_seconds();
  const optim::UnitParamGatherer* gatherer = optimizer_->unit_params();
  const double gather_before = gatherer ? gatherer->gather_seconds() : 0;
  const double gather_wait_before = gatherer ? gatherer->gather_wait_seconds() : 0;
  const optim::UnitGradReducer* reducer = optimizer_->unit_grads();
  const double reduce_before = reducer ? reducer->reduce_seconds() : 0;
  const double reduce_wait_before = reducer ? reducer->reduce_wait_seconds() : 0;
  ++iteration_;
  StepStats stats;
  stats.iteration = iteration_;
  stats.lr = schedule_.lr_at(consumed_samples_);
  stats.loss_scale = scaler_.scale();
  stats.global_batch_size = config_.global_batch_size;

  optimizer_->begin_grad_sync();
  if (fp8_) fp8_->start_step();  // each weight quantizes at its first forward of the step
  const StepTokens tokens = run_forward_backward();
  finalize_grads();
  if (model_config_.num_experts > 0) stats.moe = finish_moe_layers(static_cast<int>(tokens.micro.size()));
  const int64_t local_zeros = update_parameters(stats, tokens.local);
  if (model_config_.mtp_num_layers > 0) stats.mtp_losses = finish_mtp_losses(static_cast<int>(tokens.micro.size()));
  scaler_.update(stats.skipped);
  if (config_.log_params_norm) queue_params_sum_squares();
  consumed_samples_ += config_.global_batch_size;
  record_step_figures(stats, wait_before);
  if (gatherer) {  // this rank's FSDP parameter gathers in the step (optim/fsdp_params.h)
    stats.fsdp_gather_ms = (gatherer->gather_seconds() - gather_before) * 1e3;
    stats.fsdp_gather_wait_ms = (gatherer->gather_wait_seconds() - gather_wait_before) * 1e3;
  }
  if (reducer) {  // this rank's FSDP grad reduce-scatters in the step (optim/fsdp_grads.h)
    stats.fsdp_reduce_ms = (reducer->reduce_seconds() - reduce_before) * 1e3;
    stats.fsdp_reduce_wait_ms = (reducer->reduce_wait_seconds() - reduce_wait_before) * 1e3;
  }
  if (config_.log_params_norm || config_.log_num_zeros_in_grad || timers_) gather_observations(stats, local_zeros);
  return stats;
}

Trainer::StepTokens Trainer::run_forward_backward() {
  // Megatron's forward-backward: the samples (read inside its forward step, batch-generator)
  // and the schedule. Megatron's also holds finalize_model_grads; mt's stops before it, so the
  // level-1 timers (forward-backward, the three grad reductions, optimizer) tile the step.
  TimerScope forward_backward(timers_.get(), StepTimer::forward_backward);
  StepTokens tokens;
  {
    TimerScope batch_generator(timers_.get(), StepTimer::batch_generator);
    tokens = stage_training_samples();
  }
  run_training_pipeline(tokens);
  return tokens;
}

void Trainer::finalize_grads() {
  {
    TimerScope all_grads_sync(timers_.get(), StepTimer::all_grads_sync);
    optimizer_->finish_grad_sync();
  }
  {
    // Sequence parallelism's norm grads are all-reduced over TP inside each bucket's reduction
    // (optim/param_and_grad_buffer.h), under all-grads-sync: nothing is left for this one.
    TimerScope layernorm_grads(timers_.get(), StepTimer::layernorm_grads_all_reduce);
  }
  TimerScope embedding_grads(timers_.get(), StepTimer::embedding_grads_all_reduce);
  sum_tied_embedding_grads();
}

int64_t Trainer::update_parameters(StepStats& stats, double local_tokens) {
  TimerScope optimizer(timers_.get(), StepTimer::optimizer);
  const double unscale = 1.0 / scaler_.scale();
  {
    // mt's grads are the fp32 main grads: nothing to copy.
    TimerScope copy_to_main_grad(timers_.get(), StepTimer::optimizer_copy_to_main_grad);
  }
  bool nonfinite = false;
  {
    // The step's sums with the grad sum of squares (whose finiteness is the check), read in the
    // step's one host wait; unscaling is folded into the optimizer's grad scale.
    TimerScope check_inf(timers_.get(), StepTimer::optimizer_unscale_and_check_inf);
    if (config_.log_num_zeros_in_grad) queue_grad_copy_for_zero_count();
    const StepSums sums = reduce_step_sums(local_tokens);
    // Megatron's reported lm loss: the sum over the step's unmasked tokens over their count
    // (BERT: pretrain_bert.py's mean of the micro-batches' masked-token means, and the sop loss).
    stats.lm_loss = sums.tokens > 0 ? sums.loss / sums.tokens : 0.0;
    if (model_config_.bert) {
      const int micro_batches = config_.global_batch_size / (config_.micro_batch_size * data_parallel_size_);
      const BertLosses losses = finish_bert_losses(bert_sums_.data(), micro_batches);
      stats.lm_loss = losses.lm;
      stats.sop_loss = losses.sop;
    }
    stats.grad_norm = std::sqrt(sums.grad_sum_squares) * unscale;
    nonfinite = skip_nonfinite(stats);
  }
  stats.skipped = nonfinite;
  if (nonfinite) return -1;  // as Megatron's: no clipping, zero count or update
  double clip = 1;
  {
    TimerScope clip_main_grad(timers_.get(), StepTimer::optimizer_clip_main_grad);
    clip = optim::clip_factor(stats.grad_norm, config_.clip_grad);
  }
  int64_t local_zeros = -1;
  {
    TimerScope count_zeros(timers_.get(), StepTimer::optimizer_count_zeros);
    if (config_.log_num_zeros_in_grad) local_zeros = count_zero_grads();
  }
  optimizer_->step(stats.lr, unscale * clip, timers_.get());
  return local_zeros;
}

Trainer::StepTokens Trainer::stage_training_samples() {
  // This rank's samples of the step (MegatronPretrainingSampler: DP rank r holds micro-batches
  // r, r + DP, ... of the global batch) are staged first: the loss is normalised by unmasked
  // tokens, per micro-batch (Megatron's default: each micro-batch's token mean, averaged over
  // the step's micro-batches on every rank) or over the whole step (--calculate-per-token-loss:
  // the token count summed over DP). The CP ranks of a DP rank read the same samples and each
  // holds its part of every sequence: the whole sequences' token counts are summed over CP.
  const int micro = config_.micro_batch_size;
  const int dp = data_parallel_size_;
  const int num_micro = config_.global_batch_size / (micro * dp);  // this rank's micro-batches
  const int64_t train_total = data_.split_size(data::Split::train);
  StepTokens tokens;
  tokens.micro.resize(static_cast<size_t>(num_micro));
  for (int m = 0; m < num_micro; ++m) {
    const int64_t first =
        data::pretraining_sampler_first(train_total, consumed_samples_, micro, data_parallel_coordinate_, dp, m);
    tokens.micro[static_cast<size_t>(m)] = fill_samples(data::Split::train, first, micro, m * micro);
    tokens.local += tokens.micro[static_cast<size_t>(m)];
  }
  upload_staged(num_micro * micro);
  if (context_control_->size() > 1) {
    context_control_->all_reduce(tokens.micro.data(), num_micro, DType::f64, comm::ReduceOp::sum);
  }
  tokens.step = tokens.local;
  if (config_.calculate_per_token_loss) sum_over_data_parallel(&tokens.step, 1);
  return tokens;
}

void Trainer::run_training_pipeline(const StepTokens& tokens) {
  const int micro = config_.micro_batch_size;
  const int dp = data_parallel_size_;
  const int num_micro = static_cast<int>(tokens.micro.size());
  PipelineCallbacks callbacks;
  // The micro-batches add their loss sums to the step's, from zero, in micro-batch order.
  ops_.zero(step_sums_.data(), 3 * static_cast<int64_t>(sizeof(double)), ops_.default_stream());
  if (model_config_.bert) prepare_bert_losses(num_micro);
  callbacks.batch = [&](int m) {
    model::MicroBatch batch = staged_batch(micro, m * micro, step_sums_.data());
    if (model_config_.bert) {
      // BERT: each micro-batch's own sums (its logged losses are per micro-batch means).
      batch.loss_sums = bert_sums_.data() + kBertSumsPerMicroBatch * m;
      if (model_config_.bert_binary_head) batch.sop_sums = batch.loss_sums + 2;
    }
    if (model_config_.mtp_num_layers > 0) {
      const int depths = model_config_.mtp_num_layers;
      batch.mtp_loss_sums = mtp_sums_.data() + 2 * m * depths;
      batch.mtp_loss_grad_scales = mtp_grad_scales_.data() + m * depths;
    }
    return batch;
  };
  if (model_config_.mtp_num_layers > 0) prepare_mtp_losses(tokens);
  callbacks.dloss_scale = [&](int m) {
    const double counted = tokens.micro[static_cast<size_t>(m)];
    const double denominator = config_.calculate_per_token_loss ? tokens.step : counted * num_micro * dp;
    // A micro-batch (or step) whose tokens are all masked contributes nothing.
    return denominator > 0 ? static_cast<float>(scaler_.scale() / denominator) : 0.0f;
  };
  set_aux_loss_grad_factor(tokens);
  // Earlier micro-batches only accumulate; each chunk's last backward reduces its buckets.
  callbacks.before_last_backward = [&](int chunk) { optimizer_->arm_grad_sync(chunk); };
  callbacks.timers = timers_.get();
  // The micro-batches run through the pipeline schedule (plain forward-backward on one stage);
  // the loss sums on the last pipeline stage.
  pipeline_->run(train_actions_, model::ForwardPass{static_cast<uint64_t>(iteration_), true}, callbacks);
}

void Trainer::set_aux_loss_grad_factor(const StepTokens& tokens) {
  if (model_config_.num_experts == 0) return;
  // Megatron's main_loss_backward_scale in mt's normalisation (DP folded into the scale, grads
  // summed): the loss scale over micro-batches x DP, so the aux losses are averaged as the LM
  // loss; with --calculate-per-token-loss the loss scale over the step's tokens, times the tokens
  // of one micro-batch's router calls over TP x CP (S x |tp_cp|, Megatron's pre-multiplied aux).
  const double micro_batches = static_cast<double>(tokens.micro.size()) * data_parallel_size_;
  const double micro_tokens = static_cast<double>(config_.micro_batch_size) * model_config_.seq_length;
  const double factor = config_.calculate_per_token_loss
                            ? (tokens.step > 0 ? scaler_.scale() * micro_tokens / tokens.step : 0.0)
                            : scaler_.scale() / micro_batches;
  for (const auto& stage : stages_) stage->set_aux_loss_grad_factor(static_cast<float>(factor));
}

void Trainer::check_bert_supported() const {
  if (model_config_.bert != data_.bert()) {
    throw UsageError("data", model_config_.bert ? "BERT (model " + model_config_.name + ") trains on BERT's masked samples "
                                                      "(a sentence dataset through --data-path)"
                                                : "BERT's masked samples train BERT models only (--model tiny-bert, bert-345m)");
  }
  if (model_config_.bert && config_.calculate_per_token_loss) {
    throw UsageError("--calculate-per-token-loss", "not supported with BERT (pretrain_bert.py's losses are per micro-batch)");
  }
}

void Trainer::prepare_bert_losses(int micro_batches) {
  const double in_step = static_cast<double>(micro_batches) * data_parallel_size_;
  for (const auto& stage : stages_) stage->set_sop_loss_grad_factor(bert_sop_grad_factor(scaler_.scale(), in_step));
  ops_.zero(bert_sums_.data(),
            kBertSumsPerMicroBatch * static_cast<int64_t>(micro_batches) * static_cast<int64_t>(sizeof(double)),
            ops_.default_stream());
}

BertLosses Trainer::finish_bert_losses(const double* sums, int micro_batches) {
  const int64_t count = kBertSumsPerMicroBatch * static_cast<int64_t>(micro_batches);
  const backend::Stream stream = ops_.default_stream();
  ops_.copy(bert_sums_host_.data(), sums, count * static_cast<int64_t>(sizeof(double)), backend::CopyKind::device_to_host,
            stream);
  ops_.synchronize(stream);
  const BertLossSums local = bert_loss_sums({bert_sums_host_.data(), static_cast<size_t>(count)});
  double total[2] = {local.lm, local.sop};  // the last stage's (others add 0), over DP
  sum_over_pipeline(total, 2);
  sum_over_data_parallel(total, 2);
  return bert_logged_losses({total[0], total[1]}, static_cast<double>(micro_batches) * data_parallel_size_,
                            model_config_.bert_binary_head);
}

void Trainer::prepare_mtp_losses(const StepTokens& tokens) {
  const int micro_batches = static_cast<int>(tokens.micro.size()), depths = model_config_.mtp_num_layers;
  // Whole sequences' counts: each CP rank counts its chunks, summed over CP as the LM loss's are.
  std::vector<double> counts =
      mtp_rolled_token_counts(staged_.loss_mask.data(), micro_batches, config_.micro_batch_size,
                              model_config_.seq_length, depths, context_group_->size(), context_group_->rank());
  if (context_control_->size() > 1) {
    context_control_->all_reduce(counts.data(), static_cast<int64_t>(counts.size()), DType::f64, comm::ReduceOp::sum);
  }
  mtp_grad_scales_ = mtp_loss_grad_scales(counts, depths, model_config_.mtp_loss_scaling_factor, scaler_.scale(),
                                          static_cast<double>(micro_batches) * data_parallel_size_,
                                          config_.calculate_per_token_loss, tokens.step);
  ops_.zero(mtp_sums_.data(), 2 * static_cast<int64_t>(micro_batches) * depths * static_cast<int64_t>(sizeof(double)),
            ops_.default_stream());
}

std::vector<double> Trainer::finish_mtp_losses(int micro_batches) {
  const int depths = model_config_.mtp_num_layers;
  const backend::Stream stream = ops_.default_stream();
  ops_.copy(mtp_sums_host_.data(), mtp_sums_.data(), 2 * static_cast<int64_t>(micro_batches) * depths *
                                                         static_cast<int64_t>(sizeof(double)),
            backend::CopyKind::device_to_host, stream);
  ops_.synchronize(stream);
  // The whole sequences' sums (over CP), then the last stage's figures (other stages add 0),
  // averaged over DP as MTPLossLoggingHelper does.
  if (context_control_->size() > 1) {
    context_control_->all_reduce(mtp_sums_host_.data(), 2 * static_cast<int64_t>(micro_batches) * depths, DType::f64,
                                 comm::ReduceOp::sum);
  }
  std::vector<double> losses = mtp_logged_losses(mtp_sums_host_, micro_batches, depths);
  if (pipeline_control_->size() > 1) pipeline_control_->all_reduce(losses.data(), depths, DType::f64, comm::ReduceOp::sum);
  if (data_parallel_control_->size() > 1) {
    data_parallel_control_->all_reduce(losses.data(), depths, DType::f64, comm::ReduceOp::sum);
    for (double& loss : losses) loss /= data_parallel_control_->size();
  }
  return losses;
}

MoeStepStats Trainer::finish_moe_layers(int micro_batches) {
  std::vector<MoeLayerStep> layers;
  for (const auto& stage : stages_) {
    for (int i = 0; i < stage->moe_layer_count(); ++i) {
      model::MoeLayerState& state = stage->moe_layer(i);
      MoeLayerStep layer;
      layer.layer = state.layer;
      layer.tokens_per_expert = state.tokens_per_expert.data();
      layer.expert_bias = !state.expert_bias.empty() ? state.expert_bias.data() : nullptr;
      for (double value : state.load_balancing) layer.load_balancing_sum += value;
      for (double value : state.z_loss) layer.z_loss_sum += value;
      state.clear_losses();
      // Megatron's reset_global_aux_loss_tracker (finalize_model_grads): global_aux_loss's
      // running counts restart with each global batch.
      if (state.router) state.router->reset_global_aux_counts();
      layers.push_back(layer);
    }
  }
  const MoeStepGroups groups{expert_groups_.tp_dp_cp, data_parallel_control_, pipeline_control_};
  return finish_moe_step(model_config_, ops_, ops_.default_stream(), groups, layers, micro_batches,
                         config_.moe_per_layer_logging);
}

Trainer::StepSums Trainer::reduce_step_sums(double local_tokens) {
  const backend::Stream stream = ops_.default_stream();
  double* sums = step_sums_.data();  // loss (from the last stage), tokens, grad sum of squares
  // The token count is the rank's (every stage knows it; the head counted the last stage's only).
  local_tokens_host_ = local_tokens;
  ops_.copy(sums + 1, &local_tokens_host_, sizeof(double), backend::CopyKind::host_to_device, stream);
  if (pipeline_group_->size() > 1) pipeline_group_->all_reduce(sums, 1, DType::f64, comm::ReduceOp::sum);
  if (data_parallel_group_->size() > 1) data_parallel_group_->all_reduce(sums, 2, DType::f64, comm::ReduceOp::sum);
  // Over every rank, each tensor's primary copy once (the optimizer's local shares: TP shards and
  // sharded DP x CP slices add up; a replicated copy counts on one rank).
  optimizer_->add_grad_sum_squares(sums + 2);
  if (data_world_->size() > 1) data_world_->all_reduce(sums + 2, 1, DType::f64, comm::ReduceOp::sum);
  ops_.copy(step_sums_host_, sums, 3 * static_cast<int64_t>(sizeof(double)), backend::CopyKind::device_to_host, stream);
  ops_.synchronize(stream);  // the step's one host wait
  staging_in_flight_ = false;
  return StepSums{step_sums_host_[0], step_sums_host_[1], step_sums_host_[2]};
}

bool Trainer::skip_nonfinite(const StepStats& stats) {
  const bool loss_nonfinite = !std::isfinite(stats.lm_loss);
  if (!loss_nonfinite && std::isfinite(stats.grad_norm)) {
    skipped_in_a_row_at_min_scale_ = 0;
    return false;
  }
  // fp16: non-finite grads under a finite forward loss are a loss-scale overflow, the scaler's to
  // handle (the step is skipped and counted, the scale lowered). Anything else, a non-finite
  // forward loss in any precision included (no scale can fix it), stops the run, as Megatron's
  // default check, unless the check is off (then skipped and counted as a nan iteration).
  const bool overflow = config_.precision == Precision::fp16 && !loss_nonfinite;
  if (!overflow) {
    if (config_.check_for_nan_in_loss_and_grad) {
      const auto name = [](double x) { return std::string(std::isnan(x) ? "NaN" : "Inf"); };
      throw Error("iteration " + std::to_string(iteration_),
                  (loss_nonfinite ? "the loss is " + name(stats.lm_loss) : "a gradient is " + name(stats.grad_norm)) +
                      " (--no-check-for-nan-in-loss-and-grad skips and counts such steps)");
    }
    ++nan_iters_;
  }
  ++skipped_iters_;
  stop_on_repeated_skips();
  return true;
}

void Trainer::stop_on_repeated_skips() {
  // mt's rule (Megatron's scaler skips for ever): steps skipped in a row at a scale the scaler
  // cannot lower (fp32/bf16's 1, a static --loss-scale, or the dynamic one at --min-loss-scale)
  // mean a run that no longer trains; the checkpoint the tracker names stays the last good one.
  if (!scaler_.at_minimum()) return;
  ++skipped_in_a_row_at_min_scale_;
  const int64_t limit = config_.max_consecutive_skipped_iters;
  if (limit == 0 || skipped_in_a_row_at_min_scale_ < limit) return;
  char scale[32];
  std::snprintf(scale, sizeof(scale), "%g", scaler_.scale());
  const std::string at = config_.precision != Precision::fp16 ? ""
                         : config_.loss_scale > 0       ? std::string(" at the static loss scale ") + scale
                                                        : std::string(" at the minimum loss scale ") + scale;
  throw Error("iteration " + std::to_string(iteration_),
              std::to_string(skipped_in_a_row_at_min_scale_) + " steps in a row skipped for a non-finite loss or gradient" +
                  at + " (a diverged run; --max-consecutive-skipped-iters sets how many, 0 never stops)");
}

void Trainer::record_step_figures(StepStats& stats, double wait_before) {
  gather_memory(stats);

  double busiest[2] = {pipeline_->compute_seconds(), pipeline_->run_seconds()};
  if (world_->size() > 1) world_->all_reduce(busiest, 2, DType::f64, comm::ReduceOp::max);
  stats.compute_ms = busiest[0] * 1e3;
  stats.pipeline_ms = busiest[1] * 1e3;

  const int64_t global = config_.global_batch_size;
  const int seq = model_config_.seq_length;
  // The step's time on the stream, its queued work (the optimizer's step) done: the step's second
  // host wait, at its end.
  step_timer_->stop();
  const double seconds = step_timer_->seconds();
  stats.consumed_samples = consumed_samples_;
  stats.step_ms = seconds * 1e3;
  stats.comm_wait_ms = (communicator_wait_seconds() - wait_before) * 1e3;
  stats.comm_share = stats.step_ms > 0 ? stats.comm_wait_ms / stats.step_ms : 0;
  stats.tokens_per_s = global * static_cast<double>(seq) / seconds;
  stats.tflops_per_device = flops_per_token_ * global * seq / seconds / 1e12 / world_->size();
  stats.mfu = config_.peak_flops_per_second > 0 ? stats.tflops_per_device * 1e12 / config_.peak_flops_per_second : 0;
  stats.skipped_iters = skipped_iters_;
  stats.nan_iters = nan_iters_;
}

void Trainer::queue_grad_copy_for_zero_count() {
  // Before the step's one host wait, which it rides on.
  optimizer_->copy_counted_grads(counted_grads_host_.data());
}

int64_t Trainer::count_zero_grads() const {
  // Megatron's count_zeros_fp32: the main grads equal to zero (unscaling keeps a zero a zero).
  return std::count(counted_grads_host_.begin(), counted_grads_host_.end(), 0.0f);
}

void Trainer::queue_params_sum_squares() {
  // After the optimizer's step (Megatron's calc_params_l2_norm follows train_step); the copy is
  // read after the step's end wait.
  const backend::Stream stream = ops_.default_stream();
  ops_.zero(params_sum_squares_.data(), static_cast<int64_t>(sizeof(double)), stream);
  optimizer_->add_param_sum_squares(params_sum_squares_.data());
  ops_.copy(&params_sum_squares_host_, params_sum_squares_.data(), sizeof(double), backend::CopyKind::device_to_host,
            stream);
}

void Trainer::gather_observations(StepStats& stats, int64_t local_zeros) {
  // Per rank: its zero count, its share of the params' sum of squares, its timers.
  constexpr int kHead = 2, kFields = kHead + backend::kStepTimers;
  const int ranks = world_->size();
  std::vector<double> mine(kFields, 0.0), all(static_cast<size_t>(kFields) * static_cast<size_t>(ranks));
  mine[0] = static_cast<double>(local_zeros);
  mine[1] = params_sum_squares_host_;
  if (timers_) {
    const std::array<double, backend::kStepTimers> ms = timers_->elapsed_ms();
    std::copy(ms.begin(), ms.end(), mine.begin() + kHead);
  }
  if (ranks > 1) {
    world_->all_gather(mine.data(), all.data(), kFields, DType::f64);
  } else {
    all = mine;
  }
  const auto field = [&](int rank, int f) { return all[static_cast<size_t>(rank) * kFields + static_cast<size_t>(f)]; };
  if (config_.log_num_zeros_in_grad && local_zeros >= 0) {
    int64_t zeros = 0;
    for (int r = 0; r < ranks; ++r) zeros += static_cast<int64_t>(field(r, 0));
    stats.num_zeros = zeros;
  }
  if (config_.log_params_norm) {
    double sum = 0;  // in rank order: every rank computes the same value
    for (int r = 0; r < ranks; ++r) sum += field(r, 1);
    stats.params_norm = std::sqrt(sum);
  }
  if (!timers_) return;
  interval_timer_ms_.resize(static_cast<size_t>(ranks) * backend::kStepTimers, 0.0);
  ++interval_steps_;
  for (int t = 0; t < backend::kStepTimers; ++t) {
    const auto id = static_cast<backend::StepTimer>(t);
    if (!timers_->enabled(id)) continue;
    TimerReading reading{backend::step_timer_name(id), backend::step_timer_level(id), 0, 0, {}};
    bool ran = false;
    for (int r = 0; r < ranks; ++r) {
      const double ms = field(r, kHead + t);
      interval_timer_ms_[static_cast<size_t>(r) * backend::kStepTimers + static_cast<size_t>(t)] += ms;
      reading.rank_ms.push_back(ms);
      if (ms <= 0) continue;  // Megatron's filter: the ranks that ran it
      reading.min_ms = ran ? std::min(reading.min_ms, ms) : ms;
      reading.max_ms = ran ? std::max(reading.max_ms, ms) : ms;
      ran = true;
    }
    if (ran) stats.timers.push_back(std::move(reading));
  }
}

EvalStats Trainer::evaluate() {
  const int micro = config_.micro_batch_size;
  const int64_t global = config_.global_batch_size;
  const int dp = data_parallel_size_;
  const int64_t valid_total = data_.split_size(data::Split::valid);
  // Megatron's evaluate(): eval_iters global batches, continuing where the last evaluation
  // stopped (consumed_valid_samples), each DP rank taking its micro-batches of each.
  // Each step's micro-batches are staged, then run through the forward-only schedule; the loss
  // sums on the last pipeline stage, one pair per step in device memory, read once at the end.
  const int num_micro = static_cast<int>(global / (micro * dp));
  const backend::Stream stream = ops_.default_stream();
  ops_.zero(eval_sums_.data(), eval_sums_.bytes(), stream);
  if (model_config_.bert) ops_.zero(bert_sums_.data(), bert_sums_.bytes(), stream);
  for (int64_t step = 0; step < config_.eval_iters; ++step) {
    for (int m = 0; m < num_micro; ++m) {
      const int64_t first =
          data::pretraining_sampler_first(valid_total, consumed_valid_samples_, micro, data_parallel_coordinate_, dp, m);
      fill_samples(data::Split::valid, first, micro, m * micro);
    }
    upload_staged(num_micro * micro);
    double* step_sums = eval_sums_.data() + 2 * step;
    // BERT: every evaluation micro-batch's own sums, after the training step's.
    double* bert_sums = model_config_.bert ? bert_sums_.data() + kBertSumsPerMicroBatch * num_micro * (1 + step) : nullptr;
    PipelineCallbacks callbacks;
    callbacks.batch = [&](int m) {
      if (!bert_sums) return staged_batch(micro, m * micro, step_sums);
      double* sums = bert_sums + kBertSumsPerMicroBatch * m;
      return staged_batch(micro, m * micro, sums, sums + 2);
    };
    pipeline_->run(eval_actions_, model::ForwardPass{0, false}, callbacks);
    consumed_valid_samples_ += global;
  }
  ops_.copy(eval_sums_host_.data(), eval_sums_.data(), eval_sums_.size() * static_cast<int64_t>(sizeof(double)),
            backend::CopyKind::device_to_host, stream);
  ops_.synchronize(stream);
  staging_in_flight_ = false;
  double sums[2] = {0, 0};  // loss, tokens: the steps' sums added in step order
  for (int64_t step = 0; step < config_.eval_iters; ++step) {
    sums[0] += eval_sums_host_[static_cast<size_t>(2 * step)];
    sums[1] += eval_sums_host_[static_cast<size_t>(2 * step + 1)];
  }
  sum_over_pipeline(sums, 2);
  sum_over_data_parallel(sums, 2);
  if (fp8_) fp8_->discard_amaxes();  // evaluation's inputs do not feed the training scales
  EvalStats stats;
  stats.iteration = iteration_;
  stats.lm_loss = sums[1] > 0 ? sums[0] / sums[1] : 0;
  if (model_config_.bert) {
    // Megatron's evaluate() with pretrain_bert.py's per-micro-batch values: the mean over every
    // evaluation micro-batch.
    const BertLosses losses = finish_bert_losses(bert_sums_.data() + kBertSumsPerMicroBatch * num_micro,
                                                 static_cast<int>(num_micro * config_.eval_iters));
    stats.lm_loss = losses.lm;
    stats.sop_loss = losses.sop;
  }
  stats.ppl = std::exp(std::min(stats.lm_loss, 20.0));
  return stats;
}

void Trainer::forward_logits(int64_t first_sample, int count, float* logits) {
  const int micro = config_.micro_batch_size;
  const int seq = model_config_.seq_length;
  if (pipeline_group_->size() > 1 || context_group_->size() > 1) {
    throw Error("forward_logits", "needs the whole model and sequence on this rank (pipeline or context parallelism "
                                  "splits them)");
  }
  const std::vector<parallel::PipelineAction> one_forward = parallel::pipeline_actions({1, 1, 1, 1, true}, 0);
  for (int done = 0; done < count; done += micro) {
    const int n = std::min(micro, count - done);
    fill_samples(data::Split::train, first_sample + done, n, 0);
    upload_staged(n);
    PipelineCallbacks callbacks;
    callbacks.batch = [&](int) {
      return staged_batch(n, 0, model_config_.bert ? bert_sums_.data() : step_sums_.data(),
                          model_config_.bert ? bert_sums_.data() + 2 : nullptr);
    };
    pipeline_->run(one_forward, model::ForwardPass{0, false}, callbacks);
    // The real vocabulary's columns of the last stage's logits (one rank holds them all).
    const model::Stage& last = *stages_.back();
    const int64_t vocab = model_config_.vocab_size;
    if (last.vocab_start() != 0 || last.valid_logits() != vocab) {
      throw Error("forward_logits", "needs the whole vocabulary on this rank (tensor parallelism splits it)");
    }
    ops_.copy_2d(logits + static_cast<int64_t>(done) * seq * vocab, vocab * sizeof(float), last.logits(0),
                 last.logits_width() * sizeof(float), vocab * sizeof(float), static_cast<int64_t>(n) * seq,
                 backend::CopyKind::device_to_host, ops_.default_stream());
  }
  ops_.synchronize(ops_.default_stream());  // the logits have arrived
  staging_in_flight_ = false;
}

void Trainer::gather_memory(StepStats& stats) const {
  // Per rank: its world rank, pipeline stage, high-water mark of the sum, and of each category.
  constexpr int kHead = 3, kFields = kHead + backend::kMemoryCategories;
  int64_t mine[kFields] = {world_->rank(), pipeline_group_->rank(), memory_.peak_total()};
  for (int c = 0; c < backend::kMemoryCategories; ++c) mine[kHead + c] = memory_.peak(static_cast<backend::MemoryCategory>(c));
  std::vector<int64_t> all(static_cast<size_t>(kFields) * static_cast<size_t>(world_->size()));
  world_->all_gather(mine, all.data(), kFields, DType::i64);
  stats.stage_memory.assign(static_cast<size_t>(pipeline_group_->size()), StageMemory{});
  for (size_t s = 0; s < stats.stage_memory.size(); ++s) stats.stage_memory[s].stage = static_cast<int>(s);
  std::vector<bool> seen(stats.stage_memory.size(), false);
  const auto category = [](const int64_t* fields, backend::MemoryCategory c) { return fields[kHead + static_cast<int>(c)]; };
  for (size_t offset = 0; offset < all.size(); offset += kFields) {  // ascending world rank
    const int64_t* r = all.data() + offset;
    const int rank = static_cast<int>(r[0]);
    const int64_t peak = r[2];
    if (peak > stats.mem_peak_bytes || offset == 0) {
      stats.mem_peak_bytes = peak;
      stats.mem_peak_rank = rank;
    }
    stats.mem_weights_bytes = std::max(stats.mem_weights_bytes, category(r, backend::MemoryCategory::weights));
    stats.mem_grads_bytes = std::max(stats.mem_grads_bytes, category(r, backend::MemoryCategory::grads));
    stats.mem_optim_bytes = std::max(stats.mem_optim_bytes, category(r, backend::MemoryCategory::optimizer));
    stats.mem_activations_bytes = std::max(stats.mem_activations_bytes, category(r, backend::MemoryCategory::activations));
    const size_t stage = static_cast<size_t>(r[1]);
    StageMemory& m = stats.stage_memory.at(stage);
    if (seen[stage] && peak <= m.peak) continue;
    seen[stage] = true;
    m.rank = rank;
    m.peak = peak;
    m.weights = category(r, backend::MemoryCategory::weights);
    m.grads = category(r, backend::MemoryCategory::grads);
    m.optimizer = category(r, backend::MemoryCategory::optimizer);
    m.activations = category(r, backend::MemoryCategory::activations);
    m.comm_buffers = category(r, backend::MemoryCategory::comm_buffers);
  }
}

bool Trainer::agree_to_stop() {
  int stop = stop_signal() != 0 ? 1 : 0;
  if (world_->size() > 1) world_->all_reduce(&stop, 1, DType::i32, comm::ReduceOp::max);
  if (stop != 0) stop_reason_ = StopReason::signal;
  return stop != 0;
}

bool Trainer::agree_to_exit(const ExitConditions& exit) {
  if (!exit.any()) return false;
  int reason = static_cast<int>(exit_reason(exit, iteration_, total_iters_, std::chrono::steady_clock::now()));
  if (exit.needs_agreement() && world_->size() > 1) world_->all_reduce(&reason, 1, DType::i32, comm::ReduceOp::max);
  stop_reason_ = static_cast<StopReason>(reason);
  return stop_reason_ != StopReason::none;
}

void Trainer::sum_over_data_parallel(double* values, int count) {
  if (data_parallel_control_->size() > 1) {
    data_parallel_control_->all_reduce(values, count, DType::f64, comm::ReduceOp::sum);
  }
}

void Trainer::sum_over_pipeline(double* values, int count) {
  if (pipeline_control_->size() > 1) pipeline_control_->all_reduce(values, count, DType::f64, comm::ReduceOp::sum);
}

void Trainer::sum_tied_embedding_grads() {
  if (!embedding_group_ || embedding_group_->size() == 1) return;
  // The first stage's word embedding and the last stage's copy each sit alone in a bucket that
  // starts at the tensor and is padded alike, so the parts of it this rank owns (all of it, or
  // its distributed-optimizer shard) are the same elements of the tensor on both stages.
  for (const model::ParamEntry& entry : layout_.entries) {
    if (!entry.reduce_over_embedding_group) continue;
    for (const model::FlatRange& range : optimizer_->owned_ranges()) {
      const int64_t begin = std::max(range.begin, entry.offset), end = std::min(range.end, entry.offset + entry.numel);
      if (begin < end) embedding_group_->all_reduce(grads_.data() + begin, end - begin, DType::f32, comm::ReduceOp::sum);
    }
  }
}

double Trainer::communicator_wait_seconds() const {
  // Each communicator once: on one rank (and for groups of one kind that coincide) the pointers alias.
  // The MoE groups too: the token dispatcher's all-to-alls, the router's reductions, expert grads.
  const comm::Communicator* const groups[] = {
      world_,           tensor_group_,   data_parallel_group_, data_parallel_control_, context_group_,
      context_control_, pipeline_group_, pipeline_control_,    embedding_group_,
      expert_groups_.ep, expert_groups_.expert_tp, expert_groups_.expert_tp_ep, expert_groups_.tp_cp,
      expert_groups_.tp_dp_cp, expert_data_parallel_group_};
  double seconds = 0;
  for (size_t i = 0; i < std::size(groups); ++i) {
    if (groups[i] && std::find(groups, groups + i, groups[i]) == groups + i) seconds += groups[i]->wait_seconds();
  }
  return seconds;
}

namespace {

std::string megatron_log_line(const StepStats& s, int64_t total_iters, bool log_throughput) {
  char throughput[64] = "";
  if (log_throughput) {
    std::snprintf(throughput, sizeof throughput, " throughput per GPU (TFLOP/s/GPU): %.1f |", s.tflops_per_device);
  }
  // Megatron's optional fields after the grad norm, in its order.
  char norms[96] = "";
  int at = 0;
  if (s.num_zeros) at += std::snprintf(norms, sizeof norms, " num zeros: %.1f |", static_cast<double>(*s.num_zeros));
  if (s.params_norm) std::snprintf(norms + at, sizeof norms - static_cast<size_t>(at), " params norm: %.3f |", *s.params_norm);
  // Megatron's MoE losses after lm loss, in its order (the balancing loss, then z_loss).
  char moe[160] = "";
  if (s.moe) {
    int used = 0;
    if (!s.moe->balancing_name.empty()) {
      used += std::snprintf(moe, sizeof moe, " %s: %.6E |", s.moe->balancing_name.c_str(), s.moe->balancing_loss);
    }
    if (s.moe->z_loss) std::snprintf(moe + used, sizeof moe - static_cast<size_t>(used), " z_loss: %.6E |", *s.moe->z_loss);
  }
  // Megatron's MTP losses after the MoE ones (track_mtp_metrics: " mtp_<k> loss: %.6E |").
  std::string mtp;
  for (size_t k = 0; k < s.mtp_losses.size(); ++k) {
    char depth[64];
    std::snprintf(depth, sizeof depth, " mtp_%zu loss: %.6E |", k + 1, s.mtp_losses[k]);
    mtp += depth;
  }
  // BERT's sop loss right after lm loss (pretrain_bert.py's loss dict order).
  char sop[64] = "";
  if (s.sop_loss) std::snprintf(sop, sizeof sop, " sop loss: %.6E |", *s.sop_loss);
  char line[1024];
  std::snprintf(line, sizeof line,
                " iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per iteration (ms): %.1f |%s "
                "learning rate: %.6E | global batch size: %5d | lm loss: %.6E |%s%s%s loss scale: %.1f | grad norm: %.3f |%s"
                " number of skipped iterations: %3lld | number of nan iterations: %3lld |",
                static_cast<long long>(s.iteration), static_cast<long long>(total_iters),
                static_cast<long long>(s.consumed_samples), s.step_ms, throughput, s.lr, s.global_batch_size,
                s.lm_loss, sop, moe, mtp.c_str(), s.loss_scale, s.grad_norm, norms,
                static_cast<long long>(s.skipped_iters), static_cast<long long>(s.nan_iters));
  return line;
}

// "forward-backward ...............................": the name and a space, dot-padded to 48
// characters (Python's ljust(48, '.')).
std::string dot_padded(const std::string& name) {
  std::string padded = name + " ";
  if (padded.size() < 48) padded.append(48 - padded.size(), '.');
  return padded;
}

}  // namespace

std::string Trainer::timers_log_block(bool reset) {
  // Megatron's Timers.log after its log line: each timer's sum since the last reset, per rank,
  // over --log-interval; the ranks with a positive value count (max and minmax).
  if (!timers_ || interval_steps_ == 0) return "";
  const int ranks = world_->size();
  const double steps = config_.log_interval;
  const auto value = [&](int rank, int t) {
    return interval_timer_ms_[static_cast<size_t>(rank) * backend::kStepTimers + static_cast<size_t>(t)] / steps;
  };
  const TimingLogOption option = config_.timing_log_option;
  std::string out = option == TimingLogOption::all      ? "times across ranks (ms):"
                    : option == TimingLogOption::max    ? "max time across ranks (ms):"
                                                        : "(min, max) time across ranks (ms):";
  bool any = false;
  char line[160];
  for (int t = 0; t < backend::kStepTimers; ++t) {
    const std::string name = backend::step_timer_name(static_cast<backend::StepTimer>(t));
    double low = 0, high = 0;
    bool ran = false;
    for (int r = 0; r < ranks; ++r) {
      const double ms = value(r, t);
      if (ms <= 0) continue;
      if (option == TimingLogOption::all) {
        if (!ran) out += "\n  " + name + ":";
        std::snprintf(line, sizeof line, "\n     rank %2d: %.2f", r, ms);
        out += line;
      }
      low = ran ? std::min(low, ms) : ms;
      high = ran ? std::max(high, ms) : ms;
      ran = true;
    }
    if (!ran) continue;
    any = true;
    if (option == TimingLogOption::max) {
      std::snprintf(line, sizeof line, "\n    %s: %.2f", dot_padded(name).c_str(), high);
      out += line;
    } else if (option == TimingLogOption::minmax) {
      std::snprintf(line, sizeof line, "\n    %s: (%.2f, %.2f)", dot_padded(name).c_str(), low, high);
      out += line;
    }
  }
  if (reset) {
    std::fill(interval_timer_ms_.begin(), interval_timer_ms_.end(), 0.0);
    interval_steps_ = 0;
  }
  return any ? out : "";
}

void Trainer::run(const TrainObservers& observers, const ExitConditions& exit) {
  stopped_ = false;
  stop_reason_ = StopReason::none;
  while (iteration_ < total_iters_) {
    if (agree_to_stop()) {
      stopped_ = true;
      return;
    }
    const StepStats stats = train_step();
    if (observers.on_step) observers.on_step(stats);
    if (stats.iteration % config_.log_interval == 0 || stats.iteration == 1) {
      if (observers.on_log_line) observers.on_log_line(megatron_log_line(stats, total_iters_, config_.log_throughput));
      // Cleared at every log line, printed or not, except the first (Megatron's should_reset).
      const std::string timers = timers_log_block(/*reset=*/stats.iteration != 1);
      if (observers.on_log_line && !timers.empty()) observers.on_log_line(timers);
    }
    const bool last = iteration_ == total_iters_;
    const bool has_valid = data_.split_size(data::Split::valid) != 0;  // an absent split: no evaluation
    if (config_.eval_iters > 0 && has_valid && (iteration_ % config_.eval_interval == 0 || last)) {
      const EvalStats eval = evaluate();
      if (observers.on_eval) observers.on_eval(eval);
      if (observers.on_log_line) {
        char line[256];
        std::snprintf(line, sizeof line, " validation loss at iteration %lld | lm loss value: %.6E | lm loss PPL: %.6E |",
                      static_cast<long long>(eval.iteration), eval.lm_loss, eval.ppl);
        std::string text = line;
        if (eval.sop_loss) {  // BERT: Megatron prints every loss's value and PPL
          std::snprintf(line, sizeof line, " sop loss value: %.6E | sop loss PPL: %.6E |", *eval.sop_loss,
                        std::exp(std::min(*eval.sop_loss, 20.0)));
          text += line;
        }
        observers.on_log_line(text);
      }
    }
    if (observers.on_iteration_end) observers.on_iteration_end(iteration_);
    if (agree_to_exit(exit)) {
      stopped_ = true;
      return;
    }
  }
}

}  // namespace mt::train
