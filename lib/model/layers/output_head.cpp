// The final norm, output layer and vocab-parallel cross-entropy (see output_head.h).
#include "model/layers/output_head.h"

#include <algorithm>

#include "core/error.h"
#include "model/layers/embedding.h"

namespace mt::model {
namespace {

constexpr const char* kFinalNorm = "decoder.final_layernorm";
constexpr const char* kOutputLayer = "output_layer.weight";

const char* output_weight_name(const HeadSpec& spec) {
  return spec.output == OutputWeight::own ? kOutputLayer : Embedding::kWordEmbeddings;
}

}  // namespace

OutputHead::OutputHead(const ModelConfig& config, const HeadSpec& spec)
    : spec_(spec),
      hidden_(config.hidden_size),
      padded_vocab_(config.padded_vocab_size()),
      vocab_size_(config.vocab_size),
      init_std_(config.init_method_std),
      layer_(head_layer(config)),
      norm_(config, kFinalNorm, layer_) {}

void OutputHead::declare(ParamDeclarations& declarations) const {
  norm_.declare(declarations);
  declare_output_weight(declarations);
}

void OutputHead::declare_output_weight(ParamDeclarations& declarations) const {
  const std::string vocab = "the padded vocabulary " + std::to_string(padded_vocab_);
  ParamDeclaration weight{output_weight_name(spec_), {padded_vocab_, hidden_}, TensorSplit::column_parallel, layer_,
                          Init::normal(init_std_), 1, vocab};
  switch (spec_.output) {
    case OutputWeight::own:
      declarations.add_single(weight);
      break;
    case OutputWeight::tied_copy:
      // The last stage of a pipeline holds its own copy of the tied embedding (Megatron does the
      // same and keeps the copies equal by an all-reduce of their grads): the same tensor, so
      // the same init.
      weight.tied_embedding = weight.tied_copy = true;
      declarations.add_single(weight);
      break;
    case OutputWeight::tied_embedding:
      break;  // the embedding declares it
  }
}

void OutputHead::bind(const ParamLayout& layout) {
  norm_.bind(layout);
  const ParamEntry& weight = layout.find(output_weight_name(spec_));
  rebind_output(layout, -1);
  vocab_start_ = weight.shard_offset;
  valid_ = std::clamp<int64_t>(vocab_size_ - vocab_start_, 0, output_.out_features());
}

void OutputHead::rebind_output(const ParamLayout& layout, int64_t bias_offset) {
  const ParamEntry& weight = layout.find(output_weight_name(spec_));
  output_ = ColumnParallelLinear(LinearParams{weight.offset, bias_offset, hidden_, weight.local_shape[0]});
}

HeadActivations OutputHead::lay_out_activations(BufferSource& source, const ActivationRows& rows) const {
  const int64_t n = rows.rows, s = rows.sequence_rows;
  HeadActivations a;
  a.final_hidden = source.take(s * hidden_);
  a.final_norm = source.take(s * hidden_);
  const Norm::Statistics statistics = norm_.lay_out_statistics(source, s);
  a.final_mean = statistics.mean;
  a.final_rstd = statistics.rstd;
  a.logits = source.take(n * vocab_width());
  a.row_max = source.take(n);
  a.row_sumexp = source.take(n);
  a.target_logit = source.take(n);
  return a;
}

void OutputHead::forward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& a,
                         const HeadWorkspace& w) const {
  if (!pass.batch.loss_sums) throw Error("output head", "the micro-batch has no device loss sums to add to");
  norm_.forward(ctx, a.final_hidden, a.final_norm, a.final_mean, a.final_rstd, pass.sequence_rows);
  output_.forward(ctx, pass, a.final_norm, w.sequence_parallel, a.logits);
  cross_entropy_forward(ctx, pass, a);
}

void OutputHead::cross_entropy_forward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& a) const {
  const backend::Ops& ops = ctx.ops;
  const ParallelContext& parallel = ctx.parallel;
  const int64_t n = pass.rows, vocab = vocab_width();
  ops.xent_row_max(a.logits, n, vocab, valid_, a.row_max, ctx.stream);
  parallel.all_reduce_max_over_tensor_parallel(a.row_max, n);
  ops.xent_row_sumexp(a.logits, n, vocab, valid_, a.row_max, a.row_sumexp, ctx.stream);
  parallel.all_reduce_sum_over_tensor_parallel(a.row_sumexp, n);
  ops.xent_target_logit(a.logits, n, vocab, valid_, vocab_start_, pass.batch.labels, a.target_logit, ctx.stream);
  parallel.all_reduce_sum_over_tensor_parallel(a.target_logit, n);
  ops.xent_loss_sums(a.row_max, a.row_sumexp, a.target_logit, pass.batch.loss_mask, n, pass.batch.loss_sums,
                     pass.batch.loss_sums + 1, ctx.stream);
}

void OutputHead::backward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& a, float dloss_scale,
                          const HeadWorkspace& w, float* d_hidden, const float* d_final_norm) const {
  cross_entropy_backward(ctx, pass, a, dloss_scale, w);
  output_.backward(ctx, pass, a.logits, a.final_norm, w.sequence_parallel, w.d_norm);
  if (d_final_norm) ctx.ops.add_inplace(w.d_norm, d_final_norm, pass.sequence_rows * hidden_, ctx.stream);
  norm_.backward(ctx, w.d_norm, a.final_hidden, a.final_mean, a.final_rstd, d_hidden, pass.sequence_rows);
}

void OutputHead::cross_entropy_backward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& a,
                                        float dloss_scale, const HeadWorkspace& w) const {
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
}

}  // namespace mt::model
