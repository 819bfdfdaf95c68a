// The CUDA FP8 entries of kernels/cuda/ops.h (contracts: lib/backend/ops.h, family "fp8"):
// quantisation with the tensor's amax, the byte transpose the GEMM's layout needs, the FP8 GEMM
// on cuBLASLt and the delayed-scaling update. The arithmetic is kernels/common/fp8.h's, the same
// functions the CPU entries (kernels/cpu/fp8.cpp) call: fp32_to_fp8 in the quantise kernel (plain
// integer arithmetic, so it compiles for sm_80 too) and the per-tensor scale update in a kernel of
// one thread per tensor. Only the GEMM needs FP8 tensor cores: it refuses devices below compute
// capability 8.9 by name, and shapes cuBLASLt's FP8 kernels turn down (and A or B off 16-byte
// boundaries) take a plain kernel. Every entry only queues work on its stream (no allocation, no
// copy to or from the host, no synchronisation; the GEMM's one-time cuBLASLt state is gemm.cu's,
// made by the first GEMM of either kind outside any stream capture; a GEMM shape first met under
// capture takes the plain kernel without asking cuBLASLt's heuristic, as gemm.cu does). Tested on a GPU by tests/gpu/test_cuda_fp8.cpp
// (conversion against NVIDIA's, every entry against the CPU table) and the op harness
// (tests/gpu/test_cuda_op_harness.cpp).
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "kernels/common/fp8.h"
#include "kernels/cuda/lt_context.h"
#include "kernels/cuda/ops.h"

namespace mt::kernels::cuda {
namespace {

constexpr int kThreads = 256;          // a multiple of 32 (the amax reduction's warps)
constexpr int64_t kMaxBlocks = 65535;  // grid-stride loops cover the rest
constexpr int kTile = 32;              // the transpose's square tile
constexpr int kTileRows = 8;           // the transpose block: kTile x kTileRows threads

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

void check_launch(const char* entry) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("cuda ") + entry + ": kernel launch failed: " + cudaGetErrorString(status));
}

unsigned blocks_for(int64_t work_items, int64_t per_block) {
  return static_cast<unsigned>(std::clamp<int64_t>((work_items + per_block - 1) / per_block, 1, kMaxBlocks));
}

// --- quantise ------------------------------------------------------------------------------------

// out[i] = fp32_to_fp8(x[i] * *scale); *amax = max(*amax, max |x[i]|). The maximum is taken on
// the bits of |x| (sign cleared): non-negative floats order as their bit patterns, and every NaN
// lies above +inf, so an integer max propagates a NaN with no extra test. Each block reduces its
// threads' maxima (warp shuffles, then the warps' in shared memory) and thread 0 adds it with one
// atomicMax on *amax's bits (which hold a non-negative float or a NaN, as the contract says).
__global__ void quantize_kernel(const float* x, int64_t n, const float* scale, Fp8Type type, uint8_t* out,
                                float* amax) {
  const float s = *scale;
  uint32_t largest = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float value = x[i];
    out[i] = fp32_to_fp8(value * s, type);
    largest = max(largest, __float_as_uint(value) & 0x7fffffffu);
  }
  for (int offset = 16; offset > 0; offset /= 2) largest = max(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
  __shared__ uint32_t warp_largest[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_largest[threadIdx.x / 32] = largest;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t block_largest = warp_largest[0];
    for (int w = 1; w < kThreads / 32; ++w) block_largest = max(block_largest, warp_largest[w]);
    atomicMax(reinterpret_cast<unsigned int*>(amax), block_largest);
  }
}

// --- transpose -----------------------------------------------------------------------------------

// out (cols, rows) = in (rows, cols)^T through a kTile x kTile tile in shared memory (one column
// of padding), so both the reads and the writes walk along rows. Blocks are kTile x kTileRows
// threads; a grid-stride loop over tiles in both directions (the same trip count for every thread
// of a block, so the barriers are reached by all).
__global__ void transpose_kernel(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  for (int64_t tile_row = blockIdx.y; tile_row < row_tiles; tile_row += gridDim.y) {
    for (int64_t tile_col = blockIdx.x; tile_col < col_tiles; tile_col += gridDim.x) {
      const int64_t row0 = tile_row * kTile, col0 = tile_col * kTile;
      for (int dy = threadIdx.y; dy < kTile; dy += kTileRows) {
        const int64_t row = row0 + dy, col = col0 + threadIdx.x;
        if (row < rows && col < cols) tile[dy][threadIdx.x] = in[row * cols + col];
      }
      __syncthreads();
      // Thread (x, dy) writes out[col0 + dy][row0 + x] = in[row0 + x][col0 + dy] = tile[x][dy].
      for (int dy = threadIdx.y; dy < kTile; dy += kTileRows) {
        const int64_t out_row = col0 + dy, out_col = row0 + threadIdx.x;
        if (out_row < cols && out_col < rows) out[out_row * rows + out_col] = tile[threadIdx.x][dy];
      }
      __syncthreads();  // the tile is read before the next one overwrites it
    }
  }
}

