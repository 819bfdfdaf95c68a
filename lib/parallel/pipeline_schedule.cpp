// Pipeline schedules (see pipeline_schedule.h).
#include "parallel/pipeline_schedule.h"

#include <algorithm>

#include "core/error.h"

namespace mt::parallel {
namespace {

struct ChunkPass {
  int micro_batch;
  int chunk;
};

void check_shape(const PipelineShape& shape, int rank) {
  const int p = shape.stages, v = shape.chunks, m = shape.micro_batches, g = shape.group_size;
  const auto fail = [&](const std::string& why) {
    throw Error("pipeline schedule p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m) +
                    " G=" + std::to_string(g),
                why);
  };
  if (p < 1 || v < 1 || m < 1) fail("stages, chunks and micro-batches must be at least 1");
  if (rank < 0 || rank >= p) fail("rank " + std::to_string(rank) + " outside the pipeline");
  if (v > 1 && p == 1) fail("virtual stages need more than one pipeline stage");
  if (v > 1 && (g < p || g > m)) fail("the micro-batch group must lie in [p, m]");
  if (v > 1 && m % g != 0 && m % g < p) fail("the last micro-batch group holds fewer than p micro-batches");
}

// Megatron's get_schedule_table: groups of G micro-batches, each run through chunk 0, then chunk
// 1, ...; the last group takes every remaining micro-batch. Without interleaving: 0..m-1 on chunk 0.
std::vector<ChunkPass> schedule_table(const PipelineShape& shape) {
  const int m = shape.micro_batches, v = shape.chunks;
  const int group = v > 1 ? shape.group_size : m;
  std::vector<ChunkPass> table;
  table.reserve(static_cast<size_t>(m) * v);
  for (int group_first = 0; group_first < m; group_first += group) {
    const int group_end = group_first + group >= m ? m : group_first + group;
    for (int chunk = 0; chunk < v; ++chunk) {
      for (int mb = group_first; mb < group_end; ++mb) table.push_back({mb, chunk});
    }
    if (group_end == m) break;
  }
  return table;
}

PipelineAction make_action(const PipelineShape& shape, int rank, PipelinePass pass, ChunkPass chunk_pass) {
  const int p = shape.stages;
  const int virtual_stage = chunk_pass.chunk * p + rank;
  const int last_virtual_stage = p * shape.chunks - 1;
  const int previous_rank = (rank + p - 1) % p, next_rank = (rank + 1) % p;
  PipelineAction action{pass, chunk_pass.micro_batch, chunk_pass.chunk, -1, -1};
  const bool starts_model = virtual_stage == 0, ends_model = virtual_stage == last_virtual_stage;
  if (pass == PipelinePass::forward) {
    if (!starts_model) action.recv_from = previous_rank;
    if (!ends_model) action.send_to = next_rank;
  } else {
    if (!ends_model) action.recv_from = next_rank;
    if (!starts_model) action.send_to = previous_rank;
  }
  return action;
}

}  // namespace

PipelineShape pipeline_shape(const ParallelConfig& config, int num_layers, int micro_batches, bool forward_only) {
  return {config.pipeline_model_parallel_size, config.virtual_pipeline_size(num_layers), micro_batches,
          config.microbatch_group_size(), forward_only};
}

int pipeline_warmup_passes(const PipelineShape& shape, int rank) {
  const int p = shape.stages, v = shape.chunks;
  const int total = shape.micro_batches * v;
  if (shape.forward_only) return total;
  const int warmup = v == 1 ? p - rank - 1 : 2 * (p - rank - 1) + (v - 1) * shape.group_size;
  return std::min(warmup, total);
}

std::vector<PipelineAction> pipeline_actions(const PipelineShape& shape, int rank) {
  check_shape(shape, rank);
  const std::vector<ChunkPass> table = schedule_table(shape);
  const int total = static_cast<int>(table.size());
  const int warmup = pipeline_warmup_passes(shape, rank);
  const auto forward = [&](int k) { return make_action(shape, rank, PipelinePass::forward, table[size_t(k)]); };
  // The k-th backward runs the k-th table entry's micro-batch through the mirrored chunk.
  const auto backward = [&](int k) {
    ChunkPass entry = table[size_t(k)];
    entry.chunk = shape.chunks - 1 - entry.chunk;
    return make_action(shape, rank, PipelinePass::backward, entry);
  };

  std::vector<PipelineAction> actions;
  actions.reserve(size_t(total) * 2);
  for (int k = 0; k < warmup; ++k) actions.push_back(forward(k));
  if (shape.forward_only) return actions;
  for (int k = 0; k < total - warmup; ++k) {
    actions.push_back(forward(k + warmup));
    actions.push_back(backward(k));
  }
  for (int k = std::max(total - warmup, 0); k < total; ++k) actions.push_back(backward(k));
  return actions;
}

namespace {

// The most forwards of the chunks `counts` accepts whose backward has not run yet, over `actions`.
template <typename Counts>
int most_in_flight(const std::vector<PipelineAction>& actions, Counts counts) {
  int held = 0, most = 0;
  for (const PipelineAction& action : actions) {
    if (!counts(action.chunk)) continue;
    held += action.pass == PipelinePass::forward ? 1 : -1;
    most = std::max(most, held);
  }
  return most;
}

}  // namespace

int pipeline_activation_slots(const std::vector<PipelineAction>& actions, int chunk) {
  return most_in_flight(actions, [chunk](int c) { return chunk < 0 || c == chunk; });
}

int pipeline_activation_slots(const std::vector<PipelineAction>& actions, const std::vector<int>& chunks) {
  return most_in_flight(actions, [&chunks](int c) { return std::find(chunks.begin(), chunks.end(), c) != chunks.end(); });
}

std::vector<ActivationSlotPool> pipeline_slot_pools(const std::vector<PipelineAction>& actions,
                                                    const std::vector<int64_t>& chunk_slot_floats) {
  const auto make_pool = [&](std::vector<int> chunks) {
    std::sort(chunks.begin(), chunks.end());
    ActivationSlotPool pool{chunks, pipeline_activation_slots(actions, chunks), 0};
    for (int c : chunks) pool.slot_floats = std::max(pool.slot_floats, chunk_slot_floats.at(static_cast<size_t>(c)));
    return pool;
  };
  std::vector<ActivationSlotPool> pools;
  for (size_t c = 0; c < chunk_slot_floats.size(); ++c) pools.push_back(make_pool({static_cast<int>(c)}));
  for (;;) {
    int64_t best_saving = -1;
    size_t best_a = 0, best_b = 0;
    ActivationSlotPool best;
    for (size_t a = 0; a < pools.size(); ++a) {
      for (size_t b = a + 1; b < pools.size(); ++b) {
        std::vector<int> chunks = pools[a].chunks;
        chunks.insert(chunks.end(), pools[b].chunks.begin(), pools[b].chunks.end());
        ActivationSlotPool merged = make_pool(chunks);
        const int64_t saving = pools[a].floats() + pools[b].floats() - merged.floats();
        if (saving > best_saving) {
          best_saving = saving;
          best_a = a;
          best_b = b;
          best = std::move(merged);
        }
      }
    }
    if (best_saving < 0) return pools;
    pools[best_a] = std::move(best);
    pools.erase(pools.begin() + static_cast<std::ptrdiff_t>(best_b));
  }
}

std::string to_string(const PipelineAction& action) {
  return (action.pass == PipelinePass::forward ? "F" : "B") + std::to_string(action.micro_batch) + "." +
         std::to_string(action.chunk);
}

}  // namespace mt::parallel
