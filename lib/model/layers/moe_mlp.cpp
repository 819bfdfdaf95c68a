// The mixture-of-experts MLP (see moe_mlp.h).
#include "model/layers/moe_mlp.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/layout.h"

namespace mt::model {

std::string moe_param_name(int layer, const std::string& tensor) { return layer_prefix(layer) + "mlp." + tensor; }

std::string expert_param_name(int layer, int expert, const char* tensor) {
  return moe_param_name(layer, "experts." + std::to_string(expert) + "." + tensor);
}

moe::RouterOptions router_options(const ModelConfig& config) {
  moe::RouterOptions options;
  options.num_experts = config.num_experts;
  options.topk = config.moe_router_topk;
  options.score_function = config.moe_router_score_function == MoeScoreFunction::sigmoid
                               ? moe::ScoreFunction::sigmoid
                               : moe::ScoreFunction::softmax;
  options.pre_softmax = config.moe_router_pre_softmax;
  options.num_groups = config.moe_router_num_groups.value_or(0);
  options.group_topk = config.moe_router_group_topk.value_or(0);
  options.topk_scaling_factor = config.moe_router_topk_scaling_factor;
  options.enable_expert_bias = config.moe_router_enable_expert_bias;
  switch (config.moe_router_load_balancing_type) {
    case MoeLoadBalancing::aux_loss: options.load_balancing_type = moe::LoadBalancingType::aux_loss; break;
    case MoeLoadBalancing::seq_aux_loss: options.load_balancing_type = moe::LoadBalancingType::seq_aux_loss; break;
    case MoeLoadBalancing::global_aux_loss:
      options.load_balancing_type = moe::LoadBalancingType::global_aux_loss;
      break;
    case MoeLoadBalancing::none: options.load_balancing_type = moe::LoadBalancingType::none; break;
    case MoeLoadBalancing::sinkhorn:
      throw UsageError("--moe-router-load-balancing-type sinkhorn", "not supported");
  }
  options.aux_loss_coeff = config.moe_aux_loss_coeff;
  options.z_loss_coeff = config.moe_z_loss_coeff;
  if (config.moe_expert_capacity_factor) options.capacity_factor = *config.moe_expert_capacity_factor;
  options.token_drop_policy =
      config.moe_token_drop_policy == MoeDropPolicy::position ? moe::TokenDropPolicy::position : moe::TokenDropPolicy::probs;
  options.pad_expert_input_to_capacity = config.moe_pad_expert_input_to_capacity;
  return options;
}

namespace {

// A device buffer of at least `count` elements, regrown (never shrunk) on demand.
template <typename T>
T* grown(backend::DeviceBuffer<T>& buffer, const backend::Ops& ops, int64_t count,
         backend::MemoryCategory category = backend::MemoryCategory::activations) {
  if (count <= 0) count = 1;
  if (buffer.size() < count) buffer = backend::DeviceBuffer<T>(ops, count, category);
  return buffer.data();
}

}  // namespace

// What backward needs of one micro-batch. The S-row pieces and the shared experts' set are fixed
// per slot; the routed rows' pieces (R varies with the routing) grow on demand.
struct MoeMlp::Saved : BlockBuffers {
  std::unique_ptr<BlockBuffers> shared;            // the shared experts' saved set
  backend::DeviceBuffer<float> logits;             // (S, E) fp32
  backend::DeviceBuffer<float> probs;              // (S, E) after dropping
  backend::DeviceBuffer<uint8_t> routing_map;      // (S, E)
  backend::DeviceBuffer<int32_t> topk_indices;     // Router::saved_index_count(S)
  backend::DeviceBuffer<float> aux_weights;        // Router::aux_weight_count
  backend::DeviceBuffer<int64_t> row_ids;          // (S) rows in the micro-batch (seq_aux_loss)
  DispatchState dispatch;                          // the routed rows, their probs and counts
  backend::DeviceBuffer<float> experts_block;      // LocalExperts::saved_floats(R)
  ExpertsSaved experts;
  moe::RouterRows rows;
};

struct MoeMlp::Workspace : BlockBuffers {
  std::unique_ptr<BlockBuffers> shared;       // the shared experts' workspace
  float* shared_out = nullptr;                // (S, C): their output, then their dx
  backend::DeviceBuffer<float> expert_out;    // (R, C), in backward their grad
  backend::DeviceBuffer<float> d_rows;        // (R, C)
  backend::DeviceBuffer<float> d_row_probs;   // (R)
  backend::DeviceBuffer<float> dprobs;        // (S, E)
  backend::DeviceBuffer<float> dlogits;       // (S, E)
  backend::DeviceBuffer<float> experts_block; // LocalExperts::workspace_floats(R)
  ExpertsWorkspace experts;
  int64_t experts_capacity = 0;
};

struct MoeMlp::Runtime {
  const backend::Ops& ops;
  std::unique_ptr<moe::Router> router;
  std::unique_ptr<TokenDispatcher> dispatcher;
  std::unique_ptr<LocalExperts> experts;
};

MoeMlp::MoeMlp(const ModelConfig& config, const MlpSpec& spec, int layer)
    : layer_(layer),
      num_experts_(config.num_experts),
      topk_(config.moe_router_topk),
      hidden_(config.hidden_size),
      expert_ffn_(spec.ffn_hidden_size),
      init_std_(config.init_method_std),
      num_layers_(config.num_layers),
      grouped_gemm_(config.moe_grouped_gemm),
      options_(router_options(config)) {
  state_.layer = layer;
  state_.num_experts = num_experts_;
  if (spec.shared_expert_ffn_hidden_size > 0) {
    MlpSpec shared = spec;
    shared.kind = MlpKind::dense;
    shared.activation = MlpActivation::swiglu;
    shared.ffn_hidden_size = spec.shared_expert_ffn_hidden_size;
    shared_ = std::make_unique<Mlp>(config, shared, layer, "mlp.shared_experts.");
  }
}

MoeMlp::~MoeMlp() = default;

void MoeMlp::declare(ParamDeclarations& declarations) const {
  const int64_t hidden = hidden_, ffn = expert_ffn_;
  const Init weight = Init::normal(init_std_);
  const Init output = Init::normal(init_std_ / std::sqrt(2.0 * num_layers_));
  using S = TensorSplit;
  declarations.add_single({moe_param_name(layer_, "router.weight"), {num_experts_, hidden}, S::replicated, layer_,
                           weight});
  const std::string ffn_flag = "--moe-ffn-hidden-size " + std::to_string(ffn);
  auto expert_tensor = [&](int e, const char* tensor, std::vector<int64_t> shape, S split, const Init& init) {
    ParamDeclaration declaration{expert_param_name(layer_, e, tensor), std::move(shape), split, layer_, init, 1,
                                 ffn_flag};
    declaration.expert = e;
    declaration.num_experts = num_experts_;
    return declaration;
  };
  declarations.begin_group();  // every local expert's fc1, back to back in expert order
  for (int e = 0; e < num_experts_; ++e) {
    declarations.add(expert_tensor(e, "linear_fc1_gate.weight", {ffn, hidden}, S::column_parallel, weight));
    declarations.add(expert_tensor(e, "linear_fc1_up.weight", {ffn, hidden}, S::column_parallel, weight));
  }
  declarations.begin_group();  // and their fc2
  for (int e = 0; e < num_experts_; ++e) {
    declarations.add(expert_tensor(e, "linear_fc2.weight", {hidden, ffn}, S::row_parallel, output));
  }
  if (shared_) shared_->declare(declarations);
}

void MoeMlp::bind(const ParamLayout& layout) {
  router_offset_ = layout.find(moe_param_name(layer_, "router.weight")).offset;
  // This rank's experts: a contiguous range of global experts, fc1 and fc2 each one fused group.
  std::vector<int> local;
  for (int e = 0; e < num_experts_; ++e) {
    if (layout.try_find(expert_param_name(layer_, e, "linear_fc1_gate.weight"))) local.push_back(e);
  }
  if (local.empty() || local.back() - local.front() + 1 != static_cast<int>(local.size()) ||
      num_experts_ % static_cast<int>(local.size()) != 0) {
    throw Error("MoE layer " + std::to_string(layer_), "the layout holds no contiguous range of its experts");
  }
  first_local_expert_ = local.front();
  local_experts_ = static_cast<int64_t>(local.size());
  const ParamEntry& gate0 = layout.find(expert_param_name(layer_, first_local_expert_, "linear_fc1_gate.weight"));
  const ParamEntry& fc2_0 = layout.find(expert_param_name(layer_, first_local_expert_, "linear_fc2.weight"));
  local_ffn_ = gate0.local_shape[0];
  fc1_offset_ = gate0.offset;
  fc2_offset_ = fc2_0.offset;
  for (int j = 0; j < static_cast<int>(local_experts_); ++j) {
    const int e = first_local_expert_ + j;
    const bool adjacent =
        layout.find(expert_param_name(layer_, e, "linear_fc1_gate.weight")).offset == fc1_offset_ + j * fc1_stride() &&
        layout.find(expert_param_name(layer_, e, "linear_fc1_up.weight")).offset ==
            fc1_offset_ + j * fc1_stride() + local_ffn_ * hidden_ &&
        layout.find(expert_param_name(layer_, e, "linear_fc2.weight")).offset == fc2_offset_ + j * fc2_stride();
    if (!adjacent) throw Error(expert_param_name(layer_, e, "linear_fc1_gate.weight"), "not where the fused groups put it");
  }
  if (shared_) shared_->bind(layout);
}

LocalExpertsShape MoeMlp::experts_shape() const {
  return LocalExpertsShape{local_experts_, hidden_, local_ffn_, fc1_offset_, fc1_stride(), fc2_offset_, fc2_stride()};
}

void MoeMlp::prepare(const backend::Ops& ops, const ParallelContext& parallel) {
  const ExpertGroups& groups = parallel.expert_groups();
  if (parallel.tensor_parallel_size() > 1 && !parallel.sequence_parallel()) {
    // Each TP rank would route every token of the micro-batch: Megatron refuses it too.
    throw UsageError("--tensor-model-parallel-size " + std::to_string(parallel.tensor_parallel_size()) +
                         " with --num-experts " + std::to_string(num_experts_),
                     "needs --sequence-parallel (as Megatron)");
  }
  if (groups.expert_parallel > 1 && num_experts_ % groups.expert_parallel != 0) {
    throw UsageError("--expert-model-parallel-size " + std::to_string(groups.expert_parallel),
                     "does not divide --num-experts " + std::to_string(num_experts_));
  }
  if (local_experts_ * groups.expert_parallel != num_experts_) {
    throw Error("MoE layer " + std::to_string(layer_), "holds " + std::to_string(local_experts_) +
                                                           " experts, not --num-experts / EP");
  }
  const backend::Stream stream = ops.default_stream();
  auto runtime = std::make_unique<Runtime>(Runtime{ops, nullptr, nullptr, nullptr});
  runtime->router = std::make_unique<moe::Router>(options_, ops, stream, moe::RouterGroups{groups.tp_cp, groups.tp_dp_cp});
  state_.router = runtime->router.get();
  DispatcherGroups dispatch{groups.expert_parallel, groups.expert_tensor_parallel, groups.ep_rank, groups.etp_rank,
                            groups.ep, groups.expert_tp, groups.expert_tp_ep};
  runtime->dispatcher = std::make_unique<TokenDispatcher>(num_experts_, hidden_, dispatch, ops, stream);
  runtime->experts =
      std::make_unique<LocalExperts>(experts_shape(), grouped_gemm_ ? ExpertGemmPath::grouped : ExpertGemmPath::loop);
  state_.tokens_per_expert = backend::DeviceBuffer<float>(ops, num_experts_, backend::MemoryCategory::activations);
  if (options_.enable_expert_bias) {
    state_.expert_bias = backend::DeviceBuffer<float>(ops, num_experts_, backend::MemoryCategory::activations);
  }
  runtime_ = std::move(runtime);
}

MoeMlp::Runtime& MoeMlp::runtime() const {
  if (!runtime_) throw Error("MoE layer " + std::to_string(layer_), "runs before its stage prepared it");
  return *runtime_;
}

std::unique_ptr<BlockBuffers> MoeMlp::lay_out_saved(BufferSource& source, const ActivationRows& rows) const {
  auto saved = std::make_unique<Saved>();
  if (shared_) saved->shared = shared_->lay_out_saved(source, rows);
  return saved;
}

std::unique_ptr<BlockBuffers> MoeMlp::lay_out_workspace(BufferSource& source, const ActivationRows& rows) const {
  auto workspace = std::make_unique<Workspace>();
  if (shared_) {
    workspace->shared = shared_->lay_out_workspace(source, rows);
    workspace->shared_out = source.take(rows.sequence_rows * hidden_);
  }
  return workspace;
}

int64_t MoeMlp::widest_gemm_operand() const {
  const int64_t shared = shared_ ? shared_->widest_gemm_operand() : 0;
  return std::max({hidden_, static_cast<int64_t>(num_experts_), 2 * std::max<int64_t>(local_ffn_, 1), shared});
}

void MoeMlp::route(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, Saved& s) const {
  Runtime& rt = runtime();
  const int64_t rows = pass.sequence_rows, e = num_experts_;
  ctx.ops.gemm(false, true, rows, e, hidden_, 1.0f, x_seq, hidden_, ctx.params + router_offset_, hidden_, 0.0f,
               grown(s.logits, ctx.ops, rows * e), e, DType::f32, ctx.stream);  // logits (S, E) in fp32
  // Rows of the micro-batch (its samples are the sequences of seq_aux_loss).
  std::vector<int64_t> ids(static_cast<size_t>(rows));
  const int64_t first = ctx.parallel.sequence_row_offset(pass.rows);
  for (int64_t t = 0; t < rows; ++t) ids[static_cast<size_t>(t)] = first + t;
  ctx.ops.copy(grown(s.row_ids, ctx.ops, rows), ids.data(), rows * static_cast<int64_t>(sizeof(int64_t)),
               backend::CopyKind::host_to_device, ctx.stream);
  ctx.ops.synchronize(ctx.stream);  // `ids` leaves scope
  s.rows = moe::RouterRows{rows, s.row_ids.data(), pass.batch.seq, pass.batch.batch};
  const moe::RouterSaved router_saved = saved_of(ctx, s);
  // A forward that builds grads counts its tokens and logs its losses once: not under recompute.
  const bool counted = pass.training && !pass.recompute;
  const moe::RouterLossValues values = rt.router->forward(
      s.logits.data(), state_.expert_bias.empty() ? nullptr : state_.expert_bias.data(), s.rows, pass.training,
      counted ? state_.tokens_per_expert.data() : nullptr, grown(s.probs, ctx.ops, rows * e),
      grown(s.routing_map, ctx.ops, rows * e), router_saved, pass.training && pass.recompute);
  if (counted) {
    if (values.load_balancing) state_.load_balancing.push_back(*values.load_balancing);
    if (values.z_loss) state_.z_loss.push_back(*values.z_loss);
  }
}

moe::RouterSaved MoeMlp::saved_of(const LayerContext& ctx, Saved& s) const {
  Runtime& rt = runtime();
  const int64_t aux = rt.router->aux_weight_count(s.rows);
  return moe::RouterSaved{grown(s.topk_indices, ctx.ops, rt.router->saved_index_count(s.rows.rows)),
                          aux > 0 ? grown(s.aux_weights, ctx.ops, aux) : nullptr};
}

void MoeMlp::size_expert_buffers(const LayerContext& ctx, Saved& s, Workspace& w) const {
  const LocalExperts& experts = *runtime().experts;
  const int64_t capacity = std::max<int64_t>(s.dispatch.rows(), 1);
  BufferSource saved_count;
  experts.lay_out_saved(saved_count, capacity);
  BufferSource saved_source(grown(s.experts_block, ctx.ops, saved_count.floats()));
  s.experts = experts.lay_out_saved(saved_source, capacity);
  const Precision precision = ctx.gemm.weights().precision();
  BufferSource workspace_count;
  experts.lay_out_workspace(workspace_count, capacity, precision);
  BufferSource workspace_source(grown(w.experts_block, ctx.ops, workspace_count.floats()));
  w.experts = experts.lay_out_workspace(workspace_source, capacity, precision);
}

ExpertsContext MoeMlp::experts_context(const LayerContext& ctx) const {
  return ExpertsContext{ctx.ops, ctx.stream, ctx.gemm.weights(), ctx.params, ctx.grads, ctx.gemm.fp8()};
}

ExpertRows MoeMlp::expert_rows(const Saved& s) const {
  return ExpertRows{s.dispatch.expert_rows(), s.dispatch.expert_probs(), s.dispatch.tokens_per_local_expert().data(),
                    s.dispatch.rows()};
}

void MoeMlp::forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, BlockBuffers& saved,
                     BlockBuffers& workspace, const SequenceParallelBuffers& full_rows, float* out_seq) const {
  Saved& s = static_cast<Saved&>(saved);
  Workspace& w = static_cast<Workspace&>(workspace);
  Runtime& rt = runtime();
  const int64_t rows = pass.sequence_rows;
  if (shared_) shared_->forward(ctx, pass, x_seq, *s.shared, *w.shared, full_rows, w.shared_out);  // before the router
  route(ctx, pass, x_seq, s);
  rt.dispatcher->dispatch(x_seq, s.probs.data(), s.routing_map.data(), rows, s.dispatch);
  size_expert_buffers(ctx, s, w);
  float* expert_out = grown(w.expert_out, ctx.ops, s.dispatch.rows() * hidden_);
  rt.experts->forward(experts_context(ctx), expert_rows(s), s.experts, w.experts, expert_out);
  rt.dispatcher->combine(s.dispatch, expert_out, out_seq);
  if (shared_) ctx.ops.add_inplace(out_seq, w.shared_out, rows * hidden_, ctx.stream);
}

