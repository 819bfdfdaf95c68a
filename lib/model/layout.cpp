// The parameter layout table (see layout.h).
#include "model/layout.h"

#include "core/error.h"

namespace mt::model {
namespace {

constexpr int64_t kAlignElements = 16;  // 64 bytes of fp32

class LayoutBuilder {
 public:
  LayoutBuilder(const parallel::ParallelConfig& parallel, const parallel::RankCoordinates& rank, ParamLayout& layout)
      : tp_(parallel.tensor_model_parallel_size), tp_rank_(rank.tp), layout_(layout) {}

  // Starts a fused group: the next tensor begins aligned, the group's tensors follow back to back.
  void begin_group() { align_next_ = true; }

  void add(const std::string& name, std::vector<int64_t> shape, TensorSplit split, int layer) {
    ParamEntry entry;
    entry.name = name;
    entry.global_shape = shape;
    entry.split = split;
    entry.layer = layer;
    entry.weight_decay = shape.size() >= 2;
    entry.local_shape = shape;
    if (split != TensorSplit::replicated && tp_ > 1) {
      const int dim = split == TensorSplit::column_parallel ? 0 : 1;
      if (static_cast<int>(shape.size()) <= dim || shape[dim] % tp_ != 0) {
        throw UsageError("--tensor-model-parallel-size " + std::to_string(tp_),
                         "does not divide dimension " + std::to_string(dim) + " of " + name);
      }
      entry.shard_dim = dim;
      entry.shard_extent = shape[dim] / tp_;
      entry.shard_offset = entry.shard_extent * tp_rank_;
      entry.local_shape[dim] = entry.shard_extent;
    } else {
      entry.shard_extent = shape.empty() ? 1 : shape[0];
    }
    entry.numel = 1;
    for (int64_t extent : entry.local_shape) entry.numel *= extent;
    if (align_next_) {
      layout_.total_elements = (layout_.total_elements + kAlignElements - 1) / kAlignElements * kAlignElements;
      align_next_ = false;
    }
    entry.offset = layout_.total_elements;
    layout_.total_elements += entry.numel;
    layout_.entries.push_back(std::move(entry));
  }

  // A tensor on its own (aligned).
  void add_single(const std::string& name, std::vector<int64_t> shape, TensorSplit split, int layer) {
    begin_group();
    add(name, std::move(shape), split, layer);
  }

