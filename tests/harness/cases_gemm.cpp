// Cases of the GEMM entries (see op_cases.h): every transpose combination at odd shapes (k = 1,
// rows and columns that are not multiples of a vector), leading dimensions wider than the matrix,
// alpha and beta, on f32, bf16 and f16 operands against the reference over the operands' rounded
// values; the operand type each training precision asks for is one the backend's GEMM supports;
// other operand types are refused by name. The fused entries (gemm_bias, gemm_bias_gelu) on the
// same dtypes: the product plus bias against the reference, and the GELU output against the tanh
// GELU of the entry's own pre-activation (tight enough that erf's GELU fails), at shapes a CUDA
// epilogue takes and shapes it turns down (the GELU's n not a multiple of 8), with and without a
// bias; old output values are never read (NaN-filled).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "case_helpers.h"
#include "kernels/common/half.h"
#include "op_cases.h"
#include "reference.h"

namespace mt::harness {
namespace {

struct GemmShape {
  bool trans_a, trans_b;
  int64_t m, n, k;
  int64_t extra_lda, extra_ldb, extra_ldc;  // leading dimensions beyond the rows' widths
  float alpha, beta;
  uint32_t seed;
};

std::string describe(const GemmShape& s) {
  return std::string(s.trans_a ? "T" : "N") + (s.trans_b ? "T" : "N") + " " +
         shape_text({{"m", s.m},
                     {"n", s.n},
                     {"k", s.k},
                     {"lda+", s.extra_lda},
                     {"ldb+", s.extra_ldb},
                     {"ldc+", s.extra_ldc}}) +
         " alpha=" + std::to_string(s.alpha).substr(0, 4) + " beta=" + std::to_string(s.beta).substr(0, 4);
}

// The operands as the GEMM takes them (f32 values, or bf16/f16 bits) and the values they stand for.
struct Operand {
  std::vector<float> values;   // rounded to the dtype
  std::vector<uint16_t> bits;  // bf16/f16 only
};

Operand make_operand(const std::vector<float>& values, DType dtype) {
  Operand operand{values, {}};
  if (dtype == DType::f32) return operand;
  operand.bits.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::bf16) {
      operand.values[i] = kernels::bf16_bits_to_fp32(operand.bits[i] = kernels::fp32_to_bf16_bits(values[i]));
    } else {
      operand.values[i] = kernels::fp16_bits_to_fp32(operand.bits[i] = kernels::fp32_to_fp16_bits(values[i]));
    }
  }
  return operand;
}

const void* device_operand(CaseContext& c, const Operand& operand, DType dtype) {
  if (dtype == DType::f32) return c.upload(operand.values).data;
  return c.upload(operand.bits).data;
}

void check_gemm(CaseContext& c, const GemmShape& s, DType dtype) {
  const int64_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
  const int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  const int64_t lda = a_cols + s.extra_lda, ldb = b_cols + s.extra_ldb, ldc = s.n + s.extra_ldc;
  const Operand a = make_operand(random_floats(a_rows * lda, s.seed), dtype);
  const Operand b = make_operand(random_floats(b_rows * ldb, s.seed + 1), dtype);
  const auto c0 = random_floats(s.m * ldc, s.seed + 2);
  const DeviceArray<float> out = c.upload(c0);
  c.ops().gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, s.alpha, device_operand(c, a, dtype), lda,
               device_operand(c, b, dtype), ldb, s.beta, out.data, ldc, dtype, c.stream());
  const std::vector<float> result = c.download(out, "c");
  const std::vector<double> expected =
      ref_gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, s.alpha, a.values, lda, b.values, ldb, s.beta, c0, ldc);
  const double tol = tolerances(dtype).gemm;
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      const double error = std::abs(result[i * ldc + j] - expected[i * ldc + j]);
      if (!(error <= tol)) {
        return c.fail("c[" + std::to_string(i) + "," + std::to_string(j) + "] = " +
                      std::to_string(result[i * ldc + j]) + ", expected " + std::to_string(expected[i * ldc + j]));
      }
    }
  for (int64_t i = 0; i < s.m; ++i)  // columns past n keep C's values
    for (int64_t j = s.n; j < ldc; ++j) c.expect(result[i * ldc + j] == c0[i * ldc + j], "c beyond column n changed");
}

const std::vector<GemmShape>& gemm_shapes() {
  static const std::vector<GemmShape> shapes = {
      {false, false, 7, 5, 3, 3, 1, 2, 0.5f, 2.0f, 1},    {false, true, 33, 17, 65, 3, 1, 2, 0.5f, 2.0f, 4},
      {true, false, 64, 48, 1, 3, 1, 2, 0.5f, 2.0f, 7},   {true, true, 5, 129, 31, 3, 1, 2, 0.5f, 2.0f, 10},
      {false, false, 7, 5, 3, 3, 1, 2, 1.0f, 1.0f, 13},   {true, true, 5, 129, 31, 3, 1, 2, 1.0f, 1.0f, 16},
      {false, true, 37, 29, 53, 3, 2, 1, 0.5f, 1.5f, 19}, {false, false, 5, 3, 7, 3, 2, 1, 0.5f, 1.5f, 22},
      {true, false, 13, 65, 1, 3, 2, 1, 0.5f, 1.5f, 25},  {true, true, 1, 17, 33, 3, 2, 1, 0.5f, 1.5f, 28},
  };
  return shapes;
}

