// Pipeline schedules: for each pipeline rank, the ordered list of forward and backward passes
// (micro-batch m on model chunk c) it runs in one training step, with the ranks its inputs come
// from and its outputs go to. The order is Megatron's (megatron/core/pipeline_parallel/schedules.py):
//   - 1F1B (one chunk per rank): rank r runs min(p - r - 1, m) warm-up forwards, then alternates
//     one forward and one backward, then drains the remaining backwards.
//   - Interleaved (v > 1 chunks per rank): Megatron's schedule table (get_schedule_table) runs
//     a group of G micro-batches through chunk 0, the same G through chunk 1, ...; the k-th
//     forward is table[k], the k-th backward is table[k] with the chunk mirrored (v - 1 - c);
//     warm-up = 2 (p - r - 1) + (v - 1) G forwards (get_pp_rank_microbatches), capped at m v.
//   - Forward only (evaluation): every forward in table order.
// Model chunk c of rank r is virtual stage c p + r: forwards flow from virtual stage s to s + 1
// (rank r + 1, wrapping from the last rank to rank 0 and the next chunk), grads the other way.
// Tested in tests/unit/parallel/test_pipeline_schedule.cpp (Megatron's warm-up formulas, a
// simulator running every rank's list with blocking point-to-point semantics, in-flight counts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/parallel_config.h"

namespace mt::parallel {

struct PipelineShape {
  int stages = 1;          // p: --pipeline-model-parallel-size
  int chunks = 1;          // v: model chunks (virtual stages) per pipeline rank
  int micro_batches = 1;   // m: micro-batches per step on each data-parallel rank
  int group_size = 1;      // G: --microbatch-group-size-per-virtual-pipeline-stage (interleaved only)
  bool forward_only = false;
};

// The shape of a config validate() accepted, for `micro_batches` micro-batches per step.
PipelineShape pipeline_shape(const ParallelConfig& config, int num_layers, int micro_batches,
                             bool forward_only = false);

enum class PipelinePass { forward, backward };

struct PipelineAction {
  PipelinePass pass = PipelinePass::forward;
  int micro_batch = 0;
  int chunk = 0;
  // Pipeline rank the pass's input comes from (activation for a forward, output grad for a
  // backward); -1 when it starts here (the first virtual stage's forward, the last's backward).
  int recv_from = -1;
  // Pipeline rank the pass's output goes to; -1 when it ends here.
  int send_to = -1;
  bool operator==(const PipelineAction&) const = default;
};

// Forwards before the first backward on pipeline rank `rank` (Megatron's num_warmup_microbatches,
// counted in passes of one chunk; every pass when forward_only).
int pipeline_warmup_passes(const PipelineShape& shape, int rank);

// Rank `rank`'s passes in order. Throws mt::Error for a shape Megatron's schedules do not run
// (v > 1 without a pipeline, G outside [p, m], a last group of fewer than p micro-batches).
std::vector<PipelineAction> pipeline_actions(const PipelineShape& shape, int rank);

// Forward activations rank `rank` holds at once at most (forwards run minus backwards run, over
// its action list): the activation slots it needs, each one micro-batch of one chunk. With
// `chunk` >= 0, those of that model chunk only (the slots of its stage).
int pipeline_activation_slots(const std::vector<PipelineAction>& actions, int chunk = -1);

// The same over the model chunks `chunks` together: the slots of a pool they share.
int pipeline_activation_slots(const std::vector<PipelineAction>& actions, const std::vector<int>& chunks);

// A pool of activation slots shared by some of a rank's model chunks: a slot holds one
// micro-batch of any of them, so it is as large as the largest of their slots.
struct ActivationSlotPool {
  std::vector<int> chunks;  // ascending
  int slots = 0;            // pipeline_activation_slots(actions, chunks)
  int64_t slot_floats = 0;  // the largest of the chunks' slots
  int64_t floats() const { return slots * slot_floats; }
  bool operator==(const ActivationSlotPool&) const = default;
};

// How a rank's chunks share slots, given the floats one slot of each chunk takes
// (`chunk_slot_floats[c]`): starting from a pool per chunk, the two pools whose merging saves the
// most floats are merged while a merge costs nothing. Chunks of equal slots all share one pool
// (its count, the most they hold together, is never more than the sum of theirs); a chunk with
// much larger slots (the output layer's logits) keeps its own when sharing would cost. Never more
// floats than a pool per chunk.
std::vector<ActivationSlotPool> pipeline_slot_pools(const std::vector<PipelineAction>& actions,
                                                    const std::vector<int64_t>& chunk_slot_floats);

// "F3.1" (forward of micro-batch 3 on chunk 1) / "B3.1": compact step orders for tests and logs.
std::string to_string(const PipelineAction& action);

}  // namespace mt::parallel
