// Shared by tests/unit/parallel/test_ring_attention.cpp (one rank) and
// tests/mpi/test_ring_attention.cpp (CP ranks): every rank builds the same full-sequence problem
// (packed q|k|v rows as the model stores them, GQA, optional documents crossing chunk borders, or
// non-causal with padding that fills whole chunks),
// runs the CPU table's attention on the whole sequence (the reference), runs RingAttention on the
// table under test over its context-parallel part in that table's memory (copied in, and back
// after one synchronize of the stream), and measures how far its out, lse, dq, dk, dv are from
// its part of the full results.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "comm/communicator.h"
#include "parallel/context_parallel.h"
#include "parallel/ring_attention.h"

namespace ring_check {

struct RingCase {
  int batch = 2;
  int seq_length = 48;
  int q_heads = 4;
  int kv_heads = 2;
  int head_dim = 8;
  bool documents = false;
  // Non-causal (BERT's padding mask): sample b's valid keys are seq_length - 3 (b even) or
  // 5/12 of it (b odd: at CP 2 and 4 whole chunks of padding), keys past them masked everywhere.
  bool bidirectional = false;
};

// Largest |ring - full| over the largest |full| (at least 0.1); lse absolute. NaN propagates.
struct RingErrors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  bool finite = true;
};

inline double relative_error(const std::vector<float>& got, const std::vector<float>& want, bool& finite) {
  double error = 0, scale = 0.1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) finite = false;
    error = std::max(error, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return error / scale;
}

// The columns [first, first + width) of rows of `stride` floats, compact.
inline std::vector<float> columns(const std::vector<float>& rows, int64_t stride, int64_t first, int64_t width) {
  std::vector<float> out;
  for (size_t r = 0; r < rows.size() / size_t(stride); ++r) {
    out.insert(out.end(), rows.begin() + std::ptrdiff_t(r * stride + first),
               rows.begin() + std::ptrdiff_t(r * stride + first + width));
  }
  return out;
}

