// A model chunk's forward and backward over activation slots (see stage.h).
#include "model/stage.h"

#include "core/error.h"

namespace mt::model {

struct Stage::SlotState {
  MicroBatch batch;
  ForwardPass pass;
  bool forwarded = false;
};

namespace {

// The shape of chunk `chunk` with `sequence_rows` rows of the sequence-parallel region.
ActivationShape chunk_activation_shape(const ModelConfig& config, const ParamLayout& layout, int chunk, int64_t rows,
                                       int64_t sequence_rows, bool sequence_parallel, Precision precision) {
  const ChunkSpec& spec = layout.chunks.at(static_cast<size_t>(chunk)).spec;
  ActivationShape shape;
  shape.rows = rows;
  shape.sequence_rows = sequence_rows;
  shape.hidden = config.hidden_size;
  shape.layers = spec.last_layer - spec.first_layer;
  shape.layernorm = config.normalization == Normalization::layernorm;
  shape.has_embedding = spec.has_embedding;
  shape.has_output = spec.has_output;
  shape.sequence_parallel = sequence_parallel;
  shape.precision = precision;
  if (shape.layers > 0) {
    const TransformerLayer layer(config, layout, spec.first_layer);
    shape.qkv = layer.attention().qkv_width();
    shape.attention = layer.attention().attention_width();
    shape.q_heads = layer.attention().q_heads();
    shape.ffn = layer.mlp().ffn();
    shape.fc1 = layer.mlp().fc1_width();
  }
  if (spec.has_output) shape.vocab = OutputHead(config, layout).vocab_width();
  return shape;
}

}  // namespace

ActivationShape activation_shape(const ModelConfig& config, const ParamLayout& layout, int chunk,
                                 const ParallelContext& parallel, int64_t rows, Precision precision) {
  return chunk_activation_shape(config, layout, chunk, rows, parallel.sequence_rows(rows), parallel.sequence_parallel(),
                                precision);
}

int64_t activation_slot_floats(const ModelConfig& config, const ParamLayout& layout, int chunk,
                               const ParallelContext& parallel, const StageOptions& options) {
  const ChunkSpec& spec = layout.chunks.at(static_cast<size_t>(chunk)).spec;
  const int sequence_length = options.sequence_length > 0 ? options.sequence_length : config.seq_length;
  const ActivationShape shape = activation_shape(
      config, layout, chunk, parallel, static_cast<int64_t>(options.micro_batch_size) * sequence_length, options.precision);
  return ActivationPool(shape, plan_recompute(options.recompute, spec.last_layer - spec.first_layer), 1, nullptr,
                        nullptr)
      .slot_floats();
}

int64_t planned_activation_bytes(const ModelConfig& config, Precision precision, const RecomputeConfig& recompute,
                                 int micro_batch_size, int layers) {
  const ParamLayout layout = build_layout(config, parallel::ParallelConfig{}, parallel::RankCoordinates{},
                                          std::vector<ChunkSpec>{{0, layers, true, true}});
  const ActivationShape shape = activation_shape(config, layout, 0, ParallelContext{},
                                                 static_cast<int64_t>(micro_batch_size) * config.seq_length, precision);
  return ActivationPool(shape, plan_recompute(recompute, layers), 1, nullptr, nullptr).bytes();
}

int64_t planned_activation_bytes(const ModelConfig& config, const ParamLayout& layout, int chunk, int64_t rows,
                                 int sequence_parallel_degree, Precision precision, const RecomputeConfig& recompute,
                                 int slots) {
  const bool sequence_parallel = sequence_parallel_degree > 1;
  if (rows % sequence_parallel_degree != 0) {
    throw Error("--sequence-parallel", "a micro-batch of " + std::to_string(rows) +
                                           " tokens does not split over --tensor-model-parallel-size " +
                                           std::to_string(sequence_parallel_degree));
  }
  const ActivationShape shape = chunk_activation_shape(config, layout, chunk, rows, rows / sequence_parallel_degree,
                                                       sequence_parallel, precision);
  const ChunkSpec& spec = layout.chunks.at(static_cast<size_t>(chunk)).spec;
  return ActivationPool(shape, plan_recompute(recompute, spec.last_layer - spec.first_layer), slots, nullptr, nullptr)
      .bytes();
}

Stage::Stage(const ModelConfig& config, const ParamLayout& layout, int chunk, const ParallelContext& parallel,
             const backend::Ops& ops, const GemmWeights& weights, const StageOptions& options,
             backend::MemoryLedger* ledger)
    : config_(config),
      parallel_(parallel),
      ops_(ops),
      options_(options),
      ledger_(ledger),
      gemm_(ops, weights) {
  config_.validate();
  if (weights.precision() != options_.precision) {
    throw Error("stage", std::string("runs in ") + precision_name(options_.precision) + " but its GEMM weights are " +
                             precision_name(weights.precision()));
  }
  const ChunkSpec& spec = layout.chunks.at(static_cast<size_t>(chunk)).spec;
  first_layer_ = spec.first_layer;
  last_layer_ = spec.last_layer;
  if (options_.sequence_length <= 0) options_.sequence_length = config_.seq_length;
  if (options_.slot_blocks.empty() && options_.activation_slots <= 0) {
    throw Error("stage", "needs at least one activation slot");
  }
  capacity_rows_ = static_cast<int64_t>(options_.micro_batch_size) * options_.sequence_length;
  if (spec.has_embedding) embedding_ = std::make_unique<Embedding>(config_, layout);
  layers_.reserve(static_cast<size_t>(last_layer_ - first_layer_));
  for (int layer = first_layer_; layer < last_layer_; ++layer) layers_.emplace_back(config_, layout, layer);
  if (spec.has_output) head_ = std::make_unique<OutputHead>(config_, layout);
  recompute_ = plan_recompute(options_.recompute, last_layer_ - first_layer_);
  const ActivationShape shape = activation_shape(config_, layout, chunk, parallel_, capacity_rows_, options_.precision);
  pool_ = std::make_unique<ActivationPool>(shape, recompute_, options_.activation_slots, &ops_, &ledger_,
                                           options_.slot_blocks);
  states_.resize(static_cast<size_t>(pool_->slots()));
  if (parallel_.context_parallel_size() > 1 && !layers_.empty()) {
    ring_attention_ = std::make_unique<parallel::RingAttention>(
        ops_, parallel_.context_group(),
        layers_.front().attention().attention_shape(options_.micro_batch_size, options_.sequence_length), &ledger_);
  }
  StageWorkspace& w = pool_->workspace();
  gemm_.set_operand_buffers(w.operands[0], w.operands[1]);
}

Stage::~Stage() = default;

void Stage::bind(const float* params, float* grads) {
  params_ = params;
  grads_ = grads;
  gemm_.bind(params, grads);
}

LayerContext Stage::context() const {
  return LayerContext{config_, ops_, ops_.default_stream(), parallel_, gemm_, params_, grads_, options_.seed,
                      ring_attention_.get()};
}

LayerPass Stage::layer_pass(const SlotState& state, int64_t rows) const {
  const int64_t sequence_rows = parallel_.sequence_rows(rows);
  const int64_t* row_ids = state.batch.row_ids ? state.batch.row_ids + parallel_.sequence_row_offset(rows) : nullptr;
  return LayerPass{state.batch, rows, sequence_rows, row_ids, state.pass.iteration, state.pass.training};
}

SlotActivations& Stage::slot_activations(int slot) {
  if (slot < 0 || slot >= activation_slots()) {
    throw Error("activation slot " + std::to_string(slot),
                "outside the stage's " + std::to_string(activation_slots()) + " slots");
  }
  return pool_->slot(slot);
}

float* Stage::input_buffer(int slot) { return slot_activations(slot).input; }

StageOutput Stage::forward(int slot, const MicroBatch& batch, const float* input, const ForwardPass& pass) {
  if (!params_) throw Error("stage", "parameters not bound");
  SlotActivations& acts = slot_activations(slot);
  const int64_t rows = static_cast<int64_t>(batch.batch) * batch.seq;
  if (rows <= 0 || rows > capacity_rows_) {
    throw Error("micro-batch", "shape (" + std::to_string(batch.batch) + ", " + std::to_string(batch.seq) +
                                   ") exceeds the stage's buffers (" + std::to_string(options_.micro_batch_size) +
                                   ", " + std::to_string(options_.sequence_length) + ")");
  }
  SlotState& state = states_[static_cast<size_t>(slot)];
  state = SlotState{batch, pass, true};
  const LayerContext ctx = context();
  const LayerPass lpass = layer_pass(state, rows);
  StageWorkspace& w = pool_->workspace();
  const int64_t s = lpass.sequence_rows, c = config_.hidden_size;
  const int64_t activation_bytes = static_cast<int64_t>(sizeof(float)) * s * c;
  auto before = [&](int layer) {
    if (before_forward_) before_forward_(layer);
  };

  if (embedding_) {
    before(kEmbeddingLayer);
    embedding_->forward(ctx, lpass, w.embedding_full, acts.input);
  } else if (!input) {
    throw Error("stage of layers [" + std::to_string(first_layer_) + ", " + std::to_string(last_layer_) + ")",
                "needs the previous stage's activation as its input");
  } else if (input != acts.input) {
    ops_.copy(acts.input, input, activation_bytes, backend::CopyKind::device_to_device, ctx.stream);
  }
  float* chunk_output = head_ ? acts.head.final_hidden : acts.output;
  const int layers = static_cast<int>(layers_.size());
  const float* x = acts.input;
  for (int i = 0; i < layers; ++i) {
    float* out;
    if (i + 1 == layers) {
      out = chunk_output;
    } else if (acts.layers[static_cast<size_t>(i + 1)].x_in) {
      out = acts.layers[static_cast<size_t>(i + 1)].x_in;
    } else {
      out = w.pingpong[i % 2];
    }
    before(first_layer_ + i);
    if (recompute_.recomputed[static_cast<size_t>(i)]) {
      // Run the layer now for its output; what backward needs is rebuilt there.
      LayerActivations& scratch = w.scratch[0];
      scratch.x_in = const_cast<float*>(x);
      layers_[static_cast<size_t>(i)].forward(ctx, lpass, scratch, x, out, w.layer);
    } else {
      layers_[static_cast<size_t>(i)].forward(ctx, lpass, acts.layers[static_cast<size_t>(i)], x, out, w.layer);
    }
    x = out;
  }
  if (layers == 0) {
    ops_.copy(chunk_output, acts.input, activation_bytes, backend::CopyKind::device_to_device, ctx.stream);
  }

  StageOutput output;
  if (head_) {
    before(head_layer(config_));
    output.loss = head_->forward(ctx, lpass, acts.head, w.head);
  } else {
    output.activation = acts.output;
  }
  return output;
}

const float* Stage::backward(int slot, const float* d_output, float dloss_scale) {
  if (!grads_) throw Error("stage", "grads not bound");
  SlotActivations& acts = slot_activations(slot);
  SlotState& state = states_[static_cast<size_t>(slot)];
  if (!state.forwarded || !state.pass.training) {
    throw Error("activation slot " + std::to_string(slot), "backward needs a training forward of the slot first");
  }
  state.forwarded = false;
  const LayerContext ctx = context();
  const int64_t rows = static_cast<int64_t>(state.batch.batch) * state.batch.seq;
  const LayerPass pass = layer_pass(state, rows);
  StageWorkspace& w = pool_->workspace();
  const int64_t activation_bytes = static_cast<int64_t>(sizeof(float)) * pass.sequence_rows * config_.hidden_size;
  auto signal = [&](int layer) {
    if (grads_ready_) grads_ready_(layer);
  };

  int current = 0;  // w.d_stream[current] holds the grad of the current layer's output
  if (head_) {
    head_->backward(ctx, pass, acts.head, dloss_scale, w.head, w.d_stream[0]);
    signal(head_layer(config_));
  } else if (!d_output) {
    throw Error("stage of layers [" + std::to_string(first_layer_) + ", " + std::to_string(last_layer_) + ")",
                "needs the grad of its output from the next stage");
  } else {
    ops_.copy(w.d_stream[0], d_output, activation_bytes, backend::CopyKind::device_to_device, ctx.stream);
  }

  int i = static_cast<int>(layers_.size()) - 1;
  while (i >= 0) {
    if (!recompute_.recomputed[static_cast<size_t>(i)]) {
      layers_[static_cast<size_t>(i)].backward(ctx, pass, acts.layers[static_cast<size_t>(i)], w.d_stream[current],
                                               w.d_stream[1 - current], w.layer);
      current = 1 - current;
      signal(first_layer_ + i);
      --i;
      continue;
    }
    // Recompute the group [start, i] from its kept input into the scratch sets, then run its
    // backward in reverse.
    const int start = recompute_.group_start[static_cast<size_t>(i)];
    const float* x = acts.layers[static_cast<size_t>(start)].x_in;
    for (int j = start; j <= i; ++j) {
      LayerActivations& scratch = w.scratch[static_cast<size_t>(j - start)];
      if (j == start) scratch.x_in = const_cast<float*>(x);
      float* out = j < i ? w.scratch[static_cast<size_t>(j - start + 1)].x_in : w.pingpong[0];  // output not needed
      layers_[static_cast<size_t>(j)].forward(ctx, pass, scratch, x, out, w.layer);
      x = out;
    }
    for (int j = i; j >= start; --j) {
      layers_[static_cast<size_t>(j)].backward(ctx, pass, w.scratch[static_cast<size_t>(j - start)],
                                               w.d_stream[current], w.d_stream[1 - current], w.layer);
      current = 1 - current;
      signal(first_layer_ + j);
    }
    i = start - 1;
  }

  float* d_input = w.d_stream[current];
  if (embedding_) {
    embedding_->backward(ctx, pass, d_input, w.embedding_full);
    signal(kEmbeddingLayer);
    return nullptr;
  }
  return d_input;
}

const float* Stage::logits(int slot) const {
  if (!head_) throw Error("stage", "only the last stage has logits");
  return pool_->slot(slot).head.logits;
}

int64_t Stage::logits_width() const { return head_ ? head_->vocab_width() : 0; }
int64_t Stage::vocab_start() const { return head_ ? head_->vocab_start() : 0; }
int64_t Stage::valid_logits() const { return head_ ? head_->valid_columns() : 0; }

}  // namespace mt::model
