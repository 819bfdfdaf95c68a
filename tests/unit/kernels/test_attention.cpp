// Tests of the CPU causal attention kernels (CpuOps::attention_forward / attention_backward,
// kernels/cpu/impl/attention.inc) at every ISA level the CPU supports: output, lse and gradients
// against a naive double-precision reference (explicit masked softmax and its analytic gradients),
// the reference gradients against finite differences, GQA, documents, position offsets (queries
// that see no key), the packed qkv layout, merging key blocks through lse with attention_merge and
// accumulating their grads (context parallelism),
// thread-count independence and linear memory at T = 4096.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"

namespace {

using mt::kernels::CpuIsa;
using mt::kernels::cpu::AttentionShape;
using mt::kernels::cpu::CpuOps;

constexpr float kSentinel = 7777.0f;
constexpr double kInf = std::numeric_limits<double>::infinity();
// fp32 kernel vs fp64 reference: errors relative to the tensor's largest magnitude. The sums run
// over at most a few hundred fp32 terms, so ~1e-6 is typical and 1e-5 leaves headroom.
constexpr double kTolerance = 1e-5;

std::vector<CpuIsa> available_isas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::x86_64_v2, CpuIsa::avx2, CpuIsa::avx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(mt::kernels::detected_isa())) isas.push_back(isa);
  }
  return isas;
}

// One attention problem. Q, K, V live in one buffer: three compact blocks, or one packed qkv
// buffer per token (q, k, v are column ranges of each row). The gradients of a kernel run use the
// same buffer layout, so dq, dk, dv sit at the same offsets with the same strides.
struct Problem {
  AttentionShape shape;
  std::vector<float> inputs;
  std::size_t q_offset = 0, k_offset = 0, v_offset = 0;
  std::vector<float> dout;          // (batch * q_len, o_stride)
  std::vector<int32_t> doc_start;   // (batch * q_len) or empty

  const float* q() const { return inputs.data() + q_offset; }
  const float* k() const { return inputs.data() + k_offset; }
  const float* v() const { return inputs.data() + v_offset; }
  const int32_t* docs() const { return doc_start.empty() ? nullptr : doc_start.data(); }
  std::size_t out_size() const { return std::size_t(shape.batch) * shape.q_len * shape.o_stride; }
  std::size_t lse_size() const { return std::size_t(shape.batch) * shape.q_heads * shape.q_len; }
};

struct ShapeSpec {
  int batch, q_len, kv_len, heads, kv_heads, dim;
  int64_t q_pos0 = 0, kv_pos0 = 0;
};

std::string describe(const ShapeSpec& s) {
  return "B=" + std::to_string(s.batch) + " Tq=" + std::to_string(s.q_len) + " Tkv=" + std::to_string(s.kv_len) +
         " H=" + std::to_string(s.heads) + " G=" + std::to_string(s.kv_heads) + " D=" + std::to_string(s.dim) +
         " q_pos0=" + std::to_string(s.q_pos0) + " kv_pos0=" + std::to_string(s.kv_pos0);
}

void fill_uniform(std::vector<float>& values, uint32_t seed, float range) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-range, range);
  for (float& x : values) x = dist(rng);
}

// Compact Q, K, V blocks (strides heads*dim, kv_heads*dim) and o_stride heads*dim.
Problem make_problem(const ShapeSpec& s, uint32_t seed) {
  Problem p;
  p.shape = {s.batch, s.q_len, s.kv_len, s.heads, s.kv_heads, s.dim, int64_t(s.heads) * s.dim,
             int64_t(s.kv_heads) * s.dim, int64_t(s.kv_heads) * s.dim, int64_t(s.heads) * s.dim,
             s.q_pos0, s.kv_pos0, 1.0f / std::sqrt(float(s.dim))};
  const std::size_t q_size = std::size_t(s.batch) * s.q_len * s.heads * s.dim;
  const std::size_t kv_size = std::size_t(s.batch) * s.kv_len * s.kv_heads * s.dim;
  p.q_offset = 0;
  p.k_offset = q_size;
  p.v_offset = q_size + kv_size;
  p.inputs.resize(q_size + 2 * kv_size);
  fill_uniform(p.inputs, seed, 2.0f);
  p.dout.resize(p.out_size());
  fill_uniform(p.dout, seed + 1, 1.0f);
  return p;
}

