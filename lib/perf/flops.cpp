// Model FLOPs (see flops.h).
#include "perf/flops.h"

namespace mt::perf {

const char* convention_name(FlopsConvention convention) {
  return convention == FlopsConvention::full_attention ? "6N+12LCT" : "6N+6LCT";
}

int64_t flops_parameter_count(const model::ModelConfig& config) {
  int64_t n = model::parameter_count(config, false);
  if (config.position_embedding == model::PositionEmbedding::learned_absolute) {
    n -= static_cast<int64_t>(config.max_position_embeddings) * config.hidden_size;
  }
  return n;
}

double flops_per_token(const model::ModelConfig& config, FlopsConvention convention) {
  const double attention = 12.0 * config.num_layers * config.hidden_size * config.seq_length;
  return 6.0 * static_cast<double>(flops_parameter_count(config)) +
         (convention == FlopsConvention::full_attention ? attention : attention / 2);
}

}  // namespace mt::perf
