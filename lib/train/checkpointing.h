// A trainer's checkpoints (io/checkpoint.h holds the file format): which tensors a rank writes
// and reads, and the state around them. Each rank hands the writer the slices of every tensor it
// writes, and reads back the boxes of its own layout, so a checkpoint does not depend on the
// layout that wrote it. Who writes what is the optimizer's answer
// (optim::DistributedOptimizer::checkpoint_runs, parameters and moments alike): each tensor's
// primary copy (ParamEntry::primary: each TP rank its shard, TP rank 0 a TP-replicated tensor,
// the first stage the tied word embedding) once over the tensor's reduction group, whole from
// the group's rank 0 without sharding, or from every rank its slices (runs of flat elements that
// may cut tensors mid-row, written as boxes) with the distributed optimizer. Under pipeline
// parallelism each stage writes the layers it holds. Saving is collective over the trainer's
// world: every rank writes its slices into the one file through parallel HDF5, and every rank
// returns the same result or throws the same error. Tensors pass between the trainer's device
// memory and HDF5 through one reused host buffer, tensor by tensor (a device_to_host copy of a
// tensor's slices and one synchronize before the writer sees them; a box read on the host, then
// copied to the device): no device pointer reaches HDF5.
//
// Loading checks that the checkpoint is of the same model (the fields that make its tensors and
// its function: one line naming the field), then every tensor's presence, dtype and shape (one
// line naming the tensor). A resume first cross-checks the counters (issue 28 W10): the
// iteration against its iter_NNNNNNN directory (which the tracker named), no more skipped than
// run iterations, and from the counters' origin (TrainerState::counters_origin, saved as the root
// attribute counters_origin) --global-batch-size samples per iteration and one Adam step per
// iteration not skipped; each mismatch is one line naming the file, the attribute and both
// values. Parameters and the FP8 scaling state always load; the optimizer's moments and step with
// `optimizer`; the counters, consumed samples and the loss scaler (fp16 runs from fp16
// checkpoints, as Megatron keeps it in the optimizer state) unless `finetune` (Megatron's
// --finetune: iteration 0, no optimizer state). Tested in tests/unit/train/test_checkpointing.cpp,
// the FP8 state in tests/unit/train/test_fp8_state_checkpoint.cpp and tests/tools/mt-train-fp8.bats,
// and end to end by tests/tools/mt-train.bats and (several ranks) tests/tools/mt-train-mpi.bats;
// the save directory's lock and tracker rule in tests/unit/train/test_save_directory.cpp and
// tests/tools/overwrite.bats.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint.h"
#include "train/trainer.h"

