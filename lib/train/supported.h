// What mt-train does not run yet, in one list: the model features (multi-token prediction under
// context or pipeline parallelism and on CUDA; BERT: on CUDA, under CP and with SP), the
// mixture-of-experts settings (the fp64 router, the flex dispatcher, sinkhorn balancing)
// and Megatron-FSDP's grad and parameter sharding on CUDA, that mt-train's flag handling and the Trainer refuse by
// flag, before anything is built. Mixture of experts with expert parallelism runs on the CPU and on
// CUDA (kernels/cuda/moe_*.cu). mt-mfu and mt-memreport never call it: they account for all of
// these (BERT too, since issue 25). Megatron flags mt does not know at all are refused by name before parsing
// (tools/common/flags.h, refuse_unimplemented_megatron_flags). Tested in
// tests/unit/train/test_supported.cpp.
#pragma once

#include "backend/ops.h"
#include "model/config.h"
#include "parallel/parallel_config.h"

namespace mt::train {

// Throws mt::UsageError naming the flag (and value) of the first setting mt-train cannot run yet,
// "<flag>: not supported yet (<what mt-train runs instead>)", e.g. "--mtp-num-layers with
// --pipeline-model-parallel-size 2: not supported yet (...)". `device`: the backend the run uses
// (multi-token prediction and BERT are refused on CUDA).
void check_supported(const model::ModelConfig& model, const parallel::ParallelConfig& parallel,
                     backend::Device device = backend::Device::cpu);

}  // namespace mt::train
