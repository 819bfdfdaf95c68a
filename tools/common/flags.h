// The flags of the mt tools, each defined once: its spelling (Megatron's where Megatron has the
// flag), the kind of value, the range or choices it accepts and its help line. A value outside
// its range is refused while parsing with one line that says the range ("--workers: must be at
// least 1 (got 0)"), never CLI11's generic text. Groups of Megatron flags (model, parallel,
// training, data, tokenizer) and mt-train's backend flag (--device) are added by one function
// each and turned into lib configs here, so every tool that takes them (mt-train, mt-shard,
// mt-tokenize, mt-mfu, mt-memreport) parses and checks them the same way. Tested in tests/unit/tools/test_flags.cpp and through the
// tools' Bats suites.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "backend/registry.h"
#include "data/gpt_dataset.h"
#include "model/config.h"
#include "parallel/parallel_config.h"
#include "text/tokenizer.h"
#include "train/trainer.h"

namespace mt::tools {

// The values a numeric flag accepts. Bounds are inclusive unless marked exclusive; every real
// value must also be finite (nan and inf are never accepted).
struct Range {
  long double min = -std::numeric_limits<long double>::infinity();
  long double max = std::numeric_limits<long double>::infinity();
  bool min_exclusive = false, max_exclusive = false;

  // "at least 1", "positive", "in [0, 1)", "at most 7", "any number".
  std::string describe() const;
  bool contains(long double value) const;
};

Range at_least(long double min);
Range positive();  // > 0
Range between(long double min, long double max, bool max_exclusive = false);

enum class FlagKind { integer, real, toggle, text, list };

struct FlagSpec {
  std::string name;  // "--num-layers"
  FlagKind kind = FlagKind::text;
  std::string help;
  Range range;                         // integer and real flags
  std::vector<std::string> choices;    // text flags with a fixed set of values (empty: any text)
  std::vector<std::string> supported;  // of the choices, those mt implements (empty: all)
};

FlagSpec integer_flag(std::string name, std::string help, Range range);
FlagSpec real_flag(std::string name, std::string help, Range range);
FlagSpec toggle_flag(std::string name, std::string help);
// `choices` empty: any text; `supported` empty: every choice.
FlagSpec text_flag(std::string name, std::string help, std::vector<std::string> choices = {},
                   std::vector<std::string> supported = {});
FlagSpec list_flag(std::string name, std::string help);

// The spec of a shared flag from the one table in flags.cpp; std::logic_error for a name that is
// not in it (a programming error, caught by the unit test that defines every group).
const FlagSpec& flag_spec(std::string_view name);

// The error for `text` given to `spec` (numeric range, integer syntax, choices), or "" when it is
// accepted: "must be at least 1 (got 0)".
std::string value_error(const FlagSpec& spec, const std::string& text);
// Integer flags bound to a narrower type also fail above that type's limits.
std::string value_error(const FlagSpec& spec, const std::string& text, long double type_min, long double type_max);

namespace detail {
template <typename T>
struct Unwrap {
  using type = T;
};
template <typename T>
struct Unwrap<std::optional<T>> {
  using type = T;
};
void check_kind(const FlagSpec& spec, FlagKind bound_kind);  // std::logic_error on a mismatch
CLI::Validator value_check(const FlagSpec& spec, long double type_min, long double type_max);
}  // namespace detail

// Adds `spec` to `app`, bound to `target` (bool for toggles; an integer, floating or string type,
// optional or not; a vector of strings for lists), with its check. `help` overrides the spec's.
template <typename T>
CLI::Option* add_flag(CLI::App& app, const FlagSpec& spec, T& target, const std::string& help = "") {
  using Value = typename detail::Unwrap<T>::type;
  const std::string& text = help.empty() ? spec.help : help;
  if constexpr (std::is_same_v<Value, bool>) {
    detail::check_kind(spec, FlagKind::toggle);
    return app.add_flag(spec.name, target, text);
  } else if constexpr (std::is_same_v<Value, std::vector<std::string>>) {
    detail::check_kind(spec, FlagKind::list);
    return app.add_option(spec.name, target, text);
  } else if constexpr (std::is_same_v<Value, std::string>) {
    detail::check_kind(spec, FlagKind::text);
    return app.add_option(spec.name, target, text)->check(detail::value_check(spec, 0, 0));
  } else {
    static_assert(std::is_arithmetic_v<Value>, "flags bind to numbers, strings, string lists or bools");
    detail::check_kind(spec, std::is_integral_v<Value> ? FlagKind::integer : FlagKind::real);
    return app.add_option(spec.name, target, text)
        ->check(detail::value_check(spec, static_cast<long double>(std::numeric_limits<Value>::lowest()),
                                    static_cast<long double>(std::numeric_limits<Value>::max())));
  }
}

// The same for a flag of the shared table.
template <typename T>
CLI::Option* add_flag(CLI::App& app, std::string_view name, T& target, const std::string& help = "") {
  return add_flag(app, flag_spec(name), target, help);
}

// ---- model ----

// Megatron's model flags over a preset (--model): unset values keep the preset's.
struct ModelFlags {
  std::string preset;
  std::optional<int> num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups, kv_channels;
  std::optional<int> seq_length, max_position_embeddings, make_vocab_size_divisible_by;
  std::optional<int64_t> vocab_size;
  bool group_query_attention = false, swiglu = false, untie_embeddings_and_output_weights = false,
       disable_bias_linear = false;
  std::optional<std::string> normalization, position_embedding_type;
  std::optional<float> norm_epsilon, rotary_base, init_method_std, hidden_dropout, attention_dropout;
  // Mixture of experts (Megatron's flags; model/config.h's fields).
  std::optional<int> num_experts, moe_router_topk, moe_ffn_hidden_size, moe_shared_expert_intermediate_size,
      moe_router_num_groups, moe_router_group_topk;
  std::optional<std::string> moe_layer_freq, moe_router_score_function, moe_router_dtype, moe_token_drop_policy,
      moe_token_dispatcher_type;
  // Megatron takes lists here (one type and coefficient per loss); mt takes one value and refuses
  // a list by name.
  std::vector<std::string> moe_router_load_balancing_type, moe_aux_loss_coeff;
  std::optional<float> moe_router_topk_scaling_factor, moe_router_bias_update_rate, moe_z_loss_coeff,
      moe_expert_capacity_factor;
  bool moe_router_pre_softmax = false, moe_router_enable_expert_bias = false,
       moe_pad_expert_input_to_capacity = false, moe_grouped_gemm = false;
  bool bert_no_binary_head = false;  // BERT models (--model tiny-bert, bert-345m) only
  // Multi-token prediction (Megatron's flags; model/config.h's fields).
  std::optional<int> mtp_num_layers;
  std::optional<float> mtp_loss_scaling_factor;
  // Multi-latent attention (Megatron's flags; model/config.h's fields).
  bool multi_latent_attention = false, qk_layernorm = false;
  std::optional<int> q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim;
  std::optional<std::string> rope_type;  // rope or yarn (yarn with MLA only: model::ModelConfig::validate)
  // YaRN (model/config.h's fields): Megatron 0.16.1's --rotary-scaling-factor, --mscale,
  // --mscale-all-dim, and later Megatron's --yarn-* names for the original length and the betas.
  std::optional<double> rotary_scaling_factor, mscale, mscale_all_dim, yarn_beta_fast, yarn_beta_slow;
  std::optional<int> yarn_original_max_position_embeddings;
};

void add_model_flags(CLI::App& app, ModelFlags& flags, const std::string& group = "Model");
// The preset with the flags applied and Megatron's defaults filled in (ffn 4 x hidden, one query
// group per head, kv-channels hidden / heads, position table = sequence length). Not validated
// yet: the vocabulary may still come from the data (model::ModelConfig::validate does that).
model::ModelConfig model_config(const ModelFlags& flags);

// ---- parallel ----

// Megatron's parallel flags, bound to parallel::ParallelConfig's fields (named after them).
void add_parallel_flags(CLI::App& app, parallel::ParallelConfig& config, const std::string& group = "Parallelism");
// parallel::validate for `model` and the batch of `training` on `world_size` ranks (sets the
// data-parallel size, turns --sequence-parallel off at TP 1 as Megatron does); returns its
// warnings, one line each, for the tool to print.
std::vector<std::string> validate_parallel(parallel::ParallelConfig& config, const model::ModelConfig& model,
                                           const train::TrainConfig& training, int world_size);

// ---- training ----

struct TrainingFlags {
  train::TrainConfig config;  // numeric values are bound to it directly
  std::string lr_decay_style = "linear";
  std::string recompute_granularity, recompute_method = "uniform";
  bool bf16 = false, fp16 = false;
  // FP8 (issue 23; Megatron's defaults)
  std::string fp8_format, fp8_recipe = "delayed", fp8_amax_compute_algo = "most_recent";
  int fp8_margin = 0;
  int64_t fp8_amax_history_len = 1;
  bool fp8_param_gather = false;
  bool first_last_layers_bf16 = false, no_fp8_wgrad = false;
  std::optional<int> num_layers_at_start_in_bf16, num_layers_at_end_in_bf16;  // Megatron's default 1
  bool check_for_nan_in_loss_and_grad = false, no_check_for_nan_in_loss_and_grad = false;
  bool moe_per_layer_logging = false;
  std::optional<double> peak_tflops;
  std::string flops_convention = "megatron";
};

void add_training_flags(CLI::App& app, TrainingFlags& flags, const std::string& group = "Training");
// The training config: named values parsed, combinations checked (mt::UsageError naming flags).
train::TrainConfig training_config(const TrainingFlags& flags);

// ---- device ----

// The backend a run uses: mt-train's --device, defined once for every tool that takes mt-train's
// flags (mt-train runs on its table, backend::backend_ops; mt-mfu and mt-memreport accept it).
using BackendDevice = backend::Device;

// Adds --device to `app`, bound to `device` (unset: cpu), in option group `group` ("": the
// default group) with `help` ("": the table's). Its value is checked while parsing by
// backend_device, so a bad one is a usage error before anything runs.
CLI::Option* add_device_flag(CLI::App& app, std::optional<std::string>& device, const std::string& group = "",
                             const std::string& help = "");
// The backend `device` names (unset: cpu). Anything but cpu and cuda is mt::UsageError with a hint
// for the old use of the flag: "--device H100: a GPU model for peaks is --peak-device H100;
// --device names the backend, cpu or cuda".
BackendDevice backend_device(const std::optional<std::string>& device);

// ---- data ----

// Megatron's data-path flags (--data-path PREFIX..., or W1 PREFIX1 W2 PREFIX2 ..., the per-split
// paths, --split) and the index cache.
struct DataPathFlags {
  std::vector<std::string> data_path, train_data_path, valid_data_path, test_data_path;
  std::string split = "969, 30, 1";
  std::string data_cache_path;
  bool any() const {
    return !data_path.empty() || !train_data_path.empty() || !valid_data_path.empty() || !test_data_path.empty();
  }
};

// Adds the four path flags, --split and --data-cache-path to `app`, in option group `group` ("":
// the default group).
void add_data_path_flags(CLI::App& app, DataPathFlags& flags, const std::string& group = "");
// The blend, per-split blends and split of `flags` (each list parsed with data::parse_blend).
void apply_data_path_flags(const DataPathFlags& flags, data::DataConfig& config);
// The vocabulary the token datasets record (the largest), or nullopt when one records none
// (.bin/.idx): mt-train's model takes it unless --vocab-size is given.
std::optional<int64_t> recorded_vocab_size(const std::vector<data::TokenDataset>& datasets);

// ---- checkpoints ----

// Megatron's checkpoint flags (train/checkpointing.h does the work; mt-train decides when).
struct CheckpointFlags {
  std::string save, load;
  std::optional<int64_t> save_interval;
  bool finetune = false, no_load_optim = false, no_save_optim = false, no_load_rng = false,
       exit_on_missing_checkpoint = false;
  // Issue 28 W3: which LR schedule a resume continues on when the checkpoint's differs
  // (train/checkpointing.h SchedulerOnLoad); at most one of them.
  bool override_opt_param_scheduler = false, use_checkpoint_opt_param_scheduler = false;
  // Issue 25: --ckpt-format fsdp_dtensor, accepted with --use-megatron-fsdp (mt's own files).
  std::string ckpt_format;
};

void add_checkpoint_flags(CLI::App& app, CheckpointFlags& flags, const std::string& group = "Checkpoints");

// ---- tokenizer ----

// Megatron's tokenizer flags (--tokenizer-type and the files it reads). `required`: the type must
// be given.
void add_tokenizer_flags(CLI::App& app, text::TokenizerOptions& options, bool required, const std::string& group = "");
// Those that only change encoding (--tokenizer-hf-no-include-special-tokens), for the commands
// that encode.
void add_tokenizer_encoding_flags(CLI::App& app, text::TokenizerOptions& options, const std::string& group = "");

// ---- Megatron options whose value mt implements by construction ----

// Flags Megatron's scripts pass with the value mt always implements (--dataset-impl mmap,
// --transformer-impl local, --use-flash-attn, --exit-signal-handler, ...): accepted with that value,
// any other value refused while parsing as not supported yet. Nothing to apply: each names what
// mt does anyway (the help of each says why).
struct MegatronCompatFlags {
  std::string dataset_impl, dataloader_type, optimizer, transformer_impl;
  bool use_mcore_models = false, use_flash_attn = false, attention_softmax_in_fp32 = false,
       accumulate_allreduce_grads_in_fp32 = false, exit_signal_handler = false;
};

void add_megatron_compat_flags(CLI::App& app, MegatronCompatFlags& flags, const std::string& group);

// ---- Megatron flags mt does not implement ----

// Refuses, by name, a Megatron flag mt has no implementation of yet (before parsing, so the
// message names the flag instead of calling it unknown): "--fp8: Megatron flag not supported yet".
void refuse_unimplemented_megatron_flags(int argc, char** argv);

}  // namespace mt::tools
