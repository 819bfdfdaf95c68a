// Megatron-Core's roll_tensor(shifts=-1) for multi-token prediction (transformer/
// multi_token_prediction.py), with and without context parallelism: a per-token tensor of each
// sample rolled left by one position along the sample's whole sequence, its last position set to
// 0 (the caller's loss mask, rolled the same way, then masks it). Under CP each rank holds the
// sample's chunks i and 2 CP - 1 - i (context_parallel.h); each chunk rolls within itself and its
// last position receives the first element of the sequence's next chunk: chunk i + 1 is rank
// i + 1's early chunk (on the last rank its own late chunk), chunk 2 CP - i is rank i - 1's late
// chunk, and rank 0's late chunk ends the sequence. The boundary elements move in one
// all_to_allv over the CP group (Megatron sends them with isend/irecv to the same neighbours).
// Rolling k times gives the roll by k with the last k positions 0, as Megatron's depths chain it.
// Tested in tests/unit/parallel/test_sequence_roll.cpp (CP = 1..4 over threads against a roll of
// the whole sequence).
#pragma once

#include <cstdint>

#include "backend/ops.h"
#include "comm/communicator.h"
#include "core/dtype.h"

namespace mt::parallel {

// Elements of device scratch roll_left_one needs for a micro-batch of `batch` samples.
inline int64_t sequence_roll_boundary_elements(int batch) { return 4 * static_cast<int64_t>(batch); }

// out (batch, local_seq) = `in` rolled left by one along each sample's sequence, elements of
// `dtype`; `in` and `out` must not overlap. `cp_group`: this rank's CP group (null or size 1: the
// whole sequence is local, any length); under CP local_seq is the two chunks, early one first,
// and every rank of the group calls this together. `boundary`: sequence_roll_boundary_elements
// elements of `dtype`. Stream order on `stream`, which the group's communicator is bound to.
void roll_left_one(const backend::Ops& ops, backend::Stream stream, comm::Communicator* cp_group, const void* in,
                   void* out, int batch, int64_t local_seq, DType dtype, void* boundary);

}  // namespace mt::parallel
