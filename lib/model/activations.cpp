// Activation slots and the stage workspace (see activations.h).
#include "model/activations.h"

#include <algorithm>

#include "core/error.h"
#include "model/layers/mtp.h"
#include "model/layers/embedding.h"

namespace mt::model {

struct ActivationPool::Chunk {
  const ActivationShape& shape;
  ActivationRows rows;
  const ChunkModules& blocks;
  const RecomputePlan& plan;
  int64_t largest_saved = 0;      // floats of the largest saved set with the core attention
  int64_t largest_workspace = 0;  // floats of the largest layer workspace
};

namespace {

int64_t saved_floats(const DecoderLayer& layer, const ActivationRows& rows, bool keep_core) {
  BufferSource counter;
  layer.lay_out_saved(counter, rows, keep_core);
  return counter.floats();
}

int64_t workspace_floats(const DecoderLayer& layer, const ActivationRows& rows, bool rebuild_core) {
  BufferSource counter;
  layer.lay_out_workspace(counter, rows, rebuild_core);
  return counter.floats();
}

// The widest row a GEMM operand of the chunk takes.
int64_t widest_gemm_operand(const ActivationShape& shape, const ChunkModules& blocks) {
  int64_t widest = std::max(shape.hidden, shape.vocab);
  for (const auto& layer : blocks.layers) widest = std::max(widest, layer->widest_gemm_operand());
  if (blocks.mtp) widest = std::max(widest, blocks.mtp->widest_gemm_operand());
  return widest;
}

}  // namespace

ActivationPool::ActivationPool(const ActivationShape& shape, const ChunkModules& blocks, const RecomputePlan& plan,
                               int slots, const backend::Ops* ops, backend::MemoryLedger* ledger,
                               const std::vector<float*>& slot_blocks)
    : ops_(ops), ledger_(ledger) {
  if (plan.recomputed.size() != blocks.layers.size()) {
    throw Error("activation pool", "a recompute plan of " + std::to_string(plan.recomputed.size()) +
                                       " layers for a chunk of " + std::to_string(blocks.layers.size()));
  }
  if (shape.has_output != (blocks.head != nullptr)) throw Error("activation pool", "the shape and the head disagree");
  Chunk chunk{shape, ActivationRows{shape.rows, shape.sequence_rows}, blocks, plan};
  for (const auto& layer : blocks.layers) {
    chunk.largest_saved = std::max(chunk.largest_saved, saved_floats(*layer, chunk.rows, true));
    chunk.largest_workspace = std::max(chunk.largest_workspace, workspace_floats(*layer, chunk.rows, plan.selective));
  }

  BufferSource slot_counter;
  SlotActivations counted;
  lay_out_slot(chunk, slot_counter, counted);
  slot_floats_ = slot_counter.floats();
  slots_.resize(slot_blocks.empty() ? static_cast<size_t>(std::max(slots, 1)) : slot_blocks.size());
  for (size_t index = 0; index < slots_.size(); ++index) {
    BufferSource source(slot_blocks.empty() ? allocate(slot_floats_) : slot_blocks[index]);
    lay_out_slot(chunk, source, slots_[index]);
  }

  BufferSource workspace_counter;
  StageWorkspace counted_workspace;
  lay_out_workspace(chunk, workspace_counter, counted_workspace);
  BufferSource source(allocate(workspace_counter.floats()));
  lay_out_workspace(chunk, source, workspace_);
}

float* ActivationPool::allocate(int64_t floats) {
  bytes_ += backend::buffer_bytes<float>(floats);
  if (!ops_) return nullptr;
  owned_.emplace_back(*ops_, floats, backend::MemoryCategory::activations, ledger_);
  return owned_.back().data();
}

// Per layer that keeps its activations: its input and its saved set (without the core attention
// under selective recompute); a recomputed group keeps only its first layer's input.
void ActivationPool::lay_out_slot(const Chunk& chunk, BufferSource& source, SlotActivations& slot) {
  const int64_t s = chunk.rows.sequence_rows, c = chunk.shape.hidden;
  const RecomputePlan& plan = chunk.plan;
  const size_t layers = chunk.blocks.layers.size();
  slot.layer_inputs.assign(layers, nullptr);
  slot.layer_saved.clear();
  slot.layer_saved.resize(layers);
  for (size_t i = 0; i < layers; ++i) {
    if (!plan.recomputed[i]) {
      slot.layer_inputs[i] = source.take(s * c);
      slot.layer_saved[i] = chunk.blocks.layers[i]->lay_out_saved(source, chunk.rows, !plan.selective);
    } else if (plan.group_start[i] == static_cast<int>(i)) {
      slot.layer_inputs[i] = source.take(s * c);
    }
  }
  slot.input = layers > 0 ? slot.layer_inputs.front() : source.take(s * c);
  if (chunk.blocks.head) {
    slot.head = chunk.blocks.head->lay_out_activations(source, chunk.rows);
    if (chunk.blocks.mtp) slot.mtp = chunk.blocks.mtp->lay_out_saved(source, chunk.rows);
  } else {
    slot.output = source.take(s * c);
  }
}

void ActivationPool::lay_out_workspace(const Chunk& chunk, BufferSource& source, StageWorkspace& w) {
  const ActivationShape& shape = chunk.shape;
  const int64_t n = chunk.rows.rows, s = chunk.rows.sequence_rows, c = shape.hidden;
  const RecomputePlan& plan = chunk.plan;
  const auto& layers = chunk.blocks.layers;
  w.recompute_saved.clear();
  w.recompute_saved.resize(layers.size());
  w.recompute_inputs.assign(static_cast<size_t>(plan.group_length), nullptr);
  if (plan.any_recomputed()) {
    // One scratch set per position of a recompute group, each as large as the largest saved
    // set; after the first, each also keeps the rebuilt input of its layer.
    std::vector<float*> scratch;
    for (int position = 0; position < plan.group_length; ++position) {
      if (position > 0) w.recompute_inputs[static_cast<size_t>(position)] = source.take(s * c);
      scratch.push_back(source.take(chunk.largest_saved));
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      if (!plan.recomputed[i]) continue;
      BufferSource set(scratch[i - static_cast<size_t>(plan.group_start[i])]);
      w.recompute_saved[i] = layers[i]->lay_out_saved(set, chunk.rows, true);
    }
  }
  float* layer_block = source.take(chunk.largest_workspace);
  w.layers.clear();
  for (const auto& layer : layers) {
    BufferSource shared(layer_block);
    w.layers.push_back(layer->lay_out_workspace(shared, chunk.rows, plan.selective));
  }
  if (shape.has_output) w.head.dloss = source.take(n);
  if (chunk.blocks.mtp) w.mtp = chunk.blocks.mtp->lay_out_workspace(source, chunk.rows);
  if (chunk.blocks.embedding && chunk.blocks.embedding->has_token_types()) w.token_type_rows = source.take(n * c);
  w.pingpong[0] = source.take(s * c);
  w.pingpong[1] = source.take(s * c);
  w.temporaries.tmp = source.take(s * c);
  w.d_stream[0] = source.take(s * c);
  w.d_stream[1] = source.take(s * c);
  w.temporaries.d_mid = source.take(s * c);
  w.temporaries.d_norm = source.take(s * c);
  w.head.d_norm = w.temporaries.d_norm;
  w.temporaries.d_part = source.take(s * c);
  if (shape.sequence_parallel) {
    // Full-row (N, C) buffers of the sequence-parallel regions, shared by every linear; the
    // embedding's partial lookups use the row-parallel partial sums' buffer.
    const SequenceParallelBuffers buffers{source.take(n * c), source.take(n * c), source.take(n * c)};
    w.temporaries.sequence_parallel = w.head.sequence_parallel = buffers;
    w.embedding_full = buffers.partial;
  }
  if (shape.precision != Precision::fp32) {
    const int64_t widest = widest_gemm_operand(shape, chunk.blocks);
    w.operands[0] = source.take(n * widest);
    w.operands[1] = source.take(n * widest);
  }
}

}  // namespace mt::model
