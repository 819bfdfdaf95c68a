// oneDNN GEMM wrappers (see gemm.h). fp32 goes through dnnl_sgemm, which beat the fp32 matmul
// primitive on 5 of 6 GPT-2 training shapes here (up to 1.9x on the backward ones); bf16 goes through the matmul
// primitive (oneDNN 2.6 has no bf16 BLAS-style call), created once per shape and cached, since
// a training step repeats the same few shapes.
#include "kernels/cpu/gemm.h"

#include "kernels/cpu/isa.h"

#include <oneapi/dnnl/dnnl.h>

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <tuple>

namespace mt::kernels::cpu {
namespace {

void check(dnnl_status_t status, const char* what) {
  if (status != dnnl_success) throw std::runtime_error(std::string(what) + " failed: oneDNN status " + std::to_string(status));
}

using MatmulKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float, int>;

struct MatmulCache {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<MatmulKey, std::tuple<dnnl::matmul, dnnl::memory::desc, dnnl::memory::desc, dnnl::memory::desc>> entries;
  std::mutex mutex;
};

MatmulCache& matmul_cache() {
  static MatmulCache cache;
  return cache;
}

}  // namespace

bool native_bf16_gemm() { return active_isa() == CpuIsa::avx512_bf16; }

void gemm_f32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  check(dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc),
        "dnnl_sgemm");
}

namespace {

// C = alpha op(A) op(B) + beta C through a oneDNN matmul primitive built once per shape.
void matmul(dnnl::memory::data_type input_type, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
            float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  using dnnl::memory;
  MatmulCache& cache = matmul_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const MatmulKey key{trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, static_cast<int>(input_type)};
  auto it = cache.entries.find(key);
  if (it == cache.entries.end()) {
    const memory::desc a_md({m, k}, input_type, trans_a ? memory::dims{1, lda} : memory::dims{lda, 1});
    const memory::desc b_md({k, n}, input_type, trans_b ? memory::dims{1, ldb} : memory::dims{ldb, 1});
    const memory::desc c_md({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, cache.engine);
    it = cache.entries.emplace(key, std::make_tuple(dnnl::matmul(pd), a_md, b_md, c_md)).first;
  }
  auto& [primitive, a_md, b_md, c_md] = it->second;
  primitive.execute(cache.stream, {{DNNL_ARG_SRC, memory(a_md, cache.engine, const_cast<void*>(a))},
                                   {DNNL_ARG_WEIGHTS, memory(b_md, cache.engine, const_cast<void*>(b))},
                                   {DNNL_ARG_DST, memory(c_md, cache.engine, c)}});
  cache.stream.wait();
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  matmul(dnnl::memory::data_type::bf16, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace mt::kernels::cpu
