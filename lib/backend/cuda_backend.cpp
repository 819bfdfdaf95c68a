// The CUDA backend's op table (see ops.h): memory, streams, events, copies and conversions from
// kernels/cuda/runtime.h, the GEMM and fused kernels as thin adapters onto kernels/cuda/ops.h (the
// stream handle passed as the cudaStream_t it holds). Asynchronous: entries queue work on their
// stream and return. GEMMs (with cuBLASLt's bias and GELU epilogues too) take native bf16/f16
// operands for --bf16/--fp16 with fp32 accumulation, activations stay fp32 as on the CPU
// (DESIGN.md, "CUDA backend"). Compiled only with the CUDA
// backend (MT_WITH_CUDA), into the object library mt_cuda (backend/cuda_link.h), which installs
// it; backend/registry.cpp hands this table out when a device is usable.
// Tested on a GPU by tests/gpu/test_cuda_runtime.cpp and the op harness (CTest label gpu).
#ifdef MT_WITH_CUDA

#include <stdexcept>
#include <string>

#include "backend/ops.h"
#include "kernels/cpu/moe_permute.h"
#include "kernels/cpu/moe_router.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace mt::backend {
namespace {

namespace cuda = kernels::cuda;

// The CUDA twin of a fused-kernel entry: kernels/cuda's function of the same name, which takes
// the CPU kernel's arguments (kernels/cpu/ops.h, whose signature gives Args here) and the stream.
// The selected device is made current first: CUDA's current device is per host thread.
template <auto Entry, typename Signature>
struct OnCudaStream;
template <auto Entry, typename Result, typename... Args>
struct OnCudaStream<Entry, Result (*)(Args...)> {
  static Result run(Args... args, Stream stream) {
    cuda::bind_selected_device();
    return Entry(args..., stream.handle);
  }
};
#define MT_CUDA_KERNEL(entry) &OnCudaStream<&cuda::entry, decltype(kernels::cpu::CpuOps::entry)>::run

// The fused attention kernels are causal only: the non-causal mode with a key padding mask
// (kernels/common/op_params.h, BERT) is refused by name until they learn it.
void require_causal(const AttentionShape& shape) {
  if (!shape.causal) {
    throw std::invalid_argument("cuda backend: non-causal attention (BERT's padding mask) is not implemented");
  }
}
void attention_forward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                       const int32_t* doc_start, float* out, float* lse, Stream stream) {
  require_causal(shape);
  OnCudaStream<&cuda::attention_forward, decltype(kernels::cpu::CpuOps::attention_forward)>::run(shape, q, k, v, doc_start,
                                                                                              out, lse, stream);
}
void attention_backward(const AttentionShape& shape, const float* q, const float* k, const float* v,
                        const int32_t* doc_start, const float* out, const float* dout, const float* lse, float* dq,
                        float* dk, float* dv, Stream stream) {
  require_causal(shape);
  OnCudaStream<&cuda::attention_backward, decltype(kernels::cpu::CpuOps::attention_backward)>::run(
      shape, q, k, v, doc_start, out, dout, lse, dq, dk, dv, stream);
}

[[noreturn]] void unsupported_conversion(DType in_type, DType out_type) {
  throw std::invalid_argument(std::string("cuda backend: no conversion from ") + dtype_name(in_type) + " to " +
                              dtype_name(out_type));
}

bool is_half(DType type) { return type == DType::bf16 || type == DType::f16; }

cuda::HalfType half_type(DType type) { return type == DType::bf16 ? cuda::HalfType::bf16 : cuda::HalfType::f16; }

cuda::CopyDirection direction(CopyKind kind) {
  switch (kind) {
    case CopyKind::device_to_device: return cuda::CopyDirection::device_to_device;
    case CopyKind::host_to_device: return cuda::CopyDirection::host_to_device;
    case CopyKind::device_to_host: return cuda::CopyDirection::device_to_host;
  }
  throw std::invalid_argument("cuda backend: unknown copy kind");
}

