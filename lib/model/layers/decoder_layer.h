// The interfaces of a decoder layer and of its two parts, so that a stage holds abstract layers
// and a chunk may mix kinds (model/spec.h builds them):
//   DecoderLayer      one layer of the residual stream (PreNormLayer today; a post-norm layer is
//                     another implementation)
//   AttentionVariant  the layer's token mixer (SelfAttention today; MLA next)
//   MlpVariant        the layer's channel mixer (the dense Mlp today; MoE next)
// Each block declares its parameters with their init, binds to the layout that placed them, lays
// out its own buffers (block.h: what backward needs, following the recompute policy, and its
// workspace of one pass) and runs forward and backward. The stage keeps what every layer shares:
// the residual stream (each kept layer's input, the outputs, the stream's grads), the (S, C)
// temporaries of a layer's pass and the sequence-parallel full-row buffers (LayerTemporaries).
// Rows: N tokens of the micro-batch on this rank, S of them in the sequence-parallel region.
// Tested through tests/unit/model/test_spec.cpp and tests/unit/model/test_model_gradients.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "model/layers/block.h"
#include "model/layers/layer_context.h"
#include "model/layers/linear.h"

namespace mt::model {

// What a stage lends every layer's pass (shared by its layers, used one pass at a time).
struct LayerTemporaries {
  float* tmp = nullptr;     // (S, C) a branch's output, then its grad
  float* d_mid = nullptr;   // (S, C)
  float* d_norm = nullptr;  // (S, C)
  float* d_part = nullptr;  // (S, C)
  SequenceParallelBuffers sequence_parallel;
};

// The attention part of a decoder layer: (S, C) in, (S, C) out before dropout.
class AttentionVariant {
 public:
  virtual ~AttentionVariant() = default;
  virtual void declare(ParamDeclarations& declarations) const = 0;
  virtual void bind(const ParamLayout& layout) = 0;

  // What backward needs; the core attention's outputs only with `keep_core` (selective
  // recompute rebuilds them into the workspace, which then has room for them: `rebuild_core`).
  virtual std::unique_ptr<BlockBuffers> lay_out_saved(BufferSource& source, const ActivationRows& rows,
                                                      bool keep_core) const = 0;
  virtual std::unique_ptr<BlockBuffers> lay_out_workspace(BufferSource& source, const ActivationRows& rows,
                                                          bool rebuild_core) const = 0;
  // The widest row of its GEMM operands (in or out features of any of its linears), local.
  virtual int64_t widest_gemm_operand() const = 0;
  // The core attention's shape for `batch` samples of `seq` tokens (the stage sizes the ring
  // attention of context parallelism by it).
  virtual kernels::AttentionShape core_shape(int batch, int seq) const = 0;

  virtual void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, BlockBuffers& saved,
                       BlockBuffers& workspace, const SequenceParallelBuffers& full_rows, float* out_seq) const = 0;
  // dx_seq from dy_seq; parameter grads accumulate.
  virtual void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                        BlockBuffers& saved, BlockBuffers& workspace, const SequenceParallelBuffers& full_rows,
                        float* dx_seq) const = 0;
};

// The MLP part of a decoder layer: (S, C) in, (S, C) out before dropout.
class MlpVariant {
 public:
  virtual ~MlpVariant() = default;
  virtual void declare(ParamDeclarations& declarations) const = 0;
  virtual void bind(const ParamLayout& layout) = 0;

  virtual std::unique_ptr<BlockBuffers> lay_out_saved(BufferSource& source, const ActivationRows& rows) const = 0;
  virtual std::unique_ptr<BlockBuffers> lay_out_workspace(BufferSource& source, const ActivationRows& rows) const = 0;
  virtual int64_t widest_gemm_operand() const = 0;

  virtual void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, BlockBuffers& saved,
                       BlockBuffers& workspace, const SequenceParallelBuffers& full_rows, float* out_seq) const = 0;
  virtual void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                        BlockBuffers& saved, BlockBuffers& workspace, const SequenceParallelBuffers& full_rows,
                        float* dx_seq) const = 0;
};

// One decoder layer: x_out (S, C) from x_in (S, C). Its input is the stage's (the residual
// stream keeps it, or recompute rebuilds it); everything else backward needs is in its saved set.
class DecoderLayer {
 public:
  explicit DecoderLayer(int layer) : layer_(layer) {}
  virtual ~DecoderLayer() = default;
  int layer() const { return layer_; }  // global index

  virtual void declare(ParamDeclarations& declarations) const = 0;
  virtual void bind(const ParamLayout& layout) = 0;

  // What backward needs besides the input; the core attention's outputs only with `keep_core`
  // (selective recompute), and then the workspace holds them (`rebuild_core`).
  virtual std::unique_ptr<BlockBuffers> lay_out_saved(BufferSource& source, const ActivationRows& rows,
                                                      bool keep_core) const = 0;
  virtual std::unique_ptr<BlockBuffers> lay_out_workspace(BufferSource& source, const ActivationRows& rows,
                                                          bool rebuild_core) const = 0;
  virtual int64_t widest_gemm_operand() const = 0;
  // The shape of its core attention for `batch` samples of `seq` tokens, if it has one.
  virtual std::optional<kernels::AttentionShape> attention_core_shape(int batch, int seq) const = 0;

  // `saved` and `workspace` are this layer's (from its lay_out_*).
  virtual void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_in, float* x_out,
                       BlockBuffers& saved, BlockBuffers& workspace, const LayerTemporaries& temporaries) const = 0;
  // d_in (S, C) from d_out (S, C) for the forward that filled `saved` from x_in; grads accumulate.
  virtual void backward(const LayerContext& ctx, const LayerPass& pass, const float* x_in, const float* d_out,
                        float* d_in, BlockBuffers& saved, BlockBuffers& workspace,
                        const LayerTemporaries& temporaries) const = 0;

 private:
  int layer_;
};

}  // namespace mt::model
