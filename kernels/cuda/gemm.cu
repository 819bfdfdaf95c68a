// The CUDA GEMM entry of kernels/cuda/ops.h: C = alpha op(A) op(B) + beta C, row-major, A and B
// fp32, bf16 or fp16, C fp32, always accumulated in fp32 (CUBLAS_COMPUTE_32F: never TF32, so the
// CUDA-vs-CPU comparison of fp32 runs is fair). Row-major is reached by the usual transpose trick:
// row-major C (m x n, ldc) is column-major C^T (n x m), and C^T = op(B)^T op(A)^T, so cuBLASLt
// multiplies the B buffer (op = trans_b) by the A buffer (op = trans_a) in column-major terms
// (gemm_layout.h, whose mapping tests/unit/kernels/test_cuda_math.cpp checks on the host).
//
// State, created once per device at its first GEMM (a one-time cudaMalloc and handle creation,
// so that first GEMM must not run under stream capture) and never freed (the CUDA context outlives
// it): one cuBLASLt handle and one cuBLAS handle, kWorkspaceSlots workspaces of 32 MiB, and a
// cache of matmul descriptors, layouts and the heuristic's algorithm per shape key (transposes,
// m, n, k, lds, operand type, pointer alignments, workspace or not). GEMMs on different streams
// may overlap, so no two streams share a workspace: streams take the slots in the order they
// first call gemm, and streams past the last slot run the workspace-free algorithms. Later calls
// never allocate, copy to or from the host or synchronise, so they may run under stream capture;
// a shape first met under capture runs the cublasGemmEx fallback (cuBLASLt's heuristic may fail
// while a stream captures) and gets its plan at its first uncaptured call.
// The FP8 GEMM (fp8.cu) takes the same handle and per-stream workspaces (lt_context.h).
// Where the heuristic offers no algorithm (e.g. odd leading dimensions of 16-bit operands) the
// call falls back to cublasGemmEx with the same compute type and the stream's workspace. k = 0
// scales C by beta as BLAS does (beta = 0 writes zeros); m = 0 or n = 0 does nothing, as
// kernels/cpu/gemm.cpp.
//
// No epilogue fusion: the backend op table has no bias+GELU GEMM entry today, so bias and
// activation stay separate kernels (elementwise.cu). Tested on a GPU by the op harness
// (tests/gpu/test_cuda_op_harness.cpp) against double-precision references on odd shapes.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "kernels/cuda/gemm_layout.h"
#include "kernels/cuda/lt_context.h"
#include "kernels/cuda/ops.h"

namespace mt::kernels::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr size_t kWorkspaceSlots = 4;

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("cuda gemm: ") + what + ": " + cudaGetErrorString(status));
}

void check_blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuda gemm: ") + what + ": " + cublasGetStatusString(status));
}

cudaDataType_t data_type(GemmOperand operand) {
  switch (operand) {
    case GemmOperand::f32: return CUDA_R_32F;
    case GemmOperand::bf16: return CUDA_R_16BF;
    case GemmOperand::f16: return CUDA_R_16F;
  }
  throw std::invalid_argument("cuda gemm: unknown operand type");
}

// The largest power of two (at most 256) dividing the address: the alignment cuBLASLt may assume.
uint32_t pointer_alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

cublasOperation_t op_of(const ColumnMajorMatrix& matrix) { return matrix.transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, uint32_t,
                           uint32_t, uint32_t, bool>;

// Descriptors of one shape and the heuristic's algorithm for it (has_algorithm false: fall back).
struct Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulAlgo_t algorithm{};
  bool has_algorithm = false;
};

struct DeviceState {
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  std::mutex mutex;                             // guards the members below and the cuBLAS handle's stream
  void* workspace_slots[kWorkspaceSlots] = {};  // kWorkspaceBytes of device memory each
  std::map<void*, void*> workspaces;            // stream -> its slot, or nullptr once the slots ran out
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};

