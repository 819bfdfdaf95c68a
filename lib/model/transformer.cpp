// The transformer's forward and backward (see transformer.h).
#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/common/half.h"
#include "kernels/common/philox.h"
#include "core/error.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"

namespace mt::model {
namespace {

using kernels::cpu::CpuOps;

const CpuOps& ops() { return kernels::cpu::cpu_ops(); }

int64_t offset_of(const ParamLayout& layout, const std::string& name) { return layout.find(name).offset; }
int64_t offset_or_none(const ParamLayout& layout, const std::string& name) {
  const ParamEntry* entry = layout.try_find(name);
  return entry ? entry->offset : -1;
}

// Dropout streams: one per (site, global layer), independent of the parallel layout.
uint64_t dropout_stream(const char* site, int layer) {
  return kernels::stream_id(site) + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(layer + 2);
}

}  // namespace

namespace {

void round_fp16(const float* in, float* out, int64_t count) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = kernels::fp16_bits_to_fp32(kernels::fp32_to_fp16_bits(in[i]));
}

void round_bf16(const float* in, float* out, int64_t count) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = kernels::round_to_bf16(in[i]);
}

}  // namespace

// Offsets (into the flat buffers) of one layer's parameters; -1 when absent.
struct Transformer::LayerWeights {
  int64_t norm1_weight, norm1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias;
  int64_t norm2_weight, norm2_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
};

// What one layer keeps between forward and backward. Pointers either own a per-layer buffer
// or share a workspace buffer, by recompute policy.
struct Transformer::LayerActivations {
  float* x_in = nullptr;    // (N, C) layer input (residual stream)
  float* norm1 = nullptr;   // (N, C)
  float* mean1 = nullptr;   // (N)
  float* rstd1 = nullptr;   // (N)
  float* qkv = nullptr;     // (N, (H + 2G) D), q and k after RoPE
  float* attn = nullptr;    // (N, H D)
  float* lse = nullptr;     // (B, H, T)
  float* x_mid = nullptr;   // (N, C) residual after attention
  float* norm2 = nullptr;   // (N, C)
  float* mean2 = nullptr;   // (N)
  float* rstd2 = nullptr;   // (N)
  float* fc1 = nullptr;     // (N, F) or (N, 2F) for SwiGLU: pre-activation
  float* act = nullptr;     // (N, F)
};

struct Transformer::Workspace {
  std::vector<Buffer<float>> owned;  // every activation buffer, for lifetime
  std::vector<LayerActivations> stored;     // per layer (index layer - first)
  std::vector<bool> recomputed;             // per layer: rebuilt in backward (full recompute)
  std::vector<int> group_start;             // per layer: first layer of its recompute chunk
  std::vector<LayerActivations> scratch;    // recompute sets (chunk length)
  LayerActivations selective;               // attn + lse shared by selective layers
  float* embedded = nullptr;                // (N, C) input of the first layer
  float* final_hidden = nullptr;            // (N, C) output of the last layer
  float* final_norm = nullptr;              // (N, C)
  float* final_mean = nullptr;
  float* final_rstd = nullptr;
  float* logits = nullptr;                  // (N, Vp); dlogits in place
  float* row_max = nullptr;
  float* row_sumexp = nullptr;
  float* target_logit = nullptr;
  float* dloss = nullptr;                   // (N)
  float* pingpong[2] = {nullptr, nullptr};  // (N, C) layer outputs that are not kept
  float* tmp = nullptr;                     // (N, C)
  float* d_stream[2] = {nullptr, nullptr};  // (N, C) residual-stream grads
  float* d_mid = nullptr;                   // (N, C)
  float* d_norm = nullptr;                  // (N, C)
  float* d_part = nullptr;                  // (N, C)
  float* d_attn = nullptr;                  // (N, H D)
  float* d_qkv = nullptr;                   // (N, (H + 2G) D)
  float* d_fc1 = nullptr;                   // (N, F or 2F)
  float* d_act = nullptr;                   // (N, F)
  Buffer<float> operands[2];                // GEMM operands converted to the precision (bf16 bits or fp16-rounded)
  int64_t rows = 0;
};

