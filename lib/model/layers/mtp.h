// Multi-token prediction (--mtp-num-layers D, DeepSeek-V3's), as Megatron-Core 0.16.1 builds it
// (transformer/multi_token_prediction.py, models/gpt/gpt_model.py _postprocess), on the chunk
// that holds the head. Depth k = 0 .. D-1, from h_{-1} = the decoder's output after its final norm
// (the head's final_norm):
//
//   tokens_k   = tokens_{k-1} (the micro-batch's for k = 0) rolled left once per sample, a zero
//                rolled in (Megatron's roll_tensor; positions likewise, read only by a learned
//                position table); under context parallelism the roll runs along the whole
//                sequence across the CP ranks' chunks (parallel/sequence_roll.h)
//   e_k        = enorm_k(embedding(tokens_k))          the shared word embedding (and positions)
//   x_k        = eh_proj_k([e_k | hnorm_k(h_{k-1})])    embedding first, 2h -> h, no bias
//   h_k        = final_layernorm_k(layer_k(x_k))        a decoder layer of global index L + k
//   loss_k     = cross-entropy of the shared output layer on h_k against the labels rolled
//                left k + 1 times, under the loss mask rolled the same way (its last k + 1
//                positions of each sequence 0)
//
// The next depth starts from h_k (after its final norm, as Megatron chains them). Each training
// forward adds (sum of mask_k * loss_k, sum of mask_k) to batch.mtp_loss_sums; backward starts
// each depth from batch.mtp_loss_grad_scales[k] (Megatron's MTPLossAutoScaler: lambda / D over the
// depth's tokens times the main loss's backward scale, set by the trainer) and returns the grad of
// h_{-1}, which the head adds before its final norm's backward. Evaluation forwards skip the block
// (Megatron logs MTP losses of training only; the LM loss does not depend on it).
//
// Tensor parallelism as Megatron's: eh_proj is column-parallel (gather_output=False), its output
// columns gathered over TP (gather_from_tensor_model_parallel_region, here a sum of zero-padded
// column blocks, exact) and, under sequence parallelism, this rank's rows kept for the layer. The
// embedding lookups and the output layer are the model's own (vocab-parallel). Parameters:
// mtp.layers.<k>.{enorm,hnorm,final_layernorm}.weight (and .bias under LayerNorm),
// mtp.layers.<k>.eh_proj.weight (h, 2h), and the layer's under decoder.layers.<L + k>. (Megatron's
// mtp.layers.<k>.transformer_layer.), all with layer id L + k: depth 0 shares the head's id, whose
// grads-ready signal follows this block's backward; depths k > 0 signal L + k after theirs.
// The block keeps all its activations (no recompute of MTP layers: Megatron's full recompute of
// them changes memory, not numbers). Under context parallelism each depth's layer runs ring
// attention as the decoder's do, and the rolls exchange one element per chunk and sample with the
// neighbouring CP ranks.
// Under pipeline parallelism the block sits after the decoder on the last stage (Megatron-Core's
// mtp_process stage), which then holds a copy of the word embedding as a tied output layer does:
// declared here (`embedding_copy` with an untied output layer; the head declares it when tied)
// under the embedding's name, replica 1 (not written to checkpoints, loaded from the first stage's
// tensor), with the head's layer id, its grads summed with the first stage's between the two
// (Megatron's _allreduce_word_embedding_grads over the embedding group; model/layout.h).
// Tested against Megatron-Core in tests/unit/model/test_mtp_megatron.cpp (tests/golden/mtp/: the
// losses and every grad) and in tests/unit/model/test_mtp.cpp (TP = 2 with and without SP over
// threads against one rank, the grads-ready signals, a DeepSeek-shaped MoE + MLA depth).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "model/layers/block.h"
#include "model/layers/decoder_layer.h"
#include "model/layers/embedding.h"
#include "model/layers/linear.h"
#include "model/layers/norm.h"
#include "model/spec.h"

