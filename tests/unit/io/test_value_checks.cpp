// Value checks (io/value_checks.h), issue 28's W6, W11, U4 and the checkpoint save guard: the
// first NaN/Inf is found and named with its tensor and element; a finite value that float16
// (beyond 65504 after rounding) or bfloat16 (beyond float32's range) would store as inf is
// refused naming the tensor, element, value and dtype; values that fit pass.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "../error_text.h"
#include "io/value_checks.h"

using namespace mt;
using mt::testing::error_text;

TEST(ValueChecks, FirstNonFiniteIsFoundAndNamed) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> clean = {1.0f, -3.0f, 65504.0f, 1e30f};
  EXPECT_EQ(io::first_nonfinite(clean.data(), 4), -1);
  EXPECT_EQ(io::nonfinite_problem("model/w", clean.data(), 4), "");
  const std::vector<float> damaged = {1.0f, 2.0f, nan, inf};
  EXPECT_EQ(io::first_nonfinite(damaged.data(), 4), 2);
  EXPECT_EQ(io::nonfinite_problem("model/w", damaged.data(), 4), "tensor model/w holds NaN at element 2");
  const std::vector<float> negative = {0.0f, -inf};
  EXPECT_EQ(error_text([&] { io::check_finite("ck.h5", "model/b", negative.data(), 2, " (why)"); }),
            "ck.h5: tensor model/b holds -Inf at element 1 (why)");
  EXPECT_EQ(error_text([&] { io::check_finite("ck.h5", "model/b", clean.data(), 4); }), "");
}

TEST(ValueChecks, ValuesBeyondTheStoredDtypesRangeAreRefused) {
  const std::vector<float> fits_fp16 = {65504.0f, -65504.0f, 65519.0f, 1e-10f};  // 65519 rounds down to 65504
  EXPECT_EQ(error_text([&] { io::check_fits_dtype("ck.h5", "model/w", fits_fp16.data(), 4, DType::f16); }), "");
  const std::vector<float> big = {1.0f, 1.0e9f};
  EXPECT_EQ(error_text([&] { io::check_fits_dtype("ck.h5", "model/w", big.data(), 2, DType::f16); }),
            "ck.h5: tensor model/w holds 1e+09 at element 1, beyond float16's range (it would be stored as inf); "
            "keep --dtype fp32 or bf16");
  const std::vector<float> rounds_up = {65520.0f};  // rounds to inf in float16
  EXPECT_NE(error_text([&] { io::check_fits_dtype("ck.h5", "model/w", rounds_up.data(), 1, DType::f16); }), "");
  EXPECT_EQ(error_text([&] { io::check_fits_dtype("ck.h5", "model/w", big.data(), 2, DType::bf16); }), "");
  const std::vector<float> float_max = {std::numeric_limits<float>::max()};  // rounds to inf in bfloat16
  EXPECT_NE(error_text([&] { io::check_fits_dtype("ck.h5", "model/w", float_max.data(), 1, DType::bf16); }), "");
  EXPECT_EQ(error_text([&] { io::check_fits_dtype("ck.h5", "model/w", float_max.data(), 1, DType::f32); }), "");
}

// The block scan finds a value in any block, at a block's edges, and the first of several.
TEST(ValueChecks, TheBlockScanFindsTheFirstNonFiniteAnywhere) {
  std::vector<float> values(3 * 4096 + 5, 0.5f);
  EXPECT_EQ(io::first_nonfinite(values.data(), static_cast<int64_t>(values.size())), -1);
  for (int64_t at : {int64_t{0}, int64_t{4095}, int64_t{4096}, int64_t{3 * 4096 + 4}}) {
    std::vector<float> damaged = values;
    damaged[static_cast<size_t>(at)] = std::numeric_limits<float>::infinity();
    damaged.back() = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(io::first_nonfinite(damaged.data(), static_cast<int64_t>(damaged.size())), at) << at;
  }
}
