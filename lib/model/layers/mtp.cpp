// Multi-token prediction (see mtp.h).
#include "model/layers/mtp.h"

#include <algorithm>

#include "core/error.h"
#include "model/fp8_scaling.h"
#include "parallel/sequence_roll.h"

namespace mt::model {

// One depth's activations (S sequence rows, N rows, C hidden, V local vocabulary columns).
struct MtpBlock::Depth {
  int32_t* tokens = nullptr;     // (N) rolled
  int32_t* positions = nullptr;  // (N) rolled
  int32_t* labels = nullptr;     // (N) rolled
  float* loss_mask = nullptr;    // (N) rolled
  float* embedded = nullptr;     // (S, C) enorm's input
  Norm::Statistics enorm, hnorm, final_norm;
  float* concat = nullptr;       // (S, 2C) [enorm(embedded) | hnorm(h_prev)]: eh_proj's input
  float* layer_input = nullptr;  // (S, C)
  std::unique_ptr<BlockBuffers> layer;
  float* layer_output = nullptr;  // (S, C)
  float* hidden = nullptr;        // (S, C) h_k, after the final norm
  float* logits = nullptr;        // (N, V); dlogits in place in backward
  float* row_max = nullptr;       // (N)
  float* row_sumexp = nullptr;    // (N)
  float* target_logit = nullptr;  // (N)
};

struct MtpBlock::Saved : BlockBuffers {
  std::vector<Depth> depths;
};

struct MtpBlock::Workspace : BlockBuffers {
  std::vector<std::unique_ptr<BlockBuffers>> layers;  // each depth's layer workspace (one shared block)
  float* e_norm = nullptr;            // (S, C) enorm's output, then its grad
  float* h_norm = nullptr;            // (S, C) hnorm's output, then its grad
  float* projected = nullptr;         // (N, C / TP) eh_proj's local columns, then their grad
  float* gathered_columns = nullptr;  // (N, C) eh_proj's output over TP (TP > 1)
  float* embedding_full = nullptr;    // (N, C) the embedding's partial lookups (SP)
  SequenceParallelBuffers eh_proj;    // (N, 2C) eh_proj's gathered input and input grad (SP)
  float* d_concat = nullptr;          // (S, 2C)
  float* d_a = nullptr;               // (S, C)
  float* d_b = nullptr;               // (S, C)
  float* d_hidden = nullptr;          // (S, C) the grad of h_k carried to the depth before
  float* dloss = nullptr;             // (N); the ones of a micro-batch without a loss mask in forward
  float* roll_boundary = nullptr;     // (4 B) the roll's boundary elements (parallel/sequence_roll.h)
};

namespace {

int32_t* take_ints(BufferSource& source, int64_t count) {
  static_assert(sizeof(int32_t) == sizeof(float));
  return reinterpret_cast<int32_t*>(source.take(count));
}

}  // namespace

std::string MtpBlock::name(int depth, const char* tensor) {
  return "mtp.layers." + std::to_string(depth) + "." + tensor;
}

MtpBlock::MtpBlock(const ModelConfig& config, const EmbeddingSpec& embedding, const HeadSpec& head,
                   bool embedding_copy, std::vector<std::unique_ptr<DecoderLayer>> layers)
    : num_layers_(config.num_layers),
      hidden_(config.hidden_size),
      padded_vocab_(config.padded_vocab_size()),
      vocab_size_(config.vocab_size),
      layers_(std::move(layers)),
      head_(head),
      embedding_copy_(embedding_copy) {
  for (int k = 0; k < depths(); ++k) {
    const int layer = num_layers_ + k;
    if (layers_[static_cast<size_t>(k)]->layer() != layer) {
      throw Error("multi-token prediction depth " + std::to_string(k),
                  "needs decoder layer " + std::to_string(layer) + ", got " +
                      std::to_string(layers_[static_cast<size_t>(k)]->layer()));
    }
    enorm_.emplace_back(config, name(k, "enorm"), layer);
    hnorm_.emplace_back(config, name(k, "hnorm"), layer);
    final_norm_.emplace_back(config, name(k, "final_layernorm"), layer);
    embedding_.emplace_back(config, embedding, layer);
  }
  eh_proj_.resize(static_cast<size_t>(depths()));
  init_std_ = config.init_method_std;
}

MtpBlock::~MtpBlock() = default;

void MtpBlock::declare(ParamDeclarations& declarations) const {
  if (embedding_copy_ && head_.output == OutputWeight::own) {
    // The last stage's copy of the word table (a tied head declares it): the same tensor, so the
    // same init; its grads are summed with the first stage's.
    ParamDeclaration copy{Embedding::kWordEmbeddings, {padded_vocab_, hidden_}, TensorSplit::column_parallel,
                          num_layers_, Init::normal(init_std_), 1, "the padded vocabulary " + std::to_string(padded_vocab_)};
    copy.tied_embedding = copy.tied_copy = true;
    declarations.add_single(copy);
  }
  for (int k = 0; k < depths(); ++k) {
    const size_t d = static_cast<size_t>(k);
    enorm_[d].declare(declarations);
    hnorm_[d].declare(declarations);
    declarations.add_single({name(k, "eh_proj.weight"), {hidden_, 2 * hidden_}, TensorSplit::column_parallel,
                             num_layers_ + k, Init::normal(init_std_)});
    layers_[d]->declare(declarations);
    final_norm_[d].declare(declarations);
  }
}

void MtpBlock::bind(const ParamLayout& layout) {
  for (int k = 0; k < depths(); ++k) {
    const size_t d = static_cast<size_t>(k);
    enorm_[d].bind(layout);
    hnorm_[d].bind(layout);
    embedding_[d].bind(layout);
    const ParamEntry& eh = layout.find(name(k, "eh_proj.weight"));
    eh_proj_[d] = ColumnParallelLinear(LinearParams{eh.offset, -1, 2 * hidden_, eh.local_shape[0]});
    local_hidden_ = eh.local_shape[0];
    eh_column_offset_ = eh.shard_offset;
    layers_[d]->bind(layout);
    final_norm_[d].bind(layout);
  }
  const ParamEntry& weight =
      layout.find(head_.output == OutputWeight::own ? "output_layer.weight" : Embedding::kWordEmbeddings);
  output_ = ColumnParallelLinear(LinearParams{weight.offset, -1, hidden_, weight.local_shape[0]});
  vocab_start_ = weight.shard_offset;
  valid_ = std::clamp<int64_t>(vocab_size_ - vocab_start_, 0, output_.out_features());
}

std::unique_ptr<BlockBuffers> MtpBlock::lay_out_saved(BufferSource& source, const ActivationRows& rows) const {
  auto saved = std::make_unique<Saved>();
  const int64_t n = rows.rows, s = rows.sequence_rows, c = hidden_;
  for (int k = 0; k < depths(); ++k) {
    const size_t index = static_cast<size_t>(k);
    Depth d;
    d.tokens = take_ints(source, n);
    d.positions = take_ints(source, n);
    d.labels = take_ints(source, n);
    d.loss_mask = source.take(n);
    d.embedded = source.take(s * c);
    d.enorm = enorm_[index].lay_out_statistics(source, s);
    d.hnorm = hnorm_[index].lay_out_statistics(source, s);
    d.concat = source.take(s * 2 * c);
    d.layer_input = source.take(s * c);
    d.layer = layers_[index]->lay_out_saved(source, rows, true);
    d.layer_output = source.take(s * c);
    d.final_norm = final_norm_[index].lay_out_statistics(source, s);
    d.hidden = source.take(s * c);
    d.logits = source.take(n * output_.out_features());
    d.row_max = source.take(n);
    d.row_sumexp = source.take(n);
    d.target_logit = source.take(n);
    saved->depths.push_back(std::move(d));
  }
  return saved;
}

std::unique_ptr<BlockBuffers> MtpBlock::lay_out_workspace(BufferSource& source, const ActivationRows& rows) const {
  auto w = std::make_unique<Workspace>();
  const int64_t n = rows.rows, s = rows.sequence_rows, c = hidden_;
  const bool sequence_parallel = s != n;
  int64_t largest = 0;
  for (const auto& layer : layers_) {
    BufferSource counter;
    layer->lay_out_workspace(counter, rows, false);
    largest = std::max(largest, counter.floats());
  }
  float* block = source.take(largest);
  for (const auto& layer : layers_) {
    BufferSource shared(block);
    w->layers.push_back(layer->lay_out_workspace(shared, rows, false));
  }
  w->e_norm = source.take(s * c);
  w->h_norm = source.take(s * c);
  w->projected = source.take(n * local_hidden_);
  if (local_hidden_ != c) w->gathered_columns = source.take(n * c);
  if (sequence_parallel) {
    w->embedding_full = source.take(n * c);
    w->eh_proj.gathered = source.take(n * 2 * c);
    w->eh_proj.d_full = source.take(n * 2 * c);
  }
  w->d_concat = source.take(s * 2 * c);
  w->d_a = source.take(s * c);
  w->d_b = source.take(s * c);
  w->d_hidden = source.take(s * c);
  w->dloss = source.take(n);
  w->roll_boundary = source.take(2 * n);  // >= 4 B: a sample has at least two rows under CP, else no exchange
  return w;
}

int64_t MtpBlock::widest_gemm_operand() const {
  int64_t widest = 2 * hidden_;
  for (const auto& layer : layers_) widest = std::max(widest, layer->widest_gemm_operand());
  return widest;
}

void MtpBlock::roll_batch(const LayerContext& ctx, const LayerPass& pass, int k, Saved& a, Workspace& w) const {
  const backend::Ops& ops = ctx.ops;
  const MicroBatch& batch = pass.batch;
  const Depth& d = a.depths[static_cast<size_t>(k)];
  // Megatron's roll_tensor, once per depth from the depth before (depth 0 from the micro-batch),
  // across the CP ranks' chunks (parallel/sequence_roll.h).
  const Depth* before = k > 0 ? &a.depths[static_cast<size_t>(k - 1)] : nullptr;
  comm::Communicator* cp_group =
      ctx.parallel.context_parallel_size() > 1 ? &ctx.parallel.context_group() : nullptr;
  auto roll = [&](void* out, const void* in, DType dtype) {
    parallel::roll_left_one(ops, ctx.stream, cp_group, in, out, batch.batch, batch.seq, dtype, w.roll_boundary);
  };
  roll(d.tokens, before ? before->tokens : batch.tokens, DType::i32);
  roll(d.positions, before ? before->positions : batch.positions, DType::i32);
  roll(d.labels, before ? before->labels : batch.labels, DType::i32);
  const float* mask = before ? before->loss_mask : batch.loss_mask;
  if (!mask) {
    ops.fill(w.dloss, pass.rows, 1.0f, ctx.stream);  // every token counts: Megatron's ones, rolled
    mask = w.dloss;
  }
  roll(d.loss_mask, mask, DType::f32);
}

void MtpBlock::forward(const LayerContext& ctx, const LayerPass& pass, const float* h, BlockBuffers& saved,
                       BlockBuffers& workspace, const LayerTemporaries& temporaries,
                       const std::function<void(int layer)>& before) const {
  if (!pass.batch.mtp_loss_sums) {
    throw Error("multi-token prediction", "the micro-batch has no device loss sums for its depths");
  }
  Saved& a = static_cast<Saved&>(saved);
  Workspace& w = static_cast<Workspace&>(workspace);
  const float* h_prev = h;
  for (int k = 0; k < depths(); ++k) {
    if (k > 0 && before) before(num_layers_ + k);
    forward_depth(ctx, pass, k, h_prev, a, w, temporaries);
    h_prev = a.depths[static_cast<size_t>(k)].hidden;
  }
}

void MtpBlock::forward_depth(const LayerContext& ctx, const LayerPass& pass, int k, const float* h_prev, Saved& a,
                             Workspace& w, const LayerTemporaries& t) const {
  const backend::Ops& ops = ctx.ops;
  const ParallelContext& parallel = ctx.parallel;
  const size_t index = static_cast<size_t>(k);
  const Depth& d = a.depths[index];
  const int64_t n = pass.rows, s = pass.sequence_rows, c = hidden_;
  const int64_t row_bytes = c * static_cast<int64_t>(sizeof(float));
  const auto kind = backend::CopyKind::device_to_device;

  roll_batch(ctx, pass, k, a, w);
  MicroBatch rolled = pass.batch;
  rolled.tokens = d.tokens;
  rolled.positions = d.positions;
  const LayerPass embedding_pass{rolled,          pass.rows,     pass.sequence_rows, pass.sequence_row_ids,
                                 pass.iteration, pass.training, pass.recompute,     pass.aux_loss_grad_factor};
  embedding_[index].forward(ctx, embedding_pass, w.embedding_full, d.embedded);

  // [enorm(e) | hnorm(h)]: the embedding first (multi_token_prediction.py _concat_embeddings).
  enorm_[index].forward(ctx, d.embedded, w.e_norm, d.enorm.mean, d.enorm.rstd, s);
  hnorm_[index].forward(ctx, h_prev, w.h_norm, d.hnorm.mean, d.hnorm.rstd, s);
  ops.copy_2d(d.concat, 2 * row_bytes, w.e_norm, row_bytes, row_bytes, s, kind, ctx.stream);
  ops.copy_2d(d.concat + c, 2 * row_bytes, w.h_norm, row_bytes, row_bytes, s, kind, ctx.stream);

  // eh_proj (column-parallel), its columns gathered over TP, this rank's rows kept under SP; under
  // FP8 in its own fp8_autocast region, as the depth's layer (fp8_scaling.h).
  Fp8Scaling* fp8 = ctx.gemm.fp8();
  if (fp8) fp8->begin_region();
  eh_proj_[index].forward(ctx, pass, d.concat, w.eh_proj, w.projected);
  if (fp8) fp8->end_region();
  const float* full = w.projected;
  if (w.gathered_columns) {
    const int64_t local_bytes = local_hidden_ * static_cast<int64_t>(sizeof(float));
    ops.zero(w.gathered_columns, n * row_bytes, ctx.stream);
    ops.copy_2d(w.gathered_columns + eh_column_offset_, row_bytes, w.projected, local_bytes, local_bytes, n, kind,
                ctx.stream);
    parallel.all_reduce_sum_over_tensor_parallel(w.gathered_columns, n * c);
    full = w.gathered_columns;
  }
  const float* rows = parallel.scatter_to_sequence_parallel_region(full, n, c);
  ops.copy(d.layer_input, rows, s * row_bytes, kind, ctx.stream);

  if (fp8) fp8->begin_region();
  layers_[index]->forward(ctx, pass, d.layer_input, d.layer_output, *d.layer, *w.layers[index], t);
  if (fp8) fp8->end_region();
  final_norm_[index].forward(ctx, d.layer_output, d.hidden, d.final_norm.mean, d.final_norm.rstd, s);
  output_.forward(ctx, pass, d.hidden, t.sequence_parallel, d.logits);
  loss_forward(ctx, pass, k, d);
}

// The vocab-parallel cross-entropy of the output head (output_head.cpp) on the rolled labels.
void MtpBlock::loss_forward(const LayerContext& ctx, const LayerPass& pass, int k, const Depth& d) const {
  const backend::Ops& ops = ctx.ops;
  const ParallelContext& parallel = ctx.parallel;
  const int64_t n = pass.rows, vocab = output_.out_features();
  ops.xent_row_max(d.logits, n, vocab, valid_, d.row_max, ctx.stream);
  parallel.all_reduce_max_over_tensor_parallel(d.row_max, n);
  ops.xent_row_sumexp(d.logits, n, vocab, valid_, d.row_max, d.row_sumexp, ctx.stream);
  parallel.all_reduce_sum_over_tensor_parallel(d.row_sumexp, n);
  ops.xent_target_logit(d.logits, n, vocab, valid_, vocab_start_, d.labels, d.target_logit, ctx.stream);
  parallel.all_reduce_sum_over_tensor_parallel(d.target_logit, n);
  double* sums = pass.batch.mtp_loss_sums + 2 * k;
  ops.xent_loss_sums(d.row_max, d.row_sumexp, d.target_logit, d.loss_mask, n, sums, sums + 1, ctx.stream);
}

const float* MtpBlock::backward(const LayerContext& ctx, const LayerPass& pass, const float* h, BlockBuffers& saved,
                                BlockBuffers& workspace, const LayerTemporaries& temporaries,
                                const std::function<void(int layer)>& grads_ready) const {
  if (!pass.batch.mtp_loss_grad_scales) {
    throw Error("multi-token prediction", "the micro-batch has no loss grad scales for its depths");
  }
  Saved& a = static_cast<Saved&>(saved);
  Workspace& w = static_cast<Workspace&>(workspace);
  for (int k = depths() - 1; k >= 0; --k) {
    const float* h_prev = k > 0 ? a.depths[static_cast<size_t>(k - 1)].hidden : h;
    // w.d_hidden carries d h_k in (from depth k + 1) and d h_{k-1} out.
    backward_depth(ctx, pass, k, h_prev, a, w, temporaries, k + 1 < depths() ? w.d_hidden : nullptr, w.d_hidden);
    if (k > 0 && grads_ready) grads_ready(num_layers_ + k);
  }
  return w.d_hidden;
}

void MtpBlock::backward_depth(const LayerContext& ctx, const LayerPass& pass, int k, const float* h_prev, Saved& a,
                              Workspace& w, const LayerTemporaries& t, const float* d_h, float* d_h_prev) const {
  const backend::Ops& ops = ctx.ops;
  const ParallelContext& parallel = ctx.parallel;
  const size_t index = static_cast<size_t>(k);
  Depth& d = a.depths[index];
  const int64_t n = pass.rows, s = pass.sequence_rows, c = hidden_;
  const int64_t row_bytes = c * static_cast<int64_t>(sizeof(float));
  const auto kind = backend::CopyKind::device_to_device;

  // The loss: d(scale_k * sum_r mask_k[r] * loss_k[r]) / d logits, then the output layer.
  ops.copy(w.dloss, d.loss_mask, n * static_cast<int64_t>(sizeof(float)), kind, ctx.stream);
  ops.scale_inplace(w.dloss, n, pass.batch.mtp_loss_grad_scales[k], ctx.stream);
  ops.xent_backward(d.logits, n, output_.out_features(), valid_, vocab_start_, d.labels, d.row_max, d.row_sumexp,
                    w.dloss, ctx.stream);
  output_.backward(ctx, pass, d.logits, d.hidden, t.sequence_parallel, w.d_a);
  if (d_h) ops.add_inplace(w.d_a, d_h, s * c, ctx.stream);

  final_norm_[index].backward(ctx, w.d_a, d.layer_output, d.final_norm.mean, d.final_norm.rstd, w.d_b, s);
  // Under FP8 each region's backward ends with a backward-group update (TE: after its first
  // module's backward), the layer's, then eh_proj's.
  Fp8Scaling* fp8 = ctx.gemm.fp8();
  if (fp8) fp8->begin_region();
  layers_[index]->backward(ctx, pass, d.layer_input, w.d_b, w.d_a, *d.layer, *w.layers[index], t);
  if (fp8) fp8->end_region();

  // eh_proj: this rank's rows back to full rows (SP), this rank's columns, then the linear.
  const float* d_full = parallel.scatter_to_sequence_parallel_region_backward(
      w.d_a, w.gathered_columns ? w.gathered_columns : w.projected, n, c);
  const float* d_projected = d_full;
  if (w.gathered_columns) {
    const int64_t local_bytes = local_hidden_ * static_cast<int64_t>(sizeof(float));
    ops.copy_2d(w.projected, local_bytes, d_full + eh_column_offset_, row_bytes, local_bytes, n, kind, ctx.stream);
    d_projected = w.projected;
  }
  if (fp8) fp8->begin_region();
  eh_proj_[index].backward(ctx, pass, d_projected, d.concat, w.eh_proj, w.d_concat);
  if (fp8) fp8->end_region();
  ops.copy_2d(w.e_norm, row_bytes, w.d_concat, 2 * row_bytes, row_bytes, s, kind, ctx.stream);
  ops.copy_2d(w.h_norm, row_bytes, w.d_concat + c, 2 * row_bytes, row_bytes, s, kind, ctx.stream);

  enorm_[index].backward(ctx, w.e_norm, d.embedded, d.enorm.mean, d.enorm.rstd, w.d_b, s);
  MicroBatch rolled = pass.batch;
  rolled.tokens = d.tokens;
  rolled.positions = d.positions;
  const LayerPass embedding_pass{rolled,          pass.rows,     pass.sequence_rows, pass.sequence_row_ids,
                                 pass.iteration, pass.training, pass.recompute,     pass.aux_loss_grad_factor};
  embedding_[index].backward(ctx, embedding_pass, w.d_b, w.embedding_full);
  hnorm_[index].backward(ctx, w.h_norm, h_prev, d.hnorm.mean, d.hnorm.rstd, d_h_prev, s);
}

}  // namespace mt::model
