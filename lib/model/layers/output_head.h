// The model's end on the last chunk: the final norm, the output layer (a column-parallel linear
// over the padded vocabulary: the tied word embedding, or output_layer.weight when untied) and
// Megatron's vocab-parallel cross-entropy. The logits stay split over TP (rows, local vocab);
// only the three small all-reduces over (rows) values cross ranks (row max, sum of exps, target
// logit), and padded vocabulary columns never enter the softmax. HeadKind::language_model; its
// own output layer (untied) starts N(0, init_method_std) like the word embedding. Its interface is
// virtual: HeadKind::bert's head (model/layers/bert_head.h) builds on it. Tested through the
// PyTorch goldens, the model's finite differences and the TP = 2 stage test.
#pragma once

#include <memory>

#include "model/layers/block.h"
#include "model/layers/layer_context.h"
#include "model/layers/linear.h"
#include "model/layers/norm.h"
#include "model/spec.h"

namespace mt::model {

// What the head keeps for backward (S sequence rows, N rows, V local vocabulary columns).
struct HeadActivations {
  float* final_hidden = nullptr;  // (S, C) the last layer's output
  float* final_norm = nullptr;    // (S, C)
  float* final_mean = nullptr;    // (S), LayerNorm only
  float* final_rstd = nullptr;    // (S)
  float* logits = nullptr;        // (N, V); dlogits in place in backward
  float* row_max = nullptr;       // (N) over the whole vocabulary
  float* row_sumexp = nullptr;    // (N)
  float* target_logit = nullptr;  // (N)
  std::shared_ptr<BlockBuffers> variant;  // a head variant's own buffers (BERT's LM head and pooler)
};

struct HeadWorkspace {
  SequenceParallelBuffers sequence_parallel;
  float* d_norm = nullptr;    // (S, C)
  float* dloss = nullptr;     // (N)
};

class OutputHead {
 public:
  OutputHead(const ModelConfig& config, const HeadSpec& spec);
  virtual ~OutputHead() = default;

  virtual void declare(ParamDeclarations& declarations) const;
  virtual void bind(const ParamLayout& layout);
  // Its activations for micro-batches of `rows` (laid out in the stage's slots).
  virtual HeadActivations lay_out_activations(BufferSource& source, const ActivationRows& rows) const;

  int64_t vocab_width() const { return output_.out_features(); }  // local, incl. padding (bound)
  int64_t vocab_start() const { return vocab_start_; }
  // Local columns that are real vocabulary (the rest is padding).
  int64_t valid_columns() const { return valid_; }

  // Logits from acts.final_hidden; the micro-batch's loss sums added to pass.batch.loss_sums
  // (device doubles, on the stream; mt::Error when the batch has none).
  virtual void forward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& acts,
                       const HeadWorkspace& work) const;
  // d_hidden (S, C) = d(sum_r dloss_scale * mask[r] * loss[r]) / d final_hidden; grads accumulate.
  // `d_final_norm` (S, C; nullable): a grad of the final norm's output from elsewhere (the
  // multi-token prediction block reads it), added before the norm's backward.
  virtual void backward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& acts, float dloss_scale,
                        const HeadWorkspace& work, float* d_hidden, const float* d_final_norm = nullptr) const;

 protected:
  // The output layer's weight (own, the tied embedding's copy, or none: the embedding declares it).
  void declare_output_weight(ParamDeclarations& declarations) const;
  // The output layer bound to its weight in `layout`, with the bias at `bias_offset` (-1: none).
  void rebind_output(const ParamLayout& layout, int64_t bias_offset);
  // The vocab-parallel cross-entropy of acts.logits against the micro-batch's labels: row max,
  // sum of exps and target logit (all-reduced over TP), the loss sums added to batch.loss_sums.
  void cross_entropy_forward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& acts) const;
  // acts.logits -> dlogits in place for loss weights mask[r] * dloss_scale (work.dloss).
  void cross_entropy_backward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& acts,
                              float dloss_scale, const HeadWorkspace& work) const;

  HeadSpec spec_;
  int64_t hidden_, padded_vocab_, vocab_size_;
  double init_std_;
  int layer_;  // head_layer()
  Norm norm_;
  ColumnParallelLinear output_;
  int64_t vocab_start_ = 0, valid_ = 0;
};

}  // namespace mt::model
