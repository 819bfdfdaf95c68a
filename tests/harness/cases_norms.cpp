// Cases of the normalisation entries (see op_cases.h): LayerNorm and RMSNorm forward against the
// reference at widths that are and are not multiples of a vector (1, 5, 67, 768), with and without
// bias; backward against the analytic reference and against central differences of the reference
// forward; parameter grads accumulated (from random values, and doubled by two calls); dbias
// optional; parameter grads independent of the thread count.
#include <cstdint>
#include <string>
#include <vector>

#include "case_helpers.h"
#include "op_cases.h"
#include "reference.h"

namespace mt::harness {
namespace {

constexpr float kLayerNormEps = 1e-5f, kRmsNormEps = 1e-6f;

std::string norm_shape(int64_t rows, int cols) { return shape_text({{"rows", rows}, {"cols", cols}}); }

// The forward's saved statistics on the device (mean is empty for RMSNorm).
struct NormSaved {
  DeviceArray<float> x, weight, mean, rstd;
};

NormSaved layernorm_forward(CaseContext& c, const std::vector<float>& x, const std::vector<float>& weight,
                            const std::vector<float>* bias, int64_t rows, int cols) {
  NormSaved saved{c.upload(x), c.upload(weight), c.filled(rows, kNaN), c.filled(rows, kNaN)};
  const DeviceArray<float> y = c.filled(rows * cols, kNaN);
  const float* bias_data = bias ? c.upload(*bias).data : nullptr;
  c.ops().layernorm_forward(saved.x.data, saved.weight.data, bias_data, y.data, saved.mean.data, saved.rstd.data, rows,
                            cols, kLayerNormEps, c.stream());
  return saved;
}

NormSaved rmsnorm_forward(CaseContext& c, const std::vector<float>& x, const std::vector<float>& weight, int64_t rows,
                          int cols) {
  NormSaved saved{c.upload(x), c.upload(weight), {}, c.filled(rows, kNaN)};
  const DeviceArray<float> y = c.filled(rows * cols, kNaN);
  c.ops().rmsnorm_forward(saved.x.data, saved.weight.data, y.data, saved.rstd.data, rows, cols, kRmsNormEps,
                          c.stream());
  return saved;
}

void add_layernorm_forward(std::vector<OpCase>& cases) {
  for (int64_t rows : {1, 7, 33})
    for (int cols : {1, 5, 67, 768})
      for (bool with_bias : {true, false}) {
        cases.push_back({.op = OpId::layernorm_forward,
                         .mode = CaseMode::forward,
                         .name = norm_shape(rows, cols) + (with_bias ? " bias" : " no bias"),
                         .body = [rows, cols, with_bias](CaseContext& c) {
                           const auto x = random_floats(rows * cols, 1, -2.0f, 3.0f);
                           const auto weight = random_floats(cols, 2, 0.5f, 1.5f), bias = random_floats(cols, 3);
                           const DeviceArray<float> y = c.filled(rows * cols, kNaN), mean = c.filled(rows, kNaN),
                                                    rstd = c.filled(rows, kNaN);
                           c.ops().layernorm_forward(c.upload(x).data, c.upload(weight).data,
                                                     with_bias ? c.upload(bias).data : nullptr, y.data, mean.data,
                                                     rstd.data, rows, cols, kLayerNormEps, c.stream());
                           const auto bias_d = to_double(bias);
                           const NormReference ref = ref_layernorm(to_double(x), to_double(weight),
                                                                   with_bias ? &bias_d : nullptr, rows, cols, 1e-5);
                           const double tol = tolerances(DType::f32).reference;
                           c.expect_close("y", c.download(y, "y"), ref.y, tol);
                           c.expect_close("mean", c.download(mean, "mean"), ref.mean, tol);
                           c.expect_close("rstd", c.download(rstd, "rstd"), ref.rstd, tol);
                         }});
      }
}

// dx written (NaN before), dweight and dbias accumulated onto random values; dbias optional.
void add_layernorm_backward(std::vector<OpCase>& cases) {
  for (int64_t rows : {1, 7, 33, 130})
    for (int cols : {1, 5, 67, 768}) {
      cases.push_back(
          {.op = OpId::layernorm_backward,
           .mode = CaseMode::backward,
           .name = norm_shape(rows, cols) + ", grads accumulated onto random values, dbias optional",
           .also_uses = {OpId::layernorm_forward},
           .body = [rows, cols](CaseContext& c) {
             const auto x = random_floats(rows * cols, 4, -2.0f, 2.0f);
             const auto weight = random_floats(cols, 5, 0.5f, 1.5f), bias = random_floats(cols, 6);
             const auto dy = random_floats(rows * cols, 7);
             const auto dweight_before = random_floats(cols, 8), dbias_before = random_floats(cols, 9);
             const NormSaved saved = layernorm_forward(c, x, weight, &bias, rows, cols);
             const DeviceArray<float> d_dy = c.upload(dy), dx = c.filled(rows * cols, kNaN);
             const DeviceArray<float> dweight = c.upload(dweight_before), dbias = c.upload(dbias_before);
             const DeviceArray<float> dweight_alone = c.upload(dweight_before);
             c.ops().layernorm_backward(d_dy.data, saved.x.data, saved.weight.data, saved.mean.data, saved.rstd.data,
                                        dx.data, dweight.data, dbias.data, rows, cols, c.stream());
             c.ops().layernorm_backward(d_dy.data, saved.x.data, saved.weight.data, saved.mean.data, saved.rstd.data,
                                        dx.data, dweight_alone.data, nullptr, rows, cols, c.stream());
             LayerNormGrads ref = ref_layernorm_backward(x, weight, dy, rows, cols, 1e-5);
             for (int col = 0; col < cols; ++col) {
               ref.dweight[col] += dweight_before[col];
               ref.dbias[col] += dbias_before[col];
             }
             const double tol = tolerances(DType::f32).reference;
             // dx is a difference of terms of size rstd dy w (exactly 0 when cols = 1):
             // fp32 rounding of those terms, not of dx, sets the error.
             c.expect_close("dx", c.download(dx, "dx"), ref.dx, tol, rms(ref.dx_terms));
             const std::vector<float> dweight_result = c.download(dweight, "dweight");
             c.expect_close("dweight", dweight_result, ref.dweight, tol);
             c.expect_close("dbias", c.download(dbias, "dbias"), ref.dbias, tol);
             c.expect_bits_equal("dweight without dbias", c.download(dweight_alone, "dweight alone"), dweight_result);
           }});
    }
  for (int cols : {5, 67}) {
    cases.push_back(
        {.op = OpId::layernorm_backward,
         .mode = CaseMode::grad,
         .name = norm_shape(3, cols) + ": dx, dweight, dbias",
         .also_uses = {OpId::layernorm_forward},
         .body = [cols](CaseContext& c) {
           const int64_t rows = 3;
           const auto x = random_floats(rows * cols, 10, -2.0f, 2.0f);
           const auto weight = random_floats(cols, 11, 0.5f, 1.5f), bias = random_floats(cols, 12);
           const auto dy = random_floats(rows * cols, 13);
           const NormSaved saved = layernorm_forward(c, x, weight, &bias, rows, cols);
           const DeviceArray<float> dx = c.filled(rows * cols, kNaN), dweight = c.filled(cols, 0.0f),
                                    dbias = c.filled(cols, 0.0f);
           c.ops().layernorm_backward(c.upload(dy).data, saved.x.data, saved.weight.data, saved.mean.data,
                                      saved.rstd.data, dx.data, dweight.data, dbias.data, rows, cols, c.stream());
           const auto x_d = to_double(x), weight_d = to_double(weight), bias_d = to_double(bias), dy_d = to_double(dy);
           const double tol = tolerances(DType::f32).finite_difference;
           c.expect_close("dx", c.download(dx, "dx"),
                          numeric_gradient_by_row(
                              [&](const auto& v) { return ref_layernorm(v, weight_d, &bias_d, 1, cols, 1e-5).y; }, x_d,
                              dy_d, rows, cols),
                          tol);
           c.expect_close(
               "dweight", c.download(dweight, "dweight"),
               numeric_gradient([&](const auto& v) { return ref_layernorm(x_d, v, &bias_d, rows, cols, 1e-5).y; },
                                weight_d, dy_d),
               tol);
           c.expect_close(
               "dbias", c.download(dbias, "dbias"),
               numeric_gradient([&](const auto& v) { return ref_layernorm(x_d, weight_d, &v, rows, cols, 1e-5).y; },
                                bias_d, dy_d),
               tol);
         }});
  }
  cases.push_back({.op = OpId::layernorm_backward,
                   .mode = CaseMode::accumulate,
                   .name = norm_shape(7, 67) + ": two calls add dweight and dbias twice, write dx once",
                   .also_uses = {OpId::layernorm_forward},
                   .body = [](CaseContext& c) {
                     const int64_t rows = 7;
                     const int cols = 67;
                     const auto x = random_floats(rows * cols, 14, -2.0f, 2.0f);
                     const auto weight = random_floats(cols, 15, 0.5f, 1.5f), dy = random_floats(rows * cols, 16);
                     const auto start = random_floats(cols, 17);
                     const NormSaved saved = layernorm_forward(c, x, weight, nullptr, rows, cols);
                     const DeviceArray<float> d_dy = c.upload(dy), dx = c.filled(rows * cols, kNaN);
                     const DeviceArray<float> dweight = c.upload(start), dbias = c.upload(start);
                     for (int call = 0; call < 2; ++call) {
                       c.ops().layernorm_backward(d_dy.data, saved.x.data, saved.weight.data, saved.mean.data,
                                                  saved.rstd.data, dx.data, dweight.data, dbias.data, rows, cols,
                                                  c.stream());
                     }
                     LayerNormGrads ref = ref_layernorm_backward(x, weight, dy, rows, cols, 1e-5);
                     for (int col = 0; col < cols; ++col) {
                       ref.dweight[col] = start[col] + 2 * ref.dweight[col];
                       ref.dbias[col] = start[col] + 2 * ref.dbias[col];
                     }
                     const double tol = tolerances(DType::f32).reference;
                     c.expect_close("dx", c.download(dx, "dx"), ref.dx, tol, rms(ref.dx_terms));
                     c.expect_close("dweight", c.download(dweight, "dweight"), ref.dweight, tol);
                     c.expect_close("dbias", c.download(dbias, "dbias"), ref.dbias, tol);
                   }});
  cases.push_back({.op = OpId::layernorm_backward,
                   .mode = CaseMode::property,
                   .name = norm_shape(517, 768) + ": dweight, dbias the same bits at any thread count",
                   .also_uses = {OpId::layernorm_forward},
                   .thread_count_independent = true,
                   .body = [reference = lazy<LayerNormGrads>([] {
                              return ref_layernorm_backward(random_floats(517 * 768, 30, -2.0f, 2.0f),
                                                            random_floats(768, 31, 0.5f, 1.5f),
                                                            random_floats(517 * 768, 32), 517, 768, 1e-5);
                            })](CaseContext& c) {
                     const int64_t rows = 517;
                     const int cols = 768;
                     const auto x = random_floats(rows * cols, 30, -2.0f, 2.0f);
                     const auto weight = random_floats(cols, 31, 0.5f, 1.5f), dy = random_floats(rows * cols, 32);
                     const NormSaved saved = layernorm_forward(c, x, weight, nullptr, rows, cols);
                     const DeviceArray<float> dx = c.allocated<float>(rows * cols), dweight = c.filled(cols, 0.0f),
                                              dbias = c.filled(cols, 0.0f);
                     c.ops().layernorm_backward(c.upload(dy).data, saved.x.data, saved.weight.data, saved.mean.data,
                                                saved.rstd.data, dx.data, dweight.data, dbias.data, rows, cols,
                                                c.stream());
                     const LayerNormGrads& ref = reference->get();
                     const double tol = tolerances(DType::f32).reference;
                     c.expect_close("dweight", c.download(dweight, "dweight"), ref.dweight, tol);
                     c.expect_close("dbias", c.download(dbias, "dbias"), ref.dbias, tol);
                   }});
}

void add_rmsnorm(std::vector<OpCase>& cases) {
  for (int64_t rows : {1, 7, 33})
    for (int cols : {1, 5, 67, 768}) {
      cases.push_back({.op = OpId::rmsnorm_forward,
                       .mode = CaseMode::forward,
                       .name = norm_shape(rows, cols),
                       .body = [rows, cols](CaseContext& c) {
                         const auto x = random_floats(rows * cols, 20, -2.0f, 3.0f);
                         const auto weight = random_floats(cols, 21, 0.5f, 1.5f);
                         const DeviceArray<float> y = c.filled(rows * cols, kNaN), rstd = c.filled(rows, kNaN);
                         c.ops().rmsnorm_forward(c.upload(x).data, c.upload(weight).data, y.data, rstd.data, rows, cols,
                                                 kRmsNormEps, c.stream());
                         const NormReference ref = ref_rmsnorm(to_double(x), to_double(weight), rows, cols, 1e-6);
                         const double tol = tolerances(DType::f32).reference;
                         c.expect_close("y", c.download(y, "y"), ref.y, tol);
                         c.expect_close("rstd", c.download(rstd, "rstd"), ref.rstd, tol);
                       }});
    }
  // cols = 1 is left out: there dx = dy w rstd (1 - x^2 rstd^2) cancels to ~eps in fp32.
  for (int64_t rows : {1, 3, 70})
    for (int cols : {5, 67}) {
      cases.push_back({.op = OpId::rmsnorm_backward,
                       .mode = CaseMode::grad,
                       .name = norm_shape(rows, cols) + ": dx, dweight accumulated onto random values",
                       .also_uses = {OpId::rmsnorm_forward},
                       .body = [rows, cols](CaseContext& c) {
                         const auto x = random_floats(rows * cols, 22, -2.0f, 2.0f);
                         const auto weight = random_floats(cols, 23, 0.5f, 1.5f), dy = random_floats(rows * cols, 24);
                         const auto dweight_before = random_floats(cols, 25);
                         const NormSaved saved = rmsnorm_forward(c, x, weight, rows, cols);
                         const DeviceArray<float> dx = c.filled(rows * cols, kNaN), dweight = c.upload(dweight_before);
                         c.ops().rmsnorm_backward(c.upload(dy).data, saved.x.data, saved.weight.data, saved.rstd.data,
                                                  dx.data, dweight.data, rows, cols, c.stream());
                         const auto x_d = to_double(x), weight_d = to_double(weight), dy_d = to_double(dy);
                         const double tol = tolerances(DType::f32).finite_difference;
                         c.expect_close("dx", c.download(dx, "dx"),
                                        numeric_gradient_by_row(
                                            [&](const auto& v) { return ref_rmsnorm(v, weight_d, 1, cols, 1e-6).y; },
                                            x_d, dy_d, rows, cols),
                                        tol);
                         std::vector<double> expected = numeric_gradient(
                             [&](const auto& v) { return ref_rmsnorm(x_d, v, rows, cols, 1e-6).y; }, weight_d, dy_d);
                         for (int col = 0; col < cols; ++col) expected[col] += dweight_before[col];
                         c.expect_close("dweight (accumulated)", c.download(dweight, "dweight"), expected, tol);
                       }});
    }
  cases.push_back(
      {.op = OpId::rmsnorm_backward,
       .mode = CaseMode::accumulate,
       .name = norm_shape(7, 67) + ": two calls add dweight twice, write dx once",
       .also_uses = {OpId::rmsnorm_forward},
       .body = [](CaseContext& c) {
         const int64_t rows = 7;
         const int cols = 67;
         const auto x = random_floats(rows * cols, 26, -2.0f, 2.0f);
         const auto weight = random_floats(cols, 27, 0.5f, 1.5f), dy = random_floats(rows * cols, 28);
         const auto start = random_floats(cols, 29);
         const NormSaved saved = rmsnorm_forward(c, x, weight, rows, cols);
         const DeviceArray<float> d_dy = c.upload(dy), dx = c.filled(rows * cols, kNaN), dweight = c.upload(start);
         for (int call = 0; call < 2; ++call) {
           c.ops().rmsnorm_backward(d_dy.data, saved.x.data, saved.weight.data, saved.rstd.data, dx.data, dweight.data,
                                    rows, cols, c.stream());
         }
         const auto x_d = to_double(x), weight_d = to_double(weight), dy_d = to_double(dy);
         const double tol = tolerances(DType::f32).finite_difference;
         c.expect_close(
             "dx", c.download(dx, "dx"),
             numeric_gradient_by_row([&](const auto& v) { return ref_rmsnorm(v, weight_d, 1, cols, 1e-6).y; }, x_d,
                                     dy_d, rows, cols),
             tol);
         std::vector<double> expected =
             numeric_gradient([&](const auto& v) { return ref_rmsnorm(x_d, v, rows, cols, 1e-6).y; }, weight_d, dy_d);
         for (int col = 0; col < cols; ++col) expected[col] = start[col] + 2 * expected[col];
         c.expect_close("dweight", c.download(dweight, "dweight"), expected, tol);
       }});
  cases.push_back({.op = OpId::rmsnorm_backward,
                   .mode = CaseMode::property,
                   .name = norm_shape(517, 768) + ": dweight the same bits at any thread count",
                   .also_uses = {OpId::rmsnorm_forward},
                   .thread_count_independent = true,
                   .body = [](CaseContext& c) {
                     const int64_t rows = 517;
                     const int cols = 768;
                     const auto x = random_floats(rows * cols, 30, -2.0f, 2.0f);
                     const auto weight = random_floats(cols, 31, 0.5f, 1.5f), dy = random_floats(rows * cols, 32);
                     const NormSaved saved = rmsnorm_forward(c, x, weight, rows, cols);
                     const DeviceArray<float> dx = c.allocated<float>(rows * cols), dweight = c.filled(cols, 0.0f);
                     c.ops().rmsnorm_backward(c.upload(dy).data, saved.x.data, saved.weight.data, saved.rstd.data,
                                              dx.data, dweight.data, rows, cols, c.stream());
                     // dweight[c] = sum_r dy x rstd: RMSNorm's weight grad in closed form.
                     const NormReference fwd = ref_rmsnorm(to_double(x), to_double(weight), rows, cols, 1e-6);
                     std::vector<double> expected(cols, 0.0);
                     for (int64_t r = 0; r < rows; ++r)
                       for (int col = 0; col < cols; ++col)
                         expected[col] += double(dy[r * cols + col]) * x[r * cols + col] * fwd.rstd[r];
                     c.expect_close("dweight", c.download(dweight, "dweight"), expected,
                                    tolerances(DType::f32).reference);
                   }});
}

}  // namespace

void add_norm_cases(std::vector<OpCase>& cases) {
  add_layernorm_forward(cases);
  add_layernorm_backward(cases);
  add_rmsnorm(cases);
}

}  // namespace mt::harness
