// Tensor: owning and viewing storage, typed access checks, row views, byte accounting.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"

using namespace mt;

TEST(Tensor, OwningZerosAndByteCounter) {
  ByteCounter counter;
  {
    Tensor t = Tensor::zeros({3, 5}, DType::f32, &counter);
    EXPECT_TRUE(t.owns_storage());
    EXPECT_EQ(t.numel(), 15);
    EXPECT_EQ(t.bytes(), 60);
    EXPECT_EQ(t.describe(), "f32[3, 5]");
    for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
    EXPECT_EQ(counter.current, 64);  // rounded up to 64-byte lines
    Tensor copy = t;                 // shares storage
    copy.data<float>()[2] = 7.0f;
    EXPECT_EQ(t.data<float>()[2], 7.0f);
  }
  EXPECT_EQ(counter.current, 0);
  EXPECT_EQ(counter.peak, 64);
}

TEST(Tensor, ViewsRowsAndTypeChecks) {
  float values[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  Tensor t = Tensor::view(values, {4, 3}, DType::f32);
  EXPECT_FALSE(t.owns_storage());
  const Tensor middle = t.rows(1, 3);
  EXPECT_EQ(middle.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(middle.data<float>()[0], 3.0f);
  EXPECT_THROW(t.rows(2, 5), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
  Tensor bits = Tensor::zeros({4}, DType::bf16);
  EXPECT_NO_THROW(bits.data<uint16_t>());
  EXPECT_THROW(bits.data<float>(), Error);
}

TEST(Tensor, DoublesForReductionsAndTotals) {
  Tensor t = Tensor::zeros({3}, DType::f64);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(t.bytes(), 24);
  EXPECT_EQ(t.describe(), "f64[3]");
  EXPECT_NO_THROW(t.data<double>());
  EXPECT_THROW(t.data<int64_t>(), Error);
}
