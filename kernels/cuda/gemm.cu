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
// Epilogues (gemm_bias, gemm_bias_gelu): the same plans with cuBLASLt's CUBLASLT_EPILOGUE_BIAS,
// _GELU_AUX_BIAS or _GELU_AUX (no bias), alpha 1 and beta 0; the bias is fp32 (the output's type,
// cuBLASLt's default) and GELU_AUX writes the GELU's input, the pre-activation gelu_backward
// takes, as the aux matrix in the output's layout. The plan key holds the epilogue and the bias
// and aux pointers' alignments (the heuristic reads them); a call points the cached descriptor at
// its own bias and aux while it holds the state's lock, until cublasLtMatmul has queued the work.
// cuBLASLt's documentation and cublasLt.h name no GELU formula; its GELU is taken to be the tanh
// approximation (gelu_forward's: published cuBLASLt outputs give gelu(1) = 0.841194, tanh's
// 0.841192, not erf's 0.841345), and the op harness holds the epilogue's output to the tanh GELU
// of its own pre-activation within 5e-5 of max(|y|, 1), which erf's GELU misses by up to 4.7e-4,
// so a GPU run settles it. Where no epilogue runs (the GELU's aux leading dimension n not a
// multiple of 8: cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD; k = 0; no algorithm from the
// heuristic; an algorithm cuBLASLt then turns down; a shape first met under stream capture) the
// call runs gemm, bias_add and gelu_forward (elementwise.cu) instead and counts itself
// (gemm_epilogue_fallback_calls): it never fails for want of an epilogue. Tested on a GPU by the op harness (tests/gpu/test_cuda_op_harness.cpp) against
// double-precision references on odd shapes, fused and fallen back.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
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

// The epilogue a GEMM ends with (cuBLASLt's CUBLASLT_EPILOGUE_ of the same name).
enum class Epilogue : int { none, bias, gelu_aux, gelu_aux_bias };

// One call's epilogue and its device buffers: bias (n floats) and aux (the GELU's input, laid out
// as the output).
struct EpilogueCall {
  Epilogue kind = Epilogue::none;
  const float* bias = nullptr;
  float* aux = nullptr;
};

cublasLtEpilogue_t lt_epilogue(Epilogue epilogue) {
  switch (epilogue) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  }
  throw std::invalid_argument("cuda gemm: unknown epilogue");
}

// Transposes, m, n, k, lds, operand type, the operands' alignments, workspace or not, then the
// epilogue and its bias and aux alignments (0 without).
using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, uint32_t,
                           uint32_t, uint32_t, bool, int, uint32_t, uint32_t>;

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

void set_attribute(cublasLtMatmulDesc_t operation, cublasLtMatmulDescAttributes_t attribute, const void* value,
                   size_t size, const char* what) {
  check_blas(cublasLtMatmulDescSetAttribute(operation, attribute, value, size), what);
}

// Points `operation` at the call's bias and aux buffers. Caller holds state.mutex when the
// descriptor is a cached plan's.
void set_epilogue_pointers(cublasLtMatmulDesc_t operation, const EpilogueCall& epilogue) {
  if (epilogue.bias) {
    set_attribute(operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epilogue.bias, sizeof epilogue.bias,
                  "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  if (epilogue.aux) {
    set_attribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &epilogue.aux, sizeof epilogue.aux,
                  "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
  }
}

void set_alignment(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                   uint32_t alignment) {
  check_blas(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof alignment),
             "cublasLtMatmulPreferenceSetAttribute");
}

// Builds the descriptors of `problem` and asks the heuristic for one algorithm that respects the
// operands' actual pointer alignments.
std::unique_ptr<Plan> make_plan(cublasLtHandle_t lt, const ColumnMajorGemm& problem, GemmOperand operand,
                                const EpilogueCall& epilogue, uint32_t align_a, uint32_t align_b, uint32_t align_c,
                                uint64_t max_workspace_bytes) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t type = data_type(operand);
  check_blas(cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_first = op_of(problem.first), op_second = op_of(problem.second);
  check_blas(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first),
             "cublasLtMatmulDescSetAttribute(TRANSA)");
  check_blas(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                            sizeof op_second),
             "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (epilogue.kind != Epilogue::none) {
    const cublasLtEpilogue_t kind = lt_epilogue(epilogue.kind);
    set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &kind, sizeof kind,
                  "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    if (epilogue.aux) {
      const int64_t aux_ld = problem.out.ld;  // the aux matrix is laid out as the output
      set_attribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld,
                    "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)");
    }
    set_epilogue_pointers(plan->operation, epilogue);  // the heuristic reads their alignments
  }
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

