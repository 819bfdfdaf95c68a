// The CUDA activation, RoPE, elementwise, bias, dropout and AdamW entries of kernels/cuda/ops.h.
// Grid-stride loops: GELU, add, scale, bias_add and AdamW step four floats at a time (float4) when
// every pointer they touch is 16-byte aligned (bias_add: and cols % 4 == 0), one otherwise; SwiGLU
// takes an element, RoPE a rotated pair and dropout a Philox block (four columns) per thread.
// The per-element arithmetic is kernels/common/elementwise_math.h, the CPU kernels'
// (kernels/cpu/impl/elementwise.inc) formulas in their order: GELU in the tanh form, SwiGLU with
// the gate half first, RoPE's half rotation with inv_freq computed on the host exactly as the CPU
// does (passed by value in the launch; YaRN's from yarn_inv_freq, with its concentration factor on
// cos and sin), dropout keyed by (seed, stream, iteration, global row id, global column) so the
// same elements drop as on the CPU, AdamW in the CPU's update order with the bf16 copy rounded as
// half.h. Every entry only queues work on the given stream: no allocation, no copies, no
// synchronisation; a launch error throws
// std::runtime_error naming the entry. Tested on a GPU by the op harness
// (tests/gpu/test_cuda_op_harness.cpp); the shared arithmetic on the CPU by
// tests/unit/kernels/test_cuda_math.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/common/elementwise_math.h"
#include "kernels/common/yarn_rope.h"
#include "kernels/cuda/ops.h"

namespace mt::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // grid-stride covers the rest

// RoPE heads of up to this many dimensions: inv_freq travels in the kernel's parameters.
constexpr int kMaxRopeHalf = 256;

void check_launch(const char* entry) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("cuda ") + entry + ": kernel launch failed: " + cudaGetErrorString(status));
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