// ---- memory: the device's caching pool; categories share it (the ledger is DeviceBuffer's) ----
void* allocate(int64_t bytes, MemoryCategory) { return cuda::allocate(bytes); }
void release(void* data, int64_t, MemoryCategory) { cuda::release(data); }

// ---- streams and stream order ----
Stream default_stream() { return Stream{cuda::default_stream()}; }
void synchronize(Stream stream) {
  cuda::synchronize(stream.handle);
  cuda::moe_router_take_deferred_error(stream.handle);  // a row id this stream's MoE aux kernels refused
}
void launch_host_function(Stream stream, HostFunction function, void* argument) {
  cuda::launch_host_function(stream.handle, function, argument);
}
Event create_event() { return Event{cuda::create_event()}; }
void destroy_event(Event event) { cuda::destroy_event(event.handle); }
void record_event(Event event, Stream stream) { cuda::record_event(event.handle, stream.handle); }
void synchronize_event(Event event) { cuda::synchronize_event(event.handle); }
double elapsed_seconds(Event start, Event end) { return cuda::elapsed_seconds(start.handle, end.handle); }

// ---- copies, fills, conversions ----
void copy(void* dst, const void* src, int64_t bytes, CopyKind kind, Stream stream) {
  cuda::copy(dst, src, bytes, direction(kind), stream.handle);
}
void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width_bytes, int64_t rows,
             CopyKind kind, Stream stream) {
  cuda::copy_2d(dst, dst_pitch, src, src_pitch, width_bytes, rows, direction(kind), stream.handle);
}
void fill(float* x, int64_t n, float value, Stream stream) { cuda::fill(x, n, value, stream.handle); }
void zero(void* x, int64_t bytes, Stream stream) { cuda::zero(x, bytes, stream.handle); }

void convert(const void* in, DType in_type, void* out, DType out_type, int64_t n, Stream stream) {
  if (in_type == DType::f32 && is_half(out_type)) {
    cuda::float_to_half(static_cast<const float*>(in), static_cast<uint16_t*>(out), n, half_type(out_type),
                        stream.handle);
  } else if (is_half(in_type) && out_type == DType::f32) {
    cuda::half_to_float(static_cast<const uint16_t*>(in), static_cast<float*>(out), n, half_type(in_type),
                        stream.handle);
  } else {
    unsupported_conversion(in_type, out_type);
  }
}

void round_through(const float* in, float* out, int64_t n, DType through, Stream stream) {
  if (!is_half(through)) unsupported_conversion(DType::f32, through);
  cuda::round_through(in, out, n, half_type(through), stream.handle);
}

// ---- GEMM: native 16-bit operands with fp32 accumulation; f32 operands never through TF32 ----
DType gemm_operand_type(Precision precision) {
  switch (precision) {
    case Precision::fp32: return DType::f32;
    case Precision::bf16: return DType::bf16;
    case Precision::fp16: return DType::f16;
  }
  return DType::f32;
}

cuda::GemmOperand gemm_operand(DType type) {
  switch (type) {
    case DType::f32: return cuda::GemmOperand::f32;
    case DType::bf16: return cuda::GemmOperand::bf16;
    case DType::f16: return cuda::GemmOperand::f16;
    default: throw std::invalid_argument(std::string("cuda backend: no GEMM on ") + dtype_name(type) + " operands");
  }
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
          const void* b, int64_t ldb, float beta, float* c, int64_t ldc, DType operand_type, Stream stream) {
  const cuda::GemmOperand operand = gemm_operand(operand_type);
  cuda::bind_selected_device();
  cuda::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, operand, stream.handle);
}

// The fused GEMMs: cuBLASLt's epilogues, or the unfused kernels where it turns a shape down (gemm.cu).
void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
               const void* b, int64_t ldb, const float* bias, float* c, DType operand_type, Stream stream) {
  const cuda::GemmOperand operand = gemm_operand(operand_type);
  cuda::bind_selected_device();
  cuda::gemm_bias(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, c, operand, stream.handle);
}