// Queues D = alpha op(A) op(B) + beta C (C = D = c) with `epilogue` through cuBLASLt's cached
// plan for the shape. False, with nothing queued, where there is none: the heuristic offered no
// algorithm, cuBLASLt turned the offered one down (remembered for the shape), or the shape is
// first met while the stream captures (cuBLASLt's heuristic may fail then, CUDA 13: its plan is
// made by its first uncaptured call).
bool lt_matmul(DeviceState& state, const ColumnMajorGemm& problem, float alpha, const void* a, const void* b,
               float beta, float* c, GemmOperand operand, const EpilogueCall& epilogue, void* stream) {
  const uint32_t align_a = pointer_alignment(a), align_b = pointer_alignment(b), align_c = pointer_alignment(c);
  const uint32_t align_bias = epilogue.bias ? pointer_alignment(epilogue.bias) : 0;
  const uint32_t align_aux = epilogue.aux ? pointer_alignment(epilogue.aux) : 0;
  // problem is column-major: rows n, cols m, first = the B buffer, second = the A buffer.
  const bool trans_a = problem.second.transposed, trans_b = problem.first.transposed;
  std::unique_lock<std::mutex> lock(state.mutex);
  void* workspace = stream_workspace(state, stream);
  const PlanKey key{trans_a,       trans_b,  problem.cols,    problem.rows, problem.inner,
                    problem.second.ld, problem.first.ld, problem.out.ld, static_cast<int>(operand),
                    align_a,       align_b,  align_c,         workspace != nullptr,
                    static_cast<int>(epilogue.kind), align_bias, align_aux};
  std::unique_ptr<Plan>& plan = state.plans[key];
  if (!plan && capturing(stream)) {
    state.plans.erase(key);
    return false;
  }
  if (!plan) {
    plan = make_plan(state.lt, problem, operand, epilogue, align_a, align_b, align_c, workspace_bytes(workspace));
  }
  if (!plan->has_algorithm) return false;
  Plan* const cached = plan.get();  // map nodes stay put
  const Plan ready = *cached;       // descriptors live as long as the cache
  if (epilogue.kind == Epilogue::none) {
    lock.unlock();  // a plain plan's descriptor is never written again: queued unlocked
  } else {
    set_epilogue_pointers(ready.operation, epilogue);  // held until queued: the descriptor is shared
  }
  const cublasStatus_t status =
      cublasLtMatmul(state.lt, ready.operation, &alpha, b, ready.first, a, ready.second, &beta, c, ready.out, c,
                     ready.out, &ready.algorithm, workspace, workspace_bytes(workspace), as_stream(stream));
  if (status == CUBLAS_STATUS_SUCCESS) return true;
  // An algorithm the heuristic offered but the shape turns down queues nothing: this shape
  // takes the fallback from now on.
  if (status != CUBLAS_STATUS_NOT_SUPPORTED) check_blas(status, "cublasLtMatmul");
  if (!lock.owns_lock()) lock.lock();
  cached->has_algorithm = false;
  return false;
}

std::atomic<int64_t> epilogue_fallbacks{0};

// out (m, n, contiguous) = op(A) op(B) with `epilogue`, alpha 1 and beta 0, through cuBLASLt:
// false, with nothing queued, where no epilogue runs (the caller runs the unfused kernels).
bool fused_epilogue(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                    const void* b, int64_t ldb, const EpilogueCall& epilogue, float* out, GemmOperand operand,
                    void* stream) {
  if (m == 0 || n == 0) return true;
  check_shape(trans_a, trans_b, m, n, k, lda, ldb, n);
  // The GELU's aux leading dimension (n, column-major) must be a multiple of 8 (cublasLt.h).
  if (k == 0 || (epilogue.aux && n % 8 != 0)) return false;
  return lt_matmul(device_state(), column_major_gemm(trans_a, trans_b, m, n, k, lda, ldb, n), 1.0f, a, b, 0.0f, out,
                   operand, epilogue, stream);
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
  if (lt_matmul(state, problem, alpha, a, b, beta, c, operand, EpilogueCall{}, stream)) return;
  const std::lock_guard<std::mutex> lock(state.mutex);
  gemm_ex(state, problem, alpha, a, b, beta, c, operand, stream, stream_workspace(state, stream));
}

void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const void* b,
               int64_t ldb, const float* bias, float* c, GemmOperand operand, void* stream) {
  if (!bias) throw std::invalid_argument("cuda gemm_bias: the bias is null");
  if (fused_epilogue(trans_a, trans_b, m, n, k, a, lda, b, ldb, EpilogueCall{Epilogue::bias, bias, nullptr}, c,
                     operand, stream)) {
    return;
  }
  ++epilogue_fallbacks;
  gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n, operand, stream);
  bias_add(c, bias, m, static_cast<int>(n), stream);
}

void gemm_bias_gelu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                    const void* b, int64_t ldb, const float* bias, float* pre, float* y, GemmOperand operand,
                    void* stream) {
  const EpilogueCall epilogue{bias ? Epilogue::gelu_aux_bias : Epilogue::gelu_aux, bias, pre};
  if (fused_epilogue(trans_a, trans_b, m, n, k, a, lda, b, ldb, epilogue, y, operand, stream)) return;
  ++epilogue_fallbacks;
  gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, pre, n, operand, stream);
  if (bias) bias_add(pre, bias, m, static_cast<int>(n), stream);
  gelu_forward(pre, y, m * n, stream);
}

int64_t gemm_epilogue_fallback_calls() { return epilogue_fallbacks.load(); }

}  // namespace mt::kernels::cuda