// The state of the current device, created at its first GEMM. Never destroyed: handles and
// workspaces would outlive the CUDA context at exit otherwise.
DeviceState& device_state() {
  static std::mutex registry_mutex;
  static auto* registry = new std::map<int, std::unique_ptr<DeviceState>>();
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(registry_mutex);
  std::unique_ptr<DeviceState>& state = (*registry)[device];
  if (!state) {
    auto created = std::make_unique<DeviceState>();
    check_blas(cublasLtCreate(&created->lt), "cublasLtCreate");
    check_blas(cublasCreate(&created->blas), "cublasCreate");
    check_blas(cublasSetMathMode(created->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    for (void*& slot : created->workspace_slots)
      check(cudaMalloc(&slot, kWorkspaceBytes), "cudaMalloc of a GEMM workspace");
    state = std::move(created);
  }
  return *state;
}

// The workspace of `stream`, or nullptr (no workspace) when every slot went to earlier streams.
// Caller holds state.mutex.
void* stream_workspace(DeviceState& state, void* stream) {
  const auto found = state.workspaces.find(stream);
  if (found != state.workspaces.end()) return found->second;
  const size_t taken = state.workspaces.size();
  void* workspace = taken < kWorkspaceSlots ? state.workspace_slots[taken] : nullptr;
  state.workspaces.emplace(stream, workspace);
  return workspace;
}

size_t workspace_bytes(const void* workspace) { return workspace ? kWorkspaceBytes : 0; }

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, const ColumnMajorMatrix& matrix) {
  cublasLtMatrixLayout_t layout = nullptr;
  check_blas(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(matrix.rows),
                                        static_cast<uint64_t>(matrix.cols), matrix.ld),
             "cublasLtMatrixLayoutCreate");
  return layout;
}

void set_alignment(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                   uint32_t alignment) {
  check_blas(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof alignment),
             "cublasLtMatmulPreferenceSetAttribute");
}

// Builds the descriptors of `problem` and asks the heuristic for one algorithm that respects the
// operands' actual pointer alignments.
std::unique_ptr<Plan> make_plan(cublasLtHandle_t lt, const ColumnMajorGemm& problem, GemmOperand operand,
                                uint32_t align_a, uint32_t align_b, uint32_t align_c, uint64_t max_workspace_bytes) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t type = data_type(operand);
  check_blas(cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_first = op_of(problem.first), op_second = op_of(problem.second);
  check_blas(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first),
             "cublasLtMatmulDescSetAttribute(TRANSA)");
  check_blas(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                            sizeof op_second),
             "cublasLtMatmulDescSetAttribute(TRANSB)");
  plan->first = make_layout(type, problem.first);
  plan->second = make_layout(type, problem.second);
  plan->out = make_layout(CUDA_R_32F, problem.out);

  cublasLtMatmulPreference_t preference = nullptr;
  check_blas(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  check_blas(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &max_workspace_bytes, sizeof max_workspace_bytes),
             "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  // cuBLASLt's A is our B buffer and its B our A buffer; C and D are the same buffer.
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b);
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a);
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
  set_alignment(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c);
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt, plan->operation, plan->first, plan->second,
                                                               plan->out, plan->out, preference, 1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan->algorithm = result.algo;
    plan->has_algorithm = true;
  }
  return plan;
}

int to_int(int64_t value, const char* name) {
  if (value < 0 || value > INT_MAX)
    throw std::invalid_argument(std::string("cuda gemm: ") + name + " = " + std::to_string(value) +
                                " does not fit the cublasGemmEx fallback");
  return static_cast<int>(value);
}

