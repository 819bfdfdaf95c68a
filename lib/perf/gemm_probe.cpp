#include "perf/gemm_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "backend/ops.h"

namespace mt::perf {

double measure_gemm_flops(Precision precision) {
  const backend::Ops& ops = backend::cpu_ops();
  const int64_t n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  std::vector<uint16_t> a16(n * n, 0x3f00), b16(n * n, 0x3e80);
  const DType operand_type = ops.gemm_operand_type(precision);
  const bool bits = operand_type != DType::f32;
  auto run = [&] {
    ops.gemm(false, false, n, n, n, 1.0f, bits ? static_cast<const void*>(a16.data()) : a.data(), n,
             bits ? static_cast<const void*>(b16.data()) : b.data(), n, 0.0f, c.data(), n, operand_type,
             ops.default_stream());
  };
  run();
  double best = 0;
  for (int i = 0; i < 8; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    ops.synchronize(ops.default_stream());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * n * n * n / seconds);
  }
  return best;
}

}  // namespace mt::perf
