// The parameter layout table: for a (model config, parallel config, rank) every parameter's
// global shape, the contiguous shard this rank holds (one range of one dimension), its offset
// in the rank's flat buffers, whether weight decay applies and what it is tied to. Parameters,
// fp32 main grads and optimizer states are flat buffers laid out from this one table, and
// mt-memreport reads the same table. Tested in tests/unit/model/test_layout.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "parallel/parallel_config.h"

namespace mt::model {

// How a tensor is split over tensor-parallel ranks.
enum class TensorSplit {
  replicated,      // norms, row-parallel biases, position embeddings
  column_parallel, // dim 0 (output features): q/k/v, fc1, vocab rows of the embedding/output
  row_parallel,    // dim 1 (input features): linear_proj, linear_fc2
};

struct ParamEntry {
  std::string name;                   // global name, global layer index inside
  std::vector<int64_t> global_shape;
  TensorSplit split = TensorSplit::replicated;
  int shard_dim = -1;                 // -1: the whole tensor
  int64_t shard_offset = 0;           // along shard_dim
  int64_t shard_extent = 0;           // along shard_dim
  std::vector<int64_t> local_shape;
  int64_t offset = 0;                 // elements into the flat buffers
  int64_t numel = 0;                  // local elements
  bool weight_decay = true;           // Megatron's default: no decay for biases and 1-D tensors
  int layer = -1;                     // global layer index, -1 outside the decoder layers
};

struct ParamLayout {
  std::vector<ParamEntry> entries;
  int64_t total_elements = 0;  // flat buffer length incl. alignment gaps
  int first_layer = 0, last_layer = 0;
  bool has_embedding = true, has_output = true;

  const ParamEntry& find(const std::string& name) const;  // throws mt::Error
  const ParamEntry* try_find(const std::string& name) const;
  int64_t parameter_elements() const;  // sum of numel (no gaps)
  // This rank's shard of a parameter as a tensor view into a flat fp32 buffer of this layout.
  Tensor view(const ParamEntry& entry, float* buffer) const;
};

// Layers [first_layer, last_layer) on this rank; the embedding on the first pipeline stage and
// the final norm + output layer on the last. Tensors in one fused group (q/k/v, gate/up) are
// adjacent in the buffer so one GEMM covers them; every group starts 64-byte aligned.
ParamLayout build_layout(const ModelConfig& model, const parallel::ParallelConfig& parallel,
                         const parallel::RankCoordinates& rank, int first_layer, int last_layer);
// The single-rank layout of the whole model.
ParamLayout build_layout(const ModelConfig& model);

// Names used by the layout (also the HDF5 dataset names of checkpoints).
std::string layer_prefix(int layer);  // "decoder.layers.<i>."

}  // namespace mt::model
