// Cases of the FP8 entries (see op_cases.h; contracts in backend/ops.h, arithmetic in
// kernels/common/fp8.h): quantize against a nearest-value search over the decoded codes (the
// fp32 product first) with its accumulated, NaN-propagating amax; the byte transpose; the scaled
// FP8 GEMM against a double sum of the decoded codes (both operand types, padded rows, beta 0 and
// 1) and its refusals (k or leading dimensions not multiples of 16, e5m2 x e5m2); and the
// delayed-scaling update against a double re-statement of Transformer Engine's rule.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "case_helpers.h"
#include "op_cases.h"

namespace mt::harness {
namespace {

using kernels::Fp8AmaxAlgo;
using kernels::Fp8ScalingParams;
using kernels::Fp8Type;

const char* type_name(Fp8Type type) { return type == Fp8Type::e4m3 ? "e4m3" : "e5m2"; }

// The reference encoding: the finite fp8 value nearest to x (ties to the even code), saturating,
// NaN -> 0x7f; found by a search over the decoded codes in double.
uint8_t nearest_code(float x, Fp8Type type) {
  if (std::isnan(x)) return 0x7f;
  const int max_code = type == Fp8Type::e4m3 ? 0x7e : 0x7b;
  const double magnitude = std::fabs(static_cast<double>(x));
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  int best = max_code;
  for (int code = 0; code < max_code; ++code) {
    const double low = kernels::fp8_to_fp32(static_cast<uint8_t>(code), type);
    const double high = kernels::fp8_to_fp32(static_cast<uint8_t>(code + 1), type);
    if (magnitude > high) continue;
    const double middle = (low + high) / 2;
    best = magnitude < middle ? code : magnitude > middle ? code + 1 : (code & 1) ? code + 1 : code;
    break;
  }
  return static_cast<uint8_t>(sign | best);
}

std::vector<float> spread_values(int64_t n, float range, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> uniform(-range, range);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = uniform(random);
  for (int64_t i = 0; i < n; i += 11) values[static_cast<size_t>(i)] *= 1e-4f;  // some in the subnormal range
  return values;
}

void add_quantize(std::vector<OpCase>& cases) {
  for (Fp8Type type : {Fp8Type::e4m3, Fp8Type::e5m2}) {
    for (int64_t n : {0, 1, 37, 4099}) {
      for (float initial_amax : {0.5f, 1e6f}) {
        cases.push_back({.op = OpId::fp8_quantize,
                         .name = std::string(type_name(type)) + " " + shape_text({{"n", n}}) +
                                 (initial_amax > 1 ? ", amax already larger" : ", amax grows") +
                                 ", scale 7.3, values past the saturation point",
                         .thread_count_independent = true,
                         .body = [type, n, initial_amax](CaseContext& c) {
                           const std::vector<float> x = spread_values(n, 100.0f, 410 + static_cast<uint32_t>(n));
                           const float scale = 7.3f;
                           const DeviceArray<uint8_t> out = c.filled<uint8_t>(n, 0xaa);
                           const DeviceArray<float> amax = c.upload(std::vector<float>{initial_amax});
                           c.ops().fp8_quantize(c.upload(x).data, n, c.upload(std::vector<float>{scale}).data, type,
                                                out.data, amax.data, c.stream());
                           std::vector<uint8_t> want(static_cast<size_t>(n));
                           double want_amax = initial_amax;
                           for (int64_t i = 0; i < n; ++i) {
                             want[i] = nearest_code(x[i] * scale, type);  // the fp32 product, then the rounding
                             want_amax = std::fmax(want_amax, std::fabs(static_cast<double>(x[i])));
                           }
                           c.expect_equal("out", c.download(out, "out"), want);
                           c.expect_equal("amax", c.download(amax, "amax"), std::vector<float>{static_cast<float>(want_amax)});
                         }});
      }
    }
    cases.push_back({.op = OpId::fp8_quantize,
                     .mode = CaseMode::property,
                     .name = std::string(type_name(type)) + " n=4099, a NaN and infinities: NaN code, +-max, amax NaN",
                     .thread_count_independent = true,
                     .body = [type](CaseContext& c) {
                       std::vector<float> x = spread_values(4099, 1.0f, 420);
                       x[17] = kInf;
                       x[18] = -kInf;
                       x[3000] = kNaN;
                       const DeviceArray<uint8_t> out = c.allocated<uint8_t>(4099);
                       const DeviceArray<float> amax = c.upload(std::vector<float>{0.0f});
                       c.ops().fp8_quantize(c.upload(x).data, 4099, c.upload(std::vector<float>{1.0f}).data, type,
                                            out.data, amax.data, c.stream());
                       const std::vector<uint8_t> codes = c.download(out, "out");
                       const uint8_t max_code = type == Fp8Type::e4m3 ? 0x7e : 0x7b;
                       c.expect(codes[17] == max_code && codes[18] == (0x80 | max_code), "infinities not saturated");
                       c.expect(codes[3000] == 0x7f, "NaN not the canonical NaN code");
                       c.expect(std::isnan(c.download(amax, "amax")[0]), "amax of an input with a NaN is not NaN");
                     }});
  }
}

void add_transpose(std::vector<OpCase>& cases) {
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape s : {Shape{1, 1}, Shape{7, 67}, Shape{130, 33}}) {
    cases.push_back({.op = OpId::fp8_transpose,
                     .name = shape_text({{"rows", s.rows}, {"cols", s.cols}}),
                     .thread_count_independent = true,
                     .body = [s](CaseContext& c) {
                       std::vector<uint8_t> in(static_cast<size_t>(s.rows * s.cols));
                       for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 37 + 11);
                       const DeviceArray<uint8_t> out = c.filled<uint8_t>(s.rows * s.cols, 0);
                       c.ops().fp8_transpose(c.upload(in).data, s.rows, s.cols, out.data, c.stream());
                       std::vector<uint8_t> want(in.size());
                       for (int64_t r = 0; r < s.rows; ++r)
                         for (int64_t col = 0; col < s.cols; ++col) want[col * s.rows + r] = in[r * s.cols + col];
                       c.expect_equal("out", c.download(out, "out"), want);
                     }});
  }
}

