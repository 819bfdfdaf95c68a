// Megatron's TensorBoard scalars from the trainer's step and eval figures (training.py's
// training_log() and evaluate_and_print_results(), timers.py's write()), into an event file of
// io/tensorboard_events.h. mt-train makes one on the last rank, as Megatron does, and calls it
// from its step and eval observers.
//
// Every --tensorboard-log-interval iterations: `learning-rate`, `batch-size`, `lm loss`,
// `loss-scale` (unless --no-log-loss-scale-to-tensorboard), `grad-norm` (not on a skipped step),
// `num-zeros` and `params-norm` (when the step carries them), each also as `<name> vs samples`
// (stepped by consumed samples); for a MoE model Megatron's track_moe_metrics scalars after `lm
// loss`: `load_balancing_loss` (or `seq_`/`global_load_balancing_loss`), `z_loss` and with
// --moe-per-layer-logging `moe/<name>_layer_<i>` per MoE layer i (iteration steps only), then with
// --mtp-num-layers `mtp_<k> loss` per depth (track_mtp_metrics; iteration steps only); with --log-memory-to-tensorboard the writer rank's allocator
// figures `mem-reserved-bytes`, `mem-allocated-bytes`, `mem-max-allocated-bytes`,
// `mem-allocated-count`. Every --log-interval iterations and at the run's first (Megatron's log
// block), with --log-timers-to-tensorboard: `iteration-time` (seconds, the mean since the last
// write; not at the run's first iteration), `<timer>-time` (each rank's seconds summed since
// the last write, the largest of those sums over the ranks, divided by --log-interval: Megatron's
// timers.write(), from TimerReading::rank_ms) and, with
// --log-throughput, `throughput` (TFLOP/s per device over the same window). At each evaluation:
// `lm loss validation` and its `vs samples` pair, with --log-validation-ppl-to-tensorboard also
// `lm loss validation ppl` and its pair. Events wait in a queue of --tensorboard-queue-size and
// are written when it is full, by step() at each log-block iteration (the run's first and every
// --log-interval), at each flush() (mt-train: before each checkpoint save) and at the end.
//
// A resumed run writes a SessionLog START at the first iteration it runs: TensorBoard's reader
// then drops the steps from there on that earlier files hold (a killed run's steps past its
// checkpoint). That purge is by step for every tag, so it would also drop `vs samples` points the
// earlier runs wrote before the checkpoint (samples outnumber iterations); the resumed run copies
// those points from the earlier files after its START, and the directory reads as one straight run.
// Tested in tests/unit/train/test_tensorboard_log.cpp and tests/tools/tensorboard.bats.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/tensorboard_events.h"
#include "train/trainer.h"

namespace mt::train {

struct TensorBoardOptions {
  std::string dir;               // --tensorboard-dir
  int log_interval = 1;          // --tensorboard-log-interval
  int queue_size = 1000;         // --tensorboard-queue-size
  int timers_interval = 100;     // --log-interval: Megatron's log block, where timers are written
  bool log_timers = false;       // --log-timers-to-tensorboard
  bool log_memory = false;       // --log-memory-to-tensorboard
  bool log_validation_ppl = false;  // --log-validation-ppl-to-tensorboard
  bool log_loss_scale = true;    // --no-log-loss-scale-to-tensorboard turns it off
  bool log_throughput = false;   // --log-throughput
};

// Refuses intervals and queue sizes below 1, by flag.
void validate(const TensorBoardOptions& options);

// The writer rank's memory under the CUDA caching allocator's names (mt-train fills it from the
// rank's MemoryLedger; reserved is the CUDA pool's reserved bytes on CUDA, and equals allocated on
// the CPU, which keeps no cache).
struct AllocatorMemory {
  int64_t reserved_bytes = 0;
  int64_t allocated_bytes = 0;
  int64_t max_allocated_bytes = 0;
  int64_t allocated_count = 0;
};

class TensorBoardLog {
 public:
  // `memory` is read at each log interval when options.log_memory (it may be empty otherwise).
  TensorBoardLog(const TensorBoardOptions& options, std::function<AllocatorMemory()> memory);

  // A run resumed after `iteration` with `consumed_samples`: the START event and the copies
  // above. Called before the first step.
  void resume(int64_t iteration, int64_t consumed_samples);
  void step(const StepStats& stats);
  void eval(const EvalStats& stats);
  void flush() { writer_->flush(); }
  const std::string& path() const { return writer_->path(); }

 private:
  void write_step_scalars(const StepStats& s);
  void write_moe_scalars(const MoeStepStats& moe, int64_t iteration);
  void add_timing(const StepStats& s);
  void write_timing(const StepStats& s);
  void scalar(const std::string& tag, double value, int64_t step);
  void scalar_and_samples(const std::string& tag, double value, const StepStats& s);

  TensorBoardOptions options_;
  std::function<AllocatorMemory()> memory_;
  std::unique_ptr<io::EventFileWriter> writer_;
  bool first_step_ = true;
  int64_t consumed_samples_ = 0;  // the last step's, for the evaluation's `vs samples`
  // Megatron's log-block window (reset at each write except the run's first iteration's).
  int64_t window_steps_ = 0;
  double window_seconds_ = 0, window_teraflops_ = 0;  // teraflops: sum of TFLOP/s x seconds
  std::map<std::string, std::vector<double>> window_timer_rank_seconds_;  // timer -> per-rank sums
  std::vector<std::string> timer_order_;
};

}  // namespace mt::train