void gemm_bias_gelu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                    const void* b, int64_t ldb, const float* bias, float* pre, float* y, DType operand_type,
                    Stream stream) {
  const cuda::GemmOperand operand = gemm_operand(operand_type);
  cuda::bind_selected_device();
  cuda::gemm_bias_gelu(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, pre, y, operand, stream.handle);
}

// ---- reductions into device memory (their signatures differ from the CPU kernels' return values) ----
void xent_loss_sums(const float* row_max, const float* row_sumexp, const float* target_logit, const float* loss_mask,
                    int64_t rows, double* loss_sum, double* mask_sum, Stream stream) {
  cuda::bind_selected_device();
  cuda::xent_loss_sums(row_max, row_sumexp, target_logit, loss_mask, rows, loss_sum, mask_sum, stream.handle);
}

void sum_squares(const float* x, int64_t n, double* sum, Stream stream) {
  cuda::bind_selected_device();
  cuda::sum_squares(x, n, sum, stream.handle);
}

void all_finite(const float* x, int64_t n, int32_t* finite, Stream stream) {
  cuda::bind_selected_device();
  cuda::all_finite(x, n, finite, stream.handle);
}

// ---- MoE (issue 22): router, experts and dispatcher kernels of kernels/cuda (moe_*.cu) --------
// The CUDA twin of an entry served by a plain kernels/cpu function: kernels/cuda's function of the
// same name with that function's arguments and the stream.
#define MT_CUDA_FUNCTION(function) &OnCudaStream<&cuda::function, decltype(&kernels::cpu::function)>::run

void moe_router_z_loss_sum(const float* logits, int64_t rows, int experts, double* sum, Stream stream) {
  cuda::bind_selected_device();
  cuda::moe_router_z_loss_sum(logits, rows, experts, sum, stream.handle);
}

cuda::GemmOperand grouped_gemm_operand(DType type) {
  if (type != DType::f32 && type != DType::bf16)
    throw std::invalid_argument(std::string("cuda backend: no grouped GEMM on ") + dtype_name(type) + " operands");
  return gemm_operand(type);
}

void grouped_gemm(bool trans_b, int64_t groups, const int64_t* group_rows, int64_t n, int64_t k, float alpha,
                  const void* a, int64_t lda, const void* b, int64_t ldb, int64_t b_group_stride, float beta, float* c,
                  int64_t ldc, DType operand_type, Stream stream) {
  const cuda::GemmOperand operand = grouped_gemm_operand(operand_type);
  cuda::bind_selected_device();
  cuda::grouped_gemm(trans_b, groups, group_rows, n, k, alpha, a, lda, b, ldb, b_group_stride, beta, c, ldc, operand,
                     stream.handle);
}

void grouped_gemm_ragged_k(int64_t groups, const int64_t* group_depths, int64_t m, int64_t n, float alpha,
                           const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c, int64_t ldc,
                           int64_t c_group_stride, DType operand_type, Stream stream) {
  const cuda::GemmOperand operand = grouped_gemm_operand(operand_type);
  cuda::bind_selected_device();
  cuda::grouped_gemm_ragged_k(groups, group_depths, m, n, alpha, a, lda, b, ldb, beta, c, ldc, c_group_stride, operand,
                              stream.handle);
}

void moe_scale_rows(const float* x, const float* scale, float* y, int64_t rows, int cols, Stream stream) {
  cuda::bind_selected_device();
  cuda::moe_scale_rows(x, scale, y, rows, cols, stream.handle);
}

void moe_scale_rows_backward(const float* dy, const float* x, const float* scale, float* dx, float* d_scale,
                             int64_t rows, int cols, Stream stream) {
  cuda::bind_selected_device();
  cuda::moe_scale_rows_backward(dy, x, scale, dx, d_scale, rows, cols, stream.handle);
}
// ---- end of MoE

// ---- FP8 (issue 23): kernels/cuda/fp8.cu, the contracts in ops.h ----
void fp8_quantize(const float* x, int64_t n, const float* scale, kernels::Fp8Type type, uint8_t* out, float* amax,
                  Stream stream) {
  cuda::bind_selected_device();
  cuda::fp8_quantize(x, n, scale, type, out, amax, stream.handle);
}

