// The DType list (core/dtype.h): sizes, numpy names, integer kinds.
#include <gtest/gtest.h>

#include "core/dtype.h"

namespace mt {
namespace {

TEST(DType, SizesNamesAndKinds) {
  struct Expected {
    DType dtype;
    size_t size;
    const char* name;
    bool integer;
  };
  const Expected all[] = {{DType::f32, 4, "float32", false}, {DType::bf16, 2, "bfloat16", false},
                          {DType::f16, 2, "float16", false}, {DType::f64, 8, "float64", false},
                          {DType::u8, 1, "uint8", true},     {DType::i8, 1, "int8", true},
                          {DType::i16, 2, "int16", true},    {DType::u16, 2, "uint16", true},
                          {DType::i32, 4, "int32", true},    {DType::i64, 8, "int64", true}};
  for (const Expected& e : all) {
    EXPECT_EQ(dtype_size(e.dtype), e.size) << e.name;
    EXPECT_STREQ(dtype_name(e.dtype), e.name);
    EXPECT_EQ(is_integer(e.dtype), e.integer) << e.name;
  }
}

}  // namespace
}  // namespace mt
