// The dense MLP (see mlp.h).
#include "model/layers/mlp.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace mt::model {

struct Mlp::Saved : BlockBuffers {
  float* fc1 = nullptr;  // (rows, fc1_width): pre-activation
  float* act = nullptr;  // (rows, ffn)
};

struct Mlp::Workspace : BlockBuffers {
  float* d_fc1 = nullptr;  // (rows, fc1_width)
  float* d_act = nullptr;  // (rows, ffn)
};

std::string Mlp::name(const char* tensor) const { return layer_prefix(layer_) + prefix_ + tensor; }

Mlp::Mlp(const ModelConfig& config, const MlpSpec& spec, int layer, std::string prefix)
    : layer_(layer),
      prefix_(std::move(prefix)),
      hidden_(config.hidden_size),
      ffn_hidden_size_(spec.ffn_hidden_size),
      swiglu_(spec.activation == MlpActivation::swiglu),
      bias_(config.add_bias_linear),
      init_std_(config.init_method_std),
      num_layers_(config.num_layers) {}

void Mlp::declare(ParamDeclarations& declarations) const {
  const int64_t ffn = ffn_hidden_size_, hidden = hidden_;
  const std::string ffn_flag = "--ffn-hidden-size " + std::to_string(ffn);
  const Init weight = Init::normal(init_std_);
  const Init output = Init::normal(init_std_ / std::sqrt(2.0 * num_layers_));
  const Init zero = Init::constant(0.0f);
  using S = TensorSplit;
  if (swiglu_) {
    declarations.begin_group();
    declarations.add({name("linear_fc1_gate.weight"), {ffn, hidden}, S::column_parallel, layer_, weight, 1,
                      ffn_flag});
    declarations.add({name("linear_fc1_up.weight"), {ffn, hidden}, S::column_parallel, layer_, weight, 1,
                      ffn_flag});
    if (bias_) {
      declarations.begin_group();
      declarations.add({name("linear_fc1_gate.bias"), {ffn}, S::column_parallel, layer_, zero, 1, ffn_flag});
      declarations.add({name("linear_fc1_up.bias"), {ffn}, S::column_parallel, layer_, zero, 1, ffn_flag});
    }
  } else {
    declarations.add_single({name("linear_fc1.weight"), {ffn, hidden}, S::column_parallel, layer_, weight, 1,
                             ffn_flag});
    if (bias_) {
      declarations.add_single({name("linear_fc1.bias"), {ffn}, S::column_parallel, layer_, zero, 1, ffn_flag});
    }
  }
  declarations.add_single({name("linear_fc2.weight"), {hidden, ffn}, S::row_parallel, layer_, output, 1,
                           ffn_flag});
  if (bias_) declarations.add_single({name("linear_fc2.bias"), {hidden}, S::replicated, layer_, zero});
}

void Mlp::bind(const ParamLayout& layout) {
  if (swiglu_) {
    const ParamEntry& gate = layout.find(name("linear_fc1_gate.weight"));
    const ParamEntry& up = layout.find(name("linear_fc1_up.weight"));
    fc1_ = ColumnParallelLinear(LinearParams{gate.offset,
                                             optional_param_offset(layout, name("linear_fc1_gate.bias")),
                                             hidden_, gate.local_shape[0] + up.local_shape[0]});
  } else {
    const ParamEntry& fc1 = layout.find(name("linear_fc1.weight"));
    fc1_ = ColumnParallelLinear(LinearParams{fc1.offset, optional_param_offset(layout, name("linear_fc1.bias")),
                                             hidden_, fc1.local_shape[0]});
  }
  const ParamEntry& fc2 = layout.find(name("linear_fc2.weight"));
  fc2_ = RowParallelLinear(LinearParams{fc2.offset, optional_param_offset(layout, name("linear_fc2.bias")),
                                        fc2.local_shape[1], hidden_});
}

std::unique_ptr<BlockBuffers> Mlp::lay_out_saved(BufferSource& source, const ActivationRows& rows) const {
  auto saved = std::make_unique<Saved>();
  saved->fc1 = source.take(rows.rows * fc1_width());
  saved->act = source.take(rows.rows * ffn());
  return saved;
}

std::unique_ptr<BlockBuffers> Mlp::lay_out_workspace(BufferSource& source, const ActivationRows& rows) const {
  auto workspace = std::make_unique<Workspace>();
  workspace->d_fc1 = source.take(rows.rows * fc1_width());
  workspace->d_act = source.take(rows.rows * ffn());
  return workspace;
}

int64_t Mlp::widest_gemm_operand() const {
  return std::max({fc1_.in_features(), fc1_.out_features(), fc2_.in_features(), fc2_.out_features()});
}

void Mlp::forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, BlockBuffers& saved_buffers,
                  BlockBuffers&, const SequenceParallelBuffers& full_rows, float* out_seq) const {
  const Saved& saved = static_cast<const Saved&>(saved_buffers);
  if (swiglu_) {
    fc1_.forward(ctx, pass, x_seq, full_rows, saved.fc1);
    ctx.ops.swiglu_forward(saved.fc1, saved.act, pass.rows, static_cast<int>(ffn()), ctx.stream);
  } else {
    fc1_.forward_gelu(ctx, pass, x_seq, full_rows, saved.fc1, saved.act);  // fc1, its bias and GELU: one GEMM
  }
  fc2_.forward(ctx, pass, saved.act, full_rows, out_seq);
}

void Mlp::backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                   BlockBuffers& saved_buffers, BlockBuffers& workspace_buffers,
                   const SequenceParallelBuffers& full_rows, float* dx_seq) const {
  const Saved& saved = static_cast<const Saved&>(saved_buffers);
  const Workspace& w = static_cast<const Workspace&>(workspace_buffers);
  fc2_.backward(ctx, pass, dy_seq, saved.act, full_rows, w.d_act);
  if (swiglu_) {
    ctx.ops.swiglu_backward(w.d_act, saved.fc1, w.d_fc1, pass.rows, static_cast<int>(ffn()), ctx.stream);
  } else {
    ctx.ops.gelu_backward(w.d_act, saved.fc1, w.d_fc1, pass.rows * ffn(), ctx.stream);
  }
  fc1_.backward(ctx, pass, w.d_fc1, x_seq, full_rows, dx_seq);
}

}  // namespace mt::model
