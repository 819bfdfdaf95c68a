// Cases of the attention entries (see op_cases.h), against the naive double-precision attention of
// reference.h: odd sequence lengths around the 128-key tile, GQA, head_dim not a multiple of a
// vector, documents, global position offsets (queries that see no key: lse -inf, zero rows),
// packed q|k|v rows with unused NaN columns that must never be read or written; backward against
// the analytic reference and against central differences of the reference forward; grads
// accumulated with accumulate_grads; two key blocks merged through their lse (attention_merge)
// equal to one block, grads summed over the blocks (context parallelism); results independent of
// the thread count; memory linear in T at T = 4096. Attention dropout: against the reference's
// double loops drawing the same keyed mask (GQA, documents, offsets, a TP slice of the heads,
// packed rows), central differences with the mask fixed, merged key blocks, and the dropped
// fraction, seeds and iterations seen directly through V = I. Non-causal attention with key
// padding (BERT): against the reference (padded query rows included, a sample with no valid key,
// packed rows, dropout), padded keys changing no output bit; the CUDA entries refuse it by name.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "case_helpers.h"
#include "kernels/common/philox.h"
#include "op_cases.h"
#include "reference.h"

namespace mt::harness {
namespace {

constexpr float kSentinel = 7777.0f;
constexpr double kDoubleInf = std::numeric_limits<double>::infinity();
// fp32 kernel vs fp64 reference, relative to the tensor's largest magnitude (floor 0.1: tensors
// that vanish analytically, one key: dS = P (dP - delta) = 0, still carry O(1) inputs' rounding).
double attention_tolerance() { return tolerances(DType::f32).reference; }
constexpr double kFloor = 0.1;

// One attention problem on the host: Q, K, V in one buffer (compact blocks or packed rows).
struct Problem {
  AttentionLayout layout;
  std::vector<float> inputs;
  std::vector<float> dout;         // (batch * q_len, o_stride)
  std::vector<int32_t> doc_start;  // (batch * q_len) or empty
  std::vector<int64_t> row_ids;    // (batch * q_len) global token ids when dropping, else empty
  std::vector<int32_t> key_lengths;  // (batch) non-causal: valid keys per sample, or empty
  const AttentionShape& shape() const { return layout.shape; }
  size_t out_size() const { return size_t(shape().batch) * shape().q_len * shape().o_stride; }
  size_t lse_size() const { return size_t(shape().batch) * shape().q_heads * shape().q_len; }
};

struct ShapeSpec {
  int batch, q_len, kv_len, heads, kv_heads, dim;
  int64_t q_pos0 = 0, kv_pos0 = 0;
};

std::string describe(const ShapeSpec& s) {
  return shape_text({{"B", s.batch},
                     {"Tq", s.q_len},
                     {"Tkv", s.kv_len},
                     {"H", s.heads},
                     {"G", s.kv_heads},
                     {"D", s.dim},
                     {"q_pos0", s.q_pos0},
                     {"kv_pos0", s.kv_pos0}});
}

void fill_uniform(std::vector<float>& values, uint32_t seed, float range) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-range, range);
  for (float& x : values) x = dist(rng);
}

AttentionShape shape_of(const ShapeSpec& s, int64_t q_stride, int64_t kv_stride, int64_t o_stride) {
  AttentionShape shape;
  shape.batch = s.batch;
  shape.q_len = s.q_len;
  shape.kv_len = s.kv_len;
  shape.q_heads = s.heads;
  shape.kv_heads = s.kv_heads;
  shape.head_dim = s.dim;
  shape.q_stride = q_stride;
  shape.k_stride = shape.v_stride = kv_stride;
  shape.o_stride = o_stride;
  shape.q_pos0 = s.q_pos0;
  shape.kv_pos0 = s.kv_pos0;
  shape.scale = 1.0f / std::sqrt(float(s.dim));
  return shape;
}

// Compact Q, K, V blocks (strides heads*dim, kv_heads*dim) and o_stride heads*dim.
Problem make_problem(const ShapeSpec& s, uint32_t seed) {
  Problem p;
  p.layout.shape = shape_of(s, int64_t(s.heads) * s.dim, int64_t(s.kv_heads) * s.dim, int64_t(s.heads) * s.dim);
  const size_t q_size = size_t(s.batch) * s.q_len * s.heads * s.dim;
  const size_t kv_size = size_t(s.batch) * s.kv_len * s.kv_heads * s.dim;
  p.layout.k_offset = q_size;
  p.layout.v_offset = q_size + kv_size;
  p.inputs.resize(q_size + 2 * kv_size);
  fill_uniform(p.inputs, seed, 2.0f);
  p.dout.resize(p.out_size());
  fill_uniform(p.dout, seed + 1, 1.0f);
  return p;
}

// One packed row per token: [q heads | k heads | v heads | `extra` unused NaN columns] (a kernel
// reading them would poison its results); o_stride has 3 extra columns.
Problem make_packed_problem(const ShapeSpec& s, int extra, uint32_t seed) {
  Problem p;
  const int64_t stride = int64_t(s.heads + 2 * s.kv_heads) * s.dim + extra;
  p.layout.shape = shape_of(s, stride, stride, int64_t(s.heads) * s.dim + 3);
  p.layout.k_offset = size_t(s.heads) * s.dim;
  p.layout.v_offset = size_t(s.heads + s.kv_heads) * s.dim;
  p.inputs.resize(size_t(s.batch) * s.q_len * stride);
  fill_uniform(p.inputs, seed, 2.0f);
  for (size_t row = 0; row < size_t(s.batch) * s.q_len; ++row) {
    for (int64_t col = stride - extra; col < stride; ++col) p.inputs[row * stride + col] = std::nanf("");
  }
  p.dout.resize(p.out_size());
  fill_uniform(p.dout, seed + 1, 1.0f);
  return p;
}

// doc_start for documents starting at the given global positions of each sample.
void set_documents(Problem& p, const std::vector<std::vector<int64_t>>& starts) {
  const AttentionShape& s = p.shape();
  p.doc_start.resize(size_t(s.batch) * s.q_len);
  for (int b = 0; b < s.batch; ++b) {
    for (int t = 0; t < s.q_len; ++t) {
      int64_t start = 0;
      for (int64_t candidate : starts[b]) {
        if (candidate <= s.q_pos0 + t) start = candidate;
      }
      p.doc_start[size_t(b) * s.q_len + t] = static_cast<int32_t>(start);
    }
  }
}

