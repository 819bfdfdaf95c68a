// FP8 (OCP e4m3 and e5m2) conversions and Transformer Engine's delayed-scaling update, shared by
// the CPU backend (kernels/cpu/fp8.cpp, which emulates FP8 training on the CPU) and the CUDA
// backend's kernels (header-only, host and device, like half.h). Tested in
// tests/unit/kernels/test_fp8.cpp.
//
// Facts this file relies on (read 2026-11-27):
// - Conversion: equal bit for bit to CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3 or
//   __NV_E5M2) (cuda_fp8.hpp; PTX cvt.rn.satfinite.{e4m3,e5m2}x2.f32 on sm_89+): round to nearest
//   even; a magnitude that rounds above the largest finite value (infinity included) becomes
//   +-max finite (e4m3 448 = 0x7e, e5m2 57344 = 0x7b); any NaN becomes the canonical 0x7f (sign
//   dropped); a magnitude up to half the least subnormal (e4m3 2^-10, e5m2 2^-17) becomes a zero
//   of x's sign. e4m3 has no infinity (0x7f/0xff are NaN); e5m2 is IEEE-like (0x7c inf).
// - Delayed scaling (TransformerEngine transformer_engine/common/recipe/delayed_scaling.cu,
//   kernel amax_and_scale_update; recipe DelayedScaling in transformer_engine/common/recipe):
//   the history holds the last `amax_history_len` amaxes of a tensor, this step's included;
//   amax_used = most recent (MOST_RECENT) or the max over the history (MAX; fmaxf, so a NaN
//   entry is skipped); scale = (fp8_max * 2^-margin) / amax_used when amax_used is finite and
//   > 0, else the previous scale is kept; an infinite scale becomes FLT_MAX (newer TE);
//   scale_inv = 1 / scale. Initial state: history zeros, scale 1.
// - Megatron-LM megatron/training/arguments.py (_add_transformer_engine_args): --fp8-format
//   {e4m3, hybrid} (default none: no FP8), --fp8-recipe delayed (also tensorwise, mxfp8,
//   blockwise), --fp8-margin 0, --fp8-amax-history-len 1, --fp8-amax-compute-algo most_recent
//   (or max), --no-fp8-wgrad, --fp8-param-gather, --first-last-layers-bf16.
// - Formats (TE recipe Format): E4M3 = every FP8 tensor e4m3; HYBRID = e4m3 in the forward pass
//   (activations, weights), e5m2 for the gradients of the backward pass.
#pragma once

#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/common/host_device.h"

namespace mt::kernels {

enum class Fp8Type : uint8_t { e4m3, e5m2 };

// The largest finite value: e4m3 448, e5m2 57344.
MT_HOST_DEVICE float fp8_max(Fp8Type type) { return type == Fp8Type::e4m3 ? 448.0f : 57344.0f; }

// fp32 -> fp8 bits, round to nearest even, saturating to +-max finite, NaN -> 0x7f (see above).
MT_HOST_DEVICE uint8_t fp32_to_fp8(float x, Fp8Type type) {
  const uint32_t bits = float_bits(x);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0x7fu;  // NaN: canonical, sign dropped
  const bool e4m3 = type == Fp8Type::e4m3;
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const int mantissa_bits = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const int max_biased_exponent = e4m3 ? 15 : 30;  // e5m2's 31 is inf/NaN
  const uint32_t max_code = e4m3 ? 0x7eu : 0x7bu;
  if (magnitude < 0x00800000u) return sign;  // fp32 zero or subnormal: far below fp8's least subnormal
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  const uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;  // 24 bits, leading 1 explicit
  if (exponent + bias > max_biased_exponent) return static_cast<uint8_t>(sign | max_code);  // incl. inf
  uint32_t code;
  int shift;  // significand bits dropped
  if (exponent + bias >= 1) {  // normal: keep mantissa_bits below the leading 1
    shift = 23 - mantissa_bits;
    code = (static_cast<uint32_t>(exponent + bias) << mantissa_bits) | ((significand >> shift) & ((1u << mantissa_bits) - 1u));
  } else {  // subnormal: units of 2^(1 - bias - mantissa_bits)
    shift = 23 - mantissa_bits + (1 - bias - exponent);
    if (shift >= 25) return sign;  // below half the least subnormal (significand < 2^24 <= halfway)
    code = significand >> shift;
  }
  const uint32_t remainder = significand & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (remainder > halfway || (remainder == halfway && (code & 1u))) ++code;  // may carry into the exponent
  if (code > max_code) code = max_code;  // rounded past the largest finite value: saturate
  return static_cast<uint8_t>(sign | code);
}

// fp8 bits -> fp32 (exact). e4m3 0x7f/0xff and e5m2 NaN codes give a NaN; e5m2 0x7c/0xfc give +-inf.
MT_HOST_DEVICE float fp8_to_fp32(uint8_t code, Fp8Type type) {
  const bool e4m3 = type == Fp8Type::e4m3;
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const int mantissa_bits = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const uint32_t exponent = (code & 0x7fu) >> mantissa_bits;
  const uint32_t mantissa = code & ((1u << mantissa_bits) - 1u);
  if (e4m3 && (code & 0x7fu) == 0x7fu) return bits_float(0x7fffffffu);
  if (!e4m3 && exponent == 31u) return bits_float(sign | 0x7f800000u | (mantissa << 21));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^(1 - bias - mantissa_bits), exact
    const float unit = e4m3 ? 0.001953125f : 1.52587890625e-05f;  // 2^-9, 2^-16
    return bits_float(sign | float_bits(static_cast<float>(mantissa) * unit));
  }
  return bits_float(sign | ((exponent - static_cast<uint32_t>(bias) + 127u) << 23) | (mantissa << (23 - mantissa_bits)));
}

