// The final norm, output layer and vocab-parallel cross-entropy (see output_head.h).
#include "model/layers/output_head.h"

#include <algorithm>

#include "model/layers/embedding.h"

namespace mt::model {
namespace {

constexpr const char* kFinalNorm = "decoder.final_layernorm";
constexpr const char* kOutputLayer = "output_layer.weight";

const ParamEntry& output_weight(const ModelConfig& config, const ParamLayout& layout) {
  return layout.find(config.untie_embeddings_and_output_weights ? kOutputLayer : Embedding::kWordEmbeddings);
}

}  // namespace

void OutputHead::declare(ParamDeclarations& declarations, const ModelConfig& config, bool tied_copy) {
  Norm::declare(declarations, config, kFinalNorm, head_layer(config));
  const std::vector<int64_t> shape{config.padded_vocab_size(), config.hidden_size};
  const std::string vocab = "the padded vocabulary " + std::to_string(config.padded_vocab_size());
  if (config.untie_embeddings_and_output_weights) {
    declarations.add_single(kOutputLayer, shape, TensorSplit::column_parallel, head_layer(config), 1, vocab);
  } else if (tied_copy) {
    // The last stage of a pipeline holds its own copy of the tied embedding (Megatron does the
    // same and keeps the copies equal by an all-reduce of their grads).
    declarations.add_single(Embedding::kWordEmbeddings, shape, TensorSplit::column_parallel, head_layer(config), 1,
                            vocab);
  }
}

OutputHead::OutputHead(const ModelConfig& config, const ParamLayout& layout)
    : norm_(config, layout, kFinalNorm),
      output_(LinearParams{output_weight(config, layout).offset, -1, config.hidden_size,
                           output_weight(config, layout).local_shape[0]}),
      vocab_start_(output_weight(config, layout).shard_offset),
      valid_(std::clamp<int64_t>(config.vocab_size - vocab_start_, 0, output_.out_features())) {}

LossSums OutputHead::forward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& a,
                             const HeadWorkspace& w) const {
  const backend::Ops& ops = ctx.ops;
  const ParallelContext& parallel = ctx.parallel;
  const int64_t n = pass.rows, vocab = vocab_width();
  norm_.forward(ctx, a.final_hidden, a.final_norm, a.final_mean, a.final_rstd, pass.sequence_rows);
  output_.forward(ctx, pass, a.final_norm, w.sequence_parallel, a.logits);

  ops.xent_row_max(a.logits, n, vocab, valid_, a.row_max, ctx.stream);
  parallel.all_reduce_max_over_tensor_parallel(a.row_max, n);
  ops.xent_row_sumexp(a.logits, n, vocab, valid_, a.row_max, a.row_sumexp, ctx.stream);
  parallel.all_reduce_sum_over_tensor_parallel(a.row_sumexp, n);
  ops.xent_target_logit(a.logits, n, vocab, valid_, vocab_start_, pass.batch.labels, a.target_logit, ctx.stream);
  parallel.all_reduce_sum_over_tensor_parallel(a.target_logit, n);
  LossSums sums;
  ops.xent_loss_sums(a.row_max, a.row_sumexp, a.target_logit, pass.batch.loss_mask, n, &sums.loss, &sums.tokens,
                     ctx.stream);
  return sums;
}

void OutputHead::backward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& a, float dloss_scale,
                          const HeadWorkspace& w, float* d_hidden) const {
  const backend::Ops& ops = ctx.ops;
  const int64_t n = pass.rows;
  if (pass.batch.loss_mask) {
    ops.copy(w.dloss, pass.batch.loss_mask, static_cast<int64_t>(sizeof(float)) * n,
             backend::CopyKind::device_to_device, ctx.stream);
    ops.scale_inplace(w.dloss, n, dloss_scale, ctx.stream);
  } else {
    ops.fill(w.dloss, n, dloss_scale, ctx.stream);
  }
  ops.xent_backward(a.logits, n, vocab_width(), valid_, vocab_start_, pass.batch.labels, a.row_max, a.row_sumexp,
                    w.dloss, ctx.stream);
  output_.backward(ctx, pass, a.logits, a.final_norm, w.sequence_parallel, w.d_norm);
  norm_.backward(ctx, w.d_norm, a.final_hidden, a.final_mean, a.final_rstd, d_hidden, pass.sequence_rows);
}

}  // namespace mt::model
