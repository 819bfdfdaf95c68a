// The MoE router (see router.h): option parsing and validation, and the Router composing the
// backend's moe_router_* entries in Megatron's order.
#include "model/moe/router.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"

namespace mt::model::moe {
namespace {

int group_size(const comm::Communicator* group) { return group ? group->size() : 1; }

kernels::MoeTopkParams topk_params(const RouterOptions& options) {
  kernels::MoeTopkParams params;
  params.num_experts = options.num_experts;
  params.topk = options.topk;
  params.score_function = options.score_function == ScoreFunction::sigmoid ? kernels::MoeScoreFunction::sigmoid
                                                                           : kernels::MoeScoreFunction::softmax;
  params.pre_softmax = options.pre_softmax;
  params.num_groups = options.group_topk > 0 ? options.num_groups : 0;
  params.group_topk = options.group_topk;
  params.scaling_factor = options.topk_scaling_factor.value_or(1.0f);
  return params;
}

kernels::MoeScoreFunction kernel_score_function(ScoreFunction function) {
  return function == ScoreFunction::sigmoid ? kernels::MoeScoreFunction::sigmoid : kernels::MoeScoreFunction::softmax;
}

bool aux_loss_on(const RouterOptions& options) {
  return options.load_balancing_type != LoadBalancingType::none && options.aux_loss_coeff > 0.0f;
}

void refuse(const char* flag, const std::string& why) { throw UsageError(flag, why); }

void validate_groups(const RouterOptions& options) {
  if (options.group_topk < 0 || options.num_groups < 0) {
    refuse("--moe-router-group-topk", "group counts must not be negative");
  }
  if (options.group_topk == 0) return;
  if (options.num_groups == 0) refuse("--moe-router-group-topk", "needs --moe-router-num-groups");
  if (options.num_experts % options.num_groups != 0) {
    refuse("--moe-router-num-groups", std::to_string(options.num_groups) + " does not divide --num-experts " +
                                          std::to_string(options.num_experts));
  }
  if (options.group_topk > options.num_groups) {
    refuse("--moe-router-group-topk", std::to_string(options.group_topk) + " is above --moe-router-num-groups " +
                                          std::to_string(options.num_groups));
  }
  if (options.topk < options.group_topk) {
    refuse("--moe-router-group-topk", std::to_string(options.group_topk) + " is above --moe-router-topk " +
                                          std::to_string(options.topk) + " (no score per group)");
  }
  if (options.topk > options.group_topk * (options.num_experts / options.num_groups)) {
    refuse("--moe-router-topk", std::to_string(options.topk) + " is above the experts of the " +
                                    std::to_string(options.group_topk) + " groups kept");
  }
}

void validate_capacity(const RouterOptions& options) {
  if (options.capacity_factor && !(*options.capacity_factor > 0.0)) {
    refuse("--moe-expert-capacity-factor", "must be positive (unset for dropless)");
  }
  if (options.pad_expert_input_to_capacity && !options.capacity_factor) {
    refuse("--moe-pad-expert-input-to-capacity", "needs --moe-expert-capacity-factor");
  }
}

}  // namespace

const char* score_function_name(ScoreFunction function) {
  return function == ScoreFunction::sigmoid ? "sigmoid" : "softmax";
}

ScoreFunction parse_score_function(std::string_view name) {
  if (name == "softmax") return ScoreFunction::softmax;
  if (name == "sigmoid") return ScoreFunction::sigmoid;
  refuse("--moe-router-score-function", "'" + std::string(name) + "' is not supported (softmax or sigmoid)");
  return ScoreFunction::softmax;
}

const char* load_balancing_type_name(LoadBalancingType type) {
  switch (type) {
    case LoadBalancingType::aux_loss:
      return "aux_loss";
    case LoadBalancingType::seq_aux_loss:
      return "seq_aux_loss";
    case LoadBalancingType::global_aux_loss:
      return "global_aux_loss";
    case LoadBalancingType::none:
      return "none";
  }
  return "?";
}

LoadBalancingType parse_load_balancing_type(std::string_view name) {
  for (LoadBalancingType type : {LoadBalancingType::aux_loss, LoadBalancingType::seq_aux_loss,
                                 LoadBalancingType::global_aux_loss, LoadBalancingType::none}) {
    if (name == load_balancing_type_name(type)) return type;
  }
  refuse("--moe-router-load-balancing-type",
         "'" + std::string(name) + "' is not supported (aux_loss, seq_aux_loss, global_aux_loss or none)");
  return LoadBalancingType::none;
}

const char* token_drop_policy_name(TokenDropPolicy policy) {
  return policy == TokenDropPolicy::position ? "position" : "probs";
}

TokenDropPolicy parse_token_drop_policy(std::string_view name) {
  if (name == "probs") return TokenDropPolicy::probs;
  if (name == "position") return TokenDropPolicy::position;
  refuse("--moe-token-drop-policy", "'" + std::string(name) + "' is not supported (probs or position)");
  return TokenDropPolicy::probs;
}

const char* load_balancing_log_name(LoadBalancingType type) {
  switch (type) {
    case LoadBalancingType::aux_loss:
      return "load_balancing_loss";
    case LoadBalancingType::seq_aux_loss:
      return "seq_load_balancing_loss";
    case LoadBalancingType::global_aux_loss:
      return "global_load_balancing_loss";
    case LoadBalancingType::none:
      return "";
  }
  return "";
}

void validate_router_options(const RouterOptions& options) {
  if (options.num_experts < 1) refuse("--num-experts", "must be at least 1");
  if (options.topk < 1 || options.topk > options.num_experts) {
    refuse("--moe-router-topk",
           std::to_string(options.topk) + " is outside [1, --num-experts " + std::to_string(options.num_experts) + "]");
  }
  if (options.topk == 1 && options.score_function == ScoreFunction::softmax && !options.pre_softmax) {
    refuse("--moe-router-topk",
           "1 with softmax needs --moe-router-pre-softmax (a softmax over one logit has no "
           "gradient)");
  }
  validate_groups(options);
  if (options.enable_expert_bias && options.score_function != ScoreFunction::sigmoid) {
    refuse("--moe-router-enable-expert-bias", "needs --moe-router-score-function sigmoid");
  }
  if (options.topk_scaling_factor && !(*options.topk_scaling_factor > 0.0f)) {
    refuse("--moe-router-topk-scaling-factor", "must be positive");
  }
  if (options.aux_loss_coeff < 0.0f) refuse("--moe-aux-loss-coeff", "must not be negative");
  if (options.z_loss_coeff && *options.z_loss_coeff < 0.0f) refuse("--moe-z-loss-coeff", "must not be negative");
  validate_capacity(options);
}

int64_t expert_capacity(const RouterOptions& options, int64_t rows) {
  if (!options.capacity_factor) throw Error("expert capacity", "no --moe-expert-capacity-factor (dropless)");
  const double tokens = static_cast<double>(rows) * options.topk;
  return static_cast<int64_t>(std::ceil(tokens / options.num_experts * *options.capacity_factor));
}

Router::Router(const RouterOptions& options, const backend::Ops& ops, backend::Stream stream, RouterGroups groups)
    : options_(options), ops_(ops), stream_(stream), groups_(groups) {
  validate_router_options(options_);
  if (!ops.moe_router_topk || !ops.moe_router_topk_backward || !ops.moe_router_aux_sums ||
      !ops.moe_router_aux_backward || !ops.moe_router_z_loss_sum || !ops.moe_router_z_loss_backward ||
      !ops.moe_router_capacity_drop || !ops.moe_router_tokens_per_expert) {
    throw Error(std::string("MoE router on the ") + ops.name + " backend",
                "its op table does not fill the moe_router_* entries");
  }
  if (options_.load_balancing_type == LoadBalancingType::global_aux_loss && aux_loss_on(options_)) {
    global_counts_ = backend::DeviceBuffer<float>(ops_, options_.num_experts, backend::MemoryCategory::activations);
  }
  if (options_.z_loss_coeff) {
    z_sum_ = backend::DeviceBuffer<double>(ops_, 1, backend::MemoryCategory::activations);
    z_mean_ = backend::DeviceBuffer<float>(ops_, 1, backend::MemoryCategory::activations);
  }
}

int64_t Router::saved_index_count(int64_t rows) const { return rows * options_.topk; }

int64_t Router::aux_weight_count(const RouterRows& rows) const {
  if (!aux_loss_on(options_)) return 0;
  const int64_t groups = options_.load_balancing_type == LoadBalancingType::seq_aux_loss ? rows.num_sequences : 1;
  return groups * options_.num_experts;
}

comm::Communicator* Router::aux_group() const {
  return options_.load_balancing_type == LoadBalancingType::global_aux_loss ? groups_.tp_dp_cp : groups_.tp_cp;
}

void Router::check_rows(const RouterRows& rows, bool training) const {
  if (rows.rows < 0) throw Error("MoE router", "negative row count");
  if (training && options_.load_balancing_type == LoadBalancingType::seq_aux_loss && aux_loss_on(options_) &&
      (rows.num_sequences < 1 || rows.sequence_length < 1 || (rows.rows > 0 && !rows.row_ids))) {
    throw Error("MoE router", "seq_aux_loss needs the rows' token ids, the sequence length and the sequences");
  }
}

RouterLossValues Router::forward(const float* logits, const float* expert_bias, const RouterRows& rows, bool training,
                                 float* tokens_per_expert, float* probs, uint8_t* routing_map,
                                 const RouterSaved& saved, bool recompute) {
  check_rows(rows, training);
  if (options_.enable_expert_bias && !expert_bias) throw Error("MoE router", "expert bias on but no bias buffer");
  const int64_t count = rows.rows;
  const int experts = options_.num_experts;
  RouterLossValues values;
  if (training && options_.z_loss_coeff) values.z_loss = apply_z_loss(logits, count);
  ops_.moe_router_topk(logits, options_.enable_expert_bias ? expert_bias : nullptr, count, topk_params(options_),
                       saved.topk_indices, probs, routing_map, stream_);
  if (options_.capacity_factor) {
    ops_.moe_router_capacity_drop(probs, routing_map, count, experts, expert_capacity(options_, count),
                                  options_.token_drop_policy == TokenDropPolicy::position
                                      ? kernels::MoeDropPolicy::position
                                      : kernels::MoeDropPolicy::probs,
                                  options_.pad_expert_input_to_capacity, stream_);
  }
  if (training && aux_loss_on(options_)) values.load_balancing = apply_aux_loss(logits, rows, saved, recompute);
  if (tokens_per_expert) ops_.moe_router_tokens_per_expert(routing_map, count, experts, tokens_per_expert, stream_);
  return values;
}

double Router::apply_z_loss(const float* logits, int64_t rows) {
  ops_.moe_router_z_loss_sum(logits, rows, options_.num_experts, z_sum_.data(), stream_);
  double sum = 0;
  ops_.copy(&sum, z_sum_.data(), sizeof(double), backend::CopyKind::device_to_host, stream_);
  ops_.synchronize(stream_);
  // Megatron logs z / (coeff / |tp_cp|) = this rank's mean of logsumexp^2, averaged over tp_cp.
  float mean = rows > 0 ? static_cast<float>(sum / static_cast<double>(rows)) : 0.0f;
  const int size = group_size(groups_.tp_cp);
  if (size > 1) {
    ops_.copy(z_mean_.data(), &mean, sizeof(float), backend::CopyKind::host_to_device, stream_);
    groups_.tp_cp->all_reduce(z_mean_.data(), 1, DType::f32, comm::ReduceOp::sum);
    ops_.copy(&mean, z_mean_.data(), sizeof(float), backend::CopyKind::device_to_host, stream_);
    ops_.synchronize(stream_);
    return static_cast<double>(mean) / size;
  }
  return mean;
}

// The tokens the aux loss divides by (Megatron's total_num_tokens): the reduce group's rows, or a
// sequence's rows for seq_aux_loss.
double Router::aux_total_tokens(const RouterRows& rows) const {
  if (options_.load_balancing_type == LoadBalancingType::seq_aux_loss) return static_cast<double>(rows.sequence_length);
  return static_cast<double>(rows.rows) * group_size(aux_group());
}

void Router::global_aux_weights(const float* counts, bool recompute, std::vector<float>& weights) {
  if (recompute) {
    if (global_recomputed_ >= global_means_.size()) {
      throw Error("MoE router", "global_aux_loss recompute forward without a first forward since the reset");
    }
    weights = global_means_[global_recomputed_++];
    return;
  }
  // Megatron's running mean over the global batch's micro-batches so far: the running sum
  // divided (not multiplied by a reciprocal) by the count, in fp32, on the host.
  const int64_t bytes = static_cast<int64_t>(weights.size() * sizeof(float));
  ops_.add_inplace(global_counts_.data(), counts, static_cast<int64_t>(weights.size()), stream_);
  ++global_steps_;
  ops_.copy(weights.data(), global_counts_.data(), bytes, backend::CopyKind::device_to_host, stream_);
  ops_.synchronize(stream_);
  for (float& weight : weights) weight /= static_cast<float>(global_steps_);
  global_means_.push_back(weights);
}

double Router::apply_aux_loss(const float* logits, const RouterRows& rows, const RouterSaved& saved, bool recompute) {
  const bool per_sequence = options_.load_balancing_type == LoadBalancingType::seq_aux_loss;
  const int64_t groups = per_sequence ? rows.num_sequences : 1;
  const int64_t cells = aux_weight_count(rows);
  if (!saved.aux_weights) throw Error("MoE router", "aux loss on but no aux_weights buffer saved");
  if (aux_sums_.size() < 2 * cells) {
    aux_sums_ = backend::DeviceBuffer<float>(ops_, 2 * cells, backend::MemoryCategory::activations);
  }
  float* counts = aux_sums_.data();
  float* prob_sums = counts + cells;
  ops_.moe_router_aux_sums(logits, rows.rows, options_.num_experts, options_.topk,
                           kernel_score_function(options_.score_function), per_sequence ? rows.row_ids : nullptr,
                           rows.sequence_length, groups, counts, prob_sums, stream_);
  comm::Communicator* group = aux_group();
  if (group_size(group) > 1) group->all_reduce(counts, 2 * cells, DType::f32, comm::ReduceOp::sum);
  const int64_t bytes = cells * static_cast<int64_t>(sizeof(float));
  std::vector<float> weights(static_cast<size_t>(cells)), sums(static_cast<size_t>(cells));
  if (options_.load_balancing_type == LoadBalancingType::global_aux_loss) {
    global_aux_weights(counts, recompute, weights);
    ops_.copy(sums.data(), prob_sums, bytes, backend::CopyKind::device_to_host, stream_);
    ops_.copy(saved.aux_weights, weights.data(), bytes, backend::CopyKind::host_to_device, stream_);
    ops_.synchronize(stream_);  // `weights` is read by the queued copy
  } else {
    ops_.copy(saved.aux_weights, counts, bytes, backend::CopyKind::device_to_device, stream_);
    ops_.copy(weights.data(), counts, bytes, backend::CopyKind::device_to_host, stream_);
    ops_.copy(sums.data(), prob_sums, bytes, backend::CopyKind::device_to_host, stream_);
    ops_.synchronize(stream_);
  }
  double dot = 0;
  for (size_t i = 0; i < weights.size(); ++i) dot += static_cast<double>(sums[i]) * weights[i];
  const double total = aux_total_tokens(rows);
  if (total <= 0) return 0;
  return dot * options_.num_experts / (options_.topk * total * total) / static_cast<double>(groups);
}

void Router::backward(const float* logits, const uint8_t* routing_map, const RouterSaved& saved, const RouterRows& rows,
                      const float* dprobs, float aux_loss_grad_factor, float* dlogits) const {
  check_rows(rows, true);
  const int64_t count = rows.rows;
  const int experts = options_.num_experts;
  ops_.moe_router_topk_backward(logits, saved.topk_indices, dprobs, routing_map, count, topk_params(options_), dlogits,
                                stream_);
  // Megatron's --calculate-per-token-loss pre-multiplies both losses by S x |tp_cp|.
  const double per_token =
      options_.calculate_per_token_loss ? static_cast<double>(count) * group_size(groups_.tp_cp) : 1.0;
  if (aux_loss_on(options_)) {
    const bool per_sequence = options_.load_balancing_type == LoadBalancingType::seq_aux_loss;
    const double total = aux_total_tokens(rows);
    if (total > 0) {
      const double groups = per_sequence ? static_cast<double>(rows.num_sequences) : 1.0;
      const double scale = aux_loss_grad_factor * per_token * options_.aux_loss_coeff * experts /
                           (options_.topk * total * total) / groups;
      ops_.moe_router_aux_backward(logits, count, experts, kernel_score_function(options_.score_function),
                                   per_sequence ? rows.row_ids : nullptr, rows.sequence_length,
                                   per_sequence ? rows.num_sequences : 1, saved.aux_weights, static_cast<float>(scale),
                                   dlogits, stream_);
    }
  }
  if (options_.z_loss_coeff && count > 0) {
    // z = coeff / |tp_cp| * mean_t logsumexp_t^2.
    const double scale = aux_loss_grad_factor * per_token * *options_.z_loss_coeff / group_size(groups_.tp_cp) /
                         static_cast<double>(count);
    ops_.moe_router_z_loss_backward(logits, count, experts, static_cast<float>(scale), dlogits, stream_);
  }
}

void Router::reset_global_aux_counts() {
  if (global_counts_.data()) {
    ops_.zero(global_counts_.data(), global_counts_.size() * static_cast<int64_t>(sizeof(float)), stream_);
  }
  global_steps_ = 0;
  global_means_.clear();
  global_recomputed_ = 0;
}

void update_expert_bias(const backend::Ops& ops, backend::Stream stream, float* expert_bias,
                        const float* tokens_per_expert, int num_experts, float rate) {
  if (!ops.moe_router_expert_bias_update) {
    throw Error(std::string("MoE expert bias on the ") + ops.name + " backend",
                "its op table does not fill moe_router_expert_bias_update");
  }
  ops.moe_router_expert_bias_update(expert_bias, tokens_per_expert, num_experts, rate, stream);
}

}  // namespace mt::model::moe
