// The mixture-of-experts MLP (Megatron's MoELayer, facts note sec. 1.1), the MlpKind::moe variant
// of layers ModelConfig::is_moe_layer names. On the pre-MLP-norm output x (S, C) of this rank's
// sequence-parallel rows:
//   shared = shared_experts(x)                        (when --moe-shared-expert-intermediate-size)
//   logits = x W_r^T (S, E) in fp32                   (router.weight (E, C), replicated)
//   probs, routing_map = Router(logits, expert_bias)  (model/moe/router.h: z-loss, top-k, capacity,
//                                                      aux losses, the token counts)
//   rows   = TokenDispatcher.dispatch(x, probs, map)  (model/moe/token_dispatcher.h)
//   out    = LocalExperts(rows)                       (model/moe/experts.h: fc2(p swiglu(fc1 x)))
//   y      = TokenDispatcher.combine(out) + shared
// Backward mirrors it: the router's backward takes the aux-loss grad factor the stage was given
// for the micro-batch (LayerPass::aux_loss_grad_factor, from Stage::set_aux_loss_grad_factor).
// Recompute: a forward the stage reruns before backward (LayerPass::recompute) neither counts
// tokens nor logs losses again.
//
// Parameters (model/layout.h; names are the checkpoint's), per layer i:
//   decoder.layers.<i>.mlp.router.weight (E, C): replicated over TP, its grad summed over TP under
//     sequence parallelism (each TP rank routes its own rows), reduced over DP x CP; N(0, std).
//   decoder.layers.<i>.mlp.experts.<e>.linear_fc1_gate.weight, .linear_fc1_up.weight (F, C) and
//     .linear_fc2.weight (C, F) for global expert e, F = --moe-ffn-hidden-size: only the experts
//     of this rank's EP rank ([ep E/EP, (ep+1) E/EP)), split over expert-TP (fc1 by rows, fc2 by
//     columns; NOT the dense TP group), grads reduced over expert-DP; fc1 N(0, std), fc2 N(0,
//     std / sqrt(2 num_layers)) as Megatron's experts. The local experts' fc1 tensors are one
//     fused group in expert order (e0 gate, e0 up, e1 gate, ...) and their fc2 another, so local
//     expert j's fc1 is at fc1_base + j 2 (F/ETP) C and its fc2 at fc2_base + j C (F/ETP).
//   decoder.layers.<i>.mlp.shared_experts.linear_fc1_gate/up.weight, .linear_fc2.weight: a dense
//     SwiGLU MLP (model/layers/mlp.h) of the shared width over the dense TP group.
//   The expert bias (E) of --moe-router-enable-expert-bias is not a parameter: a buffer the layer
//   owns (MoeLayerState), which the trainer updates once per global batch and checkpoints as
//   decoder.layers.<i>.mlp.router.expert_bias.
//
// State the trainer reads (MoeLayerState, through model/stage.h): per training forward the
// router's logged values; the tokens per expert after dropping (E, device fp32), added to by
// forwards that build grads only (never by recompute, never in evaluation); the expert bias.
// Tested in tests/unit/model/test_moe_mlp.cpp and tests/unit/model/test_layout.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/memory.h"
#include "model/layers/decoder_layer.h"
#include "model/layers/mlp.h"
#include "model/moe/experts.h"
#include "model/moe/router.h"
#include "model/moe/token_dispatcher.h"
#include "model/spec.h"

namespace mt::model {

// One MoE layer's figures and buffers the trainer reads and writes (see the header comment).
struct MoeLayerState {
  int layer = 0;                  // global decoder layer index
  int num_experts = 0;            // E
  // The router's logged values of each training forward since clear_losses(), in forward order
  // (absent values are not pushed): aux / coeff summed over the loss's reduce group, and z / coeff
  // averaged over tp_cp (model/moe/router.h RouterLossValues).
  std::vector<double> load_balancing;
  std::vector<double> z_loss;
  // (E) device fp32: routed copies per expert after dropping, this rank's rows, summed over the
  // training forwards since the trainer last zeroed it (Megatron's local_tokens_per_expert).
  backend::DeviceBuffer<float> tokens_per_expert;
  // (E) device fp32 with --moe-router-enable-expert-bias (starts at 0), else empty.
  backend::DeviceBuffer<float> expert_bias;
  // The layer's router (once prepared): the trainer restarts its global_aux_loss running counts
  // once per global batch (moe::Router::reset_global_aux_counts).
  moe::Router* router = nullptr;

