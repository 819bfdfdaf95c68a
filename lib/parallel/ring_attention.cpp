// Ring attention over a context-parallel group (see ring_attention.h). No stream synchronisation:
// the group is a data communicator on the ops' stream, so a send reads its block after the ops
// issued before it (the backward's dK, dV included), a wait() orders the next step's ops after the
// block has arrived, and the caller synchronizes where the host reads the results.
#include "parallel/ring_attention.h"

#include <limits>
#include <memory>
#include <vector>

#include "core/error.h"
#include "parallel/context_parallel.h"

namespace mt::parallel {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void wait_all(std::vector<std::unique_ptr<comm::Request>>& requests) {
  for (auto& request : requests) request->wait();
  requests.clear();
}

}  // namespace

RingAttention::RingAttention(const backend::Ops& ops, comm::Communicator& cp_group,
                             const kernels::AttentionShape& local, backend::MemoryLedger* ledger)
    : ops_(ops), group_(cp_group), local_(local), cp_size_(cp_group.size()), cp_rank_(cp_group.rank()) {
  if (local.q_len != local.kv_len || local.q_len % 2 != 0) {
    throw Error("ring attention", "each rank needs two equal chunks of queries and keys, got " +
                                      std::to_string(local.q_len) + " queries and " + std::to_string(local.kv_len) +
                                      " keys");
  }
  chunk_ = local.q_len / 2;
  capacity_batch_ = local.batch;
  local_.key_lengths = nullptr;  // set_key_lengths' (device memory)
  for (auto& block : travelling_) {
    block = backend::DeviceBuffer<float>(ops, 4 * kv_block_floats(), backend::MemoryCategory::comm_buffers, ledger);
  }
  part_out_ = backend::DeviceBuffer<float>(ops, int64_t(local.batch) * local.q_len * local.o_stride,
                                           backend::MemoryCategory::activations, ledger);
  part_lse_ = backend::DeviceBuffer<float>(ops, int64_t(local.q_heads) * chunk_, backend::MemoryCategory::activations,
                                           ledger);
}

int64_t RingAttention::lse_size() const { return int64_t(local_.batch) * 2 * local_.q_heads * chunk_; }

void RingAttention::set_batch(int batch) {
  if (batch < 1 || batch > capacity_batch_) {
    throw Error("ring attention", "a micro-batch of " + std::to_string(batch) + " samples, buffers for " +
                                      std::to_string(capacity_batch_));
  }
  local_.batch = batch;
}

void RingAttention::set_dropout(const kernels::AttentionDropout& dropout) { local_.dropout = dropout; }

void RingAttention::set_key_lengths(const int32_t* key_lengths) { local_.key_lengths = key_lengths; }

int64_t RingAttention::kv_block_floats() const {
  return int64_t(local_.batch) * local_.kv_len * local_.kv_heads * local_.head_dim;
}

void RingAttention::load_local_block(const float* k, const float* v) {
  const int64_t kv_width = int64_t(local_.kv_heads) * local_.head_dim, rows = int64_t(local_.batch) * local_.kv_len;
  const auto bytes = [](int64_t floats) { return floats * int64_t(sizeof(float)); };
  ops_.copy_2d(travelling_[0].data(), bytes(kv_width), k, bytes(local_.k_stride), bytes(kv_width), rows,
               backend::CopyKind::device_to_device, ops_.default_stream());
  ops_.copy_2d(travelling_[0].data() + kv_block_floats(), bytes(kv_width), v, bytes(local_.v_stride), bytes(kv_width),
               rows, backend::CopyKind::device_to_device, ops_.default_stream());
}

template <typename PairFn>
void RingAttention::for_each_visible_pair(int kv_owner, PairFn&& pair) const {
  const int64_t seq_length = int64_t(local_.q_len) * cp_size_;
  const auto q_chunks = context_parallel_chunks(seq_length, cp_size_, cp_rank_);
  const auto kv_chunks = context_parallel_chunks(seq_length, cp_size_, kv_owner);
  kernels::AttentionShape shape = local_;
  shape.batch = 1;
  shape.q_len = shape.kv_len = chunk_;
  shape.k_stride = shape.v_stride = int64_t(local_.kv_heads) * local_.head_dim;  // the compact travelling block
  for (int b = 0; b < local_.batch; ++b) {
    for (int q_chunk = 0; q_chunk < 2; ++q_chunk) {
      for (int kv_chunk = 0; kv_chunk < 2; ++kv_chunk) {
        shape.q_pos0 = q_chunks[size_t(q_chunk)].first;
        shape.kv_pos0 = kv_chunks[size_t(kv_chunk)].first;
        if (local_.causal && shape.kv_pos0 > shape.q_pos0 + chunk_ - 1) continue;  // every key after every query
        if (local_.key_lengths) shape.key_lengths = local_.key_lengths + b;  // non-causal: the sample's valid keys
        if (local_.dropout.row_ids) {
          shape.dropout.row_ids = local_.dropout.row_ids + int64_t(b) * local_.q_len + int64_t(q_chunk) * chunk_;
        }
        pair(b, q_chunk, kv_chunk, shape);
      }
    }
  }
}

