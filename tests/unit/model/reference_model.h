// The tiny models' test harness shared by the model suites: the whole model on one rank as one
// stage (WholeModel), random micro-batches (Data), and a double-precision reference of the same
// model written from the spec of tests/golden/README.md (DoubleReference), with the check of mt's
// fp32 gradients against central differences of it. The reference reads each layer's MLP width
// from the layout, so it also covers chunks whose layers differ in width. Used by
// tests/unit/model/test_model_gradients.cpp and tests/unit/model/test_spec.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "model/init.h"
#include "model/stage.h"

namespace mt::testing {

using namespace mt::model;

// The whole model on one rank as one stage (model/stage.h), with its GEMM weight copy: the
// interface these tests drive (forward and backward of one micro-batch, loss only).
class WholeModel {
 public:
  WholeModel(const ModelConfig& config, const ParamLayout& layout, Precision precision, RecomputeConfig recompute,
             int micro_batch_size, uint64_t seed)
      : weights_(backend::cpu_ops(), precision, layout.total_elements),
        stage_(config, layout, 0, parallel_, backend::cpu_ops(), weights_,
               StageOptions{.precision = precision, .recompute = recompute, .micro_batch_size = micro_batch_size,
                            .seed = seed}) {}
  void bind(const float* params, float* grads) {
    params_ = params;
    stage_.bind(params, grads);
    refresh_gemm_weights();
  }
  void refresh_gemm_weights() { weights_.refresh(params_); }
  LossSums forward_backward(const MicroBatch& batch, float dloss_scale, uint64_t iteration) {
    const LossSums sums = forward(batch, ForwardPass{iteration, true});
    stage_.backward(0, nullptr, dloss_scale);
    return sums;
  }
  LossSums forward_loss(const MicroBatch& batch) { return forward(batch, ForwardPass{0, false}); }
  int64_t activation_bytes() const { return stage_.activation_bytes(); }
  // The stage's forward with its loss sums added to host doubles (the CPU table's memory).
  LossSums forward(const MicroBatch& micro_batch, const ForwardPass& pass) {
    double sums[2] = {0, 0};
    MicroBatch batch = micro_batch;
    batch.loss_sums = sums;
    stage_.forward(0, batch, nullptr, pass);
    return LossSums{sums[0], sums[1]};
  }
  static int64_t planned_activation_bytes(const ModelConfig& config, Precision precision, RecomputeConfig recompute,
                                          int micro_batch_size, int layers) {
    return model::planned_activation_bytes(config, precision, recompute, micro_batch_size, layers);
  }

 private:
  ParallelContext parallel_;
  GemmWeights weights_;
  Stage stage_;
  const float* params_ = nullptr;
};

struct Data {
  std::vector<int32_t> tokens, labels, positions;
  std::vector<float> mask;
  std::vector<int64_t> row_ids;
  MicroBatch batch(int b, int t) {
    return MicroBatch{b, t, tokens.data(), labels.data(), mask.data(), positions.data(), nullptr, row_ids.data()};
  }
};

// How far mt's fp32 gradient may be from the exact one (the double reference's): measured worst
// 3.7e-6 absolute (|g| up to 10) and 4e-4 relative at |g| = 2.7e-3, at most 0.15 of this bound
// at every ISA level (MT_CPU_ISA). A gradient off by 1% fails from |g| = 1e-3 up, and every
// gradient is checked to 1e-5.
constexpr double kGradientAbsolute = 1e-5, kGradientRelative = 1e-4;

inline Data make_data(const ModelConfig& c, int batch, uint32_t seed) {
  std::mt19937 rng(seed);
  Data d;
  const int n = batch * c.seq_length;
  for (int r = 0; r < n; ++r) {
    d.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
    d.labels.push_back(static_cast<int32_t>(rng() % c.vocab_size));
    d.positions.push_back(r % c.seq_length);
    d.mask.push_back(r % 5 == 3 ? 0.0f : 1.0f);
    d.row_ids.push_back(r);
  }
  return d;
}

// The same model in double precision, written from the spec of tests/golden/README.md (which
// PyTorch follows too): the masked loss sum of a micro-batch from parameters in mt's layout.
// Central differences of it are exact to about 1e-9, so they check mt's fp32 backward to its
// own round-off rather than to the noise of fp32 finite differences.
class DoubleReference {
 public:
  DoubleReference(const ModelConfig& c, const ParamLayout& layout) : c_(c), layout_(layout) {}

  double loss(const std::vector<double>& params, const Data& data, int batch) const {
    params_ = &params;
    const int T = c_.seq_length;
    double total = 0;
    for (int b = 0; b < batch; ++b) total += sample_loss(data, b * T);
    return total;
  }

