// Checks on a tensor's values before mt writes or uses them: no NaN/Inf (a checkpoint is never
// written from, nor loaded into, a non-finite state; an HF import refuses non-finite weights),
// and no finite value that a narrower stored dtype turns into inf (mt-ckpt convert --dtype).
// Each names the tensor, the element and the value. Tested in tests/unit/io/test_value_checks.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace mt::io {

// The index of the first NaN/Inf of values[0, count), or -1 when every value is finite.
int64_t first_nonfinite(const float* values, int64_t count);

// "tensor NAME holds NaN at element I" (or Inf, -Inf) when a value is not finite; "" otherwise.
std::string nonfinite_problem(const std::string& tensor, const float* values, int64_t count);
// The same words for a value found at `element` (e.g. its index in the whole tensor).
std::string nonfinite_text(const std::string& tensor, float value, int64_t element);

// Throws Error(where, nonfinite_problem(...) + why) when a value is not finite.
void check_finite(const std::string& where, const std::string& tensor, const float* values, int64_t count,
                  const std::string& why = "");

// Throws Error(where, ...) naming the tensor, element and value when a finite value becomes
// inf once rounded to `stored` (float16 beyond 65504; bfloat16 beyond float32's own range).
void check_fits_dtype(const std::string& where, const std::string& tensor, const float* values, int64_t count,
                      DType stored);

}  // namespace mt::io
