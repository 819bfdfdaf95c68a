// Model FLOPs per token and per step, with the convention named: "6N+12LCT" counts
// 6 * N (N = parameters without position embeddings, a tied output layer once) plus
// 12 * layers * hidden * seq for attention scores and values, attention not halved for
// causality; "6N+6LCT" halves it (causal). Tested in tests/unit/perf/test_flops.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace mt::perf {

enum class FlopsConvention { full_attention, causal_attention };

const char* convention_name(FlopsConvention convention);
double flops_per_token(const model::ModelConfig& config, FlopsConvention convention);
// Parameters counted by the convention's N.
int64_t flops_parameter_count(const model::ModelConfig& config);

}  // namespace mt::perf
