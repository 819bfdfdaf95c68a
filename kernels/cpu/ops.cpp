// Picks the op table of the active ISA level (see ops.h).
#include "kernels/cpu/ops.h"

namespace mt::kernels::cpu {

namespace isa_x86_64_v2 { const CpuOps& ops_table(); }
namespace isa_avx2 { const CpuOps& ops_table(); }
namespace isa_avx512 { const CpuOps& ops_table(); }

const CpuOps& cpu_ops(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512_bf16:
    case CpuIsa::avx512: return isa_avx512::ops_table();
    case CpuIsa::avx2: return isa_avx2::ops_table();
    case CpuIsa::x86_64_v2: return isa_x86_64_v2::ops_table();
  }
  return isa_x86_64_v2::ops_table();
}

const CpuOps& cpu_ops() { return cpu_ops(active_isa()); }

}  // namespace mt::kernels::cpu
