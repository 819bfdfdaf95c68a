// A trainer's checkpoints (see checkpointing.h).
#include "train/checkpointing.h"

#include <algorithm>
#include <chrono>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mt::train {
namespace {

// Model fields that do not change a checkpoint's tensors or what they compute.
bool free_to_differ(const std::string& field) {
  return field == "name" || field == "seq_length" || field == "init_method_std" || field == "hidden_dropout" ||
         field == "attention_dropout";
}

// The box of a parameter's shard inside its global tensor.
io::Box shard_box(const model::ParamEntry& entry) {
  io::Box box;
  box.offset.assign(entry.global_shape.size(), 0);
  box.extent = entry.local_shape;
  if (entry.shard_dim >= 0) box.offset[static_cast<size_t>(entry.shard_dim)] = entry.shard_offset;
  return box;
}

// The boxes of the elements [begin, end) of a parameter's shard (flat, row-major), in global
// coordinates.
std::vector<io::Box> shard_run_boxes(const model::ParamEntry& entry, int64_t begin, int64_t end) {
  std::vector<io::Box> boxes = io::flat_run_boxes(entry.local_shape, begin, end);
  if (entry.shard_dim >= 0) {
    for (io::Box& box : boxes) box.offset[static_cast<size_t>(entry.shard_dim)] += entry.shard_offset;
  }
  return boxes;
}

// Calls visit(entry, boxes, state) for every run of a tensor inside the optimizer's ranges: the
// boxes of the run (global coordinates) and where its moments start in the optimizer's state.
void for_each_optimizer_run(const model::ParamLayout& layout, const optim::AdamW& optimizer,
                            const std::function<void(const model::ParamEntry&, const std::vector<io::Box>&, int64_t)>& visit) {
  int64_t state = 0;
  for (const model::FlatRange& range : optimizer.ranges()) {
    for (const model::ParamEntry& entry : layout.entries) {
      const int64_t begin = std::max(range.begin, entry.offset);
      const int64_t end = std::min(range.end, entry.offset + entry.numel);
      if (begin < end) {
        visit(entry, shard_run_boxes(entry, begin - entry.offset, end - entry.offset), state + (begin - range.begin));
      }
    }
    state += range.end - range.begin;
  }
}

void check_same_model(const io::CheckpointReader& checkpoint, const model::ModelConfig& model) {
  nlohmann::json saved;
  try {
    saved = nlohmann::json::parse(checkpoint.state().model_config);
  } catch (const nlohmann::json::exception&) {
    throw Error(checkpoint.path(), "attribute model_config is not JSON");
  }
  const nlohmann::json run = model::to_json(model);
  for (const auto& [field, value] : run.items()) {
    if (free_to_differ(field)) continue;
    if (!saved.contains(field)) throw Error(checkpoint.path(), "model_config has no field " + field);
    if (saved[field] != value) {
      throw Error(checkpoint.path(), "written for another model: " + field + " is " + saved[field].dump() +
                                         " there, " + value.dump() + " in this run");
    }
  }
}

std::string saved_precision(const io::CheckpointReader& checkpoint) {
  try {
    const nlohmann::json train = nlohmann::json::parse(checkpoint.state().train_config);
    return train.value("precision", "");
  } catch (const nlohmann::json::exception&) {
    throw Error(checkpoint.path(), "attribute train_config is not JSON");
  }
}

}  // namespace

