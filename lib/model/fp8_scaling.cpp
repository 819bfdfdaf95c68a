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
  if (entry.local_shape.size() != 2 || is_moe_router(entry) || entry.layer < 0) return false;
  if (entry.layer < num_layers) return layer_runs_in_fp8(config, entry.layer, num_layers);
  // Layer ids L + k: an MTP depth's eh_proj and its layer's linears, not the output layer nor the
  // word table's copy, which share depth 0's id.
  return entry.name.rfind("mtp.layers.", 0) == 0 || entry.name.rfind("decoder.layers.", 0) == 0;
}

bool is_moe_router(const ParamEntry& entry) {
  static const std::string router = ".mlp.router.weight";
  return entry.name.size() >= router.size() && entry.name.compare(entry.name.size() - router.size(), router.size(), router) == 0;
}

Fp8Scaling::Fp8Scaling(const backend::Ops& ops, const Fp8Config& config, const ParamLayout& layout, int num_layers,
                       backend::MemoryLedger* ledger)
    : ops_(ops), config_(config), ledger_(ledger) {
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
  weight_cached_.assign(static_cast<size_t>(linears()), 0);
  reserve_slots(1);
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

uint8_t* Fp8Scaling::padding_codes(int64_t bytes) {
  if (padding_codes_.size() < bytes) {
    padding_codes_ = backend::DeviceBuffer<uint8_t>(ops_, bytes, backend::MemoryCategory::activations, ledger_);
  }
  return padding_codes_.data();
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
  update_group(true);
  update_group(false);
}

// The forward group (input, weight of every linear: tensors [0, 2n)) or the backward group (output
// grads: [2n, 3n)).
void Fp8Scaling::update_group(bool forward) {
  const int64_t n = linears();
  if (n == 0) return;
  const int64_t t = tensors(), history_len = config_.amax_history_len;
  const int64_t first = forward ? 0 : 2 * n, count = forward ? 2 * n : n;
  float* amax = state_.data() + first;
  float* scale = state_.data() + t + first;
  float* scale_inv = state_.data() + 2 * t + first;
  float* history = state_.data() + 3 * t + first * history_len;
  const kernels::Fp8ScalingParams params{type(forward ? Fp8Operand::input : Fp8Operand::output_grad), config_.margin,
                                         history_len, config_.amax_compute_algo};
  ops_.fp8_update_scales(amax, history, scale, scale_inv, count, params, ops_.default_stream());
}

// ---- TE's timing -----------------------------------------------------------------------------

void Fp8Scaling::reserve_slots(int slots) {
  if (slots <= slots_) return;
  slots_ = slots;
  const int64_t n = linears();
  snapshots_ = backend::DeviceBuffer<float>(ops_, 1 + 2 * n + 2 * n * slots_, backend::MemoryCategory::activations,
                                            ledger_);
  ops_.zero(snapshots_.data(), 1 * static_cast<int64_t>(sizeof(float)), ops_.default_stream());
  std::fill(weight_cached_.begin(), weight_cached_.end(), 0);
}

void Fp8Scaling::start_step() { std::fill(weight_cached_.begin(), weight_cached_.end(), 0); }

void Fp8Scaling::begin_forward(int slot, bool training) {
  if (slot < 0 || slot >= slots_) {
    throw Error("FP8 activation slot " + std::to_string(slot), "outside the " + std::to_string(slots_) + " reserved");
  }
  phase_ = last_pass_ = training ? Fp8Phase::forward : Fp8Phase::evaluation;
  slot_ = slot;
}

void Fp8Scaling::end_forward() {
  const bool training = phase_ == Fp8Phase::forward;
  phase_ = Fp8Phase::outside;
  if (!training || linears() == 0) return;
  if (reduce_) reduce_(amaxes(), 2 * linears());
  update_group(true);
}

void Fp8Scaling::begin_backward(int slot) {
  begin_forward(slot, true);
  phase_ = last_pass_ = Fp8Phase::backward;
}

void Fp8Scaling::end_backward() {
  phase_ = Fp8Phase::outside;
  if (linears() == 0) return;
  if (reduce_) reduce_(amaxes() + 2 * linears(), linears());
  update_group(false);
}

void Fp8Scaling::begin_region() {
  if (last_pass_ == Fp8Phase::outside) throw Error("FP8 region", "no forward or backward to re-enter");
  phase_ = last_pass_;
}

void Fp8Scaling::end_region() {
  if (phase_ == Fp8Phase::backward) {
    end_backward();
  } else {
    end_forward();
  }
}

void Fp8Scaling::begin_recompute() {
  phase_before_recompute_ = phase_;
  phase_ = Fp8Phase::recompute;
}

void Fp8Scaling::end_recompute() { phase_ = phase_before_recompute_; }

void Fp8Scaling::copy_float(float* to, const float* from) const {
  ops_.copy(to, from, static_cast<int64_t>(sizeof(float)), backend::CopyKind::device_to_device, ops_.default_stream());
}

Fp8Scaling::Quantization Fp8Scaling::quantization(int64_t linear, Fp8Operand operand) {
  const Quantization live{scale(linear, operand), scale_inv(linear, operand), amax(linear, operand)};
  float* discarded = snapshot(0);
  if (phase_ == Fp8Phase::outside) return live;
  if (phase_ == Fp8Phase::evaluation) return {live.scale, live.scale_inv, discarded};
  const int64_t n = linears();
  switch (operand) {
    case Fp8Operand::output_grad:  // the live backward scale; only the backward records it
      return {live.scale, live.scale_inv, phase_ == Fp8Phase::backward ? live.amax : discarded};
    case Fp8Operand::weight: {  // the step's cached FP8 weight (is_first_microbatch)
      float* cached_scale = snapshot(1 + linear);
      float* cached_scale_inv = snapshot(1 + n + linear);
      char& cached = weight_cached_[static_cast<size_t>(linear)];
      if (phase_ == Fp8Phase::forward && !cached) {
        copy_float(cached_scale, live.scale);
        copy_float(cached_scale_inv, live.scale_inv);
        cached = 1;
        return {cached_scale, cached_scale_inv, live.amax};
      }
      if (!cached) throw Error("FP8 linear " + weight_name(linear), "its weight has no forward in this step");
      return {cached_scale, cached_scale_inv, discarded};
    }
    case Fp8Operand::input: {  // the scale of the slot's forward (the input TE saved in FP8)
      float* slot_scale = snapshot(1 + 2 * n + 2 * n * slot_ + linear);
      float* slot_scale_inv = slot_scale + n;
      if (phase_ != Fp8Phase::forward) return {slot_scale, slot_scale_inv, discarded};
      copy_float(slot_scale, live.scale);
      copy_float(slot_scale_inv, live.scale_inv);
      return {slot_scale, slot_scale_inv, live.amax};
    }
  }
  return live;
}

void Fp8Scaling::discard_amaxes() {
  if (tensors() > 0) ops_.zero(amaxes(), tensors() * static_cast<int64_t>(sizeof(float)), ops_.default_stream());
}

}  // namespace mt::model
