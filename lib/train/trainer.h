// The training loop of one rank, driving the model's stages (one per model chunk of the rank's
// layout) through its pipeline schedule (train/pipeline_engine.h; with one stage Megatron's
// forward_backward_no_pipelining) on the backend op table: Megatron's batch arithmetic (micro-batches accumulated into a
// global batch, samples chosen by MegatronPretrainingSampler so a consumed-samples count fixes
// them), loss normalisation by the unmasked tokens (per micro-batch, or per step with
// --calculate-per-token-loss), LR schedule in samples, global grad norm and clipping, AdamW,
// fp16 loss scaling with skipped steps, NaN checks (fatal by default, as Megatron's), periodic
// evaluation walking the validation split as Megatron's consumed_valid_samples does.
//
// On several ranks (the process groups of a rank grid) it runs tensor and sequence parallelism
// through the stages' ParallelContext over the TP group, and data parallelism over the DP x CP
// group: DP rank r takes micro-batches r, r + DP, ... of the step's global batch (the sampler's
// slice), so every layout sees the micro-batches one rank would and Megatron's per-micro-batch
// normalisation (1/DP folded into the loss scale) gives the one-rank loss and grads; with
// --calculate-per-token-loss the token count is summed over DP first. How grads, parameters and
// optimizer state are reduced and sharded is the optimizer's (optim/distributed_optimizer.h:
// grad buckets reduced per reduction group, overlapped with the last micro-batch's backward on
// request; AdamW over the rank's owned ranges; the parameter all-gather, overlapped with the next
// forward on request through the stages' before-forward signal; each tensor's primary copy
// counted once in the grad norm and written once to checkpoints). The trainer's step is a list of
// calls: stage the samples, begin the grad sync, run the pipeline, finish the grad sync, sum the
// tied embedding's grads, the loss, the grad norm, clipping and the optimizer's step. The loss,
// evaluation and the decision to stop (a signal on any rank) are agreed by all ranks.
// Pipeline parallelism: the rank's model chunks come from parallel/pipeline_layers.h and run the
// 1F1B or interleaved schedule with p2p over the PP group; grad sync is armed per chunk before its
// last backward; the tied word embedding's grads are summed between the first and the last stage;
// the loss and evaluation loss come from the last stage over the PP group.
// Context parallelism: the CP ranks of one DP rank read the same samples; each sample is read
// whole (document starts and positions computed on the whole sequence), then every per-token
// array is split so CP rank i keeps chunks i and 2 CP - 1 - i (parallel/context_parallel.h); the
// stages run ring attention over the CP group. Each micro-batch's loss is normalised by the whole
// sequence's unmasked tokens (the CP ranks sum their counts; Megatron divides by each CP rank's
// own count), grads are reduced over DP x CP, and the grad norm counts each tensor once over the
// DP x CP replicas. What mt-train does not run yet is refused by name first (train/supported.h).
// Multi-token prediction (issue 22): the last stage's MTP depths get their grad scales per
// micro-batch (train/mtp_step.h: lambda / D over each depth's rolled tokens, times the LM loss's
// scale) and add their loss sums to device doubles per micro-batch, read after the step for
// StepStats::mtp_losses (Megatron's "mtp_<k> loss").
// Mixture of experts (issue 22): the ParallelContext the stages share carries the rank grid's
// expert groups (ep, expert_tp, expert_tp_ep for the token dispatcher; tp_cp and tp_dp_cp for the
// router's aux-loss reductions); expert grads are reduced over expert-DP by the optimizer's
// reduction groups. Each micro-batch's MoE layers get the aux-loss grad factor d(objective) /
// d(aux value) equal to the scale the LM loss's backward gets (Megatron's
// main_loss_backward_scale: loss scale / (micro-batches x DP), or loss scale / step tokens with
// --calculate-per-token-loss), so the aux losses are averaged as the LM loss is. With
// --moe-router-enable-expert-bias the tokens per expert after dropping are counted by forward
// passes that build grads (not by recompute, not by evaluation), summed over TP x DP x CP once per
// global batch after the pipeline and before the optimizer's step, and every MoE layer's bias
// moves by rate * sign(mean - count) (the same on every rank); the bias is saved in checkpoints.
// The step's aux/z values and the tokens per expert come back in StepStats::moe.
// Every op runs on the op table it is given (backend/registry.h; a device's memory is never read
// on the host): the step's samples are read and split on the host, then copied into device rows
// the micro-batches point at; parameters are initialised on the host tensor by tensor and copied;
// the loss sums, token count and grad sum of squares are reduced in device memory and read with
// one copy and one synchronize per step; the step's time and its pipeline's compute and schedule
// times are measured with events on the stream (the step's end is its second host wait).
// Watching a step (issue 27): Megatron's timers (backend/step_timers.h) at their places in the
// step (forward-backward around staging and the schedule; all-grads-sync, layernorm- and
// embedding-grads-all-reduce; optimizer around the step's sums, the clip factor and the
// optimizer's step, with its parts inside; level 2 inside the schedule), the params norm (after
// the step, as Megatron's calc_params_l2_norm) and the zero count of the grads
// (count_zeros_fp32), each tensor's primary copy once: all read after the step's waits and
// gathered over the world in one all-gather, so they add no host wait.
// BERT (issue 25; train/bert_step.h): the data is BERT's masked samples (a SampleSource whose bert()
// is true fills the token types, key lengths and sentence-order targets, staged and uploaded with
// the other rows); each micro-batch adds its own LM and sop loss sums, the sop loss's grads take
// loss scale / (micro-batches x DP), and the logged lm loss and sop loss are pretrain_bert.py's
// means over the step's (or the evaluation's) micro-batches of each one's means.
// It reports through callbacks (lib never prints): step, eval and log-line observers the tool
// turns into records. Tested in tests/unit/train/test_trainer.cpp, tests/mpi/test_data_parallel.cpp
// and tests/mpi/test_context_parallel_training.cpp (every layout against one rank) and end to end
// by tests/tools/mt-train.bats and tests/tools/mt-train-mpi.bats.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <vector>