 private:
  using Rows = std::vector<std::vector<double>>;  // (T, width)

  const double* tensor(const std::string& name) const { return params_->data() + layout_.find(name).offset; }

  // y = x W^T (+ b), W (out, in).
  Rows linear(const Rows& x, const std::string& weight, int out, const std::string& bias = "") const {
    const double* w = tensor(weight);
    const double* b = bias.empty() || !c_.add_bias_linear ? nullptr : tensor(bias);
    const size_t in = x[0].size();
    Rows y(x.size(), std::vector<double>(static_cast<size_t>(out)));
    for (size_t t = 0; t < x.size(); ++t) {
      for (int o = 0; o < out; ++o) {
        double sum = b ? b[o] : 0.0;
        for (size_t i = 0; i < in; ++i) sum += x[t][i] * w[static_cast<size_t>(o) * in + i];
        y[t][static_cast<size_t>(o)] = sum;
      }
    }
    return y;
  }

  Rows norm(const Rows& x, const std::string& prefix) const {
    const double* w = tensor(prefix + ".weight");
    const bool layernorm = c_.normalization == Normalization::layernorm;
    const double* b = layernorm ? tensor(prefix + ".bias") : nullptr;
    Rows y = x;
    for (auto& row : y) {
      const double n = static_cast<double>(row.size());
      double mean = 0, square = 0;
      for (double v : row) mean += v / n;
      if (!layernorm) mean = 0;
      for (double v : row) square += (v - mean) * (v - mean) / n;
      const double inverse = 1.0 / std::sqrt(square + c_.norm_epsilon);
      for (size_t i = 0; i < row.size(); ++i) row[i] = (row[i] - mean) * inverse * w[i] + (b ? b[i] : 0.0);
    }
    return y;
  }

  // Rotate-half RoPE of every head of x (T, heads * D) at positions[row0 + t].
  void rope(Rows& x, int heads, const Data& data, int row0) const {
    const int D = c_.head_dim(), half = D / 2;
    for (size_t t = 0; t < x.size(); ++t) {
      const double position = data.positions[static_cast<size_t>(row0) + t];
      for (int h = 0; h < heads; ++h) {
        double* v = x[t].data() + static_cast<size_t>(h) * D;
        for (int i = 0; i < half; ++i) {
          const double angle = position * std::pow(static_cast<double>(c_.rotary_base), -2.0 * i / D);
          const double a = v[i], b = v[i + half];
          v[i] = a * std::cos(angle) - b * std::sin(angle);
          v[i + half] = b * std::cos(angle) + a * std::sin(angle);
        }
      }
    }
  }

  Rows attention(const Rows& h, const std::string& prefix, const Data& data, int row0) const {
    const int H = c_.num_attention_heads, G = c_.query_groups(), D = c_.head_dim();
    Rows q = linear(h, prefix + "linear_q.weight", H * D, prefix + "linear_q.bias");
    Rows k = linear(h, prefix + "linear_k.weight", G * D, prefix + "linear_k.bias");
    Rows v = linear(h, prefix + "linear_v.weight", G * D, prefix + "linear_v.bias");
    if (c_.position_embedding == PositionEmbedding::rope) {
      rope(q, H, data, row0);
      rope(k, G, data, row0);
    }
    const size_t T = h.size();
    Rows out(T, std::vector<double>(static_cast<size_t>(H) * D, 0.0));
    for (int head = 0; head < H; ++head) {
      const size_t qo = static_cast<size_t>(head) * D, ko = static_cast<size_t>(head / (H / G)) * D;
      for (size_t t = 0; t < T; ++t) {
        std::vector<double> scores(t + 1);
        double peak = -1e300, sum = 0;
        for (size_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += q[t][qo + d] * k[u][ko + d];
          scores[u] = dot / std::sqrt(static_cast<double>(D));
          peak = std::max(peak, scores[u]);
        }
        for (double& score : scores) sum += (score = std::exp(score - peak));
        for (size_t u = 0; u <= t; ++u) {
          for (int d = 0; d < D; ++d) out[t][qo + d] += scores[u] / sum * v[u][ko + d];
        }
      }
    }
    return linear(out, prefix + "linear_proj.weight", c_.hidden_size, prefix + "linear_proj.bias");
  }