Transformer::Transformer(const ModelConfig& config, const ParamLayout& layout, Precision precision,
                         RecomputeConfig recompute, int micro_batch_size, uint64_t seed)
    : config_(config),
      layout_(layout),
      precision_(precision),
      recompute_(recompute),
      seed_(seed),
      micro_batch_size_(micro_batch_size),
      first_layer_(layout.first_layer),
      last_layer_(layout.last_layer) {
  config_.validate();
  if (!layout_.has_embedding || !layout_.has_output) {
    throw Error("pipeline stage", "a model without both the embedding and the output layer needs pipeline parallelism, "
                                  "which has not landed");
  }
  for (int layer = first_layer_; layer < last_layer_; ++layer) {
    const std::string p = layer_prefix(layer);
    const std::string fc1 = config_.swiglu ? "mlp.linear_fc1_gate" : "mlp.linear_fc1";
    weights_.push_back(LayerWeights{
        offset_of(layout_, p + "input_layernorm.weight"), offset_or_none(layout_, p + "input_layernorm.bias"),
        offset_of(layout_, p + "self_attention.linear_q.weight"), offset_or_none(layout_, p + "self_attention.linear_q.bias"),
        offset_of(layout_, p + "self_attention.linear_proj.weight"),
        offset_or_none(layout_, p + "self_attention.linear_proj.bias"),
        offset_of(layout_, p + "pre_mlp_layernorm.weight"), offset_or_none(layout_, p + "pre_mlp_layernorm.bias"),
        offset_of(layout_, p + fc1 + ".weight"), offset_or_none(layout_, p + fc1 + ".bias"),
        offset_of(layout_, p + "mlp.linear_fc2.weight"), offset_or_none(layout_, p + "mlp.linear_fc2.bias")});
  }
  // bf16 GEMMs run natively with AVX512-BF16, elsewhere as fp32 GEMMs over bf16-rounded operands
  // (cpu/gemm.h): only the speed differs.
  native_bf16_ = kernels::cpu::native_bf16_gemm();
  final_norm_weight_ = offset_of(layout_, "decoder.final_layernorm.weight");
  final_norm_bias_ = offset_or_none(layout_, "decoder.final_layernorm.bias");
  if (precision_ == Precision::bf16) bf16_weights_.allocate(layout_.total_elements);
  if (precision_ == Precision::fp16 || (precision_ == Precision::bf16 && !native_bf16_)) {
    rounded_weights_.allocate(layout_.total_elements);
  }
  work_ = std::make_unique<Workspace>();
  plan_workspace(config_, precision_, recompute_, micro_batch_size, last_layer_ - first_layer_, work_.get(),
                 &activation_counter_);
}

Transformer::~Transformer() = default;