void fp8_transpose(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out, Stream stream) {
  cuda::bind_selected_device();
  cuda::fp8_transpose(in, rows, cols, out, stream.handle);
}

void gemm_fp8(int64_t m, int64_t n, int64_t k, float alpha, const uint8_t* a, kernels::Fp8Type a_type,
              const float* a_scale_inv, int64_t lda, const uint8_t* b, kernels::Fp8Type b_type,
              const float* b_scale_inv, int64_t ldb, float beta, float* c, int64_t ldc, Stream stream) {
  cuda::bind_selected_device();
  cuda::gemm_fp8(m, n, k, alpha, a, a_type, a_scale_inv, lda, b, b_type, b_scale_inv, ldb, beta, c, ldc,
                 stream.handle);
}

void fp8_update_scales(float* amax, float* amax_history, float* scale, float* scale_inv, int64_t tensors,
                       const kernels::Fp8ScalingParams& params, Stream stream) {
  cuda::bind_selected_device();
  cuda::fp8_update_scales(amax, amax_history, scale, scale_inv, tensors, params, stream.handle);
}

// What CUDA runs (see Ops::supports): GEMMs on f32, bf16 and f16 operands; conversions between f32
// and bf16/f16; fill and the fused kernels on f32; the FP8 byte
// transpose on any type, as the CPU.
bool supports(OpId op, DType dtype) {
  switch (op) {
    case OpId::allocate:
    case OpId::release:
    case OpId::default_stream:
    case OpId::synchronize:
    case OpId::launch_host_function:
    case OpId::create_event:
    case OpId::destroy_event:
    case OpId::record_event:
    case OpId::synchronize_event:
    case OpId::elapsed_seconds:
    case OpId::copy:
    case OpId::copy_2d:
    case OpId::zero:
    case OpId::fp8_transpose:
    case OpId::gemm_operand_type: return true;
    case OpId::gemm:
    case OpId::gemm_bias:
    case OpId::gemm_bias_gelu: return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
    case OpId::grouped_gemm:
    case OpId::grouped_gemm_ragged_k: return dtype == DType::f32 || dtype == DType::bf16;  // as the CPU's
    case OpId::convert:
    case OpId::round_through: return dtype == DType::bf16 || dtype == DType::f16;
    default: return dtype == DType::f32;  // fill and the fused kernels
  }
}

}  // namespace