// One packed buffer per token: [q heads | k heads | v heads | `extra` unused columns], the unused
// columns NaN (a kernel reading them would poison its results). o_stride has 3 extra columns.
Problem make_packed_problem(const ShapeSpec& s, int extra, uint32_t seed) {
  Problem p;
  const int64_t stride = int64_t(s.heads + 2 * s.kv_heads) * s.dim + extra;
  p.shape = {s.batch, s.q_len, s.kv_len, s.heads, s.kv_heads, s.dim, stride, stride, stride,
             int64_t(s.heads) * s.dim + 3, s.q_pos0, s.kv_pos0, 1.0f / std::sqrt(float(s.dim))};
  p.q_offset = 0;
  p.k_offset = std::size_t(s.heads) * s.dim;
  p.v_offset = std::size_t(s.heads + s.kv_heads) * s.dim;
  p.inputs.resize(std::size_t(s.batch) * s.q_len * stride);
  fill_uniform(p.inputs, seed, 2.0f);
  for (std::size_t row = 0; row < std::size_t(s.batch) * s.q_len; ++row) {
    for (int64_t c = stride - extra; c < stride; ++c) p.inputs[row * stride + c] = std::nanf("");
  }
  p.dout.resize(p.out_size());
  fill_uniform(p.dout, seed + 1, 1.0f);
  return p;
}

// doc_start for documents starting at the given global positions of each sample (the first
// start must be <= the first query position).
void set_documents(Problem& p, const std::vector<std::vector<int64_t>>& starts) {
  const AttentionShape& s = p.shape;
  p.doc_start.resize(std::size_t(s.batch) * s.q_len);
  for (int b = 0; b < s.batch; ++b) {
    for (int t = 0; t < s.q_len; ++t) {
      int64_t start = 0;
      for (int64_t candidate : starts[b]) {
        if (candidate <= s.q_pos0 + t) start = candidate;
      }
      p.doc_start[std::size_t(b) * s.q_len + t] = static_cast<int32_t>(start);
    }
  }
}

// Naive fp64 attention on the problem's layout (inputs given as doubles so finite differences can
// perturb them). Results compact: out, dq (batch, q_len, heads, dim); dk, dv (batch, kv_len,
// kv_heads, dim); lse (batch, heads, q_len).
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