// Which amax of the history a scale is computed from (TE's amax_compute_algo).
enum class Fp8AmaxAlgo : uint8_t { most_recent, max };

// The delayed-scaling recipe of one group of tensors of one FP8 type (TE DelayedScaling; the
// forward tensors and the gradients of a hybrid run are two groups).
struct Fp8ScalingParams {
  Fp8Type type = Fp8Type::e4m3;  // gives fp8_max
  int margin = 0;                // scale = fp8_max * 2^-margin / amax (Megatron --fp8-margin, int)
  int64_t history_len = 1;       // >= 1 (Megatron --fp8-amax-history-len)
  Fp8AmaxAlgo algo = Fp8AmaxAlgo::most_recent;
};

// fp8_max(type) * 2^-margin, exact (margin >= 0; halving a normal float is exact until subnormal).
MT_HOST_DEVICE float fp8_scaled_max(const Fp8ScalingParams& params) {
  float scaled = fp8_max(params.type);
  for (int i = 0; i < params.margin; ++i) scaled *= 0.5f;
  return scaled;
}

// One tensor's delayed-scaling update, the arithmetic both backends' fp8_update_scales run:
// `history` (history_len floats, newest first) shifts one place older, dropping its oldest entry,
// and takes `*amax` (this step's amax, already reduced over micro-batches and ranks) as its newest;
// then the amax used (history[0], or the max over history skipping NaNs) gives
//   *scale = scaled_max / amax_used if amax_used is finite and > 0 (else *scale is kept),
//   an infinite *scale becomes FLT_MAX, *scale_inv = 1 / *scale, and *amax = 0 for the next step.
MT_HOST_DEVICE void fp8_update_scale(float* amax, float* history, float* scale, float* scale_inv,
                                     const Fp8ScalingParams& params) {
  for (int64_t i = params.history_len - 1; i > 0; --i) history[i] = history[i - 1];
  history[0] = *amax;
  float amax_used = history[0];
  if (params.algo == Fp8AmaxAlgo::max) {
    amax_used = 0.0f;
    for (int64_t i = 0; i < params.history_len; ++i) {
      if (history[i] > amax_used) amax_used = history[i];  // fmaxf: a NaN entry is skipped
    }
  }
  const bool usable = amax_used > 0.0f && amax_used <= 3.40282347e+38f;  // finite and > 0 (false for NaN)
  float new_scale = usable ? fp8_scaled_max(params) / amax_used : *scale;
  if (new_scale > 3.40282347e+38f) new_scale = 3.40282347e+38f;  // infinite: FLT_MAX
  *scale = new_scale;
  *scale_inv = 1.0f / new_scale;
  *amax = 0.0f;
}

}  // namespace mt::kernels