#include <nlohmann/json.hpp>

#include "backend/memory.h"
#include "backend/ops.h"
#include "backend/step_timers.h"
#include "backend/stream_timer.h"
#include "comm/communicator.h"
#include "core/dtype.h"
#include "data/sample_source.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/micro_batch.h"
#include "model/parallel_context.h"
#include "model/fp8_scaling.h"
#include "model/precision_gemm.h"
#include "model/recompute.h"
#include "model/stage.h"
#include "optim/adamw.h"
#include "optim/distributed_optimizer.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/process_groups.h"
#include "perf/flops.h"
#include "perf/memory.h"
#include "parallel/pipeline_schedule.h"
#include "train/exit_conditions.h"
#include "train/bert_step.h"
#include "train/pipeline_engine.h"

namespace mt::train {

// Megatron's --timing-log-option: the largest value over ranks, the smallest and the largest, or
// every rank's.
enum class TimingLogOption { max, minmax, all };

struct TrainConfig {
  int micro_batch_size = 1;
  int global_batch_size = 0;  // 0: micro_batch_size (one micro-batch per step)
  int64_t train_iters = 0;
  int64_t train_samples = 0;  // alternative to train_iters
  double lr = 1e-4;
  double min_lr = 0;
  optim::LrDecayStyle lr_decay_style = optim::LrDecayStyle::linear;
  int64_t lr_warmup_iters = 0;
  int64_t lr_warmup_samples = 0;
  double lr_warmup_fraction = -1;  // < 0: unset
  int64_t lr_decay_iters = 0;      // 0: the whole run
  int64_t lr_decay_samples = 0;
  optim::AdamWConfig adam;
  double clip_grad = 1.0;
  Precision precision = Precision::fp32;
  model::Fp8Config fp8;  // --fp8-format and its recipe (issue 23): the decoder layers' linears in FP8
  double loss_scale = 0;  // fp16: 0 = dynamic
  double initial_loss_scale = 4294967296.0;
  double min_loss_scale = 1.0;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool calculate_per_token_loss = false;
  // Megatron's default: a NaN/Inf loss or grad outside fp16 loss scaling stops the run (mt::Error
  // naming the iteration); false skips and counts such steps (nan_iters).
  bool check_for_nan_in_loss_and_grad = true;
  // mt's own (Megatron's scaler skips for ever): steps skipped in a row at a loss scale that
  // cannot go lower (fp32/bf16's 1, fp16's static one, or the dynamic one at min_loss_scale)
  // that stop the run; 0: never.
  int64_t max_consecutive_skipped_iters = 10;
  int log_interval = 100;
  bool log_throughput = false;  // Megatron's "throughput per GPU (TFLOP/s/GPU)" in the log line
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  uint64_t seed = 1234;
  model::RecomputeConfig recompute;
  double peak_flops_per_second = 0;  // for MFU; 0: not reported
  perf::FlopsConvention flops_convention = perf::FlopsConvention::megatron;  // --flops-convention
  // Watching a run (not part of the training config's JSON: they change no number): Megatron's
  // timers up to --timing-log-level (0: none; backend/step_timers.h), printed after the log line as
  // --timing-log-option says, with a world barrier before each level-1 timer starts unless
  // --no-barrier-with-level-1-timing; --log-params-norm and --log-num-zeros-in-grad.
  int timing_log_level = 0;
  TimingLogOption timing_log_option = TimingLogOption::minmax;
  bool barrier_with_level1_timing = true;
  bool log_params_norm = false;
  bool log_num_zeros_in_grad = false;
  // --moe-per-layer-logging: each MoE layer's aux and z-loss values in the step record and
  // TensorBoard (moe/<name>_layer_<i>), besides their mean over the layers.
  bool moe_per_layer_logging = false;
};

// TrainConfig as JSON with Megatron's argument names, and back (strict: unknown keys, wrong types
// and unknown names are mt::UsageError naming the key). Implemented in train_config.cpp.
nlohmann::ordered_json to_json(const TrainConfig& config);
TrainConfig train_config_from_json(const nlohmann::json& json);

// One pipeline stage's memory high-water marks by category, bytes (DESIGN.md section 4's memory
// records): those of the stage's rank with the largest peak (the lowest such world rank).
struct StageMemory {
  int stage = 0;
  int rank = 0;  // world rank
  int64_t weights = 0, grads = 0, optimizer = 0, activations = 0, comm_buffers = 0;
  int64_t peak = 0;  // the high-water mark of the sum over categories
};

// One of Megatron's timers over a step: its name ("forward-backward"), its level (1 or 2), and
// its elapsed milliseconds, the minimum and the maximum over the ranks that ran it, and every world
// rank's (0: that rank did not run it).
struct TimerReading {
  std::string name;
  int level = 1;
  double min_ms = 0;
  double max_ms = 0;
  std::vector<double> rank_ms;
};

// Mixture of experts (issue 22): one MoE layer's figures over a training step.
struct MoeLayerStats {
  int layer = 0;  // global decoder layer index, 0-based (Megatron's per-layer names count from 0 too)
  // Megatron's logged values of this layer's losses: the aux loss over its coefficient (aux /
  // --moe-aux-loss-coeff, about 1.0 when the routing is balanced) and the z-loss over its
  // coefficient (z / --moe-z-loss-coeff), each summed over the reduce group Megatron sums it over,
  // averaged over the step's micro-batches and over DP (not for global_aux_loss, whose value is
  // already the global batch's), as moe_logging.py does. 0 when the loss is off.
  double load_balancing_loss = 0;
  double z_loss = 0;
  // Tokens routed to each of the layer's E experts after capacity dropping, over the whole global
  // batch (summed over micro-batches and over TP x DP x CP, the expert-bias update's counts, so
  // every layout gives the same figures): the smallest, the largest and the coefficient of
  // variation (population standard deviation over the mean; 0 when no token was routed).
  int64_t tokens_min = 0;
  int64_t tokens_max = 0;
  double tokens_cv = 0;
};

// The MoE figures of a training step (StepStats::moe; absent for a dense model). Names are
// Megatron's: `balancing_name` is the log name of --moe-router-load-balancing-type
// ("load_balancing_loss" for aux_loss, "seq_load_balancing_loss" for seq_aux_loss,
// "global_load_balancing_loss" for global_aux_loss; "" for none), `balancing_loss` the layers'
// load_balancing_loss averaged over the MoE layers (of every pipeline stage), `z_loss` likewise
// (absent without --moe-z-loss-coeff). `layers`: every MoE layer of the model in layer order,
// gathered on every rank. The step record carries all of it (per-layer losses only with
// --moe-per-layer-logging, `per_layer_losses`; the token figures always); the Megatron log line
// carries " <balancing_name>: %.6E |" and " z_loss: %.6E |" after lm loss, as Megatron's loss
// loop; TensorBoard `<balancing_name>` and `z_loss` (and `moe/<name>_layer_<i>` per layer with
// --moe-per-layer-logging), as Megatron's track_moe_metrics.
struct MoeStepStats {
  std::string balancing_name;
  double balancing_loss = 0;
  std::optional<double> z_loss;
  bool per_layer_losses = false;
  std::vector<MoeLayerStats> layers;
};

struct StepStats {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  double lm_loss = 0;
  double grad_norm = 0;
  double lr = 0;
  double loss_scale = 1;
  int global_batch_size = 0;
  double step_ms = 0;
  double tokens_per_s = 0;
  double tflops_per_device = 0;
  double mfu = 0;  // 0 when no peak is known
  // The allocator's high-water marks by category (the GEMM weight copy counts under weights), the
  // largest over every rank.
  int64_t mem_weights_bytes = 0, mem_grads_bytes = 0, mem_optim_bytes = 0, mem_activations_bytes = 0;
  int64_t skipped_iters = 0;
  int64_t nan_iters = 0;
  bool skipped = false;
  // Over every rank: the largest memory high-water mark (all categories) and the lowest rank
  // holding it; the seconds this rank's communicators spent blocked during the step, and their
  // share of the step's time.
  int64_t mem_peak_bytes = 0;
  int mem_peak_rank = 0;
  double comm_wait_ms = 0;
  double comm_share = 0;
  std::vector<StageMemory> stage_memory;  // one per pipeline stage, gathered on every rank
  // The busiest rank's milliseconds in forward and backward compute during the step (pipeline
  // stages' passes, not their waits for inputs), and the longest rank's wall time running the
  // pipeline schedule: (pipeline_ms - compute_ms) / compute_ms is the pipeline bubble.
  double compute_ms = 0;
  double pipeline_ms = 0;
  // Megatron's timers at or below --timing-log-level (empty at level 0), in Megatron's order.
  std::vector<TimerReading> timers;
  // --log-params-norm and --log-num-zeros-in-grad: absent unless asked for.
  std::optional<double> params_norm;
  std::optional<int64_t> num_zeros;
  // Mixture-of-experts models only (see MoeStepStats).
  std::optional<MoeStepStats> moe;
  // Multi-token prediction (--mtp-num-layers D) only: per depth k Megatron's "mtp_<k+1> loss" (each
  // micro-batch's masked mean of the depth's loss, averaged over the step's micro-batches and DP;
  // train/mtp_step.h), D values, else empty.
  std::vector<double> mtp_losses;
  // BERT (issue 25; train/bert_step.h): lm_loss is pretrain_bert.py's, the mean over the step's
  // micro-batches of each one's masked-token mean; sop_loss its sentence-order loss (the binary
  // head only), Megatron's "sop loss".
  std::optional<double> sop_loss;
  // optim_grads_params only: this rank's unit gathers in the step, from start to done, and the
  // part of that it was blocked on them (optim/fsdp_params.h); 1 - wait / gather is the share
  // hidden behind compute.
  std::optional<double> fsdp_gather_ms, fsdp_gather_wait_ms;
  // optim_grads and optim_grads_params: the same for this rank's unit grad reduce-scatters
  // (optim/fsdp_grads.h; overlapped with --overlap-grad-reduce, else all wait).
  std::optional<double> fsdp_reduce_ms, fsdp_reduce_wait_ms;
};

struct EvalStats {
  int64_t iteration = 0;
  double lm_loss = 0;
  double ppl = 0;
  std::optional<double> sop_loss;  // BERT with the binary head (its PPL is exp of it, as Megatron's)
};

struct TrainObservers {
  std::function<void(const StepStats&)> on_step;
  std::function<void(const EvalStats&)> on_eval;
  std::function<void(const std::string&)> on_log_line;  // Megatron's human log line
  // The end of an iteration, after its evaluation: where Megatron saves (--save-interval).
  std::function<void(int64_t iteration)> on_iteration_end;
};

// The counters where they last started to follow the run's rules (issue 28 W10): from there on
// each iteration consumes --global-batch-size samples, and each one not skipped (skipped_iters,
// nan_iters) is one Adam step. A fresh run's is all zero; a resume keeps the checkpoint's unless
// it changes the global batch or starts Adam afresh (--no-load-optim), where it is the loaded
// counters (train/checkpointing.h).
struct CountersOrigin {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  int64_t optimizer_step = 0;
  int64_t skipped_or_nan_iters = 0;
};

// What a checkpoint keeps of a trainer besides its tensors (train/checkpointing.h).
struct TrainerState {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  int64_t consumed_valid_samples = 0;
  int64_t skipped_iters = 0;
  int64_t nan_iters = 0;
  optim::LossScalerState loss_scaler;
  CountersOrigin counters_origin;
};

// Refuses a training config whose values are out of range or inconsistent (mt::UsageError naming
// the flag); the Trainer and train_config_from_json call it.
void validate_train_config(const TrainConfig& config);

// ---- the LR schedule a config gives, and resuming it (issue 28 W3, W7) ----

// The run's length in samples: --train-samples, or --train-iters x the global batch (validated:
// validate_train_config refuses a product past 64 bits).
int64_t total_samples_of(const TrainConfig& config);
// Megatron's OptimizerParamScheduler of a validated config (global batch resolved), in samples:
// --lr, --min-lr, --lr-decay-style, warm-up and decay from the --lr-warmup-* and
// --lr-decay-iters/--lr-decay-samples flags (decay: the whole run when neither is given). Throws
// mt::UsageError naming --lr-warmup-* when the warm-up does not end before the decay does.
optim::LrSchedule lr_schedule_of(const TrainConfig& config);

// What perf::check_training_memory is given for a run of these configs on `ops`, `parallel` as
// parallel::validate left it (a global batch of 0 is micro-batch x DP): the Trainer's check
// before it allocates and mt-train --dry-run's are this one.
perf::MemoryOptions training_memory_options(const TrainConfig& config, const parallel::ParallelConfig& parallel,
                                            int ranks_per_node, const backend::Ops& ops);

class Trainer {
 public:
  // Validates the configs, refuses a plan larger than the memory available to this node's ranks
  // (perf::check_training_memory, before anything large exists), allocates everything and
  // initialises the parameters from the seed (keyed by global coordinates, so every layout starts
  // from the same model). Every op runs on `ops` (the run's table, backend/registry.h), which
  // outlives the trainer. `groups` (nullable: one rank) must outlive the trainer and have its data
  // communicators bound to `ops` (else mt::Error); its grid's config (as parallel::validate left
  // it) chooses the layout.
  Trainer(const model::ModelConfig& model, const TrainConfig& train, const data::SampleSource& data,
          const backend::Ops& ops, const parallel::ProcessGroups* groups = nullptr);
  ~Trainer();

