// The CPU op table compiled for the x86_64_v2 level (flags from kernels/CMakeLists.txt).
#define MT_ISA_NS isa_x86_64_v2
#include "kernels/cpu/impl/ops_impl.inc"
