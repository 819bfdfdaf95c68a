// The trainer's once-per-global-batch MoE work (see moe_step.h).
#include "train/moe_step.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "model/moe/router.h"

namespace mt::train {
namespace {

bool several(const comm::Communicator* group) { return group != nullptr && group->size() > 1; }

// Tokens per expert of one layer (E counts of the global batch): min, max, coefficient of variation.
void set_token_figures(const float* counts, int experts, MoeLayerStats& stats) {
  double sum = 0, low = counts[0], high = counts[0];
  for (int e = 0; e < experts; ++e) {
    sum += counts[e];
    low = std::min(low, static_cast<double>(counts[e]));
    high = std::max(high, static_cast<double>(counts[e]));
  }
  const double mean = sum / experts;
  double squares = 0;
  for (int e = 0; e < experts; ++e) squares += (counts[e] - mean) * (counts[e] - mean);
  stats.tokens_min = static_cast<int64_t>(std::llround(low));
  stats.tokens_max = static_cast<int64_t>(std::llround(high));
  stats.tokens_cv = mean > 0 ? std::sqrt(squares / experts) / mean : 0.0;
}

}  // namespace

std::string moe_balancing_log_name(const model::ModelConfig& model) {
  if (!model.moe_has_aux_loss()) return "";
  switch (model.moe_router_load_balancing_type) {
    case model::MoeLoadBalancing::aux_loss: return "load_balancing_loss";
    case model::MoeLoadBalancing::seq_aux_loss: return "seq_load_balancing_loss";
    case model::MoeLoadBalancing::global_aux_loss: return "global_load_balancing_loss";
    default: return "";
  }
}

MoeStepStats finish_moe_step(const model::ModelConfig& model, const backend::Ops& ops, backend::Stream stream,
                             const MoeStepGroups& groups, std::vector<MoeLayerStep>& layers, int micro_batches,
                             bool per_layer_logging) {
  const int experts = model.num_experts;
  std::sort(layers.begin(), layers.end(), [](const auto& a, const auto& b) { return a.layer < b.layer; });
  // 1. The counts over TP x DP x CP, each layer's in turn (every rank of the group holds the same
  // layers: one pipeline stage), then 2. the bias moves on the summed counts.
  for (MoeLayerStep& layer : layers) {
    if (several(groups.tp_dp_cp_data)) {
      groups.tp_dp_cp_data->all_reduce(layer.tokens_per_expert, experts, DType::f32, comm::ReduceOp::sum);
    }
    if (model.moe_router_enable_expert_bias && layer.expert_bias != nullptr) {
      model::moe::update_expert_bias(ops, stream, layer.expert_bias, layer.tokens_per_expert, experts,
                                     model.moe_router_bias_update_rate);
    }
  }
  // 3. Per model layer: [balancing, z, counts (E)], this rank's layers filled, the rest zero. The
  // MoE layers of multi-token prediction depths (layers L + k) count as further MoE layers, as
  // Megatron's tracker counts them.
  const int model_layers = model.num_layers + model.mtp_num_layers;
  std::vector<int> moe_index(static_cast<size_t>(model_layers), -1);
  int moe_layers = 0;
  for (int l = 0; l < model_layers; ++l) {
    if (model.is_moe_layer(l)) moe_index[static_cast<size_t>(l)] = moe_layers++;
  }
  const size_t width = 2 + static_cast<size_t>(experts);
  std::vector<float> counts(static_cast<size_t>(experts) * layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    ops.copy(counts.data() + i * static_cast<size_t>(experts), layers[i].tokens_per_expert,
             experts * static_cast<int64_t>(sizeof(float)), backend::CopyKind::device_to_host, stream);
    ops.zero(layers[i].tokens_per_expert, experts * static_cast<int64_t>(sizeof(float)), stream);
  }
  ops.synchronize(stream);
  std::vector<double> losses(2 * static_cast<size_t>(moe_layers), 0.0);
  std::vector<double> figures(width * static_cast<size_t>(moe_layers), 0.0);
  for (size_t i = 0; i < layers.size(); ++i) {
    const size_t row = static_cast<size_t>(moe_index[static_cast<size_t>(layers[i].layer)]);
    losses[2 * row] = layers[i].load_balancing_sum / micro_batches;
    losses[2 * row + 1] = layers[i].z_loss_sum / micro_batches;
    for (int e = 0; e < experts; ++e) {
      figures[width * row + 2 + static_cast<size_t>(e)] = counts[i * static_cast<size_t>(experts) + static_cast<size_t>(e)];
    }
  }
  // The losses' average over DP x CP (equal over CP), then every stage's layers to every rank.
  if (several(groups.dp_cp_control)) {
    groups.dp_cp_control->all_reduce(losses.data(), static_cast<int64_t>(losses.size()), DType::f64, comm::ReduceOp::sum);
    for (double& value : losses) value /= groups.dp_cp_control->size();
  }
  for (size_t row = 0; row < static_cast<size_t>(moe_layers); ++row) {
    figures[width * row] = losses[2 * row];
    figures[width * row + 1] = losses[2 * row + 1];
  }
  if (several(groups.pp_control)) {
    groups.pp_control->all_reduce(figures.data(), static_cast<int64_t>(figures.size()), DType::f64, comm::ReduceOp::sum);
  }
  MoeStepStats stats;
  stats.balancing_name = moe_balancing_log_name(model);
  stats.per_layer_losses = per_layer_logging;
  double balancing = 0, z = 0;
  std::vector<float> layer_counts(static_cast<size_t>(experts));
  for (int l = 0; l < model_layers; ++l) {
    if (moe_index[static_cast<size_t>(l)] < 0) continue;
    const double* row = figures.data() + width * static_cast<size_t>(moe_index[static_cast<size_t>(l)]);
    MoeLayerStats layer;
    layer.layer = l;
    layer.load_balancing_loss = row[0];
    layer.z_loss = row[1];
    for (int e = 0; e < experts; ++e) layer_counts[static_cast<size_t>(e)] = static_cast<float>(row[2 + e]);
    set_token_figures(layer_counts.data(), experts, layer);
    balancing += layer.load_balancing_loss;
    z += layer.z_loss;
    stats.layers.push_back(layer);
  }
  // Megatron's divisor (moe_utils.py track_moe_metrics): the decoder's MoE layers plus every MTP
  // depth, MoE or not.
  const int logged_layers = model.moe_layer_count() + model.mtp_num_layers;
  if (logged_layers > 0) {
    stats.balancing_loss = balancing / logged_layers;
    if (model.moe_z_loss_coeff) stats.z_loss = z / logged_layers;
  }
  return stats;
}

}  // namespace mt::train