const Ops& cuda_ops() {
  static const Ops table{
      .name = "cuda",
      .device = Device::cuda,
      .synchronous = false,
      .supports = supports,
      .allocate = allocate,
      .release = release,
      .default_stream = default_stream,
      .synchronize = synchronize,
      .launch_host_function = launch_host_function,
      .create_event = create_event,
      .destroy_event = destroy_event,
      .record_event = record_event,
      .synchronize_event = synchronize_event,
      .elapsed_seconds = elapsed_seconds,
      .copy = copy,
      .copy_2d = copy_2d,
      .fill = fill,
      .zero = zero,
      .convert = convert,
      .round_through = round_through,
      .gemm_operand_type = gemm_operand_type,
      .gemm = gemm,
      .gemm_bias = gemm_bias,
      .gemm_bias_gelu = gemm_bias_gelu,
      .layernorm_forward = MT_CUDA_KERNEL(layernorm_forward),
      .layernorm_backward = MT_CUDA_KERNEL(layernorm_backward),
      .rmsnorm_forward = MT_CUDA_KERNEL(rmsnorm_forward),
      .rmsnorm_backward = MT_CUDA_KERNEL(rmsnorm_backward),
      .gelu_forward = MT_CUDA_KERNEL(gelu_forward),
      .gelu_backward = MT_CUDA_KERNEL(gelu_backward),
      .gelu_erf_forward = MT_CUDA_KERNEL(gelu_erf_forward),
      .gelu_erf_backward = MT_CUDA_KERNEL(gelu_erf_backward),
      .tanh_forward = MT_CUDA_KERNEL(tanh_forward),
      .tanh_backward = MT_CUDA_KERNEL(tanh_backward),
      .swiglu_forward = MT_CUDA_KERNEL(swiglu_forward),
      .swiglu_backward = MT_CUDA_KERNEL(swiglu_backward),
      .rope_forward = MT_CUDA_KERNEL(rope_forward),
      .rope_backward = MT_CUDA_KERNEL(rope_backward),
      .rope_yarn_forward = MT_CUDA_KERNEL(rope_yarn_forward),
      .rope_yarn_backward = MT_CUDA_KERNEL(rope_yarn_backward),
      .attention_forward = attention_forward,
      .attention_backward = attention_backward,
      .attention_merge = MT_CUDA_KERNEL(attention_merge),
      .embedding_forward = MT_CUDA_KERNEL(embedding_forward),
      .embedding_backward = MT_CUDA_KERNEL(embedding_backward),
      .xent_row_max = MT_CUDA_KERNEL(xent_row_max),
      .xent_row_sumexp = MT_CUDA_KERNEL(xent_row_sumexp),
      .xent_target_logit = MT_CUDA_KERNEL(xent_target_logit),
      .xent_backward = MT_CUDA_KERNEL(xent_backward),
      .xent_loss_sums = xent_loss_sums,
      .add_inplace = MT_CUDA_KERNEL(add_inplace),
      .scale_inplace = MT_CUDA_KERNEL(scale_inplace),
      .bias_add = MT_CUDA_KERNEL(bias_add),
      .bias_backward = MT_CUDA_KERNEL(bias_backward),
      .sum_squares = sum_squares,
      .all_finite = all_finite,
      .dropout_forward = MT_CUDA_KERNEL(dropout_forward),
      .dropout_backward = MT_CUDA_KERNEL(dropout_backward),
      .adamw_update = MT_CUDA_KERNEL(adamw_update),
      // MoE router, experts and token dispatcher (issue 22: kernels/cuda/moe_*.cu)
      .moe_router_topk = MT_CUDA_FUNCTION(moe_router_topk),
      .moe_router_topk_backward = MT_CUDA_FUNCTION(moe_router_topk_backward),
      .moe_router_aux_sums = MT_CUDA_FUNCTION(moe_router_aux_sums),
      .moe_router_aux_backward = MT_CUDA_FUNCTION(moe_router_aux_backward),
      .moe_router_z_loss_sum = moe_router_z_loss_sum,
      .moe_router_z_loss_backward = MT_CUDA_FUNCTION(moe_router_z_loss_backward),
      .moe_router_capacity_drop = MT_CUDA_FUNCTION(moe_router_capacity_drop),
      .moe_router_tokens_per_expert = MT_CUDA_FUNCTION(moe_router_tokens_per_expert),
      .moe_router_expert_bias_update = MT_CUDA_FUNCTION(moe_router_expert_bias_update),
      .grouped_gemm = grouped_gemm,
      .grouped_gemm_ragged_k = grouped_gemm_ragged_k,
      .moe_scale_rows = moe_scale_rows,
      .moe_scale_rows_backward = moe_scale_rows_backward,
      .moe_expert_counts = MT_CUDA_FUNCTION(moe_expert_counts),
      .moe_route_index = MT_CUDA_FUNCTION(moe_route_index),
      .moe_permute_rows = MT_CUDA_FUNCTION(moe_permute_rows),
      .moe_unpermute_rows = MT_CUDA_FUNCTION(moe_unpermute_rows),
      .moe_unroute_probs = MT_CUDA_FUNCTION(moe_unroute_probs),
      .moe_sort_chunks = MT_CUDA_FUNCTION(moe_sort_chunks),
      // FP8 (issue 23): kernels/cuda/fp8.cu; gemm_fp8 refuses devices below compute capability 8.9.
      .fp8_quantize = fp8_quantize,
      .fp8_transpose = fp8_transpose,
      .gemm_fp8 = gemm_fp8,
      .fp8_update_scales = fp8_update_scales,
  };
  return table;
}

}  // namespace mt::backend

#endif  // MT_WITH_CUDA
