// Ring attention: self-attention over a sequence split across the ranks of a context-parallel
// group (context_parallel.h: rank i holds chunks i and 2 CP - 1 - i of each sample).
// Forward: CP steps; at step j a rank holds the keys and values of rank (i - j) mod CP, attends
// its two query chunks to the two key chunks that causality lets them see (the backend's attention
// kernel with global positions, so document masks work across chunks; non-causal, BERT's padding
// mask: to both, each sample's global key length masking the padding wherever it lies, a chunk of
// padding only giving an lse of -inf that the merge ignores) and merges the partial
// outputs by log-sum-exp (attention_merge), while the key/value block moves on to rank i + 1
// (non-blocking, overlapped with the compute). Backward: the same ring, with the block's dK, dV
// travelling along and accumulated by every rank (the kernel's accumulate_grads), and one last
// hop that brings each block's grads home; dQ accumulates locally.
// Everything runs through the backend op table and a data communicator bound to its default
// stream (comm/communicator.h), in stream order with no host synchronisation (one rank: plain
// attention).
// Tested in tests/unit/parallel/test_ring_attention.cpp (one rank) and
// tests/mpi/test_ring_attention.cpp (CP = 2 and 4 against the full-sequence attention, on the CPU
// table and on the asynchronous CPU table of tests/backend/async_cpu_ops.h).
#pragma once

#include <cstdint>

#include "backend/memory.h"
#include "backend/ops.h"
#include "comm/communicator.h"

namespace mt::parallel {

class RingAttention {
 public:
  // `local` describes this rank's tensors: batch samples of q_len = kv_len = seq_length / CP
  // tokens each (the two chunks, early one first), heads, head_dim, strides and scale; its
  // positions, key_lengths and accumulate_grads are ignored. Buffers (two travelling key/value/grad
  // blocks and one partial output) are allocated here, counted in `ledger` when given. `cp_group`
  // is a data communicator bound to ops' default stream (a control communicator works on the
  // synchronous CPU table only).
  RingAttention(const backend::Ops& ops, comm::Communicator& cp_group, const kernels::AttentionShape& local,
                backend::MemoryLedger* ledger = nullptr);

  // The lse layout: (batch, 2 chunks, q_heads, chunk length) floats.
  int64_t lse_size() const;

  // The samples the next passes run (at most the `local` batch the buffers were sized for).
  void set_batch(int batch);

  // The attention dropout of the next passes (kernels/common/op_params.h): row_ids are the
  // global token ids of the local query rows (batch, local tokens); p = 0 turns it off. Each
  // chunk pair draws with its global key positions, so the mask is that of the full sequence.
  void set_dropout(const kernels::AttentionDropout& dropout);

  // A non-causal `local`'s valid keys per sample of the next passes: (batch) device int32, the
  // whole sequence's counts (the micro-batch's key_lengths, which CP does not split); null: all.
  void set_key_lengths(const int32_t* key_lengths);

  // out (rows, o_stride) and lse of the local queries over the whole sequence's keys.
  // doc_start (batch, local tokens) nullable: global first position of each token's document.
  void forward(const float* q, const float* k, const float* v, const int32_t* doc_start, float* out, float* lse);

  // dq, dk, dv written (strides of q, k, v) from the forward's out and lse and the output grad.
  void backward(const float* q, const float* k, const float* v, const int32_t* doc_start, const float* out,
                const float* dout, const float* lse, float* dq, float* dk, float* dv);

 private:
  // Runs `pair(q_chunk, kv_chunk, shape)` for every sample and pair of chunks where some query
  // sees some key, with `shape` for one sample of one chunk each at their global positions.
  template <typename PairFn>
  void for_each_visible_pair(int kv_owner, PairFn&& pair) const;
  int64_t kv_block_floats() const;
  // Copies this rank's K and V (strided) into travelling block 0, compact.
  void load_local_block(const float* k, const float* v);

  const backend::Ops& ops_;
  comm::Communicator& group_;
  kernels::AttentionShape local_;
  int cp_size_;
  int cp_rank_;
  int chunk_;
  int capacity_batch_;
  backend::DeviceBuffer<float> travelling_[2];  // [K | V | dK | dV], compact (batch, local tokens, kv heads x dim)
  backend::DeviceBuffer<float> part_out_;       // (batch x local tokens, o_stride)
  backend::DeviceBuffer<float> part_lse_;       // (1 sample, q heads, chunk)
};

}  // namespace mt::parallel
