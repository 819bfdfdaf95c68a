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

void check_supported(const model::ModelConfig& model, const parallel::ParallelConfig& parallel) {
  const std::string experts = "mt-train runs 1: MoE expert parallelism is not built yet";
  const std::string accounted = "; mt-mfu and mt-memreport account for it";
  const int expert_tp = parallel.expert_tensor_parallel_size.value_or(1);
  const Unsupported list[] = {
      {parallel.expert_model_parallel_size != 1,
       "--expert-model-parallel-size " + std::to_string(parallel.expert_model_parallel_size), experts},
      {expert_tp != 1, "--expert-tensor-parallel-size " + std::to_string(expert_tp), experts},
      {model.num_experts > 0, "--num-experts " + std::to_string(model.num_experts),
       "mt-train builds dense MLPs only" + accounted},
      {model.multi_latent_attention, "--multi-latent-attention",
       "mt-train builds grouped-query attention only" + accounted},
      {model.mtp_num_layers > 0, "--mtp-num-layers " + std::to_string(model.mtp_num_layers),
       "mt-train has no multi-token prediction" + accounted},
  };
  for (const Unsupported& setting : list) {
    if (setting.asked) throw UsageError(setting.flag, "not supported yet (" + setting.instead + ")");
  }
}

}  // namespace mt::train