// --- scale update --------------------------------------------------------------------------------

// One thread per tensor: kernels/common/fp8.h's update, the CPU entry's function, on tensor t's
// amax, history (history_len floats of its own), scale and scale_inv.
__global__ void update_scales_kernel(float* amax, float* amax_history, float* scale, float* scale_inv,
                                     int64_t tensors, Fp8ScalingParams params) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < tensors; t += int64_t(gridDim.x) * blockDim.x)
    fp8_update_scale(amax + t, amax_history + t * params.history_len, scale + t, scale_inv + t, params);
}

// --- GEMM ----------------------------------------------------------------------------------------

[[noreturn]] void refuse(const std::string& what, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                         int64_t ldc) {
  throw std::invalid_argument("cuda gemm_fp8: " + what + " (m=" + std::to_string(m) + " n=" + std::to_string(n) +
                              " k=" + std::to_string(k) + " lda=" + std::to_string(lda) +
                              " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc) + ")");
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// The contract's refusals (the CPU entry refuses the same). A and B off 16-byte boundaries, which
// cuBLASLt's FP8 kernels cannot read, are no refusal (the CPU takes them): they take the plain kernel.
void check_fp8_gemm(int64_t m, int64_t n, int64_t k, Fp8Type a_type, int64_t lda, Fp8Type b_type, int64_t ldb,
                    int64_t ldc) {
  if (m < 0 || n < 0 || k < 0) refuse("negative dimension", m, n, k, lda, ldb, ldc);
  if (lda < std::max<int64_t>(1, k)) refuse("lda smaller than a row of A", m, n, k, lda, ldb, ldc);
  if (ldb < std::max<int64_t>(1, k)) refuse("ldb smaller than a row of B", m, n, k, lda, ldb, ldc);
  if (ldc < std::max<int64_t>(1, n)) refuse("ldc smaller than a row of C", m, n, k, lda, ldb, ldc);
  if (k % 16 != 0 || lda % 16 != 0 || ldb % 16 != 0)
    refuse("k, lda and ldb must be multiples of 16 (cuBLASLt's FP8 layouts)", m, n, k, lda, ldb, ldc);
  if (a_type == Fp8Type::e5m2 && b_type == Fp8Type::e5m2)
    refuse("e5m2 x e5m2 has no FP8 GEMM (cuBLASLt takes e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3)", m, n, k, lda, ldb,
           ldc);
}

// Whether `stream` is capturing work into a graph (a failed query counts as capturing: the legacy
// stream answers an error while another stream captures), as gemm.cu asks it.
bool capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(as_stream(stream), &status) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

cudaDataType_t data_type(Fp8Type type) { return type == Fp8Type::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

void check_blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuda gemm_fp8: ") + what + ": " + cublasGetStatusString(status));
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("cuda gemm_fp8: ") + what + ": " + cudaGetErrorString(status));
}

// The mapping onto cuBLASLt. mt's C (m, n) row-major = A (m, k) . B (n, k)^T, A and B row-major
// with k contiguous (lda, ldb), C with ldc. Read column-major, a row-major (r, c) matrix with
// leading dimension ld is its transpose (c, r) with the same ld, so:
//   C^T (n x m, ldc)  = B (n x k) . A^T (k x m)
//   B's buffer        = column-major (k x n, ldb) = B^T, so B = op(that) with op = T
//   A's buffer        = column-major (k x m, lda) = A^T, taken as is: op = N
// cuBLASLt computes D (M x N) = alpha op(A_lt) op(B_lt) + beta C, so A_lt is our B buffer
// (k x n, ldb, TRANSA = T), B_lt our A buffer (k x m, lda, TRANSB = N), D = C our C buffer
// (n x m, ldc), M = n, N = m, K = k: the "TN" form, the only one FP8 takes on sm_89/sm_90.
// The scales follow the buffers: A_SCALE_POINTER is b_scale_inv, B_SCALE_POINTER a_scale_inv.
struct Fp8Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr, lt_b = nullptr, out = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  bool has_algorithm = false;
};