int64_t Transformer::plan_workspace(const ModelConfig& config, Precision precision, RecomputeConfig recompute,
                                    int micro_batch_size, int layers, Workspace* workspace, ByteCounter* counter) {
  Workspace scratch_plan;
  Workspace& w = workspace ? *workspace : scratch_plan;
  const bool dry_run = workspace == nullptr;
  int64_t planned_bytes = 0;
  const auto& config_ = config;
  const auto& precision_ = precision;
  const auto& recompute_ = recompute;
  const int64_t n = static_cast<int64_t>(micro_batch_size) * config_.seq_length;
  w.rows = n;
  const int64_t c = config_.hidden_size, d = config_.head_dim();
  const int64_t h = config_.num_attention_heads, g = config_.query_groups();
  const int64_t qkv_width = (h + 2 * g) * d, f = config_.ffn_hidden_size;
  const int64_t fc1_width = config_.swiglu ? 2 * f : f;
  const int64_t vocab = config_.padded_vocab_size();
  auto take = [&](int64_t count) -> float* {
    planned_bytes += (count * static_cast<int64_t>(sizeof(float)) + 63) / 64 * 64;
    if (dry_run) return nullptr;
    w.owned.emplace_back(count, counter);
    return w.owned.back().data();
  };
  const bool layernorm = config_.normalization == Normalization::layernorm;
  // Everything a layer keeps, except its input (owned by the residual chain) and, when
  // `with_attention` is false, the core-attention outputs (selective recompute rebuilds them).
  auto make_set = [&](bool with_input, bool with_attention) {
    LayerActivations a;
    if (with_input) a.x_in = take(n * c);
    a.norm1 = take(n * c);
    if (layernorm) a.mean1 = take(n);
    a.rstd1 = take(n);
    a.qkv = take(n * qkv_width);
    if (with_attention) {
      a.attn = take(n * h * d);
      a.lse = take(n * h);
    }
    a.x_mid = take(n * c);
    a.norm2 = take(n * c);
    if (layernorm) a.mean2 = take(n);
    a.rstd2 = take(n);
    a.fc1 = take(n * fc1_width);
    a.act = take(n * f);
    return a;
  };

  w.recomputed.assign(layers, false);
  w.group_start.resize(layers);
  for (int i = 0; i < layers; ++i) w.group_start[i] = i;
  int chunk = 1;
  if (recompute_.granularity == RecomputeGranularity::full) {
    const int k = std::max(1, recompute_.num_layers);
    if (recompute_.method == RecomputeMethod::uniform) {
      chunk = k;
      for (int i = 0; i < layers; ++i) {
        w.recomputed[i] = true;
        w.group_start[i] = i / k * k;
      }
    } else {
      for (int i = 0; i < std::min(k, layers); ++i) w.recomputed[i] = true;
    }
  }
  const bool selective = recompute_.granularity == RecomputeGranularity::selective;
  w.stored.resize(layers);
  for (int i = 0; i < layers; ++i) {
    if (!w.recomputed[i]) {
      w.stored[i] = make_set(true, !selective);
    } else if (w.group_start[i] == i) {
      w.stored[i].x_in = take(n * c);  // a recomputed chunk keeps only its input
    }
  }
  if (std::any_of(w.recomputed.begin(), w.recomputed.end(), [](bool r) { return r; })) {
    // The first set of a chunk reads the chunk's kept input in place; later ones keep the
    // recomputed output of the layer before them.
    for (int i = 0; i < chunk; ++i) w.scratch.push_back(make_set(i > 0, true));
  }
  if (selective) {
    w.selective.attn = take(n * h * d);
    w.selective.lse = take(n * h);
  }
  w.embedded = layers > 0 ? w.stored[0].x_in : take(n * c);
  w.final_hidden = take(n * c);
  w.final_norm = take(n * c);
  if (layernorm) w.final_mean = take(n);
  w.final_rstd = take(n);
  w.logits = take(n * vocab);
  w.row_max = take(n);
  w.row_sumexp = take(n);
  w.target_logit = take(n);
  w.dloss = take(n);
  w.pingpong[0] = take(n * c);
  w.pingpong[1] = take(n * c);
  w.tmp = take(n * c);
  w.d_stream[0] = take(n * c);
  w.d_stream[1] = take(n * c);
  w.d_mid = take(n * c);
  w.d_norm = take(n * c);
  w.d_part = take(n * c);
  w.d_attn = take(n * h * d);
  w.d_qkv = take(n * qkv_width);
  w.d_fc1 = take(n * fc1_width);
  w.d_act = take(n * f);
  const int64_t widest = std::max({c, qkv_width, fc1_width, vocab});
  if (precision_ != Precision::fp32) {
    const int64_t elements = n * widest;
    planned_bytes += 2 * ((elements * 4 + 63) / 64 * 64);
    if (!dry_run) {
      w.operands[0].allocate(elements, counter);
      w.operands[1].allocate(elements, counter);
    }
  }
  return planned_bytes;
}

int64_t Transformer::gemm_weight_copy_bytes(Precision precision, int64_t elements) {
  if (precision == Precision::fp32) return 0;
  return precision == Precision::bf16 && kernels::cpu::native_bf16_gemm() ? elements * 2 : elements * 4;
}

int64_t Transformer::planned_activation_bytes(const ModelConfig& config, Precision precision,
                                              RecomputeConfig recompute, int micro_batch_size, int layers) {
  return plan_workspace(config, precision, recompute, micro_batch_size, layers, nullptr, nullptr);
}


void Transformer::bind(const float* params, float* grads) {
  params_ = params;
  grads_ = grads;
  refresh_gemm_weights();
}

uint16_t* Transformer::bf16_weights() { return native_bf16_ && !bf16_weights_.empty() ? bf16_weights_.data() : nullptr; }

void Transformer::refresh_gemm_weights() {
  if (precision_ == Precision::bf16 && native_bf16_) {
    kernels::cpu::fp32_to_bf16(params_, bf16_weights_.data(), static_cast<size_t>(layout_.total_elements));
  } else if (precision_ == Precision::bf16) {
    round_bf16(params_, rounded_weights_.data(), layout_.total_elements);
  } else if (precision_ == Precision::fp16) {
    round_fp16(params_, rounded_weights_.data(), layout_.total_elements);
  }
}

