// mt's side of the GPU attention benchmark (issue 23's "Fast"): the CUDA table's causal
// attention_forward + attention_backward at the shapes tests/bench/gpu_bench_torch.py times on
// SDPA's flash backend (GPT-2 124M: batch 16, 12 heads, T 1024, head 64; LLaMA-3-8B: batch 1, 32
// query heads, 8 KV heads, T 4096, head 128), timed with the table's events. mt's attention
// entries compute in fp32 (SDPA's flash backend in bf16): the figures say so. One JSON line per
// shape on stdout (tests/gpu/run_on_gpu.sh appends them to bench.jsonl). A benchmark, not a test;
// run on the GPU machine by tests/gpu/run_on_gpu.sh. Exit 1 with one line when there is no CUDA
// table.
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "backend/registry.h"

namespace {

using mt::backend::CopyKind;
using mt::backend::MemoryCategory;
using mt::backend::Ops;

struct Shape {
  const char* model;
  int batch, heads, kv_heads, seq, head_dim;
};

// Device memory of `n` floats filled from the host with values in [-1, 1).
float* random_device(const Ops& ops, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> host(static_cast<size_t>(n));
  for (float& x : host) x = dist(rng);
  auto* device = static_cast<float*>(ops.allocate(n * 4, MemoryCategory::activations));
  ops.copy(device, host.data(), n * 4, CopyKind::host_to_device, ops.default_stream());
  ops.synchronize(ops.default_stream());  // the host vector dies here
  return device;
}

void bench(const Ops& ops, const Shape& s, int repeats) {
  mt::backend::AttentionShape shape;
  shape.batch = s.batch;
  shape.q_len = shape.kv_len = s.seq;
  shape.q_heads = s.heads;
  shape.kv_heads = s.kv_heads;
  shape.head_dim = s.head_dim;
  shape.q_stride = shape.o_stride = int64_t{s.heads} * s.head_dim;
  shape.k_stride = shape.v_stride = int64_t{s.kv_heads} * s.head_dim;
  shape.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const int64_t q_size = int64_t{s.batch} * s.seq * shape.q_stride;    // (B, T, H D)
  const int64_t kv_size = int64_t{s.batch} * s.seq * shape.k_stride;  // (B, T, G D)
  const int64_t lse_size = int64_t{s.batch} * s.heads * s.seq;        // (B, H, T)
  std::mt19937 rng(7);
  float* q = random_device(ops, q_size, rng);
  float* k = random_device(ops, kv_size, rng);
  float* v = random_device(ops, kv_size, rng);
  float* dout = random_device(ops, q_size, rng);
  auto* out = static_cast<float*>(ops.allocate(q_size * 4, MemoryCategory::activations));
  auto* lse = static_cast<float*>(ops.allocate(lse_size * 4, MemoryCategory::activations));
  auto* dq = static_cast<float*>(ops.allocate(q_size * 4, MemoryCategory::activations));
  auto* dk = static_cast<float*>(ops.allocate(kv_size * 4, MemoryCategory::activations));
  auto* dv = static_cast<float*>(ops.allocate(kv_size * 4, MemoryCategory::activations));
  const auto stream = ops.default_stream();
  const auto step = [&] {
    ops.attention_forward(shape, q, k, v, nullptr, out, lse, stream);
    ops.attention_backward(shape, q, k, v, nullptr, out, dout, lse, dq, dk, dv, stream);
  };
  for (int i = 0; i < 2; ++i) step();
  const auto start = ops.create_event(), end = ops.create_event();
  ops.record_event(start, stream);
  for (int i = 0; i < repeats; ++i) step();
  ops.record_event(end, stream);
  ops.synchronize_event(end);
  const double ms = ops.elapsed_seconds(start, end) * 1e3 / repeats;
  ops.destroy_event(start);
  ops.destroy_event(end);
  const double forward_flops = 4.0 * s.batch * s.heads * double(s.seq) * s.seq * s.head_dim / 2;  // causal
  std::printf("{\"impl\": \"mt-cuda-attention\", \"model\": \"%s\", \"dtype\": \"fp32\", \"batch\": %d, \"heads\": %d, "
              "\"kv_heads\": %d, \"seq\": %d, \"head_dim\": %d, \"fwd_bwd_ms\": %.4f, \"tflops\": %.2f}\n",
              s.model, s.batch, s.heads, s.kv_heads, s.seq, s.head_dim, ms, 3.5 * forward_flops / (ms / 1e3) / 1e12);
  std::fflush(stdout);
  for (float* p : {q, dout, out, dq}) ops.release(p, q_size * 4, MemoryCategory::activations);
  for (float* p : {k, v, dk, dv}) ops.release(p, kv_size * 4, MemoryCategory::activations);
  ops.release(lse, lse_size * 4, MemoryCategory::activations);
}

}  // namespace

int main() {
  try {
    const Ops& ops = mt::backend::backend_ops(mt::backend::Device::cuda);
    bench(ops, {"gpt2", 16, 12, 12, 1024, 64}, 10);
    bench(ops, {"llama", 1, 32, 8, 4096, 128}, 5);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mt_bench_gpu_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