  int64_t total_iterations() const { return total_iters_; }
  const model::ParamLayout& layout() const { return layout_; }
  // The FP8 scaling state (device memory of ops()); null without --fp8-format.
  const model::Fp8Scaling* fp8_scaling() const { return fp8_.get(); }
  model::Fp8Scaling* fp8_scaling() { return fp8_.get(); }  // checkpoints load its state
  // The rank's flat parameters (device memory of ops()), complete: waits for any parameter
  // all-gather still in flight.
  float* parameters();
  // The rank's flat grads (device memory of ops()): after a step, that step's reduced grads,
  // still scaled by the loss scale (tests' reference for the zero count).
  const float* gradients() const { return grads_.data(); }
  // Re-derives the GEMM weight copies after parameters were changed from outside (a load).
  void parameters_changed();
  // Live and peak bytes this rank holds, by category (the memory records' source).
  const backend::MemoryLedger& memory() const { return memory_; }
  int64_t consumed_samples() const { return consumed_samples_; }
  int64_t consumed_valid_samples() const { return consumed_valid_samples_; }
  int64_t iteration() const { return iteration_; }
  const model::ModelConfig& model_config() const { return model_config_; }
  // The op table every op runs on (parameters(), the moments and the grads are its memory).
  const backend::Ops& ops() const { return ops_; }
  const TrainConfig& config() const { return config_; }
  // Checkpoints (train/checkpointing.h): the counters and loss scaler, and the optimizer whose
  // moments and step they save and which says which runs of each tensor this rank writes and
  // reads. restore() continues from a saved state; the parameters and moments are loaded into
  // parameters() and optimizer() (then parameters_changed()). A save is collective over world().
  TrainerState checkpoint_state() const;
  void restore(const TrainerState& state);
  // --use-checkpoint-opt_param-scheduler: the run continues on `schedule` (the checkpoint's);
  // config() then says so in samples (--lr-warmup-samples, --lr-decay-samples), so the next
  // checkpoint holds the schedule the run used.
  void adopt_lr_schedule(const optim::LrSchedule& schedule);
  optim::DistributedOptimizer& optimizer() { return *optimizer_; }
  // With --moe-router-enable-expert-bias: the expert bias (E floats, device memory of ops()) of
  // every MoE layer this rank's stages hold, in layer order (empty otherwise). Checkpoints save
  // and load them as model/decoder.layers.<i>.mlp.router.expert_bias; the same on every rank of a
  // stage, so the stage's rank with TP, DP and CP coordinates 0 writes them
  // (writes_expert_biases) and every holder reads them.
  struct ExpertBias {
    int layer = 0;
    float* data = nullptr;
  };
  std::vector<ExpertBias> expert_biases() const;
  bool writes_expert_biases() const { return writes_expert_biases_; }
  // FP8 (issue 23): whether this rank writes the FP8 state of the experts it holds (expert-TP and
  // expert-DP coordinates 0: one rank per EP coordinate of the stage; the dense linears' state is
  // written by the writer of the biases).
  bool writes_expert_fp8_state() const { return writes_expert_fp8_state_; }
  comm::Communicator& world() const { return *world_; }