// Attention dropout with probability `p` on the problem: sample b is global sample
// `first_sample + b` of sequences of `seq_length` tokens; local head h is global head
// q_head0 + h of `heads_total`.
void set_dropout(Problem& problem, float p, uint64_t seed, int64_t first_sample = 3, int64_t seq_length = 4096,
                 int q_head0 = 0, int heads_total = 0) {
  AttentionShape& s = problem.layout.shape;
  s.dropout.key = kernels::DropoutKey{seed, kernels::stream_id("attention-probs test"), 17, p};
  s.dropout.q_head0 = q_head0;
  s.dropout.q_heads_total = heads_total > 0 ? heads_total : s.q_heads;
  problem.row_ids.resize(size_t(s.batch) * s.q_len);
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < s.q_len; ++t) problem.row_ids[size_t(b) * s.q_len + t] = (first_sample + b) * seq_length + s.q_pos0 + t;
}

AttentionReference reference(const Problem& p) {
  return ref_attention(p.layout, to_double(p.inputs), p.dout, p.doc_start, p.row_ids, p.key_lengths);
}

// The problem's inputs on the device.
struct DeviceProblem {
  DeviceArray<float> inputs, dout;
  DeviceArray<int32_t> docs;
  DeviceArray<int64_t> row_ids;
  DeviceArray<int32_t> key_lengths;
  const float* q(const Problem& p) const { return inputs.data + p.layout.q_offset; }
  const float* k(const Problem& p) const { return inputs.data + p.layout.k_offset; }
  const float* v(const Problem& p) const { return inputs.data + p.layout.v_offset; }
  // `shape` with the dropout's row ids and the key lengths on the device.
  AttentionShape on_device(AttentionShape shape) const {
    shape.dropout.row_ids = row_ids.data;
    shape.key_lengths = key_lengths.data;
    return shape;
  }
};

DeviceProblem upload(CaseContext& c, const Problem& p) {
  return {c.upload(p.inputs), c.upload(p.dout), c.upload(p.doc_start), c.upload(p.row_ids), c.upload(p.key_lengths)};
}

// Device results: out and lse (sentinel before), grads in the inputs' layout (sentinel before).
struct DeviceResults {
  DeviceArray<float> out, lse, grads;
};

DeviceResults run_forward(CaseContext& c, const Problem& p, const DeviceProblem& d) {
  DeviceResults r{c.filled(int64_t(p.out_size()), kSentinel), c.filled(int64_t(p.lse_size()), kSentinel), {}};
  c.ops().attention_forward(d.on_device(p.shape()), d.q(p), d.k(p), d.v(p), d.docs.data, r.out.data, r.lse.data,
                            c.stream());
  return r;
}

// Backward with the given forward results (out, lse) into a sentinel-filled grads array laid out
// like the inputs (or into `into` when given).
void run_backward(CaseContext& c, const Problem& p, const DeviceProblem& d, DeviceResults& r,
                  const AttentionShape& shape) {
  if (!r.grads.data) r.grads = c.filled(int64_t(p.inputs.size()), kSentinel);
  c.ops().attention_backward(d.on_device(shape), d.q(p), d.k(p), d.v(p), d.docs.data, r.out.data, d.dout.data,
                             r.lse.data, r.grads.data + p.layout.q_offset, r.grads.data + p.layout.k_offset,
                             r.grads.data + p.layout.v_offset, c.stream());
}

// Host copies of a run's results.
struct HostResults {
  std::vector<float> out, lse, grads;
  const float* dq(const Problem& p) const { return grads.data() + p.layout.q_offset; }
  const float* dk(const Problem& p) const { return grads.data() + p.layout.k_offset; }
  const float* dv(const Problem& p) const { return grads.data() + p.layout.v_offset; }
};

HostResults download(CaseContext& c, const DeviceResults& r, const std::string& name) {
  HostResults h{c.download(r.out, name + " out"), c.download(r.lse, name + " lse"), {}};
  if (r.grads.data) h.grads = c.download(r.grads, name + " grads");
  return h;
}

HostResults run_kernel(CaseContext& c, const Problem& p, const std::string& name) {
  const DeviceProblem d = upload(c, p);
  DeviceResults r = run_forward(c, p, d);
  run_backward(c, p, d, r, p.shape());
  return download(c, r, name);
}

// The (rows, cols) block of a strided tensor, compact.
std::vector<float> compact(const float* base, int64_t rows, int64_t stride, int64_t cols) {
  std::vector<float> values(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) std::copy(base + r * stride, base + r * stride + cols, values.data() + r * cols);
  return values;
}

void expect_lse_close(CaseContext& c, const std::vector<float>& actual, const std::vector<double>& expected,
                      const std::string& what) {
  if (actual.size() != expected.size()) return c.fail(what + " lse: wrong size");
  for (size_t i = 0; i < actual.size(); ++i) {
    const bool ok = std::isinf(expected[i]) ? actual[i] == -std::numeric_limits<float>::infinity()
                                            : std::abs(actual[i] - expected[i]) <=
                                                  attention_tolerance() * std::max(1.0, std::abs(expected[i]));
    if (!ok) {
      return c.fail(what + " lse[" + std::to_string(i) + "] = " + std::to_string(actual[i]) + ", expected " +
                    std::to_string(expected[i]));
    }
  }
}

// Forward: out and lse against the reference; out's columns past the heads keep the sentinel.
void check_forward(CaseContext& c, const Problem& p, const AttentionReference& ref) {
  const AttentionShape& s = p.shape();
  const DeviceProblem d = upload(c, p);
  const HostResults run = download(c, run_forward(c, p, d), "forward");
  const int64_t q_rows = int64_t(s.batch) * s.q_len, q_cols = int64_t(s.q_heads) * s.head_dim;
  c.expect_max_close("out", compact(run.out.data(), q_rows, s.o_stride, q_cols), ref.out, attention_tolerance(),
                     kFloor);
  expect_lse_close(c, run.lse, ref.lse, "forward");
  for (int64_t r = 0; r < q_rows; ++r)
    for (int64_t col = q_cols; col < s.o_stride; ++col) {
      if (run.out[r * s.o_stride + col] != kSentinel) return c.fail("out column past the heads overwritten");
    }
}