namespace mt::train {

// The name in a checkpoint of an FP8 linear's scaling state (issue 23), "fp8/<weight name>", a
// (3, 2 + --fp8-amax-history-len) tensor: rows input, weight, output grad; columns scale,
// scale_inv, the amax history newest first (model::Fp8Scaling::state_pieces). Saved for every FP8
// linear of a run with --fp8-format, loaded as TE's set_extra_state does (load_checkpoint).
std::string fp8_state_tensor_name(const std::string& weight);
// Whether `tensor` is the FP8 state of a linear of `model`, of the shape it must have (mt-ckpt verify).
bool is_fp8_state_tensor(const model::ModelConfig& model, const io::TensorInfo& tensor);

// The name in a checkpoint of MoE layer `layer`'s expert bias, "model/decoder.layers.<i>.mlp.router.expert_bias":
// a persistent buffer (not a parameter), saved with the parameters as Megatron's state dict holds it.
std::string expert_bias_tensor_name(int layer);
// The buffers a checkpoint of `model` holds besides its parameters, as (name, global shape): with
// --moe-router-enable-expert-bias each MoE layer's expert bias (E), in layer order.
std::vector<std::pair<std::string, std::vector<int64_t>>> checkpoint_buffers(const model::ModelConfig& model);

struct SaveOptions {
  bool optimizer = true;   // write Adam's moments and step (false: --no-save-optim)
  bool resumable = true;   // false: --save-init/--save-final (parameters of a moment, not a run to resume)
  std::string parallel_config = "{}";  // JSON of the layout that writes it (provenance only)
};

struct SaveResult {
  std::string path;
  int64_t bytes = 0;
  double seconds = 0;
  int writers = 0;                  // ranks that wrote tensor values
  int64_t largest_share_bytes = 0;  // the most tensor bytes one rank wrote
};

// Writes `trainer`'s checkpoint to the file `path` (temporary name, fsync, rename). Collective over
// trainer.world(); the path and the directory matter on rank 0 only.
SaveResult save_checkpoint_file(const std::string& path, Trainer& trainer, const SaveOptions& options);
// Writes DIR/iter_NNNNNNN/checkpoint.h5 for the trainer's iteration, then points the tracker at it.
SaveResult save_checkpoint(const std::string& directory, Trainer& trainer, const SaveOptions& options);

// What a resume does with the checkpoint's LR schedule (Megatron's OptimizerParamScheduler
// load_state_dict, issue 28 W3). The schedule's fields, as Megatron's _check_and_set names them:
// learning rate (--lr), minimum learning rate (--min-lr), warmup iterations and total number of
// iterations (in samples: the --lr-warmup-* flags, and --lr-decay-iters/--lr-decay-samples or
// else --train-iters x --global-batch-size), learning rate decay style, start/end weight decay
// (--weight-decay). Megatron also checks its weight-decay increment's length (--train-iters x
// --global-batch-size); mt's weight decay is constant (--start/--end-weight-decay are refused), so
// a longer run whose LR decay the flags fix (--lr-decay-iters) resumes unchecked. `check` refuses a run whose values differ, naming every field with both
// values; `override_with_run` (--override-opt_param-scheduler) keeps the run's, `use_checkpoint`
// (--use-checkpoint-opt_param-scheduler) continues on the checkpoint's (a different
// --weight-decay is refused there: AdamW's decay is fixed when the trainer is built). Applies when
// the optimizer state loads (not --finetune, not --no-load-optim), after the tensors, as in Megatron.
enum class SchedulerOnLoad { check, override_with_run, use_checkpoint };

struct LoadOptions {
  bool optimizer = true;   // false: --no-load-optim
  bool finetune = false;   // --finetune: parameters only, the run starts at iteration 0
  SchedulerOnLoad scheduler = SchedulerOnLoad::check;
};

// ---- the save directory: one run at a time, a tracker that only moves forward ----

// A --save directory holds one run: DIR/mt-train.lock names the run that writes it (host, pid,
// the process's start in clock ticks since boot, the UTC start time), from before its first step
// to its exit. A lock whose host is this host and whose process is gone (or whose pid now belongs
// to a process started at another moment) is stale: it is taken over with a warning on stderr.
// Any other lock refuses the run, naming the holder and the file. Rank 0 takes it (the directory
// is shared). A SIGKILLed run leaves its lock behind, which the next run on that host takes over;
// on another host it is refused until removed (the message says so).
class SaveDirectoryLock {
 public:
  // Creates DIR if needed and takes its lock; throws mt::Error naming the holder when held.
  explicit SaveDirectoryLock(std::string directory);
  // Removes the lock when it is still this process's.
  ~SaveDirectoryLock();
  SaveDirectoryLock(const SaveDirectoryLock&) = delete;
  SaveDirectoryLock& operator=(const SaveDirectoryLock&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string identity_;  // what this process wrote into it
};

// DIR/mt-train.lock.
std::string save_lock_path(const std::string& directory);

// Refuses (mt::Error) a save of `iteration` into `directory` whose tracker names a later
// iteration: a tracker never moves backwards (the later checkpoint would stop being the latest
// and the earlier one of that run would be overwritten).
void check_tracker_moves_forward(const std::string& directory, int64_t iteration);

// True when `path` is an mt parameters file (--save-init/--save-final: not resumable) of the
// same model and seed: the earlier output of this run (a requeued job writes it again).
bool earlier_parameters_of_run(const std::string& path, const model::ModelConfig& model, uint64_t seed);

// Loads `checkpoint` into `trainer` (see the header comment). Throws mt::Error naming the file and
// the field or tensor.
void load_checkpoint(const io::CheckpointReader& checkpoint, Trainer& trainer, const LoadOptions& options);

}  // namespace mt::train
