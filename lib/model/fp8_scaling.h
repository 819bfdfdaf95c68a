// FP8 training state of one rank (issue 23): Transformer Engine's delayed scaling for the linears
// of the decoder layers. Each such linear has three FP8 tensors: its input and its weight (the
// forward group, e4m3) and its output grad (the backward group: e5m2 under --fp8-format hybrid,
// e4m3 under e4m3), each with an amax, a scale, its inverse and an amax history on the device,
// all in one contiguous buffer so one all-reduce MAX covers a group. PrecisionGemm
// (model/precision_gemm.h) quantizes with the scales the current phase names (quantization()) and
// accumulates the amaxes.
// When the scales change is Transformer Engine's timing (TE 1.x fp8.py / 2.x quantization.py
// FP8GlobalStateManager; Megatron-Core wraps each micro-batch's decoder layers in one
// fp8_autocast): after every training micro-batch's forward (end_forward: TE's outermost
// fp8_autocast exit) the forward group's amaxes (inputs, weights) are reduced over the amax group
// (the trainer's hook: TP x DP x CP) and every forward tensor's history and scale updated; after
// every micro-batch's backward (end_backward: the end of the first FP8 module's backward, TE's
// reduce_and_update_bwd_fp8_tensors) the same for the backward group (output grads). What the
// GEMMs of a micro-batch use, as TE's saved FP8 tensors do: the input codes of its forward (its
// backward and a recompute quantize with the input scale its forward used, kept per activation
// slot), the weight codes of the step's first forward of that linear (Megatron passes
// is_first_microbatch: later micro-batches reuse the cached FP8 weight, record no weight amax and
// push a zero into its history), the output grad with the live backward scale. Evaluation
// forwards use the live scales and feed no amax (TE updates nothing outside grad mode).
// Multi-token prediction (model/layers/mtp.h) adds two such fp8_autocasts per depth after the
// decoder's, one around eh_proj and one around the depth's layer, each ending in a forward-group
// update; in the backward each ends in a backward-group update after the backward of its first
// FP8 module (the layer's, then eh_proj's), before the decoder's (begin_region, end_region).
// What runs in FP8 (Megatron with Transformer Engine): the linears of the transformer layers
// (qkv, projection, fc1, fc2; in a MoE layer each local expert's fc1 and fc2 and the shared
// expert's, not the router: model/moe/experts.h) and of the MTP depths (eh_proj and the depth's
// layer, whatever --first-last-layers-bf16 says: Megatron's MTP takes get_fp8_context without a
// layer number), not the embedding nor the output layer; with
// --first-last-layers-bf16 not the first --num-layers-at-start-in-bf16 nor the last
// --num-layers-at-end-in-bf16 layers either (Megatron's is_first_last_bf16_layer: their GEMMs
// take the run's bf16/fp16 path and have no FP8 state); with --no-fp8-wgrad a linear's
// weight-gradient GEMM takes that path too (TE's override_linear_precision wgrad), its forward and
// input-gradient GEMMs staying FP8. The arithmetic of one element and one tensor's update:
// kernels/common/fp8.h (sources and rules in its header).
// A checkpoint holds each FP8 linear's state (TE's extra_state): state_pieces says where.
// Tested in tests/unit/model/test_fp8_gemm.cpp, tests/unit/model/test_fp8_state_selection.cpp,
// tests/unit/model/test_fp8_microbatch_scaling.cpp (the timing against a reference loop of TE's),
// tests/unit/model/test_fp8_experts.cpp (MoE experts, the EP amax merge),
// tests/unit/train/test_fp8_training.cpp and tests/unit/train/test_fp8_state_checkpoint.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "kernels/common/fp8.h"
#include "model/layout.h"

