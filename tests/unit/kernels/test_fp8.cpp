// FP8 conversions and the delayed-scaling update of kernels/common/fp8.h: every code round-trips,
// ties go to even, saturation, NaN, -0 and subnormals, and a sweep of fp32 values against an
// independent nearest-value search over the decoded codes; TE's scale update rule case by case.
// (The conversion was also compared with CUDA's host __nv_cvt_float_to_fp8 on all 2^32 fp32
// values, both types, when written: no difference.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/common/fp8.h"

using namespace mt::kernels;

namespace {

const Fp8Type kTypes[] = {Fp8Type::e4m3, Fp8Type::e5m2};

const char* type_name(Fp8Type type) { return type == Fp8Type::e4m3 ? "e4m3" : "e5m2"; }

bool is_nan_code(uint8_t code, Fp8Type type) {
  if (type == Fp8Type::e4m3) return (code & 0x7f) == 0x7f;
  return (code & 0x7f) > 0x7c;
}

// The non-negative finite codes in increasing order of value (0x00 .. max code).
std::vector<uint8_t> positive_finite_codes(Fp8Type type) {
  std::vector<uint8_t> codes;
  const int max_code = type == Fp8Type::e4m3 ? 0x7e : 0x7b;
  for (int c = 0; c <= max_code; ++c) codes.push_back(static_cast<uint8_t>(c));
  return codes;
}

// Independent reference: the nearest finite fp8 value to x (ties to the even code), saturating,
// computed by searching the decoded codes in double.
uint8_t reference_encode(float x, Fp8Type type) {
  if (std::isnan(x)) return 0x7f;
  const std::vector<uint8_t> codes = positive_finite_codes(type);
  const double magnitude = std::fabs(static_cast<double>(x));
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  uint8_t best = codes.back();
  for (size_t i = 0; i + 1 < codes.size(); ++i) {
    const double low = fp8_to_fp32(codes[i], type), high = fp8_to_fp32(codes[i + 1], type);
    if (magnitude > high) continue;
    const double middle = (low + high) / 2;
    if (magnitude < middle) best = codes[i];
    else if (magnitude > middle) best = codes[i + 1];
    else best = (codes[i] & 1) ? codes[i + 1] : codes[i];
    break;
  }
  return static_cast<uint8_t>(sign | best);
}

}  // namespace

TEST(Fp8, EveryCodeDecodesAndReencodesToItself) {
  for (Fp8Type type : kTypes) {
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<uint8_t>(c);
      const float value = fp8_to_fp32(code, type);
      if (is_nan_code(code, type)) {
        EXPECT_TRUE(std::isnan(value)) << type_name(type) << " code " << c;
        EXPECT_EQ(fp32_to_fp8(value, type), 0x7f) << type_name(type) << " code " << c;
      } else if (std::isinf(value)) {  // e5m2 0x7c / 0xfc: saturates back to the largest finite
        EXPECT_EQ(type, Fp8Type::e5m2);
        EXPECT_EQ(fp32_to_fp8(value, type), (code & 0x80) | 0x7b) << "code " << c;
      } else {
        EXPECT_EQ(fp32_to_fp8(value, type), code) << type_name(type) << " code " << c << " value " << value;
      }
    }
  }
}

TEST(Fp8, KnownValues) {
  EXPECT_EQ(fp8_to_fp32(0x7e, Fp8Type::e4m3), 448.0f);
  EXPECT_EQ(fp8_to_fp32(0x7b, Fp8Type::e5m2), 57344.0f);
  EXPECT_EQ(fp8_to_fp32(0x38, Fp8Type::e4m3), 1.0f);
  EXPECT_EQ(fp8_to_fp32(0x3c, Fp8Type::e5m2), 1.0f);
  EXPECT_EQ(fp8_to_fp32(0x01, Fp8Type::e4m3), 0x1p-9f);   // least subnormal
  EXPECT_EQ(fp8_to_fp32(0x01, Fp8Type::e5m2), 0x1p-16f);
  EXPECT_EQ(fp8_to_fp32(0x08, Fp8Type::e4m3), 0x1p-6f);   // least normal
  EXPECT_EQ(fp8_to_fp32(0xc0, Fp8Type::e4m3), -2.0f);
  EXPECT_EQ(fp32_to_fp8(1.0f, Fp8Type::e4m3), 0x38);
  EXPECT_EQ(fp32_to_fp8(-1.5f, Fp8Type::e5m2), 0xbe);
  EXPECT_EQ(fp8_max(Fp8Type::e4m3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Type::e5m2), 57344.0f);
}

