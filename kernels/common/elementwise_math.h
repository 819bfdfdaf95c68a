// Per-element arithmetic of the CUDA activation, RoPE, dropout and AdamW kernels
// (kernels/cuda/elementwise.cu), written as MT_HOST_DEVICE functions so the host can check it,
// bit for bit, against the CPU kernels it copies (kernels/cpu/impl/elementwise.inc): the Cephes
// expf, sigmoid, GELU (tanh form through sigmoid), SwiGLU (gate first, up second), the RoPE half
// rotation with PyTorch's inv_freq (and YaRN's scaled cos/sin), the keyed dropout block and the
// AdamW step, each in the CPU's order of operations. The CPU kernels keep their own vectorisable
// copies; this header is the contract the CUDA twins are held to. Tested in
// tests/unit/kernels/test_cuda_math.cpp.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/common/host_device.h"
#include "kernels/common/op_params.h"
#include "kernels/common/philox.h"

namespace mt::kernels {

// exp(x) in fp32 to ~1 ulp, the CPU's vexp: exp(x) = 2^n exp(r), n = round(x / ln 2). Inputs below
// ln(FLT_MIN) give 0 (-inf gives 0), inputs above ln(FLT_MAX) overflow to +inf, NaN stays NaN.
MT_HOST_DEVICE float cephes_exp(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f;
  const float kLn2Lo = -2.12194440e-4f;
  const float kMinInput = -87.3365447505f;
  const float kMaxInput = 88.9f;
  const float kRoundShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const uint32_t below = 0u - static_cast<uint32_t>(x < kMinInput);
  const uint32_t above = 0u - static_cast<uint32_t>(x > kMaxInput);
  const float clamped = bits_float((float_bits(x) & ~(below | above)) | (float_bits(kMinInput) & below) |
                                   (float_bits(kMaxInput) & above));
  const float shifted = clamped * kLog2e + kRoundShift;
  const float n = shifted - kRoundShift;
  const int32_t n_int = static_cast<int32_t>(float_bits(shifted)) - static_cast<int32_t>(float_bits(kRoundShift));
  float r = clamped - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float exp_r = poly * (r * r) + r + 1.0f;
  const int32_t n_low = n_int >> 1;
  const int32_t n_high = n_int - n_low;
  const float scale_low = bits_float(static_cast<uint32_t>(n_low + 127) << 23);
  const float scale_high = bits_float(static_cast<uint32_t>(n_high + 127) << 23);
  const float result = exp_r * scale_low * scale_high;
  return bits_float(float_bits(result) & ~below);
}

MT_HOST_DEVICE float sigmoid(float x) { return 1.0f / (1.0f + cephes_exp(-x)); }

// GELU, tanh form: x * 0.5 (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

MT_HOST_DEVICE float gelu_value(float v) {
  const float inner = kGeluSqrt2OverPi * (v + kGeluCubic * v * v * v);
  return v * sigmoid(2.0f * inner);
}

// dy * d/dx gelu(x), with 0.5 (1 - tanh^2(u)) = 2 s (1 - s), s = sigmoid(2u).
MT_HOST_DEVICE float gelu_gradient(float dy, float v) {
  const float inner = kGeluSqrt2OverPi * (v + kGeluCubic * v * v * v);
  const float d_inner = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
  const float s = sigmoid(2.0f * inner);
  return dy * (s + 2.0f * v * s * (1.0f - s) * d_inner);
}

// SwiGLU on one (gate, up) pair: silu(gate) * up.
MT_HOST_DEVICE float swiglu_value(float gate, float up) { return gate * sigmoid(gate) * up; }

MT_HOST_DEVICE void swiglu_gradient(float dy, float gate, float up, float& d_gate, float& d_up) {
  const float s = sigmoid(gate);
  const float silu = gate * s;
  d_gate = dy * up * (s + silu * (1.0f - s));
  d_up = dy * silu;
}

// RoPE: inverse frequency i of a head (half = head_dim/2 of them), exactly as PyTorch and the CPU:
// 1 / base^(2i/D) in fp32. Host only (the CUDA entry computes them on the host and passes them by
// value, so both backends rotate by the same angles float(position) * inv_freq[i]).
inline float rope_inv_freq(float base, int i, int head_dim) {
  return 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(head_dim));
}

// cos and sin of the angle float(position) * inv_freq (the device's sincosf, the host's std::cos
// and std::sin: each within an ulp or two, so only these may differ between the backends).
MT_HOST_DEVICE void rope_cos_sin(int64_t position, float inv_freq, float& cos_value, float& sin_value) {
  const float angle = static_cast<float>(position) * inv_freq;
#if defined(__CUDA_ARCH__)
  sincosf(angle, &sin_value, &cos_value);
#else
  cos_value = std::cos(angle);
  sin_value = std::sin(angle);
#endif
}

// YaRN's cos and sin (kernels/common/yarn_rope.h): those of the angle float(position) * inv_freq
// at YaRN's inv_freq, each then multiplied by the concentration factor, as the CPU's rope_yarn
// entries multiply their cos/sin (Megatron multiplies its cos/sin tables). Concentration 1 gives
// RoPE's values exactly (x * 1.0f is x).
MT_HOST_DEVICE void rope_cos_sin_scaled(int64_t position, float inv_freq, float concentration, float& cos_value,
                                        float& sin_value) {
  rope_cos_sin(position, inv_freq, cos_value, sin_value);
  cos_value *= concentration;
  sin_value *= concentration;
}