namespace mt::model {

// Megatron's --fp8-format: e4m3 everywhere, or hybrid (e4m3 forward, e5m2 gradients).
enum class Fp8Format { e4m3, hybrid };

// The FP8 flags of a run (Megatron's defaults); enabled is --fp8-format given.
struct Fp8Config {
  bool enabled = false;
  Fp8Format format = Fp8Format::hybrid;
  int margin = 0;                                                      // --fp8-margin
  int64_t amax_history_len = 1;                                        // --fp8-amax-history-len
  kernels::Fp8AmaxAlgo amax_compute_algo = kernels::Fp8AmaxAlgo::most_recent;  // --fp8-amax-compute-algo
  bool first_last_layers_bf16 = false;                                 // --first-last-layers-bf16
  int num_layers_at_start_in_bf16 = 1;                                 // --num-layers-at-start-in-bf16
  int num_layers_at_end_in_bf16 = 1;                                   // --num-layers-at-end-in-bf16
  bool wgrad = true;                                                   // false: --no-fp8-wgrad
};

// Whether decoder layer `layer` (global index) of a model of `num_layers` layers runs its linears
// in FP8: not with --first-last-layers-bf16 when it is among the first or last layers it names.
bool layer_runs_in_fp8(const Fp8Config& config, int layer, int num_layers);
// Whether `entry` of a layout is the weight of an FP8 linear (a 2-D weight of an FP8 layer, not
// a MoE router's, or of an MTP depth: mtp.layers.<k>.eh_proj and decoder.layers.<L + k>.).
bool is_fp8_weight(const Fp8Config& config, const ParamEntry& entry, int num_layers);
// A MoE layer's router weight (...mlp.router.weight): Megatron's TopKRouter multiplies it in the
// input dtype or fp32 (a plain parameter, no TE module), never in FP8.
bool is_moe_router(const ParamEntry& entry);

// The three FP8 tensors of a linear.
enum class Fp8Operand { input, weight, output_grad };

// Which pass the GEMMs run in (see the header comment). `outside`: no phase set (a GEMM called on
// its own, as the unit tests do): live scales, every amax recorded.
enum class Fp8Phase { outside, forward, evaluation, recompute, backward };

class Fp8Scaling {
 public:
  // The weights of `layout` that is_fp8_weight names (the decoder layers' and the MTP depths')
  // are the FP8 linears; a fused group's GEMM starts at one of them. Throws UsageError when `ops` lacks an FP8 entry.
  Fp8Scaling(const backend::Ops& ops, const Fp8Config& config, const ParamLayout& layout, int num_layers,
             backend::MemoryLedger* ledger = nullptr);

  const Fp8Config& config() const { return config_; }
  // The linear whose GEMM weight starts at `weight_offset`, or -1 when it is not an FP8 linear.
  int64_t linear(int64_t weight_offset) const;
  int64_t linears() const { return static_cast<int64_t>(weight_offsets_.size()); }
  // The name of a linear's weight in the layout ("decoder.layers.0.self_attention.linear_q.weight").
  const std::string& weight_name(int64_t linear) const { return weight_names_[static_cast<size_t>(linear)]; }
  kernels::Fp8Type type(Fp8Operand operand) const;
  float* amax(int64_t linear, Fp8Operand operand) { return amaxes() + tensor(linear, operand); }
  const float* scale(int64_t linear, Fp8Operand operand) const { return state_.data() + tensors() + tensor(linear, operand); }
  const float* scale_inv(int64_t linear, Fp8Operand operand) const {
    return state_.data() + 2 * tensors() + tensor(linear, operand);
  }
  // The tensor's amax history (history_len floats, newest first).
  const float* amax_history(int64_t linear, Fp8Operand operand) const {
    return state_.data() + 3 * tensors() + tensor(linear, operand) * config_.amax_history_len;
  }
  // Scratch for a weight's codes and their transpose (the largest fused weight of a layer).
  uint8_t* weight_codes() { return weight_codes_.data(); }
  uint8_t* weight_codes_transposed() { return weight_codes_.data() + weight_capacity_; }
  int64_t weight_capacity() const { return weight_capacity_; }
  // Scratch of at least `bytes` bytes for an expert's FP8 operands padded to 16 rows
  // (PrecisionGemm::set_fp8_rows_padded, model::Fp8RowPadding); grows on demand.
  uint8_t* padding_codes(int64_t bytes);

  // The amaxes gathered since the last update of every tensor (forward group, then backward
  // group), one array.
  float* amaxes() { return state_.data(); }
  int64_t tensors() const { return 3 * linears(); }
  // Delayed-scaling update of every tensor (the amaxes as they stand); zeroes the amaxes.
  void update_scales();
  // Drops the amaxes gathered since the last update.
  void discard_amaxes();

