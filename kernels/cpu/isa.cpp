// CPU instruction-set detection and the MT_CPU_ISA override (see isa.h).
#include "kernels/cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

namespace mt::kernels {
namespace {

constexpr int kUnset = -1;
std::atomic<int> g_active{kUnset};

}  // namespace

const char* isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::x86_64_v2: return "x86-64-v2";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
    case CpuIsa::avx512_bf16: return "avx512-bf16";
  }
  return "unknown";
}

bool parse_isa(std::string_view name, CpuIsa& isa) {
  for (CpuIsa candidate : {CpuIsa::x86_64_v2, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16}) {
    if (name == isa_name(candidate)) {
      isa = candidate;
      return true;
    }
  }
  return false;
}

CpuIsa detected_isa() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  if (bf16) return CpuIsa::avx512_bf16;
  if (avx512) return CpuIsa::avx512;
  if (avx2) return CpuIsa::avx2;
  return CpuIsa::x86_64_v2;
}

void set_active_isa(CpuIsa isa) {
  const CpuIsa best = detected_isa();
  if (static_cast<int>(isa) > static_cast<int>(best)) {
    throw std::invalid_argument(std::string("CPU ISA ") + isa_name(isa) + " is not supported by this CPU (best: " +
                                isa_name(best) + ")");
  }
  g_active.store(static_cast<int>(isa));
}

CpuIsa active_isa() {
  const int cached = g_active.load(std::memory_order_relaxed);
  if (cached != kUnset) return static_cast<CpuIsa>(cached);
  CpuIsa isa = detected_isa();
  if (const char* forced = std::getenv("MT_CPU_ISA"); forced && *forced) {
    CpuIsa requested;
    if (!parse_isa(forced, requested)) {
      throw std::invalid_argument(std::string("MT_CPU_ISA=") + forced +
                                  ": unknown level (x86-64-v2, avx2, avx512, avx512-bf16)");
    }
    isa = requested;
  }
  set_active_isa(isa);
  return isa;
}

}  // namespace mt::kernels
