// A stage: one model chunk (decoder layers [first, last) of the layout's chunk, with the embedding
// when it is the model's first chunk and the final norm, output layer and loss when it is the
// last) on one rank, run as explicit forward and backward passes over a pool of activation slots:
//
//   forward(slot, batch, input)  -> output activation (sequence rows, hidden) for the next
//                                   stage; on the last stage the loss sums are added to
//                                   batch.loss_sums (device memory)
//   backward(slot, d_output)     -> grad of the input activation for the previous stage
//                                   (nullptr on the first stage); the last stage starts from its
//                                   loss scaled by dloss_scale
//
// Each slot holds one micro-batch from its forward to its backward (what it keeps follows the
// recompute policy: none / selective / full, uniform or block), so a pipeline schedule keeps as
// many micro-batches in flight as it has slots, in any order (forward 0, forward 1, backward 0,
// backward 1 gives the grads of running them one after the other). Parameter grads accumulate
// into the bound grads; after each layer's backward (and the head's, and the embedding's) the
// grads-ready callback names the layer whose grads are complete for this micro-batch (layer ids
// of model/layout.h: head_layer(), then L-1 .. first, then kEmbeddingLayer), so DP can start
// reducing a bucket during backward. Before each forward reads a layer's parameters (the
// embedding's, each layer's, the head's) the before-forward callback names that layer, so
// parameters still arriving (an overlapped all-gather) can be waited for. Collectives run through the ParallelContext; under context
// parallelism the stage owns one ring attention over the CP group (sized for its micro-batch of
// sequence_length local tokens per sample) that all its layers' attention cores share.
// What the chunk is made of is its spec in the layout (model/spec.h, ModelChunk::spec): the stage
// builds its blocks from it by the spec's factories and drives them through their interfaces
// (model/layers/decoder_layer.h), so a chunk may mix layer kinds and widths.
// Tested in tests/unit/model/test_stage.cpp, tests/unit/model/test_model_gradients.cpp and
// tests/unit/model/test_spec.cpp (under CP: tests/mpi/test_context_parallel_training.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "model/activations.h"
#include "model/config.h"
#include "model/layers/decoder_layer.h"
#include "model/layers/embedding.h"
#include "model/layers/output_head.h"
#include "model/layout.h"
#include "model/micro_batch.h"
#include "model/parallel_context.h"
#include "model/precision_gemm.h"
#include "model/recompute.h"
#include "model/spec.h"
#include "parallel/ring_attention.h"

namespace mt::model {

struct StageOptions {
  Precision precision = Precision::fp32;
  RecomputeConfig recompute;
  int micro_batch_size = 1;  // samples per micro-batch (the buffers' capacity)
  int sequence_length = 0;   // tokens per sample on this rank (seq_length / CP); 0: the model's seq_length
  int activation_slots = 1;  // micro-batches in flight
  // When not empty: the slots' memory, one block of activation_slot_floats() each (allocated by
  // the caller, who lays the rank's other chunks' slots in the same blocks); replaces
  // activation_slots.
  std::vector<float*> slot_blocks{};
  uint64_t seed = 0;         // dropout
  Fp8Scaling* fp8 = nullptr;  // FP8 mode of the decoder layers' linears (model/fp8_scaling.h); null: off
};

struct ForwardPass {
  uint64_t iteration = 0;  // dropout key
  bool training = true;    // false: no dropout (evaluation); backward needs training passes
};

struct StageOutput {
  const float* activation = nullptr;  // (sequence rows, hidden), a chunk without the head
};

struct MoeLayerState;

class Stage {
 public:
  // Chunk `chunk` of `layout`. `weights` (the rank's GEMM weight copy), `parallel` and `ops`
  // must outlive the stage. Activation buffers report to `ledger` (nullable) through the
  // stage's own ledger.
  Stage(const ModelConfig& config, const ParamLayout& layout, int chunk, const ParallelContext& parallel,
        const backend::Ops& ops, const GemmWeights& weights, const StageOptions& options,
        backend::MemoryLedger* ledger = nullptr);
  ~Stage();
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  // The rank's flat fp32 parameters and grads (laid out by the layout).
  void bind(const float* params, float* grads);
  void on_grads_ready(std::function<void(int layer)> callback) { grads_ready_ = std::move(callback); }
  void on_before_forward(std::function<void(int layer)> callback) { before_forward_ = std::move(callback); }
  // FSDP's parameter units (optim/fsdp_params.h): after a layer's forward (its parameters may go),
  // and before its backward (its parameters must be back; a recomputed group's layers all signal
  // before its recompute). Same layer ids; the head's covers the MTP depths.
  void on_after_forward(std::function<void(int layer)> callback) { after_forward_ = std::move(callback); }
  void on_before_backward(std::function<void(int layer)> callback) { before_backward_ = std::move(callback); }

  bool is_first() const { return blocks_.embedding != nullptr; }
  bool is_last() const { return blocks_.head != nullptr; }
  int first_layer() const { return first_layer_; }
  int last_layer() const { return last_layer_; }
  int activation_slots() const { return pool_->slots(); }