 private:
  int tp_, tp_rank_;
  ParamLayout& layout_;
  bool align_next_ = true;
};

}  // namespace

std::string layer_prefix(int layer) { return "decoder.layers." + std::to_string(layer) + "."; }

const ParamEntry* ParamLayout::try_find(const std::string& name) const {
  for (const auto& entry : entries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

const ParamEntry& ParamLayout::find(const std::string& name) const {
  if (const ParamEntry* entry = try_find(name)) return *entry;
  throw Error("parameter " + name, "not in this rank's layout");
}

Tensor ParamLayout::view(const ParamEntry& entry, float* buffer) const {
  return Tensor::view(buffer + entry.offset, entry.local_shape, DType::f32);
}

int64_t ParamLayout::parameter_elements() const {
  int64_t total = 0;
  for (const auto& entry : entries) total += entry.numel;
  return total;
}

ParamLayout build_layout(const ModelConfig& model, const parallel::ParallelConfig& parallel,
                         const parallel::RankCoordinates& rank, int first_layer, int last_layer) {
  model.validate();
  model.check_trainable();
  if (first_layer < 0 || last_layer > model.num_layers || first_layer > last_layer) {
    throw Error("layer range [" + std::to_string(first_layer) + ", " + std::to_string(last_layer) + ")",
                "outside the model's " + std::to_string(model.num_layers) + " layers");
  }
  ParamLayout layout;
  layout.first_layer = first_layer;
  layout.last_layer = last_layer;
  layout.has_embedding = rank.pp == 0;
  layout.has_output = rank.pp == parallel.pipeline_model_parallel_size - 1;
  LayoutBuilder builder(parallel, rank, layout);

  const int64_t hidden = model.hidden_size, ffn = model.ffn_hidden_size, vocab = model.padded_vocab_size();
  const int64_t q_width = static_cast<int64_t>(model.num_attention_heads) * model.head_dim();
  const int64_t kv_width = static_cast<int64_t>(model.query_groups()) * model.head_dim();
  const bool layernorm = model.normalization == Normalization::layernorm;
  const bool bias = model.add_bias_linear;
  using S = TensorSplit;

  auto add_norm = [&](const std::string& name, int layer) {
    builder.add_single(name + ".weight", {hidden}, S::replicated, layer);
    if (layernorm) builder.add_single(name + ".bias", {hidden}, S::replicated, layer);
  };

  if (layout.has_embedding) {
    builder.add_single("embedding.word_embeddings.weight", {vocab, hidden}, S::column_parallel, -1);
    if (model.position_embedding == PositionEmbedding::learned_absolute) {
      builder.add_single("embedding.position_embeddings.weight", {model.max_position_embeddings, hidden},
                         S::replicated, -1);
    }
  }
  for (int layer = first_layer; layer < last_layer; ++layer) {
    const std::string p = layer_prefix(layer);
    add_norm(p + "input_layernorm", layer);
    builder.begin_group();
    builder.add(p + "self_attention.linear_q.weight", {q_width, hidden}, S::column_parallel, layer);
    builder.add(p + "self_attention.linear_k.weight", {kv_width, hidden}, S::column_parallel, layer);
    builder.add(p + "self_attention.linear_v.weight", {kv_width, hidden}, S::column_parallel, layer);
    if (bias) {
      builder.begin_group();
      builder.add(p + "self_attention.linear_q.bias", {q_width}, S::column_parallel, layer);
      builder.add(p + "self_attention.linear_k.bias", {kv_width}, S::column_parallel, layer);
      builder.add(p + "self_attention.linear_v.bias", {kv_width}, S::column_parallel, layer);
    }
    builder.add_single(p + "self_attention.linear_proj.weight", {hidden, q_width}, S::row_parallel, layer);
    if (bias) builder.add_single(p + "self_attention.linear_proj.bias", {hidden}, S::replicated, layer);
    add_norm(p + "pre_mlp_layernorm", layer);
    if (model.swiglu) {
      builder.begin_group();
      builder.add(p + "mlp.linear_fc1_gate.weight", {ffn, hidden}, S::column_parallel, layer);
      builder.add(p + "mlp.linear_fc1_up.weight", {ffn, hidden}, S::column_parallel, layer);
      if (bias) {
        builder.begin_group();
        builder.add(p + "mlp.linear_fc1_gate.bias", {ffn}, S::column_parallel, layer);
        builder.add(p + "mlp.linear_fc1_up.bias", {ffn}, S::column_parallel, layer);
      }
    } else {
      builder.add_single(p + "mlp.linear_fc1.weight", {ffn, hidden}, S::column_parallel, layer);
      if (bias) builder.add_single(p + "mlp.linear_fc1.bias", {ffn}, S::column_parallel, layer);
    }
    builder.add_single(p + "mlp.linear_fc2.weight", {hidden, ffn}, S::row_parallel, layer);
    if (bias) builder.add_single(p + "mlp.linear_fc2.bias", {hidden}, S::replicated, layer);
  }
  if (layout.has_output) {
    add_norm("decoder.final_layernorm", -1);
    if (model.untie_embeddings_and_output_weights) {
      builder.add_single("output_layer.weight", {vocab, hidden}, S::column_parallel, -1);
    } else if (!layout.has_embedding) {
      // The last stage of a pipeline holds its own copy of the tied embedding (Megatron does the
      // same and keeps the copies equal by an all-reduce of their grads).
      builder.add_single("embedding.word_embeddings.weight", {vocab, hidden}, S::column_parallel, -1);
    }
  }
  layout.total_elements = (layout.total_elements + kAlignElements - 1) / kAlignElements * kAlignElements;
  return layout;
}

ParamLayout build_layout(const ModelConfig& model) {
  return build_layout(model, parallel::ParallelConfig{}, parallel::RankCoordinates{}, 0, model.num_layers);
}

}  // namespace mt::model
