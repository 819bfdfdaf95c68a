// Argument checks shared by the communicator implementations (communicator.h): each throws a
// one-line mt::Error naming the operation and the bad argument. Exercised through both
// implementations' tests (tests/unit/comm/test_single_communicator.cpp, tests/mpi/test_communicator.cpp).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mt::comm::detail {

void check_count(const char* op, int64_t count);
// Counts and element offsets of all_to_allv, one per rank of a group of `size`.
void check_counts(const char* op, const int64_t* counts, const int64_t* offsets, int size);
// Point to point: another rank of the group, and a tag in [0, tag_upper_bound].
void check_peer(const char* op, int peer, int rank, int size);
void check_tag(const char* op, int tag, int tag_upper_bound);
void check_root(const char* op, int root, int size);
// Whether `part` (count elements of `dtype`) is block `rank` of `whole` (size * count elements):
// false when the two are disjoint; an error when they overlap any other way.
bool is_own_block(const char* op, const void* whole, const void* part, int64_t count, DType dtype, int rank, int size);

}  // namespace mt::comm::detail