TEST(Fp8, TiesGoToTheEvenCode) {
  for (Fp8Type type : kTypes) {
    const std::vector<uint8_t> codes = positive_finite_codes(type);
    for (size_t i = 0; i + 1 < codes.size(); ++i) {
      const float low = fp8_to_fp32(codes[i], type), high = fp8_to_fp32(codes[i + 1], type);
      const float middle = (low + high) / 2;  // exact: fp8 values have few bits
      const uint8_t even = (codes[i] & 1) ? codes[i + 1] : codes[i];
      EXPECT_EQ(fp32_to_fp8(middle, type), even) << type_name(type) << " between " << low << " and " << high;
      EXPECT_EQ(fp32_to_fp8(-middle, type), 0x80 | even) << type_name(type);
      EXPECT_EQ(fp32_to_fp8(std::nextafter(middle, 0.0f), type), codes[i]) << type_name(type) << " below " << middle;
      EXPECT_EQ(fp32_to_fp8(std::nextafter(middle, 1e9f), type), codes[i + 1]) << type_name(type) << " above " << middle;
    }
  }
  EXPECT_EQ(fp32_to_fp8(1.0625f, Fp8Type::e4m3), 0x38);  // 1 + 2^-4: halfway 1 (even) and 1.125
  EXPECT_EQ(fp32_to_fp8(1.1875f, Fp8Type::e4m3), 0x3a);  // halfway 1.125 (odd) and 1.25: up
}

TEST(Fp8, SaturatesToTheLargestFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fp32_to_fp8(448.0f, Fp8Type::e4m3), 0x7e);
  EXPECT_EQ(fp32_to_fp8(464.0f, Fp8Type::e4m3), 0x7e);  // halfway to 480 (not a value): even 448
  EXPECT_EQ(fp32_to_fp8(480.0f, Fp8Type::e4m3), 0x7e);
  EXPECT_EQ(fp32_to_fp8(1e30f, Fp8Type::e4m3), 0x7e);
  EXPECT_EQ(fp32_to_fp8(inf, Fp8Type::e4m3), 0x7e);
  EXPECT_EQ(fp32_to_fp8(-inf, Fp8Type::e4m3), 0xfe);
  EXPECT_EQ(fp32_to_fp8(61440.0f, Fp8Type::e5m2), 0x7b);  // halfway to 65536: would round up
  EXPECT_EQ(fp32_to_fp8(inf, Fp8Type::e5m2), 0x7b);
  EXPECT_EQ(fp32_to_fp8(-3e38f, Fp8Type::e5m2), 0xfb);
}

TEST(Fp8, NanBecomesTheCanonicalNan) {
  for (Fp8Type type : kTypes) {
    EXPECT_EQ(fp32_to_fp8(std::numeric_limits<float>::quiet_NaN(), type), 0x7f);
    EXPECT_EQ(fp32_to_fp8(-std::numeric_limits<float>::quiet_NaN(), type), 0x7f);
    EXPECT_EQ(fp32_to_fp8(bits_float(0x7f800001u), type), 0x7f);  // signalling
    EXPECT_TRUE(std::isnan(fp8_to_fp32(0xff, type)));
  }
}

TEST(Fp8, ZerosKeepTheirSignAndSubnormalsRound) {
  for (Fp8Type type : kTypes) {
    EXPECT_EQ(fp32_to_fp8(0.0f, type), 0x00);
    EXPECT_EQ(fp32_to_fp8(-0.0f, type), 0x80);
    EXPECT_TRUE(std::signbit(fp8_to_fp32(0x80, type)));
    EXPECT_EQ(fp32_to_fp8(-1e-30f, type), 0x80);                  // underflows to -0
    EXPECT_EQ(fp32_to_fp8(bits_float(0x00000001u), type), 0x00);  // fp32 subnormal
  }
  EXPECT_EQ(fp32_to_fp8(0x1p-10f, Fp8Type::e4m3), 0x00);  // half the least subnormal: even (0)
  EXPECT_EQ(fp32_to_fp8(std::nextafter(0x1p-10f, 1.0f), Fp8Type::e4m3), 0x01);
  EXPECT_EQ(fp32_to_fp8(3 * 0x1p-10f, Fp8Type::e4m3), 0x02);  // 1.5 units: even (2)
  EXPECT_EQ(fp32_to_fp8(5 * 0x1p-9f, Fp8Type::e4m3), 0x05);
  EXPECT_EQ(fp32_to_fp8(0x1p-17f, Fp8Type::e5m2), 0x00);
  EXPECT_EQ(fp32_to_fp8(3 * 0x1p-16f, Fp8Type::e5m2), 0x03);
  EXPECT_EQ(fp32_to_fp8(7.5f * 0x1p-9f, Fp8Type::e4m3), 0x08);  // rounds up into the least normal
}