Reference reference_attention(const Problem& p, const std::vector<double>& inputs) {
  const AttentionShape& s = p.shape;
  const int dim = s.head_dim, group = s.q_heads / s.kv_heads;
  Reference r;
  r.out.assign(std::size_t(s.batch) * s.q_len * s.q_heads * dim, 0.0);
  r.dq.assign(r.out.size(), 0.0);
  r.lse.assign(p.lse_size(), -kInf);
  r.dk.assign(std::size_t(s.batch) * s.kv_len * s.kv_heads * dim, 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  auto q_at = [&](int b, int t, int h, int d) {
    return inputs[p.q_offset + (std::size_t(b) * s.q_len + t) * s.q_stride + std::size_t(h) * dim + d];
  };
  auto k_at = [&](int b, int j, int g, int d) {
    return inputs[p.k_offset + (std::size_t(b) * s.kv_len + j) * s.k_stride + std::size_t(g) * dim + d];
  };
  auto v_at = [&](int b, int j, int g, int d) {
    return inputs[p.v_offset + (std::size_t(b) * s.kv_len + j) * s.v_stride + std::size_t(g) * dim + d];
  };
  auto dout_at = [&](int b, int t, int h, int d) {
    return double(p.dout[(std::size_t(b) * s.q_len + t) * s.o_stride + std::size_t(h) * dim + d]);
  };
  std::vector<int> visible;
  std::vector<double> probs, dprobs;
  for (int b = 0; b < s.batch; ++b) {
    for (int h = 0; h < s.q_heads; ++h) {
      const int g = h / group;
      for (int t = 0; t < s.q_len; ++t) {
        const int64_t q_pos = s.q_pos0 + t;
        const int64_t doc = p.docs() ? p.doc_start[std::size_t(b) * s.q_len + t] : INT64_MIN;
        visible.clear();
        for (int j = 0; j < s.kv_len; ++j) {
          const int64_t k_pos = s.kv_pos0 + j;
          if (k_pos <= q_pos && k_pos >= doc) visible.push_back(j);
        }
        if (visible.empty()) continue;
        probs.assign(visible.size(), 0.0);
        double max_score = -kInf;
        for (std::size_t n = 0; n < visible.size(); ++n) {
          double dot = 0;
          for (int d = 0; d < dim; ++d) dot += q_at(b, t, h, d) * k_at(b, visible[n], g, d);
          probs[n] = s.scale * dot;
          max_score = std::max(max_score, probs[n]);
        }
        double sum = 0;
        for (double& x : probs) sum += (x = std::exp(x - max_score));
        for (double& x : probs) x /= sum;
        const std::size_t row = (std::size_t(b) * s.q_len + t) * s.q_heads + h;
        r.lse[(std::size_t(b) * s.q_heads + h) * s.q_len + t] = max_score + std::log(sum);
        for (std::size_t n = 0; n < visible.size(); ++n) {
          for (int d = 0; d < dim; ++d) r.out[row * dim + d] += probs[n] * v_at(b, visible[n], g, d);
        }
        // dP = dout . v, dS = P (dP - sum_j P dP), dq = scale dS k, dk = scale dS q, dv = P dout.
        dprobs.assign(visible.size(), 0.0);
        double delta = 0;
        for (std::size_t n = 0; n < visible.size(); ++n) {
          for (int d = 0; d < dim; ++d) dprobs[n] += dout_at(b, t, h, d) * v_at(b, visible[n], g, d);
          delta += probs[n] * dprobs[n];
        }
        for (std::size_t n = 0; n < visible.size(); ++n) {
          const double dscore = probs[n] * (dprobs[n] - delta);
          const std::size_t kv_row = (std::size_t(b) * s.kv_len + visible[n]) * s.kv_heads + g;
          for (int d = 0; d < dim; ++d) {
            r.dq[row * dim + d] += s.scale * dscore * k_at(b, visible[n], g, d);
            r.dk[kv_row * dim + d] += s.scale * dscore * q_at(b, t, h, d);
            r.dv[kv_row * dim + d] += probs[n] * dout_at(b, t, h, d);
          }
        }
      }
    }
  }
  return r;
}

Reference reference_attention(const Problem& p) {
  return reference_attention(p, std::vector<double>(p.inputs.begin(), p.inputs.end()));
}

// Kernel results in the problem's layouts: out (o_stride rows), lse, grads (same layout as the
// inputs); untouched elements keep kSentinel.
struct KernelRun {
  std::vector<float> out, lse, grads;
  const float* dq(const Problem& p) const { return grads.data() + p.q_offset; }
  const float* dk(const Problem& p) const { return grads.data() + p.k_offset; }
  const float* dv(const Problem& p) const { return grads.data() + p.v_offset; }
};

KernelRun run_forward(const CpuOps& ops, const Problem& p) {
  KernelRun run;
  run.out.assign(p.out_size(), kSentinel);
  run.lse.assign(p.lse_size(), kSentinel);
  ops.attention_forward(p.shape, p.q(), p.k(), p.v(), p.docs(), run.out.data(), run.lse.data());
  return run;
}

void run_backward(const CpuOps& ops, const Problem& p, KernelRun& run) {
  run.grads.assign(p.inputs.size(), kSentinel);
  ops.attention_backward(p.shape, p.q(), p.k(), p.v(), p.docs(), run.out.data(), p.dout.data(), run.lse.data(),
                         run.grads.data() + p.q_offset, run.grads.data() + p.k_offset,
                         run.grads.data() + p.v_offset);
}

KernelRun run_kernel(const CpuOps& ops, const Problem& p) {
  KernelRun run = run_forward(ops, p);
  run_backward(ops, p, run);
  return run;
}

// The (rows, heads*dim) block of a strided tensor, compact.
std::vector<float> compact(const float* base, int64_t rows, int64_t stride, int64_t cols) {
  std::vector<float> values(std::size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) std::copy(base + r * stride, base + r * stride + cols, values.data() + r * cols);
  return values;
}

// max |kernel - reference| <= tolerance * max(max |reference|, 0.1) and no NaN. The floor covers
// tensors that vanish analytically (one key: dS = P (dP - delta) = 0) yet carry the rounding
// noise of O(1) inputs.
void expect_close(const std::vector<float>& kernel, const std::vector<double>& reference, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(kernel.size(), reference.size()) << what;
  double max_error = 0, max_reference = 0;
  for (std::size_t i = 0; i < kernel.size(); ++i) {
    ASSERT_TRUE(std::isfinite(kernel[i])) << what << " element " << i;
    max_error = std::max(max_error, std::abs(double(kernel[i]) - reference[i]));
    max_reference = std::max(max_reference, std::abs(reference[i]));
  }
  EXPECT_LE(max_error, tolerance * std::max(max_reference, 0.1)) << what << " (max |ref| " << max_reference << ")";
}

void expect_lse_close(const std::vector<float>& kernel, const std::vector<double>& reference,
                      const std::string& what) {
  ASSERT_EQ(kernel.size(), reference.size()) << what;
  for (std::size_t i = 0; i < kernel.size(); ++i) {
    if (std::isinf(reference[i])) {
      EXPECT_EQ(kernel[i], -std::numeric_limits<float>::infinity()) << what << " lse " << i;
    } else {
      EXPECT_NEAR(kernel[i], reference[i], kTolerance * std::max(1.0, std::abs(reference[i])))
          << what << " lse " << i;
    }
  }
}

// Every output against the reference, and every element the kernel must not write still kSentinel.
void check_against_reference(const CpuOps& ops, const Problem& p, const std::string& what) {
  const AttentionShape& s = p.shape;
  const Reference ref = reference_attention(p);
  const KernelRun run = run_kernel(ops, p);
  const int64_t q_rows = int64_t(s.batch) * s.q_len, kv_rows = int64_t(s.batch) * s.kv_len;
  const int64_t q_cols = int64_t(s.q_heads) * s.head_dim, kv_cols = int64_t(s.kv_heads) * s.head_dim;
  expect_close(compact(run.out.data(), q_rows, s.o_stride, q_cols), ref.out, kTolerance, what + " out");
  expect_lse_close(run.lse, ref.lse, what);
  expect_close(compact(run.dq(p), q_rows, s.q_stride, q_cols), ref.dq, kTolerance, what + " dq");
  expect_close(compact(run.dk(p), kv_rows, s.k_stride, kv_cols), ref.dk, kTolerance, what + " dk");
  expect_close(compact(run.dv(p), kv_rows, s.v_stride, kv_cols), ref.dv, kTolerance, what + " dv");

  std::vector<bool> written(p.inputs.size(), false);
  auto mark = [&](std::size_t offset, int64_t rows, int64_t stride, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) written[offset + r * stride + c] = true;
    }
  };
  mark(p.q_offset, q_rows, s.q_stride, q_cols);
  mark(p.k_offset, kv_rows, s.k_stride, kv_cols);
  mark(p.v_offset, kv_rows, s.v_stride, kv_cols);
  for (std::size_t i = 0; i < written.size(); ++i) {
    if (!written[i]) {
      ASSERT_EQ(run.grads[i], kSentinel) << what << ": grad buffer element " << i << " overwritten";
    }
  }
  for (int64_t r = 0; r < q_rows; ++r) {
    for (int64_t c = q_cols; c < s.o_stride; ++c) {
      ASSERT_EQ(run.out[r * s.o_stride + c], kSentinel) << what << ": out element overwritten";
    }
  }
}

