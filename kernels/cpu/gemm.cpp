// oneDNN GEMM wrappers (see gemm.h). fp32 goes through dnnl_sgemm, which beat the fp32 matmul
// primitive on 5 of 6 GPT-2 training shapes here (up to 1.9x on the backward ones); bf16 goes through the matmul
// primitive (oneDNN 2.6 has no bf16 BLAS-style call), created once per shape and cached, since
// a training step repeats the same few shapes. A shape oneDNN cannot build a bf16 matmul for is
// remembered as such and runs as an fp32 GEMM over the widened operands.
#include "kernels/cpu/gemm.h"

#include "kernels/cpu/convert.h"
#include "kernels/cpu/isa.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace mt::kernels::cpu {
namespace {

void check(dnnl_status_t status, const char* what) {
  if (status != dnnl_success) throw std::runtime_error(std::string(what) + " failed: oneDNN status " + std::to_string(status));
}

using MatmulKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float, int>;

// A shape's matmul and its memory descriptors; no primitive when oneDNN has no implementation
// for it (the shape then runs widened).
struct CachedMatmul {
  std::optional<dnnl::matmul> primitive;
  dnnl::memory::desc a_md, b_md, c_md;
};

struct MatmulCache {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<MatmulKey, CachedMatmul> entries;
  std::mutex mutex;
};

MatmulCache& matmul_cache() {
  static MatmulCache cache;
  return cache;
}

std::string shape_text(int64_t m, int64_t n, int64_t k) {
  return std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k);
}

// The matmul primitive for C = alpha op(A) op(B) + beta C with these descriptors, or none when
// oneDNN has no implementation of it on this CPU (under ONEDNN_MAX_CPU_ISA); any other oneDNN
// failure is an error naming the GEMM.
std::optional<dnnl::matmul> make_matmul(const dnnl::engine& engine, const dnnl::memory::desc& a_md,
                                        const dnnl::memory::desc& b_md, const dnnl::memory::desc& c_md, float alpha,
                                        float beta, int64_t m, int64_t n, int64_t k) {
  try {
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine);
    return dnnl::matmul(pd);
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_unimplemented) return std::nullopt;
    throw std::runtime_error("bf16 GEMM " + shape_text(m, n, k) + ": oneDNN could not build a matmul (status " +
                             std::to_string(e.status) + ")");
  }
}

// The cache entry for one shape, built on first use.
CachedMatmul& cached_matmul(MatmulCache& cache, dnnl::memory::data_type input_type, bool trans_a, bool trans_b,
                            int64_t m, int64_t n, int64_t k, float alpha, int64_t lda, int64_t ldb, float beta,
                            int64_t ldc) {
  using dnnl::memory;
  const MatmulKey key{trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, static_cast<int>(input_type)};
  auto it = cache.entries.find(key);
  if (it == cache.entries.end()) {
    CachedMatmul entry;
    entry.a_md = memory::desc({m, k}, input_type, trans_a ? memory::dims{1, lda} : memory::dims{lda, 1});
    entry.b_md = memory::desc({k, n}, input_type, trans_b ? memory::dims{1, ldb} : memory::dims{ldb, 1});
    entry.c_md = memory::desc({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
    entry.primitive = make_matmul(cache.engine, entry.a_md, entry.b_md, entry.c_md, alpha, beta, m, n, k);
    it = cache.entries.emplace(key, std::move(entry)).first;
  }
  return it->second;
}

// C = alpha op(A) op(B) + beta C through a oneDNN matmul primitive built once per shape; false
// (nothing done) when oneDNN has no matmul for the shape.
bool matmul(dnnl::memory::data_type input_type, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  using dnnl::memory;
  MatmulCache& cache = matmul_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  CachedMatmul& entry = cached_matmul(cache, input_type, trans_a, trans_b, m, n, k, alpha, lda, ldb, beta, ldc);
  if (!entry.primitive) return false;
  entry.primitive->execute(cache.stream, {{DNNL_ARG_SRC, memory(entry.a_md, cache.engine, const_cast<void*>(a))},
                                          {DNNL_ARG_WEIGHTS, memory(entry.b_md, cache.engine, const_cast<void*>(b))},
                                          {DNNL_ARG_DST, memory(entry.c_md, cache.engine, c)}});
  cache.stream.wait();
  return true;
}

// `rows` rows of `cols` bf16 values, `ld` apart, widened into a compact fp32 matrix.
void widen_rows(const uint16_t* in, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& out) {
  out.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) bf16_to_fp32(in + r * ld, out.data() + r * cols, static_cast<size_t>(cols));
}

// The bf16 GEMM as an fp32 GEMM over the widened operands: exact products, fp32 accumulation.
void gemm_bf16_widened(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
                       int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  thread_local std::vector<float> a_wide, b_wide;
  const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
  const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
  widen_rows(a, a_rows, a_cols, lda, a_wide);
  widen_rows(b, b_rows, b_cols, ldb, b_wide);
  gemm_f32(trans_a, trans_b, m, n, k, alpha, a_wide.data(), std::max<int64_t>(a_cols, 1), b_wide.data(),
           std::max<int64_t>(b_cols, 1), beta, c, ldc);
}

}  // namespace

bool onednn_bf16_matmul() {
  static const bool available = [] {
    using dnnl::memory;
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    const memory::desc one({1, 1}, memory::data_type::bf16, memory::dims{1, 1});
    const memory::desc out({1, 1}, memory::data_type::f32, memory::dims{1, 1});
    return make_matmul(engine, one, one, out, 1.0f, 0.0f, 1, 1, 1).has_value();
  }();
  return available;
}

bool native_bf16_gemm() { return active_isa() == CpuIsa::avx512_bf16 && onednn_bf16_matmul(); }

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  check(dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc),
        "dnnl_sgemm");
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (matmul(dnnl::memory::data_type::bf16, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
  gemm_bf16_widened(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace mt::kernels::cpu