using Fp8PlanKey =
    std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, uint32_t, uint32_t, uint32_t, bool>;

// The largest power of two (at most 256) dividing the address: the alignment cuBLASLt may assume.
uint32_t pointer_alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  check_blas(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
             "cublasLtMatrixLayoutCreate");
  return layout;
}

template <typename T>
void set_attribute(cublasLtMatmulDesc_t operation, cublasLtMatmulDescAttributes_t attribute, const T& value,
                   const char* what) {
  check_blas(cublasLtMatmulDescSetAttribute(operation, attribute, &value, sizeof value), what);
}

void set_preference(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                    uint32_t alignment) {
  check_blas(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof alignment),
             "cublasLtMatmulPreferenceSetAttribute");
}

struct GemmShape {
  int64_t m, n, k, lda, ldb, ldc;
  Fp8Type a_type, b_type;
  uint32_t align_a, align_b, align_c;
  const float *a_scale_inv, *b_scale_inv;  // this call's (device pointers)
};

std::unique_ptr<Fp8Plan> make_plan(cublasLtHandle_t lt, const GemmShape& shape, uint64_t workspace_bytes) {
  auto plan = std::make_unique<Fp8Plan>();
  check_blas(cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "TRANSA");
  set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "TRANSB");
  set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{0}, "FAST_ACCUM");
  // The heuristic sees the scale pointers set (algorithms differ with scaling); every call sets
  // its own before it runs.
  set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, shape.b_scale_inv, "A_SCALE_POINTER");
  set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, shape.a_scale_inv, "B_SCALE_POINTER");
  plan->lt_a = make_layout(data_type(shape.b_type), shape.k, shape.n, shape.ldb);
  plan->lt_b = make_layout(data_type(shape.a_type), shape.k, shape.m, shape.lda);
  plan->out = make_layout(CUDA_R_32F, shape.n, shape.m, shape.ldc);

  cublasLtMatmulPreference_t preference = nullptr;
  check_blas(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  check_blas(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace_bytes, sizeof workspace_bytes),
             "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, shape.align_b);
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, shape.align_a);
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, shape.align_c);
  set_preference(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, shape.align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt, plan->operation, plan->lt_a, plan->lt_b, plan->out,
                                                               plan->out, preference, 1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algorithm = result.algo;
    plan->has_algorithm = true;
  }
  return plan;
}

// Per device: its compute capability (read once) and the plans by shape. The mutex also guards a
// plan's descriptor from the setting of the scale pointers until cublasLtMatmul has queued.
struct Fp8DeviceState {
  int compute_major = 0, compute_minor = 0;
  std::string name;
  std::mutex mutex;
  std::map<Fp8PlanKey, std::unique_ptr<Fp8Plan>> plans;
  // Per stream: 8 floats on a 256-byte boundary holding copies of a call's two scales (see
  // aligned_scales below); made at a stream's first such call outside capture, never freed.
  std::map<void*, float*> scale_copies;
};

// Never destroyed, as gemm.cu's state: descriptors would outlive the library at exit otherwise.
Fp8DeviceState& fp8_device_state() {
  static std::mutex registry_mutex;
  static auto* registry = new std::map<int, std::unique_ptr<Fp8DeviceState>>();
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(registry_mutex);
  std::unique_ptr<Fp8DeviceState>& state = (*registry)[device];
  if (!state) {
    auto created = std::make_unique<Fp8DeviceState>();
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
    created->compute_major = properties.major;
    created->compute_minor = properties.minor;
    created->name = properties.name;
    state = std::move(created);
  }
  return *state;
}

// cuBLASLt's FP8 matmul turns down a scale pointer off a 16-byte boundary (an H200 run with
// CUDA 13.0 / cuBLAS 13.1: every training GEMM whose scale sat at a 4- or 8-byte offset of the
// scaling state's array returned CUBLAS_STATUS_NOT_SUPPORTED and ran the plain kernel, 100x
// slower). Such a call's two scales are first copied, in stream order, to the stream's aligned
// pair: copies[0] = *a_scale_inv, copies[4] = *b_scale_inv.
__global__ void copy_scales_kernel(const float* a_scale_inv, const float* b_scale_inv, float* copies) {
  copies[0] = *a_scale_inv;
  copies[4] = *b_scale_inv;
}

