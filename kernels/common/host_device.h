// Marks functions compiled for both the host (CPU backend) and the device (CUDA backend), so the
// CPU and CUDA twins of an op share one definition of e.g. Philox and the bf16/fp16 conversions.
#pragma once

#if defined(__CUDACC__)
#define MT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MT_HOST_DEVICE inline
#endif
