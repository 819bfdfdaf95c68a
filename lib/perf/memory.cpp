// Training memory by category, floor then plan (see memory.h).
#include "perf/memory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "backend/ops.h"
#include "model/layout.h"
#include "model/precision_gemm.h"
#include "model/stage.h"

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

TrainingMemory memory_floor(const model::ModelConfig& model, const MemoryOptions& options) {
  model.validate();
  const Wide params = model::parameter_count_wide(model, true);
  const Wide copy = static_cast<Wide>(model::GemmWeights::bytes(backend::cpu_ops(), options.precision, 1));
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

  // A rank holds at least 1/TP of the parameters, and with the distributed optimizer at least
  // 1/DP of that in Adam's moments.
  const Wide tp = std::max(1, options.parallel.tensor_model_parallel_size);
  const Wide optimizer_share =
      options.parallel.use_distributed_optimizer ? std::max(1, options.parallel.data_parallel_size) : 1;
  TrainingMemory floor;
  bool overflow = false;
  floor.weights = saturate(params / tp * (4 + copy), overflow);
  floor.grads = saturate(params / tp * 4, overflow);
  floor.optimizer = saturate(params / tp / optimizer_share * 8, overflow);
  floor.activations = saturate(activation_elements * 4, overflow);
  floor.other = saturate(
      layers * kHostBytesPerLayer + static_cast<Wide>(options.staged_samples) * model.seq_length * kStagedBytesPerToken,
      overflow);
  floor.exact_total = params / tp * (8 + copy + 8 / optimizer_share) + activation_elements * 4 + layers * kHostBytesPerLayer +
                      static_cast<Wide>(options.staged_samples) * model.seq_length * kStagedBytesPerToken;
  floor.overflow = overflow || floor.exact_total > kLargestPlannable;
  return floor;
}

TrainingMemory planned_memory(const model::ModelConfig& model, const MemoryOptions& options) {
  const TrainingMemory floor = memory_floor(model, options);
  if (floor.overflow) refuse_overflow(model, floor);
  const model::ParamLayout layout =
      model::build_layout(model, options.parallel, parallel::RankCoordinates{},
                          {model::ChunkSpec{0, model.num_layers, true, true}}, model::bucket_options(options.parallel));
  const int64_t elements = layout.total_elements;
  int64_t optimizer_elements = elements;
  if (options.parallel.use_distributed_optimizer) {
    optimizer_elements = 0;
    for (const model::FlatRange& range : layout.data_parallel_shard(0, options.parallel.data_parallel_size)) {
      optimizer_elements += range.end - range.begin;
    }
  }
  model::RecomputeConfig recompute = options.recompute;
  recompute.num_layers = effective_recompute_layers(model, options);
  TrainingMemory plan;
  plan.weights = elements * 4 + model::GemmWeights::bytes(backend::cpu_ops(), options.precision, elements);
  plan.grads = elements * 4;
  plan.optimizer = optimizer_elements * 8;  // Adam's exp_avg and exp_avg_sq, fp32
  plan.activations = model::planned_activation_bytes(model, options.precision, recompute,
                                                                  options.micro_batch_size, model.num_layers);
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

}  // namespace mt::perf