unsigned blocks_for(int64_t work_items) {
  const int64_t blocks = std::min<int64_t>((work_items + kThreads - 1) / kThreads, kMaxBlocks);
  return static_cast<unsigned>(std::max<int64_t>(1, blocks));
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

__device__ int64_t thread_index() { return blockIdx.x * int64_t(blockDim.x) + threadIdx.x; }
__device__ int64_t thread_count() { return int64_t(gridDim.x) * blockDim.x; }

// Runs op(i) for i in [0, n) and, when vectorised, op.vec4(j) for the float4 j in [0, n / 4)
// first: the float4 part covers [0, 4 (n / 4)), the scalar tail the rest.
template <typename Op>
__global__ void map_kernel(Op op, int64_t n, bool vectorised) {
  int64_t scalar_begin = 0;
  if (vectorised) {
    const int64_t quads = n / 4;
    for (int64_t j = thread_index(); j < quads; j += thread_count()) op.vec4(j);
    scalar_begin = quads * 4;
  }
  for (int64_t i = scalar_begin + thread_index(); i < n; i += thread_count()) op(i);
}

template <typename Op>
void launch_map(const Op& op, int64_t n, bool vectorised, void* stream, const char* entry) {
  if (n <= 0) return;
  map_kernel<<<blocks_for(vectorised ? (n + 3) / 4 : n), kThreads, 0, as_stream(stream)>>>(op, n, vectorised);
  check_launch(entry);
}

// --- activations -------------------------------------------------------------------------------

// out[i] = f(in[i]).
template <typename F>
struct UnaryMap {
  const float* in;
  float* out;
  F f;
  __device__ void operator()(int64_t i) const { out[i] = f(in[i]); }
  __device__ void vec4(int64_t j) const {
    const float4 v = reinterpret_cast<const float4*>(in)[j];
    reinterpret_cast<float4*>(out)[j] = make_float4(f(v.x), f(v.y), f(v.z), f(v.w));
  }
};

// out[i] = f(dy[i], saved[i]): a gradient from the upstream gradient and the forward's input or output.
template <typename F>
struct GradientMap {
  const float* dy;
  const float* saved;
  float* out;
  F f;
  __device__ void operator()(int64_t i) const { out[i] = f(dy[i], saved[i]); }
  __device__ void vec4(int64_t j) const {
    const float4 g = reinterpret_cast<const float4*>(dy)[j];
    const float4 v = reinterpret_cast<const float4*>(saved)[j];
    reinterpret_cast<float4*>(out)[j] = make_float4(f(g.x, v.x), f(g.y, v.y), f(g.z, v.z), f(g.w, v.w));
  }
};

// GELU, tanh form (GPT-2's; kernels/common/elementwise_math.h, bit for bit the CPU's).
struct GeluValue {
  __device__ float operator()(float v) const { return gelu_value(v); }
};
struct GeluGradient {
  __device__ float operator()(float dy, float v) const { return gelu_gradient(dy, v); }
};

// GELU, erf form (BERT's LM head), and tanh (BERT's pooler): the CPU's formulas
// (kernels/cpu/impl/elementwise.inc) on CUDA's erff, expf and tanhf, each within 2 ulp of the
// exact value as the CPU's libm is.
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

struct GeluErfValue {
  __device__ float operator()(float v) const { return 0.5f * v * (1.0f + erff(v * kInvSqrt2)); }
};
// dy (Phi(x) + x phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
struct GeluErfGradient {
  __device__ float operator()(float dy, float v) const {
    const float cdf = 0.5f * (1.0f + erff(v * kInvSqrt2));
    return dy * (cdf + v * kInvSqrt2Pi * expf(-0.5f * v * v));
  }
};
struct TanhValue {
  __device__ float operator()(float v) const { return tanhf(v); }
};
// From the forward's output y: dy (1 - y^2).
struct TanhGradient {
  __device__ float operator()(float dy, float y) const { return dy * (1.0f - y * y); }
};

// Element (r, c) of y (rows, ffn) from gate_up (rows, 2 ffn): gate at column c, up at ffn + c.
__global__ void swiglu_forward_kernel(const float* gate_up, float* y, int64_t rows, int ffn) {
  const int64_t total = rows * ffn;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t r = i / ffn, c = i % ffn;
    const float* gate = gate_up + r * 2 * ffn;
    y[i] = swiglu_value(gate[c], gate[ffn + c]);
  }
}

__global__ void swiglu_backward_kernel(const float* dy, const float* gate_up, float* d_gate_up, int64_t rows,
                                       int ffn) {
  const int64_t total = rows * ffn;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t r = i / ffn, c = i % ffn;
    const float* gate = gate_up + r * 2 * ffn;
    float* d_gate = d_gate_up + r * 2 * ffn;
    swiglu_gradient(dy[i], gate[c], gate[ffn + c], d_gate[c], d_gate[ffn + c]);
  }
}

// --- RoPE ------------------------------------------------------------------------------------------

struct RopeFrequencies {
  float inv_freq[kMaxRopeHalf];  // (half)
  float concentration = 1.0f;    // YaRN's cos/sin multiplier; RoPE's is 1
};

// One thread per rotated pair (row r, head h, i < half): (first[i], first[half + i]).
__global__ void rope_kernel(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim,
                            const int32_t* positions, RopeFrequencies frequencies, bool transpose) {
  const int half = head_dim / 2;
  const int64_t total = rows * heads * half;
  for (int64_t index = thread_index(); index < total; index += thread_count()) {
    const int i = int(index % half);
    const int h = int(index / half % heads);
    const int64_t r = index / half / heads;
    float* first = x + r * row_stride + int64_t(h) * head_dim;
    float cos_value, sin_value;
    rope_cos_sin_scaled(positions[r], frequencies.inv_freq[i], frequencies.concentration, cos_value, sin_value);
    rope_rotate(first[i], first[half + i], cos_value, sin_value, transpose);
  }
}

