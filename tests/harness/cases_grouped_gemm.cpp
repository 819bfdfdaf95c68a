// Cases of the MoE experts' entries (see op_cases.h): the grouped GEMM with ragged rows (both
// transposes of the per-group weights at a stride, odd shapes, empty groups first, inside and last,
// every group empty, leading dimensions wider than the matrices, alpha and beta) and with ragged
// depth (the weight-grad form, depth-0 groups under beta 0 over NaN, beta 1 and beta 0.5), on f32
// and bf16 operands against double loops over the operands' rounded values, outputs of several of
// the CPU's tiles included, each result the same bits at any thread count; other operand types
// refused by name; the probs' row scaling and its backward (in place too) against
// double loops and central differences.
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "case_helpers.h"
#include "kernels/common/half.h"
#include "op_cases.h"
#include "reference.h"

namespace mt::harness {
namespace {

struct GroupedShape {
  bool trans_b;                 // ragged rows: the weights' transpose; ragged depth: unused
  std::vector<int64_t> counts;  // rows (or depths) per group
  int64_t n, k;                 // ragged rows: C_g (m_g, n), depth k; ragged depth: C_g (k, n)
                                // from m = k
  int64_t extra_ld;             // leading dimensions beyond the rows' widths
  float alpha, beta;
  uint32_t seed;
};

std::string counts_text(const std::vector<int64_t>& counts) {
  std::string text = "[";
  for (size_t g = 0; g < counts.size(); ++g) {
    if (g) text += ',';
    text += std::to_string(counts[g]);
  }
  text += ']';
  return text;
}

std::string describe(const GroupedShape& s, bool ragged_depth) {
  return std::string(ragged_depth ? "" : (s.trans_b ? "NT " : "NN ")) + (ragged_depth ? "depths=" : "rows=") +
         counts_text(s.counts) + " " +
         shape_text({{ragged_depth ? "m" : "n", ragged_depth ? s.k : s.n},
                     {ragged_depth ? "n" : "k", ragged_depth ? s.n : s.k},
                     {"ld+", s.extra_ld}}) +
         " alpha=" + std::to_string(s.alpha).substr(0, 4) + " beta=" + std::to_string(s.beta).substr(0, 4);
}

int64_t total(const std::vector<int64_t>& counts) { return std::accumulate(counts.begin(), counts.end(), int64_t{0}); }

// An operand as the entry takes it (f32 values or bf16 bits) and the values it stands for.
struct Operand {
  std::vector<float> values;   // rounded to the dtype
  std::vector<uint16_t> bits;  // bf16 only
};

Operand make_operand(std::vector<float> values, DType dtype) {
  Operand operand{std::move(values), {}};
  if (dtype == DType::f32) return operand;
  operand.bits.resize(operand.values.size());
  for (size_t i = 0; i < operand.values.size(); ++i) {
    operand.bits[i] = kernels::fp32_to_bf16_bits(operand.values[i]);
    operand.values[i] = kernels::bf16_bits_to_fp32(operand.bits[i]);
  }
  return operand;
}

const void* device_operand(CaseContext& c, const Operand& operand, DType dtype) {
  if (dtype == DType::f32) return c.upload(operand.values).data;
  return c.upload(operand.bits).data;
}

// Elements of `what` against `expected` at absolute `tol`; the first miss reported.
void expect_within(CaseContext& c, const std::string& what, const std::vector<float>& actual,
                   const std::vector<double>& expected, double tol) {
  for (size_t i = 0; i < actual.size(); ++i) {
    const double error = std::abs(actual[i] - expected[i]);
    if (!(error <= tol) && !(std::isnan(expected[i]) && std::isnan(actual[i]))) {
      return c.fail(what + "[" + std::to_string(i) + "] = " + std::to_string(actual[i]) + ", expected " +
                    std::to_string(expected[i]));
    }
  }
}

// The ragged-rows operands: A (R, k) at lda, B per group at a stride, C (R, n) at ldc.
struct RaggedRows {
  int64_t rows, lda, ldb, b_rows, b_stride, ldc;
  Operand a, b;
  std::vector<float> c0;
};

RaggedRows ragged_rows_inputs(const GroupedShape& s, DType dtype) {
  RaggedRows in;
  in.rows = total(s.counts);
  in.lda = s.k + s.extra_ld;
  in.ldb = (s.trans_b ? s.k : s.n) + s.extra_ld;
  in.b_rows = s.trans_b ? s.n : s.k;
  in.b_stride = in.b_rows * in.ldb + 5;  // groups' weights apart, not adjacent
  in.ldc = s.n + s.extra_ld;
  in.a = make_operand(random_floats(in.rows * in.lda, s.seed), dtype);
  in.b = make_operand(random_floats(static_cast<size_t>(s.counts.size()) * in.b_stride, s.seed + 1), dtype);
  in.c0 = random_floats(in.rows * in.ldc + 3,
                        s.seed + 2);  // 3 floats past the last row: untouched
  return in;
}

// C_g = alpha A_g op(B_g) + beta C_g per group, in double over the rounded operands.
std::vector<double> ragged_rows_reference(const GroupedShape& s, const RaggedRows& in) {
  std::vector<double> expected = to_double(in.c0);
  int64_t row = 0;
  for (size_t g = 0; g < s.counts.size(); ++g) {
    const int64_t m = s.counts[g];
    const std::vector<float> a(in.a.values.begin() + row * in.lda, in.a.values.begin() + (row + m) * in.lda);
    const std::vector<float> b(in.b.values.begin() + g * in.b_stride,
                               in.b.values.begin() + g * in.b_stride + in.b_rows * in.ldb);
    const std::vector<float> c0(in.c0.begin() + row * in.ldc, in.c0.begin() + (row + m) * in.ldc);
    const std::vector<double> group =
        ref_gemm(false, s.trans_b, m, s.n, s.k, s.alpha, a, in.lda, b, in.ldb, s.beta, c0, in.ldc);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < s.n; ++j) expected[(row + i) * in.ldc + j] = group[i * in.ldc + j];
    row += m;
  }
  return expected;
}

void check_ragged_rows(CaseContext& c, const GroupedShape& s, DType dtype) {
  const RaggedRows in = ragged_rows_inputs(s, dtype);
  const DeviceArray<float> out = c.upload(in.c0);
  c.ops().grouped_gemm(s.trans_b, static_cast<int64_t>(s.counts.size()), s.counts.data(), s.n, s.k, s.alpha,
                       device_operand(c, in.a, dtype), in.lda, device_operand(c, in.b, dtype), in.ldb, in.b_stride,
                       s.beta, out.data, in.ldc, dtype, c.stream());
  // Columns past n and the floats past the last row keep C's values (the reference keeps them).
  expect_within(c, "c", c.download(out, "c"), ragged_rows_reference(s, in), tolerances(dtype).gemm);
}

// The ragged-depth operands: A (K, m) at lda, B (K, n) at ldb, C_g (m, n) at ldc, c_stride apart.
struct RaggedDepth {
  int64_t depth, m, lda, ldb, ldc, c_stride;
  Operand a, b;
  std::vector<float> c0;
};

RaggedDepth ragged_depth_inputs(const GroupedShape& s, DType dtype) {
  RaggedDepth in;
  in.depth = total(s.counts);
  in.m = s.k;
  in.lda = in.m + s.extra_ld;
  in.ldb = s.n + s.extra_ld;
  in.ldc = s.n + s.extra_ld;
  in.c_stride = in.m * in.ldc + 7;
  in.a = make_operand(random_floats(in.depth * in.lda, s.seed), dtype);
  in.b = make_operand(random_floats(in.depth * in.ldb, s.seed + 1), dtype);
  in.c0 = random_floats(static_cast<size_t>(s.counts.size()) * in.c_stride, s.seed + 2);
  // A depth-0 group's output holds NaN where beta = 0 must write zeros.
  if (s.beta == 0.0f) {
    for (size_t g = 0; g < s.counts.size(); ++g)
      if (s.counts[g] == 0) in.c0[g * in.c_stride] = kNaN;
  }
  return in;
}

std::vector<double> ragged_depth_reference(const GroupedShape& s, const RaggedDepth& in) {
  std::vector<double> expected = to_double(in.c0);
  int64_t row = 0;
  for (size_t g = 0; g < s.counts.size(); ++g) {
    const int64_t k = s.counts[g];
    const std::vector<float> a(in.a.values.begin() + row * in.lda, in.a.values.begin() + (row + k) * in.lda);
    const std::vector<float> b(in.b.values.begin() + row * in.ldb, in.b.values.begin() + (row + k) * in.ldb);
    const std::vector<float> c0(in.c0.begin() + g * in.c_stride, in.c0.begin() + g * in.c_stride + in.m * in.ldc);
    for (int64_t i = 0; i < in.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = 0.0;
        for (int64_t p = 0; p < k; ++p) sum += static_cast<double>(a[p * in.lda + i]) * b[p * in.ldb + j];
        const double old = s.beta == 0.0f ? 0.0 : s.beta * static_cast<double>(c0[i * in.ldc + j]);
        expected[g * in.c_stride + i * in.ldc + j] = s.alpha * sum + old;
      }
    row += k;
  }
  return expected;
}

void check_ragged_depth(CaseContext& c, const GroupedShape& s, DType dtype) {
  const RaggedDepth in = ragged_depth_inputs(s, dtype);
  const DeviceArray<float> out = c.upload(in.c0);
  c.ops().grouped_gemm_ragged_k(static_cast<int64_t>(s.counts.size()), s.counts.data(), in.m, s.n, s.alpha,
                                device_operand(c, in.a, dtype), in.lda, device_operand(c, in.b, dtype), in.ldb, s.beta,
                                out.data, in.ldc, in.c_stride, dtype, c.stream());
  expect_within(c, "c", c.download(out, "c"), ragged_depth_reference(s, in), tolerances(dtype).gemm);
}

const std::vector<GroupedShape>& ragged_rows_shapes() {
  static const std::vector<GroupedShape> shapes = {
      {true, {3, 0, 5, 1}, 17, 33, 0, 1.0f, 0.0f, 100},   {false, {0, 7, 2}, 29, 13, 3, 0.5f, 2.0f, 103},
      {true, {1, 1, 1, 1, 1}, 5, 65, 2, 1.0f, 1.0f, 106}, {false, {37, 0}, 64, 1, 0, 1.0f, 0.0f, 109},
      {true, {0, 0, 0}, 9, 7, 1, 1.0f, 0.0f, 112},        {true, {70, 3, 0, 11}, 48, 31, 1, 1.0f, 0.0f, 115},
      {true, {300, 0, 129}, 300, 40, 1, 1.0f, 0.0f, 118},  // several of the CPU's 128 x 256 tiles per group
  };
  return shapes;
}

const std::vector<GroupedShape>& ragged_depth_shapes() {
  static const std::vector<GroupedShape> shapes = {
      {false, {4, 0, 1, 9}, 17, 33, 0, 1.0f, 1.0f, 120}, {false, {0, 13, 0}, 29, 7, 2, 1.0f, 0.0f, 123},
      {false, {5, 0, 66}, 3, 64, 1, 0.5f, 0.5f, 126},    {false, {0, 0}, 9, 5, 0, 1.0f, 0.0f, 129},
      {false, {1, 2, 3}, 65, 1, 3, 1.0f, 1.0f, 132},     {false, {0, 140, 7}, 260, 131, 1, 1.0f, 1.0f, 135},
  };
  return shapes;
}

void add_grouped_gemm_entry_cases(std::vector<OpCase>& cases) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const GroupedShape& shape : ragged_rows_shapes()) {
      cases.push_back({.op = OpId::grouped_gemm,
                       .dtype = dtype,
                       .mode = CaseMode::forward,
                       .name = describe(shape, false),
                       .thread_count_independent = true,
                       .body = [shape, dtype](CaseContext& c) { check_ragged_rows(c, shape, dtype); }});
    }
    for (const GroupedShape& shape : ragged_depth_shapes()) {
      cases.push_back({.op = OpId::grouped_gemm_ragged_k,
                       .dtype = dtype,
                       .mode = CaseMode::forward,
                       .name = describe(shape, true),
                       .thread_count_independent = true,
                       .body = [shape, dtype](CaseContext& c) { check_ragged_depth(c, shape, dtype); }});
    }
  }
  for (DType refused : {DType::i32, DType::f16}) {
    cases.push_back({.op = OpId::grouped_gemm,
                     .dtype = refused,
                     .mode = CaseMode::refusal,
                     .name = std::string(dtype_name(refused)) + " operands are refused by name",
                     .body = [refused](CaseContext& c) {
                       const DeviceArray<float> one = c.filled(4, 1.0f), out = c.filled(4, 0.0f);
                       const int64_t rows[1] = {2};
                       expect_refusal(c, "grouped_gemm", dtype_name(refused), [&] {
                         c.ops().grouped_gemm(false, 1, rows, 2, 2, 1.0f, one.data, 2, one.data, 2, 4, 0.0f, out.data,
                                              2, refused, c.stream());
                       });
                     }});
    cases.push_back({.op = OpId::grouped_gemm_ragged_k,
                     .dtype = refused,
                     .mode = CaseMode::refusal,
                     .name = std::string(dtype_name(refused)) + " operands are refused by name",
                     .body = [refused](CaseContext& c) {
                       const DeviceArray<float> one = c.filled(4, 1.0f), out = c.filled(4, 0.0f);
                       const int64_t depths[1] = {2};
                       expect_refusal(c, "grouped_gemm_ragged_k", dtype_name(refused), [&] {
                         c.ops().grouped_gemm_ragged_k(1, depths, 2, 2, 1.0f, one.data, 2, one.data, 2, 0.0f, out.data,
                                                       2, 4, refused, c.stream());
                       });
                     }});
  }
}

