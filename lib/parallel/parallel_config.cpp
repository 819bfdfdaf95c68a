// ParallelConfig as JSON (see parallel_config.h).
#include "parallel/parallel_config.h"

#include "core/json_fields.h"

namespace mt::parallel {
namespace {

// Every field once, with Megatron's argument name (core/json_fields.h).
template <typename Visit, typename Config>
void visit_fields(Visit& visit, Config& c) {
  visit("tensor_model_parallel_size", c.tensor_model_parallel_size);
  visit("pipeline_model_parallel_size", c.pipeline_model_parallel_size);
  visit("data_parallel_size", c.data_parallel_size);
  visit("context_parallel_size", c.context_parallel_size);
  visit("expert_model_parallel_size", c.expert_model_parallel_size);
  visit("sequence_parallel", c.sequence_parallel);
}

}  // namespace

nlohmann::ordered_json to_json(const ParallelConfig& c) {
  JsonWriter writer;
  visit_fields(writer, c);
  return writer.json();
}

ParallelConfig parallel_config_from_json(const nlohmann::json& json) {
  ParallelConfig c;
  JsonFields fields(json, "parallel config");
  visit_fields(fields, c);
  fields.finish();
  // Each degree checked through the same list: any integer field below 1 is refused.
  auto at_least_one = [&](const std::string& key, const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, int>) {
      if (value < 1) fields.fail(key, "must be at least 1 (got " + std::to_string(value) + ")");
    }
  };
  visit_fields(at_least_one, c);
  return c;
}

}  // namespace mt::parallel