// The launch parameters for a head of head_dim dims, inv_freq still zero; refuses heads wider
// than they hold.
RopeFrequencies rope_frequencies(int head_dim, const char* entry) {
  if (head_dim / 2 > kMaxRopeHalf)
    throw std::invalid_argument(std::string("cuda ") + entry + ": head_dim " + std::to_string(head_dim) +
                                " is above the largest supported, " + std::to_string(2 * kMaxRopeHalf + 1));
  return RopeFrequencies{};
}

void rope_launch(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, const int32_t* positions,
                 const RopeFrequencies& frequencies, bool transpose, void* stream, const char* entry) {
  rope_kernel<<<blocks_for(rows * heads * (head_dim / 2)), kThreads, 0, as_stream(stream)>>>(
      x, rows, row_stride, heads, head_dim, positions, frequencies, transpose);
  check_launch(entry);
}

void rope_apply(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, const int32_t* positions,
                float base, bool transpose, void* stream, const char* entry) {
  if (rows <= 0 || heads <= 0 || head_dim < 2) return;
  RopeFrequencies frequencies = rope_frequencies(head_dim, entry);
  for (int i = 0; i < head_dim / 2; ++i) frequencies.inv_freq[i] = rope_inv_freq(base, i, head_dim);
  rope_launch(x, rows, row_stride, heads, head_dim, positions, frequencies, transpose, stream, entry);
}

// YaRN: the same rotation at YaRN's frequencies (yarn_inv_freq, the host function the CPU entries
// call) with cos and sin times the concentration factor.
void rope_yarn_apply(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, const int32_t* positions,
                     const YarnRope& yarn, bool transpose, void* stream, const char* entry) {
  if (rows <= 0 || heads <= 0 || head_dim < 2) return;
  RopeFrequencies frequencies = rope_frequencies(head_dim, entry);
  yarn_inv_freq(yarn, head_dim, frequencies.inv_freq);
  frequencies.concentration = yarn.concentration;
  rope_launch(x, rows, row_stride, heads, head_dim, positions, frequencies, transpose, stream, entry);
}

// --- elementwise, bias ---------------------------------------------------------------------------

struct AddInplace {
  float* y;
  const float* x;
  __device__ void operator()(int64_t i) const { y[i] += x[i]; }
  __device__ void vec4(int64_t j) const {
    float4 a = reinterpret_cast<float4*>(y)[j];
    const float4 b = reinterpret_cast<const float4*>(x)[j];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    reinterpret_cast<float4*>(y)[j] = a;
  }
};

struct ScaleInplace {
  float* x;
  float s;
  __device__ void operator()(int64_t i) const { x[i] *= s; }
  __device__ void vec4(int64_t j) const {
    float4 a = reinterpret_cast<float4*>(x)[j];
    a.x *= s;
    a.y *= s;
    a.z *= s;
    a.w *= s;
    reinterpret_cast<float4*>(x)[j] = a;
  }
};

// y (rows, cols) += bias (cols) on every row; float4 steps need cols % 4 == 0 (rows stay aligned).
struct BiasAdd {
  float* y;
  const float* bias;
  int cols;
  __device__ void operator()(int64_t i) const { y[i] += bias[i % cols]; }
  __device__ void vec4(int64_t j) const {
    float4 a = reinterpret_cast<float4*>(y)[j];
    const float4 b = reinterpret_cast<const float4*>(bias)[j % (cols / 4)];
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    reinterpret_cast<float4*>(y)[j] = a;
  }
};

// --- dropout -------------------------------------------------------------------------------------

// One thread per (row, Philox block): the block's four uniforms serve the local columns whose
// global column lies in [4 block, 4 block + 4).
__global__ void dropout_kernel(float* x, int64_t rows, int cols, const int64_t* row_ids, int64_t col0,
                               DropoutKey key, float keep_scale) {
  const int64_t first_block = col0 >> 2;
  const int64_t blocks_per_row = dropout_blocks_per_row(col0, cols);
  const int64_t total = rows * blocks_per_row;
  for (int64_t index = thread_index(); index < total; index += thread_count()) {
    const int64_t r = index / blocks_per_row;
    dropout_row_block(x + r * cols, cols, col0, row_ids[r], first_block + index % blocks_per_row, key, keep_scale);
  }
}

