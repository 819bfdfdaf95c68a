// The transformer (GPT-2 and LLaMA families) with an explicit forward and backward per layer
// over the layer range of its layout, on the CPU op table (kernels/cpu/ops.h) and oneDNN GEMMs.
// Activations live in persistent buffers sized once for the micro-batch; what each layer keeps
// for backward follows the recompute policy (none / selective = core attention / full, with
// Megatron's uniform and block methods), and the bytes held are measured by a ByteCounter.
// Tested in tests/unit/model/test_transformer.cpp (finite differences, recompute equivalence)
// and against PyTorch in tests/golden/.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "model/config.h"
#include "model/layout.h"

namespace mt::model {

enum class RecomputeGranularity { none, selective, full };
enum class RecomputeMethod { uniform, block };

struct RecomputeConfig {
  RecomputeGranularity granularity = RecomputeGranularity::none;
  RecomputeMethod method = RecomputeMethod::uniform;
  int num_layers = 1;  // uniform: layers per recomputed chunk; block: layers recomputed
};

// One micro-batch of `batch` samples of `seq` tokens, all (batch*seq) arrays row-major.
struct MicroBatch {
  int batch = 0;
  int seq = 0;
  const int32_t* tokens = nullptr;
  const int32_t* labels = nullptr;
  const float* loss_mask = nullptr;    // 1 counts, 0 does not
  const int32_t* positions = nullptr;
  const int32_t* doc_start = nullptr;  // nullable: first position of each token's document
  const int64_t* row_ids = nullptr;    // global token ids (global sample * seq + position): dropout keys
};

struct LossSums {
  double loss = 0;    // sum over tokens of loss * mask
  double tokens = 0;  // sum of the mask
};

class Transformer {
 public:
  Transformer(const ModelConfig& config, const ParamLayout& layout, Precision precision, RecomputeConfig recompute,
              int micro_batch_size, uint64_t seed);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  // The flat fp32 master parameters and fp32 grads (laid out by the layout table).
  void bind(const float* params, float* grads);
  // Re-derives the GEMM weight copy (bf16 bits, or fp16-rounded fp32) from the master weights;
  // call after every parameter change. No-op in fp32.
  void refresh_gemm_weights();
  // The bf16 GEMM weight copy (bf16 runs on AVX512-BF16 CPUs only; else nullptr), for a fused
  // optimizer pass to refresh directly. Callers must call refresh_gemm_weights() when it is null.
  uint16_t* bf16_weights();

  // Forward and backward of one micro-batch: grads += d(loss)/d(params) where the loss is
  // sum_r dloss_scale * mask[r] * loss[r]. Returns the unscaled loss sums.
  LossSums forward_backward(const MicroBatch& batch, float dloss_scale, uint64_t iteration);
  // Forward only (evaluation: no dropout).
  LossSums forward_loss(const MicroBatch& batch);
  // Forward only; writes the logits over the real vocabulary, (batch*seq, vocab_size).
  void forward_logits(const MicroBatch& batch, float* logits);

  // Activation bytes the buffers of a model with `layers` layers will hold, without allocating
  // (used to refuse a configuration that cannot fit before anything is allocated).
  // Bytes of the GEMM weight copy a precision keeps beside the fp32 master weights.
  static int64_t gemm_weight_copy_bytes(Precision precision, int64_t elements);
  static int64_t planned_activation_bytes(const ModelConfig& config, Precision precision, RecomputeConfig recompute,
                                          int micro_batch_size, int layers);

  // Bytes of activation buffers held (measured by the allocator), and their high-water mark.
  int64_t activation_bytes() const { return activation_counter_.peak; }

 private:
  struct LayerActivations;
  struct LayerWeights;
  struct Workspace;

  static int64_t plan_workspace(const ModelConfig& config, Precision precision, RecomputeConfig recompute,
                                int micro_batch_size, int layers, Workspace* workspace, ByteCounter* counter);
  void forward_pass(const MicroBatch& batch, uint64_t iteration, bool training);
  LossSums head_loss(const MicroBatch& batch);
  void head_backward(const MicroBatch& batch, float dloss_scale);
  void layer_forward(int layer, LayerActivations& acts, const float* x_in, float* x_out, const MicroBatch& batch,
                     uint64_t iteration, bool training);
  void layer_backward(int layer, LayerActivations& acts, const float* d_out, float* d_in, const MicroBatch& batch,
                      uint64_t iteration);
  void attention_forward(LayerActivations& acts, const MicroBatch& batch);
  kernels::cpu::AttentionShape attention_shape(const MicroBatch& batch) const;
  void norm_forward(const float* x, int64_t weight_offset, int64_t bias_offset, float* y, float* mean, float* rstd,
                    int64_t rows);
  void norm_backward(const float* dy, const float* x, int64_t weight_offset, int64_t bias_offset, const float* mean,
                     const float* rstd, float* dx, int64_t rows);
  void linear_backward(const float* dy, const float* x, int64_t rows, int64_t out_features, int64_t in_features,
                       int64_t weight_offset, int64_t bias_offset, float* dx);

  // GEMMs in the run's precision: activations are converted into operand slot 0 or 1, weights
  // come from the matching copy (fp32 master, bf16 bits or fp16-rounded fp32).
  const void* activation_operand(const float* x, int64_t count, int slot);
  const void* weight_operand(int64_t offset) const;
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b,
            int64_t ldb, float beta, float* c, int64_t ldc) const;
  void linear_forward(const float* x, int64_t rows, int64_t in_features, int64_t weight_offset, int64_t out_features,
                      float* y);
  void linear_backward_input(const float* dy, int64_t rows, int64_t out_features, int64_t weight_offset,
                             int64_t in_features, float* dx);
  void linear_backward_weight(const float* dy, const float* x, int64_t rows, int64_t out_features,
                              int64_t in_features, int64_t weight_offset);

  ModelConfig config_;
  ParamLayout layout_;
  Precision precision_;
  RecomputeConfig recompute_;
  uint64_t seed_;
  int micro_batch_size_;
  const float* params_ = nullptr;
  float* grads_ = nullptr;
  bool native_bf16_ = false;      // bf16 GEMMs in hardware (AVX512-BF16)
  Buffer<uint16_t> bf16_weights_; // bf16 bits of the weights (native bf16)
  Buffer<float> rounded_weights_; // fp16-rounded or bf16-rounded fp32 weights
  ByteCounter activation_counter_;
  std::vector<LayerWeights> weights_;
  std::unique_ptr<Workspace> work_;
  int first_layer_ = 0, last_layer_ = 0;
  int64_t final_norm_weight_ = -1, final_norm_bias_ = -1;
};

}  // namespace mt::model