inline RingErrors ring_attention_errors(const mt::backend::Ops& ops, mt::comm::Communicator& group, const RingCase& c,
                                        uint32_t seed) {
  const int cp = group.size(), rank = group.rank();
  const int64_t q_width = int64_t(c.q_heads) * c.head_dim, kv_width = int64_t(c.kv_heads) * c.head_dim;
  const int64_t stride = q_width + 2 * kv_width;  // packed q | k | v
  const int64_t rows = int64_t(c.batch) * c.seq_length, local_seq = c.seq_length / cp;
  const int64_t local_rows = int64_t(c.batch) * local_seq;

  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<float> qkv(size_t(rows * stride)), dout(size_t(rows * q_width));
  for (float& x : qkv) x = uniform(rng);
  for (float& x : dout) x = uniform(rng) / 2;
  // Documents of sample b start every 7 + 4 b tokens (borders inside and across chunks).
  std::vector<int32_t> doc_start(static_cast<size_t>(rows));
  for (int b = 0; b < c.batch; ++b) {
    for (int t = 0; t < c.seq_length; ++t) doc_start[size_t(b * c.seq_length + t)] = t / (7 + 4 * b) * (7 + 4 * b);
  }

  std::vector<int32_t> key_lengths(size_t(c.batch));
  for (int b = 0; b < c.batch; ++b) key_lengths[size_t(b)] = b % 2 == 0 ? c.seq_length - 3 : c.seq_length * 5 / 12;

  mt::kernels::AttentionShape full;
  full.causal = !c.bidirectional;
  full.key_lengths = c.bidirectional ? key_lengths.data() : nullptr;
  full.batch = c.batch;
  full.q_len = full.kv_len = c.seq_length;
  full.q_heads = c.q_heads;
  full.kv_heads = c.kv_heads;
  full.head_dim = c.head_dim;
  full.q_stride = full.k_stride = full.v_stride = stride;
  full.o_stride = q_width;
  full.scale = 1.0f / std::sqrt(float(c.head_dim));
  const mt::backend::Ops& reference = mt::backend::cpu_ops();
  std::vector<float> full_out(size_t(rows * q_width)), full_lse(size_t(rows * c.q_heads)), full_grad(qkv.size());
  const int32_t* full_docs = c.documents ? doc_start.data() : nullptr;
  reference.attention_forward(full, qkv.data(), qkv.data() + q_width, qkv.data() + q_width + kv_width, full_docs,
                              full_out.data(), full_lse.data(), reference.default_stream());
  reference.attention_backward(full, qkv.data(), qkv.data() + q_width, qkv.data() + q_width + kv_width, full_docs,
                               full_out.data(), dout.data(), full_lse.data(), full_grad.data(),
                               full_grad.data() + q_width, full_grad.data() + q_width + kv_width,
                               reference.default_stream());

  // This rank's part of the inputs and of the full results.
  const auto split = [&](const auto& full_rows, int64_t width) {
    std::vector<typename std::decay_t<decltype(full_rows)>::value_type> local(size_t(local_rows * width));
    mt::parallel::split_for_context_parallel(full_rows.data(), local.data(), c.batch, c.seq_length, width, cp, rank);
    return local;
  };
  const std::vector<float> local_qkv = split(qkv, stride), local_dout = split(dout, q_width);
  const std::vector<int32_t> local_docs = split(doc_start, 1);

  mt::kernels::AttentionShape local = full;
  local.q_len = local.kv_len = static_cast<int>(local_seq);
  mt::parallel::RingAttention ring(ops, group, local);
  // The ring's inputs and outputs in the table's memory; the outputs start as NaN.
  const mt::backend::Stream stream = ops.default_stream();
  const auto on_device = [&](const auto& host) {
    using T = typename std::decay_t<decltype(host)>::value_type;
    mt::backend::DeviceBuffer<T> device(ops, int64_t(host.size()), mt::backend::MemoryCategory::activations);
    ops.copy(device.data(), host.data(), int64_t(host.size() * sizeof(T)), mt::backend::CopyKind::host_to_device, stream);
    return device;
  };
  const auto nan_filled = [&](int64_t n) {
    mt::backend::DeviceBuffer<float> device(ops, n, mt::backend::MemoryCategory::activations);
    ops.fill(device.data(), n, std::nanf(""), stream);
    return device;
  };
  const auto d_qkv = on_device(local_qkv), d_dout = on_device(local_dout);
  const auto d_docs = on_device(local_docs), d_key_lengths = on_device(key_lengths);
  auto d_out = nan_filled(local_rows * q_width), d_lse = nan_filled(ring.lse_size());
  auto d_grad = nan_filled(int64_t(local_qkv.size()));
  const float* q = d_qkv.data();
  float* g = d_grad.data();
  const int32_t* docs = c.documents ? d_docs.data() : nullptr;
  ring.set_key_lengths(c.bidirectional ? d_key_lengths.data() : nullptr);
  ring.forward(q, q + q_width, q + q_width + kv_width, docs, d_out.data(), d_lse.data());
  ring.backward(q, q + q_width, q + q_width + kv_width, docs, d_out.data(), d_dout.data(), d_lse.data(), g,
                g + q_width, g + q_width + kv_width);
  std::vector<float> out(size_t(local_rows * q_width)), lse(size_t(ring.lse_size())), grad(local_qkv.size());
  for (auto [host, device] : {std::pair{&out, d_out.data()}, std::pair{&lse, d_lse.data()}, std::pair{&grad, g}}) {
    ops.copy(host->data(), device, int64_t(host->size() * sizeof(float)), mt::backend::CopyKind::device_to_host,
             stream);
  }
  ops.synchronize(stream);  // the host reads what the stream wrote

  RingErrors errors;
  errors.out = relative_error(out, split(full_out, q_width), errors.finite);
  const std::vector<float> want_grad = split(full_grad, stride);
  errors.dq = relative_error(columns(grad, stride, 0, q_width), columns(want_grad, stride, 0, q_width), errors.finite);
  errors.dk = relative_error(columns(grad, stride, q_width, kv_width), columns(want_grad, stride, q_width, kv_width),
                             errors.finite);
  errors.dv = relative_error(columns(grad, stride, q_width + kv_width, kv_width),
                             columns(want_grad, stride, q_width + kv_width, kv_width), errors.finite);
  // lse: ring (batch, 2 chunks, heads, chunk) against full (batch, heads, seq) at global positions.
  const auto chunks = mt::parallel::context_parallel_chunks(c.seq_length, cp, rank);
  const int64_t chunk = local_seq / 2;
  for (int b = 0; b < c.batch; ++b) {
    for (int half = 0; half < 2; ++half) {
      for (int h = 0; h < c.q_heads; ++h) {
        for (int64_t t = 0; t < chunk; ++t) {
          const float got = lse[size_t(((int64_t(b) * 2 + half) * c.q_heads + h) * chunk + t)];
          const int64_t position = chunks[size_t(half)].first + t;
          const float want = full_lse[size_t((int64_t(b) * c.q_heads + h) * c.seq_length + position)];
          if (!std::isfinite(got)) errors.finite = false;
          errors.lse = std::max(errors.lse, std::abs(double(got) - double(want)));
        }
      }
    }
  }
  return errors;
}

}  // namespace ring_check