TEST(Fp8, SweepOfFp32MatchesTheNearestValueSearch) {
  for (Fp8Type type : kTypes) {
    int64_t mismatches = 0;
    for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 65521) {  // ~65k values, every exponent
      const float x = bits_float(static_cast<uint32_t>(bits));
      const uint8_t got = fp32_to_fp8(x, type), want = reference_encode(x, type);
      if (got != want && mismatches++ < 5) ADD_FAILURE() << type_name(type) << " x " << x << " got " << int(got) << " want " << int(want);
    }
    EXPECT_EQ(mismatches, 0) << type_name(type);
  }
}

// ---- delayed scaling (TE's amax_and_scale_update) ------------------------------------------------

TEST(Fp8ScaleUpdate, MostRecentUsesThisStepsAmax) {
  Fp8ScalingParams params{Fp8Type::e4m3, 0, 3, Fp8AmaxAlgo::most_recent};
  float amax = 2.0f, scale = 1.0f, scale_inv = 1.0f;
  float history[3] = {8.0f, 16.0f, 32.0f};
  fp8_update_scale(&amax, history, &scale, &scale_inv, params);
  EXPECT_EQ(history[0], 2.0f);  // newest first, the oldest (32) dropped
  EXPECT_EQ(history[1], 8.0f);
  EXPECT_EQ(history[2], 16.0f);
  EXPECT_EQ(scale, 224.0f);  // 448 / 2
  EXPECT_EQ(scale_inv, 1.0f / 224.0f);
  EXPECT_EQ(amax, 0.0f);
}

TEST(Fp8ScaleUpdate, MaxUsesTheWholeWindowWithMargin) {
  Fp8ScalingParams params{Fp8Type::e5m2, 2, 3, Fp8AmaxAlgo::max};
  float amax = 2.0f, scale = 1.0f, scale_inv = 1.0f;
  float history[3] = {8.0f, 16.0f, 32.0f};
  fp8_update_scale(&amax, history, &scale, &scale_inv, params);
  EXPECT_EQ(scale, 57344.0f / 4 / 16.0f);  // 32 left the window; margin 2 divides by 4
}

TEST(Fp8ScaleUpdate, HistoryOfOneIsThisStep) {
  Fp8ScalingParams params{Fp8Type::e4m3, 0, 1, Fp8AmaxAlgo::max};
  float amax = 0.5f, scale = 1.0f, scale_inv = 1.0f, history = 100.0f;
  fp8_update_scale(&amax, &history, &scale, &scale_inv, params);
  EXPECT_EQ(history, 0.5f);
  EXPECT_EQ(scale, 896.0f);
}

TEST(Fp8ScaleUpdate, ZeroOrNanOrInfiniteAmaxKeepsTheScale) {
  for (float bad : {0.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Fp8ScalingParams params{Fp8Type::e4m3, 0, 1, Fp8AmaxAlgo::most_recent};
    float amax = bad, scale = 3.0f, scale_inv = 0.0f, history = 0.0f;
    fp8_update_scale(&amax, &history, &scale, &scale_inv, params);
    EXPECT_EQ(scale, 3.0f) << bad;
    EXPECT_EQ(scale_inv, 1.0f / 3.0f) << bad;
    EXPECT_EQ(amax, 0.0f);
  }
  // Under max a NaN entry is skipped (fmaxf), the others still count.
  Fp8ScalingParams params{Fp8Type::e4m3, 0, 2, Fp8AmaxAlgo::max};
  float amax = std::numeric_limits<float>::quiet_NaN(), scale = 1.0f, scale_inv = 1.0f;
  float history[2] = {4.0f, 1.0f};
  fp8_update_scale(&amax, history, &scale, &scale_inv, params);
  EXPECT_EQ(scale, 112.0f);
}

TEST(Fp8ScaleUpdate, TinyAmaxClampsTheScaleToFltMax) {
  Fp8ScalingParams params{Fp8Type::e4m3, 0, 1, Fp8AmaxAlgo::most_recent};
  float amax = 1e-40f, scale = 1.0f, scale_inv = 1.0f, history = 0.0f;
  fp8_update_scale(&amax, &history, &scale, &scale_inv, params);
  EXPECT_EQ(scale, std::numeric_limits<float>::max());
  EXPECT_EQ(scale_inv, 1.0f / std::numeric_limits<float>::max());
}
