#include "perf/gemm_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace mt::perf {

double measure_gemm_flops(Precision precision) {
  const int64_t n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  std::vector<uint16_t> a16(n * n, 0x3f00), b16(n * n, 0x3e80);
  auto run = [&] {
    if (precision == Precision::bf16 && kernels::cpu::native_bf16_gemm()) {
      kernels::cpu::gemm_bf16(false, false, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(), n);
    } else {
      kernels::cpu::gemm_f32(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    }
  };
  run();
  double best = 0;
  for (int i = 0; i < 8; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * n * n * n / seconds);
  }
  return best;
}

}  // namespace mt::perf
