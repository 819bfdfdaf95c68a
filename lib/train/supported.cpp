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
  // Every setting below is refused on every backend (MoE runs on the CPU and CUDA tables), but YaRN,
  // which has no CUDA kernel yet.
  const bool moe = model.num_experts > 0;
  const Unsupported list[] = {
      {moe && model.moe_router_dtype == model::MoeRouterDtype::fp64, "--moe-router-dtype fp64",
       "mt-train routes in fp32"},
      {moe && model.moe_token_dispatcher_type == model::MoeDispatcher::flex, "--moe-token-dispatcher-type flex",
       "mt-train runs the all-to-all dispatcher"},
      {moe && model.moe_router_load_balancing_type == model::MoeLoadBalancing::sinkhorn,
       "--moe-router-load-balancing-type sinkhorn", "mt-train runs aux_loss, seq_aux_loss, global_aux_loss or none"},
      {device == backend::Device::cuda && model.rope_type == model::RopeType::yarn, "--rope-type yarn",
       "the CUDA backend has no YaRN kernel yet: run it on the CPU backend, or --rope-type rope"},
      {model.mtp_num_layers > 0, "--mtp-num-layers " + std::to_string(model.mtp_num_layers),
       "mt-train has no multi-token prediction" + accounted},
  };
  for (const Unsupported& setting : list) {
    if (setting.asked) throw UsageError(setting.flag, "not supported yet (" + setting.instead + ")");
  }
}

}  // namespace mt::train
