// The CPU backend's op table (see ops.h): host memory, memcpy copies, kernels/cpu conversions and
// fused kernels at the active ISA level, oneDNN GEMMs on f32 and bf16 operands; synchronous, so
// host functions run at once and events read the host clock. The fused GEMM entries are gemm
// followed by the fused kernels, so CPU numbers do not change with them.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include "backend/ops.h"
#include "core/clock.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/moe_router.h"
#include "kernels/cpu/grouped_gemm.h"
#include "kernels/cpu/moe_expert_ops.h"
#include "kernels/cpu/moe_permute.h"
#include "kernels/cpu/ops.h"

namespace mt::backend {
namespace {

using kernels::cpu::CpuOps;

// The CPU twin of a fused-kernel entry: the kernels/cpu entry of the active ISA level, called
// with the stream dropped (CPU ops complete before they return).
template <auto Entry, typename Signature>
struct OnStream;
template <auto Entry, typename Result, typename... Args>
struct OnStream<Entry, Result (*)(Args...)> {
  static Result run(Args... args, Stream) { return (kernels::cpu::cpu_ops().*Entry)(args...); }
};
#define MT_CPU_KERNEL(entry) &OnStream<&CpuOps::entry, decltype(CpuOps::entry)>::run

// The CPU twin of an entry served by a plain kernels/cpu function (one build for every ISA level).
template <auto Function, typename Signature = decltype(Function)>
struct PlainOnStream;
template <auto Function, typename Result, typename... Args>
struct PlainOnStream<Function, Result (*)(Args...)> {
  static Result run(Args... args, Stream) { return Function(args...); }
};
#define MT_CPU_FUNCTION(function) &PlainOnStream<&kernels::cpu::function>::run

void* allocate(int64_t bytes, MemoryCategory) {
  if (bytes <= 0) return nullptr;
  const size_t rounded = (static_cast<size_t>(bytes) + 63) / 64 * 64;
  void* data = std::aligned_alloc(64, rounded);
  if (!data) throw std::bad_alloc();
  std::memset(data, 0, rounded);
  return data;
}

void release(void* data, int64_t, MemoryCategory) { std::free(data); }

Stream default_stream() { return Stream{}; }

void synchronize(Stream) {}

// ---- stream order: every op has finished when it returns, so host work runs at once and an
// event is the host clock when it is recorded.
using Clock = std::chrono::steady_clock;

void launch_host_function(Stream, HostFunction function, void* argument) { function(argument); }

// An event's handle: the moment of its last record, if any.
struct CpuEvent {
  std::optional<Clock::time_point> recorded;
};

Event create_event() { return Event{new CpuEvent}; }

void destroy_event(Event event) { delete static_cast<CpuEvent*>(event.handle); }

void record_event(Event event, Stream) { static_cast<CpuEvent*>(event.handle)->recorded = Clock::now(); }

void synchronize_event(Event) {}

double elapsed_seconds(Event start, Event end) {
  const auto& from = static_cast<const CpuEvent*>(start.handle)->recorded;
  const auto& to = static_cast<const CpuEvent*>(end.handle)->recorded;
  if (!from || !to) throw std::logic_error("cpu backend: elapsed_seconds between events not both recorded");
  return seconds_between(*from, *to);
}
// ---- end of stream order

void copy(void* dst, const void* src, int64_t bytes, CopyKind, Stream) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width_bytes, int64_t rows,
             CopyKind, Stream) {
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(out + r * dst_pitch, in + r * src_pitch, static_cast<size_t>(width_bytes));
  }
}

void fill(float* x, int64_t n, float value, Stream) {
#pragma omp parallel for simd schedule(static) if (n >= (int64_t{1} << 15))
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}

void zero(void* x, int64_t bytes, Stream) {
  if (bytes > 0) std::memset(x, 0, static_cast<size_t>(bytes));
}

[[noreturn]] void unsupported_conversion(DType in_type, DType out_type) {
  throw std::invalid_argument(std::string("cpu backend: no conversion from ") + dtype_name(in_type) + " to " +
                              dtype_name(out_type));
}

