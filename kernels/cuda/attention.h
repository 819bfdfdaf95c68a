// CUDA twin of the CPU attention kernels (kernels/cpu/impl/attention.inc; semantics in
// kernels/cpu/ops.h and AttentionShape): causal attention forward with global positions, document
// masks and lse, backward writing or accumulating dq, dk, dv, and the lse merge of key blocks.
// Straightforward kernels (one thread per query row, or per key row for dk/dv) for correctness
// first; head_dim up to 256. Host entry points take host arrays and copy them through the device
// (the shape of a future CUDA backend's entries, which will take device pointers and a stream).
// Checked against the CPU kernels by tests/gpu/test_cuda_selftest.cpp.
#pragma once

#include <cstdint>

#include "kernels/common/op_params.h"

namespace mt::kernels::cuda {

inline constexpr int kMaxAttentionHeadDim = 256;

// q, k, v, dq, dk, dv: batch * len rows of their strides; out, dout: batch * q_len rows of
// o_stride; lse: batch * q_heads * q_len; doc_start nullable. Runs the forward (out, lse), then the
// backward from that out and lse (dq, dk, dv written, or added to their incoming values with
// shape.accumulate_grads). Throws std::runtime_error without a device, for head_dim > 256 or for
// attention dropout (shape.dropout.key.p != 0: the CPU kernels only, so far).
void attention_roundtrip(const AttentionShape& shape, const float* q, const float* k, const float* v,
                         const int32_t* doc_start, const float* dout, float* out, float* lse, float* dq, float* dk,
                         float* dv);

// attention_merge (kernels/cpu/ops.h) on host arrays: out, lse updated in place.
void attention_merge_roundtrip(const AttentionShape& shape, float* out, float* lse, const float* part_out,
                               const float* part_lse);

}  // namespace mt::kernels::cuda
