// Context-parallel sequence split (see context_parallel.h).
#include "parallel/context_parallel.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace mt::parallel {

std::array<SequenceChunk, 2> context_parallel_chunks(int64_t seq_length, int cp_size, int cp_rank) {
  if (cp_size < 1 || cp_rank < 0 || cp_rank >= cp_size) {
    throw Error("context parallel split", "rank " + std::to_string(cp_rank) + " outside a group of " +
                                              std::to_string(cp_size));
  }
  if (cp_size == 1 && seq_length > 0) {
    // No context parallelism: the whole sequence in one rank's two chunks, in order (any length).
    const int64_t early = seq_length / 2;
    return {SequenceChunk{0, early}, SequenceChunk{early, seq_length - early}};
  }
  if (seq_length <= 0 || seq_length % (2 * cp_size) != 0) {
    throw Error("context parallel split", "sequence of " + std::to_string(seq_length) +
                                              " tokens not divisible into 2 x " + std::to_string(cp_size) + " chunks");
  }
  const int64_t chunk = seq_length / (2 * cp_size);
  return {SequenceChunk{cp_rank * chunk, chunk}, SequenceChunk{(2 * cp_size - 1 - cp_rank) * chunk, chunk}};
}

void split_for_context_parallel(const void* full, void* local, int batch, int64_t seq_length, int64_t row_bytes,
                                int cp_size, int cp_rank) {
  const auto chunks = context_parallel_chunks(seq_length, cp_size, cp_rank);
  const auto* source = static_cast<const unsigned char*>(full);
  auto* target = static_cast<unsigned char*>(local);
  for (int b = 0; b < batch; ++b) {
    for (const SequenceChunk& chunk : chunks) {
      const size_t bytes = static_cast<size_t>(chunk.length * row_bytes);
      std::memcpy(target, source + (b * seq_length + chunk.first) * row_bytes, bytes);
      target += bytes;
    }
  }
}

}  // namespace mt::parallel
