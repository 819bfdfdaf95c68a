// The fused CPU attention kernel with and without attention dropout at GPT-2 124M's shape
// (B = 8, T = 256, 12 heads of 64, causal): forward + backward per layer, the two settings
// alternated so that a change in machine load hits both; prints the medians, their difference,
// what it adds to a 12-layer step, and the kernel's ratio. tests/bench/bench_attention_dropout.sh
// measures the whole mt-train step. A benchmark, not a test. Usage: mt_bench_attention_dropout_kernel [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/common/philox.h"
#include "kernels/cpu/ops.h"

namespace {

using mt::kernels::AttentionShape;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  constexpr int kBatch = 8, kSeq = 256, kHeads = 12, kDim = 64, kLayers = 12;
  AttentionShape shape;
  shape.batch = kBatch;
  shape.q_len = shape.kv_len = kSeq;
  shape.q_heads = shape.kv_heads = kHeads;
  shape.head_dim = kDim;
  shape.q_stride = shape.k_stride = shape.v_stride = 3 * kHeads * kDim;  // packed q|k|v rows, as the model's
  shape.o_stride = kHeads * kDim;
  shape.scale = 0.125f;
  const size_t rows = size_t(kBatch) * kSeq;
  std::vector<float> qkv(rows * shape.q_stride), dqkv(qkv.size()), out(rows * shape.o_stride), dout(out.size());
  std::vector<float> lse(rows * kHeads);
  std::vector<int64_t> row_ids(rows);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (float& x : qkv) x = dist(rng);
  for (float& x : dout) x = dist(rng);
  for (size_t r = 0; r < rows; ++r) row_ids[r] = int64_t(r);
  const auto& ops = mt::kernels::cpu::cpu_ops();
  const int64_t k_off = kHeads * kDim, v_off = 2 * kHeads * kDim;
  const auto layer_ms = [&](float p) {
    AttentionShape s = shape;
    s.dropout.key = mt::kernels::DropoutKey{1, mt::kernels::stream_id("bench"), 1, p};
    s.dropout.row_ids = row_ids.data();
    s.dropout.q_heads_total = kHeads;
    const auto start = std::chrono::steady_clock::now();
    ops.attention_forward(s, qkv.data(), qkv.data() + k_off, qkv.data() + v_off, nullptr, out.data(), lse.data());
    ops.attention_backward(s, qkv.data(), qkv.data() + k_off, qkv.data() + v_off, nullptr, out.data(), dout.data(),
                           lse.data(), dqkv.data(), dqkv.data() + k_off, dqkv.data() + v_off);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  layer_ms(0.0f);
  layer_ms(0.1f);
  std::vector<double> off, on;
  for (int i = 0; i < reps; ++i) {
    off.push_back(layer_ms(0.0f));
    on.push_back(layer_ms(0.1f));
  }
  const double without = median(off), with = median(on);
  std::printf("attention forward+backward, B=%d T=%d H=%d D=%d, median of %d: %.2f ms without dropout, %.2f ms with "
              "0.1\n",
              kBatch, kSeq, kHeads, kDim, reps, without, with);
  std::printf("kernel ratio %.3f; dropout adds %.1f ms to a %d-layer forward+backward\n", with / without,
              kLayers * (with - without), kLayers);
  return 0;
}