void convert(const void* in, DType in_type, void* out, DType out_type, int64_t n, Stream) {
  const auto count = static_cast<size_t>(n);
  if (in_type == DType::f32 && out_type == DType::bf16) {
    kernels::cpu::fp32_to_bf16(static_cast<const float*>(in), static_cast<uint16_t*>(out), count);
  } else if (in_type == DType::bf16 && out_type == DType::f32) {
    kernels::cpu::bf16_to_fp32(static_cast<const uint16_t*>(in), static_cast<float*>(out), count);
  } else if (in_type == DType::f32 && out_type == DType::f16) {
    kernels::cpu::fp32_to_fp16(static_cast<const float*>(in), static_cast<uint16_t*>(out), count);
  } else if (in_type == DType::f16 && out_type == DType::f32) {
    kernels::cpu::fp16_to_fp32(static_cast<const uint16_t*>(in), static_cast<float*>(out), count);
  } else {
    unsupported_conversion(in_type, out_type);
  }
}

void round_through(const float* in, float* out, int64_t n, DType through, Stream) {
  if (through == DType::bf16) {
    kernels::cpu::round_through_bf16(in, out, static_cast<size_t>(n));
  } else if (through == DType::f16) {
    kernels::cpu::round_through_fp16(in, out, static_cast<size_t>(n));
  } else {
    unsupported_conversion(DType::f32, through);
  }
}

// bf16 GEMMs run natively with AVX512-BF16; elsewhere as fp32 GEMMs over bf16-rounded values,
// which give the same products faster than oneDNN's emulation (kernels/cpu/gemm.h). fp16 always
// runs as fp32 over fp16-rounded values.
DType gemm_operand_type(Precision precision) {
  return precision == Precision::bf16 && kernels::cpu::native_bf16_gemm() ? DType::bf16 : DType::f32;
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
          const void* b, int64_t ldb, float beta, float* c, int64_t ldc, DType operand_type, Stream) {
  if (operand_type == DType::bf16) {
    kernels::cpu::gemm_bf16(trans_a, trans_b, m, n, k, alpha, static_cast<const uint16_t*>(a), lda,
                            static_cast<const uint16_t*>(b), ldb, beta, c, ldc);
  } else if (operand_type == DType::f32) {
    kernels::cpu::gemm_f32(trans_a, trans_b, m, n, k, alpha, static_cast<const float*>(a), lda,
                           static_cast<const float*>(b), ldb, beta, c, ldc);
  } else {
    throw std::invalid_argument(std::string("cpu backend: no GEMM on ") + dtype_name(operand_type) + " operands");
  }
}

// ---- the fused GEMM entries: gemm, then the kernels a CUDA epilogue fuses, one after another
// (the same bits as the layers' separate calls).
void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
               const void* b, int64_t ldb, const float* bias, float* c, DType operand_type, Stream stream) {
  gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n, operand_type, stream);
  kernels::cpu::cpu_ops().bias_add(c, bias, m, static_cast<int>(n));
}

void gemm_bias_gelu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                    const void* b, int64_t ldb, const float* bias, float* pre, float* y, DType operand_type,
                    Stream stream) {
  gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, pre, n, operand_type, stream);
  if (bias) kernels::cpu::cpu_ops().bias_add(pre, bias, m, static_cast<int>(n));
  kernels::cpu::cpu_ops().gelu_forward(pre, y, m * n);
}

// ---- MoE experts: grouped GEMMs over the local experts (kernels/cpu/grouped_gemm.h) and the
// probs' row scaling (kernels/cpu/moe_expert_ops.h).
[[noreturn]] void unsupported_grouped_gemm(DType operand_type) {
  throw std::invalid_argument(std::string("cpu backend: no grouped GEMM on ") + dtype_name(operand_type) +
                              " operands");
}

void grouped_gemm(bool trans_b, int64_t groups, const int64_t* group_rows, int64_t n, int64_t k, float alpha,
                  const void* a, int64_t lda, const void* b, int64_t ldb, int64_t b_group_stride, float beta, float* c,
                  int64_t ldc, DType operand_type, Stream) {
  if (operand_type == DType::bf16) {
    kernels::cpu::grouped_gemm_bf16(trans_b, groups, group_rows, n, k, alpha, static_cast<const uint16_t*>(a), lda,
                                    static_cast<const uint16_t*>(b), ldb, b_group_stride, beta, c, ldc);
  } else if (operand_type == DType::f32) {
    kernels::cpu::grouped_gemm_f32(trans_b, groups, group_rows, n, k, alpha, static_cast<const float*>(a), lda,
                                   static_cast<const float*>(b), ldb, b_group_stride, beta, c, ldc);
  } else {
    unsupported_grouped_gemm(operand_type);
  }
}

