// The activation buffers of a stage, sized once for its micro-batch: a pool of slots (what each
// micro-batch in flight keeps from forward to backward, by recompute policy) and one workspace of
// temporaries every slot shares (backward runs one micro-batch at a time). Each block lays out its
// own buffers (model/layers/block.h); the pool holds what every layer shares: the residual stream
// (each kept layer's input, the chunk's input and output, ping-pong outputs and the stream's
// grads), the (S, C) temporaries of a layer's pass, the sequence-parallel full-row buffers (shared
// with the head and the embedding), the GEMM operand buffers and the head's activations. The
// per-layer workspace is one block sized by the largest layer of the chunk, and so is each
// recompute scratch set, into which every recomputed layer lays its saved set, so a chunk may mix
// layers of different kinds and widths. Every buffer is rounded to 64 bytes. The same code counts
// the bytes without allocating, so a configuration that cannot fit is refused before anything is
// allocated (planned_activation_bytes). The memory is activations DeviceBuffers reported to the
// stage's ledger: one per slot and one for the workspace. Tested by
// tests/unit/model/test_model_gradients.cpp (planned equals measured, ordering across recompute
// policies, linear in T), tests/unit/model/test_stage.cpp (slots) and
// tests/unit/model/test_spec.cpp (a chunk of mixed widths).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/memory.h"
#include "core/dtype.h"
#include "model/layers/decoder_layer.h"
#include "model/layers/output_head.h"
#include "model/recompute.h"
#include "model/spec.h"

namespace mt::model {

// What every block of the chunk shares: the rows, the residual stream's width and the chunk's ends.
struct ActivationShape {
  int64_t rows = 0;           // tokens of a full micro-batch on this rank
  int64_t sequence_rows = 0;  // rows of the sequence-parallel region (rows / TP under SP)
  int64_t hidden = 0;
  int64_t vocab = 0;          // local logits width (the last chunk), else 0
  bool has_embedding = true;
  bool has_output = true;
  bool sequence_parallel = false;
  Precision precision = Precision::fp32;
};

// Temporaries shared by every slot.
struct StageWorkspace {
  std::vector<std::unique_ptr<BlockBuffers>> layers;           // per layer: its workspace (one shared block)
  std::vector<std::unique_ptr<BlockBuffers>> recompute_saved;  // per layer: its saved set in a recompute
                                                               // scratch set (null unless recomputed)
  std::vector<float*> recompute_inputs;  // (S, C) per position of a recompute group: the rebuilt input
                                         // (position 0 reads the group's kept input: null)
  LayerTemporaries temporaries;
  HeadWorkspace head;
  float* pingpong[2] = {nullptr, nullptr};  // (S, C) outputs of layers whose outputs are not kept
  float* d_stream[2] = {nullptr, nullptr};  // (S, C) residual-stream grads
  float* embedding_full = nullptr;          // (N, C) embedding partial lookups, SP only
  float* token_type_rows = nullptr;         // (N, C) BERT's token-type lookups (an embedding with token types)
  float* operands[2] = {nullptr, nullptr};  // GEMM operands in the precision (rows * widest each)
  std::unique_ptr<BlockBuffers> mtp;        // the multi-token prediction block's (model/layers/mtp.h)
};

// What one micro-batch in flight keeps.
struct SlotActivations {
  std::vector<float*> layer_inputs;                        // (S, C) per layer: its kept input, null
                                                           // when rebuilt from its group's
  std::vector<std::unique_ptr<BlockBuffers>> layer_saved;  // per layer: what backward needs (null:
                                                           // recomputed)
  float* input = nullptr;   // (S, C) the chunk's input: embedding output or received activation
  float* output = nullptr;  // (S, C) the chunk's output (a chunk without the head)
  HeadActivations head;     // the last chunk
  std::unique_ptr<BlockBuffers> mtp;  // the multi-token prediction block's saved set (beside the head)
};

class ActivationPool {
 public:
  // For the (bound) blocks of a chunk. Allocates on `ops` (reporting to `ledger`), or only counts
  // when `ops` is null. With `slot_blocks` the slots are laid out in those blocks instead (one
  // slot per block, each at least slot_floats() long, owned by the caller, who may lay other
  // pools' slots in the same blocks: a rank's model chunks share one pool of slots,
  // train/trainer.h); then `slots` is ignored and bytes() counts the workspace only.
  ActivationPool(const ActivationShape& shape, const ChunkModules& blocks, const RecomputePlan& plan, int slots,
                 const backend::Ops* ops, backend::MemoryLedger* ledger, const std::vector<float*>& slot_blocks = {});

  int64_t bytes() const { return bytes_; }
  // Floats one slot takes in a block (its buffers 64-byte aligned, back to back).
  int64_t slot_floats() const { return slot_floats_; }
  int slots() const { return static_cast<int>(slots_.size()); }
  SlotActivations& slot(int index) { return slots_.at(static_cast<size_t>(index)); }
  StageWorkspace& workspace() { return workspace_; }

 private:
  // What the layout of a chunk's buffers reads (for the constructor's duration).
  struct Chunk;
  static void lay_out_slot(const Chunk& chunk, BufferSource& source, SlotActivations& slot);
  static void lay_out_workspace(const Chunk& chunk, BufferSource& source, StageWorkspace& workspace);
  float* allocate(int64_t floats);

  const backend::Ops* ops_;
  backend::MemoryLedger* ledger_;
  int64_t bytes_ = 0;
  int64_t slot_floats_ = 0;
  std::vector<backend::DeviceBuffer<float>> owned_;
  std::vector<SlotActivations> slots_;
  StageWorkspace workspace_;
};

}  // namespace mt::model
