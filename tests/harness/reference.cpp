// Reference loops of the op harness (see reference.h).
#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "kernels/common/philox.h"

namespace mt::harness {

std::vector<float> random_floats(size_t n, uint32_t seed, float low, float high) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return values;
}

std::vector<double> to_double(const std::vector<float>& values) { return {values.begin(), values.end()}; }

double rms(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v * v;
  return values.empty() ? 0.0 : std::sqrt(sum / static_cast<double>(values.size()));
}

std::vector<double> numeric_gradient(const std::function<std::vector<double>(const std::vector<double>&)>& f,
                                     std::vector<double> at, const std::vector<double>& dy) {
  std::vector<double> gradient(at.size());
  for (size_t i = 0; i < at.size(); ++i) {
    const double saved = at[i];
    const double h = 1e-6 * std::max(1.0, std::abs(saved));
    at[i] = saved + h;
    const std::vector<double> plus = f(at);
    at[i] = saved - h;
    const std::vector<double> minus = f(at);
    at[i] = saved;
    double sum = 0;
    for (size_t j = 0; j < dy.size(); ++j) sum += dy[j] * (plus[j] - minus[j]);
    gradient[i] = sum / (2 * h);
  }
  return gradient;
}

std::vector<double> numeric_gradient_by_row(const std::function<std::vector<double>(const std::vector<double>&)>& f_row,
                                            const std::vector<double>& at, const std::vector<double>& dy, int64_t rows,
                                            int cols) {
  std::vector<double> gradient(at.size());
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<double> row(at.begin() + r * cols, at.begin() + (r + 1) * cols);
    const std::vector<double> row_dy(dy.begin() + r * cols, dy.begin() + (r + 1) * cols);
    const std::vector<double> row_gradient = numeric_gradient(f_row, row, row_dy);
    std::copy(row_gradient.begin(), row_gradient.end(), gradient.begin() + r * cols);
  }
  return gradient;
}

NormReference ref_layernorm(const std::vector<double>& x, const std::vector<double>& weight,
                            const std::vector<double>* bias, int64_t rows, int cols, double eps) {
  NormReference out{std::vector<double>(x.size()), std::vector<double>(rows), std::vector<double>(rows)};
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < cols; ++c) mean += x[r * cols + c];
    mean /= cols;
    for (int c = 0; c < cols; ++c) var += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
    var /= cols;
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < cols; ++c)
      out.y[r * cols + c] = (x[r * cols + c] - mean) * rstd * weight[c] + (bias ? (*bias)[c] : 0.0);
    out.mean[r] = mean;
    out.rstd[r] = rstd;
  }
  return out;
}

NormReference ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& weight, int64_t rows, int cols,
                          double eps) {
  NormReference out{std::vector<double>(x.size()), {}, std::vector<double>(rows)};
  for (int64_t r = 0; r < rows; ++r) {
    double squares = 0;
    for (int c = 0; c < cols; ++c) squares += x[r * cols + c] * x[r * cols + c];
    const double rstd = 1.0 / std::sqrt(squares / cols + eps);
    for (int c = 0; c < cols; ++c) out.y[r * cols + c] = x[r * cols + c] * rstd * weight[c];
    out.rstd[r] = rstd;
  }
  return out;
}

