// Pipeline layer assignment (see pipeline_layers.h).
#include "parallel/pipeline_layers.h"

#include <string>

#include "core/error.h"

namespace mt::parallel {

LayerRange pipeline_layers(const ParallelConfig& config, int num_layers, int pp_rank, int chunk) {
  const int pp = config.pipeline_model_parallel_size;
  const int chunks = config.virtual_pipeline_size(num_layers);
  if (pp_rank < 0 || pp_rank >= pp || chunk < 0 || chunk >= chunks) {
    throw Error("pipeline_layers", "pipeline rank " + std::to_string(pp_rank) + " chunk " + std::to_string(chunk) +
                                       " outside " + std::to_string(pp) + " x " + std::to_string(chunks));
  }
  // Unset first/last stages count as middle stages, so one formula covers the even split too.
  const bool has_first = pp > 1 && config.decoder_first_pipeline_num_layers.has_value();
  const bool has_last = pp > 1 && config.decoder_last_pipeline_num_layers.has_value();
  const int first = has_first ? *config.decoder_first_pipeline_num_layers : 0;
  const int last = has_last ? *config.decoder_last_pipeline_num_layers : 0;
  const int middle_stages = pp - (has_first ? 1 : 0) - (has_last ? 1 : 0);
  const int middle_per_chunk = middle_stages > 0 ? (num_layers - first - last) / middle_stages / chunks : 0;
  // Layers of one chunk summed over every stage: chunk c of every rank starts after c of these.
  const int per_chunk_all_stages = num_layers / chunks;

  LayerRange range;
  if (has_first && pp_rank == 0) {
    range.count = first / chunks;
  } else if (has_last && pp_rank == pp - 1) {
    range.count = last / chunks;
  } else {
    range.count = middle_per_chunk;
  }
  const int middle_rank = pp_rank - (has_first ? 1 : 0);
  range.first = chunk * per_chunk_all_stages + (pp_rank == 0 ? 0 : first / chunks + middle_rank * middle_per_chunk);
  return range;
}

std::vector<std::vector<LayerRange>> pipeline_layer_table(const ParallelConfig& config, int num_layers) {
  const int chunks = config.virtual_pipeline_size(num_layers);
  std::vector<std::vector<LayerRange>> table(static_cast<size_t>(config.pipeline_model_parallel_size));
  for (int r = 0; r < config.pipeline_model_parallel_size; ++r) {
    for (int c = 0; c < chunks; ++c) table[static_cast<size_t>(r)].push_back(pipeline_layers(config, num_layers, r, c));
  }
  return table;
}

}  // namespace mt::parallel
