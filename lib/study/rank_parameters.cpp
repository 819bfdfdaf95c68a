// Parameters one rank holds and Megatron's vocabulary padding (see rank_parameters.h).
#include "study/rank_parameters.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline_layers.h"
#include "perf/parameters.h"

namespace mt::study {

using model::ModelConfig;

int64_t megatron_padded_vocab(const ModelConfig& m, int tensor_parallel) {
  const int64_t multiple = static_cast<int64_t>(m.make_vocab_size_divisible_by) * tensor_parallel;
  return (m.vocab_size + multiple - 1) / multiple * multiple;
}

int64_t rank_parameter_count(const ModelConfig& m, int64_t vocab, const parallel::ParallelConfig& parallel, int stage) {
  const int tp = parallel.tensor_model_parallel_size, ep = parallel.expert_model_parallel_size;
  const int etp = parallel.expert_tensor_parallel();
  if (tp < 1 || ep < 1 || etp < 1) throw UsageError("parallel sizes", "must be at least 1");
  if (m.num_experts > 0 && m.num_experts % ep != 0) {
    throw UsageError("--expert-model-parallel-size " + std::to_string(ep),
                     "does not divide --num-experts " + std::to_string(m.num_experts));
  }
  const int stages = parallel.pipeline_model_parallel_size;
  if (stage < 0 || stage >= stages) throw Error("pipeline stage " + std::to_string(stage), "outside the pipeline");
  const bool first_stage = stage == 0, last_stage = stage == stages - 1;
  std::vector<parallel::LayerRange> ranges = parallel::pipeline_layer_table(parallel, m.num_layers)[static_cast<size_t>(stage)];
  if (last_stage && m.mtp_num_layers > 0) ranges.push_back({m.num_layers, m.mtp_num_layers});
  auto on_rank = [&](int layer) {
    for (const parallel::LayerRange& range : ranges) {
      if (layer >= range.first && layer < range.end()) return true;
    }
    return false;
  };
  auto share = [&](const perf::ParamBlock& block) -> int64_t {
    switch (block.split) {
      case perf::ParamSplit::tensor_parallel: return block.elements / tp;
      case perf::ParamSplit::expert: return block.elements / (static_cast<int64_t>(ep) * etp);
      case perf::ParamSplit::replicated: return block.elements;
    }
    return 0;
  };
  int64_t count = 0;
  for (const perf::ParamBlock& block : perf::parameter_blocks(m, vocab)) {
    if (block.layer >= 0) {
      if (on_rank(block.layer)) count += share(block);
      continue;
    }
    switch (block.group) {
      case perf::ParamGroup::word_embeddings: {
        // The first stage embeds; the last holds a copy when it needs the embedding too (a tied
        // output layer, or the MTP modules' inputs) and is not also the first.
        const bool copy = last_stage && !first_stage && (!m.untie_embeddings_and_output_weights || m.mtp_num_layers > 0);
        if (first_stage || copy) count += share(block);
        break;
      }
      case perf::ParamGroup::position_embeddings:
      case perf::ParamGroup::token_type_embeddings:
        if (first_stage) count += share(block);
        break;
      default:  // the final norm, an untied output layer and BERT's heads
        if (last_stage) count += share(block);
        break;
    }
  }
  return count;
}

}  // namespace mt::study
