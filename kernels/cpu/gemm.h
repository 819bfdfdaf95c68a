// Dense matrix multiply on the CPU through oneDNN (which picks its kernels from the CPU's
// feature flags): C = alpha * op(A) * op(B) + beta * C, row-major, op = transpose or not.
// The bf16 variant takes bf16 A and B (uint16 bits) and accumulates in fp32 into fp32 C. Where
// oneDNN has no bf16 matmul (Debian's oneDNN 2.6 below AVX-512, or ONEDNN_MAX_CPU_ISA holding it
// there) it widens the operands to fp32 and runs the fp32 GEMM: the same exact products and fp32
// accumulation, never a raw oneDNN error. Tested in tests/unit/backend/test_op_harness.cpp (the
// backend's gemm entry on f32 and bf16 operands at every ISA level).
#pragma once

#include <cstdint>

namespace mt::kernels::cpu {

// True when bf16 GEMMs run in hardware: AVX512-BF16 at the active ISA level and a oneDNN that
// builds bf16 matmuls under its own ISA limit. Elsewhere callers get the same products faster
// from gemm_f32 over bf16-rounded operands (a bf16 x bf16 product is exact in fp32); oneDNN's
// bf16 emulation is slower than that.
bool native_bf16_gemm();

// True when oneDNN builds a bf16 matmul on this CPU (asked once, with a 1 x 1 x 1 primitive);
// when false, gemm_bf16 runs widened.
bool onednn_bf16_matmul();

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace mt::kernels::cpu
