// HDF5 checkpoints of global tensors (DESIGN.md sec. 3-4): one float32 dataset per parameter at
// /model/<name> with its global shape, each rank writing its shard's hyperslab; root attributes
// mt_format = "mt-checkpoint", mt_format_version, iteration, consumed_samples and the configs as
// JSON. Written under a temporary name and renamed, so a failed write never replaces a good file.
// Tested in tests/unit/io/test_checkpoint.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "model/layout.h"

namespace mt::io {

struct CheckpointInfo {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  std::string config_json = "{}";
};

// Writes the parameters held in `params` (laid out by `layout`) to `path`.
void write_parameters(const std::string& path, const model::ParamLayout& layout, const float* params,
                      const CheckpointInfo& info);
// Reads this rank's shards of every parameter in `layout` from `path` into `params`; throws
// mt::Error naming the tensor when one is missing or has another global shape.
CheckpointInfo read_parameters(const std::string& path, const model::ParamLayout& layout, float* params);

}  // namespace mt::io
