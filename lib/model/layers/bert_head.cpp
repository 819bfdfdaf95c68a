// BERT's LM head, pooler and sentence-order head (see bert_head.h).
#include "model/layers/bert_head.h"

#include <memory>
#include <string>

#include "core/error.h"

namespace mt::model {

namespace {

constexpr const char* kDense = "lm_head.dense";
constexpr const char* kLmNorm = "lm_head.layer_norm";
constexpr const char* kVocabBias = "output_layer.bias";
constexpr const char* kPooler = "pooler.dense";
constexpr const char* kBinary = "binary_head";
constexpr int kClasses = 2;  // sentence order: in order, swapped

std::string weight(const char* module) { return std::string(module) + ".weight"; }
std::string bias(const char* module) { return std::string(module) + ".bias"; }

}  // namespace

// What the head keeps from forward to backward (S sequence rows, B samples).
struct BertHead::Buffers : BlockBuffers {
  float* dense = nullptr;    // (S, C) lm_head.dense's output, before GELU; d_dense in backward
  float* act = nullptr;      // (S, C) after GELU
  float* lm = nullptr;       // (S, C) after lm_head.layer_norm: the output layer's input
  Norm::Statistics lm_statistics;
  float* pool_in = nullptr;   // (B, C) each sample's first row of the final norm's output
  float* pooled = nullptr;    // (B, C) tanh(pooler); the pooler input's grad in backward
  float* binary = nullptr;    // (B, 2) the sentence-order logits; their grads in backward
  float* binary_max = nullptr, *binary_sumexp = nullptr, *binary_target = nullptr;  // (B)
  float* d_pool = nullptr;    // (B, C) the pooler's output before tanh; its grad in backward
  float* dsop = nullptr;      // (B)
  int64_t samples = 0;        // B: the capacity
};

BertHead::BertHead(const ModelConfig& config, const HeadSpec& spec)
    : OutputHead(config, spec),
      binary_head_(spec.binary_head),
      seq_length_(config.seq_length),
      lm_norm_(config, kLmNorm, head_layer(config)) {}

void BertHead::declare(ParamDeclarations& declarations) const {
  norm_.declare(declarations);
  const int layer = layer_;
  const Init normal = Init::normal(init_std_), zero = Init::constant(0.0f);
  using S = TensorSplit;
  declarations.add_single({weight(kDense), {hidden_, hidden_}, S::replicated, layer, normal});
  declarations.add_single({bias(kDense), {hidden_}, S::replicated, layer, zero});
  lm_norm_.declare(declarations);
  OutputHead::declare_output_weight(declarations);
  const std::string vocab = "the padded vocabulary " + std::to_string(padded_vocab_);
  declarations.add_single({kVocabBias, {padded_vocab_}, S::column_parallel, layer, zero, 1, vocab});
  if (!binary_head_) return;
  // Every TP rank runs the pooler on the same rows (Megatron gathers them under SP): full rows.
  auto full_rows = [&](ParamDeclaration declaration) {
    declaration.full_rows = true;
    declarations.add_single(declaration);
  };
  full_rows({weight(kPooler), {hidden_, hidden_}, S::replicated, layer, normal});
  full_rows({bias(kPooler), {hidden_}, S::replicated, layer, zero});
  full_rows({weight(kBinary), {kClasses, hidden_}, S::replicated, layer, normal});
  full_rows({bias(kBinary), {kClasses}, S::replicated, layer, zero});
}

void BertHead::bind(const ParamLayout& layout) {
  OutputHead::bind(layout);
  lm_norm_.bind(layout);
  dense_weight_ = param_offset(layout, weight(kDense));
  dense_bias_ = param_offset(layout, bias(kDense));
  rebind_output(layout, param_offset(layout, kVocabBias));
  if (!binary_head_) return;
  pooler_weight_ = param_offset(layout, weight(kPooler));
  pooler_bias_ = param_offset(layout, bias(kPooler));
  binary_weight_ = param_offset(layout, weight(kBinary));
  binary_bias_ = param_offset(layout, bias(kBinary));
}

HeadActivations BertHead::lay_out_activations(BufferSource& source, const ActivationRows& rows) const {
  HeadActivations a = OutputHead::lay_out_activations(source, rows);
  auto b = std::make_shared<Buffers>();
  const int64_t s = rows.sequence_rows;
  b->dense = source.take(s * hidden_);
  b->act = source.take(s * hidden_);
  b->lm = source.take(s * hidden_);
  b->lm_statistics = lm_norm_.lay_out_statistics(source, s);
  if (binary_head_) {
    b->samples = (rows.rows + seq_length_ - 1) / seq_length_;
    b->pool_in = source.take(b->samples * hidden_);
    b->pooled = source.take(b->samples * hidden_);
    b->binary = source.take(b->samples * kClasses);
    b->binary_max = source.take(b->samples);
    b->binary_sumexp = source.take(b->samples);
    b->binary_target = source.take(b->samples);
    b->d_pool = source.take(b->samples * hidden_);
    b->dsop = source.take(b->samples);
  }
  a.variant = std::move(b);
  return a;
}

void BertHead::forward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& a,
                       const HeadWorkspace& w) const {
  if (!pass.batch.loss_sums) throw Error("BERT's head", "the micro-batch has no device loss sums to add to");
  if (ctx.parallel.context_parallel_size() > 1) {
    throw Error("BERT's head", "context parallelism is not supported yet (the pooler's buffers hold a micro-batch "
                               "of whole sequences)");
  }
  Buffers& b = static_cast<Buffers&>(*a.variant);
  const backend::Ops& ops = ctx.ops;
  const int64_t s = pass.sequence_rows;
  norm_.forward(ctx, a.final_hidden, a.final_norm, a.final_mean, a.final_rstd, s);
  ctx.gemm.linear_forward(a.final_norm, s, hidden_, dense_weight_, hidden_, b.dense);
  ops.bias_add(b.dense, ctx.params + dense_bias_, s, static_cast<int>(hidden_), ctx.stream);
  ops.gelu_erf_forward(b.dense, b.act, s * hidden_, ctx.stream);  // BertLMHead's F.gelu: the erf form
  lm_norm_.forward(ctx, b.act, b.lm, b.lm_statistics.mean, b.lm_statistics.rstd, s);
  output_.forward(ctx, pass, b.lm, w.sequence_parallel, a.logits);  // + the vocabulary bias
  cross_entropy_forward(ctx, pass, a);
  if (binary_head_) binary_forward(ctx, pass, a, w, b);
}

