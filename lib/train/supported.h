// What mt-train does not run yet, in one list: the model features (multi-latent attention,
// multi-token prediction) and the mixture-of-experts settings (the fp64 router, the flex
// dispatcher, sinkhorn balancing), YaRN on CUDA, that mt-train's flag handling and the
// Trainer refuse by flag, before anything is built. Mixture of experts with expert parallelism
// runs on the CPU and on CUDA (kernels/cuda/moe_*.cu). mt-mfu and mt-memreport account for all of them and never
// call it. Megatron flags mt does not know at all are refused by name before parsing
// (tools/common/flags.h, refuse_unimplemented_megatron_flags). Tested in
// tests/unit/train/test_supported.cpp.
#pragma once

#include "backend/ops.h"
#include "model/config.h"
#include "parallel/parallel_config.h"

namespace mt::train {

// Throws mt::UsageError naming the flag (and value) of the first setting mt-train cannot run yet,
// "<flag>: not supported yet (<what mt-train runs instead>)", e.g. "--mtp-num-layers 1: not
// supported yet (mt-train has no multi-token prediction; ...)". `device`: the backend the run
// uses (--rope-type yarn is refused on CUDA, which has no YaRN kernel yet).
void check_supported(const model::ModelConfig& model, const parallel::ParallelConfig& parallel,
                     backend::Device device = backend::Device::cpu);

}  // namespace mt::train