// Backward: dq, dk, dv against the reference; grad elements outside the q, k, v columns (packed
// rows' unused columns) keep the sentinel.
void check_backward(CaseContext& c, const Problem& p, const AttentionReference& ref) {
  const AttentionShape& s = p.shape();
  const HostResults run = run_kernel(c, p, "kernel");
  const int64_t q_rows = int64_t(s.batch) * s.q_len, kv_rows = int64_t(s.batch) * s.kv_len;
  const int64_t q_cols = int64_t(s.q_heads) * s.head_dim, kv_cols = int64_t(s.kv_heads) * s.head_dim;
  const double tol = attention_tolerance();
  c.expect_max_close("dq", compact(run.dq(p), q_rows, s.q_stride, q_cols), ref.dq, tol, kFloor);
  c.expect_max_close("dk", compact(run.dk(p), kv_rows, s.k_stride, kv_cols), ref.dk, tol, kFloor);
  c.expect_max_close("dv", compact(run.dv(p), kv_rows, s.v_stride, kv_cols), ref.dv, tol, kFloor);
  std::vector<bool> written(p.inputs.size(), false);
  auto mark = [&](size_t offset, int64_t rows, int64_t stride, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < cols; ++col) written[offset + r * stride + col] = true;
  };
  mark(p.layout.q_offset, q_rows, s.q_stride, q_cols);
  mark(p.layout.k_offset, kv_rows, s.k_stride, kv_cols);
  mark(p.layout.v_offset, kv_rows, s.v_stride, kv_cols);
  for (size_t i = 0; i < written.size(); ++i) {
    if (!written[i] && run.grads[i] != kSentinel) {
      return c.fail("grad buffer element " + std::to_string(i) + " outside q, k, v overwritten");
    }
  }
}

// A problem and its reference, made on first use and shared by the cases that check it.
struct ProblemAndReference {
  Problem problem;
  AttentionReference reference;
};
using SharedProblem = std::shared_ptr<Lazy<ProblemAndReference>>;

SharedProblem shared_problem(std::function<Problem()> make) {
  return lazy<ProblemAndReference>([make = std::move(make)] {
    Problem p = make();
    AttentionReference r = reference(p);
    return ProblemAndReference{std::move(p), std::move(r)};
  });
}

// A problem as a pair of cases: the forward entry's and the backward entry's.
SharedProblem add_problem(std::vector<OpCase>& cases, const std::string& name, std::function<Problem()> make) {
  SharedProblem shared = shared_problem(std::move(make));
  cases.push_back(
      {.op = OpId::attention_forward, .mode = CaseMode::forward, .name = name, .body = [shared](CaseContext& c) {
         check_forward(c, shared->get().problem, shared->get().reference);
       }});
  cases.push_back(
      {.op = OpId::attention_backward,
       .mode = CaseMode::backward,
       .name = name,
       .also_uses = {OpId::attention_forward},
       .body = [shared](CaseContext& c) { check_backward(c, shared->get().problem, shared->get().reference); }});
  return shared;
}

void add_reference_problems(std::vector<OpCase>& cases) {
  const std::vector<ShapeSpec> specs = {
      {2, 7, 7, 2, 2, 8},      {1, 1, 1, 1, 1, 16},     {1, 130, 130, 1, 1, 16},
      {2, 257, 257, 4, 2, 12}, {1, 200, 200, 4, 1, 64}, {2, 65, 65, 3, 3, 33},
  };
  uint32_t seed = 100;
  for (const ShapeSpec& spec : specs) {
    const uint32_t problem_seed = ++seed;
    add_problem(cases, describe(spec), [spec, problem_seed] { return make_problem(spec, problem_seed); });
  }
  add_problem(cases, "documents " + describe({2, 257, 257, 4, 2, 16}), [] {
    Problem p = make_problem({2, 257, 257, 4, 2, 16}, 7);
    set_documents(p, {{0, 17, 60, 61, 128, 250}, {0, 100, 256}});
    return p;
  });
  // A context-parallel-like block: queries at [200, 330) over keys at [64, 330).
  add_problem(cases, "documents with offsets " + describe({2, 130, 266, 4, 2, 16, 200, 64}), [] {
    Problem p = make_problem({2, 130, 266, 4, 2, 16, 200, 64}, 8);
    set_documents(p, {{0, 50, 190, 250, 301}, {0, 329}});
    return p;
  });
  // Every key before every query (no causal mask at all), and a diagonal block away from 0.
  add_problem(cases, "keys before queries " + describe({2, 70, 100, 2, 1, 16, 100, 0}), [] {
    return make_problem({2, 70, 100, 2, 1, 16, 100, 0}, 21);
  });
  add_problem(cases, "diagonal block " + describe({1, 130, 130, 2, 2, 16, 64, 64}), [] {
    return make_problem({1, 130, 130, 2, 2, 16, 64, 64}, 22);
  });
  // Strides exactly (H + 2G) D, and with 5 unused NaN columns per token.
  add_problem(cases, "packed qkv " + describe({2, 130, 130, 4, 2, 16}), [] {
    return make_packed_problem({2, 130, 130, 4, 2, 16}, 0, 31);
  });
  add_problem(cases, "packed qkv with 5 unused columns, documents " + describe({2, 130, 130, 4, 2, 12}), [] {
    Problem p = make_packed_problem({2, 130, 130, 4, 2, 12}, 5, 32);
    set_documents(p, {{0, 70}, {0, 3, 129}});
    return p;
  });
}