// ---- the fused entries --------------------------------------------------------------------------

struct EpilogueShape {
  bool trans_a, trans_b;
  int64_t m, n, k;
  int64_t extra_lda, extra_ldb;
  bool bias;
  uint32_t seed;
};

std::string describe(const EpilogueShape& s) {
  return std::string(s.trans_a ? "T" : "N") + (s.trans_b ? "T" : "N") + " " +
         shape_text({{"m", s.m}, {"n", s.n}, {"k", s.k}, {"lda+", s.extra_lda}, {"ldb+", s.extra_ldb}}) +
         (s.bias ? " bias" : " no bias") + (s.n % 8 != 0 ? " (no CUDA GELU epilogue)" : "");
}

// The linear layers' form (x W^T: NT) first; n = 13 is a shape CUDA's GELU epilogue cannot take
// (it runs the unfused kernels there), and odd leading dimensions (7) of 16-bit operands are
// ones cuBLASLt's heuristic may turn down.
const std::vector<EpilogueShape>& epilogue_shapes() {
  static const std::vector<EpilogueShape> shapes = {
      {false, true, 33, 64, 65, 0, 0, true, 51}, {false, true, 7, 13, 29, 0, 0, true, 54},
      {false, false, 17, 24, 31, 3, 1, true, 57}, {true, true, 5, 40, 1, 2, 3, true, 60},
      {false, true, 9, 24, 7, 0, 0, true, 63},   {false, true, 20, 32, 19, 0, 0, false, 66},
  };
  return shapes;
}

// The operands of an epilogue case, the reference product plus bias (m, n) and the bias.
struct EpilogueProblem {
  Operand a, b;
  std::vector<float> bias;
  std::vector<double> pre;  // op(A) op(B) + bias
};

EpilogueProblem epilogue_problem(const EpilogueShape& s, DType dtype) {
  const int64_t a_rows = s.trans_a ? s.k : s.m, a_cols = s.trans_a ? s.m : s.k;
  const int64_t b_rows = s.trans_b ? s.n : s.k, b_cols = s.trans_b ? s.k : s.n;
  EpilogueProblem p{make_operand(random_floats(a_rows * (a_cols + s.extra_lda), s.seed), dtype),
                    make_operand(random_floats(b_rows * (b_cols + s.extra_ldb), s.seed + 1), dtype),
                    s.bias ? random_floats(s.n, s.seed + 2) : std::vector<float>{},
                    {}};
  p.pre = ref_gemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0, p.a.values, a_cols + s.extra_lda, p.b.values,
                   b_cols + s.extra_ldb, 0.0, std::vector<float>(s.m * s.n, 0.0f), s.n);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) p.pre[i * s.n + j] += s.bias ? p.bias[j] : 0.0f;
  return p;
}

int64_t lda_of(const EpilogueShape& s) { return (s.trans_a ? s.m : s.k) + s.extra_lda; }
int64_t ldb_of(const EpilogueShape& s) { return (s.trans_b ? s.k : s.n) + s.extra_ldb; }

// Every element within the GEMM's absolute tolerance of the reference.
void expect_gemm_close(CaseContext& c, const std::string& what, const std::vector<float>& actual,
                       const std::vector<double>& expected, DType dtype) {
  const double tol = tolerances(dtype).gemm;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!(std::abs(actual[i] - expected[i]) <= tol)) {
      return c.fail(what + "[" + std::to_string(i) + "] = " + std::to_string(actual[i]) + ", expected " +
                    std::to_string(expected[i]));
    }
  }
}

void check_gemm_bias(CaseContext& c, const EpilogueShape& s, DType dtype) {
  const EpilogueProblem p = epilogue_problem(s, dtype);
  const DeviceArray<float> out = c.filled(s.m * s.n, kNaN);
  c.ops().gemm_bias(s.trans_a, s.trans_b, s.m, s.n, s.k, device_operand(c, p.a, dtype), lda_of(s),
                    device_operand(c, p.b, dtype), ldb_of(s), c.upload(p.bias).data, out.data, dtype, c.stream());
  expect_gemm_close(c, "c", c.download(out, "c"), p.pre, dtype);
}