struct Zero {
  float* x;
  __device__ void operator()(int64_t i) const { x[i] = 0.0f; }
  __device__ void vec4(int64_t j) const { reinterpret_cast<float4*>(x)[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
};

void dropout_apply(float* x, int64_t rows, int cols, const int64_t* row_ids, int64_t col0, const DropoutKey& key,
                   void* stream, const char* entry) {
  if (rows <= 0 || cols <= 0 || key.p <= 0.0f) return;
  if (key.p >= 1.0f) {  // everything dropped: zeros, as the CPU's memset (NaN and inf included)
    launch_map(Zero{x}, rows * cols, aligned16(x), stream, entry);
    return;
  }
  const float keep_scale = 1.0f / (1.0f - key.p);
  const int64_t blocks_per_row = dropout_blocks_per_row(col0, cols);
  dropout_kernel<<<blocks_for(rows * blocks_per_row), kThreads, 0, as_stream(stream)>>>(x, rows, cols, row_ids, col0,
                                                                                       key, keep_scale);
  check_launch(entry);
}

// --- AdamW ---------------------------------------------------------------------------------------

struct AdamWStep {
  float* param;
  uint16_t* param_bf16;  // nullable
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  AdamWConstants constants;
  __device__ void operator()(int64_t i) const {
    float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
    adamw_element(constants, p, grad[i], m, v);
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (param_bf16) param_bf16[i] = fp32_to_bf16_bits(p);
  }
  __device__ void vec4(int64_t j) const {
    float4 p = reinterpret_cast<float4*>(param)[j];
    float4 m = reinterpret_cast<float4*>(exp_avg)[j];
    float4 v = reinterpret_cast<float4*>(exp_avg_sq)[j];
    const float4 g = reinterpret_cast<const float4*>(grad)[j];
    adamw_element(constants, p.x, g.x, m.x, v.x);
    adamw_element(constants, p.y, g.y, m.y, v.y);
    adamw_element(constants, p.z, g.z, m.z, v.z);
    adamw_element(constants, p.w, g.w, m.w, v.w);
    reinterpret_cast<float4*>(param)[j] = p;
    reinterpret_cast<float4*>(exp_avg)[j] = m;
    reinterpret_cast<float4*>(exp_avg_sq)[j] = v;
    if (param_bf16) {
      uint16_t* out = param_bf16 + 4 * j;
      out[0] = fp32_to_bf16_bits(p.x);
      out[1] = fp32_to_bf16_bits(p.y);
      out[2] = fp32_to_bf16_bits(p.z);
      out[3] = fp32_to_bf16_bits(p.w);
    }
  }
};

}  // namespace

void gelu_forward(const float* x, float* y, int64_t n, void* stream) {
  launch_map(UnaryMap<GeluValue>{x, y, {}}, n, aligned16(x) && aligned16(y), stream, "gelu_forward");
}

void gelu_backward(const float* dy, const float* x, float* dx, int64_t n, void* stream) {
  launch_map(GradientMap<GeluGradient>{dy, x, dx, {}}, n, aligned16(dy) && aligned16(x) && aligned16(dx), stream,
             "gelu_backward");
}

void gelu_erf_forward(const float* x, float* y, int64_t n, void* stream) {
  launch_map(UnaryMap<GeluErfValue>{x, y, {}}, n, aligned16(x) && aligned16(y), stream, "gelu_erf_forward");
}

void gelu_erf_backward(const float* dy, const float* x, float* dx, int64_t n, void* stream) {
  launch_map(GradientMap<GeluErfGradient>{dy, x, dx, {}}, n, aligned16(dy) && aligned16(x) && aligned16(dx), stream,
             "gelu_erf_backward");
}

void tanh_forward(const float* x, float* y, int64_t n, void* stream) {
  launch_map(UnaryMap<TanhValue>{x, y, {}}, n, aligned16(x) && aligned16(y), stream, "tanh_forward");
}

void tanh_backward(const float* dy, const float* y, float* dx, int64_t n, void* stream) {
  launch_map(GradientMap<TanhGradient>{dy, y, dx, {}}, n, aligned16(dy) && aligned16(y) && aligned16(dx), stream,
             "tanh_backward");
}

void swiglu_forward(const float* gate_up, float* y, int64_t rows, int ffn, void* stream) {
  if (rows <= 0 || ffn <= 0) return;
  swiglu_forward_kernel<<<blocks_for(rows * ffn), kThreads, 0, as_stream(stream)>>>(gate_up, y, rows, ffn);
  check_launch("swiglu_forward");
}

void swiglu_backward(const float* dy, const float* gate_up, float* d_gate_up, int64_t rows, int ffn, void* stream) {
  if (rows <= 0 || ffn <= 0) return;
  swiglu_backward_kernel<<<blocks_for(rows * ffn), kThreads, 0, as_stream(stream)>>>(dy, gate_up, d_gate_up, rows,
                                                                                     ffn);
  check_launch("swiglu_backward");
}

void rope_forward(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, const int32_t* positions,
                  float base, void* stream) {
  rope_apply(x, rows, row_stride, heads, head_dim, positions, base, false, stream, "rope_forward");
}

void rope_backward(float* dx, int64_t rows, int64_t row_stride, int heads, int head_dim, const int32_t* positions,
                   float base, void* stream) {
  rope_apply(dx, rows, row_stride, heads, head_dim, positions, base, true, stream, "rope_backward");
}

void rope_yarn_forward(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, const int32_t* positions,
                       const YarnRope& yarn, void* stream) {
  rope_yarn_apply(x, rows, row_stride, heads, head_dim, positions, yarn, false, stream, "rope_yarn_forward");
}

void rope_yarn_backward(float* dx, int64_t rows, int64_t row_stride, int heads, int head_dim,
                        const int32_t* positions, const YarnRope& yarn, void* stream) {
  rope_yarn_apply(dx, rows, row_stride, heads, head_dim, positions, yarn, true, stream, "rope_yarn_backward");
}

void add_inplace(float* y, const float* x, int64_t n, void* stream) {
  launch_map(AddInplace{y, x}, n, aligned16(y) && aligned16(x), stream, "add_inplace");
}

void scale_inplace(float* x, int64_t n, float s, void* stream) {
  launch_map(ScaleInplace{x, s}, n, aligned16(x), stream, "scale_inplace");
}

void bias_add(float* y, const float* bias, int64_t rows, int cols, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  launch_map(BiasAdd{y, bias, cols}, rows * cols, cols % 4 == 0 && aligned16(y) && aligned16(bias), stream,
             "bias_add");
}

void dropout_forward(float* x, int64_t rows, int cols, const int64_t* row_ids, int64_t col0, const DropoutKey& key,
                     void* stream) {
  dropout_apply(x, rows, cols, row_ids, col0, key, stream, "dropout_forward");
}

void dropout_backward(float* dx, int64_t rows, int cols, const int64_t* row_ids, int64_t col0, const DropoutKey& key,
                      void* stream) {
  dropout_apply(dx, rows, cols, row_ids, col0, key, stream, "dropout_backward");
}

void adamw_update(float* param, uint16_t* param_bf16, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWParams& params, void* stream) {
  // The bf16 copy is written as four uint16 per float4 step, so it only needs 2-byte alignment.
  const bool vectorised = aligned16(param) && aligned16(grad) && aligned16(exp_avg) && aligned16(exp_avg_sq);
  launch_map(AdamWStep{param, param_bf16, grad, exp_avg, exp_avg_sq, adamw_constants(params)}, n, vectorised, stream,
             "adamw_update");
}

}  // namespace mt::kernels::cuda