  // Where a stage after the first should receive its input activation for `slot` (forward
  // reads it in place when given this pointer).
  float* input_buffer(int slot);
  // First stage: embeds batch.tokens (input ignored). Others: `input` (sequence rows, hidden).
  StageOutput forward(int slot, const MicroBatch& batch, const float* input, const ForwardPass& pass);
  // Last stage: d_output ignored, starts from the loss times dloss_scale. Others: `d_output`.
  // The returned grad is valid until the next backward on this stage.
  const float* backward(int slot, const float* d_output, float dloss_scale);

  // The last stage's logits of a forwarded slot: (rows, logits_width()) local vocabulary columns
  // starting at global column vocab_start(), of which valid_logits() are real vocabulary.
  const float* logits(int slot) const;
  int64_t logits_width() const;
  int64_t vocab_start() const;
  int64_t valid_logits() const;

  // Mixture of experts: the chunk's MoE layers in layer order (none for a dense chunk), each with
  // its state (model/layers/moe_mlp.h MoeLayerState): the router's logged aux / z values of each
  // training forward since their clear_losses(), the tokens per expert after dropping counted by
  // forwards that build grads (not recompute, not evaluation) until the trainer zeroes them, and
  // the expert bias the trainer updates once per global batch and checkpoints.
  int moe_layer_count() const;
  MoeLayerState& moe_layer(int index);
  // d(objective) / d(aux loss value) that the following backward passes give the MoE routers'
  // aux and z-losses (Megatron's main_loss_backward_scale; with --calculate-per-token-loss the
  // caller includes the router's factor, model/moe/router.h). The trainer sets it before each
  // micro-batch's backward; 0 (the default) gives the losses no grads.
  void set_aux_loss_grad_factor(float factor) { aux_loss_grad_factor_ = factor; }
  // BERT with the binary head: d(objective) / d(a micro-batch's sop loss, its sample mean) for the
  // following backward passes (the trainer's loss scale over micro-batches x DP); 0 (the default)
  // gives the sop loss no grads.
  void set_sop_loss_grad_factor(float factor) { sop_loss_grad_factor_ = factor; }

  // Bytes of activation buffers the stage allocated (measured by the allocator; not the
  // caller's slot blocks) and their high-water mark.
  int64_t activation_bytes() const { return ledger_.peak(backend::MemoryCategory::activations); }

 private:
  struct SlotState;
  LayerContext context() const;
  void make_ring_attention();
  LayerPass layer_pass(const SlotState& state, int64_t rows) const;
  SlotActivations& slot_activations(int slot);

  ModelConfig config_;
  const ParallelContext& parallel_;
  const backend::Ops& ops_;
  StageOptions options_;
  int first_layer_, last_layer_;
  int64_t capacity_rows_;
  backend::MemoryLedger ledger_;
  PrecisionGemm gemm_;
  ChunkModules blocks_;  // the chunk's embedding, decoder layers and head, from its spec
  RecomputePlan recompute_;
  std::unique_ptr<ActivationPool> pool_;
  std::unique_ptr<parallel::RingAttention> ring_attention_;  // CP > 1 with layers
  std::vector<SlotState> states_;
  const float* params_ = nullptr;
  float* grads_ = nullptr;
  std::function<void(int)> grads_ready_;
  std::function<void(int)> before_forward_;
  std::function<void(int)> after_forward_;
  std::function<void(int)> before_backward_;
  float aux_loss_grad_factor_ = 0.0f;
  float sop_loss_grad_factor_ = 0.0f;
};

// The activation buffers' shape of chunk `chunk` of `layout` for micro-batches of `rows` tokens.
ActivationShape activation_shape(const ModelConfig& config, const ParamLayout& layout, int chunk,
                                 const ParallelContext& parallel, int64_t rows, Precision precision);

// Floats one activation slot of chunk `chunk` takes (the block size of StageOptions::slot_blocks).
int64_t activation_slot_floats(const ModelConfig& config, const ParamLayout& layout, int chunk,
                               const ParallelContext& parallel, const StageOptions& options);

// Activation bytes a single-rank stage over layers [0, layers) (with both ends) would hold for
// micro-batches of `micro_batch_size` samples of the model's seq_length, without allocating:
// refuses a configuration that cannot fit before anything is allocated.
int64_t planned_activation_bytes(const ModelConfig& config, Precision precision, const RecomputeConfig& recompute,
                                 int micro_batch_size, int layers);
// The same for chunk `chunk` of a rank's `layout` (its TP shard), as a Stage with `slots`
// activation slots allocates them: micro-batches of `rows` tokens on the rank, the residual
// stream split `sequence_parallel_degree` ways (TP under sequence parallelism, else 1).
int64_t planned_activation_bytes(const ModelConfig& config, const ParamLayout& layout, int chunk, int64_t rows,
                                 int sequence_parallel_degree, Precision precision, const RecomputeConfig& recompute,
                                 int slots);

}  // namespace mt::model
