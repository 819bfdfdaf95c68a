// What mt-train does not run yet, in one list: the model features (mixture of experts,
// multi-latent attention, multi-token prediction) and the parallel setting (expert parallelism)
// that mt-train's flag handling and the Trainer refuse by flag, before anything is built. mt-mfu and mt-memreport account for all of them and never call
// it. Megatron flags mt does not know at all are refused by name before parsing
// (tools/common/flags.h, refuse_unimplemented_megatron_flags). Tested in
// tests/unit/train/test_supported.cpp.
#pragma once

#include "model/config.h"
#include "parallel/parallel_config.h"

namespace mt::train {

// Throws mt::UsageError naming the flag (and value) of the first setting mt-train cannot run yet,
// "<flag>: not supported yet (<what mt-train runs instead>)", e.g. "--expert-model-parallel-size
// 8: not supported yet (mt-train runs 1: MoE expert parallelism is not built yet)".
void check_supported(const model::ModelConfig& model, const parallel::ParallelConfig& parallel);

}  // namespace mt::train