// Queries at [0, 100), keys at [40, 110): queries 0..39 see no key (lse -inf, zero out and dq),
// keys 60..69 no query (zero dk, dv).
void add_hidden_block(std::vector<OpCase>& cases) {
  const ShapeSpec spec{2, 100, 70, 2, 1, 16, 0, 40};
  const auto shared =
      add_problem(cases, "partly hidden block " + describe(spec), [spec] { return make_problem(spec, 23); });
  cases.push_back(
      {.op = OpId::attention_backward,
       .mode = CaseMode::property,
       .name = "queries that see no key get lse -inf and zero rows; unseen keys zero grads, " + describe(spec),
       .also_uses = {OpId::attention_forward},
       .body = [shared](CaseContext& c) {
         const Problem& p = shared->get().problem;
         const HostResults run = run_kernel(c, p, "kernel");
         const AttentionShape& s = p.shape();
         for (int b = 0; b < s.batch; ++b) {
           for (int t = 0; t < 40; ++t) {
             for (int h = 0; h < s.q_heads; ++h) {
               c.expect(run.lse[(b * s.q_heads + h) * s.q_len + t] == -std::numeric_limits<float>::infinity(),
                        "lse of a query that sees no key is not -inf");
             }
             for (int col = 0; col < s.q_heads * s.head_dim; ++col) {
               c.expect(run.out[(b * s.q_len + t) * s.o_stride + col] == 0.0f, "out of a blind query");
               c.expect(run.dq(p)[(b * s.q_len + t) * s.q_stride + col] == 0.0f, "dq of a blind query");
             }
           }
           for (int j = 60; j < 70; ++j) {
             for (int col = 0; col < s.kv_heads * s.head_dim; ++col) {
               c.expect(run.dk(p)[(b * s.kv_len + j) * s.k_stride + col] == 0.0f, "dk of an unseen key");
               c.expect(run.dv(p)[(b * s.kv_len + j) * s.v_stride + col] == 0.0f, "dv of an unseen key");
             }
           }
         }
       }});
}

// The problem restricted to keys [lo, hi) of each sample (compact K, V; kv_pos0 moved).
Problem slice_keys(const Problem& full, int lo, int hi) {
  Problem p = full;
  AttentionShape& s = p.layout.shape;
  const int64_t cols = int64_t(s.kv_heads) * s.head_dim;
  const size_t q_size = size_t(s.batch) * s.q_len * s.q_stride;
  s.kv_len = hi - lo;
  s.kv_pos0 = full.shape().kv_pos0 + lo;
  s.k_stride = s.v_stride = cols;
  p.inputs.assign(full.inputs.begin(), full.inputs.begin() + std::ptrdiff_t(q_size));
  p.layout.k_offset = q_size;
  p.layout.v_offset = q_size + size_t(s.batch) * s.kv_len * cols;
  p.inputs.resize(p.layout.v_offset + size_t(s.batch) * s.kv_len * cols);
  for (int b = 0; b < s.batch; ++b) {
    for (int j = lo; j < hi; ++j) {
      const size_t src_row = size_t(b) * full.shape().kv_len + j, dst_row = size_t(b) * s.kv_len + j - lo;
      std::copy_n(full.inputs.data() + full.layout.k_offset + src_row * full.shape().k_stride, cols,
                  p.inputs.data() + p.layout.k_offset + dst_row * cols);
      std::copy_n(full.inputs.data() + full.layout.v_offset + src_row * full.shape().v_stride, cols,
                  p.inputs.data() + p.layout.v_offset + dst_row * cols);
    }
  }
  return p;
}

// Equal within 4 units in the last place (gtest's float equality).
bool float_eq(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return false;
  const auto biased = [](float f) {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    return (bits & 0x80000000u) ? ~bits + 1 : bits | 0x80000000u;
  };
  const uint32_t x = biased(a), y = biased(b);
  return (x >= y ? x - y : y - x) <= 4;
}

