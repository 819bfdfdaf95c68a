// Run-time choice of the CPU instruction-set level for mt's own kernels. Binaries are built for
// x86-64-v2; wider paths are compiled per file and picked here from the CPU's feature flags (never
// from vendor tables). MT_CPU_ISA=x86-64-v2|avx2|avx512|avx512-bf16 forces a level at or below
// what the CPU supports, so tests exercise every path. Tested in tests/unit/kernels/test_isa.cpp.
#pragma once

#include <string>
#include <string_view>

namespace mt::kernels {

enum class CpuIsa { x86_64_v2 = 0, avx2 = 1, avx512 = 2, avx512_bf16 = 3 };

const char* isa_name(CpuIsa isa);
// Parses an MT_CPU_ISA value; returns false for an unknown name.
bool parse_isa(std::string_view name, CpuIsa& isa);
// The best level this CPU supports (feature flags via cpuid).
CpuIsa detected_isa();
// The level kernels use: detected_isa(), lowered by MT_CPU_ISA when set. Throws
// std::invalid_argument naming the problem when MT_CPU_ISA is unknown or above the CPU's level.
CpuIsa active_isa();
// Overrides the active level for this process (tests); throws std::invalid_argument above the CPU.
void set_active_isa(CpuIsa isa);

}  // namespace mt::kernels