LayerNormGrads ref_layernorm_backward(const std::vector<float>& x, const std::vector<float>& weight,
                                      const std::vector<float>& dy, int64_t rows, int cols, double eps) {
  LayerNormGrads out{std::vector<double>(rows * cols), std::vector<double>(cols, 0.0), std::vector<double>(cols, 0.0),
                     std::vector<double>(rows * cols)};
  const NormReference fwd = ref_layernorm(to_double(x), to_double(weight), nullptr, rows, cols, eps);
  for (int64_t r = 0; r < rows; ++r) {
    double mean_g = 0, mean_g_xhat = 0;
    for (int c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - fwd.mean[r]) * fwd.rstd[r];
      const double g = static_cast<double>(dy[r * cols + c]) * weight[c];
      mean_g += g / cols;
      mean_g_xhat += g * xhat / cols;
      out.dweight[c] += dy[r * cols + c] * xhat;
      out.dbias[c] += dy[r * cols + c];
    }
    for (int c = 0; c < cols; ++c) {
      const double xhat = (x[r * cols + c] - fwd.mean[r]) * fwd.rstd[r];
      const double g = static_cast<double>(dy[r * cols + c]) * weight[c];
      out.dx[r * cols + c] = fwd.rstd[r] * (g - mean_g - xhat * mean_g_xhat);
      out.dx_terms[r * cols + c] = fwd.rstd[r] * g;
    }
  }
  return out;
}

double ref_gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double ref_gelu_derivative(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

std::vector<double> ref_gelu_all(const std::vector<double>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = ref_gelu(x[i]);
  return out;
}

std::vector<double> ref_gelu_erf_all(const std::vector<double>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
  return out;
}

double ref_silu(double x) { return x / (1.0 + std::exp(-x)); }

std::vector<double> ref_swiglu(const std::vector<double>& gate_up, int64_t rows, int ffn) {
  std::vector<double> y(rows * ffn);
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < ffn; ++c) y[r * ffn + c] = ref_silu(gate_up[r * 2 * ffn + c]) * gate_up[r * 2 * ffn + ffn + c];
  return y;
}

std::vector<double> ref_swiglu_backward(const std::vector<float>& dy, const std::vector<float>& gate_up, int64_t rows,
                                        int ffn) {
  std::vector<double> d(rows * 2 * ffn);
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < ffn; ++c) {
      const double g = gate_up[r * 2 * ffn + c], u = gate_up[r * 2 * ffn + ffn + c];
      const double s = 1.0 / (1.0 + std::exp(-g));
      d[r * 2 * ffn + c] = dy[r * ffn + c] * u * (s + g * s * (1 - s));
      d[r * 2 * ffn + ffn + c] = dy[r * ffn + c] * g * s;
    }
  return d;
}

std::vector<double> ref_rope(const std::vector<double>& x, int64_t rows, int64_t row_stride, int heads, int head_dim,
                             const std::vector<int32_t>& positions, float base, bool transpose) {
  std::vector<double> out = x;
  const int half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const float inv_freq = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(head_dim));
        const float angle = static_cast<float>(positions[r]) * inv_freq;
        const double c = std::cos(static_cast<double>(angle)), s = std::sin(static_cast<double>(angle));
        const int64_t at = r * row_stride + static_cast<int64_t>(h) * head_dim + i;
        const double x1 = x[at], x2 = x[at + half];
        out[at] = transpose ? x1 * c + x2 * s : x1 * c - x2 * s;
        out[at + half] = transpose ? x2 * c - x1 * s : x2 * c + x1 * s;
      }
  return out;
}

std::vector<double> ref_rope_yarn(const std::vector<double>& x, int64_t rows, int64_t row_stride, int heads,
                                  int head_dim, const std::vector<int32_t>& positions,
                                  const std::vector<float>& inv_freq, double concentration, bool transpose) {
  std::vector<double> out = x;
  const int half = head_dim / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const float angle = static_cast<float>(positions[r]) * inv_freq[i];
        const double c = concentration * std::cos(static_cast<double>(angle));
        const double s = concentration * std::sin(static_cast<double>(angle));
        const int64_t at = r * row_stride + static_cast<int64_t>(h) * head_dim + i;
        const double x1 = x[at], x2 = x[at + half];
        out[at] = transpose ? x1 * c + x2 * s : x1 * c - x2 * s;
        out[at + half] = transpose ? x2 * c - x1 * s : x2 * c + x1 * s;
      }
  return out;
}

