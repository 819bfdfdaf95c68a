// The activation buffers of a stage, sized once for its micro-batch: a pool of slots (what each
// micro-batch in flight keeps from forward to backward, by recompute policy) and one workspace of
// temporaries every slot shares (backward runs one micro-batch at a time). The same code counts
// the bytes without allocating, so a configuration that cannot fit is refused before anything is
// allocated (planned_activation_bytes). Every buffer is an activations DeviceBuffer reported to
// the stage's ledger. Tested by tests/unit/model/test_transformer.cpp (planned equals measured,
// ordering across recompute policies, linear in T) and tests/unit/model/test_stage.cpp (slots).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/memory.h"
#include "core/dtype.h"
#include "model/layers/output_head.h"
#include "model/layers/transformer_layer.h"
#include "model/recompute.h"

namespace mt::model {

// The local widths and counts the buffers are sized by.
struct ActivationShape {
  int64_t rows = 0;             // tokens of a full micro-batch on this rank
  int64_t sequence_rows = 0;    // rows of the sequence-parallel region (rows / TP under SP)
  int64_t hidden = 0;
  int64_t qkv = 0;              // local (q heads + 2 kv heads) * head_dim
  int64_t attention = 0;        // local q heads * head_dim
  int64_t q_heads = 0;          // local
  int64_t ffn = 0;              // local
  int64_t fc1 = 0;              // ffn, or 2 ffn with SwiGLU
  int64_t vocab = 0;            // local logits width (the last chunk), else 0
  int layers = 0;
  bool layernorm = true;
  bool has_embedding = true;
  bool has_output = true;
  bool sequence_parallel = false;
  Precision precision = Precision::fp32;
};

// Temporaries shared by every slot.
struct StageWorkspace {
  std::vector<LayerActivations> scratch;  // recompute sets: one per layer of a recompute group
  LayerWorkspace layer;
  HeadWorkspace head;
  float* pingpong[2] = {nullptr, nullptr};  // (S, C) outputs of layers whose outputs are not kept
  float* d_stream[2] = {nullptr, nullptr};  // (S, C) residual-stream grads
  float* embedding_full = nullptr;          // (N, C) embedding partial lookups, SP only
  float* operands[2] = {nullptr, nullptr};  // GEMM operands in the precision (rows * widest each)
};

// What one micro-batch in flight keeps.
struct SlotActivations {
  std::vector<LayerActivations> layers;  // per layer of the chunk, by recompute policy
  float* input = nullptr;   // (S, C) the chunk's input: embedding output or received activation
  float* output = nullptr;  // (S, C) the chunk's output (a chunk without the head)
  HeadActivations head;     // the last chunk
};

class ActivationPool {
 public:
  // Allocates on `ops` (reporting to `ledger`), or only counts when `ops` is null. With
  // `slot_blocks` the slots are laid out in those blocks instead (one slot per block, each at
  // least slot_floats() long, owned by the caller, who may lay other pools' slots in the same
  // blocks: a rank's model chunks share one pool of slots, train/trainer.h); then `slots` is
  // ignored and bytes() counts the workspace only.
  ActivationPool(const ActivationShape& shape, const RecomputePlan& plan, int slots, const backend::Ops* ops,
                 backend::MemoryLedger* ledger, const std::vector<float*>& slot_blocks = {});

  int64_t bytes() const { return bytes_; }
  // Floats one slot takes in a block (its buffers 64-byte aligned, back to back).
  int64_t slot_floats() const { return slot_floats_; }
  int slots() const { return static_cast<int>(slots_.size()); }
  SlotActivations& slot(int index) { return slots_.at(static_cast<size_t>(index)); }
  StageWorkspace& workspace() { return workspace_; }

 private:
  float* take(int64_t count);
  LayerActivations layer_set(const ActivationShape& shape, bool with_input, bool with_attention);

  const backend::Ops* ops_;
  backend::MemoryLedger* ledger_;
  int64_t bytes_ = 0;
  int64_t slot_floats_ = 0;
  int64_t taken_floats_ = 0;  // every buffer taken so far, 64-byte aligned
  // The caller's block the slot being laid out goes in (null: own buffers), and where it starts.
  float* block_ = nullptr;
  int64_t block_start_ = 0;
  std::vector<backend::DeviceBuffer<float>> owned_;
  std::vector<SlotActivations> slots_;
  StageWorkspace workspace_;
};

}  // namespace mt::model