void RingAttention::forward(const float* q, const float* k, const float* v, const int32_t* doc_start, float* out,
                            float* lse) {
  const backend::Stream stream = ops_.default_stream();
  const int64_t block = kv_block_floats(), kv_width = int64_t(local_.kv_heads) * local_.head_dim;
  const int64_t lse_rows = int64_t(local_.q_heads) * chunk_;
  const int next = (cp_rank_ + 1) % cp_size_, previous = (cp_rank_ + cp_size_ - 1) % cp_size_;
  load_local_block(k, v);
  ops_.fill(lse, lse_size(), kNegInf, stream);

  std::vector<std::unique_ptr<comm::Request>> requests;
  int current = 0;
  for (int step = 0; step < cp_size_; ++step) {
    float* held = travelling_[current].data();
    if (step + 1 < cp_size_) {  // pass the block on while attending to it
      requests.push_back(group_.send_async(held, 2 * block, DType::f32, next, step));
      requests.push_back(group_.recv_async(travelling_[1 - current].data(), 2 * block, DType::f32, previous, step));
    }
    const int owner = (cp_rank_ + cp_size_ - step) % cp_size_;
    for_each_visible_pair(owner, [&](int b, int q_chunk, int kv_chunk, const kernels::AttentionShape& shape) {
      const int64_t q_row = int64_t(b) * local_.q_len + int64_t(q_chunk) * chunk_;
      const int64_t kv_row = int64_t(b) * local_.kv_len + int64_t(kv_chunk) * chunk_;
      float* chunk_lse = lse + (int64_t(b) * 2 + q_chunk) * lse_rows;
      ops_.attention_forward(shape, q + q_row * local_.q_stride, held + kv_row * kv_width,
                             held + block + kv_row * kv_width, doc_start ? doc_start + q_row : nullptr,
                             part_out_.data() + q_row * local_.o_stride, part_lse_.data(), stream);
      ops_.attention_merge(shape, out + q_row * local_.o_stride, chunk_lse, part_out_.data() + q_row * local_.o_stride,
                           part_lse_.data(), stream);
    });
    wait_all(requests);
    current = 1 - current;
  }
}

void RingAttention::backward(const float* q, const float* k, const float* v, const int32_t* doc_start,
                             const float* out, const float* dout, const float* lse, float* dq, float* dk, float* dv) {
  const backend::Stream stream = ops_.default_stream();
  const int64_t block = kv_block_floats(), kv_width = int64_t(local_.kv_heads) * local_.head_dim;
  const int64_t q_width = int64_t(local_.q_heads) * local_.head_dim;
  const int64_t kv_rows = int64_t(local_.batch) * local_.kv_len, q_rows = int64_t(local_.batch) * local_.q_len;
  const int64_t lse_rows = int64_t(local_.q_heads) * chunk_;
  const int next = (cp_rank_ + 1) % cp_size_, previous = (cp_rank_ + cp_size_ - 1) % cp_size_;
  load_local_block(k, v);
  ops_.fill(travelling_[0].data() + 2 * block, 2 * block, 0.0f, stream);
  for (int64_t row = 0; row < q_rows; ++row) ops_.fill(dq + row * local_.q_stride, q_width, 0.0f, stream);

  std::vector<std::unique_ptr<comm::Request>> requests;
  int current = 0;
  for (int step = 0; step < cp_size_; ++step) {
    float* held = travelling_[current].data();
    float* incoming = travelling_[1 - current].data();
    const bool passes_on = step + 1 < cp_size_;
    if (passes_on) {  // K, V move on at once; their grads once this rank has added its share
      requests.push_back(group_.send_async(held, 2 * block, DType::f32, next, 2 * step));
      requests.push_back(group_.recv_async(incoming, 2 * block, DType::f32, previous, 2 * step));
      requests.push_back(group_.recv_async(incoming + 2 * block, 2 * block, DType::f32, previous, 2 * step + 1));
    }
    const int owner = (cp_rank_ + cp_size_ - step) % cp_size_;
    for_each_visible_pair(owner, [&](int b, int q_chunk, int kv_chunk, kernels::AttentionShape shape) {
      shape.accumulate_grads = true;
      const int64_t q_row = int64_t(b) * local_.q_len + int64_t(q_chunk) * chunk_;
      const int64_t kv_row = int64_t(b) * local_.kv_len + int64_t(kv_chunk) * chunk_;
      ops_.attention_backward(shape, q + q_row * local_.q_stride, held + kv_row * kv_width,
                              held + block + kv_row * kv_width, doc_start ? doc_start + q_row : nullptr,
                              out + q_row * local_.o_stride, dout + q_row * local_.o_stride,
                              lse + (int64_t(b) * 2 + q_chunk) * lse_rows, dq + q_row * local_.q_stride,
                              held + 2 * block + kv_row * kv_width, held + 3 * block + kv_row * kv_width, stream);
    });
    if (passes_on) {
      requests.push_back(group_.send_async(held + 2 * block, 2 * block, DType::f32, next, 2 * step + 1));
    }
    wait_all(requests);
    current = 1 - current;
  }
  // The block held last is rank + 1's, its grads complete: one more hop brings every block's home.
  const float* home = travelling_[1 - current].data();
  if (cp_size_ > 1) {
    const int last_tag = 2 * cp_size_;
    requests.push_back(group_.send_async(home + 2 * block, 2 * block, DType::f32, next, last_tag));
    requests.push_back(group_.recv_async(travelling_[current].data() + 2 * block, 2 * block, DType::f32, previous,
                                         last_tag));
    wait_all(requests);
    home = travelling_[current].data();
  }
  const int64_t float_bytes = sizeof(float), row_bytes = kv_width * float_bytes;
  ops_.copy_2d(dk, local_.k_stride * float_bytes, home + 2 * block, row_bytes, row_bytes, kv_rows,
               backend::CopyKind::device_to_device, stream);
  ops_.copy_2d(dv, local_.v_stride * float_bytes, home + 3 * block, row_bytes, row_bytes, kv_rows,
               backend::CopyKind::device_to_device, stream);
}

}  // namespace mt::parallel