// Codes of values spread over [-range, range] (quantized with scale 1), rows `ld` apart, the
// padding bytes NaN codes (a GEMM that reads them gives NaN).
std::vector<uint8_t> operand_codes(int64_t rows, int64_t k, int64_t ld, Fp8Type type, uint32_t seed) {
  const std::vector<float> values = spread_values(rows * k, 2.0f, seed);
  std::vector<uint8_t> codes(static_cast<size_t>(rows * ld), 0x7f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k; ++i) codes[r * ld + i] = kernels::fp32_to_fp8(values[r * k + i], type);
  return codes;
}

struct GemmShape {
  int64_t m, n, k, lda, ldb;
};

void add_gemm(std::vector<OpCase>& cases) {
  struct Types {
    Fp8Type a, b;
  };
  for (const Types types : {Types{Fp8Type::e4m3, Fp8Type::e4m3}, Types{Fp8Type::e4m3, Fp8Type::e5m2},
                            Types{Fp8Type::e5m2, Fp8Type::e4m3}}) {
    for (const GemmShape s : {GemmShape{1, 1, 16, 16, 16}, GemmShape{7, 13, 32, 48, 32}, GemmShape{33, 65, 48, 64, 80}}) {
      for (float beta : {0.0f, 1.0f}) {
        cases.push_back({.op = OpId::gemm_fp8,
                         .name = std::string(type_name(types.a)) + " x " + type_name(types.b) + " " +
                                 shape_text({{"m", s.m}, {"n", s.n}, {"k", s.k}, {"lda", s.lda}, {"ldb", s.ldb}}) +
                                 (beta == 0 ? ", beta 0 over NaN C" : ", beta 1") + ", scale_inv 0.25 and 3",
                         .thread_count_independent = true,
                         .body = [types, s, beta](CaseContext& c) {
                           const auto a = operand_codes(s.m, s.k, s.lda, types.a, 430);
                           const auto b = operand_codes(s.n, s.k, s.ldb, types.b, 431);
                           const float alpha = 0.5f, a_scale_inv = 0.25f, b_scale_inv = 3.0f;
                           const int64_t ldc = s.n + 3;
                           std::vector<float> c_old(static_cast<size_t>(s.m * ldc), beta == 0 ? kNaN : 0.0f);
                           for (size_t i = 0; i < c_old.size() && beta != 0; ++i) c_old[i] = 0.01f * static_cast<float>(i % 17);
                           const DeviceArray<float> out = c.upload(c_old);
                           c.ops().gemm_fp8(s.m, s.n, s.k, alpha, c.upload(a).data, types.a,
                                            c.upload(std::vector<float>{a_scale_inv}).data, s.lda, c.upload(b).data,
                                            types.b, c.upload(std::vector<float>{b_scale_inv}).data, s.ldb, beta,
                                            out.data, ldc, c.stream());
                           std::vector<double> want(c_old.size());
                           for (int64_t i = 0; i < s.m; ++i) {
                             for (int64_t j = 0; j < ldc; ++j) {
                               if (j >= s.n) {
                                 want[i * ldc + j] = c_old[i * ldc + j];  // padding untouched
                                 continue;
                               }
                               double sum = 0;
                               for (int64_t p = 0; p < s.k; ++p)
                                 sum += static_cast<double>(kernels::fp8_to_fp32(a[i * s.lda + p], types.a)) *
                                        kernels::fp8_to_fp32(b[j * s.ldb + p], types.b);
                               want[i * ldc + j] = alpha * a_scale_inv * b_scale_inv * sum +
                                                   (beta == 0 ? 0.0 : beta * c_old[i * ldc + j]);
                             }
                           }
                           std::vector<float> got = c.download(out, "c");
                           // NaN padding (beta 0) compared by position, the rest by value.
                           for (size_t i = 0; i < got.size(); ++i)
                             if (std::isnan(want[i]) && std::isnan(got[i])) got[i] = 0, want[i] = 0;
                           c.expect_close("c", got, want, 1e-5);
                         }});
      }
    }
  }
  const auto refusal = [](std::string what, GemmShape s, Fp8Type a_type, Fp8Type b_type) {
    return OpCase{.op = OpId::gemm_fp8,
                  .mode = CaseMode::property,
                  .name = "refuses " + what,
                  .body = [what, s, a_type, b_type](CaseContext& c) {
                    const DeviceArray<uint8_t> a = c.allocated<uint8_t>(s.m * s.lda);
                    const DeviceArray<uint8_t> b = c.allocated<uint8_t>(s.n * s.ldb);
                    const DeviceArray<float> scale_inv = c.upload(std::vector<float>{1.0f});
                    const DeviceArray<float> out = c.allocated<float>(s.m * s.n);
                    expect_refusal(c, "gemm_fp8", what.substr(0, what.find(" (")), [&] {
                      c.ops().gemm_fp8(s.m, s.n, s.k, 1.0f, a.data, a_type, scale_inv.data, s.lda, b.data, b_type,
                                       scale_inv.data, s.ldb, 0.0f, out.data, s.n, c.stream());
                      c.ops().synchronize(c.stream());
                    });
                  }};
  };
  cases.push_back(refusal("multiples of 16 (k 24)", {4, 4, 24, 32, 32}, Fp8Type::e4m3, Fp8Type::e4m3));
  cases.push_back(refusal("multiples of 16 (lda 40)", {4, 4, 32, 40, 32}, Fp8Type::e4m3, Fp8Type::e4m3));
  cases.push_back(refusal("multiples of 16 (ldb 36)", {4, 4, 32, 32, 36}, Fp8Type::e4m3, Fp8Type::e5m2));
  cases.push_back(refusal("e5m2 x e5m2", {4, 4, 32, 32, 32}, Fp8Type::e5m2, Fp8Type::e5m2));
}