void check_gemm_bias_gelu(CaseContext& c, const EpilogueShape& s, DType dtype) {
  const EpilogueProblem p = epilogue_problem(s, dtype);
  const DeviceArray<float> pre = c.filled(s.m * s.n, kNaN), y = c.filled(s.m * s.n, kNaN);
  c.ops().gemm_bias_gelu(s.trans_a, s.trans_b, s.m, s.n, s.k, device_operand(c, p.a, dtype), lda_of(s),
                         device_operand(c, p.b, dtype), ldb_of(s), s.bias ? c.upload(p.bias).data : nullptr,
                         pre.data, y.data, dtype, c.stream());
  const std::vector<float> pre_out = c.download(pre, "pre");
  expect_gemm_close(c, "pre", pre_out, p.pre, dtype);
  // y against the tanh GELU of the entry's own pre-activation: fp32 rounding of the GELU only
  // (5e-5 of max(|y|, 1)); erf's GELU differs from it by up to 4.7e-4 near |x| = 2.
  c.expect_close("y = gelu(pre)", c.download(y, "y"), ref_gelu_all(std::vector<double>(pre_out.begin(), pre_out.end())),
                 5 * tolerances(dtype).reference, 1.0);
}

// A refusal case: `call` runs `op` on `refused` operands (one: 4 ones, out: 8 floats), which it
// must refuse by name.
using RefusedCall = void (*)(CaseContext& c, const float* one, float* out, DType refused);
OpCase operand_refusal(OpId op, DType refused, RefusedCall call) {
  return {.op = op,
          .dtype = refused,
          .mode = CaseMode::refusal,
          .name = std::string(dtype_name(refused)) + " operands are refused by name",
          .body = [op, refused, call](CaseContext& c) {
            const DeviceArray<float> one = c.filled(4, 1.0f), out = c.filled(8, 0.0f);
            expect_refusal(c, backend::op_name(op), dtype_name(refused),
                           [&] { call(c, one.data, out.data, refused); });
          }};
}

}  // namespace

void add_gemm_cases(std::vector<OpCase>& cases) {
  cases.push_back({.op = OpId::gemm_operand_type,
                   .mode = CaseMode::property,
                   .name = "fp32 runs f32 GEMMs, bf16 and fp16 f32 or their own bits, each one the GEMM supports",
                   .body = [](CaseContext& c) {
                     const backend::Ops& ops = c.ops();
                     c.expect(ops.gemm_operand_type(Precision::fp32) == DType::f32, "fp32 does not give f32");
                     const DType bf16 = ops.gemm_operand_type(Precision::bf16);
                     const DType fp16 = ops.gemm_operand_type(Precision::fp16);
                     c.expect(bf16 == DType::f32 || bf16 == DType::bf16, std::string("bf16 gives ") + dtype_name(bf16));
                     c.expect(fp16 == DType::f32 || fp16 == DType::f16, std::string("fp16 gives ") + dtype_name(fp16));
                     for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
                       c.expect(ops.supports(OpId::gemm, ops.gemm_operand_type(p)),
                                std::string("gemm does not support the operands of ") + precision_name(p));
                     }
                   }});
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const GemmShape& shape : gemm_shapes()) {
      cases.push_back({.op = OpId::gemm,
                       .dtype = dtype,
                       .mode = CaseMode::forward,
                       .name = describe(shape),
                       .body = [shape, dtype](CaseContext& c) { check_gemm(c, shape, dtype); }});
    }
  }
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const EpilogueShape& shape : epilogue_shapes()) {
      if (shape.bias) {
        cases.push_back({.op = OpId::gemm_bias,
                         .dtype = dtype,
                         .mode = CaseMode::forward,
                         .name = describe(shape),
                         .body = [shape, dtype](CaseContext& c) { check_gemm_bias(c, shape, dtype); }});
      }
      cases.push_back({.op = OpId::gemm_bias_gelu,
                       .dtype = dtype,
                       .mode = CaseMode::forward,
                       .name = describe(shape),
                       .body = [shape, dtype](CaseContext& c) { check_gemm_bias_gelu(c, shape, dtype); }});
    }
  }
  // Each GEMM entry refuses other operand types by name (2 x 2 ones; pre and y are out's halves).
  for (DType refused : {DType::i32, DType::f16}) {
    cases.push_back(operand_refusal(OpId::gemm, refused, [](CaseContext& c, const float* one, float* out, DType type) {
      c.ops().gemm(false, false, 2, 2, 2, 1.0f, one, 2, one, 2, 0.0f, out, 2, type, c.stream());
    }));
    cases.push_back(
        operand_refusal(OpId::gemm_bias, refused, [](CaseContext& c, const float* one, float* out, DType type) {
          c.ops().gemm_bias(false, false, 2, 2, 2, one, 2, one, 2, one, out, type, c.stream());
        }));
    cases.push_back(
        operand_refusal(OpId::gemm_bias_gelu, refused, [](CaseContext& c, const float* one, float* out, DType type) {
          c.ops().gemm_bias_gelu(false, false, 2, 2, 2, one, 2, one, 2, one, out, out + 4, type, c.stream());
        }));
  }
}

}  // namespace mt::harness
