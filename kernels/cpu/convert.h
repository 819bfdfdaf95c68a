// Bulk fp32 <-> bf16/fp16 conversions (round to nearest even), dispatched on the active ISA, and
// fp32 rounded through bf16/fp16.
// Every path gives the bits of kernels/common/half.h. Tested in tests/unit/kernels/test_half.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.h"

namespace mt::kernels::cpu {

void fp32_to_bf16(const float* in, uint16_t* out, size_t n);
void bf16_to_fp32(const uint16_t* in, float* out, size_t n);
void fp32_to_fp16(const float* in, uint16_t* out, size_t n);
void fp16_to_fp32(const uint16_t* in, float* out, size_t n);
// fp32 values rounded to the nearest bf16 / fp16 value and kept in fp32 storage: the GEMM inputs
// of a precision whose products run as fp32 GEMMs (exact: a product of two such values fits fp32).
// OpenMP over the process's threads.
void round_through_bf16(const float* in, float* out, size_t n);
void round_through_fp16(const float* in, float* out, size_t n);

// Per-ISA entry points, exposed so tests can compare every path against the scalar one.
void fp32_to_bf16_isa(CpuIsa isa, const float* in, uint16_t* out, size_t n);

namespace detail {
void fp32_to_bf16_scalar(const float* in, uint16_t* out, size_t n);
void fp32_to_bf16_avx2(const float* in, uint16_t* out, size_t n);
void fp32_to_bf16_avx512(const float* in, uint16_t* out, size_t n);
}  // namespace detail

}  // namespace mt::kernels::cpu