  // Runs the remaining iterations (with evaluations every eval_interval and at the end). Returns
  // early, between steps, when a stop was requested (core/stop_request.h) or, after an
  // iteration's on_iteration_end, when `exit` says so (train/exit_conditions.h): stopped() is
  // then true and stop_reason() says why, the same on every rank.
  void run(const TrainObservers& observers, const ExitConditions& exit = {});
  bool stopped() const { return stopped_; }
  StopReason stop_reason() const { return stop_reason_; }
  StepStats train_step();
  EvalStats evaluate();
  // Logits over the real vocabulary of training samples [first_sample, first_sample + count),
  // (count * seq_length, vocab_size), under the current parameters (one rank holding the whole
  // vocabulary).
  void forward_logits(int64_t first_sample, int count, float* logits);

 private:
  // The token counts of a training step's staged samples: per micro-batch (whole sequences: summed
  // over CP), this rank's total, and the step's denominator with --calculate-per-token-loss
  // (summed over DP x CP).
  struct StepTokens {
    std::vector<double> micro;
    double local = 0;
    double step = 0;
  };
  // The constructor's parts, in its order: this rank's groups (and coordinates) from `groups` or
  // groups of one; the batch shape against the data and DP (global batch set, recompute clamped);
  // the memory plan against what this node's ranks have; the layout and the pipeline schedules;
  // the parameters (initialised, GEMM copy made); the stages over their activation slot pools and
  // the pipeline engine; the data-parallel optimizer over the rank's groups; the loss scaler; the
  // LR schedule and the run's length; the data's splits against the run; the staging rows (and
  // the step timers and buffers --log-params-norm and --log-num-zeros-in-grad need).
  parallel::RankCoordinates connect_groups(const parallel::ProcessGroups* groups);
  void check_batch_shape();
  void check_fp8_supported() const;
  void reduce_fp8_amaxes(float* amaxes, int64_t count);
  void check_memory(int ranks_per_node) const;
  void build_layout_and_schedules(const parallel::RankCoordinates& coordinates);
  void build_parameters();
  void build_stages_and_pipeline();
  // The activation slot blocks of each chunk (and the pool each chunk takes them from).
  std::vector<std::vector<float*>> lay_out_activation_slots(const model::StageOptions& stage_options,
                                                            std::vector<int>& slot_pool_of_chunk);
  void build_optimizer(const parallel::ProcessGroups* groups);
  // The expert grid's groups for the MoE layers (ParallelContext::set_expert_groups).
  void connect_expert_groups(const parallel::ProcessGroups& groups);
  void build_loss_scaler();
  void build_lr_schedule();
  void check_data_covers_run() const;
  void allocate_staging();
  // A training step's parts (train_step): this rank's samples of the step staged; the pipeline
  // run over them (grads accumulated and reduced as it goes); the step's loss over every rank;
  // the global grad norm; whether the step is skipped (a NaN or Inf loss or grad: fatal unless
  // fp16's loss scaler handles it or the check is off); the timing and memory figures.
  StepTokens stage_training_samples();
  void run_training_pipeline(const StepTokens& tokens);
  // MoE: the aux-loss grad factor of the step's backward passes, given to every stage; after the
  // grad sync, the once-per-global-batch work (train/moe_step.h: counts, expert bias, figures).
  void set_aux_loss_grad_factor(const StepTokens& tokens);
  MoeStepStats finish_moe_layers(int micro_batches);
  // Multi-token prediction: each micro-batch's depth grad scales (from the staged loss mask) and
  // device loss sums set before the pipeline; after the step's wait, the logged losses.
  void prepare_mtp_losses(const StepTokens& tokens);
  std::vector<double> finish_mtp_losses(int micro_batches);
  // BERT (train/bert_step.h): the stages' sop grad factor and the micro-batches' loss sums zeroed
  // before the pipeline; after the step's wait, the logged lm and sop losses from the sums of
  // `micro_batches` micro-batches at `sums` (summed over PP and DP).
  void prepare_bert_losses(int micro_batches);
  BertLosses finish_bert_losses(const double* sums, int micro_batches);
  void check_bert_supported() const;
  // The step in Megatron's timed parts: forward-backward (staging and the schedule; returns the
  // step's token counts), the grads' reductions (all-grads-sync, layernorm-grads-all-reduce,
  // embedding-grads-all-reduce), and the optimizer (the step's sums over this rank's
  // `local_tokens` and their host wait, the skip decision, clipping, the zero count and the
  // optimizer's step; returns this rank's zero count, -1 when not counted).
  StepTokens run_forward_backward();
  void finalize_grads();
  int64_t update_parameters(StepStats& stats, double local_tokens);
  // The step's loss sum and token count (summed over PP, then DP x CP) and grad sum of squares
  // (this rank's share summed over the world), reduced in device memory on the stream and read
  // with one copy and one synchronize: the step's one host wait.
  struct StepSums {
    double loss = 0, tokens = 0, grad_sum_squares = 0;
  };
  StepSums reduce_step_sums(double local_tokens);
  bool skip_nonfinite(const StepStats& stats);
  void stop_on_repeated_skips();
  void record_step_figures(StepStats& stats, double wait_before);
  // --log-num-zeros-in-grad: the counted grads' copy queued before the step's one host wait, and
  // this rank's zeros in it after the wait. --log-params-norm: the counted parameters' sum of
  // squares queued after the optimizer's step, read after the step's end wait.
  void queue_grad_copy_for_zero_count();
  int64_t count_zero_grads() const;
  void queue_params_sum_squares();
  // The timers, the params norm and the zero count over every rank (one all-gather over the
  // world, after the step's end wait: no host wait of its own), into `stats`.
  void gather_observations(StepStats& stats, int64_t local_zeros);
  // Megatron's timer block for the log (Timers.log(normalizer=log_interval)): each rank's sums
  // since the last cleared block divided by --log-interval, the same figures as TensorBoard's
  // `<timer>-time`; the sums are cleared when `reset` (not at the first line: Megatron's reset=False).
  std::string timers_log_block(bool reset);
  // Stages this rank's context-parallel part of samples [first_sample, first_sample + count) of
  // `split` at sample slot `slot` of the staging buffers; returns the number of tokens the loss
  // mask counts in that part.
  double fill_samples(data::Split split, int64_t first_sample, int count, int slot);
  // Copies the first `samples` samples' staged rows to the device rows (host_to_device, on the
  // stream); wait_for_staging blocks until such a copy has read the host rows, before they are
  // refilled (a no-op once the step's synchronize has passed).
  void upload_staged(int samples);
  void wait_for_staging();
  // Micro-batch `count` samples from sample slot `slot` of the device rows, adding its loss sums
  // to `loss_sums` (two device doubles).
  // With BERT, `sop_sums` (two device doubles) takes the sop loss sums with the binary head.
  model::MicroBatch staged_batch(int count, int slot, double* loss_sums, double* sop_sums = nullptr) const;
  // The parameters from the seed: each tensor initialised on the host in one reused buffer, then
  // copied into the device parameters.
  void initialize_parameters();
  // Whether every rank stops before the next step: a stop request (signal) on any of them.
  bool agree_to_stop();
  // Whether every rank stops after this iteration by `exit` (the duration agreed over the world).
  bool agree_to_exit(const ExitConditions& exit);
  // Sums `values` over the data-parallel group (in place).
  void sum_over_data_parallel(double* values, int count);
  // Sums `values` over the pipeline group (in place): the loss from the last stage to all.
  void sum_over_pipeline(double* values, int count);
  // Sums the tied word embedding's grads between the first and the last pipeline stage (after
  // the DP reduction, over the parts this rank owns), so both copies take the same step.
  void sum_tied_embedding_grads();
  // Every rank's memory high-water marks (collective over the world): the step's maxima over
  // ranks (mem_*), the largest rank's total and each pipeline stage's most loaded rank.
  void gather_memory(StepStats& stats) const;
  // Seconds this rank's communicators have been blocked so far.
  double communicator_wait_seconds() const;

