// Register-only arithmetic loops for measuring a core's peak FLOP rate: independent chains of
// fused multiply-adds (or bf16 dot products) that never touch memory, so the rate is the
// arithmetic units' and not a GEMM's. lib/perf/peak.h times them. Tested in
// tests/unit/perf/test_peak.cpp.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"

namespace mt::kernels::cpu {

enum class ProbeArithmetic { fp32, bf16_dot };

// Whether `isa` has an instruction for the arithmetic (bf16_dot needs AVX512-BF16).
bool probe_supported(CpuIsa isa, ProbeArithmetic arithmetic);
// Runs `iterations` rounds over the register chains at `isa` and returns the floating-point
// operations done (a multiply and an add count two). A result is folded into the return so
// nothing is optimised away.
double run_fma_probe(CpuIsa isa, ProbeArithmetic arithmetic, int64_t iterations);

namespace detail {
double fma_probe_x86_64_v2(int64_t iterations);
double fma_probe_avx2(int64_t iterations);
double fma_probe_avx512(int64_t iterations);
double bf16_dot_probe_avx512bf16(int64_t iterations);
}  // namespace detail

}  // namespace mt::kernels::cpu
