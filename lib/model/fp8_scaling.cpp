// FP8 delayed-scaling state of a rank (see fp8_scaling.h).
#include "model/fp8_scaling.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "backend/op_list.h"
#include "core/error.h"

namespace mt::model {
namespace {

// Megatron's TransformerConfig checks: each count between 0 and the layers of the model.
void check_bf16_layers(const Fp8Config& config, int num_layers) {
  if (!config.first_last_layers_bf16) return;
  const std::pair<const char*, int> counts[] = {{"--num-layers-at-start-in-bf16", config.num_layers_at_start_in_bf16},
                                                {"--num-layers-at-end-in-bf16", config.num_layers_at_end_in_bf16}};
  for (const auto& [flag, count] : counts) {
    if (count < 0 || count > num_layers) {
      throw UsageError(flag, std::to_string(count) + " is not between 0 and the model's " + std::to_string(num_layers) +
                                 " layers");
    }
  }
}

}  // namespace

bool layer_runs_in_fp8(const Fp8Config& config, int layer, int num_layers) {
  if (!config.first_last_layers_bf16) return true;
  return layer >= config.num_layers_at_start_in_bf16 && layer < num_layers - config.num_layers_at_end_in_bf16;
}

bool is_fp8_weight(const Fp8Config& config, const ParamEntry& entry, int num_layers) {
  return entry.layer >= 0 && entry.layer < num_layers && entry.local_shape.size() == 2 &&
         layer_runs_in_fp8(config, entry.layer, num_layers);
}

Fp8Scaling::Fp8Scaling(const backend::Ops& ops, const Fp8Config& config, const ParamLayout& layout, int num_layers,
                       backend::MemoryLedger* ledger)
    : ops_(ops), config_(config) {
  for (const backend::OpId op : {backend::OpId::fp8_quantize, backend::OpId::fp8_transpose, backend::OpId::gemm_fp8,
                                 backend::OpId::fp8_update_scales}) {
    if (!backend::op_entry(ops, op)) {
      throw UsageError("--fp8-format", std::string("the ") + ops.name + " backend has no " + backend::op_name(op) +
                                           " entry yet (FP8 runs on the CPU backend)");
    }
  }
  if (config_.amax_history_len < 1) throw UsageError("--fp8-amax-history-len", "must be at least 1");
  if (config_.margin < 0) throw UsageError("--fp8-margin", "must be at least 0");
  check_bf16_layers(config_, num_layers);
  std::map<int, int64_t> layer_weight_elements;
  std::vector<std::pair<int64_t, std::string>> weights;  // (offset, name)
  for (const ParamEntry& entry : layout.entries) {
    if (!is_fp8_weight(config_, entry, num_layers)) continue;
    weights.emplace_back(entry.offset, entry.name);
    layer_weight_elements[entry.layer] += entry.numel;
  }
  std::sort(weights.begin(), weights.end());
  for (auto& [offset, name] : weights) {
    weight_offsets_.push_back(offset);
    weight_names_.push_back(std::move(name));
  }
  for (const auto& [layer, elements] : layer_weight_elements) weight_capacity_ = std::max(weight_capacity_, elements);
  const int64_t t = tensors();
  state_ = backend::DeviceBuffer<float>(ops, std::max<int64_t>(1, t * (3 + config_.amax_history_len)),
                                        backend::MemoryCategory::weights, ledger);
  weight_codes_ = backend::DeviceBuffer<uint8_t>(ops, std::max<int64_t>(1, 2 * weight_capacity_),
                                                 backend::MemoryCategory::activations, ledger);
  if (t > 0) ops.fill(state_.data() + t, 2 * t, 1.0f, ops.default_stream());  // scale 1, scale_inv 1 (TE's start)
}

std::vector<Fp8Scaling::StatePiece> Fp8Scaling::state_pieces(int64_t linear) {
  const int64_t t = tensors(), history_len = config_.amax_history_len;
  float* scale = state_.data() + t;
  float* scale_inv = scale + t;
  float* history = scale_inv + t;
  // The forward group's two tensors (input, weight) are adjacent; the output grad stands apart.
  const int64_t forward = tensor(linear, Fp8Operand::input), backward = tensor(linear, Fp8Operand::output_grad);
  return {StatePiece{0, 2, 0, 1, scale + forward},
          StatePiece{2, 1, 0, 1, scale + backward},
          StatePiece{0, 2, 1, 1, scale_inv + forward},
          StatePiece{2, 1, 1, 1, scale_inv + backward},
          StatePiece{0, 2, 2, history_len, history + forward * history_len},
          StatePiece{2, 1, 2, history_len, history + backward * history_len}};
}

int64_t Fp8Scaling::linear(int64_t weight_offset) const {
  const auto found = std::lower_bound(weight_offsets_.begin(), weight_offsets_.end(), weight_offset);
  if (found == weight_offsets_.end() || *found != weight_offset) return -1;
  return found - weight_offsets_.begin();
}

kernels::Fp8Type Fp8Scaling::type(Fp8Operand operand) const {
  if (operand == Fp8Operand::output_grad && config_.format == Fp8Format::hybrid) return kernels::Fp8Type::e5m2;
  return kernels::Fp8Type::e4m3;
}

int64_t Fp8Scaling::tensor(int64_t linear, Fp8Operand operand) const {
  switch (operand) {
    case Fp8Operand::input: return 2 * linear;
    case Fp8Operand::weight: return 2 * linear + 1;
    case Fp8Operand::output_grad: return 2 * linears() + linear;
  }
  return 0;
}

void Fp8Scaling::update_scales() {
  const int64_t n = linears();
  if (n == 0) return;
  const int64_t t = tensors(), history_len = config_.amax_history_len;
  float* amax = state_.data();
  float* scale = amax + t;
  float* scale_inv = scale + t;
  float* history = scale_inv + t;
  kernels::Fp8ScalingParams forward{type(Fp8Operand::input), config_.margin, history_len, config_.amax_compute_algo};
  kernels::Fp8ScalingParams backward = forward;
  backward.type = type(Fp8Operand::output_grad);
  const backend::Stream stream = ops_.default_stream();
  ops_.fp8_update_scales(amax, history, scale, scale_inv, 2 * n, forward, stream);
  ops_.fp8_update_scales(amax + 2 * n, history + 2 * n * history_len, scale + 2 * n, scale_inv + 2 * n, n, backward,
                         stream);
}

void Fp8Scaling::discard_amaxes() {
  if (tensors() > 0) ops_.zero(amaxes(), tensors() * static_cast<int64_t>(sizeof(float)), ops_.default_stream());
}

}  // namespace mt::model