// Context parallelism: two key blocks attended separately, merged through their lse by
// attention_merge, then each block's backward run with the merged out and lse gives that block's
// dk, dv and a dq part; with accumulate_grads the entry sums them into existing grads.
// Queries at [40, 160) over keys [0, 200) split at 100: queries 40..99 see nothing of block 2
// (its lse -inf), keys 160..199 are seen by no query.
// With dropout, each block draws its part of the mask at its global key positions.
void check_merge(CaseContext& c, bool dropout) {
  Problem full = make_problem({2, 120, 200, 4, 2, 16, 40, 0}, 41);
  set_documents(full, {{0, 30, 95, 150}, {0, 120}});
  if (dropout) set_dropout(full, 0.2f, 5);
  const Problem first = slice_keys(full, 0, 100), second = slice_keys(full, 100, 200);
  const AttentionShape& s = full.shape();
  const HostResults whole = run_kernel(c, full, "whole");
  const DeviceProblem d_first = upload(c, first), d_second = upload(c, second);
  DeviceResults part1 = run_forward(c, first, d_first), part2 = run_forward(c, second, d_second);
  const HostResults part1_host = download(c, part1, "part 1");
  // The running result starts empty (lse -inf, out never read: NaN) and takes the blocks in turn.
  DeviceResults merged{c.filled(int64_t(full.out_size()), kNaN),
                       c.filled(int64_t(full.lse_size()), -std::numeric_limits<float>::infinity()),
                       {}};
  c.ops().attention_merge(s, merged.out.data, merged.lse.data, part1.out.data, part1.lse.data, c.stream());
  const std::vector<float> after_first = c.download(merged.out, "merged out after block 1");
  const int dim = s.head_dim;
  for (int b = 0; b < s.batch; ++b)  // rows that saw a key of block 1 copy it, the others wait
    for (int h = 0; h < s.q_heads; ++h)
      for (int t = 0; t < s.q_len; ++t) {
        const bool blind = std::isinf(part1_host.lse[(size_t(b) * s.q_heads + h) * s.q_len + t]);
        const size_t o = (size_t(b) * s.q_len + t) * s.o_stride + size_t(h) * dim;
        for (int e = 0; e < dim; ++e) {
          if (blind ? !std::isnan(after_first[o + e]) : after_first[o + e] != part1_host.out[o + e]) {
            return c.fail("merging block 1 into an empty result did not copy it");
          }
        }
      }
  c.ops().attention_merge(s, merged.out.data, merged.lse.data, part2.out.data, part2.lse.data, c.stream());
  const HostResults merged_host = download(c, merged, "merged");
  for (int b = 0; b < s.batch; ++b)  // queries 40..99 see nothing of block 2: unchanged bits
    for (int t = 0; t < 60; ++t)
      for (int col = 0; col < s.q_heads * dim; ++col) {
        const size_t o = (size_t(b) * s.q_len + t) * s.o_stride + col;
        if (merged_host.out[o] != after_first[o]) return c.fail("a block with lse -inf changed the result");
      }
  c.expect_max_close("merged out", merged_host.out, to_double(whole.out), attention_tolerance(), kFloor);
  expect_lse_close(c, merged_host.lse, to_double(whole.lse), "merged");

  // Each block's backward with the merged out and lse.
  part1.out = part2.out = merged.out;
  part1.lse = part2.lse = merged.lse;
  run_backward(c, first, d_first, part1, first.shape());
  run_backward(c, second, d_second, part2, second.shape());
  const HostResults grads1 = download(c, part1, "block 1 backward"), grads2 = download(c, part2, "block 2 backward");
  const size_t q_size = size_t(s.batch) * s.q_len * s.q_stride;
  const std::vector<double> whole_dq(whole.dq(full), whole.dq(full) + q_size);
  std::vector<float> dq_sum(q_size);
  for (size_t i = 0; i < q_size; ++i) dq_sum[i] = grads1.dq(first)[i] + grads2.dq(second)[i];
  c.expect_max_close("dq summed over the blocks", dq_sum, whole_dq, attention_tolerance(), kFloor);

  // The same sums made by the entry: block 2's backward adds into block 1's grads (dq over both
  // key blocks; dk, dv of block 1's layout get block 2's added).
  AttentionShape accumulating = second.shape();
  accumulating.accumulate_grads = true;
  DeviceResults into{merged.out, merged.lse, c.upload(grads1.grads)};
  c.ops().attention_backward(d_second.on_device(accumulating), d_second.q(second), d_second.k(second), d_second.v(second),
                             d_second.docs.data, merged.out.data, d_second.dout.data, merged.lse.data,
                             into.grads.data + first.layout.q_offset, into.grads.data + first.layout.k_offset,
                             into.grads.data + first.layout.v_offset, c.stream());
  const std::vector<float> accumulated = c.download(into.grads, "accumulated grads");
  c.expect_max_close("dq accumulated by the entry",
                     std::vector<float>(accumulated.begin(), accumulated.begin() + std::ptrdiff_t(q_size)), whole_dq,
                     attention_tolerance(), kFloor);
  for (size_t i = first.layout.k_offset; i < accumulated.size(); ++i) {
    const float expected = grads1.grads[i] + grads2.grads[second.layout.k_offset + (i - first.layout.k_offset)];
    if (!float_eq(accumulated[i], expected)) {
      return c.fail("accumulated dk/dv[" + std::to_string(i) + "] = " + std::to_string(accumulated[i]) + ", expected " +
                    std::to_string(expected));
    }
  }
  const int64_t cols = int64_t(s.kv_heads) * dim;
  for (const auto& [grads, block, lo] : {std::tuple{&grads1, &first, 0}, std::tuple{&grads2, &second, 100}}) {
    std::vector<float> dk_block, dv_block;
    std::vector<double> dk_whole, dv_whole;
    for (int b = 0; b < s.batch; ++b)
      for (int j = 0; j < 100; ++j) {
        const float* dk_row = grads->dk(*block) + (size_t(b) * 100 + j) * cols;
        const float* dv_row = grads->dv(*block) + (size_t(b) * 100 + j) * cols;
        dk_block.insert(dk_block.end(), dk_row, dk_row + cols);
        dv_block.insert(dv_block.end(), dv_row, dv_row + cols);
        const float* dk_whole_row = whole.dk(full) + (size_t(b) * s.kv_len + lo + j) * cols;
        const float* dv_whole_row = whole.dv(full) + (size_t(b) * s.kv_len + lo + j) * cols;
        dk_whole.insert(dk_whole.end(), dk_whole_row, dk_whole_row + cols);
        dv_whole.insert(dv_whole.end(), dv_whole_row, dv_whole_row + cols);
      }
    c.expect_max_close("dk of the block at " + std::to_string(lo), dk_block, dk_whole, attention_tolerance(), kFloor);
    c.expect_max_close("dv of the block at " + std::to_string(lo), dv_block, dv_whole, attention_tolerance(), kFloor);
  }
}

void add_block_cases(std::vector<OpCase>& cases) {
  cases.push_back({.op = OpId::attention_merge,
                   .mode = CaseMode::property,
                   .name = "two key blocks merged through lse equal one block; their grads sum (accumulate_grads), " +
                           describe({2, 120, 200, 4, 2, 16, 40, 0}),
                   .also_uses = {OpId::attention_forward, OpId::attention_backward},
                   .body = [](CaseContext& c) { check_merge(c, false); }});
  cases.push_back({.op = OpId::attention_merge,
                   .mode = CaseMode::property,
                   .name = "dropout 0.2: two key blocks merged through lse equal one block, grads sum, " +
                           describe({2, 120, 200, 4, 2, 16, 40, 0}),
                   .also_uses = {OpId::attention_forward, OpId::attention_backward},
                   .body = [](CaseContext& c) { check_merge(c, true); }});
  cases.push_back(
      {.op = OpId::attention_backward,
       .mode = CaseMode::accumulate,
       .name = "accumulate_grads: two calls add twice onto random grads, " + describe({2, 65, 65, 4, 2, 12}),
       .also_uses = {OpId::attention_forward},
       .body = [](CaseContext& c) {
         Problem p = make_problem({2, 65, 65, 4, 2, 12}, 45);
         set_documents(p, {{0, 20}, {0, 40}});
         const AttentionReference ref = reference(p);
         const auto start = random_floats(p.inputs.size(), 46);
         const DeviceProblem d = upload(c, p);
         DeviceResults r = run_forward(c, p, d);
         r.grads = c.upload(start);
         AttentionShape accumulating = p.shape();
         accumulating.accumulate_grads = true;
         run_backward(c, p, d, r, accumulating);
         run_backward(c, p, d, r, accumulating);
         const std::vector<float> grads = c.download(r.grads, "grads");
         std::vector<double> expected = to_double(start);  // compact layout: [dq | dk | dv]
         const std::vector<double>* parts[] = {&ref.dq, &ref.dk, &ref.dv};
         const size_t offsets[] = {p.layout.q_offset, p.layout.k_offset, p.layout.v_offset};
         for (int part = 0; part < 3; ++part)
           for (size_t i = 0; i < parts[part]->size(); ++i) expected[offsets[part] + i] += 2 * (*parts[part])[i];
         c.expect_max_close("grads", grads, expected, attention_tolerance(), kFloor);
       }});
}

