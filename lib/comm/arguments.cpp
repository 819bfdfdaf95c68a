// Argument checks of the communicators (see arguments.h).
#include "comm/arguments.h"

#include <cstdint>
#include <string>

#include "core/error.h"

namespace mt::comm::detail {

void check_count(const char* op, int64_t count) {
  if (count < 0) throw Error(op, "negative element count " + std::to_string(count));
}

void check_counts(const char* op, const int64_t* counts, const int64_t* offsets, int size) {
  if (size > 0 && (counts == nullptr || offsets == nullptr)) throw Error(op, "counts or offsets missing");
  for (int r = 0; r < size; ++r) {
    if (counts[r] < 0 || offsets[r] < 0) {
      throw Error(op, "negative count or offset for rank " + std::to_string(r) + " (count " +
                          std::to_string(counts[r]) + ", offset " + std::to_string(offsets[r]) + ")");
    }
  }
}

void check_peer(const char* op, int peer, int rank, int size) {
  if (peer < 0 || peer >= size) {
    throw Error(op, "peer " + std::to_string(peer) + " is outside the group of " + std::to_string(size));
  }
  if (peer == rank) throw Error(op, "rank " + std::to_string(rank) + " cannot message itself");
}

void check_tag(const char* op, int tag, int tag_upper_bound) {
  if (tag < 0 || tag > tag_upper_bound) {
    throw Error(op, "tag " + std::to_string(tag) + " outside [0, " + std::to_string(tag_upper_bound) + "]");
  }
}

void check_root(const char* op, int root, int size) {
  if (root < 0 || root >= size) {
    throw Error(op, "root " + std::to_string(root) + " is outside the group of " + std::to_string(size));
  }
}

bool is_own_block(const char* op, const void* whole, const void* part, int64_t count, DType dtype, int rank,
                  int size) {
  const auto w = reinterpret_cast<uintptr_t>(whole), p = reinterpret_cast<uintptr_t>(part);
  const auto block = static_cast<uintptr_t>(count) * dtype_size(dtype);
  if (p + block <= w || p >= w + block * static_cast<uintptr_t>(size)) return false;
  if (p == w + block * static_cast<uintptr_t>(rank)) return true;
  throw Error(op, "the shard buffer overlaps the full buffer but is not block " + std::to_string(rank) + " of it");
}

}  // namespace mt::comm::detail