// The stream's copies (8 floats), made at its first call outside capture; nullptr when the stream
// is capturing and has none yet (the call then takes the plain kernel, as an unplanned shape does).
// The caller holds state.mutex.
float* scale_copies(Fp8DeviceState& state, void* stream) {
  float*& copies = state.scale_copies[stream];
  if (!copies) {
    if (capturing(stream)) return nullptr;
    check(cudaMalloc(&copies, 8 * sizeof(float)), "cudaMalloc (gemm_fp8's aligned scales)");
  }
  return copies;
}

void require_fp8_tensor_cores(const Fp8DeviceState& state) {
  if (state.compute_major * 10 + state.compute_minor >= 89) return;
  throw std::runtime_error("cuda gemm_fp8: FP8 GEMMs need compute capability 8.9 or newer (Ada, Hopper); this "
                           "device is " + state.name + ", compute capability " + std::to_string(state.compute_major) +
                           "." + std::to_string(state.compute_minor));
}

// C (m, n) = beta C (zeros when beta = 0): the k = 0 product, as BLAS and the CPU entry.
__global__ void scale_c_kernel(float* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * n; i += int64_t(gridDim.x) * blockDim.x) {
    float& value = c[(i / n) * ldc + i % n];
    value = beta == 0.0f ? 0.0f : beta * value;
  }
}

// The GEMM for shapes cuBLASLt's FP8 kernels turn down (the heuristic offers none, or the one
// offered reports not supported; e.g. n, cuBLASLt's M, not a multiple of 16), for A or B off
// 16-byte boundaries and for a shape first met under stream capture: one thread
// per element of C, the k exact products added in order in fp32, scaled as the CPU entry scales
// (alpha * a_scale_inv * b_scale_inv, then times the sum). Slow, and meant only for such shapes;
// gemm_fp8_fallback_calls() counts gemm_fp8's uses of it so the GPU test can see which path a
// shape took, and gemm_fp8_plain runs it directly (the GPU test checks it on its own).
__global__ void gemm_fallback_kernel(int64_t m, int64_t n, int64_t k, float alpha, const uint8_t* a, Fp8Type a_type,
                                     const float* a_scale_inv, int64_t lda, const uint8_t* b, Fp8Type b_type,
                                     const float* b_scale_inv, int64_t ldb, float beta, float* c, int64_t ldc) {
  const float scaled_alpha = alpha * *a_scale_inv * *b_scale_inv;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / n, col = i % n;
    const uint8_t* a_row = a + row * lda;
    const uint8_t* b_row = b + col * ldb;
    float sum = 0.0f;
    for (int64_t p = 0; p < k; ++p) sum += fp8_to_fp32(a_row[p], a_type) * fp8_to_fp32(b_row[p], b_type);
    float& out = c[row * ldc + col];
    out = beta == 0.0f ? scaled_alpha * sum : scaled_alpha * sum + beta * out;
  }
}

std::atomic<int64_t> g_fallback_calls{0};

}  // namespace

int64_t gemm_fp8_fallback_calls() { return g_fallback_calls.load(std::memory_order_relaxed); }

void gemm_fp8_plain(int64_t m, int64_t n, int64_t k, float alpha, const uint8_t* a, Fp8Type a_type,
                    const float* a_scale_inv, int64_t lda, const uint8_t* b, Fp8Type b_type, const float* b_scale_inv,
                    int64_t ldb, float beta, float* c, int64_t ldc, void* stream) {
  if (m <= 0 || n <= 0) return;
  gemm_fallback_kernel<<<blocks_for(m * n, kThreads), kThreads, 0, as_stream(stream)>>>(
      m, n, k, alpha, a, a_type, a_scale_inv, lda, b, b_type, b_scale_inv, ldb, beta, c, ldc);
  check_launch("gemm_fp8 (the plain kernel)");
}

void fp8_quantize(const float* x, int64_t n, const float* scale, Fp8Type type, uint8_t* out, float* amax,
                  void* stream) {
  if (n < 0) throw std::invalid_argument("cuda fp8_quantize: negative n = " + std::to_string(n));
  if (n == 0) return;
  quantize_kernel<<<blocks_for(n, kThreads), kThreads, 0, as_stream(stream)>>>(x, n, scale, type, out, amax);
  check_launch("fp8_quantize");
}

void fp8_transpose(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out, void* stream) {
  if (rows < 0 || cols < 0)
    throw std::invalid_argument("cuda fp8_transpose: negative shape (" + std::to_string(rows) + ", " +
                                std::to_string(cols) + ")");
  if (rows == 0 || cols == 0) return;
  const dim3 grid(blocks_for(cols, kTile), blocks_for(rows, kTile));
  transpose_kernel<<<grid, dim3(kTile, kTileRows), 0, as_stream(stream)>>>(in, rows, cols, out);
  check_launch("fp8_transpose");
}