// The reference's analytic grads against central differences of its fp64 forward (accurate to
// ~1e-9), and the entry's grads against those differences.
// With dropout the mask (a function of the coordinates only) stays fixed under the differences.
void check_finite_differences(CaseContext& c, float dropout) {
  Problem p = make_problem({1, 9, 9, 2, 1, 4, 0, 0}, 51);
  set_documents(p, {{0, 4}});
  if (dropout > 0) set_dropout(p, dropout, 9);
  const std::vector<double> inputs = to_double(p.inputs);
  auto loss = [&](const std::vector<double>& x) {
    const AttentionReference r = ref_attention(p.layout, x, p.dout, p.doc_start, p.row_ids);
    double sum = 0;
    for (size_t i = 0; i < r.out.size(); ++i) sum += r.out[i] * p.dout[i];  // compact out == o_stride layout
    return sum;
  };
  const double step = 1e-5;
  std::vector<double> differences(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<double> plus = inputs, minus = inputs;
    plus[i] += step;
    minus[i] -= step;
    differences[i] = (loss(plus) - loss(minus)) / (2 * step);
  }
  const AttentionReference ref = reference(p);
  std::vector<double> analytic = ref.dq;  // compact layouts: inputs = [Q | K | V]
  analytic.insert(analytic.end(), ref.dk.begin(), ref.dk.end());
  analytic.insert(analytic.end(), ref.dv.begin(), ref.dv.end());
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.expect(std::abs(differences[i] - analytic[i]) <= 1e-7,
             "reference grad " + std::to_string(i) + " is not its forward's central difference");
  }
  c.expect_max_close("grads", run_kernel(c, p, "kernel").grads, differences, attention_tolerance(), kFloor);
}