  // ---- TE's timing (see the header comment) ----
  // Activation slots a stage keeps in flight (each stage calls it with its count; the largest wins).
  void reserve_slots(int slots);
  // Reduces `count` amaxes in place over the amax group (MAX); called before each group's update.
  // Unset: no reduction (one rank).
  void set_amax_reduction(std::function<void(float* amaxes, int64_t count)> reduce) { reduce_ = std::move(reduce); }
  // A training step begins: each weight quantizes afresh (and records its amax) at its next forward.
  void start_step();
  // A stage's forward of activation slot `slot` begins; `training` false: an evaluation forward.
  void begin_forward(int slot, bool training);
  // The forward ends: a training forward reduces and updates the forward group.
  void end_forward();
  // Backward of `slot` begins / ends (the end reduces and updates the backward group).
  void begin_backward(int slot);
  void end_backward();
  // Megatron's MTP layer runs eh_proj and the depth's layer each in an fp8_autocast of its own
  // (transformer/multi_token_prediction.py): a region re-enters the pass of the last begin_forward
  // or begin_backward (its slot; training, evaluation or backward), and its end closes it as
  // end_forward or end_backward would (a training pass's group reduced and updated).
  void begin_region();
  void end_region();
  // A recompute inside the backward re-runs forwards with the slot's forward scales, recording nothing.
  void begin_recompute();
  void end_recompute();
  Fp8Phase phase() const { return phase_; }
  // What a GEMM of `linear` quantizes `operand` with now: the scale, its inverse for the GEMM, and
  // the amax the quantize accumulates into (a scratch float when the phase records nothing).
  struct Quantization {
    const float* scale = nullptr;
    const float* scale_inv = nullptr;
    float* amax = nullptr;
  };
  Quantization quantization(int64_t linear, Fp8Operand operand);

  // A linear's state as its checkpoint tensor holds it, a (3, 2 + history_len) matrix: rows input,
  // weight, output grad; columns scale, scale_inv, then the amax history newest first (TE's
  // extra_state keeps scale and amax_history per forward and backward group). The running amaxes
  // are not part of it: they are zero between steps, when checkpoints are written. Each piece is
  // the block rows [row, row + rows) x columns [column, column + columns) of that matrix, stored
  // row-major at `data` (device memory of the ops).
  struct StatePiece {
    int64_t row = 0, rows = 0, column = 0, columns = 0;
    float* data = nullptr;
  };
  std::vector<StatePiece> state_pieces(int64_t linear);
  int64_t state_columns() const { return 2 + config_.amax_history_len; }

 private:
  int64_t tensor(int64_t linear, Fp8Operand operand) const;
  void update_group(bool forward);
  // Copies one float of device memory (a scale into its snapshot).
  void copy_float(float* to, const float* from) const;
  float* snapshot(int64_t offset) { return snapshots_.data() + offset; }

  const backend::Ops& ops_;
  Fp8Config config_;
  std::vector<int64_t> weight_offsets_;  // ascending
  std::vector<std::string> weight_names_;  // in the order of weight_offsets_
  int64_t weight_capacity_ = 0;
  // amax[T], scale[T], scale_inv[T], history[T][history_len]; T = 3 linears: the forward group
  // (input, weight of each linear), then the backward group (output grads).
  backend::DeviceBuffer<float> state_;
  backend::DeviceBuffer<uint8_t> weight_codes_;
  backend::DeviceBuffer<uint8_t> padding_codes_;  // empty until an expert's rows need padding
  backend::MemoryLedger* ledger_ = nullptr;
  // The phase's snapshots: the discarded amax, the step's cached weight scale[n] and
  // scale_inv[n], then per activation slot the input scale[n] and scale_inv[n] of its forward.
  backend::DeviceBuffer<float> snapshots_;
  int slots_ = 0;
  std::vector<char> weight_cached_;  // per linear: quantized since start_step
  std::function<void(float*, int64_t)> reduce_;
  Fp8Phase phase_ = Fp8Phase::outside;
  Fp8Phase phase_before_recompute_ = Fp8Phase::outside;
  Fp8Phase last_pass_ = Fp8Phase::outside;  // what begin_region re-enters
  int slot_ = 0;
};

}  // namespace mt::model