void gemm_fp8(int64_t m, int64_t n, int64_t k, float alpha, const uint8_t* a, Fp8Type a_type,
              const float* a_scale_inv, int64_t lda, const uint8_t* b, Fp8Type b_type, const float* b_scale_inv,
              int64_t ldb, float beta, float* c, int64_t ldc, void* stream) {
  check_fp8_gemm(m, n, k, a_type, lda, b_type, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    scale_c_kernel<<<blocks_for(m * n, kThreads), kThreads, 0, as_stream(stream)>>>(c, m, n, ldc, beta);
    check_launch("gemm_fp8 (k = 0)");
    return;
  }
  Fp8DeviceState& state = fp8_device_state();
  require_fp8_tensor_cores(state);
  const auto plain = [&] {
    g_fallback_calls.fetch_add(1, std::memory_order_relaxed);
    gemm_fp8_plain(m, n, k, alpha, a, a_type, a_scale_inv, lda, b, b_type, b_scale_inv, ldb, beta, c, ldc, stream);
  };
  if (!aligned16(a) || !aligned16(b)) return plain();
  const LtStreamContext context = lt_stream_context(stream);
  const GemmShape shape{m,      n,      k,
                        lda,    ldb,    ldc,
                        a_type, b_type, pointer_alignment(a),
                        pointer_alignment(b), pointer_alignment(c), a_scale_inv, b_scale_inv};
  const Fp8PlanKey key{m, n, k, lda, ldb, ldc, static_cast<int>(a_type), static_cast<int>(b_type),
                       shape.align_a, shape.align_b, shape.align_c, context.workspace != nullptr};
  std::unique_lock<std::mutex> lock(state.mutex);
  const auto found = state.plans.find(key);
  Fp8Plan* plan = found != state.plans.end() ? found->second.get() : nullptr;
  if (!plan) {
    // cuBLASLt's heuristic may fail while a stream captures (CUDA 13; see gemm.cu): a shape first
    // met under capture takes the plain kernel, and its plan is made by its first uncaptured call.
    if (capturing(stream)) {
      lock.unlock();
      return plain();
    }
    plan = (state.plans[key] = make_plan(context.lt, shape, context.workspace_bytes)).get();
  }
  if (plan->has_algorithm) {
    const float* lt_a_scale = a_scale_inv;  // mt's A's scale: cuBLASLt's B scale (the TN mapping)
    const float* lt_b_scale = b_scale_inv;
    if (!aligned16(a_scale_inv) || !aligned16(b_scale_inv)) {
      float* copies = scale_copies(state, stream);
      if (!copies) {
        lock.unlock();
        return plain();
      }
      copy_scales_kernel<<<1, 1, 0, as_stream(stream)>>>(a_scale_inv, b_scale_inv, copies);
      check_launch("gemm_fp8 (its scales to 16-byte boundaries)");
      lt_a_scale = copies;
      lt_b_scale = copies + 4;
    }
    set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, lt_b_scale, "A_SCALE_POINTER");
    set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, lt_a_scale, "B_SCALE_POINTER");
    const cublasStatus_t status =
        cublasLtMatmul(context.lt, plan->operation, &alpha, b, plan->lt_a, a, plan->lt_b, &beta, c, plan->out, c,
                       plan->out, &plan->algorithm, context.workspace, context.workspace_bytes, as_stream(stream));
    if (status == CUBLAS_STATUS_SUCCESS) return;
    // An algorithm the heuristic offered but the shape turns down queues nothing: this shape
    // takes the fallback from now on.
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) check_blas(status, "cublasLtMatmul");
    plan->has_algorithm = false;
  }
  lock.unlock();
  plain();
}

void fp8_update_scales(float* amax, float* amax_history, float* scale, float* scale_inv, int64_t tensors,
                       const Fp8ScalingParams& params, void* stream) {
  if (tensors < 0) throw std::invalid_argument("cuda fp8_update_scales: negative tensors = " + std::to_string(tensors));
  if (params.history_len < 1) throw std::invalid_argument("fp8_update_scales: history_len must be >= 1");
  if (tensors == 0) return;
  update_scales_kernel<<<blocks_for(tensors, kThreads), kThreads, 0, as_stream(stream)>>>(amax, amax_history, scale,
                                                                                         scale_inv, tensors, params);
  check_launch("fp8_update_scales");
}

}  // namespace mt::kernels::cuda