// T = 4096 without a (T, T) buffer: the process's peak grows by less than 24 MiB (the scores alone
// would take 64 MiB); rows of out and lse against fp64; softmax rows sum to 1 and dS rows to 0,
// so sum_s dv[s] = sum_t dout[t] and sum_s dk[s] = 0.
void check_long_sequence(CaseContext& c) {
  const ShapeSpec spec{1, 4096, 4096, 1, 1, 64};
  const Problem p = make_problem(spec, 11);
  const int dim = spec.dim;
  const DeviceProblem d = upload(c, p);
  DeviceResults r{c.filled(int64_t(p.out_size()), kSentinel), c.filled(int64_t(p.lse_size()), kSentinel),
                  c.filled(int64_t(p.inputs.size()), kSentinel)};
  c.ops().synchronize(c.stream());
  const long before = c.peak_rss_kib ? c.peak_rss_kib() : 0;
  c.ops().attention_forward(p.shape(), d.q(p), d.k(p), d.v(p), nullptr, r.out.data, r.lse.data, c.stream());
  run_backward(c, p, d, r, p.shape());
  c.ops().synchronize(c.stream());
  if (c.peak_rss_kib) {
    const long growth = c.peak_rss_kib() - before;
    c.expect(growth < 24 * 1024, "peak memory grew by " + std::to_string(growth) + " KiB");
  }
  const HostResults run = download(c, r, "kernel");
  const float* q = p.inputs.data() + p.layout.q_offset;
  const float* k = p.inputs.data() + p.layout.k_offset;
  const float* v = p.inputs.data() + p.layout.v_offset;
  for (int t : {0, 1, 2047, 4095}) {
    std::vector<double> scores(size_t(t) + 1), out(dim, 0.0);
    double max_score = -kDoubleInf, sum = 0;
    for (int j = 0; j <= t; ++j) {
      double dot = 0;
      for (int e = 0; e < dim; ++e) dot += double(q[t * dim + e]) * k[j * dim + e];
      scores[j] = p.shape().scale * dot;
      max_score = std::max(max_score, scores[j]);
    }
    for (int j = 0; j <= t; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
    for (int j = 0; j <= t; ++j)
      for (int e = 0; e < dim; ++e) out[e] += scores[j] / sum * v[j * dim + e];
    for (int e = 0; e < dim; ++e) {
      c.expect(std::abs(run.out[t * dim + e] - out[e]) <= 1e-5, "out row " + std::to_string(t));
    }
    const double lse = max_score + std::log(sum);
    c.expect(std::abs(run.lse[t] - lse) <= 1e-5 * std::max(1.0, std::abs(max_score)), "lse row " + std::to_string(t));
  }
  for (int e = 0; e < dim; ++e) {
    double dv_sum = 0, dk_sum = 0, dk_abs = 0, dout_sum = 0;
    for (int j = 0; j < spec.kv_len; ++j) {
      dv_sum += run.dv(p)[j * dim + e];
      dk_sum += run.dk(p)[j * dim + e];
      dk_abs += std::abs(run.dk(p)[j * dim + e]);
      dout_sum += p.dout[j * dim + e];
    }
    c.expect(std::abs(dv_sum - dout_sum) <= 1e-3, "sum of dv column " + std::to_string(e));
    c.expect(std::abs(dk_sum) <= 1e-5 * dk_abs, "sum of dk column " + std::to_string(e));
  }
  c.expect(std::all_of(run.grads.begin(), run.grads.end(), [](float x) { return std::isfinite(x); }),
           "a grad is not finite");
}

// Attention dropout against the double loops of the reference, which draw every pair's keep
// decision from keyed_uniform at the same global coordinates: odd lengths around the tiles, GQA,
// documents, global offsets, a TP-like slice of the heads (local heads 3.. of 11), packed rows.
void add_dropout_problems(std::vector<OpCase>& cases) {
  add_problem(cases, "dropout 0.1, documents " + describe({2, 257, 257, 4, 2, 16}), [] {
    Problem p = make_problem({2, 257, 257, 4, 2, 16}, 71);
    set_documents(p, {{0, 17, 60, 61, 128, 250}, {0, 100, 256}});
    set_dropout(p, 0.1f, 1);
    return p;
  });
  add_problem(cases, "dropout 0.5, heads 3..6 of 11 " + describe({3, 67, 67, 3, 1, 12}), [] {
    Problem p = make_problem({3, 67, 67, 3, 1, 12}, 72);
    set_dropout(p, 0.5f, 2, 11, 67, 3, 11);
    return p;
  });
  add_problem(cases, "dropout 0.2, documents with offsets " + describe({2, 130, 266, 4, 2, 16, 200, 64}), [] {
    Problem p = make_problem({2, 130, 266, 4, 2, 16, 200, 64}, 73);
    set_documents(p, {{0, 50, 190, 250, 301}, {0, 329}});
    set_dropout(p, 0.2f, 3);
    return p;
  });
  add_problem(cases, "dropout 0.1, packed qkv with 5 unused columns " + describe({2, 130, 130, 4, 2, 12}), [] {
    Problem p = make_packed_problem({2, 130, 130, 4, 2, 12}, 5, 74);
    set_documents(p, {{0, 70}, {0, 3, 129}});
    set_dropout(p, 0.1f, 4);
    return p;
  });
}

// The mask seen directly: Q = K = 0 (uniform probabilities 1/64 over 64 keys that all precede
// the queries) and V = I (head_dim 64), so out(query, key) = keep / (1 - p) / 64. Over 2 x 2048 x
// 4 x 64 = 1M pairs the dropped fraction is within 3 standard deviations of p, every kept value
// is 1 / (1 - p) / 64; the same seed gives the same mask, another seed (or iteration) another.
void check_mask_statistics(CaseContext& c) {
  constexpr float kP = 0.1f;
  constexpr int kKeys = 64, kQueries = 2048, kHeads = 4, kBatch = 2;
  Problem p = make_problem({kBatch, kQueries, kKeys, kHeads, 1, kKeys, kKeys, 0}, 81);
  std::fill(p.inputs.begin(), p.inputs.begin() + std::ptrdiff_t(p.layout.v_offset), 0.0f);
  for (int b = 0; b < kBatch; ++b)
    for (int j = 0; j < kKeys; ++j)
      for (int e = 0; e < kKeys; ++e) p.inputs[p.layout.v_offset + (size_t(b) * kKeys + j) * kKeys + e] = j == e;
  const auto out_of = [&](uint64_t seed, uint64_t iteration) {
    Problem run = p;
    set_dropout(run, kP, seed);
    run.layout.shape.dropout.key.iteration = iteration;
    const DeviceProblem d = upload(c, run);
    return c.download(run_forward(c, run, d).out, "out");
  };
  const std::vector<float> first = out_of(1, 17), again = out_of(1, 17), other_seed = out_of(2, 17),
                           other_iteration = out_of(1, 18);
  const float kept = 1.0f / (1.0f - kP) / kKeys;
  double dropped = 0;
  for (float x : first) {
    if (x == 0.0f) {
      ++dropped;
    } else if (std::abs(x - kept) > 1e-6f * kept) {
      return c.fail("a kept probability is " + std::to_string(x) + ", expected " + std::to_string(kept));
    }
  }
  const double n = double(first.size()), fraction = dropped / n, sigma = std::sqrt(kP * (1 - kP) / n);
  c.expect(std::abs(fraction - kP) <= 3 * sigma, "dropped fraction " + std::to_string(fraction) + " over " +
                                                     std::to_string(n) + " pairs, 3 sigma " + std::to_string(3 * sigma));
  c.expect(first == again, "the same seed gave another mask");
  for (const auto* other : {&other_seed, &other_iteration}) {
    double differ = 0;
    for (size_t i = 0; i < first.size(); ++i) differ += (first[i] == 0.0f) != ((*other)[i] == 0.0f);
    // Independent masks differ in 2 p (1 - p) = 18% of the pairs.
    c.expect(std::abs(differ / n - 2 * kP * (1 - kP)) <= 0.01, "another seed or iteration: " +
                                                                   std::to_string(differ / n) + " of the pairs differ");
  }
}

void add_attention_dropout_cases(std::vector<OpCase>& cases) {
  add_dropout_problems(cases);
  cases.push_back({.op = OpId::attention_forward,
                   .mode = CaseMode::property,
                   .name = "dropout 0.1: dropped fraction within 3 sigma over 1M pairs, seeds and iterations",
                   .body = check_mask_statistics});
}

// Non-causal attention with a key padding mask (BERT): sample b sees keys [0, lengths[b]).
Problem make_padded_problem(const ShapeSpec& spec, std::vector<int32_t> lengths, uint32_t seed, int packed_extra = -1) {
  Problem p = packed_extra < 0 ? make_problem(spec, seed) : make_packed_problem(spec, packed_extra, seed);
  p.layout.shape.causal = false;
  p.key_lengths = std::move(lengths);
  return p;
}

// The CUDA entries refuse the non-causal mode by name (no kernel yet); other backends run it.
bool refuses_non_causal(CaseContext& c, const std::function<void()>& run) {
  if (std::string(c.ops().name) != "cuda") return false;
  try {
    run();
    c.fail("the cuda backend ran non-causal attention it has no kernel for");
  } catch (const std::exception& error) {
    c.expect(std::string(error.what()).find("non-causal") != std::string::npos,
             std::string("refusal does not name the non-causal mode: ") + error.what());
  }
  return true;
}

void add_padded_problem(std::vector<OpCase>& cases, const std::string& name, std::function<Problem()> make) {
  SharedProblem shared = shared_problem(std::move(make));
  cases.push_back({.op = OpId::attention_forward,
                   .mode = CaseMode::forward,
                   .name = name,
                   .body = [shared](CaseContext& c) {
                     const Problem& p = shared->get().problem;
                     if (refuses_non_causal(c, [&] { run_forward(c, p, upload(c, p)); c.finish(); })) return;
                     check_forward(c, p, shared->get().reference);
                   }});
  cases.push_back({.op = OpId::attention_backward,
                   .mode = CaseMode::backward,
                   .name = name,
                   .also_uses = {OpId::attention_forward},
                   .body = [shared](CaseContext& c) {
                     const Problem& p = shared->get().problem;
                     if (refuses_non_causal(c, [&] { run_kernel(c, p, "kernel"); })) return;
                     check_backward(c, p, shared->get().reference);
                   }});
}

// Padded keys reach nothing: changing their K and V leaves out and lse the same bits, and their
// dk, dv are exactly zero.
void check_padding_hidden(CaseContext& c) {
  const ShapeSpec spec{2, 100, 100, 2, 1, 16};
  const std::vector<int32_t> lengths = {70, 9};
  const Problem p = make_padded_problem(spec, lengths, 91);
  if (refuses_non_causal(c, [&] { run_kernel(c, p, "kernel"); })) return;
  Problem changed = p;
  const AttentionShape& s = p.shape();
  const int64_t cols = int64_t(s.kv_heads) * s.head_dim;
  for (int b = 0; b < s.batch; ++b) {
    for (int j = lengths[size_t(b)]; j < s.kv_len; ++j) {
      const size_t row = size_t(b) * s.kv_len + j;
      for (int64_t col = 0; col < cols; ++col) {
        changed.inputs[p.layout.k_offset + row * s.k_stride + col] = 50.0f;
        changed.inputs[p.layout.v_offset + row * s.v_stride + col] = -9.0f;
      }
    }
  }
  const HostResults run = run_kernel(c, p, "padded");
  const HostResults other = run_kernel(c, changed, "padded keys changed");
  c.expect_bits_equal("out with padded keys changed", other.out, run.out);
  c.expect_bits_equal("lse with padded keys changed", other.lse, run.lse);
  for (int b = 0; b < s.batch; ++b) {
    for (int j = lengths[size_t(b)]; j < s.kv_len; ++j) {
      for (int64_t col = 0; col < cols; ++col) {
        const size_t row = size_t(b) * s.kv_len + j;
        c.expect(run.dk(p)[row * s.k_stride + col] == 0.0f && run.dv(p)[row * s.v_stride + col] == 0.0f,
                 "dk, dv of a padded key not zero");
      }
    }
  }
}

void add_padding_cases(std::vector<OpCase>& cases) {
  add_padded_problem(cases, "non-causal, keys padded to 77/40/1 " + describe({3, 77, 77, 4, 2, 16}),
                     [] { return make_padded_problem({3, 77, 77, 4, 2, 16}, {77, 40, 1}, 81); });
  add_padded_problem(cases, "non-causal, no key lengths " + describe({2, 130, 130, 2, 2, 16}), [] {
    Problem p = make_padded_problem({2, 130, 130, 2, 2, 16}, {}, 82);
    return p;
  });
  add_padded_problem(cases, "non-causal packed qkv, 5 NaN columns, keys 65/0 " + describe({2, 130, 130, 4, 2, 12}),
                     [] { return make_padded_problem({2, 130, 130, 4, 2, 12}, {65, 0}, 83, 5); });
  add_padded_problem(cases, "non-causal with dropout 0.3, keys 100/33 " + describe({2, 100, 100, 2, 1, 16}), [] {
    Problem p = make_padded_problem({2, 100, 100, 2, 1, 16}, {100, 33}, 84);
    set_dropout(p, 0.3f, 11);
    return p;
  });
  cases.push_back({.op = OpId::attention_backward,
                   .mode = CaseMode::property,
                   .name = "non-causal: padded keys change no output bit and get zero grads",
                   .also_uses = {OpId::attention_forward},
                   .body = check_padding_hidden});
}

}  // namespace

