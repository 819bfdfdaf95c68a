// A model chunk's forward and backward over activation slots (see stage.h).
#include "model/stage.h"

#include "model/layers/moe_mlp.h"
#include "model/layers/mtp.h"

#include <optional>

#include "core/error.h"

namespace mt::model {

struct Stage::SlotState {
  MicroBatch batch;
  ForwardPass pass;
  bool forwarded = false;
};

namespace {

ActivationShape chunk_shape(const ModelConfig& config, const ChunkBlocks& spec, const ChunkModules& blocks,
                            int64_t rows, int64_t sequence_rows, bool sequence_parallel, Precision precision) {
  ActivationShape shape;
  shape.rows = rows;
  shape.sequence_rows = sequence_rows;
  shape.hidden = config.hidden_size;
  shape.vocab = blocks.head ? blocks.head->vocab_width() : 0;
  shape.has_embedding = spec.has_embedding;
  shape.has_output = spec.has_output;
  shape.sequence_parallel = sequence_parallel;
  shape.precision = precision;
  return shape;
}

// Chunk `chunk`'s buffers for micro-batches of `rows` tokens (`sequence_rows` of them in the
// sequence-parallel region) as a pool of `slots` lays them out, counted without allocating.
ActivationPool counted_pool(const ModelConfig& config, const ParamLayout& layout, int chunk, int64_t rows,
                            int64_t sequence_rows, bool sequence_parallel, Precision precision,
                            const RecomputeConfig& recompute, int slots) {
  const ChunkBlocks& spec = layout.chunks.at(static_cast<size_t>(chunk)).spec;
  const ChunkModules blocks = make_chunk(spec, config, layout);
  const ActivationShape shape = chunk_shape(config, spec, blocks, rows, sequence_rows, sequence_parallel, precision);
  return ActivationPool(shape, blocks, plan_recompute(recompute, spec.last_layer - spec.first_layer), slots, nullptr,
                        nullptr);
}

bool same_attention_shape(const kernels::AttentionShape& a, const kernels::AttentionShape& b) {
  return a.q_heads == b.q_heads && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim && a.q_stride == b.q_stride &&
         a.k_stride == b.k_stride && a.v_stride == b.v_stride && a.o_stride == b.o_stride;
}

}  // namespace

ActivationShape activation_shape(const ModelConfig& config, const ParamLayout& layout, int chunk,
                                 const ParallelContext& parallel, int64_t rows, Precision precision) {
  const ChunkBlocks& spec = layout.chunks.at(static_cast<size_t>(chunk)).spec;
  return chunk_shape(config, spec, make_chunk(spec, config, layout), rows, parallel.sequence_rows(rows),
                     parallel.sequence_parallel(), precision);
}

int64_t activation_slot_floats(const ModelConfig& config, const ParamLayout& layout, int chunk,
                               const ParallelContext& parallel, const StageOptions& options) {
  const int sequence_length = options.sequence_length > 0 ? options.sequence_length : config.seq_length;
  const int64_t rows = static_cast<int64_t>(options.micro_batch_size) * sequence_length;
  return counted_pool(config, layout, chunk, rows, parallel.sequence_rows(rows), parallel.sequence_parallel(),
                      options.precision, options.recompute, 1)
      .slot_floats();
}

int64_t planned_activation_bytes(const ModelConfig& config, Precision precision, const RecomputeConfig& recompute,
                                 int micro_batch_size, int layers) {
  const ParamLayout layout = build_layout(config, parallel::ParallelConfig{}, parallel::RankCoordinates{},
                                          std::vector<ChunkSpec>{{0, layers, true, true}});
  const int64_t rows = static_cast<int64_t>(micro_batch_size) * config.seq_length;
  return counted_pool(config, layout, 0, rows, rows, false, precision, recompute, 1).bytes();
}

int64_t planned_activation_bytes(const ModelConfig& config, const ParamLayout& layout, int chunk, int64_t rows,
                                 int sequence_parallel_degree, Precision precision, const RecomputeConfig& recompute,
                                 int slots) {
  if (rows % sequence_parallel_degree != 0) {
    throw Error("--sequence-parallel", "a micro-batch of " + std::to_string(rows) +
                                           " tokens does not split over --tensor-model-parallel-size " +
                                           std::to_string(sequence_parallel_degree));
  }
  return counted_pool(config, layout, chunk, rows, rows / sequence_parallel_degree, sequence_parallel_degree > 1,
                      precision, recompute, slots)
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
  const ChunkBlocks& spec = layout.chunks.at(static_cast<size_t>(chunk)).spec;
  first_layer_ = spec.first_layer;
  last_layer_ = spec.last_layer;
  if (options_.sequence_length <= 0) options_.sequence_length = config_.seq_length;
  if (options_.slot_blocks.empty() && options_.activation_slots <= 0) {
    throw Error("stage", "needs at least one activation slot");
  }
  capacity_rows_ = static_cast<int64_t>(options_.micro_batch_size) * options_.sequence_length;
  blocks_ = make_chunk(spec, config_, layout);
  for (MoeMlp* moe : blocks_.moe_layers) moe->prepare(ops_, parallel_);
  recompute_ = plan_recompute(options_.recompute, last_layer_ - first_layer_);
  const ActivationShape shape = chunk_shape(config_, spec, blocks_, capacity_rows_,
                                            parallel_.sequence_rows(capacity_rows_), parallel_.sequence_parallel(),
                                            options_.precision);
  pool_ = std::make_unique<ActivationPool>(shape, blocks_, recompute_, options_.activation_slots, &ops_, &ledger_,
                                           options_.slot_blocks);
  states_.resize(static_cast<size_t>(pool_->slots()));
  make_ring_attention();
  StageWorkspace& w = pool_->workspace();
  gemm_.set_operand_buffers(w.operands[0], w.operands[1]);
  gemm_.set_fp8(options_.fp8);
  if (options_.fp8) options_.fp8->reserve_slots(activation_slots());
}

// Under context parallelism one ring attention, sized for the micro-batch, serves every layer's
// core attention; layers whose cores differ in shape would each need their own.
void Stage::make_ring_attention() {
  if (parallel_.context_parallel_size() <= 1) return;
  std::optional<kernels::AttentionShape> shape;
  for (const auto& layer : blocks_.layers) {
    const auto core = layer->attention_core_shape(options_.micro_batch_size, options_.sequence_length);
    if (!core) continue;
    if (!shape) {
      shape = core;
    } else if (!same_attention_shape(*shape, *core)) {
      throw Error("context parallelism over layers [" + std::to_string(first_layer_) + ", " +
                      std::to_string(last_layer_) + ")",
                  "needs one core attention shape per chunk (layer " + std::to_string(layer->layer()) + " differs)");
    }
  }
  if (shape) ring_attention_ = std::make_unique<parallel::RingAttention>(ops_, parallel_.context_group(), *shape, &ledger_);
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
  return LayerPass{state.batch,           rows,  sequence_rows, row_ids, state.pass.iteration, state.pass.training,
                   /*recompute=*/false, aux_loss_grad_factor_, sop_loss_grad_factor_};
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
  auto after = [&](int layer) {
    if (after_forward_) after_forward_(layer);
  };

  if (blocks_.embedding) {
    before(kEmbeddingLayer);
    blocks_.embedding->forward(ctx, lpass, w.embedding_full, acts.input, w.token_type_rows);
    after(kEmbeddingLayer);
  } else if (!input) {
    throw Error("stage of layers [" + std::to_string(first_layer_) + ", " + std::to_string(last_layer_) + ")",
                "needs the previous stage's activation as its input");
  } else if (input != acts.input) {
    ops_.copy(acts.input, input, activation_bytes, backend::CopyKind::device_to_device, ctx.stream);
  }
  float* chunk_output = blocks_.head ? acts.head.final_hidden : acts.output;
  const int layers = static_cast<int>(blocks_.layers.size());
  const float* x = acts.input;
  if (options_.fp8) options_.fp8->begin_forward(slot, pass.training);  // the decoder's fp8_autocast
  for (int i = 0; i < layers; ++i) {
    const size_t layer = static_cast<size_t>(i);
    float* out;
    if (i + 1 == layers) {
      out = chunk_output;
    } else if (acts.layer_inputs[layer + 1]) {
      out = acts.layer_inputs[layer + 1];
    } else {
      out = w.pingpong[i % 2];
    }
    before(first_layer_ + i);
    // A recomputed layer runs now for its output into its scratch set; backward rebuilds it.
    BlockBuffers& saved = recompute_.recomputed[layer] ? *w.recompute_saved[layer] : *acts.layer_saved[layer];
    blocks_.layers[layer]->forward(ctx, lpass, x, out, saved, *w.layers[layer], w.temporaries);
    after(first_layer_ + i);
    x = out;
  }
  if (options_.fp8) options_.fp8->end_forward();
  if (layers == 0) {
    ops_.copy(chunk_output, acts.input, activation_bytes, backend::CopyKind::device_to_device, ctx.stream);
  }

  StageOutput output;
  if (blocks_.head) {
    before(head_layer(config_));
    blocks_.head->forward(ctx, lpass, acts.head, w.head);  // adds to batch.loss_sums
    // Multi-token prediction from the final norm's output (training only: adds to batch.mtp_loss_sums).
    if (blocks_.mtp && pass.training) {
      blocks_.mtp->forward(ctx, lpass, acts.head.final_norm, *acts.mtp, *w.mtp, w.temporaries, before);
    }
    after(head_layer(config_));
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
  auto before = [&](int layer) {
    if (before_backward_) before_backward_(layer);
  };

  int current = 0;  // w.d_stream[current] holds the grad of the current layer's output
  if (blocks_.head) {
    before(head_layer(config_));
    // The MTP depths' grads first (depths k > 0 signal L + k); their grad of the final norm's
    // output joins the head's before its norm, and the head's signal covers depth 0.
    // Under FP8 the depths' regions re-enter this slot's backward (Fp8Scaling::begin_region).
    if (options_.fp8 && blocks_.mtp) options_.fp8->begin_backward(slot);
    const float* d_final_norm =
        blocks_.mtp ? blocks_.mtp->backward(ctx, pass, acts.head.final_norm, *acts.mtp, *w.mtp, w.temporaries, signal)
                    : nullptr;
    blocks_.head->backward(ctx, pass, acts.head, dloss_scale, w.head, w.d_stream[0], d_final_norm);
    signal(head_layer(config_));
  } else if (!d_output) {
    throw Error("stage of layers [" + std::to_string(first_layer_) + ", " + std::to_string(last_layer_) + ")",
                "needs the grad of its output from the next stage");
  } else {
    ops_.copy(w.d_stream[0], d_output, activation_bytes, backend::CopyKind::device_to_device, ctx.stream);
  }

  if (options_.fp8) options_.fp8->begin_backward(slot);
  auto layer_backward = [&](int i, const float* x_in, BlockBuffers& saved) {
    const size_t layer = static_cast<size_t>(i);
    before(first_layer_ + i);
    blocks_.layers[layer]->backward(ctx, pass, x_in, w.d_stream[current], w.d_stream[1 - current], saved,
                                    *w.layers[layer], w.temporaries);
    current = 1 - current;
    signal(first_layer_ + i);
  };
  int i = static_cast<int>(blocks_.layers.size()) - 1;
  while (i >= 0) {
    if (!recompute_.recomputed[static_cast<size_t>(i)]) {
      layer_backward(i, acts.layer_inputs[static_cast<size_t>(i)], *acts.layer_saved[static_cast<size_t>(i)]);
      --i;
      continue;
    }
    // Recompute the group [start, i] from its kept input into the scratch sets, then run its
    // backward in reverse.
    const int start = recompute_.group_start[static_cast<size_t>(i)];
    auto input_of = [&](int j) -> float* {
      return j == start ? acts.layer_inputs[static_cast<size_t>(start)]
                        : w.recompute_inputs[static_cast<size_t>(j - start)];
    };
    LayerPass rerun = pass;
    rerun.recompute = true;
    for (int j = start; j <= i; ++j) before(first_layer_ + j);
    if (options_.fp8) options_.fp8->begin_recompute();
    for (int j = start; j <= i; ++j) {
      float* out = j < i ? input_of(j + 1) : w.pingpong[0];  // the last output is not needed
      blocks_.layers[static_cast<size_t>(j)]->forward(ctx, rerun, input_of(j), out,
                                                      *w.recompute_saved[static_cast<size_t>(j)],
                                                      *w.layers[static_cast<size_t>(j)], w.temporaries);
    }
    if (options_.fp8) options_.fp8->end_recompute();
    for (int j = i; j >= start; --j) layer_backward(j, input_of(j), *w.recompute_saved[static_cast<size_t>(j)]);
    i = start - 1;
  }

  if (options_.fp8) options_.fp8->end_backward();
  float* d_input = w.d_stream[current];
  if (blocks_.embedding) {
    before(kEmbeddingLayer);
    blocks_.embedding->backward(ctx, pass, d_input, w.embedding_full);
    signal(kEmbeddingLayer);
    return nullptr;
  }
  return d_input;
}

int Stage::moe_layer_count() const { return static_cast<int>(blocks_.moe_layers.size()); }

MoeLayerState& Stage::moe_layer(int index) {
  if (index < 0 || index >= moe_layer_count()) {
    throw Error("MoE layer index " + std::to_string(index), "outside the stage's " + std::to_string(moe_layer_count()));
  }
  return blocks_.moe_layers[static_cast<size_t>(index)]->state();
}

const float* Stage::logits(int slot) const {
  if (!blocks_.head) throw Error("stage", "only the last stage has logits");
  return pool_->slot(slot).head.logits;
}

int64_t Stage::logits_width() const { return blocks_.head ? blocks_.head->vocab_width() : 0; }
int64_t Stage::vocab_start() const { return blocks_.head ? blocks_.head->vocab_start() : 0; }
int64_t Stage::valid_logits() const { return blocks_.head ? blocks_.head->valid_columns() : 0; }

}  // namespace mt::model