void grouped_gemm_ragged_k(int64_t groups, const int64_t* group_depths, int64_t m, int64_t n, float alpha,
                           const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c, int64_t ldc,
                           int64_t c_group_stride, DType operand_type, Stream) {
  if (operand_type == DType::bf16) {
    kernels::cpu::grouped_gemm_ragged_k_bf16(groups, group_depths, m, n, alpha, static_cast<const uint16_t*>(a), lda,
                                             static_cast<const uint16_t*>(b), ldb, beta, c, ldc, c_group_stride);
  } else if (operand_type == DType::f32) {
    kernels::cpu::grouped_gemm_ragged_k_f32(groups, group_depths, m, n, alpha, static_cast<const float*>(a), lda,
                                            static_cast<const float*>(b), ldb, beta, c, ldc, c_group_stride);
  } else {
    unsupported_grouped_gemm(operand_type);
  }
}

void moe_scale_rows(const float* x, const float* scale, float* y, int64_t rows, int cols, Stream) {
  kernels::cpu::moe_scale_rows(x, scale, y, rows, cols);
}

void moe_scale_rows_backward(const float* dy, const float* x, const float* scale, float* dx, float* d_scale,
                             int64_t rows, int cols, Stream) {
  kernels::cpu::moe_scale_rows_backward(dy, x, scale, dx, d_scale, rows, cols);
}
// ---- end of MoE experts

// What the CPU runs (see Ops::supports): GEMMs (grouped and fused too) on f32 and bf16 operands (bf16 natively or widened
// to fp32, kernels/cpu/gemm.h), conversions between f32 and bf16/f16, the fused kernels on f32.
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
    case OpId::gemm_bias_gelu:
    case OpId::grouped_gemm:
    case OpId::grouped_gemm_ragged_k: return dtype == DType::f32 || dtype == DType::bf16;
    case OpId::convert:
    case OpId::round_through: return dtype == DType::bf16 || dtype == DType::f16;
    default: return dtype == DType::f32;  // fill and the fused kernels
  }
}

}  // namespace

const char* memory_category_name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::weights: return "weights";
    case MemoryCategory::grads: return "grads";
    case MemoryCategory::optimizer: return "optimizer";
    case MemoryCategory::activations: return "activations";
    case MemoryCategory::comm_buffers: return "comm_buffers";
  }
  return "?";
}

// ---- reductions into device memory: the kernel's result (summed from zero) added to the
// accumulator, so pieces and micro-batches add up in call order as host sums did.
void xent_loss_sums(const float* row_max, const float* row_sumexp, const float* target_logit, const float* loss_mask,
                    int64_t rows, double* loss_sum, double* mask_sum, Stream) {
  double loss = 0, mask = 0;
  kernels::cpu::cpu_ops().xent_loss_sums(row_max, row_sumexp, target_logit, loss_mask, rows, &loss, &mask);
  *loss_sum += loss;
  *mask_sum += mask;
}

void sum_squares(const float* x, int64_t n, double* sum, Stream) { *sum += kernels::cpu::cpu_ops().sum_squares(x, n); }

void all_finite(const float* x, int64_t n, int32_t* finite, Stream) {
  if (!kernels::cpu::cpu_ops().all_finite(x, n)) *finite = 0;
}

void moe_router_z_loss_sum(const float* logits, int64_t rows, int experts, double* sum, Stream) {
  *sum = kernels::cpu::moe_router_z_loss_sum(logits, rows, experts);
}

