// Parallel layout: Megatron's degrees and the options that shape the parallel engine, checked by
// validate() before anything is allocated, and a rank's coordinates. The world is
// TP x CP x DP x PP (DP derived from the world size); experts are laid out on a second grid over
// the same ranks, expert-TP x EP x expert-DP x PP, with EP x expert-TP dividing TP x CP x DP
// (Megatron's parallel folding). parallel/rank_grid.h maps ranks to coordinates and groups,
// parallel/pipeline_layers.h layers to pipeline stages. Fields are named after Megatron's flags
// (--tensor-model-parallel-size -> tensor_model_parallel_size); std::nullopt is Megatron's None.
// The config also goes to and from JSON (the run record, checkpoints).
// Tested in tests/unit/parallel/test_parallel_config.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::parallel {

struct ParallelConfig {
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  int context_parallel_size = 1;
  // Not a flag: world size / (TP x CP x PP), set by validate().
  int data_parallel_size = 1;
  int expert_model_parallel_size = 1;
  // Defaults to TP (Megatron's None).
  std::optional<int> expert_tensor_parallel_size;
  // Megatron turns it off (with a warning) at TP = 1; validate() does the same.
  bool sequence_parallel = false;

  // Virtual pipeline stages (the interleaved schedule): at most one of the two; a resulting size
  // of 1 means no interleaving. With uneven first/last stages only the second is accepted.
  std::optional<int> num_layers_per_virtual_pipeline_stage;
  std::optional<int> num_virtual_stages_per_pipeline_rank;
  // Uneven pipelines: transformer layers on the first / last stage, the rest split evenly.
  std::optional<int> decoder_first_pipeline_num_layers;
  std::optional<int> decoder_last_pipeline_num_layers;
  // Micro-batches run through one model chunk before the next (interleaved schedule); default PP.
  std::optional<int> microbatch_group_size_per_virtual_pipeline_stage;

  // Data-parallel grads and optimizer.
  bool use_distributed_optimizer = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  // Elements per grad bucket; default (with --overlap-grad-reduce) max(40M, 1M x DP), else one bucket.
  std::optional<int64_t> ddp_bucket_size;

  // Megatron-FSDP (issue 25): --use-megatron-fsdp (--use-custom-fsdp its deprecated alias: validate()
  // turns it into use_megatron_fsdp with Megatron's deprecation warning) and
  // --data-parallel-sharding-strategy (no_shard, optim, optim_grads, optim_grads_params; Megatron's
  // default the last), which decides the sharding instead of --use-distributed-optimizer
  // (optim/distributed_optimizer.h). Hybrid sharding (--num-distributed-optimizer-instances > 1,
  // --outer-dp-sharding-strategy) is refused by validate().
  bool use_megatron_fsdp = false;
  bool use_custom_fsdp = false;  // not in the JSON: validate() folds it into use_megatron_fsdp
  std::string data_parallel_sharding_strategy = "optim_grads_params";
  int num_distributed_optimizer_instances = 1;
  std::optional<std::string> outer_dp_sharding_strategy;
  // optim_grads_params: gathering a unit starts the next unit's gather (Megatron-FSDP always
  // prefetches); --no-fsdp-prefetch (mt's own flag) makes every gather wait. Not in the JSON:
  // it changes no number.
  bool no_fsdp_prefetch = false;

  // Whether the optimizer state is sharded: --use-distributed-optimizer, or with
  // --use-megatron-fsdp any strategy but no_shard.
  bool shards_optimizer() const {
    return use_megatron_fsdp ? data_parallel_sharding_strategy != "no_shard" : use_distributed_optimizer;
  }
  // Megatron-FSDP sharding grads (optim_grads) or grads and parameters (optim_grads_params).
  bool shards_grads() const {
    return use_megatron_fsdp &&
           (data_parallel_sharding_strategy == "optim_grads" || data_parallel_sharding_strategy == "optim_grads_params");
  }

  int world_size() const {
    return tensor_model_parallel_size * context_parallel_size * data_parallel_size * pipeline_model_parallel_size;
  }
  int expert_tensor_parallel() const { return expert_tensor_parallel_size.value_or(tensor_model_parallel_size); }
  // The expert grid's DP: world / (expert-TP x EP x PP).
  int expert_data_parallel_size() const {
    return world_size() / (expert_tensor_parallel() * expert_model_parallel_size * pipeline_model_parallel_size);
  }
  // Model chunks per pipeline rank (1 without interleaving); needs the layer count for
  // --num-layers-per-virtual-pipeline-stage.
  int virtual_pipeline_size(int num_layers) const;
  // The interleaved schedule's micro-batch group size G.
  int microbatch_group_size() const {
    return microbatch_group_size_per_virtual_pipeline_stage.value_or(pipeline_model_parallel_size);
  }
  // Elements per DP grad bucket, 0 meaning one bucket for everything (Megatron's defaults).
  int64_t bucket_size_elements() const;
};

// The model dimensions validate() checks against (lib/model adapts its ModelConfig to this).
struct ModelDimensions {
  int num_layers = 1;
  int num_attention_heads = 1;
  int num_query_groups = 1;  // = heads without GQA
  int64_t ffn_hidden_size = 1;
  int64_t padded_vocab_size = 1;
  int seq_length = 1;
  int num_experts = 0;  // 0: a dense model
};

struct BatchDimensions {
  int micro_batch_size = 1;
  int global_batch_size = 1;
};

// The tensor-parallel rule, the one place it is written (validate() applies it; lib/model's
// layout calls it before it shards): heads, query groups, ffn and padded vocabulary divisible by
// `tensor_parallel`, so each TP rank holds whole heads and whole query groups. Throws UsageError
// naming the flag and value that do not divide.
void check_tensor_parallel_split(int tensor_parallel, const ModelDimensions& model);

// Checks `config` for a world of `world_size` ranks, sets config.data_parallel_size, and turns
// --sequence-parallel off at TP = 1. Throws UsageError naming the flags (and values) of the
// first rule broken: heads, query groups, ffn and padded vocabulary divisible by TP; layers per
// pipeline stage with Megatron's uneven first/last and virtual-stage rules; global batch =
// micro-batch x DP x micro-batches; the interleaved schedule's p <= G <= m with m mod G = 0 or
// >= p; sequence divisible by 2 x CP, and by TP on each CP rank with SP; the world divisible by
// TP x CP x PP; EP x expert-TP dividing TP x CP x DP; the experts divisible by EP; the
// distributed optimizer's overlap rules; Megatron-FSDP's strategy names, and what mt's FSDP does not
// run (optim_grads / optim_grads_params with PP or MoE, hybrid sharding). Returns warnings (one line each), for the caller to
// print, where Megatron warns: settings it corrected or that have no effect, EP with TP but no SP.
std::vector<std::string> validate(ParallelConfig& config, const ModelDimensions& model, const BatchDimensions& batch,
                                  int world_size);

// The config as JSON with Megatron's argument names (null for None), and back: unknown keys,
// wrong types and degrees below 1 are mt::UsageError naming the key, missing keys keep the
// defaults. The layout rules are validate()'s.
nlohmann::ordered_json to_json(const ParallelConfig& config);
ParallelConfig parallel_config_from_json(const nlohmann::json& json);

// A rank's coordinates: on the dense grid (TP fastest) and on the expert grid (same PP).
struct RankCoordinates {
  int tp = 0, cp = 0, dp = 0, pp = 0;
  int expert_tp = 0, ep = 0, expert_dp = 0;
};

}  // namespace mt::parallel