// --- GEMMs ------------------------------------------------------------------------------------


const void* Transformer::activation_operand(const float* x, int64_t count, int slot) {
  float* scratch = work_->operands[slot].data();
  switch (precision_) {
    case Precision::fp32: return x;
    case Precision::bf16: {
      if (!native_bf16_) {
        round_bf16(x, scratch, count);
        return scratch;
      }
      auto* bits = reinterpret_cast<uint16_t*>(scratch);
      kernels::cpu::fp32_to_bf16(x, bits, static_cast<size_t>(count));
      return bits;
    }
    case Precision::fp16: round_fp16(x, scratch, count); return scratch;
  }
  return x;
}

const void* Transformer::weight_operand(int64_t offset) const {
  switch (precision_) {
    case Precision::fp32: return params_ + offset;
    case Precision::bf16:
      return native_bf16_ ? static_cast<const void*>(bf16_weights_.data() + offset)
                          : static_cast<const void*>(rounded_weights_.data() + offset);
    case Precision::fp16: return rounded_weights_.data() + offset;
  }
  return params_ + offset;
}

void Transformer::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                       const void* b, int64_t ldb, float beta, float* c, int64_t ldc) const {
  if (precision_ == Precision::bf16 && native_bf16_) {
    kernels::cpu::gemm_bf16(trans_a, trans_b, m, n, k, 1.0f, static_cast<const uint16_t*>(a), lda,
                            static_cast<const uint16_t*>(b), ldb, beta, c, ldc);
  } else {
    kernels::cpu::gemm_f32(trans_a, trans_b, m, n, k, 1.0f, static_cast<const float*>(a), lda,
                           static_cast<const float*>(b), ldb, beta, c, ldc);
  }
}

// y (rows, out) = x (rows, in) . W^T, W (out, in)
void Transformer::linear_forward(const float* x, int64_t rows, int64_t in_features, int64_t weight_offset,
                                 int64_t out_features, float* y) {
  gemm(false, true, rows, out_features, in_features, activation_operand(x, rows * in_features, 0), in_features,
       weight_operand(weight_offset), in_features, 0.0f, y, out_features);
}

// dx (rows, in) = dy (rows, out) . W
void Transformer::linear_backward_input(const float* dy, int64_t rows, int64_t out_features, int64_t weight_offset,
                                        int64_t in_features, float* dx) {
  gemm(false, false, rows, in_features, out_features, activation_operand(dy, rows * out_features, 0), out_features,
       weight_operand(weight_offset), in_features, 0.0f, dx, in_features);
}

// dW (out, in) += dy^T . x
void Transformer::linear_backward_weight(const float* dy, const float* x, int64_t rows, int64_t out_features,
                                         int64_t in_features, int64_t weight_offset) {
  gemm(true, false, out_features, in_features, rows, activation_operand(dy, rows * out_features, 0), out_features,
       activation_operand(x, rows * in_features, 1), in_features, 1.0f, grads_ + weight_offset, in_features);
}

// y = norm(x) with this config's normalisation; mean is unused (nullable) for RMSNorm.
void Transformer::norm_forward(const float* x, int64_t weight_offset, int64_t bias_offset, float* y, float* mean,
                               float* rstd, int64_t rows) {
  const int c = config_.hidden_size;
  if (config_.normalization == Normalization::layernorm) {
    ops().layernorm_forward(x, params_ + weight_offset, bias_offset >= 0 ? params_ + bias_offset : nullptr, y, mean,
                            rstd, rows, c, config_.norm_epsilon);
  } else {
    ops().rmsnorm_forward(x, params_ + weight_offset, y, rstd, rows, c, config_.norm_epsilon);
  }
}

// dx = d norm(x) / dx . dy; the norm's weight (and bias) grads accumulate.
void Transformer::norm_backward(const float* dy, const float* x, int64_t weight_offset, int64_t bias_offset,
                                const float* mean, const float* rstd, float* dx, int64_t rows) {
  const int c = config_.hidden_size;
  if (config_.normalization == Normalization::layernorm) {
    ops().layernorm_backward(dy, x, params_ + weight_offset, mean, rstd, dx, grads_ + weight_offset,
                             bias_offset >= 0 ? grads_ + bias_offset : nullptr, rows, c);
  } else {
    ops().rmsnorm_backward(dy, x, params_ + weight_offset, rstd, dx, grads_ + weight_offset, rows, c);
  }
}

