// Training memory by category, floor then plan (see memory.h).
#include "perf/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <vector>

#include "core/error.h"
#include "backend/ops.h"
#include "model/layout.h"
#include "model/precision_gemm.h"
#include "model/stage.h"
#include "optim/distributed_optimizer.h"
#include "parallel/pipeline_schedule.h"
#include "perf/peak.h"

namespace mt::perf {
namespace {

using Wide = long double;

// Floors above this are refused as overflowing: the plan is at most a few times its floor, so
// every plan computed below it fits int64 with room to spare.
constexpr Wide kLargestPlannable = 1152921504606846976.0L;  // 2^60 bytes

// Bytes of one staged sample row: tokens, labels, positions, document starts (int32), the loss
// mask (float) and the global row id (int64).
constexpr int64_t kStagedBytesPerToken = 4 * 4 + 4 + 8;

int64_t saturate(Wide bytes, bool& overflow) {
  if (!(bytes < static_cast<Wide>(std::numeric_limits<int64_t>::max()))) {
    overflow = true;
    return std::numeric_limits<int64_t>::max();
  }
  return static_cast<int64_t>(bytes);
}

int effective_recompute_layers(const model::ModelConfig& model, const MemoryOptions& options) {
  return std::clamp(options.recompute.num_layers, 1, std::max(1, model.num_layers));
}

[[noreturn]] void refuse_overflow(const model::ModelConfig& model, const TrainingMemory& floor) {
  char figures[96];
  std::snprintf(figures, sizeof figures, "%.3Lg bytes, %.3Lg parameters", floor.exact_total,
                model::parameter_count_wide(model, true));
  throw Error("model " + model.name, "needs more than 1 EiB (" + std::string(figures) +
                                         "): counts that large overflow 64-bit arithmetic; use a smaller model");
}

std::string breakdown(const TrainingMemory& m) {
  return "weights " + gib(m.weights) + ", grads " + gib(m.grads) + ", optimizer " + gib(m.optimizer) +
         ", activations " + gib(m.activations) + ", other " + gib(m.other);
}

}  // namespace

int64_t TrainingMemory::total() const {
  const Wide sum = static_cast<Wide>(weights) + grads + optimizer + activations + other;
  bool ignored = false;
  return saturate(sum, ignored);
}

std::string gib(int64_t bytes) {
  char text[48];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

int optimizer_shards(const parallel::ParallelConfig& parallel) {
  if (!parallel.shards_optimizer()) return 1;
  return std::max(1, parallel.data_parallel_size) * std::max(1, parallel.context_parallel_size);
}

int64_t optimizer_state_elements(const model::ParamLayout& layout, const parallel::ParallelConfig& parallel) {
  if (!parallel.shards_optimizer()) return layout.total_elements;
  int64_t elements = 0;
  for (const model::FlatRange& range : layout.data_parallel_shard(0, optimizer_shards(parallel))) {
    elements += range.end - range.begin;
  }
  return elements;
}

FsdpResidentElements fsdp_resident_elements(const model::ParamLayout& layout, const parallel::ParallelConfig& parallel,
                                            bool prefetch) {
  const int dense_group = parallel.data_parallel_size * parallel.context_parallel_size;
  const int expert_group = parallel.expert_data_parallel_size();
  const int head = layout.last_layer;
  int64_t owned = 0, root = 0, embedding = 0;
  std::vector<int64_t> layer_extra(static_cast<size_t>(std::max(0, head)), 0);  // beyond the shard, per layer
  for (size_t b = 0; b < layout.buckets.size(); ++b) {
    const model::GradBucket& bucket = layout.buckets[b];
    const int group = bucket.group == model::DataParallelGroup::expert ? expert_group : dense_group;
    const model::FlatRange shard = layout.bucket_shard(static_cast<int>(b), 0, group);
    const int64_t extra = (bucket.padded_end - bucket.begin) - (shard.end - shard.begin);
    owned += shard.end - shard.begin;
    if (bucket.first_layer == model::kEmbeddingLayer) embedding += extra;
    if (bucket.first_layer == model::kEmbeddingLayer || bucket.first_layer >= head) {
      root += extra;
    } else {
      layer_extra[static_cast<size_t>(bucket.first_layer)] += extra;
    }
  }
  int64_t one_layer = 0, two_layers = 0;
  for (size_t i = 0; i < layer_extra.size(); ++i) {
    one_layer = std::max(one_layer, layer_extra[i]);
    two_layers = std::max(two_layers, layer_extra[i] + (i + 1 < layer_extra.size() ? layer_extra[i + 1] : 0));
  }
  const bool params = parallel.data_parallel_sharding_strategy == "optim_grads_params";
  FsdpResidentElements held;
  held.weights = params ? owned + root + (prefetch ? two_layers : one_layer) : layout.total_elements;
  // Overlapped (--overlap-grad-reduce), a unit's full-size grads are held until the next unit's
  // backward is done: the head's beside the last layer's, two adjacent layers' beside the embedding's.
  const int64_t last_layer = layer_extra.empty() ? 0 : layer_extra.back();
  held.grads = owned + (parallel.overlap_grad_reduce ? std::max(root + last_layer, embedding + two_layers)
                                                     : std::max(root, embedding + one_layer));
  held.optimizer = owned;
  return held;
}

TrainingMemory memory_floor(const model::ModelConfig& model, const MemoryOptions& options) {
  model.validate();
  const Wide params = model::parameter_count_wide(model, true);
  const Wide copy = static_cast<Wide>(model::GemmWeights::bytes(*options.ops, options.precision, 1));
  const Wide n = static_cast<Wide>(options.micro_batch_size) * model.seq_length;  // token rows
  const Wide c = model.hidden_size, f = model.ffn_hidden_size, d = model.head_dim();
  const Wide h = model.num_attention_heads, g = model.query_groups();
  const Wide qkv = (h + 2 * g) * d, fc1 = model.swiglu ? 2 * f : f;
  const Wide m = model.make_vocab_size_divisible_by;
  const Wide vocab = std::ceil(static_cast<Wide>(model.vocab_size) / m) * m;

  // Per layer that keeps its activations: its input and three more (N, C) rows, q/k/v, fc1 and
  // the MLP activation. Every plan also holds the head's logits and one of each gradient buffer.
  const Wide layer_set = 4 * c + qkv + fc1 + f;
  const Wide always = 10 * c + h * d + qkv + fc1 + f + vocab;
  const Wide layers = model.num_layers;
  const Wide k = effective_recompute_layers(model, options);
  Wide full_sets = layers, kept_inputs = 0, scratch_sets = 0;
  if (options.recompute.granularity == model::RecomputeGranularity::full) {
    if (options.recompute.method == model::RecomputeMethod::uniform) {
      full_sets = 0;
      kept_inputs = std::ceil(layers / k);
      scratch_sets = k;
    } else {
      full_sets = layers - k;
      kept_inputs = k;
      scratch_sets = 1;
    }
  }
  const Wide activation_elements =
      n * (always + full_sets * layer_set + kept_inputs * c + scratch_sets * (layer_set - c));

  // A rank holds at least 1/(TP x PP) of the parameters (its stage's TP shard; the largest stage
  // holds at least the average), with the distributed optimizer at least 1/(DP x CP) of that in
  // Adam's moments, and at least 1/(TP x PP x CP) of the one-rank activations.
  const Wide tp = static_cast<Wide>(std::max(1, options.parallel.tensor_model_parallel_size)) *
                  std::max(1, options.parallel.pipeline_model_parallel_size);
  const Wide activation_share = tp * std::max(1, options.parallel.context_parallel_size);
  const Wide optimizer_share = optimizer_shards(options.parallel);
  TrainingMemory floor;
  bool overflow = false;
  // Megatron-FSDP keeps at least its DP x CP shard of the grads, and of the fp32 weights under
  // optim_grads_params (the GEMM copy stays whole-size).
  const bool fsdp_grads = options.parallel.shards_grads();
  const Wide grad_share = fsdp_grads ? optimizer_share : 1;
  const Wide weight_share =
      fsdp_grads && options.parallel.data_parallel_sharding_strategy == "optim_grads_params" ? optimizer_share : 1;
  floor.weights = saturate(params / tp * (4 / weight_share + copy), overflow);
  floor.grads = saturate(params / tp * 4 / grad_share, overflow);
  floor.optimizer = saturate(params / tp / optimizer_share * 8, overflow);
  floor.activations = saturate(activation_elements * 4 / activation_share, overflow);
  floor.other = saturate(
      layers * kHostBytesPerLayer + static_cast<Wide>(options.staged_samples) * model.seq_length * kStagedBytesPerToken,
      overflow);
  floor.exact_total = params / tp * (4 / weight_share + copy + 4 / grad_share + 8 / optimizer_share) + activation_elements * 4 / activation_share +
                      layers * kHostBytesPerLayer +
                      static_cast<Wide>(options.staged_samples) * model.seq_length * kStagedBytesPerToken;
  floor.overflow = overflow || floor.exact_total > kLargestPlannable;
  return floor;
}

TrainingMemory planned_memory(const model::ModelConfig& model, const MemoryOptions& options) {
  const TrainingMemory floor = memory_floor(model, options);
  if (floor.overflow) refuse_overflow(model, floor);
  const parallel::ParallelConfig& parallel = options.parallel;
  const int stages = std::max(1, parallel.pipeline_model_parallel_size);
  const int chunks = parallel.virtual_pipeline_size(model.num_layers);
  const int micro_batches = static_cast<int>(std::max<int64_t>(1, options.staged_samples / options.micro_batch_size));
  const int64_t rows = static_cast<int64_t>(options.micro_batch_size) * model.seq_length /
                       std::max(1, parallel.context_parallel_size);
  const int sequence_split = parallel.sequence_parallel ? std::max(1, parallel.tensor_model_parallel_size) : 1;
  model::RecomputeConfig recompute = options.recompute;
  recompute.num_layers = effective_recompute_layers(model, options);
  const parallel::PipelineShape schedule = parallel::pipeline_shape(parallel, model.num_layers, micro_batches);
  // Each pipeline stage as the trainer builds it (its chunks' layout on TP rank 0, DP rank 0's
  // optimizer shard, the activation slots its schedule keeps in flight); the plan takes each
  // category's largest over the stages.
  TrainingMemory plan;
  for (int stage = 0; stage < stages; ++stage) {
    parallel::RankCoordinates rank;
    rank.pp = stage;
    const model::ParamLayout layout = model::build_layout(
        model, parallel, rank, model::pipeline_chunks(model, parallel, stage),
        optim::DistributedOptimizer::bucket_options(parallel));
    const int64_t elements = layout.total_elements;
    // Whole fp32 weights and grads and the optimizer's shard, or what Megatron-FSDP's units hold.
    const FsdpResidentElements held =
        parallel.shards_grads() ? fsdp_resident_elements(layout, parallel, !parallel.no_fsdp_prefetch)
                                : FsdpResidentElements{elements, elements, optimizer_state_elements(layout, parallel)};
    const std::vector<parallel::PipelineAction> actions = parallel::pipeline_actions(schedule, stage);
    TrainingMemory rank_plan;  // this stage's
    // The GEMM copy of the weights stays whole-size under Megatron-FSDP too.
    rank_plan.weights = held.weights * 4 + model::GemmWeights::bytes(*options.ops, options.precision, elements);
    rank_plan.grads = held.grads * 4;
    rank_plan.optimizer = held.optimizer * 8;  // Adam's exp_avg and exp_avg_sq, fp32
    for (int c = 0; c < chunks; ++c) {
      rank_plan.activations += model::planned_activation_bytes(model, layout, c, rows, sequence_split, options.precision,
                                                               recompute, parallel::pipeline_activation_slots(actions, c));
    }
    plan.weights = std::max(plan.weights, rank_plan.weights);
    plan.grads = std::max(plan.grads, rank_plan.grads);
    plan.optimizer = std::max(plan.optimizer, rank_plan.optimizer);
    plan.activations = std::max(plan.activations, rank_plan.activations);
  }
  plan.other = floor.other;
  return plan;
}

int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t value = 0;
  while (meminfo >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return -1;
}

TrainingMemory check_training_memory(const model::ModelConfig& model, const MemoryOptions& options,
                                     int64_t available_bytes) {
  const std::string what = "model " + model.name;
  const int ranks = std::max(1, options.ranks_per_node);
  const std::string per_rank = ranks > 1 ? " per rank x " + std::to_string(ranks) + " ranks on this node" : "";
  const std::string advice = "; use a smaller model, micro-batch or recompute" +
                             std::string(ranks > 1 ? ", or fewer ranks per node" : "");
  // The node's total, in long double: a floor near the int64 limit times the ranks must not wrap.
  auto exceeds = [&](const TrainingMemory& m) {
    return available_bytes > 0 && static_cast<Wide>(m.total()) * ranks > static_cast<Wide>(available_bytes);
  };
  const TrainingMemory floor = memory_floor(model, options);
  if (floor.overflow) refuse_overflow(model, floor);
  if (exceeds(floor)) {
    throw Error(what, "needs at least " + gib(floor.total()) + per_rank + " (" + breakdown(floor) + ") but only " +
                          gib(available_bytes) + " is available" + advice);
  }
  const TrainingMemory plan = planned_memory(model, options);
  if (exceeds(plan)) {
    throw Error(what, "needs " + gib(plan.total()) + per_rank + " (" + breakdown(plan) + ") but only " +
                          gib(available_bytes) + " is available" + advice);
  }
  return plan;
}

void check_report_floor(const model::ModelConfig& model, const MemoryOptions& options, int64_t host_bytes,
                        int ranks_sharing) {
  const TrainingMemory floor = memory_floor(model, options);
  if (floor.overflow) refuse_overflow(model, floor);
  const Device* largest = nullptr;
  for (const Device& device : device_table()) {
    if (largest == nullptr || device.memory_gib > largest->memory_gib) largest = &device;
  }
  const int64_t device_bytes = largest == nullptr ? 0 : device_memory_bytes(*largest);
  const int64_t rank_bytes = floor.total() / std::max(1, ranks_sharing);
  if (rank_bytes <= device_bytes || rank_bytes <= host_bytes) return;
  const std::string over = ranks_sharing > 1 ? " over " + std::to_string(ranks_sharing) + " ranks" : "";
  throw Error("model " + model.name,
              "needs at least " + gib(rank_bytes) + " per rank" + over + " (" + breakdown(floor) +
                  (ranks_sharing > 1 ? " in all" : "") + "), more than any device mt knows holds (the largest, " +
                  largest->name + ", " + gib(device_bytes) + ")" +
                  (host_bytes > 0 ? " and than this host's available " + gib(host_bytes) : "") +
                  "; use a smaller model, more ranks, a smaller micro-batch or recompute");
}

}  // namespace mt::perf