XentReference ref_xent(const std::vector<double>& logits, int64_t rows, int64_t ld, int64_t valid_cols,
                       int64_t vocab_start, const std::vector<int32_t>& targets, const std::vector<double>& dloss) {
  XentReference out{std::vector<double>(rows), std::vector<double>(rows), std::vector<double>(rows),
                    std::vector<double>(rows), std::vector<double>(rows * ld, 0.0)};
  for (int64_t r = 0; r < rows; ++r) {
    double best = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < valid_cols; ++c) best = std::max(best, logits[r * ld + c]);
    double sum = 0;
    for (int64_t c = 0; c < valid_cols; ++c) sum += std::exp(logits[r * ld + c] - best);
    const int64_t column = targets[r] - vocab_start;
    const bool here = column >= 0 && column < valid_cols;
    out.max[r] = best;
    out.sumexp[r] = sum;
    out.target_logit[r] = here ? logits[r * ld + column] : 0.0;
    out.loss[r] = std::log(sum) + best - out.target_logit[r];
    for (int64_t c = 0; c < valid_cols; ++c)
      out.grad[r * ld + c] = dloss[r] * (std::exp(logits[r * ld + c] - best) / sum - (c == column ? 1.0 : 0.0));
  }
  return out;
}

AttentionReference ref_attention(const AttentionLayout& layout, const std::vector<double>& inputs,
                                 const std::vector<float>& dout, const std::vector<int32_t>& doc_start,
                                 const std::vector<int64_t>& row_ids, const std::vector<int32_t>& key_lengths) {
  const AttentionShape& s = layout.shape;
  const int dim = s.head_dim, group = s.q_heads / s.kv_heads;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  AttentionReference r;
  r.out.assign(size_t(s.batch) * s.q_len * s.q_heads * dim, 0.0);
  r.dq.assign(r.out.size(), 0.0);
  r.lse.assign(size_t(s.batch) * s.q_heads * s.q_len, -kInf);
  r.dk.assign(size_t(s.batch) * s.kv_len * s.kv_heads * dim, 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  auto q_at = [&](int b, int t, int h, int d) {
    return inputs[layout.q_offset + (size_t(b) * s.q_len + t) * s.q_stride + size_t(h) * dim + d];
  };
  auto k_at = [&](int b, int j, int g, int d) {
    return inputs[layout.k_offset + (size_t(b) * s.kv_len + j) * s.k_stride + size_t(g) * dim + d];
  };
  auto v_at = [&](int b, int j, int g, int d) {
    return inputs[layout.v_offset + (size_t(b) * s.kv_len + j) * s.v_stride + size_t(g) * dim + d];
  };
  auto dout_at = [&](int b, int t, int h, int d) {
    return double(dout[(size_t(b) * s.q_len + t) * s.o_stride + size_t(h) * dim + d]);
  };
  std::vector<int> visible;
  std::vector<double> probs, dprobs, keep;  // keep: the dropout factor keep / (1 - p) or 0
  const kernels::DropoutKey& drop = s.dropout.key;
  auto keep_factor = [&](int b, int t, int h, int j) {  // keyed by global (token, head, key position)
    if (drop.p <= 0.0f) return 1.0;
    const int64_t row = row_ids.at(size_t(b) * s.q_len + t) * s.dropout.q_heads_total + s.dropout.q_head0 + h;
    const float u = kernels::keyed_uniform(drop.seed, drop.stream, drop.iteration, row, s.kv_pos0 + j);
    return u >= drop.p ? 1.0 / (1.0 - double(drop.p)) : 0.0;
  };
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.q_heads; ++h) {
      const int g = h / group;
      for (int t = 0; t < s.q_len; ++t) {
        const int64_t q_pos = s.q_pos0 + t;
        const int64_t doc = doc_start.empty() ? INT64_MIN : doc_start[size_t(b) * s.q_len + t];
        visible.clear();
        for (int j = 0; j < s.kv_len; ++j) {
          const int64_t k_pos = s.kv_pos0 + j;
          const bool seen = s.causal ? k_pos <= q_pos && k_pos >= doc
                                     : key_lengths.empty() || k_pos < key_lengths[size_t(b)];
          if (seen) visible.push_back(j);
        }
        if (visible.empty()) continue;
        probs.assign(visible.size(), 0.0);
        double max_score = -kInf;
        for (size_t n = 0; n < visible.size(); ++n) {
          double dot = 0;
          for (int d = 0; d < dim; ++d) dot += q_at(b, t, h, d) * k_at(b, visible[n], g, d);
          probs[n] = s.scale * dot;
          max_score = std::max(max_score, probs[n]);
        }
        double sum = 0;
        for (double& x : probs) sum += (x = std::exp(x - max_score));
        for (double& x : probs) x /= sum;
        keep.assign(visible.size(), 1.0);
        for (size_t n = 0; n < visible.size(); ++n) keep[n] = keep_factor(b, t, h, visible[n]);
        const size_t row = (size_t(b) * s.q_len + t) * s.q_heads + h;
        r.lse[(size_t(b) * s.q_heads + h) * s.q_len + t] = max_score + std::log(sum);
        for (size_t n = 0; n < visible.size(); ++n) {
          for (int d = 0; d < dim; ++d) r.out[row * dim + d] += probs[n] * keep[n] * v_at(b, visible[n], g, d);
        }
        dprobs.assign(visible.size(), 0.0);
        double delta = 0;
        for (size_t n = 0; n < visible.size(); ++n) {
          for (int d = 0; d < dim; ++d) dprobs[n] += dout_at(b, t, h, d) * v_at(b, visible[n], g, d);
          dprobs[n] *= keep[n];
          delta += probs[n] * dprobs[n];
        }
        for (size_t n = 0; n < visible.size(); ++n) {
          const double dscore = probs[n] * (dprobs[n] - delta);
          const size_t kv_row = (size_t(b) * s.kv_len + visible[n]) * s.kv_heads + g;
          for (int d = 0; d < dim; ++d) {
            r.dq[row * dim + d] += s.scale * dscore * k_at(b, visible[n], g, d);
            r.dk[kv_row * dim + d] += s.scale * dscore * q_at(b, t, h, d);
            r.dv[kv_row * dim + d] += probs[n] * keep[n] * dout_at(b, t, h, d);
          }
        }
      }
    }
  }
  return r;
}

