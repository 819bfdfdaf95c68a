// Which transformer layers each pipeline stage builds: pipeline rank r's model chunk c (one chunk
// per rank without virtual stages) holds a contiguous range of global layers, assigned as
// Megatron's get_num_layers_to_build / get_transformer_layer_offset do. Even split: chunk c on
// rank r holds [c*L/v + r*L/(p*v), + L/(p*v)), so with 8 layers, 2 stages and 2 chunks rank 0
// holds [0,1] and [4,5], rank 1 [2,3] and [6,7]. Uneven first/last stages hold their own counts
// (divided among their chunks) and the middle stages split the rest. Tested in
// tests/unit/parallel/test_pipeline_layers.cpp.
#pragma once

#include <vector>

#include "parallel/parallel_config.h"

namespace mt::parallel {

struct LayerRange {
  int first = 0;  // global index of the first layer
  int count = 0;
  int end() const { return first + count; }
  bool operator==(const LayerRange&) const = default;
};

// Layers of pipeline rank `pp_rank`, model chunk `chunk` (0 <= chunk < virtual_pipeline_size),
// for a config validate() accepted with this layer count.
LayerRange pipeline_layers(const ParallelConfig& config, int num_layers, int pp_rank, int chunk);

// Every (pipeline rank, chunk): table[pp_rank][chunk].
std::vector<std::vector<LayerRange>> pipeline_layer_table(const ParallelConfig& config, int num_layers);

}  // namespace mt::parallel
