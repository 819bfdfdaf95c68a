// The trainer's once-per-global-batch work for mixture-of-experts layers (issue 22), after the
// step's pipeline and its grad sync and before the optimizer's step, as Megatron's
// finalize_model_grads (_update_router_expert_bias) and training_log (track_moe_metrics) do it:
//
//   1. Each MoE layer's tokens per expert after dropping, accumulated on the device by the step's
//      training forwards (not by recompute, not by evaluation), are summed over TP x DP x CP (one
//      all-reduce per layer over the tp_dp_cp data group, in layer order: every rank of the group
//      holds the same layers), so every rank of a pipeline stage holds the global batch's counts.
//   2. With --moe-router-enable-expert-bias every layer's bias moves by rate * sign(mean - count)
//      (the same on every rank: the counts are equal there), then the counts are zeroed.
//   3. The step's figures (train/trainer.h, MoeStepStats): per layer the logged aux and z-loss
//      values (each micro-batch's already summed over its reduce group by the router) averaged
//      over the rank's micro-batches and over DP x CP (equal over CP; global_aux_loss's value is
//      equal over DP too, so the average leaves it as it is), the tokens' min, max and coefficient
//      of variation; then every layer of every stage by one sum over the pipeline group, the
//      losses' means over the model's MoE layers.
//
// The counts' host copy is one synchronize of the stream. Every rank of the world calls it once
// per step, with the layers of its stages (a stage with no MoE layer passes none: the collectives
// are issued all the same, so no rank waits for another in a different order).
// Tested in tests/unit/train/test_moe_step.cpp (one rank, the formulas) and through the trainer
// in tests/tools/mt-train.bats and tests/tools/mt-train-mpi.bats (layouts against one rank).
#pragma once

#include <vector>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "model/config.h"
#include "train/trainer.h"

namespace mt::train {

// One MoE layer of this rank's stages over the step.
struct MoeLayerStep {
  int layer = 0;                       // global decoder layer index
  float* tokens_per_expert = nullptr;  // (E) device: the step's counts after dropping; zeroed here
  float* expert_bias = nullptr;        // (E) device, moved here; null without the expert bias
  // The logged values the layer's router returned, summed over this rank's training micro-batches.
  double load_balancing_sum = 0;
  double z_loss_sum = 0;
};

// The groups the step's MoE work reduces over (nullable or of size 1: this rank alone).
struct MoeStepGroups {
  comm::Communicator* tp_dp_cp_data = nullptr;  // data: the counts
  comm::Communicator* dp_cp_control = nullptr;  // control: the losses' DP average
  comm::Communicator* pp_control = nullptr;     // control: every stage's layers to every rank
};

// Megatron's log name of the model's balancing loss ("load_balancing_loss", ...; "" when the
// model has none: --moe-router-load-balancing-type none or a zero --moe-aux-loss-coeff).
std::string moe_balancing_log_name(const model::ModelConfig& model);

// Steps 1-3 above for `layers` (this rank's MoE layers, any order) after a step of
// `micro_batches` micro-batches on this rank. Collective over the three groups.
MoeStepStats finish_moe_step(const model::ModelConfig& model, const backend::Ops& ops, backend::Stream stream,
                             const MoeStepGroups& groups, std::vector<MoeLayerStep>& layers, int micro_batches,
                             bool per_layer_logging);

}  // namespace mt::train
