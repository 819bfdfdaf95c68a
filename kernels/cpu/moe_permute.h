// The MoE token dispatcher's row moves on the CPU (lib/model/moe/token_dispatcher.h): per-expert
// counts of a routing map, the expert-major row order (Megatron's permute: experts ascending,
// tokens ascending inside an expert), gathering rows by index, scatter-adding them back, the dense
// prob grads of the routed copies, and reordering chunks of rows (Megatron's sort_chunks_by_idxs).
// Row-major fp32 rows of `cols` elements; routing maps (tokens, experts) of uint8, nonzero =
// routed. Plain C++ with OpenMP; every result is the same at any thread count (each output element
// is written by one thread, sums in a fixed order). Zero rows or chunks are no-ops (null pointers
// allowed then). Tested in tests/harness/cases_moe_permute.cpp (against double loops, at two
// thread counts).
#pragma once

#include <cstdint>

namespace mt::kernels::cpu {

// counts[e] = number of tokens t with routing_map[t experts + e] != 0 (overwritten).
void moe_expert_counts(const uint8_t* routing_map, int64_t tokens, int experts, int64_t* counts);

// One row per routed (token, expert), experts ascending, tokens ascending inside an expert:
// row_token[r] = its token, row_probs[r] = probs[token experts + expert]. The rows number the ones
// of the map (the sum of moe_expert_counts); row_token and row_probs hold that many.
void moe_route_index(const uint8_t* routing_map, const float* probs, int64_t tokens, int experts, int32_t* row_token,
                     float* row_probs);

// out[r] = in[row_index[r]] for r < rows (gather; in's rows are those the indices name).
void moe_permute_rows(const float* in, const int32_t* row_index, int64_t rows, int64_t cols, float* out);

// out (out_rows, cols), overwritten: row t = the sum, in ascending r, of the in[r] whose
// row_index[r] = t (starting from +0.0f), zero where none; every row_index in [0, out_rows).
void moe_unpermute_rows(const float* in, const int32_t* row_index, int64_t rows, int64_t cols, float* out,
                        int64_t out_rows);

// dprobs (tokens, experts), overwritten: the rows of moe_route_index's order, expert e's
// expert_rows[e] rows after those of experts before it, give dprobs[row_token[r] experts + e] =
// row_grads[r]; every other element zero.
void moe_unroute_probs(const float* row_grads, const int32_t* row_token, const int64_t* expert_rows, int64_t tokens,
                       int experts, float* dprobs);

// `in` holds `chunks` consecutive chunks of rows, chunk i of chunk_rows[i] rows; out holds the
// same chunks in the order `order` gives (out's chunk j is in's chunk order[j]; order a
// permutation of [0, chunks)).
void moe_sort_chunks(const float* in, int64_t cols, const int64_t* chunk_rows, const int32_t* order, int chunks,
                     float* out);

}  // namespace mt::kernels::cpu
