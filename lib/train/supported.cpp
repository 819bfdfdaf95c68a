// The one list of what mt-train does not run yet (see supported.h).
#include "train/supported.h"

#include <string>

#include "core/error.h"

namespace mt::train {
namespace {

// A setting the engine does not implement yet: whether the run asks for it, the flag (and value)
// that asks, and what mt-train does instead.
struct Unsupported {
  bool asked;
  std::string flag;
  std::string instead;
};

}  // namespace

void check_supported(const model::ModelConfig& model, const parallel::ParallelConfig& parallel,
                     backend::Device device) {
  // Every parallel layout parallel::validate accepts runs (expert parallelism included).
  const std::string accounted = "; mt-mfu and mt-memreport account for it";
  // A setting whose condition names `device` is refused on CUDA only (BERT and FSDP's grad sharding
  // have no CUDA path yet); the others on every backend.
  const bool moe = model.num_experts > 0;
  parallel::ParallelConfig fsdp = parallel;  // --use-custom-fsdp is --use-megatron-fsdp (validate() folds it later)
  fsdp.use_megatron_fsdp = parallel.use_megatron_fsdp || parallel.use_custom_fsdp;
  const Unsupported list[] = {
      {moe && model.moe_router_dtype == model::MoeRouterDtype::fp64, "--moe-router-dtype fp64",
       "mt-train routes in fp32"},
      {moe && model.moe_token_dispatcher_type == model::MoeDispatcher::flex, "--moe-token-dispatcher-type flex",
       "mt-train runs the all-to-all dispatcher"},
      {moe && model.moe_router_load_balancing_type == model::MoeLoadBalancing::sinkhorn,
       "--moe-router-load-balancing-type sinkhorn", "mt-train runs aux_loss, seq_aux_loss, global_aux_loss or none"},
      // Under PP the last stage keeps a copy of the word table for the MTP lookups (model/layers/mtp.h);
      // Megatron's last stage would also hold a position table that nothing keeps equal to the first's.
      {model.mtp_num_layers > 0 && parallel.pipeline_model_parallel_size > 1 &&
           model.position_embedding == model::PositionEmbedding::learned_absolute,
       "--mtp-num-layers with --pipeline-model-parallel-size " + std::to_string(parallel.pipeline_model_parallel_size) +
           " and --position-embedding-type learned_absolute",
       "the last stage keeps a copy of the word table for the MTP lookups, not of the learned position table: "
       "use rope, or PP 1" + accounted},
      // BERT (issue 25): the model (lib/model, checked against Megatron-Core's BertModel) trains on
      // BERT's masked samples on the CPU table under TP (with or without SP), DP and PP; the CUDA
      // attention is causal only; under CP the ring attention runs non-causal but the head does not.
      {model.bert && device == backend::Device::cuda, "--device cuda with BERT (--model " + model.name + ")",
       "the CUDA attention kernels are causal only and have no padding mask; BERT runs on the CPU table"},
      {model.bert && parallel.context_parallel_size > 1,
       "--context-parallel-size " + std::to_string(parallel.context_parallel_size) + " with BERT",
       "the ring attention runs BERT's padding mask, but the pooler, token types and per-micro-batch losses are "
       "not split over CP ranks yet (Megatron's pretrain_bert.py does not split BERT over CP either)"},
      // Megatron-FSDP (issue 25): the strategies mt's optimizer shards by (optim/distributed_optimizer.h).
      {fsdp.shards_grads() && device != backend::Device::cpu,
       "--use-megatron-fsdp with --data-parallel-sharding-strategy " + parallel.data_parallel_sharding_strategy +
           " on --device cuda",
       "FSDP's per-unit reduce-scatter and gathers, and the unit buffers' page pools mapped per unit, run on "
       "the CPU backend only; CUDA would need cuMemMap/cuMemUnmap"},
  };
  for (const Unsupported& setting : list) {
    if (setting.asked) throw UsageError(setting.flag, "not supported yet (" + setting.instead + ")");
  }
}

}  // namespace mt::train
