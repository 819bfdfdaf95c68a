// BERT's end of the model (HeadKind::bert), Megatron-Core's BertModel after its encoder: the final
// LayerNorm (decoder.final_layernorm), BertLMHead (lm_head.dense h -> h with bias, GELU,
// lm_head.layer_norm), the output layer tied to the word embeddings with a vocabulary bias
// (output_layer.bias, split over TP like the vocabulary, init 0) and the vocab-parallel
// cross-entropy of the base head over the masked positions (loss_mask); with the binary head, the
// pooler (pooler.dense h -> h with bias, then tanh, on each sample's first token of the final
// LayerNorm's output) and the sentence-order head (binary_head h -> 2 with bias), whose
// cross-entropy against the micro-batch's sentence_order is added to batch.sop_sums (sum, samples).
// Backward: the LM loss with dloss_scale per masked token (as the base head), the sop loss with
// LayerPass::sop_loss_grad_factor over the micro-batch's samples (Megatron's per-micro-batch mean).
// The dense, pooler and binary weights start N(0, init_method_std), biases 0, the norm 1 and 0.
// The LM head's GELU is the erf form, as BertLMHead's torch.nn.functional.gelu (the encoder's MLP
// keeps the tanh form of Megatron's fused bias-GELU).
// Under sequence parallelism (as Megatron-Core's BertModel) the LM head's dense, GELU and LayerNorm
// run on this rank's sequence rows (their weights' grads summed over TP, as the encoder's norms),
// the output layer gathers its input like any column-parallel linear, and the pooler gathers the
// final norm's rows and runs on every TP rank alike (its weights' grads are not summed: full_rows).
// Context parallelism is refused by name (the encoder's ring attention runs non-causal, the head
// is not built for it yet).
// Tested in tests/unit/model/test_bert.cpp (against Megatron-Core's BertModel: tests/golden/bert).
#pragma once

#include "model/layers/output_head.h"

namespace mt::model {

class BertHead : public OutputHead {
 public:
  BertHead(const ModelConfig& config, const HeadSpec& spec);

  void declare(ParamDeclarations& declarations) const override;
  void bind(const ParamLayout& layout) override;
  HeadActivations lay_out_activations(BufferSource& source, const ActivationRows& rows) const override;

  // Logits and the LM loss sums (batch.loss_sums); with the binary head the sop loss sums
  // (batch.sop_sums). mt::Error when the batch lacks them, or under context parallelism.
  void forward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& acts,
               const HeadWorkspace& work) const override;
  // `d_final_norm` must be null: BERT has no multi-token prediction (ModelConfig::validate_bert).
  void backward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& acts, float dloss_scale,
                const HeadWorkspace& work, float* d_hidden, const float* d_final_norm = nullptr) const override;

 private:
  struct Buffers;
  void binary_forward(const LayerContext& ctx, const LayerPass& pass, const HeadActivations& acts,
                      const HeadWorkspace& work, Buffers& b) const;
  // Adds the sop loss's grad of the pooled rows held here into d_norm (S, C).
  void binary_backward(const LayerContext& ctx, const LayerPass& pass, Buffers& b, float* d_norm) const;

  bool binary_head_;
  int seq_length_;  // samples per micro-batch of `rows` tokens: rows / seq_length
  Norm lm_norm_;
  int64_t dense_weight_ = -1, dense_bias_ = -1;
  int64_t pooler_weight_ = -1, pooler_bias_ = -1, binary_weight_ = -1, binary_bias_ = -1;
};

}  // namespace mt::model
