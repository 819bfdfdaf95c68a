// Cases of the activation and rotary entries (see op_cases.h): GELU (tanh) and SwiGLU forward and
// backward against the reference, tanh (BERT's pooler) and the erf GELU (BERT's LM head) against
// std::tanh / std::erf and central differences, including saturated inputs where exp over- or
// underflows inside a kernel, backward against central differences; RoPE forward and backward against the reference
// on heads inside wider rows and at positions past any cached table, backward the transpose of
// forward and its inverse.
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "case_helpers.h"
#include "op_cases.h"
#include "reference.h"

namespace mt::harness {
namespace {

using UnaryEntry = decltype(&backend::Ops::gelu_forward);
using Reference = std::vector<double> (*)(const std::vector<double>&);

// y = entry(x) against `reference` in double, over the (lazily made) inputs.
OpCase unary_forward_case(OpId op, UnaryEntry entry, Reference reference, std::string name,
                          std::function<std::vector<float>()> inputs) {
  return {.op = op, .mode = CaseMode::forward, .name = std::move(name), .body = [=](CaseContext& c) {
            const auto x = inputs();
            const auto n = static_cast<int64_t>(x.size());
            const DeviceArray<float> y = c.filled(n, kNaN);
            (c.ops().*entry)(c.upload(x).data, y.data, n, c.stream());
            c.expect_close("y", c.download(y, "y"), reference(to_double(x)), tolerances(DType::f32).reference);
          }};
}

std::vector<double> ref_tanh_all(const std::vector<double>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = std::tanh(x[i]);
  return out;
}

void add_gelu(std::vector<OpCase>& cases) {
  for (int64_t n : {1, 5, 67, 100003}) {
    const auto inputs = [n] {
      auto x = random_floats(n, 40, -6.0f, 6.0f);
      if (n > 8) {  // saturated tails: exp overflows / underflows inside the kernel
        x[0] = -100.0f;
        x[1] = 100.0f;
        x[2] = -30.0f;
        x[3] = 30.0f;
        x[4] = 0.0f;
      }
      return x;
    };
    cases.push_back(unary_forward_case(OpId::gelu_forward, &backend::Ops::gelu_forward, ref_gelu_all,
                                       shape_text({{"n", n}}) + (n > 8 ? " with saturated tails" : ""), inputs));
    cases.push_back({.op = OpId::gelu_backward,
                     .mode = CaseMode::backward,
                     .name = shape_text({{"n", n}}) + (n > 8 ? " with saturated tails" : ""),
                     .body = [n, inputs](CaseContext& c) {
                       const auto x = inputs();
                       const auto dy = random_floats(n, 41);
                       const DeviceArray<float> dx = c.filled(n, kNaN);
                       c.ops().gelu_backward(c.upload(dy).data, c.upload(x).data, dx.data, n, c.stream());
                       std::vector<double> expected(n);
                       for (int64_t i = 0; i < n; ++i) expected[i] = dy[i] * ref_gelu_derivative(x[i]);
                       c.expect_close("dx", c.download(dx, "dx"), expected, tolerances(DType::f32).reference);
                     }});
  }
  cases.push_back(unary_forward_case(OpId::tanh_forward, &backend::Ops::tanh_forward, ref_tanh_all,
                                     shape_text({{"n", 67}}) + " with saturated tails", [] {
                                       auto x = random_floats(67, 44, -4.0f, 4.0f);
                                       x[0] = -30.0f;
                                       x[1] = 30.0f;
                                       x[2] = 0.0f;
                                       return x;
                                     }));
  cases.push_back({.op = OpId::tanh_backward,
                   .mode = CaseMode::grad,
                   .name = shape_text({{"n", 67}}),
                   .body = [](CaseContext& c) {
                     const int64_t n = 67;
                     const auto x = random_floats(n, 45, -3.0f, 3.0f), dy = random_floats(n, 46);
                     std::vector<float> y(n);
                     for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
                     const DeviceArray<float> dx = c.filled(n, kNaN);
                     c.ops().tanh_backward(c.upload(dy).data, c.upload(y).data, dx.data, n, c.stream());
                     c.expect_close("dx", c.download(dx, "dx"),
                                    numeric_gradient(ref_tanh_all, to_double(x), to_double(dy)),
                                    tolerances(DType::f32).finite_difference);
                   }});
  cases.push_back(
      {.op = OpId::gelu_backward, .mode = CaseMode::grad, .name = shape_text({{"n", 67}}), .body = [](CaseContext& c) {
         const int64_t n = 67;
         const auto x = random_floats(n, 42, -4.0f, 4.0f), dy = random_floats(n, 43);
         const DeviceArray<float> dx = c.filled(n, kNaN);
         c.ops().gelu_backward(c.upload(dy).data, c.upload(x).data, dx.data, n, c.stream());
         c.expect_close("dx", c.download(dx, "dx"), numeric_gradient(ref_gelu_all, to_double(x), to_double(dy)),
                        tolerances(DType::f32).finite_difference);
       }});
}

// The erf form against std::erf in double, where the tanh form is off by up to ~5e-4 (x near
// +-2: far outside the tolerance), and its backward against central differences of that.
void add_gelu_erf(std::vector<OpCase>& cases) {
  const auto inputs = [](int64_t n) {
    auto x = random_floats(n, 47, -6.0f, 6.0f);
    x[0] = -100.0f;  // erf saturates to -1, the backward's exp underflows
    x[1] = 100.0f;
    x[2] = 0.0f;
    x[3] = 1.0f;    // 0.8413447460685429
    x[4] = -2.0f;   // -0.04550026389635842
    return x;
  };
  for (int64_t n : {67, 100003}) {
    cases.push_back(unary_forward_case(OpId::gelu_erf_forward, &backend::Ops::gelu_erf_forward, ref_gelu_erf_all,
                                       shape_text({{"n", n}}) + " with saturated tails", [n, inputs] { return inputs(n); }));
  }
  cases.push_back({.op = OpId::gelu_erf_backward,
                   .mode = CaseMode::grad,
                   .name = shape_text({{"n", 67}}) + " with saturated tails",
                   .body = [inputs](CaseContext& c) {
                     const int64_t n = 67;
                     const auto x = inputs(n), dy = random_floats(n, 48);
                     const DeviceArray<float> dx = c.filled(n, kNaN);
                     c.ops().gelu_erf_backward(c.upload(dy).data, c.upload(x).data, dx.data, n, c.stream());
                     c.expect_close("dx", c.download(dx, "dx"),
                                    numeric_gradient(ref_gelu_erf_all, to_double(x), to_double(dy)),
                                    tolerances(DType::f32).finite_difference);
                   }});
}

void add_swiglu(std::vector<OpCase>& cases) {
  for (int64_t rows : {1, 7, 33})
    for (int ffn : {1, 37, 768}) {
      const auto inputs = [rows, ffn] {
        auto gate_up = random_floats(rows * 2 * ffn, 50, -8.0f, 8.0f);
        gate_up[0] = -120.0f;  // silu saturates to -0: exp(120) overflows inside the kernel
        if (ffn > 1) gate_up[1] = 120.0f;
        return gate_up;
      };
      const std::string shape = shape_text({{"rows", rows}, {"ffn", ffn}}) + " with saturated gates";
      cases.push_back({.op = OpId::swiglu_forward,
                       .mode = CaseMode::forward,
                       .name = shape,
                       .body = [rows, ffn, inputs](CaseContext& c) {
                         const auto gate_up = inputs();
                         const DeviceArray<float> y = c.filled(rows * ffn, kNaN);
                         c.ops().swiglu_forward(c.upload(gate_up).data, y.data, rows, ffn, c.stream());
                         c.expect_close("y", c.download(y, "y"), ref_swiglu(to_double(gate_up), rows, ffn),
                                        tolerances(DType::f32).reference);
                       }});
      cases.push_back({.op = OpId::swiglu_backward,
                       .mode = CaseMode::backward,
                       .name = shape,
                       .body = [rows, ffn, inputs](CaseContext& c) {
                         const auto gate_up = inputs();
                         const auto dy = random_floats(rows * ffn, 51);
                         const DeviceArray<float> d_gate_up = c.filled(rows * 2 * ffn, kNaN);
                         c.ops().swiglu_backward(c.upload(dy).data, c.upload(gate_up).data, d_gate_up.data, rows, ffn,
                                                 c.stream());
                         c.expect_close("d_gate_up", c.download(d_gate_up, "d_gate_up"),
                                        ref_swiglu_backward(dy, gate_up, rows, ffn), tolerances(DType::f32).reference);
                       }});
    }
  cases.push_back({.op = OpId::swiglu_backward,
                   .mode = CaseMode::grad,
                   .name = shape_text({{"rows", 3}, {"ffn", 37}}),
                   .body = [](CaseContext& c) {
                     const int64_t rows = 3;
                     const int ffn = 37;
                     const auto gate_up = random_floats(rows * 2 * ffn, 52, -4.0f, 4.0f);
                     const auto dy = random_floats(rows * ffn, 53);
                     const DeviceArray<float> d_gate_up = c.filled(rows * 2 * ffn, kNaN);
                     c.ops().swiglu_backward(c.upload(dy).data, c.upload(gate_up).data, d_gate_up.data, rows, ffn,
                                             c.stream());
                     c.expect_close("d_gate_up", c.download(d_gate_up, "d_gate_up"),
                                    numeric_gradient([&](const auto& v) { return ref_swiglu(v, rows, ffn); },
                                                     to_double(gate_up), to_double(dy)),
                                    tolerances(DType::f32).finite_difference);
                   }});
}

struct RopeShape {
  int64_t rows;
  int heads, head_dim;
  int64_t row_stride;  // > heads * head_dim: the heads sit inside a wider (e.g. packed QKV) row
  float base;
};

std::string describe(const RopeShape& s) {
  return shape_text({{"rows", s.rows}, {"heads", s.heads}, {"head_dim", s.head_dim}, {"row_stride", s.row_stride}}) +
         " base=" + std::to_string(static_cast<long long>(s.base));
}

std::vector<int32_t> rope_positions(int64_t rows) {
  std::vector<int32_t> positions(rows);
  std::mt19937 rng(60);
  for (auto& p : positions) p = static_cast<int32_t>(rng() % 2048);
  positions[0] = 0;
  if (rows > 2) positions[1] = 70000;  // past the kernel's cached table
  return positions;
}

// Forward, backward, <rope(x), y> = <x, rope_backward(y)>, and backward(forward(x)) = x.
void check_rope(CaseContext& c, const RopeShape& s) {
  const auto positions = rope_positions(s.rows);
  const auto x = random_floats(s.rows * s.row_stride, 61), y = random_floats(s.rows * s.row_stride, 62);
  const DeviceArray<int32_t> d_positions = c.upload(positions);
  const DeviceArray<float> rotated = c.upload(x), back = c.upload(y);
  c.ops().rope_forward(rotated.data, s.rows, s.row_stride, s.heads, s.head_dim, d_positions.data, s.base, c.stream());
  c.ops().rope_backward(back.data, s.rows, s.row_stride, s.heads, s.head_dim, d_positions.data, s.base, c.stream());
  const std::vector<float> rotated_x = c.download(rotated, "rope_forward(x)");
  const std::vector<float> back_y = c.download(back, "rope_backward(y)");
  const double tol = tolerances(DType::f32).reference;
  c.expect_close("rope_forward", rotated_x,
                 ref_rope(to_double(x), s.rows, s.row_stride, s.heads, s.head_dim, positions, s.base, false), tol);
  c.expect_close("rope_backward", back_y,
                 ref_rope(to_double(y), s.rows, s.row_stride, s.heads, s.head_dim, positions, s.base, true), tol);
  double lhs = 0, rhs = 0, scale = 0;  // columns outside the heads are untouched by both
  for (size_t i = 0; i < x.size(); ++i) {
    lhs += static_cast<double>(rotated_x[i]) * y[i];
    rhs += static_cast<double>(x[i]) * back_y[i];
    scale += std::abs(static_cast<double>(x[i]) * y[i]);
  }
  c.expect(std::abs(lhs - rhs) <= 1e-5 * scale,
           "<rope(x), y> = " + std::to_string(lhs) + " but <x, rope_backward(y)> = " + std::to_string(rhs));
  c.ops().rope_backward(rotated.data, s.rows, s.row_stride, s.heads, s.head_dim, d_positions.data, s.base, c.stream());
  c.expect_close("backward(forward(x))", c.download(rotated, "round trip"), to_double(x), tol);
}

void add_rope(std::vector<OpCase>& cases) {
  for (const RopeShape& shape : {RopeShape{1, 1, 2, 2, 10000.0f}, RopeShape{7, 3, 6, 18, 10000.0f},
                                 RopeShape{33, 4, 64, 300, 10000.0f}, RopeShape{5, 2, 128, 256, 500000.0f}}) {
    cases.push_back({.op = OpId::rope_forward,
                     .mode = CaseMode::forward,
                     .name = describe(shape) + ", with backward as its transpose and inverse",
                     .also_uses = {OpId::rope_backward},
                     .body = [shape](CaseContext& c) { check_rope(c, shape); }});
  }
  // The backward entry's own case: the gradient of sum(dy * rope_forward(x)) by central
  // differences of the reference forward (positions below 2048; the cases above take 70000).
  cases.push_back({.op = OpId::rope_backward,
                   .mode = CaseMode::grad,
                   .name = describe({7, 3, 6, 18, 10000.0f}) + ", positions below 2048",
                   .body = [](CaseContext& c) {
                     const RopeShape s{7, 3, 6, 18, 10000.0f};
                     std::vector<int32_t> positions = rope_positions(s.rows);
                     positions[1] = 2047;
                     const auto x = random_floats(s.rows * s.row_stride, 63),
                                dy = random_floats(s.rows * s.row_stride, 64);
                     const DeviceArray<float> dx = c.upload(dy);
                     c.ops().rope_backward(dx.data, s.rows, s.row_stride, s.heads, s.head_dim, c.upload(positions).data,
                                           s.base, c.stream());
                     const auto forward = [&](const std::vector<double>& v) {
                       return ref_rope(v, s.rows, s.row_stride, s.heads, s.head_dim, positions, s.base, false);
                     };
                     c.expect_close("dx", c.download(dx, "dx"), numeric_gradient(forward, to_double(x), to_double(dy)),
                                    tolerances(DType::f32).finite_difference);
                   }});
}

// YaRN (issue 22): DeepSeek-V3's settings on MLA's 64-dim rotary head, and a narrow head with a
// concentration factor other than 1 and a ramp of one fractional step.
struct YarnCase {
  RopeShape shape;
  kernels::YarnRope yarn;
};

std::string describe(const YarnCase& y) {
  return describe(y.shape) + " factor=" + std::to_string(y.yarn.scaling_factor) +
         " concentration=" + std::to_string(y.yarn.concentration);
}

std::vector<float> yarn_frequencies(const YarnCase& y) {
  std::vector<float> inv_freq(y.shape.head_dim / 2);
  kernels::yarn_inv_freq(y.yarn, y.shape.head_dim, inv_freq.data());
  return inv_freq;
}

// Forward and backward against the reference, and <yarn(x), y> = <x, yarn_backward(y)>.
void check_rope_yarn(CaseContext& c, const YarnCase& y) {
  const RopeShape& s = y.shape;
  std::vector<int32_t> positions = rope_positions(s.rows);
  if (s.rows > 2) positions[1] = 4095;
  const auto inv_freq = yarn_frequencies(y);
  const auto x = random_floats(s.rows * s.row_stride, 65), dy = random_floats(s.rows * s.row_stride, 66);
  const DeviceArray<int32_t> d_positions = c.upload(positions);
  const DeviceArray<float> rotated = c.upload(x), back = c.upload(dy);
  c.ops().rope_yarn_forward(rotated.data, s.rows, s.row_stride, s.heads, s.head_dim, d_positions.data, y.yarn,
                            c.stream());
  c.ops().rope_yarn_backward(back.data, s.rows, s.row_stride, s.heads, s.head_dim, d_positions.data, y.yarn,
                             c.stream());
  const std::vector<float> rotated_x = c.download(rotated, "rope_yarn_forward(x)");
  const std::vector<float> back_y = c.download(back, "rope_yarn_backward(dy)");
  const double tol = tolerances(DType::f32).reference;
  c.expect_close("rope_yarn_forward", rotated_x,
                 ref_rope_yarn(to_double(x), s.rows, s.row_stride, s.heads, s.head_dim, positions, inv_freq,
                               y.yarn.concentration, false),
                 tol);
  c.expect_close("rope_yarn_backward", back_y,
                 ref_rope_yarn(to_double(dy), s.rows, s.row_stride, s.heads, s.head_dim, positions, inv_freq,
                               y.yarn.concentration, true),
                 tol);
  double lhs = 0, rhs = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    lhs += static_cast<double>(rotated_x[i]) * dy[i];
    rhs += static_cast<double>(x[i]) * back_y[i];
    scale += std::abs(static_cast<double>(x[i]) * dy[i]);
  }
  c.expect(std::abs(lhs - rhs) <= 1e-5 * scale,
           "<yarn(x), y> = " + std::to_string(lhs) + " but <x, yarn_backward(y)> = " + std::to_string(rhs));
}

void add_rope_yarn(std::vector<OpCase>& cases) {
  kernels::YarnRope deepseek;
  deepseek.scaling_factor = 40.0;
  kernels::YarnRope narrow;
  narrow.scaling_factor = 4.0;
  narrow.original_max_position_embeddings = 64;
  narrow.concentration = kernels::yarn_concentration(4.0, 1.0, 0.707);
  for (const YarnCase& y : {YarnCase{{9, 3, 64, 200, 10000.0f}, deepseek}, YarnCase{{7, 2, 6, 14, 10000.0f}, narrow}}) {
    cases.push_back({.op = OpId::rope_yarn_forward,
                     .mode = CaseMode::forward,
                     .name = describe(y) + ", with backward as its transpose",
                     .also_uses = {OpId::rope_yarn_backward},
                     .body = [y](CaseContext& c) { check_rope_yarn(c, y); }});
  }
  cases.push_back({.op = OpId::rope_yarn_backward,
                   .mode = CaseMode::grad,
                   .name = "rows=7 heads=2 head_dim=6 factor=4 concentration=1.1, positions below 2048",
                   .body = [narrow](CaseContext& c) {
                     const YarnCase y{{7, 2, 6, 14, 10000.0f}, narrow};
                     const RopeShape& s = y.shape;
                     std::vector<int32_t> positions = rope_positions(s.rows);
                     positions[1] = 2047;
                     const auto inv_freq = yarn_frequencies(y);
                     const auto x = random_floats(s.rows * s.row_stride, 67),
                                dy = random_floats(s.rows * s.row_stride, 68);
                     const DeviceArray<float> dx = c.upload(dy);
                     c.ops().rope_yarn_backward(dx.data, s.rows, s.row_stride, s.heads, s.head_dim,
                                                c.upload(positions).data, y.yarn, c.stream());
                     const auto forward = [&](const std::vector<double>& v) {
                       return ref_rope_yarn(v, s.rows, s.row_stride, s.heads, s.head_dim, positions, inv_freq,
                                            y.yarn.concentration, false);
                     };
                     c.expect_close("dx", c.download(dx, "dx"), numeric_gradient(forward, to_double(x), to_double(dy)),
                                    tolerances(DType::f32).finite_difference);
                   }});
}

}  // namespace

void add_activation_cases(std::vector<OpCase>& cases) {
  add_gelu(cases);
  add_gelu_erf(cases);
  add_swiglu(cases);
  add_rope(cases);
  add_rope_yarn(cases);
}

}  // namespace mt::harness