  Rows mlp(const Rows& h, const std::string& prefix) const {
    const int F = static_cast<int>(layout_.find(prefix + "linear_fc2.weight").global_shape[1]);  // the layer's width
    Rows a;
    if (c_.swiglu) {
      a = linear(h, prefix + "linear_fc1_gate.weight", F);
      const Rows up = linear(h, prefix + "linear_fc1_up.weight", F);
      for (size_t t = 0; t < a.size(); ++t) {
        for (int f = 0; f < F; ++f) a[t][f] = a[t][f] / (1.0 + std::exp(-a[t][f])) * up[t][f];
      }
    } else {
      a = linear(h, prefix + "linear_fc1.weight", F, prefix + "linear_fc1.bias");
      for (auto& row : a) {
        for (double& x : row) x = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
      }
    }
    return linear(a, prefix + "linear_fc2.weight", c_.hidden_size, prefix + "linear_fc2.bias");
  }

  double sample_loss(const Data& data, int row0) const {
    const int T = c_.seq_length, C = c_.hidden_size;
    const double* embedding = tensor("embedding.word_embeddings.weight");
    Rows x(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(C)));
    for (int t = 0; t < T; ++t) {
      const size_t r = static_cast<size_t>(row0 + t);
      for (int i = 0; i < C; ++i) x[t][i] = embedding[static_cast<size_t>(data.tokens[r]) * C + i];
      if (c_.position_embedding == PositionEmbedding::learned_absolute) {
        const double* positions = tensor("embedding.position_embeddings.weight");
        for (int i = 0; i < C; ++i) x[t][i] += positions[static_cast<size_t>(data.positions[r]) * C + i];
      }
    }
    for (int layer = 0; layer < c_.num_layers; ++layer) {
      const std::string prefix = layer_prefix(layer);
      const Rows attended = attention(norm(x, prefix + "input_layernorm"), prefix + "self_attention.", data, row0);
      for (int t = 0; t < T; ++t) {
        for (int i = 0; i < C; ++i) x[t][i] += attended[t][i];
      }
      const Rows mixed = mlp(norm(x, prefix + "pre_mlp_layernorm"), prefix + "mlp.");
      for (int t = 0; t < T; ++t) {
        for (int i = 0; i < C; ++i) x[t][i] += mixed[t][i];
      }
    }
    x = norm(x, "decoder.final_layernorm");
    const Rows logits = linear(x, c_.untie_embeddings_and_output_weights ? "output_layer.weight"
                                                                          : "embedding.word_embeddings.weight",
                               static_cast<int>(c_.vocab_size));
    double loss = 0;
    for (int t = 0; t < T; ++t) {
      const size_t r = static_cast<size_t>(row0 + t);
      const auto& row = logits[static_cast<size_t>(t)];
      const double peak = *std::max_element(row.begin(), row.end());
      double sum = 0;
      for (double z : row) sum += std::exp(z - peak);
      loss += data.mask[r] * (peak + std::log(sum) - row[static_cast<size_t>(data.labels[r])]);
    }
    return loss;
  }

  const ModelConfig& c_;
  const ParamLayout& layout_;
  mutable const std::vector<double>* params_ = nullptr;
};

// mt's fp32 gradients (of the masked loss sum) of the model laid out by `layout` against central
// differences of the double reference, element by element over every tensor.
inline void check_gradients_against_double_reference(const ModelConfig& c, const ParamLayout& layout, int batch,
                                                     uint32_t data_seed = 3) {
  Data data = make_data(c, batch, data_seed);
  std::vector<float> params(static_cast<size_t>(layout.total_elements)), grads(params.size(), 0.0f);
  initialize_parameters(layout, 11, params.data());
  WholeModel model(c, layout, Precision::fp32, {}, batch, 5);
  model.bind(params.data(), grads.data());
  const MicroBatch mb = data.batch(batch, c.seq_length);
  const double mt_loss = model.forward_backward(mb, 1.0f, 1).loss;

  const DoubleReference reference(c, layout);
  std::vector<double> exact(params.begin(), params.end());
  const double reference_loss = reference.loss(exact, data, batch);
  EXPECT_NEAR(mt_loss, reference_loss, 1e-5 * std::fabs(reference_loss)) << "forward loss";
  for (const auto& entry : layout.entries) {
    int mismatches = 0;
    for (int64_t i = 0; i < entry.numel; ++i) {
      double& p = exact[static_cast<size_t>(entry.offset + i)];
      const double saved = p, h = 1e-6;
      p = saved + h;
      const double up = reference.loss(exact, data, batch);
      p = saved - h;
      const double down = reference.loss(exact, data, batch);
      p = saved;
      const double numeric = (up - down) / (2 * h);
      const double analytic = grads[static_cast<size_t>(entry.offset + i)];
      if (std::fabs(analytic - numeric) > kGradientAbsolute + kGradientRelative * std::fabs(numeric) &&
          ++mismatches <= 3) {
        ADD_FAILURE() << entry.name << "[" << i << "]: mt " << analytic << ", double reference " << numeric;
      }
    }
  }
}

}  // namespace mt::testing
