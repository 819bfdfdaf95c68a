// bf16/fp16 conversions: known values, and every ISA path of the bulk conversion against the
// scalar reference of kernels/common/half.h.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/common/half.h"
#include "kernels/cpu/convert.h"

using namespace mt::kernels;

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16_bits(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even mantissa (1.0).
  EXPECT_EQ(fp32_to_bf16_bits(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(fp32_to_bf16_bits(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(fp32_to_bf16_bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  EXPECT_EQ(fp32_to_bf16_bits(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(fp32_to_bf16_bits(3.4e38f), 0x7f80);  // rounds past the largest bf16
  const uint16_t nan = fp32_to_bf16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(bf16_bits_to_fp32(nan)));
  EXPECT_TRUE(std::isnan(bf16_bits_to_fp32(fp32_to_bf16_bits(bits_float(0x7f800001u)))));  // signalling stays NaN
}

TEST(Fp16, KnownValues) {
  EXPECT_EQ(fp32_to_fp16_bits(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16_bits(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16_bits(65520.0f), 0x7c00);  // halfway to 2^16 rounds to infinity
  EXPECT_EQ(fp32_to_fp16_bits(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16_bits(0x1p-24f), 0x0001);  // least subnormal
  EXPECT_EQ(fp32_to_fp16_bits(0x1p-25f), 0x0000);  // halfway to it: ties to even (zero)
  EXPECT_EQ(fp32_to_fp16_bits(0x1.8p-25f), 0x0001);
  EXPECT_EQ(fp32_to_fp16_bits(1.0f + 0x1p-11f), 0x3c00);  // tie, even
  EXPECT_EQ(fp32_to_fp16_bits(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_FLOAT_EQ(fp16_bits_to_fp32(0x0001), 0x1p-24f);
  EXPECT_FLOAT_EQ(fp16_bits_to_fp32(0x3555), 0.333251953125f);
}

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = fp16_bits_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16_bits(f), h) << std::hex << h;
  }
}

TEST(Bf16, RoundTripsEveryBf16) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = bf16_bits_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_bf16_bits(f), h) << std::hex << h;
  }
}

TEST(Bf16, EveryIsaPathMatchesScalar) {
  std::mt19937 rng(7);
  std::vector<float> input(1000 + 13);
  for (auto& x : input) x = bits_float(static_cast<uint32_t>(rng()));  // every bit pattern class
  input[0] = std::numeric_limits<float>::quiet_NaN();
  input[1] = -std::numeric_limits<float>::infinity();
  input[2] = 1.0f + 0x1p-8f;
  std::vector<uint16_t> expected(input.size()), actual(input.size());
  cpu::detail::fp32_to_bf16_scalar(input.data(), expected.data(), input.size());
  for (CpuIsa isa : {CpuIsa::x86_64_v2, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16}) {
    if (static_cast<int>(isa) > static_cast<int>(detected_isa())) continue;
    std::fill(actual.begin(), actual.end(), 0);
    cpu::fp32_to_bf16_isa(isa, input.data(), actual.data(), input.size());
    for (size_t i = 0; i < input.size(); ++i) {
      ASSERT_EQ(actual[i], expected[i]) << isa_name(isa) << " at " << i;
    }
  }
}