  void clear_losses() {
    load_balancing.clear();
    z_loss.clear();
  }
};

// Megatron's router options from the model config's MoE fields.
moe::RouterOptions router_options(const ModelConfig& config);

class MoeMlp : public MlpVariant {
 public:
  MoeMlp(const ModelConfig& config, const MlpSpec& spec, int layer);
  ~MoeMlp() override;

  void declare(ParamDeclarations& declarations) const override;
  void bind(const ParamLayout& layout) override;
  // After bind: makes the router, the token dispatcher (over parallel.expert_groups()) and the
  // local experts, and the state's buffers. The stage calls it once; forward refuses to run before.
  // mt::UsageError for TP > 1 without sequence parallelism (Megatron's rule: the router runs on
  // each TP rank's own rows).
  void prepare(const backend::Ops& ops, const ParallelContext& parallel);

  int layer() const { return layer_; }
  int64_t num_local_experts() const { return local_experts_; }    // after bind
  int first_local_expert() const { return first_local_expert_; }  // after bind
  LocalExpertsShape experts_shape() const;                        // after bind
  MoeLayerState& state() { return state_; }
  const MoeLayerState& state() const { return state_; }

  // The shared experts' saved set and workspace come from `source` (they scale with the rows); the
  // routed part (S x E router buffers, the dispatcher's rows, the experts' sets for R rows) is
  // device memory each set grows on demand (R varies with the routing).
  std::unique_ptr<BlockBuffers> lay_out_saved(BufferSource& source, const ActivationRows& rows) const override;
  std::unique_ptr<BlockBuffers> lay_out_workspace(BufferSource& source, const ActivationRows& rows) const override;
  int64_t widest_gemm_operand() const override;

  // out_seq (S, C) = routed experts' combined output + shared experts' output.
  void forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, BlockBuffers& saved,
               BlockBuffers& workspace, const SequenceParallelBuffers& full_rows, float* out_seq) const override;
  // dx_seq (S, C) written; router, expert and shared-expert grads accumulate; the router's aux and
  // z-loss grads are scaled by pass.aux_loss_grad_factor.
  void backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                BlockBuffers& saved, BlockBuffers& workspace, const SequenceParallelBuffers& full_rows,
                float* dx_seq) const override;

 private:
  struct Saved;
  struct Workspace;
  struct Runtime;

  Runtime& runtime() const;
  int64_t fc1_stride() const { return 2 * local_ffn_ * hidden_; }
  int64_t fc2_stride() const { return hidden_ * local_ffn_; }
  void route(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, Saved& saved) const;
  moe::RouterSaved saved_of(const LayerContext& ctx, Saved& saved) const;
  void size_expert_buffers(const LayerContext& ctx, Saved& saved, Workspace& workspace) const;
  ExpertsContext experts_context(const LayerContext& ctx) const;
  ExpertRows expert_rows(const Saved& saved) const;

  int layer_;
  int num_experts_, topk_;
  int64_t hidden_, expert_ffn_;  // global widths
  double init_std_;
  int num_layers_;
  bool grouped_gemm_;
  moe::RouterOptions options_;
  std::unique_ptr<Mlp> shared_;  // null without shared experts
  // Bound: offsets into the flat buffers and the local expert range.
  int64_t router_offset_ = -1;
  int64_t fc1_offset_ = -1, fc2_offset_ = -1, local_ffn_ = 0;
  int64_t local_experts_ = 0;
  int first_local_expert_ = 0;
  // The router's, dispatcher's and experts' objects (prepare) and the state the trainer reads:
  // forward is const for the stage, these are the layer's own running state.
  std::unique_ptr<Runtime> runtime_;
  mutable MoeLayerState state_;
};

// The name of a MoE layer's tensors (`tensor` after "decoder.layers.<i>.mlp.").
std::string moe_param_name(int layer, const std::string& tensor);
std::string expert_param_name(int layer, int expert, const char* tensor);  // ...mlp.experts.<e>.<tensor>

}  // namespace mt::model