// y = scale[r] x in double.
std::vector<double> ref_scale_rows(const std::vector<double>& x, const std::vector<double>& scale, int64_t rows,
                                   int cols) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) y[r * cols + c] = scale[r] * x[r * cols + c];
  return y;
}

struct ScaleRowsInputs {
  std::vector<float> x, scale, dy;
};

ScaleRowsInputs scale_rows_inputs(int64_t rows, int cols) {
  ScaleRowsInputs in{random_floats(rows * cols, 140, -3.0f, 3.0f), random_floats(rows, 141, 0.0f, 1.0f),
                     random_floats(rows * cols, 142)};
  if (rows > 1) in.scale[1] = 0.0f;  // a zero prob still gets its grad
  return in;
}

void add_scale_rows_cases(std::vector<OpCase>& cases) {
  for (int64_t rows : {1, 5, 300})
    for (int cols : {1, 37, 67}) {
      const std::string shape = shape_text({{"rows", rows}, {"cols", cols}});
      cases.push_back(
          {.op = OpId::moe_scale_rows,
           .mode = CaseMode::forward,
           .name = shape,
           .thread_count_independent = true,
           .body = [rows, cols](CaseContext& c) {
             const ScaleRowsInputs in = scale_rows_inputs(rows, cols);
             const DeviceArray<float> y = c.filled(rows * cols, kNaN);
             c.ops().moe_scale_rows(c.upload(in.x).data, c.upload(in.scale).data, y.data, rows, cols, c.stream());
             c.expect_close("y", c.download(y, "y"), ref_scale_rows(to_double(in.x), to_double(in.scale), rows, cols),
                            tolerances(DType::f32).reference);
           }});
      cases.push_back({.op = OpId::moe_scale_rows_backward,
                       .mode = CaseMode::backward,
                       .name = shape + ", dx in place of dy",
                       .thread_count_independent = true,
                       .body = [rows, cols](CaseContext& c) {
                         const ScaleRowsInputs in = scale_rows_inputs(rows, cols);
                         const DeviceArray<float> dx = c.upload(in.dy), d_scale = c.filled(rows, kNaN);
                         c.ops().moe_scale_rows_backward(dx.data, c.upload(in.x).data, c.upload(in.scale).data, dx.data,
                                                         d_scale.data, rows, cols, c.stream());
                         std::vector<double> expected_d_scale(rows, 0.0);
                         for (int64_t r = 0; r < rows; ++r)
                           for (int j = 0; j < cols; ++j)
                             expected_d_scale[r] += static_cast<double>(in.dy[r * cols + j]) * in.x[r * cols + j];
                         c.expect_close("d_scale", c.download(d_scale, "d_scale"), expected_d_scale,
                                        tolerances(DType::f32).reference);
                         c.expect_close("dx", c.download(dx, "dx"),
                                        ref_scale_rows(to_double(in.dy), to_double(in.scale), rows, cols),
                                        tolerances(DType::f32).reference);
                       }});
    }
  cases.push_back(
      {.op = OpId::moe_scale_rows_backward,
       .mode = CaseMode::grad,
       .name = shape_text({{"rows", 4}, {"cols", 9}}) + ", x and scale",
       .body = [](CaseContext& c) {
         const int64_t rows = 4;
         const int cols = 9;
         const ScaleRowsInputs in = scale_rows_inputs(rows, cols);
         const DeviceArray<float> dx = c.filled(rows * cols, kNaN), d_scale = c.filled(rows, kNaN);
         c.ops().moe_scale_rows_backward(c.upload(in.dy).data, c.upload(in.x).data, c.upload(in.scale).data, dx.data,
                                         d_scale.data, rows, cols, c.stream());
         const std::vector<double> x = to_double(in.x), scale = to_double(in.scale);
         const std::vector<double> dy = to_double(in.dy);
         c.expect_close("dx", c.download(dx, "dx"),
                        numeric_gradient([&](const auto& v) { return ref_scale_rows(v, scale, rows, cols); }, x, dy),
                        tolerances(DType::f32).finite_difference);
         c.expect_close("d_scale", c.download(d_scale, "d_scale"),
                        numeric_gradient([&](const auto& v) { return ref_scale_rows(x, v, rows, cols); }, scale, dy),
                        tolerances(DType::f32).finite_difference);
       }});
}

}  // namespace

void add_moe_expert_cases(std::vector<OpCase>& cases) {
  add_grouped_gemm_entry_cases(cases);
  add_scale_rows_cases(cases);
}

}  // namespace mt::harness