void add_attention_cases(std::vector<OpCase>& cases) {
  cases.push_back({.op = OpId::attention_backward,
                   .mode = CaseMode::property,
                   .name = "T=4096 D=64: memory linear in T, rows against fp64, grad sums",
                   .also_uses = {OpId::attention_forward},
                   .measures_host_memory = true,
                   .body = check_long_sequence});
  add_reference_problems(cases);
  add_hidden_block(cases);
  add_block_cases(cases);
  cases.push_back({.op = OpId::attention_backward,
                   .mode = CaseMode::grad,
                   .name = "documents " + describe({1, 9, 9, 2, 1, 4}) + ", and the reference's own grads",
                   .also_uses = {OpId::attention_forward},
                   .body = [](CaseContext& c) { check_finite_differences(c, 0.0f); }});
  cases.push_back({.op = OpId::attention_backward,
                   .mode = CaseMode::grad,
                   .name = "dropout 0.3, mask fixed: documents " + describe({1, 9, 9, 2, 1, 4}) +
                           ", and the reference's own grads",
                   .also_uses = {OpId::attention_forward},
                   .body = [](CaseContext& c) { check_finite_differences(c, 0.3f); }});
  add_attention_dropout_cases(cases);
  add_padding_cases(cases);
  cases.push_back(
      {.op = OpId::attention_backward,
       .mode = CaseMode::property,
       .name = "out, lse and grads the same bits at any thread count, documents " + describe({2, 257, 257, 4, 2, 16}),
       .also_uses = {OpId::attention_forward},
       .thread_count_independent = true,
       .body = [shared = shared_problem([] {
                  Problem p = make_problem({2, 257, 257, 4, 2, 16}, 61);
                  set_documents(p, {{0, 17, 60, 200}, {0, 129}});
                  return p;
                })](CaseContext& c) {  // run at two thread counts: one reference
         const Problem& p = shared->get().problem;
         const HostResults run = run_kernel(c, p, "kernel");
         const AttentionReference& ref = shared->get().reference;  // grads = [dq | dk | dv]
         std::vector<double> grads = ref.dq;
         grads.insert(grads.end(), ref.dk.begin(), ref.dk.end());
         grads.insert(grads.end(), ref.dv.begin(), ref.dv.end());
         c.expect_max_close("out", run.out, ref.out, attention_tolerance(), kFloor);
         expect_lse_close(c, run.lse, ref.lse, "kernel");
         c.expect_max_close("grads", run.grads, grads, attention_tolerance(), kFloor);
       }});
}

}  // namespace mt::harness