// Transformer Engine's rule (kernels/common/fp8.h's header) re-stated in double on one tensor.
void reference_update(float& amax, float* history, float& scale, float& scale_inv, const Fp8ScalingParams& p) {
  std::vector<float> rolled(static_cast<size_t>(p.history_len));
  rolled[0] = amax;
  for (int64_t i = 1; i < p.history_len; ++i) rolled[i] = history[i - 1];
  double used = rolled[0];
  if (p.algo == Fp8AmaxAlgo::max) {
    used = 0;
    for (float h : rolled) used = std::fmax(used, static_cast<double>(h));
  }
  if (std::isfinite(used) && used > 0) {
    const double quotient = static_cast<double>(kernels::fp8_max(p.type)) * std::ldexp(1.0, -p.margin) / used;
    scale = quotient > 3.4028234663852886e38 ? 3.4028234663852886e38f : static_cast<float>(quotient);
  }
  scale_inv = static_cast<float>(1.0 / static_cast<double>(scale));
  for (int64_t i = 0; i < p.history_len; ++i) history[i] = rolled[i];
  amax = 0;
}

void add_update(std::vector<OpCase>& cases) {
  const Fp8ScalingParams params_list[] = {{Fp8Type::e4m3, 0, 1, Fp8AmaxAlgo::most_recent},
                                          {Fp8Type::e4m3, 1, 4, Fp8AmaxAlgo::max},
                                          {Fp8Type::e5m2, 0, 4, Fp8AmaxAlgo::most_recent},
                                          {Fp8Type::e5m2, 3, 16, Fp8AmaxAlgo::max}};
  for (const Fp8ScalingParams& p : params_list) {
    for (int64_t tensors : {0, 6}) {
      cases.push_back({.op = OpId::fp8_update_scales,
                       .name = std::string(type_name(p.type)) + " margin " + std::to_string(p.margin) + " " +
                               shape_text({{"history_len", p.history_len}, {"tensors", tensors}}) +
                               (p.algo == Fp8AmaxAlgo::max ? " max" : " most_recent") +
                               ", amaxes 0, NaN, inf, 1e-40 and normal, three steps",
                       .thread_count_independent = true,
                       .body = [p, tensors](CaseContext& c) {
                         const std::vector<float> step_amaxes = {3.5f, 0.0f, kNaN, kInf, 1e-40f, 0.02f};
                         std::vector<float> amax(static_cast<size_t>(tensors)), scale(static_cast<size_t>(tensors), 2.0f);
                         std::vector<float> scale_inv(static_cast<size_t>(tensors), 0.5f);
                         std::vector<float> history(static_cast<size_t>(tensors * p.history_len));
                         for (size_t i = 0; i < history.size(); ++i) history[i] = 0.1f * static_cast<float>(i % 7);
                         const DeviceArray<float> d_amax = c.upload(amax), d_history = c.upload(history);
                         const DeviceArray<float> d_scale = c.upload(scale), d_scale_inv = c.upload(scale_inv);
                         for (int step = 0; step < 3; ++step) {
                           for (int64_t t = 0; t < tensors; ++t) amax[t] = step_amaxes[(t + step) % step_amaxes.size()];
                           c.ops().copy(d_amax.data, amax.data(), tensors * 4, backend::CopyKind::host_to_device, c.stream());
                           c.ops().fp8_update_scales(d_amax.data, d_history.data, d_scale.data, d_scale_inv.data,
                                                     tensors, p, c.stream());
                           c.ops().synchronize(c.stream());
                           for (int64_t t = 0; t < tensors; ++t)
                             reference_update(amax[t], history.data() + t * p.history_len, scale[t], scale_inv[t], p);
                         }
                         c.expect_bits_equal("scale", c.download(d_scale, "scale"), scale);
                         c.expect_bits_equal("scale_inv", c.download(d_scale_inv, "scale_inv"), scale_inv);
                         c.expect_bits_equal("amax_history", c.download(d_history, "history"), history);
                         c.expect_bits_equal("amax", c.download(d_amax, "amax"), amax);
                       }});
    }
  }
}

}  // namespace

void add_fp8_cases(std::vector<OpCase>& cases) {
  add_quantize(cases);
  add_transpose(cases);
  add_gemm(cases);
  add_update(cases);
}

}  // namespace mt::harness