SaveResult save_checkpoint_file(const std::string& path, Trainer& trainer, const SaveOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const model::ParamLayout& layout = trainer.layout();
  io::CheckpointWriter writer(path);
  // Every tensor's primary copy: the TP-replicated tensors and the tied embedding once.
  const float* params = trainer.parameters();
  for (const model::ParamEntry& entry : layout.entries) {
    if (entry.replica != 0) continue;
    writer.write_tensor("model/" + entry.name, entry.global_shape, {io::TensorSlice{shard_box(entry), params + entry.offset}});
  }
  optim::AdamW& optimizer = trainer.optimizer();
  if (options.optimizer) {
    const char* names[] = {"optimizer/exp_avg/", "optimizer/exp_avg_sq/"};
    const float* moments[] = {optimizer.exp_avg(), optimizer.exp_avg_sq()};
    for (int m = 0; m < 2; ++m) {
      // A tensor's slices may come from several ranges: collected per tensor, then written.
      std::vector<std::vector<io::TensorSlice>> slices(layout.entries.size());
      for_each_optimizer_run(layout, optimizer, [&](const model::ParamEntry& entry, const std::vector<io::Box>& boxes,
                                                    int64_t state) {
        if (entry.replica != 0) return;
        auto& tensor = slices[static_cast<size_t>(&entry - layout.entries.data())];
        for (const io::Box& box : boxes) {
          tensor.push_back(io::TensorSlice{box, moments[m] + state});
          state += box.elements();
        }
      });
      for (size_t e = 0; e < layout.entries.size(); ++e) {
        const model::ParamEntry& entry = layout.entries[e];
        if (entry.replica == 0) writer.write_tensor(names[m] + entry.name, entry.global_shape, slices[e]);
      }
    }
  }
  const TrainerState state = trainer.checkpoint_state();
  io::CheckpointState s;
  s.iteration = state.iteration;
  s.consumed_train_samples = state.consumed_samples;
  s.consumed_valid_samples = state.consumed_valid_samples;
  s.skipped_iters = state.skipped_iters;
  s.nan_iters = state.nan_iters;
  s.loss_scale = state.loss_scaler.scale;
  s.loss_scale_growth_tracker = state.loss_scaler.growth_tracker;
  s.loss_scale_hysteresis_tracker = state.loss_scaler.hysteresis_tracker;
  s.seed = trainer.config().seed;
  s.has_optimizer = options.optimizer;
  s.optimizer_step = optimizer.steps();
  s.resumable = options.resumable;
  s.model_config = model::to_json(trainer.model_config()).dump();
  s.parallel_config = options.parallel_config;
  s.train_config = to_json(trainer.config()).dump();
  SaveResult result;
  result.path = path;
  result.bytes = writer.commit(s);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

SaveResult save_checkpoint(const std::string& directory, Trainer& trainer, const SaveOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const std::string path = io::prepare_checkpoint_directory(directory, trainer.iteration());
  SaveResult result = save_checkpoint_file(path, trainer, options);
  io::write_tracker(directory, trainer.iteration());
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

void load_checkpoint(const io::CheckpointReader& checkpoint, Trainer& trainer, const LoadOptions& options) {
  const io::CheckpointState& saved = checkpoint.state();
  check_same_model(checkpoint, trainer.model_config());
  const bool optimizer_state = options.optimizer && !options.finetune;
  if (optimizer_state && !saved.has_optimizer) {
    throw Error(checkpoint.path(), "holds no optimizer state (saved with --no-save-optim or --save-final); load it with "
                                   "--no-load-optim or --finetune");
  }
  if (!options.finetune && !saved.resumable) {
    throw Error(checkpoint.path(), "holds parameters only (--save-init/--save-final); load it with --finetune");
  }
  const model::ParamLayout& layout = trainer.layout();
  // Every copy this rank holds (replicas too) reads its box of the global tensor.
  for (const model::ParamEntry& entry : layout.entries) {
    checkpoint.read_box("model/" + entry.name, entry.global_shape, shard_box(entry), trainer.parameters() + entry.offset);
  }
  optim::AdamW& optimizer = trainer.optimizer();
  if (optimizer_state) {
    const char* names[] = {"optimizer/exp_avg/", "optimizer/exp_avg_sq/"};
    float* moments[] = {optimizer.exp_avg(), optimizer.exp_avg_sq()};
    for (int m = 0; m < 2; ++m) {
      for_each_optimizer_run(layout, optimizer, [&](const model::ParamEntry& entry, const std::vector<io::Box>& boxes,
                                                    int64_t state) {
        for (const io::Box& box : boxes) {
          checkpoint.read_box(names[m] + entry.name, entry.global_shape, box, moments[m] + state);
          state += box.elements();
        }
      });
    }
    optimizer.set_steps(saved.optimizer_step);
  }
  trainer.parameters_changed();
  if (options.finetune) return;
  TrainerState state = trainer.checkpoint_state();  // the scaler stays this run's unless restored below
  state.iteration = saved.iteration;
  state.consumed_samples = saved.consumed_train_samples;
  state.consumed_valid_samples = saved.consumed_valid_samples;
  state.skipped_iters = saved.skipped_iters;
  state.nan_iters = saved.nan_iters;
  const TrainConfig& config = trainer.config();
  const bool dynamic_fp16 = config.precision == Precision::fp16 && config.loss_scale == 0;
  if (optimizer_state && dynamic_fp16 && saved_precision(checkpoint) == "fp16") {
    state.loss_scaler.scale = saved.loss_scale;
    state.loss_scaler.growth_tracker = static_cast<int>(saved.loss_scale_growth_tracker);
    state.loss_scaler.hysteresis_tracker = static_cast<int>(saved.loss_scale_hysteresis_tracker);
  }
  trainer.restore(state);
}

}  // namespace mt::train