std::vector<double> ref_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                             const std::vector<float>& a, int64_t lda, const std::vector<float>& b, int64_t ldb,
                             double beta, const std::vector<float>& c0, int64_t ldc) {
  std::vector<double> out(c0.begin(), c0.end());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double x = trans_a ? a[p * lda + i] : a[i * lda + p];
        const double y = trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += x * y;
      }
      out[i * ldc + j] = alpha * sum + beta * c0[i * ldc + j];
    }
  return out;
}

void ref_adamw_step(std::vector<double>& param, std::vector<double>& exp_avg, std::vector<double>& exp_avg_sq,
                    const std::vector<float>& grad, const kernels::AdamWParams& params) {
  for (size_t i = 0; i < param.size(); ++i) {
    const double g = static_cast<double>(grad[i]) * params.grad_scale;
    param[i] *= 1.0 - static_cast<double>(params.lr) * params.weight_decay;
    exp_avg[i] = params.beta1 * exp_avg[i] + (1.0 - params.beta1) * g;
    exp_avg_sq[i] = params.beta2 * exp_avg_sq[i] + (1.0 - params.beta2) * g * g;
    const double denom =
        std::sqrt(exp_avg_sq[i]) / std::sqrt(static_cast<double>(params.bias_correction2)) + params.eps;
    param[i] -= static_cast<double>(params.lr) / params.bias_correction1 * exp_avg[i] / denom;
  }
}

}  // namespace mt::harness