void BertHead::binary_forward(const LayerContext& ctx, const LayerPass& pass, const HeadActivations& a,
                              const HeadWorkspace& w, Buffers& b) const {
  const MicroBatch& batch = pass.batch;
  if (!batch.sop_sums || !batch.sentence_order) {
    throw Error("BERT's binary head", "the micro-batch has no sentence-order targets or sop loss sums");
  }
  if (batch.batch > b.samples) {
    throw Error("BERT's binary head", "a micro-batch of " + std::to_string(batch.batch) + " samples, buffers for " +
                                          std::to_string(b.samples));
  }
  const backend::Ops& ops = ctx.ops;
  const int64_t samples = batch.batch, row_bytes = static_cast<int64_t>(sizeof(float)) * hidden_;
  // Under SP each sample's first row lives on one rank: Megatron's Pooler gathers the whole
  // sequence first, and every TP rank runs the pooler on the same rows.
  const float* final_norm =  // (N, C)
      ctx.parallel.gather_from_sequence_parallel_region(a.final_norm, w.sequence_parallel.gathered, pass.rows, hidden_);
  ops.copy_2d(b.pool_in, row_bytes, final_norm, row_bytes * batch.seq, row_bytes, samples,
              backend::CopyKind::device_to_device, ctx.stream);
  ctx.gemm.linear_forward(b.pool_in, samples, hidden_, pooler_weight_, hidden_, b.d_pool);
  ops.bias_add(b.d_pool, ctx.params + pooler_bias_, samples, static_cast<int>(hidden_), ctx.stream);
  ops.tanh_forward(b.d_pool, b.pooled, samples * hidden_, ctx.stream);
  ctx.gemm.linear_forward(b.pooled, samples, hidden_, binary_weight_, kClasses, b.binary);
  ops.bias_add(b.binary, ctx.params + binary_bias_, samples, kClasses, ctx.stream);
  ops.xent_row_max(b.binary, samples, kClasses, kClasses, b.binary_max, ctx.stream);
  ops.xent_row_sumexp(b.binary, samples, kClasses, kClasses, b.binary_max, b.binary_sumexp, ctx.stream);
  ops.xent_target_logit(b.binary, samples, kClasses, kClasses, 0, batch.sentence_order, b.binary_target, ctx.stream);
  ops.xent_loss_sums(b.binary_max, b.binary_sumexp, b.binary_target, nullptr, samples, batch.sop_sums,
                     batch.sop_sums + 1, ctx.stream);
}