// Backward of y = x W^T (+ b): dW (and db) accumulate, dx (rows, in) is written.
void Transformer::linear_backward(const float* dy, const float* x, int64_t rows, int64_t out_features,
                                  int64_t in_features, int64_t weight_offset, int64_t bias_offset, float* dx) {
  linear_backward_weight(dy, x, rows, out_features, in_features, weight_offset);
  if (bias_offset >= 0) ops().bias_backward(dy, grads_ + bias_offset, rows, static_cast<int>(out_features));
  linear_backward_input(dy, rows, out_features, weight_offset, in_features, dx);
}

kernels::cpu::AttentionShape Transformer::attention_shape(const MicroBatch& batch) const {
  const int64_t h = config_.num_attention_heads, g = config_.query_groups(), d = config_.head_dim();
  kernels::cpu::AttentionShape shape;
  shape.batch = batch.batch;
  shape.q_len = shape.kv_len = batch.seq;
  shape.q_heads = static_cast<int>(h);
  shape.kv_heads = static_cast<int>(g);
  shape.head_dim = static_cast<int>(d);
  shape.q_stride = shape.k_stride = shape.v_stride = (h + 2 * g) * d;
  shape.o_stride = h * d;
  shape.scale = 1.0f / std::sqrt(static_cast<float>(d));
  return shape;
}

// --- layers ----------------------------------------------------------------------------------

void Transformer::attention_forward(LayerActivations& a, const MicroBatch& batch) {
  const int64_t h = config_.num_attention_heads, g = config_.query_groups(), d = config_.head_dim();
  ops().attention_forward(attention_shape(batch), a.qkv, a.qkv + h * d, a.qkv + (h + g) * d, batch.doc_start, a.attn,
                          a.lse);
}

void Transformer::layer_forward(int layer, LayerActivations& a, const float* x_in, float* x_out,
                                const MicroBatch& batch, uint64_t iteration, bool training) {
  const CpuOps& k = ops();
  const LayerWeights& wt = weights_[layer - first_layer_];
  const int64_t n = static_cast<int64_t>(batch.batch) * batch.seq;
  const int64_t c = config_.hidden_size, d = config_.head_dim(), f = config_.ffn_hidden_size;
  const int64_t h = config_.num_attention_heads, g = config_.query_groups();
  const int64_t qkv_width = (h + 2 * g) * d, fc1_width = config_.swiglu ? 2 * f : f;
  const float* p = params_;
  Workspace& w = *work_;

  if (a.x_in != x_in) std::memcpy(a.x_in, x_in, sizeof(float) * n * c);
  norm_forward(a.x_in, wt.norm1_weight, wt.norm1_bias, a.norm1, a.mean1, a.rstd1, n);
  linear_forward(a.norm1, n, c, wt.qkv_weight, qkv_width, a.qkv);
  if (wt.qkv_bias >= 0) k.bias_add(a.qkv, p + wt.qkv_bias, n, static_cast<int>(qkv_width));
  if (config_.position_embedding == PositionEmbedding::rope) {
    k.rope_forward(a.qkv, n, qkv_width, static_cast<int>(h), static_cast<int>(d), batch.positions, config_.rotary_base);
    k.rope_forward(a.qkv + h * d, n, qkv_width, static_cast<int>(g), static_cast<int>(d), batch.positions,
                   config_.rotary_base);
  }
  LayerActivations& core = a.attn ? a : w.selective;
  core.qkv = a.qkv;
  attention_forward(core, batch);
  linear_forward(core.attn, n, h * d, wt.proj_weight, c, w.tmp);
  if (wt.proj_bias >= 0) k.bias_add(w.tmp, p + wt.proj_bias, n, static_cast<int>(c));
  kernels::cpu::DropoutKey key{seed_, dropout_stream("attention-output", layer), iteration, config_.hidden_dropout};
  if (training && key.p > 0) k.dropout_forward(w.tmp, n, static_cast<int>(c), batch.row_ids, 0, key);
  std::memcpy(a.x_mid, a.x_in, sizeof(float) * n * c);
  k.add_inplace(a.x_mid, w.tmp, n * c);

  norm_forward(a.x_mid, wt.norm2_weight, wt.norm2_bias, a.norm2, a.mean2, a.rstd2, n);
  linear_forward(a.norm2, n, c, wt.fc1_weight, fc1_width, a.fc1);
  if (wt.fc1_bias >= 0) k.bias_add(a.fc1, p + wt.fc1_bias, n, static_cast<int>(fc1_width));
  if (config_.swiglu) {
    k.swiglu_forward(a.fc1, a.act, n, static_cast<int>(f));
  } else {
    k.gelu_forward(a.fc1, a.act, n * f);
  }
  linear_forward(a.act, n, f, wt.fc2_weight, c, w.tmp);
  if (wt.fc2_bias >= 0) k.bias_add(w.tmp, p + wt.fc2_bias, n, static_cast<int>(c));
  key.stream = dropout_stream("mlp-output", layer);
  if (training && key.p > 0) k.dropout_forward(w.tmp, n, static_cast<int>(c), batch.row_ids, 0, key);
  std::memcpy(x_out, a.x_mid, sizeof(float) * n * c);
  k.add_inplace(x_out, w.tmp, n * c);
}

