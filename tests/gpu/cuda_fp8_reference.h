// NVIDIA's own FP8 conversions run on the device, the reference tests/gpu/test_cuda_fp8.cpp holds
// mt's kernels/common/fp8.h to (cuda_fp8.hpp's intrinsics: on sm_89 and newer the PTX
// cvt.rn.satfinite instructions of the hardware). Plain C++ interface so the test compiles with the
// host compiler; the kernels are in tests/gpu/cuda_fp8_reference.cu. Pointers are device pointers;
// every function waits for its kernel and throws std::runtime_error when CUDA reports an error.
#pragma once

#include <cstdint>

#include "kernels/common/fp8.h"

namespace mt::fp8_reference {

// out[i] = __nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, __NV_E4M3 or __NV_E5M2).
void nvidia_fp32_to_fp8(const float* in, int64_t n, kernels::Fp8Type type, uint8_t* out);
// out[code] for the 256 codes: __nv_cvt_fp8_to_halfraw(code, ...) widened to fp32.
void nvidia_fp8_to_fp32(kernels::Fp8Type type, float* out);
// out[code] for the 256 codes: mt's kernels::fp8_to_fp32 run in a kernel.
void mt_fp8_to_fp32_on_device(kernels::Fp8Type type, float* out);
// The device's compute capability as major * 10 + minor (90 for sm_90).
int compute_capability();

}  // namespace mt::fp8_reference
