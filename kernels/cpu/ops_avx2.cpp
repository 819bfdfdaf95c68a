// The CPU op table compiled for the avx2 level (flags from kernels/CMakeLists.txt).
#define MT_ISA_NS isa_avx2
#include "kernels/cpu/impl/ops_impl.inc"