void MoeMlp::backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                      BlockBuffers& saved, BlockBuffers& workspace, const SequenceParallelBuffers& full_rows,
                      float* dx_seq) const {
  Saved& s = static_cast<Saved&>(saved);
  Workspace& w = static_cast<Workspace&>(workspace);
  Runtime& rt = runtime();
  const int64_t rows = pass.sequence_rows, e = num_experts_, routed = s.dispatch.rows();
  size_expert_buffers(ctx, s, w);  // the workspace may have been sized by another micro-batch since
  float* d_expert_out = grown(w.expert_out, ctx.ops, routed * hidden_);
  rt.dispatcher->combine_backward(s.dispatch, dy_seq, d_expert_out);
  float* d_rows = grown(w.d_rows, ctx.ops, routed * hidden_);
  float* d_row_probs = grown(w.d_row_probs, ctx.ops, routed);
  rt.experts->backward(experts_context(ctx), expert_rows(s), s.experts, w.experts, d_expert_out, d_rows, d_row_probs);
  float* dprobs = grown(w.dprobs, ctx.ops, rows * e);
  rt.dispatcher->dispatch_backward(s.dispatch, d_rows, d_row_probs, dx_seq, dprobs);
  float* dlogits = grown(w.dlogits, ctx.ops, rows * e);
  rt.router->backward(s.logits.data(), s.routing_map.data(), saved_of(ctx, s), s.rows, dprobs,
                      pass.aux_loss_grad_factor, dlogits);
  // The router GEMM's backward in fp32: dW_r (E, C) += dlogits^T x, dx += dlogits W_r.
  ctx.ops.gemm(true, false, e, hidden_, rows, 1.0f, dlogits, e, x_seq, hidden_, 1.0f, ctx.grads + router_offset_,
               hidden_, DType::f32, ctx.stream);
  ctx.ops.gemm(false, false, rows, hidden_, e, 1.0f, dlogits, e, ctx.params + router_offset_, hidden_, 1.0f, dx_seq,
               hidden_, DType::f32, ctx.stream);
  if (shared_) {
    shared_->backward(ctx, pass, dy_seq, x_seq, *s.shared, *w.shared, full_rows, w.shared_out);
    ctx.ops.add_inplace(dx_seq, w.shared_out, rows * hidden_, ctx.stream);
  }
}

}  // namespace mt::model
