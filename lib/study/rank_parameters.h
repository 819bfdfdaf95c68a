// What one rank holds of a model under a parallel layout, from perf/parameters.h's blocks: its
// parameter count, chunk by chunk as mt-train places the layers (parallel::pipeline_layers), and
// Megatron's vocabulary padding for reproducing its logs. For dense models a rank's count equals
// its layout table's parameter_elements(). Tested in tests/unit/study/test_rank_parameters.cpp.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "parallel/parallel_config.h"

namespace mt::study {

// Megatron's padded vocabulary: a multiple of make_vocab_size_divisible_by x TP (mt pads
// independently of TP; reproducing Megatron's logs needs its padding).
int64_t megatron_padded_vocab(const model::ModelConfig& model, int tensor_parallel);

// Parameters one rank of pipeline stage `stage` holds under `parallel` (a layout parallel::validate
// accepts): its chunks' layers as mt-train places them (parallel::pipeline_layers; TP-sharded
// blocks / TP, experts E/EP of them / expert-TP), the word (and position) embedding on the first
// stage, the final norm, output layer (or a copy of the tied embedding when the stage is not also
// the first) and MTP layers on the last.
int64_t rank_parameter_count(const model::ModelConfig& model, int64_t vocab, const parallel::ParallelConfig& parallel,
                             int stage);

}  // namespace mt::study
