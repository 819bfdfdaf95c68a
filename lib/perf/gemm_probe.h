// The GEMM rate probe: the best of eight 2048^3 products at a precision, on the path the model's
// GEMMs take. mt-train reports it beside MFU; it is not a hardware peak. Tested through
// tests/tools/mt-train.bats and tests/tools/mt-mfu.bats (gemm_tflops and gemm_efficiency).
#pragma once

#include "backend/ops.h"
#include "core/dtype.h"

namespace mt::perf {

// FLOP/s of `ops`'s GEMM at `precision`, operands in its memory (about a second; shared machines
// are noisy).
double measure_gemm_flops(const backend::Ops& ops, Precision precision);

}  // namespace mt::perf