void BertHead::backward(const LayerContext& ctx, const LayerPass& pass, HeadActivations& a, float dloss_scale,
                        const HeadWorkspace& w, float* d_hidden, const float* d_final_norm) const {
  if (d_final_norm) throw Error("the BERT head", "has no multi-token prediction to take a final-norm grad from");
  Buffers& b = static_cast<Buffers&>(*a.variant);
  const backend::Ops& ops = ctx.ops;
  const int64_t s = pass.sequence_rows;
  cross_entropy_backward(ctx, pass, a, dloss_scale, w);
  output_.backward(ctx, pass, a.logits, b.lm, w.sequence_parallel, w.d_norm);  // d_lm
  // d_hidden and b.dense serve as scratch until the final norm's backward writes d_hidden.
  lm_norm_.backward(ctx, w.d_norm, b.act, b.lm_statistics.mean, b.lm_statistics.rstd, d_hidden, s);  // d_act
  ops.gelu_erf_backward(d_hidden, b.dense, b.act, s * hidden_, ctx.stream);  // d_dense into act
  ops.bias_backward(b.act, ctx.grads + dense_bias_, s, static_cast<int>(hidden_), ctx.stream);
  ctx.gemm.linear_backward_weight(b.act, a.final_norm, s, hidden_, hidden_, dense_weight_);
  ctx.gemm.linear_backward_input(b.act, s, hidden_, dense_weight_, hidden_, w.d_norm);  // d_final_norm
  if (binary_head_) binary_backward(ctx, pass, b, w.d_norm);
  norm_.backward(ctx, w.d_norm, a.final_hidden, a.final_mean, a.final_rstd, d_hidden, s);
}

void BertHead::binary_backward(const LayerContext& ctx, const LayerPass& pass, Buffers& b, float* d_norm) const {
  const MicroBatch& batch = pass.batch;
  const backend::Ops& ops = ctx.ops;
  const int64_t samples = batch.batch;
  // Megatron's sop loss is the micro-batch's sample mean.
  ops.fill(b.dsop, samples, pass.sop_loss_grad_factor / static_cast<float>(samples), ctx.stream);
  ops.xent_backward(b.binary, samples, kClasses, kClasses, 0, batch.sentence_order, b.binary_max, b.binary_sumexp,
                    b.dsop, ctx.stream);
  ops.bias_backward(b.binary, ctx.grads + binary_bias_, samples, kClasses, ctx.stream);
  ctx.gemm.linear_backward_weight(b.binary, b.pooled, samples, kClasses, hidden_, binary_weight_);
  ctx.gemm.linear_backward_input(b.binary, samples, kClasses, binary_weight_, hidden_, b.d_pool);
  ops.tanh_backward(b.d_pool, b.pooled, b.d_pool, samples * hidden_, ctx.stream);
  ops.bias_backward(b.d_pool, ctx.grads + pooler_bias_, samples, static_cast<int>(hidden_), ctx.stream);
  ctx.gemm.linear_backward_weight(b.d_pool, b.pool_in, samples, hidden_, hidden_, pooler_weight_);
  ctx.gemm.linear_backward_input(b.d_pool, samples, hidden_, pooler_weight_, hidden_, b.pooled);  // d_pool_in
  // The gather's backward is a split (Megatron's tensor_parallel_output_grad=False): every TP
  // rank holds the same d_pool_in, and each adds the rows of the samples whose first token it holds.
  const int64_t first = ctx.parallel.sequence_row_offset(pass.rows);
  for (int64_t sample = 0; sample < samples; ++sample) {
    const int64_t row = sample * batch.seq - first;
    if (row < 0 || row >= pass.sequence_rows) continue;
    ops.add_inplace(d_norm + row * hidden_, b.pooled + sample * hidden_, hidden_, ctx.stream);
  }
}

}  // namespace mt::model