const Ops& cpu_ops() {
  static const Ops table{
      .name = "cpu",
      .device = Device::cpu,
      .synchronous = true,
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
      .layernorm_forward = MT_CPU_KERNEL(layernorm_forward),
      .layernorm_backward = MT_CPU_KERNEL(layernorm_backward),
      .rmsnorm_forward = MT_CPU_KERNEL(rmsnorm_forward),
      .rmsnorm_backward = MT_CPU_KERNEL(rmsnorm_backward),
      .gelu_forward = MT_CPU_KERNEL(gelu_forward),
      .gelu_backward = MT_CPU_KERNEL(gelu_backward),
      .gelu_erf_forward = MT_CPU_KERNEL(gelu_erf_forward),
      .gelu_erf_backward = MT_CPU_KERNEL(gelu_erf_backward),
      .tanh_forward = MT_CPU_KERNEL(tanh_forward),
      .tanh_backward = MT_CPU_KERNEL(tanh_backward),
      .swiglu_forward = MT_CPU_KERNEL(swiglu_forward),
      .swiglu_backward = MT_CPU_KERNEL(swiglu_backward),
      .rope_forward = MT_CPU_KERNEL(rope_forward),
      .rope_backward = MT_CPU_KERNEL(rope_backward),
      .rope_yarn_forward = MT_CPU_KERNEL(rope_yarn_forward),
      .rope_yarn_backward = MT_CPU_KERNEL(rope_yarn_backward),
      .attention_forward = MT_CPU_KERNEL(attention_forward),
      .attention_backward = MT_CPU_KERNEL(attention_backward),
      .attention_merge = MT_CPU_KERNEL(attention_merge),
      .embedding_forward = MT_CPU_KERNEL(embedding_forward),
      .embedding_backward = MT_CPU_KERNEL(embedding_backward),
      .xent_row_max = MT_CPU_KERNEL(xent_row_max),
      .xent_row_sumexp = MT_CPU_KERNEL(xent_row_sumexp),
      .xent_target_logit = MT_CPU_KERNEL(xent_target_logit),
      .xent_backward = MT_CPU_KERNEL(xent_backward),
      .xent_loss_sums = xent_loss_sums,
      .add_inplace = MT_CPU_KERNEL(add_inplace),
      .scale_inplace = MT_CPU_KERNEL(scale_inplace),
      .bias_add = MT_CPU_KERNEL(bias_add),
      .bias_backward = MT_CPU_KERNEL(bias_backward),
      .sum_squares = sum_squares,
      .all_finite = all_finite,
      .dropout_forward = MT_CPU_KERNEL(dropout_forward),
      .dropout_backward = MT_CPU_KERNEL(dropout_backward),
      .adamw_update = MT_CPU_KERNEL(adamw_update),
      // MoE router (issue 22)
      .moe_router_topk = MT_CPU_FUNCTION(moe_router_topk),
      .moe_router_topk_backward = MT_CPU_FUNCTION(moe_router_topk_backward),
      .moe_router_aux_sums = MT_CPU_FUNCTION(moe_router_aux_sums),
      .moe_router_aux_backward = MT_CPU_FUNCTION(moe_router_aux_backward),
      .moe_router_z_loss_sum = moe_router_z_loss_sum,
      .moe_router_z_loss_backward = MT_CPU_FUNCTION(moe_router_z_loss_backward),
      .moe_router_capacity_drop = MT_CPU_FUNCTION(moe_router_capacity_drop),
      .moe_router_tokens_per_expert = MT_CPU_FUNCTION(moe_router_tokens_per_expert),
      .moe_router_expert_bias_update = MT_CPU_FUNCTION(moe_router_expert_bias_update),
      .grouped_gemm = grouped_gemm,
      .grouped_gemm_ragged_k = grouped_gemm_ragged_k,
      .moe_scale_rows = moe_scale_rows,
      .moe_scale_rows_backward = moe_scale_rows_backward,
      // MoE token dispatcher
      .moe_expert_counts = MT_CPU_FUNCTION(moe_expert_counts),
      .moe_route_index = MT_CPU_FUNCTION(moe_route_index),
      .moe_permute_rows = MT_CPU_FUNCTION(moe_permute_rows),
      .moe_unpermute_rows = MT_CPU_FUNCTION(moe_unpermute_rows),
      .moe_unroute_probs = MT_CPU_FUNCTION(moe_unroute_probs),
      .moe_sort_chunks = MT_CPU_FUNCTION(moe_sort_chunks),
      // FP8 (issue 23): emulated with the arithmetic of kernels/common/fp8.h
      .fp8_quantize = MT_CPU_FUNCTION(fp8_quantize),
      .fp8_transpose = MT_CPU_FUNCTION(fp8_transpose),
      .gemm_fp8 = MT_CPU_FUNCTION(gemm_fp8),
      .fp8_update_scales = MT_CPU_FUNCTION(fp8_update_scales),
  };
  return table;
}

}  // namespace mt::backend