void Transformer::layer_backward(int layer, LayerActivations& a, const float* d_out, float* d_in,
                                 const MicroBatch& batch, uint64_t iteration) {
  const CpuOps& k = ops();
  const LayerWeights& wt = weights_[layer - first_layer_];
  const int64_t n = static_cast<int64_t>(batch.batch) * batch.seq;
  const int64_t c = config_.hidden_size, d = config_.head_dim(), f = config_.ffn_hidden_size;
  const int64_t h = config_.num_attention_heads, g = config_.query_groups();
  const int64_t qkv_width = (h + 2 * g) * d, fc1_width = config_.swiglu ? 2 * f : f;
  Workspace& w = *work_;
  kernels::cpu::DropoutKey key{seed_, dropout_stream("mlp-output", layer), iteration, config_.hidden_dropout};

  // MLP branch: x_out = x_mid + dropout(fc2(act(fc1(norm2(x_mid))))).
  std::memcpy(w.tmp, d_out, sizeof(float) * n * c);
  if (key.p > 0) k.dropout_backward(w.tmp, n, static_cast<int>(c), batch.row_ids, 0, key);
  linear_backward(w.tmp, a.act, n, c, f, wt.fc2_weight, wt.fc2_bias, w.d_act);
  if (config_.swiglu) {
    k.swiglu_backward(w.d_act, a.fc1, w.d_fc1, n, static_cast<int>(f));
  } else {
    k.gelu_backward(w.d_act, a.fc1, w.d_fc1, n * f);
  }
  linear_backward(w.d_fc1, a.norm2, n, fc1_width, c, wt.fc1_weight, wt.fc1_bias, w.d_norm);
  norm_backward(w.d_norm, a.x_mid, wt.norm2_weight, wt.norm2_bias, a.mean2, a.rstd2, w.d_part, n);
  std::memcpy(w.d_mid, d_out, sizeof(float) * n * c);
  k.add_inplace(w.d_mid, w.d_part, n * c);

  // Attention branch: x_mid = x_in + dropout(proj(attention(rope(qkv(norm1(x_in)))))).
  LayerActivations& core = a.attn ? a : w.selective;
  if (!a.attn) {
    core.qkv = a.qkv;
    attention_forward(core, batch);  // selective recompute of the core attention
  }
  std::memcpy(w.tmp, w.d_mid, sizeof(float) * n * c);
  key.stream = dropout_stream("attention-output", layer);
  if (key.p > 0) k.dropout_backward(w.tmp, n, static_cast<int>(c), batch.row_ids, 0, key);
  linear_backward(w.tmp, core.attn, n, c, h * d, wt.proj_weight, wt.proj_bias, w.d_attn);
  k.attention_backward(attention_shape(batch), a.qkv, a.qkv + h * d, a.qkv + (h + g) * d, batch.doc_start, core.attn, w.d_attn,
                       core.lse, w.d_qkv, w.d_qkv + h * d, w.d_qkv + (h + g) * d);
  if (config_.position_embedding == PositionEmbedding::rope) {
    k.rope_backward(w.d_qkv, n, qkv_width, static_cast<int>(h), static_cast<int>(d), batch.positions,
                    config_.rotary_base);
    k.rope_backward(w.d_qkv + h * d, n, qkv_width, static_cast<int>(g), static_cast<int>(d), batch.positions,
                    config_.rotary_base);
  }
  linear_backward(w.d_qkv, a.norm1, n, qkv_width, c, wt.qkv_weight, wt.qkv_bias, w.d_norm);
  norm_backward(w.d_norm, a.x_in, wt.norm1_weight, wt.norm1_bias, a.mean1, a.rstd1, w.d_part, n);
  std::memcpy(d_in, w.d_mid, sizeof(float) * n * c);
  k.add_inplace(d_in, w.d_part, n * c);
}

