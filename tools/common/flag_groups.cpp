// The groups of Megatron flags and their lib configs (see flags.h).
#include <algorithm>
#include <limits>

#include "core/error.h"
#include "model/layout.h"
#include "perf/flops.h"
#include "tools/common/flags.h"

namespace mt::tools {
namespace {

// Adds shared flags to `app` in option group `group` (CLI11 hides the options of an empty group,
// so "" leaves the default group alone).
class GroupAdder {
 public:
  GroupAdder(CLI::App& app, std::string group) : app_(app), group_(std::move(group)) {}
  template <typename T>
  CLI::Option* operator()(std::string_view name, T& target) const {
    CLI::Option* option = add_flag(app_, name, target);
    return group(option);
  }
  CLI::Option* group(CLI::Option* option) const { return group_.empty() ? option : option->group(group_); }

 private:
  CLI::App& app_;
  std::string group_;
};

template <typename T>
void apply(const std::optional<T>& value, T& target) {
  if (value) target = *value;
}

}  // namespace

// ---- model ----

namespace {

// Megatron's list-valued flags (nargs='+') taken as a list, so a list is refused by name rather
// than as an unexpected argument; each value is checked against the table's spec.
void add_list_valued(CLI::App& app, const GroupAdder& grouped, std::string_view name, std::vector<std::string>& target) {
  const FlagSpec& spec = flag_spec(name);
  CLI::Option* option = app.add_option(spec.name, target, spec.help)
                            ->expected(1, CLI::detail::expected_max_vector_size)
                            ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
                            ->check(detail::value_check(spec, std::numeric_limits<long double>::lowest(),
                                                        std::numeric_limits<long double>::max()));
  grouped.group(option);
}

void add_moe_flags(CLI::App& app, ModelFlags& f, const GroupAdder& add) {
  add("--num-experts", f.num_experts);
  add("--moe-router-topk", f.moe_router_topk);
  add("--moe-ffn-hidden-size", f.moe_ffn_hidden_size);
  add("--moe-shared-expert-intermediate-size", f.moe_shared_expert_intermediate_size);
  add("--moe-layer-freq", f.moe_layer_freq);
  add("--moe-router-score-function", f.moe_router_score_function);
  add("--moe-router-pre-softmax", f.moe_router_pre_softmax);
  add("--moe-router-num-groups", f.moe_router_num_groups);
  add("--moe-router-group-topk", f.moe_router_group_topk);
  add("--moe-router-topk-scaling-factor", f.moe_router_topk_scaling_factor);
  add("--moe-router-enable-expert-bias", f.moe_router_enable_expert_bias);
  add("--moe-router-bias-update-rate", f.moe_router_bias_update_rate);
  add("--moe-router-dtype", f.moe_router_dtype);
  add_list_valued(app, add, "--moe-router-load-balancing-type", f.moe_router_load_balancing_type);
  add_list_valued(app, add, "--moe-aux-loss-coeff", f.moe_aux_loss_coeff);
  add("--moe-z-loss-coeff", f.moe_z_loss_coeff);
  add("--moe-expert-capacity-factor", f.moe_expert_capacity_factor);
  add("--moe-token-drop-policy", f.moe_token_drop_policy);
  add("--moe-pad-expert-input-to-capacity", f.moe_pad_expert_input_to_capacity);
  add("--moe-grouped-gemm", f.moe_grouped_gemm);
  add("--moe-token-dispatcher-type", f.moe_token_dispatcher_type);
}

void add_mla_flags(ModelFlags& f, const GroupAdder& add) {
  add("--multi-latent-attention", f.multi_latent_attention);
  add("--q-lora-rank", f.q_lora_rank);
  add("--kv-lora-rank", f.kv_lora_rank);
  add("--qk-head-dim", f.qk_head_dim);
  add("--qk-pos-emb-head-dim", f.qk_pos_emb_head_dim);
  add("--v-head-dim", f.v_head_dim);
  add("--qk-layernorm", f.qk_layernorm);
  add("--rope-type", f.rope_type);
  add("--rotary-scaling-factor", f.rotary_scaling_factor);
  add("--mscale", f.mscale);
  add("--mscale-all-dim", f.mscale_all_dim);
  add("--yarn-original-max-position-embeddings", f.yarn_original_max_position_embeddings);
  add("--yarn-beta-fast", f.yarn_beta_fast);
  add("--yarn-beta-slow", f.yarn_beta_slow);
}

// The YaRN flags over the preset's values. --rope-type absent: the preset's choice, except that
// --multi-latent-attention given here on a model without MLA takes Megatron's MLA default, yarn
// (MLATransformerConfig.rope_type; arguments.py pops a None --rope-type).
void apply_yarn_flags(const ModelFlags& f, bool mla_before_flags, model::ModelConfig& c) {
  if (f.rope_type) {
    c.rope_type = *f.rope_type == "yarn" ? model::RopeType::yarn : model::RopeType::rope;
  } else if (f.multi_latent_attention && !mla_before_flags) {
    c.rope_type = model::RopeType::yarn;
  }
  apply(f.rotary_scaling_factor, c.rotary_scaling_factor);
  apply(f.mscale, c.mscale);
  apply(f.mscale_all_dim, c.mscale_all_dim);
  apply(f.yarn_original_max_position_embeddings, c.original_max_position_embeddings);
  apply(f.yarn_beta_fast, c.yarn_beta_fast);
  apply(f.yarn_beta_slow, c.yarn_beta_slow);
}

// The MLA flags over the preset's values, then Megatron's defaults for the sizes not given
// (arguments.py: --kv-lora-rank 32, --qk-head-dim 128, --qk-pos-emb-head-dim 64, --v-head-dim 128,
// --q-lora-rank None).
void apply_mla_flags(const ModelFlags& f, model::ModelConfig& c) {
  if (f.multi_latent_attention) c.multi_latent_attention = true;
  if (f.qk_layernorm) c.qk_layernorm = true;
  apply(f.q_lora_rank, c.q_lora_rank);
  apply(f.kv_lora_rank, c.kv_lora_rank);
  apply(f.qk_head_dim, c.qk_head_dim);
  apply(f.qk_pos_emb_head_dim, c.qk_pos_emb_head_dim);
  apply(f.v_head_dim, c.v_head_dim);
  if (!c.multi_latent_attention) return;
  if (c.kv_lora_rank == 0) c.kv_lora_rank = 32;
  if (c.qk_head_dim == 0) c.qk_head_dim = 128;
  if (c.qk_pos_emb_head_dim == 0) c.qk_pos_emb_head_dim = 64;
  if (c.v_head_dim == 0) c.v_head_dim = 128;
}

// The one value of a list-valued Megatron flag, or nullopt when not given; a list is refused.
std::optional<std::string> single_value(const std::vector<std::string>& values, const char* flag) {
  if (values.empty()) return std::nullopt;
  if (values.size() > 1) {
    std::string list;
    for (const std::string& v : values) list += " " + v;
    throw UsageError(flag + list, "a list (one per loss) is not supported yet; give one value");
  }
  return values.front();
}

// The MoE flags over the preset's values.
void apply_moe_flags(const ModelFlags& f, model::ModelConfig& c) {
  apply(f.num_experts, c.num_experts);
  apply(f.moe_router_topk, c.moe_router_topk);
  apply(f.moe_ffn_hidden_size, c.moe_ffn_hidden_size);
  apply(f.moe_shared_expert_intermediate_size, c.moe_shared_expert_intermediate_size);
  if (f.moe_layer_freq) {
    const std::vector<int> pattern = model::parse_moe_layer_freq(*f.moe_layer_freq, c.num_layers);
    if (f.moe_layer_freq->find('[') == std::string::npos) {
      c.moe_layer_freq = std::stoi(*f.moe_layer_freq);  // parsed above: a positive integer
      c.moe_layer_pattern.clear();
    } else {
      c.moe_layer_pattern = pattern;
    }
  }
  if (f.moe_router_score_function) {
    c.moe_router_score_function =
        *f.moe_router_score_function == "sigmoid" ? model::MoeScoreFunction::sigmoid : model::MoeScoreFunction::softmax;
  }
  if (f.moe_router_pre_softmax) c.moe_router_pre_softmax = true;
  if (f.moe_router_num_groups) c.moe_router_num_groups = f.moe_router_num_groups;
  if (f.moe_router_group_topk) c.moe_router_group_topk = f.moe_router_group_topk;
  if (f.moe_router_topk_scaling_factor) c.moe_router_topk_scaling_factor = f.moe_router_topk_scaling_factor;
  if (f.moe_router_enable_expert_bias) c.moe_router_enable_expert_bias = true;
  apply(f.moe_router_bias_update_rate, c.moe_router_bias_update_rate);
  if (f.moe_router_dtype) {
    c.moe_router_dtype = *f.moe_router_dtype == "fp64" ? model::MoeRouterDtype::fp64 : model::MoeRouterDtype::fp32;
  }
  if (const auto type = single_value(f.moe_router_load_balancing_type, "--moe-router-load-balancing-type")) {
    c.moe_router_load_balancing_type = *type == "aux_loss"          ? model::MoeLoadBalancing::aux_loss
                                       : *type == "seq_aux_loss"    ? model::MoeLoadBalancing::seq_aux_loss
                                       : *type == "global_aux_loss" ? model::MoeLoadBalancing::global_aux_loss
                                       : *type == "sinkhorn"        ? model::MoeLoadBalancing::sinkhorn
                                                                    : model::MoeLoadBalancing::none;
  }
  if (const auto coeff = single_value(f.moe_aux_loss_coeff, "--moe-aux-loss-coeff")) {
    c.moe_aux_loss_coeff = std::stof(*coeff);  // checked while parsing: a finite number >= 0
  }
  if (f.moe_z_loss_coeff) c.moe_z_loss_coeff = f.moe_z_loss_coeff;
  if (f.moe_expert_capacity_factor) c.moe_expert_capacity_factor = f.moe_expert_capacity_factor;
  if (f.moe_token_drop_policy) {
    c.moe_token_drop_policy =
        *f.moe_token_drop_policy == "position" ? model::MoeDropPolicy::position : model::MoeDropPolicy::probs;
  }
  if (f.moe_pad_expert_input_to_capacity) c.moe_pad_expert_input_to_capacity = true;
  if (f.moe_grouped_gemm) c.moe_grouped_gemm = true;
  if (f.moe_token_dispatcher_type) {
    c.moe_token_dispatcher_type = *f.moe_token_dispatcher_type == "alltoall" ? model::MoeDispatcher::alltoall
                                  : *f.moe_token_dispatcher_type == "flex"   ? model::MoeDispatcher::flex
                                                                             : model::MoeDispatcher::allgather;
  }
}

}  // namespace

void add_model_flags(CLI::App& app, ModelFlags& f, const std::string& group) {
  const GroupAdder add(app, group);
  add("--model", f.preset);
  add("--num-layers", f.num_layers);
  add("--hidden-size", f.hidden_size);
  add("--ffn-hidden-size", f.ffn_hidden_size);
  add("--num-attention-heads", f.num_attention_heads);
  add("--group-query-attention", f.group_query_attention);
  add("--num-query-groups", f.num_query_groups);
  add("--kv-channels", f.kv_channels);
  add("--seq-length", f.seq_length);
  add("--max-position-embeddings", f.max_position_embeddings);
  add("--vocab-size", f.vocab_size);
  add("--make-vocab-size-divisible-by", f.make_vocab_size_divisible_by);
  add("--swiglu", f.swiglu);
  add("--normalization", f.normalization);
  add("--norm-epsilon", f.norm_epsilon);
  add("--position-embedding-type", f.position_embedding_type);
  add("--rotary-base", f.rotary_base);
  add("--untie-embeddings-and-output-weights", f.untie_embeddings_and_output_weights);
  add("--disable-bias-linear", f.disable_bias_linear);
  add("--init-method-std", f.init_method_std);
  add("--hidden-dropout", f.hidden_dropout);
  add("--attention-dropout", f.attention_dropout);
  add_moe_flags(app, f, add);
  add("--mtp-num-layers", f.mtp_num_layers);
  add("--mtp-loss-scaling-factor", f.mtp_loss_scaling_factor);
  add("--bert-no-binary-head", f.bert_no_binary_head);
  add_mla_flags(f, add);
}

model::ModelConfig model_config(const ModelFlags& f) {
  model::ModelConfig c;
  if (!f.preset.empty()) c = model::preset(f.preset);
  apply(f.num_layers, c.num_layers);
  apply(f.hidden_size, c.hidden_size);
  apply(f.ffn_hidden_size, c.ffn_hidden_size);
  apply(f.num_attention_heads, c.num_attention_heads);
  apply(f.kv_channels, c.kv_channels);
  apply(f.seq_length, c.seq_length);
  apply(f.max_position_embeddings, c.max_position_embeddings);
  apply(f.make_vocab_size_divisible_by, c.make_vocab_size_divisible_by);
  apply(f.vocab_size, c.vocab_size);
  apply(f.norm_epsilon, c.norm_epsilon);
  apply(f.rotary_base, c.rotary_base);
  apply(f.init_method_std, c.init_method_std);
  apply(f.hidden_dropout, c.hidden_dropout);
  apply(f.attention_dropout, c.attention_dropout);
  if (f.num_attention_heads && !f.num_query_groups && !f.group_query_attention)
    c.num_query_groups = c.num_attention_heads;
  if (f.num_query_groups) {
    if (!f.group_query_attention && *f.num_query_groups != c.num_attention_heads) {
      throw UsageError("--num-query-groups", "needs --group-query-attention (as in Megatron)");
    }
    c.num_query_groups = *f.num_query_groups;
  }
  if (f.swiglu) c.swiglu = true;
  if (f.untie_embeddings_and_output_weights) c.untie_embeddings_and_output_weights = true;
  if (f.disable_bias_linear) c.add_bias_linear = false;
  if (f.normalization) {
    c.normalization = *f.normalization == "RMSNorm" ? model::Normalization::rmsnorm : model::Normalization::layernorm;
  }
  apply_moe_flags(f, c);
  apply(f.mtp_num_layers, c.mtp_num_layers);
  apply(f.mtp_loss_scaling_factor, c.mtp_loss_scaling_factor);
  if (f.bert_no_binary_head) c.bert_binary_head = false;  // validate() refuses it for a model that is not BERT
  const bool mla_before_flags = c.multi_latent_attention;
  apply_mla_flags(f, c);
  apply_yarn_flags(f, mla_before_flags, c);
  if (f.position_embedding_type) {
    c.position_embedding = *f.position_embedding_type == "rope" ? model::PositionEmbedding::rope
                                                                : model::PositionEmbedding::learned_absolute;
  }
  if (c.name.empty() || f.preset.empty()) c.name = "custom";
  if (c.max_position_embeddings == 0) c.max_position_embeddings = c.seq_length;
  if (c.ffn_hidden_size == 0) c.ffn_hidden_size = 4 * c.hidden_size;
  if (c.num_query_groups == 0) c.num_query_groups = c.num_attention_heads;
  if (c.kv_channels == 0 && c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0) {
    c.kv_channels = c.hidden_size / c.num_attention_heads;
  }
  return c;
}

// ---- parallel ----

void add_parallel_flags(CLI::App& app, parallel::ParallelConfig& c, const std::string& group) {
  const GroupAdder add(app, group);
  add("--tensor-model-parallel-size", c.tensor_model_parallel_size)->capture_default_str();
  add("--pipeline-model-parallel-size", c.pipeline_model_parallel_size)->capture_default_str();
  add("--context-parallel-size", c.context_parallel_size)->capture_default_str();
  add("--expert-model-parallel-size", c.expert_model_parallel_size)->capture_default_str();
  add("--expert-tensor-parallel-size", c.expert_tensor_parallel_size);
  add("--sequence-parallel", c.sequence_parallel);
  add("--num-layers-per-virtual-pipeline-stage", c.num_layers_per_virtual_pipeline_stage);
  add("--num-virtual-stages-per-pipeline-rank", c.num_virtual_stages_per_pipeline_rank);
  add("--decoder-first-pipeline-num-layers", c.decoder_first_pipeline_num_layers);
  add("--decoder-last-pipeline-num-layers", c.decoder_last_pipeline_num_layers);
  add("--microbatch-group-size-per-virtual-pipeline-stage", c.microbatch_group_size_per_virtual_pipeline_stage);
  add("--use-distributed-optimizer", c.use_distributed_optimizer);
  add("--overlap-grad-reduce", c.overlap_grad_reduce);
  add("--overlap-param-gather", c.overlap_param_gather);
  add("--ddp-bucket-size", c.ddp_bucket_size);
  add("--use-megatron-fsdp", c.use_megatron_fsdp);
  add("--use-custom-fsdp", c.use_custom_fsdp);
  add("--data-parallel-sharding-strategy", c.data_parallel_sharding_strategy)->capture_default_str();
  add("--num-distributed-optimizer-instances", c.num_distributed_optimizer_instances)->capture_default_str();
  add("--outer-dp-sharding-strategy", c.outer_dp_sharding_strategy);
  add("--no-fsdp-prefetch", c.no_fsdp_prefetch);
}

std::vector<std::string> validate_parallel(parallel::ParallelConfig& config, const model::ModelConfig& model,
                                           const train::TrainConfig& training, int world_size) {
  parallel::BatchDimensions batch;
  batch.micro_batch_size = training.micro_batch_size;
  batch.global_batch_size = training.global_batch_size > 0 ? training.global_batch_size : training.micro_batch_size;
  return parallel::validate(config, model::parallel_dimensions(model), batch, world_size);
}

// ---- training ----

void add_training_flags(CLI::App& app, TrainingFlags& f, const std::string& group) {
  const GroupAdder add(app, group);
  train::TrainConfig& c = f.config;
  add("--micro-batch-size", c.micro_batch_size)->capture_default_str();
  add("--global-batch-size", c.global_batch_size);
  add("--train-iters", c.train_iters);
  add("--train-samples", c.train_samples);
  add("--lr", c.lr)->capture_default_str();
  add("--min-lr", c.min_lr)->capture_default_str();
  add("--lr-decay-style", f.lr_decay_style)->capture_default_str();
  add("--lr-warmup-iters", c.lr_warmup_iters);
  add("--lr-warmup-samples", c.lr_warmup_samples);
  add("--lr-warmup-fraction", c.lr_warmup_fraction);
  add("--lr-decay-iters", c.lr_decay_iters);
  add("--lr-decay-samples", c.lr_decay_samples);
  add("--weight-decay", c.adam.weight_decay)->capture_default_str();
  add("--adam-beta1", c.adam.beta1)->capture_default_str();
  add("--adam-beta2", c.adam.beta2)->capture_default_str();
  add("--adam-eps", c.adam.eps)->capture_default_str();
  add("--clip-grad", c.clip_grad)->capture_default_str();
  add("--bf16", f.bf16);
  add("--fp16", f.fp16);
  add("--fp8-format", f.fp8_format);
  add("--fp8-recipe", f.fp8_recipe)->capture_default_str();
  add("--fp8-margin", f.fp8_margin)->capture_default_str();
  add("--fp8-amax-history-len", f.fp8_amax_history_len)->capture_default_str();
  add("--fp8-amax-compute-algo", f.fp8_amax_compute_algo)->capture_default_str();
  add("--fp8-param-gather", f.fp8_param_gather);
  add("--first-last-layers-bf16", f.first_last_layers_bf16);
  add("--num-layers-at-start-in-bf16", f.num_layers_at_start_in_bf16);
  add("--num-layers-at-end-in-bf16", f.num_layers_at_end_in_bf16);
  add("--no-fp8-wgrad", f.no_fp8_wgrad);
  add("--loss-scale", c.loss_scale);
  add("--initial-loss-scale", c.initial_loss_scale)->capture_default_str();
  add("--min-loss-scale", c.min_loss_scale)->capture_default_str();
  add("--loss-scale-window", c.loss_scale_window)->capture_default_str();
  add("--hysteresis", c.hysteresis)->capture_default_str();
  add("--calculate-per-token-loss", c.calculate_per_token_loss);
  add("--check-for-nan-in-loss-and-grad", f.check_for_nan_in_loss_and_grad);
  add("--no-check-for-nan-in-loss-and-grad", f.no_check_for_nan_in_loss_and_grad);
  add("--max-consecutive-skipped-iters", c.max_consecutive_skipped_iters)->capture_default_str();
  add("--recompute-granularity", f.recompute_granularity);
  add("--recompute-method", f.recompute_method)->capture_default_str();
  add("--recompute-num-layers", c.recompute.num_layers)->capture_default_str();
  add("--seed", c.seed)->capture_default_str();
  add("--log-interval", c.log_interval)->capture_default_str();
  add("--log-throughput", c.log_throughput);
  add("--moe-per-layer-logging", f.moe_per_layer_logging);
  add("--eval-interval", c.eval_interval)->capture_default_str();
  add("--eval-iters", c.eval_iters)->capture_default_str();
  add("--peak-tflops", f.peak_tflops);
  add("--flops-convention", f.flops_convention)->capture_default_str();
}

namespace {

// Which GEMMs quantize (Megatron's --first-last-layers-bf16, --num-layers-at-*-in-bf16, --no-fp8-wgrad);
// each flag is refused by name where it would change nothing.
void fp8_layer_selection(const TrainingFlags& f, model::Fp8Config& fp8) {
  const bool counts = f.num_layers_at_start_in_bf16 || f.num_layers_at_end_in_bf16;
  if (!fp8.enabled && (f.first_last_layers_bf16 || f.no_fp8_wgrad || counts)) {
    throw UsageError(f.no_fp8_wgrad ? "--no-fp8-wgrad" : "--first-last-layers-bf16", "needs --fp8-format");
  }
  if (counts && !f.first_last_layers_bf16) {
    throw UsageError(f.num_layers_at_start_in_bf16 ? "--num-layers-at-start-in-bf16" : "--num-layers-at-end-in-bf16",
                     "needs --first-last-layers-bf16");
  }
  fp8.first_last_layers_bf16 = f.first_last_layers_bf16;
  fp8.num_layers_at_start_in_bf16 = f.num_layers_at_start_in_bf16.value_or(1);
  fp8.num_layers_at_end_in_bf16 = f.num_layers_at_end_in_bf16.value_or(1);
  fp8.wgrad = !f.no_fp8_wgrad;
}

// --fp8-*: Megatron's names and defaults; the recipes and options mt does not run are refused by name.
model::Fp8Config fp8_config(const TrainingFlags& f) {
  if (f.fp8_param_gather) throw UsageError("--fp8-param-gather", "not supported (parameters are gathered in fp32)");
  if (f.fp8_recipe != "delayed") {
    throw UsageError("--fp8-recipe " + f.fp8_recipe, "not supported (mt runs the delayed recipe only)");
  }
  model::Fp8Config fp8;
  fp8.enabled = !f.fp8_format.empty();
  fp8.format = f.fp8_format == "e4m3" ? model::Fp8Format::e4m3 : model::Fp8Format::hybrid;
  fp8.margin = f.fp8_margin;
  fp8.amax_history_len = f.fp8_amax_history_len;
  fp8.amax_compute_algo =
      f.fp8_amax_compute_algo == "max" ? kernels::Fp8AmaxAlgo::max : kernels::Fp8AmaxAlgo::most_recent;
  fp8_layer_selection(f, fp8);
  return fp8;
}

}  // namespace

train::TrainConfig training_config(const TrainingFlags& f) {
  if (f.bf16 && f.fp16) throw UsageError("--bf16/--fp16", "choose one");
  if (f.check_for_nan_in_loss_and_grad && f.no_check_for_nan_in_loss_and_grad) {
    throw UsageError("--check-for-nan-in-loss-and-grad/--no-check-for-nan-in-loss-and-grad", "choose one");
  }
  train::TrainConfig c = f.config;
  c.precision = f.bf16 ? Precision::bf16 : f.fp16 ? Precision::fp16 : Precision::fp32;
  c.fp8 = fp8_config(f);
  c.check_for_nan_in_loss_and_grad = !f.no_check_for_nan_in_loss_and_grad;
  c.moe_per_layer_logging = f.moe_per_layer_logging;
  c.lr_decay_style = optim::parse_decay_style(f.lr_decay_style);
  if (f.recompute_granularity == "full") c.recompute.granularity = model::RecomputeGranularity::full;
  if (f.recompute_granularity == "selective") c.recompute.granularity = model::RecomputeGranularity::selective;
  c.recompute.method = f.recompute_method == "block" ? model::RecomputeMethod::block : model::RecomputeMethod::uniform;
  if (c.recompute.method == model::RecomputeMethod::block &&
      c.recompute.granularity != model::RecomputeGranularity::full) {
    throw UsageError("--recompute-method block", "needs --recompute-granularity full");
  }
  if (f.peak_tflops) c.peak_flops_per_second = *f.peak_tflops * 1e12;
  c.flops_convention = perf::parse_flops_convention(f.flops_convention);
  return c;
}

// ---- device ----

CLI::Option* add_device_flag(CLI::App& app, std::optional<std::string>& device, const std::string& group,
                             const std::string& help) {
  CLI::Option* option = add_flag(app, "--device", device, help);
  option->check(CLI::Validator(
      [](std::string& text) {
        backend_device(text);  // throws the one-line refusal (a usage error, not CLI11's text)
        return std::string();
      },
      "cpu or cuda"));
  return group.empty() ? option : option->group(group);
}

BackendDevice backend_device(const std::optional<std::string>& device) {
  if (!device || *device == "cpu") return BackendDevice::cpu;
  if (*device == "cuda") return BackendDevice::cuda;
  throw UsageError("--device " + *device, "a GPU model for peaks is --peak-device " + *device +
                                              "; --device names the backend, cpu or cuda");
}

// ---- data ----

void add_data_path_flags(CLI::App& app, DataPathFlags& f, const std::string& group) {
  const GroupAdder add(app, group);
  auto list = [&](const char* flag, std::vector<std::string>& target) {
    add(flag, target)
        ->expected(1, CLI::detail::expected_max_vector_size)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  list("--data-path", f.data_path);
  list("--train-data-path", f.train_data_path);
  list("--valid-data-path", f.valid_data_path);
  list("--test-data-path", f.test_data_path);
  add("--split", f.split)->capture_default_str();
  add("--data-cache-path", f.data_cache_path);
}

void apply_data_path_flags(const DataPathFlags& flags, data::DataConfig& config) {
  if (!flags.data_path.empty()) config.blend = data::parse_blend(flags.data_path, "--data-path");
  const std::vector<std::string>* per_split[3] = {&flags.train_data_path, &flags.valid_data_path,
                                                  &flags.test_data_path};
  const char* names[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
  for (size_t s = 0; s < 3; ++s) {
    if (!per_split[s]->empty()) config.blend_per_split[s] = data::parse_blend(*per_split[s], names[s]);
  }
  config.split = flags.split;
}

std::optional<int64_t> recorded_vocab_size(const std::vector<data::TokenDataset>& datasets) {
  int64_t vocab = 0;
  for (const auto& dataset : datasets) {
    if (dataset.vocab_size() < 0) return std::nullopt;
    vocab = std::max(vocab, dataset.vocab_size());
  }
  return vocab > 0 ? std::optional<int64_t>(vocab) : std::nullopt;
}

// ---- checkpoints ----

void add_checkpoint_flags(CLI::App& app, CheckpointFlags& f, const std::string& group) {
  const GroupAdder add(app, group);
  add("--save", f.save);
  add("--save-interval", f.save_interval);
  add("--ckpt-format", f.ckpt_format);
  add("--load", f.load);
  add("--finetune", f.finetune);
  add("--no-load-optim", f.no_load_optim);
  add("--no-save-optim", f.no_save_optim);
  add("--no-load-rng", f.no_load_rng);
  add("--exit-on-missing-checkpoint", f.exit_on_missing_checkpoint);
  // issue 28 W3
  add("--override-opt_param-scheduler", f.override_opt_param_scheduler);
  add("--use-checkpoint-opt_param-scheduler", f.use_checkpoint_opt_param_scheduler);
}

// ---- compatibility ----

void add_megatron_compat_flags(CLI::App& app, MegatronCompatFlags& f, const std::string& group) {
  const GroupAdder add(app, group);
  add("--dataset-impl", f.dataset_impl);
  add("--dataloader-type", f.dataloader_type);
  add("--optimizer", f.optimizer);
  add("--transformer-impl", f.transformer_impl);
  add("--use-mcore-models", f.use_mcore_models);
  add("--use-flash-attn", f.use_flash_attn);
  add("--attention-softmax-in-fp32", f.attention_softmax_in_fp32);
  add("--accumulate-allreduce-grads-in-fp32", f.accumulate_allreduce_grads_in_fp32);
  add("--exit-signal-handler", f.exit_signal_handler);
}

// ---- tokenizer ----

void add_tokenizer_flags(CLI::App& app, text::TokenizerOptions& options, bool required, const std::string& group) {
  const GroupAdder add(app, group);
  CLI::Option* type = add("--tokenizer-type", options.type);
  if (required) type->required();
  add("--vocab-file", options.vocab_file);
  add("--merge-file", options.merge_file);
  add("--tokenizer-model", options.tokenizer_model);
  add("--tiktoken-pattern", options.tiktoken_pattern);
  add("--tiktoken-num-special-tokens", options.tiktoken_num_special_tokens)->capture_default_str();
}

void add_tokenizer_encoding_flags(CLI::App& app, text::TokenizerOptions& options, const std::string& group) {
  // Megatron's negative spelling: given, it sets include_special_tokens to false.
  const FlagSpec& spec = flag_spec("--tokenizer-hf-no-include-special-tokens");
  CLI::Option* option = app.add_flag(spec.name + "{false}", options.include_special_tokens, spec.help);
  if (!group.empty()) option->group(group);
}

}  // namespace mt::tools
