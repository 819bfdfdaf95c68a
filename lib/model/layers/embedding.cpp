// The input embedding (see embedding.h).
#include "model/layers/embedding.h"

namespace mt::model {

void Embedding::declare(ParamDeclarations& declarations, const ModelConfig& config) {
  const std::string vocab = "the padded vocabulary " + std::to_string(config.padded_vocab_size());
  declarations.add_single(kWordEmbeddings, {config.padded_vocab_size(), config.hidden_size},
                          TensorSplit::column_parallel, kEmbeddingLayer, 1, vocab);
  if (config.position_embedding == PositionEmbedding::learned_absolute) {
    declarations.add_single(kPositionEmbeddings, {config.max_position_embeddings, config.hidden_size},
                            TensorSplit::replicated, kEmbeddingLayer);
  }
}

Embedding::Embedding(const ModelConfig& config, const ParamLayout& layout)
    : hidden_(config.hidden_size),
      hidden_dropout_(config.hidden_dropout),
      word_(param_offset(layout, kWordEmbeddings)),
      position_(optional_param_offset(layout, kPositionEmbeddings)) {
  const ParamEntry& word = layout.find(kWordEmbeddings);
  vocab_start_ = word.shard_offset;
  vocab_end_ = word.shard_offset + word.local_shape[0];
}

kernels::DropoutKey Embedding::dropout_key(const LayerContext& ctx, const LayerPass& pass) const {
  return kernels::DropoutKey{ctx.seed, dropout_stream("embedding", kEmbeddingLayer), pass.iteration, hidden_dropout_};
}

void Embedding::forward(const LayerContext& ctx, const LayerPass& pass, float* full_buffer, float* x_seq) const {
  const ParallelContext& parallel = ctx.parallel;
  const bool sequence_parallel = parallel.sequence_parallel();
  float* full = sequence_parallel ? full_buffer : x_seq;
  const bool adds_positions = position_ >= 0 && parallel.tensor_parallel_rank() == 0;
  ctx.ops.embedding_forward(pass.batch.tokens, pass.batch.positions, ctx.params + word_,
                            adds_positions ? ctx.params + position_ : nullptr, full, pass.rows, hidden_, vocab_start_,
                            vocab_end_, ctx.stream);
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
}

}  // namespace mt::model