// --- whole model ------------------------------------------------------------------------------

void Transformer::forward_pass(const MicroBatch& batch, uint64_t iteration, bool training) {
  if (batch.batch > micro_batch_size_ || batch.seq != config_.seq_length) {
    throw Error("micro-batch", "shape (" + std::to_string(batch.batch) + ", " + std::to_string(batch.seq) +
                                   ") exceeds the model's buffers (" + std::to_string(micro_batch_size_) + ", " +
                                   std::to_string(config_.seq_length) + ")");
  }
  const CpuOps& k = ops();
  Workspace& w = *work_;
  const int64_t n = static_cast<int64_t>(batch.batch) * batch.seq;
  const int c = config_.hidden_size;
  const ParamEntry& wte = layout_.find("embedding.word_embeddings.weight");
  const ParamEntry* wpe = layout_.try_find("embedding.position_embeddings.weight");
  k.embedding_forward(batch.tokens, batch.positions, params_ + wte.offset, wpe ? params_ + wpe->offset : nullptr,
                      w.embedded, n, c, wte.shard_offset, wte.shard_offset + wte.local_shape[0]);
  kernels::cpu::DropoutKey key{seed_, dropout_stream("embedding", -1), iteration, config_.hidden_dropout};
  if (training && key.p > 0) k.dropout_forward(w.embedded, n, c, batch.row_ids, 0, key);

  const int layers = last_layer_ - first_layer_;
  const float* x = w.embedded;
  for (int i = 0; i < layers; ++i) {
    float* out;
    if (i + 1 == layers) {
      out = w.final_hidden;
    } else if (w.stored[i + 1].x_in) {
      out = w.stored[i + 1].x_in;
    } else {
      out = w.pingpong[i % 2];
    }
    if (w.recomputed[i]) {
      // Run the layer now for its output; what backward needs is rebuilt there.
      LayerActivations& scratch = w.scratch[0];
      scratch.x_in = const_cast<float*>(x);
      layer_forward(first_layer_ + i, scratch, x, out, batch, iteration, training);
    } else {
      layer_forward(first_layer_ + i, w.stored[i], x, out, batch, iteration, training);
    }
    x = out;
  }
  if (layers == 0) std::memcpy(w.final_hidden, w.embedded, sizeof(float) * n * c);

  norm_forward(w.final_hidden, final_norm_weight_, final_norm_bias_, w.final_norm, w.final_mean, w.final_rstd, n);
  const ParamEntry& out = layout_.find(config_.untie_embeddings_and_output_weights ? "output_layer.weight"
                                                                                   : "embedding.word_embeddings.weight");
  linear_forward(w.final_norm, n, c, out.offset, out.local_shape[0], w.logits);
}

LossSums Transformer::head_loss(const MicroBatch& batch) {
  const CpuOps& k = ops();
  Workspace& w = *work_;
  const int64_t n = static_cast<int64_t>(batch.batch) * batch.seq;
  const int64_t ld = config_.padded_vocab_size();
  const int64_t valid = config_.vocab_size;
  k.xent_row_max(w.logits, n, ld, valid, w.row_max);
  k.xent_row_sumexp(w.logits, n, ld, valid, w.row_max, w.row_sumexp);
  k.xent_target_logit(w.logits, n, ld, valid, 0, batch.labels, w.target_logit);
  LossSums sums;
  for (int64_t r = 0; r < n; ++r) {
    const double mask = batch.loss_mask ? batch.loss_mask[r] : 1.0;
    const double loss = std::log(static_cast<double>(w.row_sumexp[r])) + w.row_max[r] - w.target_logit[r];
    sums.loss += mask * loss;
    sums.tokens += mask;
  }
  return sums;
}

