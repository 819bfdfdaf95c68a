// The GEMM rate probe (see gemm_probe.h): operands in the table's memory, timed to a synchronize.
#include "perf/gemm_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "backend/memory.h"
#include "core/clock.h"

namespace mt::perf {

double measure_gemm_flops(const backend::Ops& ops, Precision precision) {
  const int64_t n = 2048;
  const DType operand_type = ops.gemm_operand_type(precision);
  const int64_t operand_bytes = n * n * static_cast<int64_t>(dtype_size(operand_type));
  backend::DeviceBuffer<unsigned char> a(ops, operand_bytes, backend::MemoryCategory::activations);
  backend::DeviceBuffer<unsigned char> b(ops, operand_bytes, backend::MemoryCategory::activations);
  backend::DeviceBuffer<float> c(ops, n * n, backend::MemoryCategory::activations);
  const backend::Stream stream = ops.default_stream();
  // Operands 0.5 and 0.25 (their bf16/f16 bits when the GEMM takes 16-bit operands).
  const auto fill = [&](unsigned char* operand, float value) {
    if (operand_type == DType::f32) {
      ops.fill(reinterpret_cast<float*>(operand), n * n, value, stream);
    } else {
      ops.fill(c.data(), n * n, value, stream);
      ops.convert(c.data(), DType::f32, operand, operand_type, n * n, stream);
    }
  };
  fill(a.data(), 0.5f);
  fill(b.data(), 0.25f);
  const auto run = [&] {
    ops.gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n, operand_type, stream);
  };
  run();
  ops.synchronize(stream);
  double best = 0;
  for (int i = 0; i < 8; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    ops.synchronize(stream);
    const double seconds = seconds_since(start);
    best = std::max(best, 2.0 * n * n * n / seconds);
  }
  return best;
}

}  // namespace mt::perf