// Rotates the pair (first[i], second[i]) = (x1, x2) of a head in half-rotation (GPT-NeoX) layout;
// transpose = true is the inverse rotation (the gradient).
MT_HOST_DEVICE void rope_rotate(float& x1, float& x2, float cos_value, float sin_value, bool transpose) {
  const float a = x1, b = x2;
  if (!transpose) {
    x1 = a * cos_value - b * sin_value;
    x2 = b * cos_value + a * sin_value;
  } else {
    x1 = a * cos_value + b * sin_value;
    x2 = b * cos_value - a * sin_value;
  }
}

// Dropout: the four uniforms of Philox block `block` (global columns 4*block .. 4*block+3) of
// global row `row`, the values keyed_uniform(seed, stream, iteration, row, col) gives column by
// column (philox.h), from one Philox call.
struct DropoutBlock {
  float uniform[4];
};

MT_HOST_DEVICE DropoutBlock dropout_block(const DropoutKey& key, int64_t row, int64_t block) {
  const uint64_t mixed = key.seed ^ key.stream;
  const uint64_t urow = static_cast<uint64_t>(row);
  const Philox4x32Counter bits = philox4x32_10(
      Philox4x32Counter{{static_cast<uint32_t>(static_cast<uint64_t>(block)), static_cast<uint32_t>(urow),
                         static_cast<uint32_t>(urow >> 32), static_cast<uint32_t>(key.iteration)}},
      Philox4x32Key{{static_cast<uint32_t>(mixed), static_cast<uint32_t>(mixed >> 32)}});
  return DropoutBlock{{uint_to_unit_float(bits.v[0]), uint_to_unit_float(bits.v[1]), uint_to_unit_float(bits.v[2]),
                       uint_to_unit_float(bits.v[3])}};
}

// x * keep / (1 - p) with keep = (u >= p), for 0 < p < 1 (p >= 1 zeroes, p <= 0 leaves x).
MT_HOST_DEVICE float dropout_value(float x, float uniform, float p, float keep_scale) {
  return x * (uniform >= p ? keep_scale : 0.0f);
}

// Philox blocks a row of `cols` local columns starting at global column col0 meets: the first is
// col0 / 4, and this many follow from it.
MT_HOST_DEVICE int64_t dropout_blocks_per_row(int64_t col0, int cols) {
  return ((col0 + cols - 1) >> 2) - (col0 >> 2) + 1;
}

// Drops, in one row (cols local columns, global column col0 first) of global row id `row_id`, the
// columns Philox block `block` covers: global columns [4 block, 4 block + 4) within the row.
// keep_scale = 1 / (1 - key.p), 0 < key.p < 1.
MT_HOST_DEVICE void dropout_row_block(float* row, int cols, int64_t col0, int64_t row_id, int64_t block,
                                      const DropoutKey& key, float keep_scale) {
  const DropoutBlock uniforms = dropout_block(key, row_id, block);
  const int64_t begin = col0 > 4 * block ? col0 : 4 * block;  // global columns [begin, end)
  const int64_t end = col0 + cols < 4 * block + 4 ? col0 + cols : 4 * block + 4;
  for (int64_t col = begin; col < end; ++col)
    row[col - col0] = dropout_value(row[col - col0], uniforms.uniform[col & 3], key.p, keep_scale);
}

// The scalars of one AdamW step, computed once on the host as the CPU kernel does.
struct AdamWConstants {
  float decay;  // 1 - lr * weight_decay
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  float step_size;  // lr / bias_correction1
  float sqrt_bc2;   // sqrt(bias_correction2)
  float eps;
  float grad_scale;
};

inline AdamWConstants adamw_constants(const AdamWParams& params) {
  return AdamWConstants{1.0f - params.lr * params.weight_decay,
                        params.beta1,
                        params.beta2,
                        1.0f - params.beta1,
                        1.0f - params.beta2,
                        params.lr / params.bias_correction1,
                        std::sqrt(params.bias_correction2),
                        params.eps,
                        params.grad_scale};
}

// One element of PyTorch's AdamW: decoupled decay, then the Adam step with bias corrections.
MT_HOST_DEVICE void adamw_element(const AdamWConstants& k, float& param, float grad, float& exp_avg,
                                  float& exp_avg_sq) {
  const float scaled_grad = grad * k.grad_scale;
  exp_avg = k.beta1 * exp_avg + k.one_minus_beta1 * scaled_grad;
  exp_avg_sq = k.beta2 * exp_avg_sq + k.one_minus_beta2 * scaled_grad * scaled_grad;
#if defined(__CUDA_ARCH__)
  const float denom = sqrtf(exp_avg_sq);  // IEEE-rounded unless built with fast math
#else
  const float denom = std::sqrt(exp_avg_sq);
#endif
  param = param * k.decay - k.step_size * (exp_avg / (denom / k.sqrt_bc2 + k.eps));
}

}  // namespace mt::kernels
