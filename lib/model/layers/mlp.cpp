// The MLP (see mlp.h).
#include "model/layers/mlp.h"

namespace mt::model {
namespace {

std::string name(int layer, const char* tensor) { return layer_prefix(layer) + "mlp." + tensor; }

LinearParams fc1_params(const ModelConfig& config, const ParamLayout& layout, int layer) {
  if (config.swiglu) {
    const ParamEntry& gate = layout.find(name(layer, "linear_fc1_gate.weight"));
    const ParamEntry& up = layout.find(name(layer, "linear_fc1_up.weight"));
    return LinearParams{gate.offset, optional_param_offset(layout, name(layer, "linear_fc1_gate.bias")),
                        config.hidden_size, gate.local_shape[0] + up.local_shape[0]};
  }
  const ParamEntry& fc1 = layout.find(name(layer, "linear_fc1.weight"));
  return LinearParams{fc1.offset, optional_param_offset(layout, name(layer, "linear_fc1.bias")), config.hidden_size,
                      fc1.local_shape[0]};
}

LinearParams fc2_params(const ModelConfig& config, const ParamLayout& layout, int layer) {
  const ParamEntry& fc2 = layout.find(name(layer, "linear_fc2.weight"));
  return LinearParams{fc2.offset, optional_param_offset(layout, name(layer, "linear_fc2.bias")), fc2.local_shape[1],
                      config.hidden_size};
}

}  // namespace

void Mlp::declare(ParamDeclarations& declarations, const ModelConfig& config, int layer) {
  const int64_t ffn = config.ffn_hidden_size, hidden = config.hidden_size;
  const bool bias = config.add_bias_linear;
  const std::string ffn_flag = "--ffn-hidden-size " + std::to_string(ffn);
  using S = TensorSplit;
  if (config.swiglu) {
    declarations.begin_group();
    declarations.add(name(layer, "linear_fc1_gate.weight"), {ffn, hidden}, S::column_parallel, layer, 1, ffn_flag);
    declarations.add(name(layer, "linear_fc1_up.weight"), {ffn, hidden}, S::column_parallel, layer, 1, ffn_flag);
    if (bias) {
      declarations.begin_group();
      declarations.add(name(layer, "linear_fc1_gate.bias"), {ffn}, S::column_parallel, layer, 1, ffn_flag);
      declarations.add(name(layer, "linear_fc1_up.bias"), {ffn}, S::column_parallel, layer, 1, ffn_flag);
    }
  } else {
    declarations.add_single(name(layer, "linear_fc1.weight"), {ffn, hidden}, S::column_parallel, layer, 1, ffn_flag);
    if (bias) declarations.add_single(name(layer, "linear_fc1.bias"), {ffn}, S::column_parallel, layer, 1, ffn_flag);
  }
  declarations.add_single(name(layer, "linear_fc2.weight"), {hidden, ffn}, S::row_parallel, layer, 1, ffn_flag);
  if (bias) declarations.add_single(name(layer, "linear_fc2.bias"), {hidden}, S::replicated, layer);
}

Mlp::Mlp(const ModelConfig& config, const ParamLayout& layout, int layer)
    : swiglu_(config.swiglu), fc1_(fc1_params(config, layout, layer)), fc2_(fc2_params(config, layout, layer)) {}

void Mlp::forward(const LayerContext& ctx, const LayerPass& pass, const float* x_seq, const Saved& saved,
                  const Buffers& buffers, float* out_seq) const {
  fc1_.forward(ctx, pass, x_seq, buffers.sequence_parallel, saved.fc1);
  if (swiglu_) {
    ctx.ops.swiglu_forward(saved.fc1, saved.act, pass.rows, static_cast<int>(ffn()), ctx.stream);
  } else {
    ctx.ops.gelu_forward(saved.fc1, saved.act, pass.rows * ffn(), ctx.stream);
  }
  fc2_.forward(ctx, pass, saved.act, buffers.sequence_parallel, out_seq);
}

void Mlp::backward(const LayerContext& ctx, const LayerPass& pass, const float* dy_seq, const float* x_seq,
                   const Saved& saved, const Buffers& buffers, float* dx_seq) const {
  fc2_.backward(ctx, pass, dy_seq, saved.act, buffers.sequence_parallel, buffers.d_act);
  if (swiglu_) {
    ctx.ops.swiglu_backward(buffers.d_act, saved.fc1, buffers.d_fc1, pass.rows, static_cast<int>(ffn()), ctx.stream);
  } else {
    ctx.ops.gelu_backward(buffers.d_act, saved.fc1, buffers.d_fc1, pass.rows * ffn(), ctx.stream);
  }
  fc1_.backward(ctx, pass, buffers.d_fc1, x_seq, buffers.sequence_parallel, dx_seq);
}

}  // namespace mt::model