// The fallback for shapes the heuristic turns down. Caller holds state.mutex (the handle's stream).
void gemm_ex(DeviceState& state, const ColumnMajorGemm& problem, float alpha, const void* a, const void* b,
             float beta, float* c, GemmOperand operand, void* stream, void* workspace) {
  const cudaDataType_t type = data_type(operand);
  check_blas(cublasSetStream(state.blas, as_stream(stream)), "cublasSetStream");
  // Always a workspace of ours (or none): cuBLAS's default pool would allocate on first use.
  check_blas(cublasSetWorkspace(state.blas, workspace, workspace_bytes(workspace)), "cublasSetWorkspace");
  check_blas(cublasGemmEx(state.blas, op_of(problem.first), op_of(problem.second), to_int(problem.rows, "n"),
                          to_int(problem.cols, "m"), to_int(problem.inner, "k"), &alpha, b, type,
                          to_int(problem.first.ld, "ldb"), a, type, to_int(problem.second.ld, "lda"), &beta, c,
                          CUDA_R_32F, to_int(problem.out.ld, "ldc"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
}

// C(m x n, ldc) = beta C, zeros when beta = 0 (BLAS: C is not read then). One thread per element.
__global__ void scale_c_kernel(float* c, int64_t m, int64_t n, int64_t ldc, float beta) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float& value = c[(i / n) * ldc + i % n];
    value = beta == 0.0f ? 0.0f : beta * value;
  }
}

void scale_c(float* c, int64_t m, int64_t n, int64_t ldc, float beta, void* stream) {
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((m * n + kThreads - 1) / kThreads, 65535);
  scale_c_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, as_stream(stream)>>>(c, m, n, ldc, beta);
  check(cudaGetLastError(), "scale_c_kernel launch (k = 0)");
}

// Whether `stream` is capturing work into a graph (a failed query counts as capturing: the legacy
// stream answers an error while another stream captures).
bool capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(as_stream(stream), &status) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

void check_shape(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                 int64_t ldc) {
  const auto fail = [&](const std::string& what) {
    throw std::invalid_argument("cuda gemm: " + what + " (m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                " k=" + std::to_string(k) + " lda=" + std::to_string(lda) +
                                " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc) + ")");
  };
  if (m < 0 || n < 0 || k < 0) fail("negative dimension");
  if (lda < std::max<int64_t>(1, trans_a ? m : k)) fail("lda smaller than a row of A");
  if (ldb < std::max<int64_t>(1, trans_b ? k : n)) fail("ldb smaller than a row of B");
  if (ldc < std::max<int64_t>(1, n)) fail("ldc smaller than a row of C");
}

}  // namespace

LtStreamContext lt_stream_context(void* stream) {
  DeviceState& state = device_state();
  const std::lock_guard<std::mutex> lock(state.mutex);
  void* workspace = stream_workspace(state, stream);
  return LtStreamContext{state.lt, workspace, workspace_bytes(workspace)};
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
          const void* b, int64_t ldb, float beta, float* c, int64_t ldc, GemmOperand operand, void* stream) {
  if (m == 0 || n == 0) return;
  check_shape(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (k == 0) {
    scale_c(c, m, n, ldc, beta, stream);
    return;
  }
  DeviceState& state = device_state();
  const ColumnMajorGemm problem = column_major_gemm(trans_a, trans_b, m, n, k, lda, ldb, ldc);
  const uint32_t align_a = pointer_alignment(a), align_b = pointer_alignment(b), align_c = pointer_alignment(c);
  std::unique_lock<std::mutex> lock(state.mutex);
  void* workspace = stream_workspace(state, stream);
  const PlanKey key{trans_a, trans_b, m,       n,       k,       lda, ldb, ldc, static_cast<int>(operand),
                    align_a, align_b, align_c, workspace != nullptr};
  std::unique_ptr<Plan>& plan = state.plans[key];
  if (!plan && capturing(stream)) {
    // cuBLASLt's heuristic may fail while a stream captures (CUDA 13): a shape first met under
    // capture takes the fallback, and its plan is made by its first uncaptured call.
    state.plans.erase(key);
    gemm_ex(state, problem, alpha, a, b, beta, c, operand, stream, workspace);
    return;
  }
  if (!plan) plan = make_plan(state.lt, problem, operand, align_a, align_b, align_c, workspace_bytes(workspace));
  if (!plan->has_algorithm) {
    gemm_ex(state, problem, alpha, a, b, beta, c, operand, stream, workspace);
    return;
  }
  const Plan ready = *plan;  // descriptors live as long as the cache; the copy is read unlocked
  lock.unlock();
  const cublasStatus_t status =
      cublasLtMatmul(state.lt, ready.operation, &alpha, b, ready.first, a, ready.second, &beta, c, ready.out, c,
                     ready.out, &ready.algorithm, workspace, workspace_bytes(workspace), as_stream(stream));
  if (status == CUBLAS_STATUS_SUCCESS) return;
  // An algorithm the heuristic offered but the shape turns down queues nothing: this shape
  // takes the fallback from now on.
  if (status != CUBLAS_STATUS_NOT_SUPPORTED) check_blas(status, "cublasLtMatmul");
  lock.lock();
  plan->has_algorithm = false;
  gemm_ex(state, problem, alpha, a, b, beta, c, operand, stream, workspace);
}

}  // namespace mt::kernels::cuda