  model::ModelConfig model_config_;
  TrainConfig config_;
  parallel::ParallelConfig parallel_config_;
  // This rank's groups (groups of one without process groups): data groups (bound to ops_'s
  // stream) for tensors, control groups for host values (comm/communicator.h).
  std::unique_ptr<comm::Communicator> single_;       // a control group of one
  std::unique_ptr<comm::Communicator> single_data_;  // a data group of one
  comm::Communicator* world_ = nullptr;              // control: timings, memory, stop, checkpoints
  comm::Communicator* data_world_ = nullptr;         // data: the grad norm's sum of squares
  comm::Communicator* tensor_group_ = nullptr;       // data: TP/SP collectives
  comm::Communicator* data_parallel_group_ = nullptr;    // data, DP x CP: grads
  comm::Communicator* data_parallel_control_ = nullptr;  // control, DP x CP: loss and token sums
  comm::Communicator* context_group_ = nullptr;          // data: ring attention
  comm::Communicator* context_control_ = nullptr;        // control: token counts of whole sequences
  int data_parallel_coordinate_ = 0;  // the DP coordinate, without CP: the sampler's slice
  int data_parallel_size_ = 1;
  comm::Communicator* pipeline_group_ = nullptr;    // data: activations and their grads
  comm::Communicator* pipeline_control_ = nullptr;  // control: the loss from the last stage
  comm::Communicator* embedding_group_ = nullptr;   // data, first and last pipeline stage; null elsewhere
  model::ExpertGroups expert_groups_;               // data: the MoE layers' groups (none: one rank)
  comm::Communicator* expert_data_parallel_group_ = nullptr;  // data: expert grads (MoE models)
  const data::SampleSource& data_;
  const backend::Ops& ops_;
  backend::MemoryLedger memory_;
  model::ParamLayout layout_;
  backend::DeviceBuffer<float> params_;
  backend::DeviceBuffer<float> grads_;
  model::ParallelContext parallel_;
  std::unique_ptr<model::GemmWeights> gemm_weights_;
  std::unique_ptr<model::Fp8Scaling> fp8_;  // FP8 scaling state (null without --fp8-format)
  // The activation slots of this rank's chunks, pool by pool (parallel::pipeline_slot_pools):
  // each block holds one micro-batch of any chunk of its pool.
  std::vector<backend::DeviceBuffer<float>> slot_blocks_;
  std::vector<std::unique_ptr<model::Stage>> stages_;  // one per model chunk of this rank
  std::vector<parallel::PipelineAction> train_actions_, eval_actions_;  // this rank's schedules
  std::unique_ptr<PipelineEngine> pipeline_;
  std::unique_ptr<optim::DistributedOptimizer> optimizer_;
  optim::LossScaler scaler_;
  optim::LrSchedule schedule_;
  int64_t total_iters_ = 0;
  int64_t iteration_ = 0;
  int64_t consumed_samples_ = 0;
  int64_t consumed_valid_samples_ = 0;
  int64_t skipped_iters_ = 0;
  int64_t nan_iters_ = 0;
  CountersOrigin counters_origin_;
  int64_t skipped_in_a_row_at_min_scale_ = 0;  // not checkpointed: counts again after a resume
  bool stopped_ = false;
  StopReason stop_reason_ = StopReason::none;
  double flops_per_token_ = 0;
  std::unique_ptr<backend::StreamTimer> step_timer_;  // a step, from its start to its figures
  std::unique_ptr<backend::StepTimers> timers_;       // Megatron's timers; null at --timing-log-level 0
  // Every world rank's milliseconds per timer summed over the steps since the last log line
  // (rank-major), and the number of those steps.
  std::vector<double> interval_timer_ms_;
  int interval_steps_ = 0;
  std::vector<float> counted_grads_host_;               // --log-num-zeros-in-grad
  backend::DeviceBuffer<double> params_sum_squares_;    // --log-params-norm
  double params_sum_squares_host_ = 0;
  // Per-token arrays of `rows` tokens on the host.
  // BERT's token types (rows) and per-sample key lengths and sentence-order targets (rows / seq):
  // allocated for BERT only.
  struct TokenRows {
    std::vector<int32_t> tokens, labels, positions, doc_start;
    std::vector<float> loss_mask;
    std::vector<int64_t> row_ids;
    std::vector<int32_t> token_types, key_lengths, sentence_order;
    void allocate(int64_t rows, int64_t samples, bool bert);
  };
  // The same arrays in device memory (what a MicroBatch points at).
  struct DeviceRows {
    backend::DeviceBuffer<int32_t> tokens, labels, positions, doc_start;
    backend::DeviceBuffer<float> loss_mask;
    backend::DeviceBuffer<int64_t> row_ids;
    backend::DeviceBuffer<int32_t> token_types, key_lengths, sentence_order;
    void allocate(const backend::Ops& ops, int64_t rows, int64_t samples, bool bert);
  };
  // One whole sample as the data gives it, (seq_length), and this rank's staging of one step's
  // samples (global batch / DP), (samples * seq_length / CP) each: filled on the host, then
  // copied to the device rows.
  TokenRows sample_rows_, staged_;
  DeviceRows device_rows_;
  bool staging_in_flight_ = false;  // a copy from staged_ may not have run yet
  // The step's sums in device memory (loss, tokens, grad sum of squares), the host's copy of them
  // and the token count copied in; an evaluation's loss sums, a pair per evaluation step.
  backend::DeviceBuffer<double> step_sums_, eval_sums_;
  double step_sums_host_[3] = {0, 0, 0};
  double local_tokens_host_ = 0;
  std::vector<double> eval_sums_host_;
  bool writes_expert_biases_ = false;  // TP, DP and CP coordinates 0: this stage's copy of the biases
  bool writes_expert_fp8_state_ = false;  // expert-TP and expert-DP coordinates 0 (FP8 block)
  // Multi-token prediction: (loss, tokens) per micro-batch and depth in device memory, their host
  // copy, and the depths' grad scales per micro-batch (host).
  backend::DeviceBuffer<double> mtp_sums_;
  std::vector<double> mtp_sums_host_;
  std::vector<float> mtp_grad_scales_;
  // BERT: kBertSumsPerMicroBatch device doubles per micro-batch of a step, then per micro-batch of
  // every evaluation step (eval_iters x micro-batches), and their host copy.
  backend::DeviceBuffer<double> bert_sums_;
  std::vector<double> bert_sums_host_;
};

}  // namespace mt::train
