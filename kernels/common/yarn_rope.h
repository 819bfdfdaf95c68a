// YaRN rotary embeddings (Megatron-Core 0.16.1's YarnRotaryEmbedding,
// megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py): the parameters the
// rope_yarn_* entries take by value, and the host arithmetic of their frequencies and factors, in
// Megatron's order of operations and precisions (Python doubles for the correction range and the
// mscale factors; fp32 tensors for the frequencies, as torch computes them):
//   inv_extra_j = 1 / base^(2j/D), inv_inter_j = 1 / (factor * base^(2j/D))      j < D/2, fp32
//   corr(r)     = D ln(L_orig / (2 pi r)) / (2 ln base)                           double
//   low         = max(floor(corr(beta_fast)), 0), high = min(ceil(corr(beta_slow)), D - 1)
//   ramp_j      = clamp((j - low) / (high - low), 0, 1)   (high += 0.001 when equal), fp32
//   mask_j      = 1 - ramp_j
//   inv_j       = inv_inter_j (1 - mask_j) + inv_extra_j mask_j                   fp32
// so dimensions below `low` (high frequencies) keep RoPE's frequency and those above `high` are
// interpolated by 1/factor. cos and sin of float(position) * inv_j are multiplied by the
// concentration factor mscale(factor, mscale) / mscale(factor, mscale_all_dim), with
// mscale(f, m) = 0.1 m ln f + 1 for f > 1, else 1. Multi-latent attention's softmax scale is
// mscale(factor, mscale_all_dim)^2 / sqrt(d_n + d_r) (multi_latent_attention.py L125-126).
// Host only. Tested in tests/unit/model/test_yarn.cpp (against Megatron-Core's tables,
// tests/golden/yarn).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace mt::kernels {

// The YaRN settings of one rotary embedding (Megatron's MLATransformerConfig fields).
struct YarnRope {
  double base = 10000.0;                         // --rotary-base
  double scaling_factor = 1.0;                   // --rotary-scaling-factor
  int64_t original_max_position_embeddings = 4096;  // original_max_position_embeddings
  double beta_fast = 32.0;                       // beta_fast
  double beta_slow = 1.0;                        // beta_slow
  float concentration = 1.0f;                    // yarn_concentration(...): the cos/sin multiplier
};

// Megatron's _yarn_get_mscale(scale, mscale).
inline double yarn_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// Megatron's _yarn_get_concentration_factor(scaling_factor, mscale, mscale_all_dim), as the
// float32 the cos/sin tensors are multiplied by.
inline float yarn_concentration(double scaling_factor, double mscale, double mscale_all_dim) {
  return static_cast<float>(yarn_mscale(scaling_factor, mscale) / yarn_mscale(scaling_factor, mscale_all_dim));
}

// Megatron's _yarn_find_correction_dim: the dimension whose wavelength makes `rotations` turns
// over the original context.
inline double yarn_correction_dim(double rotations, int dim, double base, int64_t max_positions) {
  const double pi = 3.141592653589793;
  return (dim * std::log(static_cast<double>(max_positions) / (rotations * 2 * pi))) / (2 * std::log(base));
}

// Megatron's _yarn_find_correction_range (round_to_int = True): [low, high] clamped to [0, D-1].
// Always rounded: Megatron-Core 0.16.1's MLA builds its YarnRotaryEmbedding without
// correction_range_round_to_int (multi_latent_attention.py L138-149); the unrounded range
// (--no-yarn-correction-range-round-to-int) reaches only GPTModel's position_embedding_type 'yarn'
// on common attention, which mt does not run (README, Multi-latent attention).
inline void yarn_correction_range(const YarnRope& yarn, int dim, int64_t& low, int64_t& high) {
  low = static_cast<int64_t>(
      std::floor(yarn_correction_dim(yarn.beta_fast, dim, yarn.base, yarn.original_max_position_embeddings)));
  high = static_cast<int64_t>(
      std::ceil(yarn_correction_dim(yarn.beta_slow, dim, yarn.base, yarn.original_max_position_embeddings)));
  low = std::max<int64_t>(low, 0);
  high = std::min<int64_t>(high, dim - 1);
}

// inv_freq (head_dim / 2 floats) of YaRN for a rotary head of head_dim dims.
inline void yarn_inv_freq(const YarnRope& yarn, int head_dim, float* inv_freq) {
  int64_t low = 0, high = 0;
  yarn_correction_range(yarn, head_dim, low, high);
  const double span = high == low ? static_cast<double>(high) + 0.001 - static_cast<double>(low)
                                  : static_cast<double>(high - low);
  const float span_f = static_cast<float>(span);
  const float base = static_cast<float>(yarn.base);
  const float factor = static_cast<float>(yarn.scaling_factor);
  for (int j = 0; j < head_dim / 2; ++j) {
    const float power = std::pow(base, static_cast<float>(2 * j) / static_cast<float>(head_dim));
    const float extra = 1.0f / power;
    const float inter = 1.0f / (factor * power);
    const float ramp = std::clamp((static_cast<float>(j) - static_cast<float>(low)) / span_f, 0.0f, 1.0f);
    const float mask = 1.0f - ramp;
    // Two rounded products, then the sum (torch's separate ops; no fused multiply-add).
    volatile float interpolated = inter * (1.0f - mask);
    volatile float extrapolated = extra * mask;
    inv_freq[j] = interpolated + extrapolated;
  }
}

}  // namespace mt::kernels
