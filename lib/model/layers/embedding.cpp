// The input embedding (see embedding.h).
#include "model/layers/embedding.h"

#include "core/error.h"

namespace mt::model {

Embedding::Embedding(const ModelConfig& config, const EmbeddingSpec& spec, int dropout_layer)
    : spec_(spec),
      hidden_(config.hidden_size),
      padded_vocab_(config.padded_vocab_size()),
      max_positions_(config.max_position_embeddings),
      init_std_(config.init_method_std),
      hidden_dropout_(config.hidden_dropout),
      dropout_layer_(dropout_layer) {}

void Embedding::declare(ParamDeclarations& declarations) const {
  const std::string vocab = "the padded vocabulary " + std::to_string(padded_vocab_);
  ParamDeclaration word{kWordEmbeddings, {padded_vocab_, hidden_}, TensorSplit::column_parallel, kEmbeddingLayer,
                        Init::normal(init_std_), 1, vocab};
  word.tied_embedding = spec_.tied_to_output || spec_.shared_with_mtp;
  declarations.add_single(word);
  if (spec_.kind == EmbeddingKind::word_and_learned_positions) {
    ParamDeclaration positions{kPositionEmbeddings, {max_positions_, hidden_}, TensorSplit::replicated,
                               kEmbeddingLayer, Init::normal(init_std_)};
    positions.full_rows = true;
    declarations.add_single(positions);
  }
  if (spec_.token_types) {
    ParamDeclaration types{kTokenTypeEmbeddings, {kTokenTypes, hidden_}, TensorSplit::replicated, kEmbeddingLayer,
                           Init::normal(init_std_)};
    types.full_rows = true;
    declarations.add_single(types);
  }
}

void Embedding::bind(const ParamLayout& layout) {
  const ParamEntry& word = layout.find(kWordEmbeddings);
  word_ = word.offset;
  vocab_start_ = word.shard_offset;
  vocab_end_ = word.shard_offset + word.local_shape[0];
  position_ = spec_.kind == EmbeddingKind::word_and_learned_positions ? param_offset(layout, kPositionEmbeddings) : -1;
  token_type_ = spec_.token_types ? param_offset(layout, kTokenTypeEmbeddings) : -1;
}

kernels::DropoutKey Embedding::dropout_key(const LayerContext& ctx, const LayerPass& pass) const {
  return kernels::DropoutKey{ctx.seed, dropout_stream("embedding", dropout_layer_), pass.iteration, hidden_dropout_};
}

void Embedding::forward(const LayerContext& ctx, const LayerPass& pass, float* full_buffer, float* x_seq,
                        float* token_type_rows) const {
  const ParallelContext& parallel = ctx.parallel;
  const bool sequence_parallel = parallel.sequence_parallel();
  float* full = sequence_parallel ? full_buffer : x_seq;
  const bool adds_positions = position_ >= 0 && parallel.tensor_parallel_rank() == 0;
  ctx.ops.embedding_forward(pass.batch.tokens, pass.batch.positions, ctx.params + word_,
                            adds_positions ? ctx.params + position_ : nullptr, full, pass.rows, hidden_, vocab_start_,
                            vocab_end_, ctx.stream);
  if (token_type_ >= 0 && parallel.tensor_parallel_rank() == 0) {
    if (!pass.batch.token_types || !token_type_rows) {
      throw Error("BERT's token-type embedding", "needs the micro-batch's token types and a buffer for their rows");
    }
    ctx.ops.embedding_forward(pass.batch.token_types, nullptr, ctx.params + token_type_, nullptr, token_type_rows,
                              pass.rows, hidden_, 0, kTokenTypes, ctx.stream);
    ctx.ops.add_inplace(full, token_type_rows, pass.rows * hidden_, ctx.stream);
  }
  if (sequence_parallel) {
    parallel.reduce_scatter_to_sequence_parallel_region(full, x_seq, pass.rows, hidden_);
  } else {
    parallel.reduce_from_tensor_parallel_region(full, pass.rows * hidden_);
  }
  const kernels::DropoutKey key = dropout_key(ctx, pass);
  if (pass.training && key.p > 0) {
    ctx.ops.dropout_forward(x_seq, pass.sequence_rows, hidden_, pass.sequence_row_ids, 0, key, ctx.stream);
  }
}

void Embedding::backward(const LayerContext& ctx, const LayerPass& pass, float* dx_seq, float* full_buffer) const {
  const ParallelContext& parallel = ctx.parallel;
  const kernels::DropoutKey key = dropout_key(ctx, pass);
  if (key.p > 0) {
    ctx.ops.dropout_backward(dx_seq, pass.sequence_rows, hidden_, pass.sequence_row_ids, 0, key, ctx.stream);
  }
  const float* dy = parallel.sequence_parallel()
                        ? parallel.reduce_scatter_to_sequence_parallel_region_backward(dx_seq, full_buffer, pass.rows,
                                                                                       hidden_)
                        : parallel.reduce_from_tensor_parallel_region_backward(dx_seq);
  ctx.ops.embedding_backward(pass.batch.tokens, pass.batch.positions, dy, ctx.grads + word_,
                             position_ >= 0 ? ctx.grads + position_ : nullptr, pass.rows, hidden_, vocab_start_,
                             vocab_end_, ctx.stream);
  if (token_type_ >= 0) {
    ctx.ops.embedding_backward(pass.batch.token_types, nullptr, dy, ctx.grads + token_type_, nullptr, pass.rows,
                               hidden_, 0, kTokenTypes, ctx.stream);
  }
}

}  // namespace mt::model
