// The input embedding (Megatron's LanguageModelEmbedding): a vocab-parallel word embedding (each
// TP rank looks up the token ids of its vocabulary rows, zero rows elsewhere), plus the learned
// position table of EmbeddingKind::word_and_learned_positions (GPT-2; TP-replicated, looked up on
// full rows; added by TP rank 0 only, so the sum over TP adds it once), summed over TP by
// reduce_from_tensor_parallel_region or, under sequence parallelism,
// reduce_scatter_to_sequence_parallel_region, then dropout on this rank's rows. Both tables start
// N(0, init_method_std). BERT with the binary head (EmbeddingSpec::token_types) adds Megatron's
// token-type table (2 rows, like the positions: replicated, full rows, added by TP rank 0,
// N(0, init_method_std)) looked up by the micro-batch's token_types. Tested through the model's finite differences, the PyTorch goldens and
// the TP = 2 stage test.
#pragma once

#include "model/layers/layer_context.h"
#include "model/spec.h"

namespace mt::model {

class Embedding {
 public:
  static constexpr const char* kWordEmbeddings = "embedding.word_embeddings.weight";
  static constexpr const char* kPositionEmbeddings = "embedding.position_embeddings.weight";
  static constexpr const char* kTokenTypeEmbeddings = "embedding.tokentype_embeddings.weight";
  static constexpr int kTokenTypes = 2;

  // `dropout_layer`: the layer id of its dropout stream (kEmbeddingLayer; a multi-token
  // prediction depth's lookup uses its own, model/layers/mtp.h).
  Embedding(const ModelConfig& config, const EmbeddingSpec& spec, int dropout_layer = kEmbeddingLayer);

  void declare(ParamDeclarations& declarations) const;
  void bind(const ParamLayout& layout);

  bool has_token_types() const { return spec_.token_types; }

  // x_seq (sequence rows, hidden) = dropout(embedding of the micro-batch's tokens); full_buffer
  // (rows, hidden) holds the partial lookups under SP; token_type_rows (rows, hidden) the
  // token-type lookups (needed with has_token_types()).
  void forward(const LayerContext& ctx, const LayerPass& pass, float* full_buffer, float* x_seq,
               float* token_type_rows = nullptr) const;
  // From dx_seq (sequence rows, hidden; dropout's backward is applied in place), accumulates the
  // tables' grads of the rows the tokens touch.
  void backward(const LayerContext& ctx, const LayerPass& pass, float* dx_seq, float* full_buffer) const;

 private:
  kernels::DropoutKey dropout_key(const LayerContext& ctx, const LayerPass& pass) const;

  EmbeddingSpec spec_;
  int hidden_;
  int64_t padded_vocab_, max_positions_;
  double init_std_;
  float hidden_dropout_;
  int dropout_layer_;
  int64_t word_ = -1, position_ = -1;        // offsets; position_ -1 without a learned table
  int64_t token_type_ = -1;                  // offset; -1 without token types
  int64_t vocab_start_ = 0, vocab_end_ = 0;  // this rank's vocabulary rows
};

}  // namespace mt::model