namespace mt::model {

class MtpBlock {
 public:
  // `layers`: depth k's decoder layer (global index num_layers + k), made by the spec's factories.
  // `embedding_copy`: no chunk of the rank embeds (a pipeline's last stage), so the lookups read
  // the rank's copy of the word table.
  MtpBlock(const ModelConfig& config, const EmbeddingSpec& embedding, const HeadSpec& head, bool embedding_copy,
           std::vector<std::unique_ptr<DecoderLayer>> layers);
  ~MtpBlock();

  int depths() const { return static_cast<int>(layers_.size()); }
  static std::string name(int depth, const char* tensor);  // "mtp.layers.<k>.<tensor>"

  void declare(ParamDeclarations& declarations) const;
  void bind(const ParamLayout& layout);

  // What backward needs (every depth's activations) and one pass's workspace.
  std::unique_ptr<BlockBuffers> lay_out_saved(BufferSource& source, const ActivationRows& rows) const;
  std::unique_ptr<BlockBuffers> lay_out_workspace(BufferSource& source, const ActivationRows& rows) const;
  int64_t widest_gemm_operand() const;

  // From h (S, C), the decoder's output after its final norm: every depth's loss sums added to
  // pass.batch.mtp_loss_sums. `before(layer)` is called before depth k > 0 reads its parameters
  // (layer id L + k; depth 0's are the head's, already announced).
  void forward(const LayerContext& ctx, const LayerPass& pass, const float* h, BlockBuffers& saved,
               BlockBuffers& workspace, const LayerTemporaries& temporaries,
               const std::function<void(int layer)>& before) const;
  // The grad of h (S, C), in the workspace (valid until the next pass); parameter grads
  // accumulate. `grads_ready(layer)` after each depth k > 0's backward (layer id L + k).
  const float* backward(const LayerContext& ctx, const LayerPass& pass, const float* h, BlockBuffers& saved,
                        BlockBuffers& workspace, const LayerTemporaries& temporaries,
                        const std::function<void(int layer)>& grads_ready) const;

 private:
  struct Depth;
  struct Saved;
  struct Workspace;
  // Depth k's tokens, positions, labels and loss mask: depth k - 1's (the micro-batch's for k = 0)
  // rolled left once per sample along the whole sequence, across the CP ranks, zeros rolled in.
  void roll_batch(const LayerContext& ctx, const LayerPass& pass, int k, Saved& a, Workspace& w) const;
  void forward_depth(const LayerContext& ctx, const LayerPass& pass, int k, const float* h_prev, Saved& a,
                     Workspace& w, const LayerTemporaries& t) const;
  void loss_forward(const LayerContext& ctx, const LayerPass& pass, int k, const Depth& d) const;
  // d_h_prev (S, C) written: the grad of h_{k-1} through depth k, given the grad `d_h` of h_k
  // from later depths (null for the last).
  void backward_depth(const LayerContext& ctx, const LayerPass& pass, int k, const float* h_prev, Saved& a,
                      Workspace& w, const LayerTemporaries& t, const float* d_h, float* d_h_prev) const;

  int num_layers_;
  int64_t hidden_, padded_vocab_, vocab_size_;
  double init_std_ = 0;
  std::vector<Norm> enorm_, hnorm_, final_norm_;
  std::vector<Embedding> embedding_;  // per depth: the shared tables, its own dropout stream
  std::vector<ColumnParallelLinear> eh_proj_;
  std::vector<std::unique_ptr<DecoderLayer>> layers_;
  HeadSpec head_;
  bool embedding_copy_ = false;
  ColumnParallelLinear output_;
  int64_t vocab_start_ = 0, valid_ = 0;
  int64_t local_hidden_ = 0;      // eh_proj's output columns on this rank
  int64_t eh_column_offset_ = 0;  // the first of them
};

}  // namespace mt::model
