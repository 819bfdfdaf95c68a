// Activation slots and the stage workspace (see activations.h).
#include "model/activations.h"

#include <algorithm>

namespace mt::model {

ActivationPool::ActivationPool(const ActivationShape& shape, const RecomputePlan& plan, int slots,
                               const backend::Ops* ops, backend::MemoryLedger* ledger,
                               const std::vector<float*>& slot_blocks)
    : ops_(ops), ledger_(ledger) {
  const int64_t n = shape.rows, s = shape.sequence_rows, c = shape.hidden;
  const bool any_recomputed = plan.any_recomputed();

  slots_.resize(slot_blocks.empty() ? static_cast<size_t>(std::max(slots, 1)) : slot_blocks.size());
  for (size_t index = 0; index < slots_.size(); ++index) {
    SlotActivations& slot = slots_[index];
    block_ = slot_blocks.empty() ? nullptr : slot_blocks[index];
    block_start_ = taken_floats_;
    slot.layers.resize(static_cast<size_t>(shape.layers));
    for (int i = 0; i < shape.layers; ++i) {
      LayerActivations& layer = slot.layers[static_cast<size_t>(i)];
      if (!plan.recomputed[static_cast<size_t>(i)]) {
        layer = layer_set(shape, true, !plan.selective);
      } else if (plan.group_start[static_cast<size_t>(i)] == i) {
        layer.x_in = take(s * c);  // a recomputed group keeps only its input
      }
    }
    slot.input = shape.layers > 0 ? slot.layers.front().x_in : take(s * c);
    if (shape.has_output) {
      HeadActivations& head = slot.head;
      head.final_hidden = take(s * c);
      head.final_norm = take(s * c);
      if (shape.layernorm) head.final_mean = take(s);
      head.final_rstd = take(s);
      head.logits = take(n * shape.vocab);
      head.row_max = take(n);
      head.row_sumexp = take(n);
      head.target_logit = take(n);
    } else {
      slot.output = take(s * c);
    }
    if (index == 0) slot_floats_ = taken_floats_ - block_start_;
  }
  block_ = nullptr;

  StageWorkspace& w = workspace_;
  if (any_recomputed) {
    // The first set of a group reads the group's kept input in place; later ones keep the
    // recomputed output of the layer before them.
    for (int i = 0; i < plan.group_length; ++i) w.scratch.push_back(layer_set(shape, i > 0, true));
  }
  if (plan.selective) {
    w.layer.attn = take(n * shape.attention);
    w.layer.lse = take(n * shape.q_heads);
  }
  if (shape.has_output) w.head.dloss = take(n);
  w.pingpong[0] = take(s * c);
  w.pingpong[1] = take(s * c);
  w.layer.tmp = take(s * c);
  w.d_stream[0] = take(s * c);
  w.d_stream[1] = take(s * c);
  w.layer.d_mid = take(s * c);
  w.layer.d_norm = take(s * c);
  w.head.d_norm = w.layer.d_norm;
  w.layer.d_part = take(s * c);
  w.layer.attention.d_attn = take(n * shape.attention);
  w.layer.attention.d_qkv = take(n * shape.qkv);
  w.layer.mlp.d_fc1 = take(n * shape.fc1);
  w.layer.mlp.d_act = take(n * shape.ffn);
  if (shape.sequence_parallel) {
    // Full-row (N, C) buffers of the sequence-parallel regions, shared by every linear; the
    // embedding's partial lookups use the row-parallel partial sums' buffer.
    SequenceParallelBuffers buffers{take(n * c), take(n * c), take(n * c)};
    w.layer.attention.sequence_parallel = w.layer.mlp.sequence_parallel = w.head.sequence_parallel = buffers;
    w.embedding_full = buffers.partial;
  }
  if (shape.precision != Precision::fp32) {
    const int64_t widest = std::max({c, shape.qkv, shape.fc1, shape.vocab});
    w.operands[0] = take(n * widest);
    w.operands[1] = take(n * widest);
  }
}

float* ActivationPool::take(int64_t count) {
  const int64_t bytes = backend::buffer_bytes<float>(count);
  const int64_t offset = taken_floats_ - block_start_;
  taken_floats_ += bytes / static_cast<int64_t>(sizeof(float));
  if (block_) return block_ + offset;
  bytes_ += bytes;
  if (!ops_) return nullptr;
  owned_.emplace_back(*ops_, count, backend::MemoryCategory::activations, ledger_);
  return owned_.back().data();
}

// Everything a layer keeps, except its input (owned by the residual chain) unless `with_input`,
// and the core-attention outputs unless `with_attention` (selective recompute rebuilds them).
LayerActivations ActivationPool::layer_set(const ActivationShape& shape, bool with_input, bool with_attention) {
  const int64_t n = shape.rows, s = shape.sequence_rows, c = shape.hidden;
  LayerActivations a;
  if (with_input) a.x_in = take(s * c);
  a.norm1 = take(s * c);
  if (shape.layernorm) a.mean1 = take(s);
  a.rstd1 = take(s);
  a.qkv = take(n * shape.qkv);
  if (with_attention) {
    a.attn = take(n * shape.attention);
    a.lse = take(n * shape.q_heads);
  }
  a.x_mid = take(s * c);
  a.norm2 = take(s * c);
  if (shape.layernorm) a.mean2 = take(s);
  a.rstd2 = take(s);
  a.fc1 = take(n * shape.fc1);
  a.act = take(n * shape.ffn);
  return a;
}

}  // namespace mt::model
