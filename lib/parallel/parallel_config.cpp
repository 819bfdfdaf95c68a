// Parallel layout validation (see parallel_config.h). Each rule follows Megatron's argument checks
// (megatron/training/arguments.py, TransformerConfig.__post_init__, the interleaved schedule in
// pipeline_parallel/schedules.py) and names the flags that break it; and the config as JSON.
#include "parallel/parallel_config.h"

#include <algorithm>

#include "core/error.h"
#include "core/json_fields.h"

namespace mt::parallel {
namespace {

std::string flag(const char* name, int64_t value) { return std::string(name) + " " + std::to_string(value); }

[[noreturn]] void reject(const std::string& what, const std::string& why) { throw UsageError(what, why); }

void require_positive(const char* name, int64_t value) {
  if (value < 1) reject(flag(name, value), "must be at least 1");
}
void require_positive(const char* name, const std::optional<int>& value) {
  if (value) require_positive(name, *value);
}

void require_divisible(const std::string& what, int64_t value, int64_t divisor, const std::string& divisor_text,
                       const std::string& reason = "") {
  if (value % divisor != 0) {
    reject(what, "not divisible by " + divisor_text + (reason.empty() ? "" : " (" + reason + ")"));
  }
}

const char* const kTp = "--tensor-model-parallel-size";
const char* const kPp = "--pipeline-model-parallel-size";
const char* const kCp = "--context-parallel-size";
const char* const kFirst = "--decoder-first-pipeline-num-layers";
const char* const kLast = "--decoder-last-pipeline-num-layers";
const char* const kLayersPerVirtual = "--num-layers-per-virtual-pipeline-stage";
const char* const kVirtualStages = "--num-virtual-stages-per-pipeline-rank";
const char* const kGroupSize = "--microbatch-group-size-per-virtual-pipeline-stage";

void check_degrees(const ParallelConfig& c, const ModelDimensions& model, const BatchDimensions& batch) {
  require_positive(kTp, c.tensor_model_parallel_size);
  require_positive(kPp, c.pipeline_model_parallel_size);
  require_positive(kCp, c.context_parallel_size);
  require_positive("--expert-model-parallel-size", c.expert_model_parallel_size);
  require_positive("--expert-tensor-parallel-size", c.expert_tensor_parallel_size);
  require_positive(kLayersPerVirtual, c.num_layers_per_virtual_pipeline_stage);
  require_positive(kVirtualStages, c.num_virtual_stages_per_pipeline_rank);
  require_positive(kFirst, c.decoder_first_pipeline_num_layers);
  require_positive(kLast, c.decoder_last_pipeline_num_layers);
  require_positive(kGroupSize, c.microbatch_group_size_per_virtual_pipeline_stage);
  if (c.ddp_bucket_size) require_positive("--ddp-bucket-size", *c.ddp_bucket_size);
  require_positive("--micro-batch-size", batch.micro_batch_size);
  require_positive("--global-batch-size", batch.global_batch_size);
  require_positive("--num-layers", model.num_layers);
  require_positive("--seq-length", model.seq_length);
}

void check_sequence(ParallelConfig& c, const ModelDimensions& model, std::vector<std::string>& warnings) {
  const int cp = c.context_parallel_size, tp = c.tensor_model_parallel_size;
  if (cp > 1) {
    require_divisible(flag("--seq-length", model.seq_length), model.seq_length, 2 * cp, "2 x " + flag(kCp, cp),
                      "each context-parallel rank holds two of 2 x CP chunks");
  }
  if (c.sequence_parallel && tp == 1) {
    warnings.push_back("--sequence-parallel: disabled because --tensor-model-parallel-size is 1");
    c.sequence_parallel = false;
  }
  if (c.sequence_parallel) {
    const int local = model.seq_length / cp;
    require_divisible(flag("--seq-length", model.seq_length) + " with --sequence-parallel", local, tp, flag(kTp, tp),
                      "the " + std::to_string(local) + " tokens of each context-parallel rank are split across TP");
  }
}

// Megatron's layer-count rules for pipeline stages, uneven first/last stages and virtual stages.
void check_pipeline(const ParallelConfig& c, const ModelDimensions& model) {
  const int pp = c.pipeline_model_parallel_size, layers = model.num_layers;
  const std::string num_layers = flag("--num-layers", layers);
  if (c.num_layers_per_virtual_pipeline_stage && c.num_virtual_stages_per_pipeline_rank) {
    reject(std::string(kLayersPerVirtual) + " and " + kVirtualStages, "give at most one of them");
  }
  const bool uneven = c.decoder_first_pipeline_num_layers || c.decoder_last_pipeline_num_layers;
  if (uneven && pp == 1) {
    reject(c.decoder_first_pipeline_num_layers ? flag(kFirst, *c.decoder_first_pipeline_num_layers)
                                               : flag(kLast, *c.decoder_last_pipeline_num_layers),
           "needs " + std::string(kPp) + " > 1");
  }
  if (uneven && c.num_layers_per_virtual_pipeline_stage) {
    reject(flag(kLayersPerVirtual, *c.num_layers_per_virtual_pipeline_stage),
           "with uneven first/last stages give the virtual stages with " + std::string(kVirtualStages));
  }
  int virtual_stages = c.num_virtual_stages_per_pipeline_rank.value_or(1);
  if (!uneven) {
    require_divisible(num_layers, layers, pp, flag(kPp, pp));
    if (c.num_layers_per_virtual_pipeline_stage) {
      const int per_stage = layers / pp, per_chunk = *c.num_layers_per_virtual_pipeline_stage;
      require_divisible(num_layers + " / " + flag(kPp, pp) + " = " + std::to_string(per_stage) + " layers per stage",
                        per_stage, per_chunk, flag(kLayersPerVirtual, per_chunk));
      virtual_stages = per_stage / per_chunk;
    } else {
      require_divisible(num_layers + " / " + flag(kPp, pp) + " = " + std::to_string(layers / pp) + " layers per stage",
                        layers / pp, virtual_stages, flag(kVirtualStages, virtual_stages));
    }
  } else {
    const int first = c.decoder_first_pipeline_num_layers.value_or(0);
    const int last = c.decoder_last_pipeline_num_layers.value_or(0);
    const int middle_layers = layers - first - last;
    const int middle_stages = pp - (c.decoder_first_pipeline_num_layers ? 1 : 0) - (c.decoder_last_pipeline_num_layers ? 1 : 0);
    std::string given = num_layers;
    if (c.decoder_first_pipeline_num_layers) given += ", " + flag(kFirst, first);
    if (c.decoder_last_pipeline_num_layers) given += ", " + flag(kLast, last);
    given += ", " + flag(kPp, pp);
    // The stages whose layers are not given: between the first and the last, or all but the given end.
    const std::string rest = !c.decoder_last_pipeline_num_layers ? "after the first"
                             : !c.decoder_first_pipeline_num_layers ? "before the last"
                                                                    : "between the first and the last";
    const std::string other_stages = middle_stages == 0 ? "no stage " + rest
                                     : std::to_string(middle_stages) + (middle_stages == 1 ? " stage " : " stages ") + rest;
    if (middle_layers < 0 || (middle_layers > 0) != (middle_stages > 0)) {
      reject(given, "leaves " + std::to_string(middle_layers) + " layers for " + other_stages +
                        (middle_stages > 0 ? " (every stage needs at least one layer)" : ""));
    }
    if (middle_stages > 0) {
      require_divisible(given + ": " + std::to_string(middle_layers) + " layers left", middle_layers, middle_stages,
                        "the " + other_stages);
    }
    if (virtual_stages > 1) {
      const std::string by_virtual = flag(kVirtualStages, virtual_stages);
      if (c.decoder_first_pipeline_num_layers) require_divisible(flag(kFirst, first), first, virtual_stages, by_virtual);
      if (c.decoder_last_pipeline_num_layers) require_divisible(flag(kLast, last), last, virtual_stages, by_virtual);
      if (middle_stages > 0) {
        const int per_stage = middle_layers / middle_stages;
        require_divisible(given + ": " + std::to_string(per_stage) + " layers per middle stage", per_stage,
                          virtual_stages, by_virtual);
      }
    }
  }
  if (virtual_stages > 1 && pp == 1) {
    reject(std::to_string(virtual_stages) + " virtual pipeline stages", "need " + std::string(kPp) + " > 1");
  }
}

void check_batch_and_schedule(const ParallelConfig& c, const ModelDimensions& model, const BatchDimensions& batch,
                              std::vector<std::string>& warnings) {
  const int dp = c.data_parallel_size;
  const int64_t per_step = static_cast<int64_t>(batch.micro_batch_size) * dp;
  require_divisible(flag("--global-batch-size", batch.global_batch_size), batch.global_batch_size, per_step,
                    flag("--micro-batch-size", batch.micro_batch_size) + " x data-parallel size " + std::to_string(dp));
  const int64_t micro_batches = batch.global_batch_size / per_step;
  const int pp = c.pipeline_model_parallel_size;
  if (c.virtual_pipeline_size(model.num_layers) > 1) {
    const int group = c.microbatch_group_size();
    const std::string what = flag(kGroupSize, group) + (c.microbatch_group_size_per_virtual_pipeline_stage ? "" : " (default: PP)");
    const std::string m = std::to_string(micro_batches) + " micro-batches per step";
    if (group < pp || group > micro_batches) {
      reject(what, "must lie in [" + flag(kPp, pp) + ", " + m + "] for the interleaved schedule");
    }
    const int64_t remainder = micro_batches % group;
    if (remainder != 0 && remainder < pp) {
      reject(what + " with " + m, "the last group of " + std::to_string(remainder) + " micro-batches must hold 0 or at least " +
                                      flag(kPp, pp) + " (else the pipeline stalls)");
    }
  } else if (c.microbatch_group_size_per_virtual_pipeline_stage) {
    warnings.push_back(flag(kGroupSize, *c.microbatch_group_size_per_virtual_pipeline_stage) +
                       ": no effect without virtual pipeline stages");
  }
}

void check_experts(const ParallelConfig& c, const ModelDimensions& model, std::vector<std::string>& warnings) {
  const int ep = c.expert_model_parallel_size, etp = c.expert_tensor_parallel();
  const int dense = c.tensor_model_parallel_size * c.context_parallel_size * c.data_parallel_size;
  if (dense % (ep * etp) != 0) {
    reject(flag("--expert-model-parallel-size", ep) + " x expert tensor-parallel size " + std::to_string(etp),
           "does not divide TP x CP x DP = " + std::to_string(dense) + " (experts fold into the ranks of one pipeline stage)");
  }
  if (ep > 1 && model.num_experts == 0) reject(flag("--expert-model-parallel-size", ep), "needs --num-experts");
  if (model.num_experts > 0) {
    require_divisible(flag("--num-experts", model.num_experts), model.num_experts, ep,
                      flag("--expert-model-parallel-size", ep));
  }
  if (ep > 1 && c.tensor_model_parallel_size > 1 && !c.sequence_parallel) {
    warnings.push_back(flag("--expert-model-parallel-size", ep) + " with " + flag(kTp, c.tensor_model_parallel_size) +
                       ": Megatron expects --sequence-parallel");
  }
}

// Megatron-FSDP (issue 25): the alias folded in with Megatron's warning, the strategy's name, and
// what mt's FSDP does not run refused by name. MoE runs under every strategy: a layer's expert
// tensors are a unit of their own, sharded over expert-DP (optim/fsdp_grads.h).
void check_megatron_fsdp(ParallelConfig& c, std::vector<std::string>& warnings) {
  if (c.use_custom_fsdp) {
    warnings.push_back("--use-custom-fsdp is deprecated and will be removed in future versions; "
                       "use --use-megatron-fsdp instead");
    c.use_custom_fsdp = false;
    c.use_megatron_fsdp = true;
  }
  static const char* const strategies[] = {"no_shard", "optim", "optim_grads", "optim_grads_params"};
  const std::string& strategy = c.data_parallel_sharding_strategy;
  if (std::find(std::begin(strategies), std::end(strategies), strategy) == std::end(strategies)) {
    reject("--data-parallel-sharding-strategy " + strategy,
           "must be one of no_shard, optim, optim_grads, optim_grads_params");
  }
  if (c.num_distributed_optimizer_instances > 1) {
    reject(flag("--num-distributed-optimizer-instances", c.num_distributed_optimizer_instances),
           "not supported yet (hybrid sharding: mt shards over the whole DP x CP group)");
  }
  if (c.outer_dp_sharding_strategy) {
    reject("--outer-dp-sharding-strategy " + *c.outer_dp_sharding_strategy,
           "not supported yet (hybrid sharding: mt shards over the whole DP x CP group)");
  }
  if (c.no_fsdp_prefetch && !(c.use_megatron_fsdp && strategy == "optim_grads_params")) {
    reject("--no-fsdp-prefetch", "needs --use-megatron-fsdp with --data-parallel-sharding-strategy optim_grads_params "
                                 "(only parameter sharding gathers units)");
  }
  if (c.no_fsdp_prefetch && c.overlap_param_gather) {
    reject("--no-fsdp-prefetch with --overlap-param-gather",
           "contradict each other (with optim_grads_params the overlapped parameter gathers are FSDP's prefetches)");
  }
  if (!c.use_megatron_fsdp) {
    if (strategy != "optim_grads_params") {
      warnings.push_back("--data-parallel-sharding-strategy " + strategy +
                         ": no effect without --use-megatron-fsdp (--use-distributed-optimizer decides)");
    }
    return;
  }
  if (!c.shards_grads()) return;  // no_shard and optim: today's data parallelism, PP included
  const std::string fsdp = "--use-megatron-fsdp with --data-parallel-sharding-strategy " + strategy;
  if (c.pipeline_model_parallel_size > 1) {
    reject(fsdp + " and " + flag(kPp, c.pipeline_model_parallel_size),
           "not supported yet (FSDP units run on one pipeline stage; use no_shard or optim with PP)");
  }
}

void check_data_parallel(const ParallelConfig& c, std::vector<std::string>& warnings) {
  if (c.overlap_param_gather && !c.shards_optimizer()) {
    reject("--overlap-param-gather", "needs --use-distributed-optimizer");
  }
  if (c.overlap_param_gather && !c.overlap_grad_reduce) reject("--overlap-param-gather", "needs --overlap-grad-reduce");
  if (c.ddp_bucket_size && !c.overlap_grad_reduce) {
    warnings.push_back(flag("--ddp-bucket-size", *c.ddp_bucket_size) +
                       ": no effect without --overlap-grad-reduce (grads are reduced in one bucket)");
  }
}

}  // namespace

void check_tensor_parallel_split(int tensor_parallel, const ModelDimensions& model) {
  require_positive(kTp, tensor_parallel);
  const std::string by_tp = flag(kTp, tensor_parallel);
  require_divisible(flag("--num-attention-heads", model.num_attention_heads), model.num_attention_heads,
                    tensor_parallel, by_tp, "each tensor-parallel rank holds whole heads");
  require_divisible(flag("--num-query-groups", model.num_query_groups), model.num_query_groups, tensor_parallel, by_tp,
                    "each tensor-parallel rank holds whole query groups (key/value heads)");
  require_divisible(flag("--ffn-hidden-size", model.ffn_hidden_size), model.ffn_hidden_size, tensor_parallel, by_tp);
  require_divisible("padded vocabulary size " + std::to_string(model.padded_vocab_size), model.padded_vocab_size,
                    tensor_parallel, by_tp, "pad it with --make-vocab-size-divisible-by");
}

int ParallelConfig::virtual_pipeline_size(int num_layers) const {
  if (num_virtual_stages_per_pipeline_rank) return *num_virtual_stages_per_pipeline_rank;
  if (num_layers_per_virtual_pipeline_stage && pipeline_model_parallel_size > 0 && *num_layers_per_virtual_pipeline_stage > 0) {
    return std::max(1, num_layers / pipeline_model_parallel_size / *num_layers_per_virtual_pipeline_stage);
  }
  return 1;
}

int64_t ParallelConfig::bucket_size_elements() const {
  if (!overlap_grad_reduce) return 0;
  return ddp_bucket_size.value_or(std::max<int64_t>(40'000'000, int64_t{1'000'000} * data_parallel_size));
}

std::vector<std::string> validate(ParallelConfig& config, const ModelDimensions& model, const BatchDimensions& batch,
                                  int world_size) {
  std::vector<std::string> warnings;
  check_degrees(config, model, batch);
  const int model_ranks = config.tensor_model_parallel_size * config.context_parallel_size * config.pipeline_model_parallel_size;
  if (world_size < 1 || world_size % model_ranks != 0) {
    reject("world size " + std::to_string(world_size),
           "not divisible by " + flag(kTp, config.tensor_model_parallel_size) + " x " +
               flag(kCp, config.context_parallel_size) + " x " + flag(kPp, config.pipeline_model_parallel_size) +
               " (data parallelism takes the rest)");
  }
  config.data_parallel_size = world_size / model_ranks;
  check_tensor_parallel_split(config.tensor_model_parallel_size, model);
  check_sequence(config, model, warnings);
  check_pipeline(config, model);
  check_batch_and_schedule(config, model, batch, warnings);
  check_experts(config, model, warnings);
  check_megatron_fsdp(config, warnings);
  check_data_parallel(config, warnings);
  return warnings;
}

namespace {

// Every field once, with Megatron's argument name (core/json_fields.h).
template <typename Visit, typename Config>
void visit_fields(Visit& visit, Config& c) {
  visit("tensor_model_parallel_size", c.tensor_model_parallel_size);
  visit("pipeline_model_parallel_size", c.pipeline_model_parallel_size);
  visit("context_parallel_size", c.context_parallel_size);
  visit("data_parallel_size", c.data_parallel_size);
  visit("expert_model_parallel_size", c.expert_model_parallel_size);
  visit("expert_tensor_parallel_size", c.expert_tensor_parallel_size);
  visit("sequence_parallel", c.sequence_parallel);
  visit("num_layers_per_virtual_pipeline_stage", c.num_layers_per_virtual_pipeline_stage);
  visit("num_virtual_stages_per_pipeline_rank", c.num_virtual_stages_per_pipeline_rank);
  visit("decoder_first_pipeline_num_layers", c.decoder_first_pipeline_num_layers);
  visit("decoder_last_pipeline_num_layers", c.decoder_last_pipeline_num_layers);
  visit("microbatch_group_size_per_virtual_pipeline_stage", c.microbatch_group_size_per_virtual_pipeline_stage);
  visit("use_distributed_optimizer", c.use_distributed_optimizer);
  visit("overlap_grad_reduce", c.overlap_grad_reduce);
  visit("overlap_param_gather", c.overlap_param_gather);
  visit("ddp_bucket_size", c.ddp_bucket_size);
  visit("use_megatron_fsdp", c.use_megatron_fsdp);
  visit("data_parallel_sharding_strategy", c.data_parallel_sharding_strategy);
  visit("num_distributed_optimizer_instances", c.num_distributed_optimizer_instances);
  visit("outer_dp_sharding_strategy", c.outer_dp_sharding_strategy);
}

}  // namespace

nlohmann::ordered_json to_json(const ParallelConfig& c) {
  JsonWriter writer;
  visit_fields(writer, c);
  return writer.json();
}

ParallelConfig parallel_config_from_json(const nlohmann::json& json) {
  ParallelConfig c;
  JsonFields fields(json, "parallel config");
  visit_fields(fields, c);
  fields.finish();
  // Every degree, size and count is at least 1 (the layout rules are validate()'s).
  auto at_least_one = [&](const std::string& key, const auto& value) {
    using Value = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<Value, bool> || std::is_same_v<Value, std::string> ||
                  std::is_same_v<Value, std::optional<std::string>>) {
      return;  // the FSDP strategy names are validate()'s
    } else if constexpr (std::is_arithmetic_v<Value>) {
      if (value < 1) fields.fail(key, "must be at least 1 (got " + std::to_string(value) + ")");
    } else {
      if (value && *value < 1) fields.fail(key, "must be at least 1 (got " + std::to_string(*value) + ")");
    }
  };
  visit_fields(at_least_one, c);
  return c;
}

}  // namespace mt::parallel
