// A hand-made parameter declaration set of a small MoE-shaped model for the layout's bucket pass
// (model::lay_out): one chunk of two layers with dense attention, norms and embedding, and per
// layer two expert tensors (a rank's experts) reduced over the expert-DP group, the final norm as
// the head (layer 2). Used by tests/unit/optim/test_distributed_optimizer.cpp and
// tests/mpi/test_distributed_optimizer.cpp.
#pragma once

#include <string>
#include <vector>

#include "model/layout.h"

namespace mt::testing {

inline model::DeclaredParam declared_tensor(const std::string& name, std::vector<int64_t> shape, int layer,
                                            int fused_group,
                                            model::DataParallelGroup group = model::DataParallelGroup::dense) {
  model::DeclaredParam declared;
  model::ParamEntry& e = declared.entry;
  e.name = name;
  e.global_shape = shape;
  e.local_shape = shape;
  e.numel = 1;
  for (int64_t extent : shape) e.numel *= extent;
  e.shard_extent = shape[0];
  e.weight_decay = shape.size() >= 2;
  e.layer = layer;
  e.data_parallel_group = group;
  declared.fused_group = fused_group;
  return declared;
}

inline std::vector<model::DeclaredParam> moe_declarations() {
  const model::DataParallelGroup expert = model::DataParallelGroup::expert;
  return {declared_tensor("embedding.word_embeddings.weight", {40, 24}, model::kEmbeddingLayer, 0),
          declared_tensor("decoder.layers.0.self_attention.linear_qkv.weight", {72, 24}, 0, 1),
          declared_tensor("decoder.layers.0.self_attention.linear_qkv.bias", {72}, 0, 1),
          declared_tensor("decoder.layers.0.mlp.experts.linear_fc1.weight", {2, 48, 24}, 0, 2, expert),
          declared_tensor("decoder.layers.0.mlp.experts.linear_fc2.weight", {2, 24, 48}, 0, 3, expert),
          declared_tensor("decoder.layers.1.self_attention.linear_qkv.weight", {72, 24}, 1, 4),
          declared_tensor("decoder.layers.1.input_layernorm.weight", {24}, 1, 5),
          declared_tensor("decoder.layers.1.mlp.experts.linear_fc1.weight", {2, 48, 24}, 1, 6, expert),
          declared_tensor("decoder.layers.1.mlp.experts.linear_fc2.weight", {2, 24, 48}, 1, 7, expert),
          declared_tensor("decoder.final_layernorm.weight", {24}, 2, 8)};
}

}  // namespace mt::testing
