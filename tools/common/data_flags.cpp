// Megatron's data-path flags shared by mt-shard and mt-train (see data_flags.h).
#include "tools/common/data_flags.h"

namespace mt::tools {

void add_data_path_flags(CLI::App& app, DataPathFlags& flags, const std::string& group) {
  // CLI11 hides options of an empty group, so "" leaves the default group alone.
  auto grouped = [&](CLI::Option* option) { return group.empty() ? option : option->group(group); };
  auto list = [&](const char* flag, std::vector<std::string>& target, const char* help) {
    grouped(app.add_option(flag, target, help))
        ->expected(1, CLI::detail::expected_max_vector_size)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  list("--data-path", flags.data_path,
       "Token datasets: PREFIX (X.h5 or X.bin/.idx), PREFIX..., or a weighted blend W1 PREFIX1 W2 PREFIX2 ...");
  list("--train-data-path", flags.train_data_path, "Training split's datasets (instead of --data-path and --split)");
  list("--valid-data-path", flags.valid_data_path, "Validation split's datasets");
  list("--test-data-path", flags.test_data_path, "Test split's datasets");
  grouped(app.add_option("--split", flags.split, "Train/valid/test proportions of each --data-path dataset, in sequences"))
      ->capture_default_str();
}

void apply_data_path_flags(const DataPathFlags& flags, data::DataConfig& config) {
  if (!flags.data_path.empty()) config.blend = data::parse_blend(flags.data_path, "--data-path");
  const std::vector<std::string>* per_split[3] = {&flags.train_data_path, &flags.valid_data_path, &flags.test_data_path};
  const char* names[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
  for (size_t s = 0; s < 3; ++s) {
    if (!per_split[s]->empty()) config.blend_per_split[s] = data::parse_blend(*per_split[s], names[s]);
  }
  config.split = flags.split;
}

}  // namespace mt::tools