void Transformer::head_backward(const MicroBatch& batch, float dloss_scale) {
  const CpuOps& k = ops();
  Workspace& w = *work_;
  const int64_t n = static_cast<int64_t>(batch.batch) * batch.seq;
  const int64_t ld = config_.padded_vocab_size();
  const int c = config_.hidden_size;
  for (int64_t r = 0; r < n; ++r) w.dloss[r] = dloss_scale * (batch.loss_mask ? batch.loss_mask[r] : 1.0f);
  k.xent_backward(w.logits, n, ld, config_.vocab_size, 0, batch.labels, w.row_max, w.row_sumexp, w.dloss);
  const ParamEntry& out = layout_.find(config_.untie_embeddings_and_output_weights ? "output_layer.weight"
                                                                                   : "embedding.word_embeddings.weight");
  linear_backward_weight(w.logits, w.final_norm, n, out.local_shape[0], c, out.offset);
  linear_backward_input(w.logits, n, out.local_shape[0], out.offset, c, w.d_norm);
  norm_backward(w.d_norm, w.final_hidden, final_norm_weight_, final_norm_bias_, w.final_mean, w.final_rstd,
                w.d_stream[0], n);
}

LossSums Transformer::forward_backward(const MicroBatch& batch, float dloss_scale, uint64_t iteration) {
  if (!params_ || !grads_) throw Error("model", "parameters not bound");
  forward_pass(batch, iteration, true);
  const LossSums sums = head_loss(batch);
  head_backward(batch, dloss_scale);

  const CpuOps& k = ops();
  Workspace& w = *work_;
  const int64_t n = static_cast<int64_t>(batch.batch) * batch.seq;
  const int c = config_.hidden_size;
  const int layers = last_layer_ - first_layer_;
  int current = 0;  // w.d_stream[current] holds the grad of the current layer's output
  int i = layers - 1;
  while (i >= 0) {
    if (!w.recomputed[i]) {
      layer_backward(first_layer_ + i, w.stored[i], w.d_stream[current], w.d_stream[1 - current], batch, iteration);
      current = 1 - current;
      --i;
      continue;
    }
    // Recompute the chunk [start, i] from its kept input into the scratch sets, then run its
    // backward in reverse.
    const int start = w.group_start[i];
    const float* x = w.stored[start].x_in;
    for (int j = start; j <= i; ++j) {
      LayerActivations& scratch = w.scratch[j - start];
      if (j == start) scratch.x_in = const_cast<float*>(x);
      float* out = j < i ? w.scratch[j - start + 1].x_in : w.pingpong[0];  // the chunk's output is not needed
      layer_forward(first_layer_ + j, scratch, x, out, batch, iteration, true);
      x = out;
    }
    for (int j = i; j >= start; --j) {
      layer_backward(first_layer_ + j, w.scratch[j - start], w.d_stream[current], w.d_stream[1 - current], batch,
                     iteration);
      current = 1 - current;
    }
    i = start - 1;
  }

  float* d_embedded = w.d_stream[current];
  kernels::cpu::DropoutKey key{seed_, dropout_stream("embedding", -1), iteration, config_.hidden_dropout};
  if (key.p > 0) k.dropout_backward(d_embedded, n, c, batch.row_ids, 0, key);
  const ParamEntry& wte = layout_.find("embedding.word_embeddings.weight");
  const ParamEntry* wpe = layout_.try_find("embedding.position_embeddings.weight");
  k.embedding_backward(batch.tokens, batch.positions, d_embedded, grads_ + wte.offset,
                       wpe ? grads_ + wpe->offset : nullptr, n, c, wte.shard_offset,
                       wte.shard_offset + wte.local_shape[0]);
  return sums;
}

LossSums Transformer::forward_loss(const MicroBatch& batch) {
  if (!params_) throw Error("model", "parameters not bound");
  forward_pass(batch, 0, false);
  return head_loss(batch);
}

void Transformer::forward_logits(const MicroBatch& batch, float* logits) {
  if (!params_) throw Error("model", "parameters not bound");
  forward_pass(batch, 0, false);
  const int64_t n = static_cast<int64_t>(batch.batch) * batch.seq;
  const int64_t ld = config_.padded_vocab_size();
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(logits + r * config_.vocab_size, work_->logits + r * ld, sizeof(float) * config_.vocab_size);
  }
}

}  // namespace mt::model