// Runs first so that the process's peak RSS before it is small.
TEST(Attention, LongSequenceMemoryIsLinear) {
  const ShapeSpec spec{1, 4096, 4096, 1, 1, 64};
  const Problem p = make_problem(spec, 11);
  const int dim = spec.dim;
  for (CpuIsa isa : available_isas()) {
    const CpuOps& ops = mt::kernels::cpu::cpu_ops(isa);
    rusage before{};
    getrusage(RUSAGE_SELF, &before);
    const KernelRun run = run_kernel(ops, p);
    rusage after{};
    getrusage(RUSAGE_SELF, &after);
    // A (T, T) fp32 buffer alone would be 64 MiB; results and per-thread scratch are ~3 MiB.
    EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 24 * 1024) << "peak RSS growth in KiB";

    for (int t : {0, 1, 2047, 4095}) {  // spot rows of the output against fp64
      std::vector<double> scores(std::size_t(t) + 1), out(dim, 0.0);
      double max_score = -kInf, sum = 0;
      for (int j = 0; j <= t; ++j) {
        double dot = 0;
        for (int d = 0; d < dim; ++d) dot += double(p.q()[t * dim + d]) * p.k()[j * dim + d];
        scores[j] = p.shape.scale * dot;
        max_score = std::max(max_score, scores[j]);
      }
      for (int j = 0; j <= t; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
      for (int j = 0; j <= t; ++j) {
        for (int d = 0; d < dim; ++d) out[d] += scores[j] / sum * p.v()[j * dim + d];
      }
      for (int d = 0; d < dim; ++d) EXPECT_NEAR(run.out[t * dim + d], out[d], 1e-5) << mt::kernels::isa_name(isa);
      EXPECT_NEAR(run.lse[t], max_score + std::log(sum), 1e-5 * std::max(1.0, std::abs(max_score)));
    }
    // Softmax rows sum to 1 and dS rows to 0, so sum_s dv[s] = sum_t dout[t] and sum_s dk[s] = 0.
    for (int d = 0; d < dim; ++d) {
      double dv_sum = 0, dk_sum = 0, dk_abs = 0, dout_sum = 0;
      for (int j = 0; j < spec.kv_len; ++j) {
        dv_sum += run.dv(p)[j * dim + d];
        dk_sum += run.dk(p)[j * dim + d];
        dk_abs += std::abs(run.dk(p)[j * dim + d]);
        dout_sum += p.dout[j * dim + d];
      }
      EXPECT_NEAR(dv_sum, dout_sum, 1e-3) << mt::kernels::isa_name(isa);
      EXPECT_NEAR(dk_sum, 0.0, 1e-5 * dk_abs) << mt::kernels::isa_name(isa);
    }
    for (float x : run.grads) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(Attention, MatchesReferenceAcrossShapes) {
  const std::vector<ShapeSpec> specs = {
      {2, 7, 7, 2, 2, 8},       {1, 1, 1, 1, 1, 16},       {1, 130, 130, 1, 1, 16},
      {2, 257, 257, 4, 2, 12},  {1, 200, 200, 4, 1, 64},   {2, 65, 65, 3, 3, 33},
  };
  uint32_t seed = 100;
  for (CpuIsa isa : available_isas()) {
    for (const ShapeSpec& spec : specs) {
      check_against_reference(mt::kernels::cpu::cpu_ops(isa), make_problem(spec, ++seed),
                              std::string(mt::kernels::isa_name(isa)) + " " + describe(spec));
    }
  }
}

TEST(Attention, DocumentsMaskEarlierDocuments) {
  for (CpuIsa isa : available_isas()) {
    const std::string name = mt::kernels::isa_name(isa);
    Problem p = make_problem({2, 257, 257, 4, 2, 16}, 7);
    set_documents(p, {{0, 17, 60, 61, 128, 250}, {0, 100, 256}});
    check_against_reference(mt::kernels::cpu::cpu_ops(isa), p, name + " documents");

    // A context-parallel-like block: queries at [200, 330) over keys at [64, 330).
    Problem block = make_problem({2, 130, 266, 4, 2, 16, 200, 64}, 8);
    set_documents(block, {{0, 50, 190, 250, 301}, {0, 329}});
    check_against_reference(mt::kernels::cpu::cpu_ops(isa), block, name + " documents with offsets");
  }
}

TEST(Attention, PositionOffsets) {
  for (CpuIsa isa : available_isas()) {
    const CpuOps& ops = mt::kernels::cpu::cpu_ops(isa);
    const std::string name = mt::kernels::isa_name(isa);
    // Every key before every query: no causal mask at all.
    check_against_reference(ops, make_problem({2, 70, 100, 2, 1, 16, 100, 0}, 21), name + " keys before queries");
    // Diagonal block away from position 0.
    check_against_reference(ops, make_problem({1, 130, 130, 2, 2, 16, 64, 64}, 22), name + " diagonal block");

    // Queries at [0, 100), keys at [40, 110): queries 0..39 see no key, keys 60..69 no query.
    const Problem p = make_problem({2, 100, 70, 2, 1, 16, 0, 40}, 23);
    check_against_reference(ops, p, name + " partly hidden block");
    const KernelRun run = run_kernel(ops, p);
    const AttentionShape& s = p.shape;
    for (int b = 0; b < s.batch; ++b) {
      for (int t = 0; t < 40; ++t) {
        for (int h = 0; h < s.q_heads; ++h) {
          EXPECT_EQ(run.lse[(b * s.q_heads + h) * s.q_len + t], -std::numeric_limits<float>::infinity());
        }
        for (int c = 0; c < s.q_heads * s.head_dim; ++c) {
          EXPECT_EQ(run.out[(b * s.q_len + t) * s.o_stride + c], 0.0f);
          EXPECT_EQ(run.dq(p)[(b * s.q_len + t) * s.q_stride + c], 0.0f);
        }
      }
      for (int j = 60; j < 70; ++j) {
        for (int c = 0; c < s.kv_heads * s.head_dim; ++c) {
          EXPECT_EQ(run.dk(p)[(b * s.kv_len + j) * s.k_stride + c], 0.0f);
          EXPECT_EQ(run.dv(p)[(b * s.kv_len + j) * s.v_stride + c], 0.0f);
        }
      }
    }
  }
}

TEST(Attention, PackedQkvLayoutWritesOnlyItsColumns) {
  for (CpuIsa isa : available_isas()) {
    const CpuOps& ops = mt::kernels::cpu::cpu_ops(isa);
    const std::string name = mt::kernels::isa_name(isa);
    // Strides exactly (H + 2G) * D, and with 5 unused (NaN, sentinel-checked) columns per token.
    check_against_reference(ops, make_packed_problem({2, 130, 130, 4, 2, 16}, 0, 31), name + " packed");
    Problem p = make_packed_problem({2, 130, 130, 4, 2, 12}, 5, 32);
    set_documents(p, {{0, 70}, {0, 3, 129}});
    check_against_reference(ops, p, name + " packed with extra columns");
  }
}

// The problem restricted to keys [lo, hi) of each sample (compact K, V; kv_pos0 moved).
Problem slice_keys(const Problem& full, int lo, int hi) {
  Problem p = full;
  AttentionShape& s = p.shape;
  const int64_t cols = int64_t(s.kv_heads) * s.head_dim;
  const std::size_t q_size = std::size_t(s.batch) * s.q_len * s.q_stride;
  s.kv_len = hi - lo;
  s.kv_pos0 = full.shape.kv_pos0 + lo;
  s.k_stride = s.v_stride = cols;
  p.inputs.assign(full.inputs.begin(), full.inputs.begin() + q_size);
  p.k_offset = q_size;
  p.v_offset = q_size + std::size_t(s.batch) * s.kv_len * cols;
  p.inputs.resize(p.v_offset + std::size_t(s.batch) * s.kv_len * cols);
  for (int b = 0; b < s.batch; ++b) {
    for (int j = lo; j < hi; ++j) {
      const std::size_t src_row = std::size_t(b) * full.shape.kv_len + j, dst_row = std::size_t(b) * s.kv_len + j - lo;
      std::copy_n(full.k() + src_row * full.shape.k_stride, cols, p.inputs.data() + p.k_offset + dst_row * cols);
      std::copy_n(full.v() + src_row * full.shape.v_stride, cols, p.inputs.data() + p.v_offset + dst_row * cols);
    }
  }
  return p;
}

// Context parallelism: two key blocks attended separately, merged through their lse by
// attention_merge, then each block's backward run with the merged out and lse gives that block's
// dk, dv and a dq part; with accumulate_grads the kernel sums them into existing grads.
TEST(Attention, MergingKeyBlocksThroughLseMatchesOneBlock) {
  for (CpuIsa isa : available_isas()) {
    const CpuOps& ops = mt::kernels::cpu::cpu_ops(isa);
    const std::string name = mt::kernels::isa_name(isa);
    // Queries at [40, 160) over keys [0, 200) split at 100: queries 40..99 see nothing of block 2
    // (lse2 = -inf), keys 160..199 are seen by no query.
    Problem full = make_problem({2, 120, 200, 4, 2, 16, 40, 0}, 41);
    set_documents(full, {{0, 30, 95, 150}, {0, 120}});
    const Problem first = slice_keys(full, 0, 100), second = slice_keys(full, 100, 200);
    const KernelRun whole = run_kernel(ops, full);
    KernelRun part1 = run_forward(ops, first), part2 = run_forward(ops, second);

    const AttentionShape& s = full.shape;
    // The running result starts empty (lse -inf, out never read: NaN) and takes the blocks one
    // at a time.
    KernelRun merged;
    merged.out.assign(full.out_size(), std::nanf(""));
    merged.lse.assign(full.lse_size(), -std::numeric_limits<float>::infinity());
    ops.attention_merge(s, merged.out.data(), merged.lse.data(), part1.out.data(), part1.lse.data());
    const std::vector<float> after_first = merged.out;
    const int dim = s.head_dim;
    for (int b = 0; b < s.batch; ++b) {  // rows that saw a key of block 1 copy it, the others wait
      for (int h = 0; h < s.q_heads; ++h) {
        for (int t = 0; t < s.q_len; ++t) {
          const float lse1 = part1.lse[(std::size_t(b) * s.q_heads + h) * s.q_len + t];
          const std::size_t o = (std::size_t(b) * s.q_len + t) * s.o_stride + std::size_t(h) * dim;
          for (int d = 0; d < dim; ++d) {
            if (std::isinf(lse1)) {
              ASSERT_TRUE(std::isnan(after_first[o + d])) << name;
            } else {
              ASSERT_EQ(after_first[o + d], part1.out[o + d]) << name;
            }
          }
        }
      }
    }
    ops.attention_merge(s, merged.out.data(), merged.lse.data(), part2.out.data(), part2.lse.data());
    for (int b = 0; b < s.batch; ++b) {
      for (int t = 0; t < 60; ++t) {  // queries 40..99 see nothing of block 2: unchanged bits
        for (int c = 0; c < s.q_heads * dim; ++c) {
          const std::size_t o = (std::size_t(b) * s.q_len + t) * s.o_stride + c;
          ASSERT_EQ(merged.out[o], after_first[o]) << name;
        }
      }
    }
    const std::vector<double> whole_out(whole.out.begin(), whole.out.end());
    const std::vector<double> whole_lse(whole.lse.begin(), whole.lse.end());
    expect_close(merged.out, whole_out, kTolerance, name + " merged out");
    expect_lse_close(merged.lse, whole_lse, name + " merged");

    part1.out = part2.out = merged.out;
    part1.lse = part2.lse = merged.lse;
    run_backward(ops, first, part1);
    run_backward(ops, second, part2);
    const std::size_t q_size = std::size_t(s.batch) * s.q_len * s.q_stride;
    const std::vector<double> whole_dq(whole.dq(full), whole.dq(full) + q_size);
    std::vector<float> dq_sum(q_size);
    for (std::size_t i = 0; i < q_size; ++i) dq_sum[i] = part1.dq(first)[i] + part2.dq(second)[i];
    expect_close(dq_sum, whole_dq, kTolerance, name + " dq");
    // The same sums made by the kernel: the second block's backward adds into the first's grads
    // (dq over both key blocks; dk, dv of the first block's layout get the second's added).
    Problem second_accumulating = second;
    second_accumulating.shape.accumulate_grads = true;
    std::vector<float> accumulated = part1.grads;
    ops.attention_backward(second_accumulating.shape, second.q(), second.k(), second.v(), second.docs(),
                           merged.out.data(), second.dout.data(), merged.lse.data(),
                           accumulated.data() + first.q_offset, accumulated.data() + first.k_offset,
                           accumulated.data() + first.v_offset);
    expect_close(std::vector<float>(accumulated.begin(), accumulated.begin() + std::ptrdiff_t(q_size)), whole_dq,
                 kTolerance, name + " dq accumulated by the kernel");
    for (std::size_t i = first.k_offset; i < accumulated.size(); ++i) {
      const std::size_t offset_in_block = i - first.k_offset;
      ASSERT_FLOAT_EQ(accumulated[i], part1.grads[i] + part2.grads[second.k_offset + offset_in_block])
          << name << " " << i;
    }
    const int64_t cols = int64_t(s.kv_heads) * dim;
    for (const auto& [part, block, lo] : {std::tuple{&part1, &first, 0}, std::tuple{&part2, &second, 100}}) {
      std::vector<float> dk_block, dv_block;
      std::vector<double> dk_whole, dv_whole;
      for (int b = 0; b < s.batch; ++b) {
        for (int j = 0; j < 100; ++j) {
          const float* dk_row = part->dk(*block) + (std::size_t(b) * 100 + j) * cols;
          const float* dv_row = part->dv(*block) + (std::size_t(b) * 100 + j) * cols;
          dk_block.insert(dk_block.end(), dk_row, dk_row + cols);
          dv_block.insert(dv_block.end(), dv_row, dv_row + cols);
          const float* dk_whole_row = whole.dk(full) + (std::size_t(b) * s.kv_len + lo + j) * cols;
          const float* dv_whole_row = whole.dv(full) + (std::size_t(b) * s.kv_len + lo + j) * cols;
          dk_whole.insert(dk_whole.end(), dk_whole_row, dk_whole_row + cols);
          dv_whole.insert(dv_whole.end(), dv_whole_row, dv_whole_row + cols);
        }
      }
      expect_close(dk_block, dk_whole, kTolerance, name + " dk block at " + std::to_string(lo));
      expect_close(dv_block, dv_whole, kTolerance, name + " dv block at " + std::to_string(lo));
    }
  }
}

// The reference's analytic gradients against central differences of its fp64 forward (fp64 so the
// differences are accurate to ~1e-9), and the kernel's gradients against both.
TEST(Attention, GradientsMatchFiniteDifferences) {
  Problem p = make_problem({1, 9, 9, 2, 1, 4, 0, 0}, 51);
  set_documents(p, {{0, 4}});
  const std::vector<double> inputs(p.inputs.begin(), p.inputs.end());
  const Reference ref = reference_attention(p, inputs);
  auto loss = [&](const std::vector<double>& x) {
    const Reference r = reference_attention(p, x);
    double sum = 0;
    for (std::size_t i = 0; i < r.out.size(); ++i) sum += r.out[i] * p.dout[i];  // compact out == o_stride layout
    return sum;
  };
  // Compact layouts: inputs = [Q | K | V] with the reference's dq | dk | dv ordering.
  std::vector<double> analytic = ref.dq;
  analytic.insert(analytic.end(), ref.dk.begin(), ref.dk.end());
  analytic.insert(analytic.end(), ref.dv.begin(), ref.dv.end());
  ASSERT_EQ(analytic.size(), inputs.size());
  const double step = 1e-5;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    std::vector<double> plus = inputs, minus = inputs;
    plus[i] += step;
    minus[i] -= step;
    EXPECT_NEAR((loss(plus) - loss(minus)) / (2 * step), analytic[i], 1e-7) << "input " << i;
  }
  for (CpuIsa isa : available_isas()) {
    const KernelRun run = run_kernel(mt::kernels::cpu::cpu_ops(isa), p);
    expect_close(run.grads, analytic, kTolerance, std::string(mt::kernels::isa_name(isa)) + " grads");
  }
}

TEST(Attention, ResultsDoNotDependOnThreadCount) {
  Problem p = make_problem({2, 257, 257, 4, 2, 16}, 61);
  set_documents(p, {{0, 17, 60, 200}, {0, 129}});
  const int saved_threads = omp_get_max_threads();
  for (CpuIsa isa : available_isas()) {
    const CpuOps& ops = mt::kernels::cpu::cpu_ops(isa);
    omp_set_num_threads(1);
    const KernelRun one = run_kernel(ops, p);
    omp_set_num_threads(2);
    const KernelRun two = run_kernel(ops, p);
    omp_set_num_threads(saved_threads);
    const std::string name = mt::kernels::isa_name(isa);
    EXPECT_EQ(std::memcmp(one.out.data(), two.out.data(), one.out.size() * sizeof(float)), 0) << name;
    EXPECT_EQ(std::memcmp(one.lse.data(), two.lse.data(), one.lse.size() * sizeof(float)), 0) << name;
    EXPECT_EQ(std::memcmp(one.grads.data(), two.grads.data(), one.grads.size() * sizeof(float)), 0) << name;
  }
}

}  // namespace
