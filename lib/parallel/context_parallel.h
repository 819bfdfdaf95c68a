// Context parallelism's load-balanced sequence split (Megatron's get_batch_on_this_cp_rank):
// each sequence of T tokens is viewed as 2 x CP chunks of T / (2 CP); CP rank i keeps chunks i and
// 2 CP - 1 - i, in that order, so every rank gets the same causal-attention work (an early chunk
// sees few keys, its late partner many). Every per-token tensor of a micro-batch is split the same
// way: tokens, labels, loss mask, position ids, row ids and document starts. Values are kept, not
// renumbered: position ids and document starts stay global positions (so RoPE, the learned
// position embedding and the attention kernel's masks, which compare global positions, need no
// change), and a document start that lies in a chunk this rank does not hold is still right. The
// document starts must therefore be computed on the whole sequence before the split, as the data
// pipeline does. Tested in tests/unit/parallel/test_context_parallel.cpp.
#pragma once

#include <array>
#include <cstdint>

namespace mt::parallel {

// A run of global sequence positions.
struct SequenceChunk {
  int64_t first = 0;
  int64_t length = 0;
  int64_t end() const { return first + length; }
  bool operator==(const SequenceChunk&) const = default;
};

// The two chunks CP rank `cp_rank` holds, early one first. Throws mt::Error unless
// 0 <= cp_rank < cp_size and seq_length is divisible by 2 x cp_size; at cp_size 1 any positive
// length splits (halves, the later one holding the odd token), so odd --seq-length trains.
std::array<SequenceChunk, 2> context_parallel_chunks(int64_t seq_length, int cp_size, int cp_rank);

// Copies this rank's part of a per-token tensor: `full` is (batch, seq_length) rows of
// `row_bytes` bytes, `local` (batch, seq_length / cp_size) rows: each sample's early chunk, then
// its late chunk.
void split_for_context_parallel(const void* full, void* local, int batch, int64_t seq_length, int64_t row_bytes,
                                int cp_size, int cp_rank);

template <typename T>
void split_for_context_parallel(const T* full, T* local, int batch, int64_t seq_length, int64_t width, int cp_size,
                                int cp_rank) {
  split_for_context_parallel(static_cast<const void*>(full), static_cast<void*>(local), batch, seq_length,
                             width * static_cast<int64_t>(sizeof(T)), cp_size, cp_rank);
}

}  // namespace mt::parallel
