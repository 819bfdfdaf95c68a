// mt-train: pre-train a GPT-2, LLaMA, MoE or BERT model with Megatron-LM's flag names. Step, memory (per
// pipeline stage), eval, ckpt and summary records on stdout (JSONL by default, led by the run
// record), Megatron's log line on stderr. With --dry-run --world-size N it only checks the run for
// N ranks in this one process (no MPI) and prints its plan. Tested by tests/tools/mt-train.bats,
// tests/tools/mt-train-plan.bats and tests/tools/conventions.bats.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend_info.h"
#include "backend/registry.h"
#include "comm/communicator.h"
#include "comm/mpi_runtime.h"
#include "comm/nccl_communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "core/stop_request.h"
#include "core/temporary_file.h"
#include "core/threads.h"
#include "data/bert_sample_source.h"
#include "data/gpt_dataset.h"
#include "data/sample_source.h"
#include "data/token_range.h"
#include "io/checkpoint.h"
#include "io/output_policy.h"
#include "model/config.h"
#include "parallel/process_groups.h"
#include "parallel/rank_grid.h"
#include "perf/flops.h"
#include "perf/memory.h"
#include "perf/peak.h"
#include "text/tokenizer.h"
#include "tools/common/bert_vocabulary.h"
#include "tools/common/flags.h"
#include "tools/common/peak_source.h"
#include "tools/common/signals.h"
#include "tools/common/tool_main.h"
#include "train/checkpointing.h"
#include "train/exit_conditions.h"
#include "train/supported.h"
#include "train/tensorboard_log.h"
#include "train/trainer.h"

namespace {

using mt::tools::Record;

// --dry-run and what it plans for: the world and the device whose memory each rank has
// (--peak-device is also a real run's MFU peak).
struct DryRunFlags {
  bool enabled = false;
  std::optional<int> world_size;
  std::string peak_device;
};

// Megatron's planned stops; the duration counts from `process_started`.
struct ExitFlags {
  std::optional<int64_t> interval;
  std::optional<double> duration_minutes;
  std::chrono::steady_clock::time_point process_started = std::chrono::steady_clock::now();
};

// Megatron's TensorBoard flags; the options take --log-interval and --log-throughput from the
// training flags once parsed (TensorBoardEvents).
struct TensorBoardFlags {
  mt::train::TensorBoardOptions options;  // dir empty: no event files
  bool no_log_loss_scale = false;
};

// Flags as Megatron spells them (tools/common/flags.h); unset model flags keep the preset's value.
struct TrainOptions {
  mt::tools::ModelFlags model;
  mt::parallel::ParallelConfig parallel;
  mt::tools::TrainingFlags training;
  mt::tools::DataPathFlags paths;
  mt::tools::MegatronCompatFlags compat;
  mt::tools::CheckpointFlags checkpoint;
  std::optional<std::string> device;  // --device: the backend (unset: cpu)
  std::optional<int> distributed_timeout_minutes;  // NCCL's bound (unset: Megatron's 10 minutes)
  bool mock_data = false;
  std::string byte_data;
  mt::data::LoaderOptions loader;
  // BERT's data (pretrain_bert.py's flags): the WordPiece vocabulary and the masking.
  struct Bert {
    mt::text::TokenizerOptions tokenizer;
    double mask_prob = 0.15;
    double short_seq_prob = 0.1;
  } bert;
  std::string save_init, save_final;
  bool force = false;  // --force: overwrite outputs that are not this run's (never an input)
  DryRunFlags dry;
  ExitFlags exit;
  TensorBoardFlags tensorboard;
  // Watching a run: Megatron's timers, params norm and zero count (define_watch_flags).
  struct Watch {
    int timing_log_level = 0;
    std::string timing_log_option = "minmax";
    bool no_barrier_with_level_1_timing = false;
    bool log_params_norm = false;
    bool log_num_zeros_in_grad = false;
  } watch;
};

// Megatron's timer and norm flags, in a group of their own.
void define_watch_flags(CLI::App& app, TrainOptions::Watch& w) {
  using mt::tools::add_flag;
  const char* g = "Timers and norms (Megatron's names; printed after the log line, in the step records)";
  add_flag(app,
           mt::tools::integer_flag("--timing-log-level",
                                   "Megatron's timers: 0 none, 1 the step's parts (forward-backward, the grad "
                                   "reductions, optimizer and its parts), 2 also batch-generator, forward-/backward-"
                                   "compute and the pipeline's sends and receives",
                                   mt::tools::between(0, 2)),
           w.timing_log_level)
      ->capture_default_str()
      ->group(g);
  add_flag(app,
           mt::tools::text_flag("--timing-log-option",
                                "How the timers print over ranks: max, minmax ((min, max) of the ranks that ran "
                                "it) or all (every rank)",
                                {"max", "minmax", "all"}),
           w.timing_log_option)
      ->capture_default_str()
      ->group(g);
  add_flag(app,
           mt::tools::toggle_flag("--no-barrier-with-level-1-timing",
                                  "Do not barrier the world before each level-1 timer starts"),
           w.no_barrier_with_level_1_timing)
      ->group(g);
  add_flag(app,
           mt::tools::toggle_flag("--log-params-norm",
                                  "Add the parameters' L2 norm after the step (' params norm:') to the log line and "
                                  "params_norm to the step records"),
           w.log_params_norm)
      ->group(g);
  add_flag(app,
           mt::tools::toggle_flag("--log-num-zeros-in-grad",
                                  "Add the count of zero grads (' num zeros:') to the log line and num_zeros to the "
                                  "step records"),
           w.log_num_zeros_in_grad)
      ->group(g);
}

void apply_watch_flags(const TrainOptions::Watch& w, mt::train::TrainConfig& config) {
  config.timing_log_level = w.timing_log_level;
  config.timing_log_option = w.timing_log_option == "max"   ? mt::train::TimingLogOption::max
                             : w.timing_log_option == "all" ? mt::train::TimingLogOption::all
                                                            : mt::train::TimingLogOption::minmax;
  config.barrier_with_level1_timing = !w.no_barrier_with_level_1_timing;
  config.log_params_norm = w.log_params_norm;
  config.log_num_zeros_in_grad = w.log_num_zeros_in_grad;
}

// The run record's model: the config's JSON plus what follows from it.
Record model_record(const mt::model::ModelConfig& c) {
  Record record = mt::model::to_json(c);
  record["padded_vocab_size"] = c.padded_vocab_size();
  record["parameters"] = mt::model::parameter_count(c);
  return record;
}

// Token datasets that record no vocabulary (.bin/.idx) are scanned (memory-mapped) so that a
// token outside the model's vocabulary is refused before training, not at its first sample.
void check_token_ids(const std::vector<mt::data::TokenDataset>& datasets, const mt::model::ModelConfig& model,
                     const std::string& vocabulary_source) {
  for (const auto& dataset : datasets) {
    if (dataset.vocab_size() >= 0) continue;  // HDF5: ids below the recorded vocabulary, checked on write
    const mt::data::TokenRange range = mt::data::token_range(dataset);
    if (range.empty()) continue;
    if (range.min < 0) {
      throw mt::Error(dataset.path(), "holds the negative token id " + std::to_string(range.min));
    }
    if (range.max >= model.vocab_size) {
      throw mt::UsageError("--vocab-size", "the largest token id in " + dataset.path() + " is " +
                                               std::to_string(range.max) + ", outside the vocabulary of " +
                                               std::to_string(model.vocab_size) + " (" + vocabulary_source +
                                               "); give --vocab-size " + std::to_string(range.max + 1) + " or more");
    }
  }
}

// The token data's config: the path flags, the sequence, the seed and Megatron's sample counts.
mt::data::DataConfig token_data_config(const TrainOptions& o, const mt::train::TrainConfig& config,
                                       const mt::model::ModelConfig& model) {
  mt::data::DataConfig data;
  mt::tools::apply_data_path_flags(o.paths, data);
  data.seq_length = model.seq_length;
  data.seed = static_cast<int64_t>(config.seed);
  const int64_t global = config.global_batch_size > 0 ? config.global_batch_size : config.micro_batch_size;
  data.num_samples = mt::data::megatron_num_samples(config.train_iters, config.train_samples, global,
                                                    config.eval_interval, config.eval_iters);
  mt::data::validate_data_config(data);
  return data;
}

// The model's vocabulary unless --vocab-size: the one the datasets record, else the preset's.
// Returns where it came from.
std::string take_vocabulary(const TrainOptions& o, const std::vector<mt::data::TokenDataset>& datasets,
                            mt::model::ModelConfig& model) {
  if (o.model.vocab_size) return "--vocab-size";
  if (const std::optional<int64_t> vocab = mt::tools::recorded_vocab_size(datasets)) {
    model.vocab_size = *vocab;
    return "recorded in the data";
  }
  if (o.model.preset.empty()) throw mt::UsageError("--vocab-size", "needed: the token datasets (.bin/.idx) record none");
  return "the preset " + o.model.preset + "'s";
}

// Token datasets through a sample index: found in the cache directory under the md5 of its
// parameters (stale ones refused), else built there. Under MPI rank 0 builds while the others
// wait (a barrier on the control world), then every rank reads it. Sets the model's vocabulary
// from the data unless --vocab-size.
std::unique_ptr<mt::data::SampleSource> open_token_data(const TrainOptions& o, const mt::train::TrainConfig& config,
                                                        mt::model::ModelConfig& model, mt::comm::Communicator& world) {
  const mt::data::DataConfig data = token_data_config(o, config, model);
  std::vector<mt::data::TokenDataset> datasets = mt::data::open_datasets(data);
  mt::data::loader_eod_id(datasets, o.loader);  // refuse EOD flags the data cannot serve before building
  const std::string vocabulary_source = take_vocabulary(o, datasets, model);
  model.validate();
  check_token_ids(datasets, model, vocabulary_source);
  const std::string directory =
      o.paths.data_cache_path.empty() ? mt::data::default_cache_dir(data) : o.paths.data_cache_path;
  const std::string path = (std::filesystem::path(directory) / mt::data::index_file_name(data)).string();
  const bool builder = world.rank() == 0;
  bool built = false;
  mt::data::SampleIndex index;
  if (builder) index = mt::data::load_or_build_index(data, datasets, path, true, &built);
  world.barrier();
  if (!builder) index = mt::data::load_or_build_index(data, datasets, path, false);
  mt::log::info(std::string("mt-train: ") + (built ? "built sample index " : "using sample index ") + path);
  return std::make_unique<mt::data::GptSampleSource>(std::move(datasets), std::move(index), path, model.seq_length,
                                                     o.loader);
}

// BERT's data flags (pretrain_bert.py's): the tokenizer whose vocabulary the masking reads, the
// mask and short-sequence probabilities (--bert-no-binary-head is a model flag).
void define_bert_data_flags(CLI::App& app, TrainOptions::Bert& b) {
  const char* g = "BERT data (--model tiny-bert, bert-345m: a pre-split sentence dataset through --data-path)";
  mt::tools::add_tokenizer_flags(app, b.tokenizer, false, g);
  static const mt::tools::FlagSpec mask_prob = mt::tools::real_flag(
      "--mask-prob", "Share of each sample's tokens masked (whole words, n-grams up to 3; default 0.15)",
      mt::tools::between(0, 1, true));
  static const mt::tools::FlagSpec short_seq_prob = mt::tools::real_flag(
      "--short-seq-prob", "Probability of a shorter target length per sample (default 0.1)", mt::tools::between(0, 1));
  mt::tools::add_flag(app, mask_prob, b.mask_prob)->group(g);
  mt::tools::add_flag(app, short_seq_prob, b.short_seq_prob)->group(g);
}

// BERT reads one sentence dataset through --data-path with a WordPiece vocabulary; its flags mean
// nothing for other models, and the GPT data flags nothing for BERT.
void check_bert_flags(mt::tools::ToolCli& cli, const TrainOptions& o, const mt::model::ModelConfig& model) {
  const char* bert_flags[] = {"--tokenizer-type", "--vocab-file",         "--merge-file", "--tokenizer-model",
                              "--tiktoken-pattern", "--tiktoken-num-special-tokens", "--mask-prob", "--short-seq-prob"};
  if (!model.bert) {
    for (const char* flag : bert_flags) {
      if (cli.app().count(flag) > 0) {
        throw mt::UsageError(flag, "is read for BERT models only (--model tiny-bert, bert-345m); a GPT run takes its "
                                   "vocabulary from the token data");
      }
    }
    return;
  }
  if (o.paths.data_path.size() != 1 || !o.paths.train_data_path.empty() || !o.paths.valid_data_path.empty() ||
      !o.paths.test_data_path.empty()) {
    throw mt::UsageError("--data-path", "BERT (model " + model.name +
                                            ") trains on one pre-split sentence dataset: give --data-path PREFIX "
                                            "(no blend, no per-split paths)");
  }
  if (!o.paths.data_cache_path.empty()) {
    throw mt::UsageError("--data-cache-path", "not used with BERT (its sample index is built in memory on open)");
  }
  if (o.loader.needs_eod()) {
    throw mt::UsageError("--eod-mask-loss/--reset-position-ids/--reset-attention-mask",
                         "are GPT's: BERT's samples are sentence runs with [CLS]/[SEP]");
  }
  if (o.bert.tokenizer.type.empty()) {
    throw mt::UsageError("--tokenizer-type", "needed with BERT: the WordPiece vocabulary (BertWordPieceLowerCase "
                                             "or BertWordPieceCase with --vocab-file vocab.txt)");
  }
}

// BERT's masked samples (data/bert_sample_source.h) over the --data-path sentence dataset, the
// vocabulary from the tokenizer; the model's vocabulary is the tokenizer's unless --vocab-size
// (Megatron's: padded from tokenizer.vocab_size). Every rank builds the index in memory.
std::unique_ptr<mt::data::SampleSource> open_bert_data(const TrainOptions& o, const mt::train::TrainConfig& config,
                                                       mt::model::ModelConfig& model) {
  const auto tokenizer = mt::text::Tokenizer::load(o.bert.tokenizer);
  mt::data::BertVocabulary vocabulary = mt::tools::bert_vocabulary(*tokenizer);
  if (!o.model.vocab_size) model.vocab_size = vocabulary.vocab_size();
  if (model.vocab_size < vocabulary.vocab_size()) {
    throw mt::UsageError("--vocab-size " + std::to_string(model.vocab_size),
                         "smaller than the WordPiece vocabulary of " + std::to_string(vocabulary.vocab_size()) +
                             " (the masking draws random ids from all of it)");
  }
  model.validate();
  mt::data::BertSourceConfig bert;
  bert.path = o.paths.data_path.front();
  bert.split = o.paths.split;
  bert.dataset.index.seq_length = model.seq_length;
  bert.dataset.index.seed = static_cast<int64_t>(config.seed);
  bert.dataset.index.short_seq_prob = o.bert.short_seq_prob;
  bert.dataset.index.binary_head = model.bert_binary_head;
  bert.dataset.mask_prob = o.bert.mask_prob;
  const int64_t global = config.global_batch_size > 0 ? config.global_batch_size : config.micro_batch_size;
  bert.num_samples = mt::data::megatron_num_samples(config.train_iters, config.train_samples, global,
                                                    config.eval_interval, config.eval_iters);
  return std::make_unique<mt::data::BertSampleSource>(bert, vocabulary);
}

// --dry-run with its world and device, and Megatron's planned stops (issue 24).
void define_plan_and_stop_flags(CLI::App& app, TrainOptions& o) {
  const auto* plan = "Dry run (plan without training: one process, no MPI)";
  mt::tools::add_flag(app, "--dry-run", o.dry.enabled)->group(plan);
  mt::tools::add_flag(app, "--world-size", o.dry.world_size,
                      "With --dry-run: the ranks the run would start (DP = world / (TP x CP x PP))")
      ->group(plan);
  mt::tools::add_flag(app, "--peak-device", o.dry.peak_device,
                      "A GPU of perf/peak.h's table (h100, h200, a100, a100-40gb, ...): with --dry-run each rank's "
                      "memory is checked against its memory (without it: this host's); also the dense peak MFU divides by")
      ->group(plan);
  const auto* stops = "Planned stops (Megatron's; exit 75 when --save saved a checkpoint, else 0)";
  mt::tools::add_flag(app, "--exit-interval", o.exit.interval)->group(stops);
  mt::tools::add_flag(app, "--exit-duration-in-mins", o.exit.duration_minutes)->group(stops);
}

// Megatron's TensorBoard flags (--log-throughput and --log-interval, which also gate scalars, are
// training flags).
void add_tensorboard_flags(CLI::App& app, TensorBoardFlags& flags) {
  mt::train::TensorBoardOptions& tb = flags.options;
  auto* g = "TensorBoard (event files written by the last rank, Megatron's scalar names)";
  // Each of the others means nothing without the directory: given alone it is a usage error.
  CLI::Option* dir =
      mt::tools::add_flag(app, mt::tools::text_flag("--tensorboard-dir", "Write TensorBoard event files to this directory"),
                          tb.dir)
          ->group(g);
  mt::tools::add_flag(app,
                      mt::tools::integer_flag("--tensorboard-log-interval",
                                              "Iterations between the step scalars (default 1)", mt::tools::at_least(1)),
                      tb.log_interval)
      ->group(g)
      ->needs(dir);
  mt::tools::add_flag(app,
                      mt::tools::integer_flag("--tensorboard-queue-size",
                                              "Events held in memory before a write (also written every --log-interval "
                                              "iteration, before each checkpoint save and at the end; default 1000)",
                                              mt::tools::at_least(1)),
                      tb.queue_size)
      ->group(g)
      ->needs(dir);
  mt::tools::add_flag(app,
                      mt::tools::toggle_flag("--log-timers-to-tensorboard",
                                             "Write iteration-time, <timer>-time and (with --log-throughput) "
                                             "throughput every --log-interval iterations"),
                      tb.log_timers)
      ->group(g)
      ->needs(dir);
  mt::tools::add_flag(app,
                      mt::tools::toggle_flag("--log-memory-to-tensorboard",
                                             "Write the writer rank's mem-reserved-bytes, mem-allocated-bytes, "
                                             "mem-max-allocated-bytes and mem-allocated-count (README: which figures)"),
                      tb.log_memory)
      ->group(g)
      ->needs(dir);
  mt::tools::add_flag(app,
                      mt::tools::toggle_flag("--log-validation-ppl-to-tensorboard",
                                             "Also write 'lm loss validation ppl' and its 'vs samples' pair"),
                      tb.log_validation_ppl)
      ->group(g)
      ->needs(dir);
  mt::tools::add_flag(app,
                      mt::tools::toggle_flag("--no-log-loss-scale-to-tensorboard", "Leave out loss-scale and its pair"),
                      flags.no_log_loss_scale)
      ->group(g)
      ->needs(dir);
}

void define(mt::tools::ToolCli& cli, TrainOptions& o) {
  CLI::App& app = cli.app();
  app.footer(
      "Data: token datasets (--data-path, or --train/valid/test-data-path) through a sample index found in, or\n"
      "built into, --data-cache-path under the md5 of its parameters (mt-shard build writes the same file); or\n"
      "--mock-data (Philox tokens) or --byte-data FILE (a text file's UTF-8 bytes as tokens, vocabulary 256).\n"
      "BERT (--model tiny-bert, bert-345m): --data-path one pre-split sentence dataset, --tokenizer-type\n"
      "BertWordPieceLowerCase|BertWordPieceCase --vocab-file vocab.txt; Megatron's masked samples and its lm and sop\n"
      "losses (README \"Training BERT\").\n"
      "Values outside a flag's range, and Megatron flags or values mt does not implement yet, are refused by name.\n"
      "Precision: --bf16 rounds every GEMM input to bf16 (fp32 accumulation, fp32 master weights, grads and Adam\n"
      "states); --fp16 rounds them to fp16 with a loss scaler. --fp8-format e4m3|hybrid runs the transformer\n"
      "layers' linears as FP8 GEMMs with delayed scaling (emulated on the CPU; README \"FP8 training\"), but not\n"
      "those --first-last-layers-bf16 names, nor with --no-fp8-wgrad the weight-gradient GEMMs; checkpoints\n"
      "save and --load restores its scales and amax histories. A NaN/Inf loss or grad outside fp16 loss scaling\n"
      "stops the run (as Megatron's default). Records: run, step, memory (one per pipeline stage, after the first\n"
      "step and at the end, before the final saves), eval, ckpt, summary (docs/DESIGN.md).\n"
      "Checkpoints: --save DIR writes DIR/iter_NNNNNNN/checkpoint.h5 (fp32 parameters, Adam moments and step,\n"
      "counters, loss scaler, configs) every --save-interval iterations and at the end, then points\n"
      "DIR/latest_checkpointed_iteration.txt at it; --load DIR resumes exactly from the iteration it names (with\n"
      "no tracker: a warning and a fresh start, or an error with --exit-on-missing-checkpoint). The checkpoint's\n"
      "--seed wins unless --no-load-rng. --save-init/--save-final write parameters only (not resumable).\n"
      "Under mpirun every rank writes the slices it holds into the one file through parallel HDF5 (with\n"
      "--use-distributed-optimizer each DP rank its shard of parameters and moments; the save record's\n"
      "writers and largest_share_bytes show the split), and each rank reads only its own slices.\n"
      "Signals: SIGTERM, SIGINT, SIGHUP or SIGUSR1 (always handled; Megatron's --exit-signal-handler is opt-in)\n"
      "finish the current step; with --save a checkpoint is saved and the exit code is 75 (resumable: sbatch\n"
      "requeues), without it --save-final is written and the exit code is 128 + the signal. A second signal\n"
      "exits at once, except during a save, which it lets finish (at most 120 s). A closed stdout (| head)\n"
      "stops the run the same way. Under mpirun send SIGUSR1: mpirun ends the job on SIGTERM or Ctrl-C\n"
      "(README \"Signals under mpirun\"). Every output path is checked writable before the first step.\n"
      "Parallelism: under mpirun -np N (or srun --mpi=pmix) the world is TP x CP x DP x PP (TP fastest),\n"
      "DP = N / (TP x CP x PP): the four dense dimensions combine freely. --tensor-model-parallel-size splits\n"
      "heads, query groups, ffn and vocabulary;\n"
      "--sequence-parallel adds the row split of norms and dropout; --use-distributed-optimizer shards Adam's\n"
      "states over DP (reduce-scatter grads, all-gather parameters); --overlap-grad-reduce reduces\n"
      "--ddp-bucket-size buckets during the last micro-batch's backward; --overlap-param-gather (with both)\n"
      "starts each bucket's parameter all-gather after the step and waits for it just before the next\n"
      "forward reads the bucket. --pipeline-model-parallel-size P\n"
      "splits the layers into P stages run by the 1F1B schedule (embedding on the first stage, head and loss on\n"
      "the last, a tied embedding's grads summed between them); --num-virtual-stages-per-pipeline-rank V or\n"
      "--num-layers-per-virtual-pipeline-stage K gives each rank V model chunks run by the interleaved schedule\n"
      "in groups of --microbatch-group-size-per-virtual-pipeline-stage G micro-batches (default P; P <= G <= m,\n"
      "m mod G = 0 or >= P, m = global batch / (micro-batch x DP)); --decoder-first-pipeline-num-layers and\n"
      "--decoder-last-pipeline-num-layers set the end stages' layers (the middle stages split the rest; with\n"
      "virtual stages only through --num-virtual-stages-per-pipeline-rank). --context-parallel-size C splits\n"
      "every sequence into 2C chunks, rank i of the CP group keeping chunks i and 2C-1-i (equal causal work);\n"
      "ring attention passes keys and values round the CP group (--seq-length divisible by 2C, and with\n"
      "--sequence-parallel seq-length / C by TP); grads are reduced over DP x CP (the distributed optimizer\n"
      "shards over DP x CP). The loss is normalised over the whole sequence's tokens (the CP ranks sum their\n"
      "counts; Megatron divides by each CP rank's own count). --global-batch-size must be a multiple of\n"
      "micro-batch x DP. Every layout trains one rank's loss and grad norm. Only rank 0 writes stdout; its step\n"
      "records carry compute_ms (the busiest rank's forward/backward compute) and pipeline_ms (the longest\n"
      "rank's schedule run): (pipeline_ms - compute_ms) / compute_ms is the pipeline bubble.\n"
      "Mixture of experts (on the CPU and on --device cuda): --num-experts E and Megatron's --moe-* flags\n"
      "(Model group). --expert-model-parallel-size EP and --expert-tensor-parallel-size ETP (default TP) fold\n"
      "into each pipeline stage's ranks (ETP x EP divides TP x CP x DP; TP > 1 needs --sequence-parallel);\n"
      "--moe-token-dispatcher-type allgather (Megatron's default) runs through the all-to-all dispatcher with\n"
      "identical numbers, flex is refused. Step records add load_balancing_loss (or seq_load_balancing_loss),\n"
      "z_loss (aux / coeff averaged over MoE layers, micro-batches and DP) and moe_layers (per MoE layer the\n"
      "tokens per expert after dropping: tokens_min, tokens_max, tokens_cv); the log line prints the losses.\n"
      "Multi-latent attention (DeepSeek-V2/V3): --multi-latent-attention with --q-lora-rank, --kv-lora-rank,\n"
      "--qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim and --qk-layernorm (Megatron's flags and defaults;\n"
      "Model group); needs rope, runs under TP, SP, PP, DP and CP (ring attention).\n"
      "YaRN (MLA only, as Megatron): --rope-type yarn with --rotary-scaling-factor, --mscale, --mscale-all-dim\n"
      "(Megatron's defaults 1, 1.0, 0.0) and --yarn-original-max-position-embeddings, --yarn-beta-fast,\n"
      "--yarn-beta-slow (4096, 32, 1: Megatron-Core 0.16.1's fixed values, under later Megatron's names); without\n"
      "--rope-type, --multi-latent-attention takes Megatron's MLA default yarn (at factor 1 it rotates as RoPE);\n"
      "MLA's softmax scale is (0.1 * mscale_all_dim * ln factor + 1)^2 / sqrt(qk head dim) with either rope type.\n"
      "--model deepseek-v3 applies YaRN (factor 40, 4096, 32, 1, mscale 1.0, mscale_all_dim 1.0; softmax scale\n"
      "0.1352) from the start, as Megatron's DeepSeek-V3 recipes train the 4K phase (DeepSeek's paper adds YaRN\n"
      "only to extend the context). YaRN runs on the CPU and CUDA backends.\n"
      "Multi-token prediction (DeepSeek-V3's, as Megatron-Core builds it): --mtp-num-layers D adds D depths after\n"
      "the decoder, each a layer like the last (MoE, MLA where the model has them) over its enorm'd rolled-token\n"
      "embedding and hnorm'd previous hidden state, with the shared embedding and output layer;\n"
      "--mtp-loss-scaling-factor L (default 0.1) adds L / D x the depths' losses to the LM loss's backward. Step\n"
      "records add mtp_<k>_loss, the log line ' mtp_<k> loss: ' (each micro-batch's masked mean over the rolled\n"
      "labels, averaged over micro-batches and DP, as Megatron logs it); checkpoints hold the depths under\n"
      "mtp.layers.<k>. and decoder.layers.<num-layers + k>.; runs under TP, SP, DP, CP (the rolls cross the CP\n"
      "ranks' chunks, as Megatron's roll_tensor) and PP (1F1B or interleaved: the depths on the last stage, which\n"
      "keeps a copy of the word table whose grads are summed with the first stage's, as Megatron-Core places\n"
      "them; not with learned absolute positions) and with --fp8-format (eh_proj and the depth's layer each in\n"
      "an fp8_autocast region of their own, as Megatron-Core's); runs on --device cuda too; mt-ckpt export refuses it.\n"
      "Dry run: --dry-run --world-size N [flags] checks the run in one process, without MPI (no mpirun, no Slurm\n"
      "allocation): every flag, the layout at N ranks (parallel::validate, as a run), the memory each rank needs\n"
      "(the check a run makes before it allocates) against --peak-device NAME's memory per GPU, or without it\n"
      "against this host's available memory shared by all N ranks (as mpirun -np N here would), and the data and\n"
      "--load paths that exist (the vocabulary they record; token ids are not scanned); a path that does not\n"
      "exist yet is a warning. --device cuda is planned with --peak-device (no GPU needed; the record's\n"
      "backend_built says whether this build has the CUDA backend), so full-scale recipes check their own\n"
      "command line. stdout:\n"
      "one dry_run record (layout, per-rank memory,\n"
      "verdict); exit 0 when it would run, 2 when not, with the reason on stderr. Nothing is written.\n"
      "Planned stops (Megatron's): --exit-interval N stops after an iteration that is a multiple of N,\n"
      "--exit-duration-in-mins M after the first iteration that ends more than M minutes (a fraction is\n"
      "accepted) after the process started (any rank's clock: the ranks agree); neither at the run's last\n"
      "iteration. With --save a checkpoint is saved (unless that iteration's --save-interval save was) and the\n"
      "exit code is 75 (resumable: mt-launch requeues, --load resumes); without --save the exit code is 0 (as\n"
      "Megatron's). The summary's stopped_by names the flag.");
  mt::tools::add_model_flags(app, o.model, "Model");
  mt::tools::add_parallel_flags(app, o.parallel, "Parallelism (TP, SP, CP, DP, PP, EP, expert TP)");
  mt::tools::add_training_flags(app, o.training, "Training");
  mt::tools::add_device_flag(app, o.device, "Device",
                             "The backend the run's ops run on: cpu, or cuda (one GPU per rank: the rank's index on its "
                             "node modulo the GPUs visible after CUDA_VISIBLE_DEVICES; MFU against that GPU's dense "
                             "peak unless --peak-tflops or --peak-device names one; refused with one line where this "
                             "build has no CUDA backend or no GPU is found)");
  mt::tools::add_flag(app,
                      mt::tools::integer_flag(
                          "--distributed-timeout-minutes",
                          "Bound on NCCL's waits (--device cuda; default 10, as Megatron's): joining a "
                          "communicator, and every queued collective or message; past it the communicator is "
                          "aborted and the run fails naming the operation. MPI's waits (the CPU) are not bounded",
                          mt::tools::between(1, 10080)),
                      o.distributed_timeout_minutes)
      ->group("Device");

  auto* d = "Data and output";
  mt::tools::add_flag(app, "--mock-data", o.mock_data)->group(d);
  mt::tools::add_flag(app, "--byte-data", o.byte_data)->group(d);
  mt::tools::add_data_path_flags(app, o.paths, d);
  mt::tools::add_flag(app, "--eod-mask-loss", o.loader.eod_mask_loss)->group(d);
  mt::tools::add_flag(app, "--reset-position-ids", o.loader.reset_position_ids)->group(d);
  mt::tools::add_flag(app, "--reset-attention-mask", o.loader.reset_attention_mask)->group(d);
  define_bert_data_flags(app, o.bert);
  mt::tools::add_flag(app, "--save-init", o.save_init)->group(d);
  mt::tools::add_flag(app, "--save-final", o.save_final)->group(d);
  mt::tools::add_flag(app, "--force", o.force)->group(d);
  mt::tools::add_checkpoint_flags(app, o.checkpoint, "Checkpoints");
  mt::tools::add_megatron_compat_flags(app, o.compat, "Megatron options with the value mt implements");
  define_plan_and_stop_flags(app, o);
  add_tensorboard_flags(app, o.tensorboard);
  define_watch_flags(app, o.watch);
  cli.add_output_format(app);
}

// Checkpoint flags that only mean something with another one.
void check_checkpoint_flags(const mt::tools::CheckpointFlags& ck) {
  if (ck.save_interval && ck.save.empty()) throw mt::UsageError("--save-interval", "needs --save DIR");
  if (ck.no_save_optim && ck.save.empty()) throw mt::UsageError("--no-save-optim", "needs --save DIR");
  const std::pair<bool, const char*> need_load[] = {{ck.finetune, "--finetune"},
                                                    {ck.no_load_optim, "--no-load-optim"},
                                                    {ck.no_load_rng, "--no-load-rng"},
                                                    {ck.exit_on_missing_checkpoint, "--exit-on-missing-checkpoint"},
                                                    {ck.override_opt_param_scheduler, "--override-opt_param-scheduler"},
                                                    {ck.use_checkpoint_opt_param_scheduler,
                                                     "--use-checkpoint-opt_param-scheduler"}};
  for (const auto& [given, flag] : need_load) {
    if (given && ck.load.empty()) throw mt::UsageError(flag, "needs --load DIR");
  }
  if (ck.override_opt_param_scheduler && ck.use_checkpoint_opt_param_scheduler) {
    throw mt::UsageError("--override-opt_param-scheduler", "conflicts with --use-checkpoint-opt_param-scheduler "
                                                           "(this run's schedule or the checkpoint's: give one)");
  }
}

// "2026-01-02T03:04:05.678Z": UTC, `seconds_before` the time point `at` (the ckpt records'
// started and ended).
std::string utc_time(std::chrono::system_clock::time_point at, double seconds_before) {
  const auto moment = at - std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(seconds_before));
  const auto milliseconds = std::chrono::duration_cast<std::chrono::milliseconds>(moment.time_since_epoch()).count();
  const std::time_t whole = static_cast<std::time_t>(milliseconds / 1000);
  std::tm utc{};
  gmtime_r(&whole, &utc);
  char buffer[40];
  const size_t n = std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(buffer + n, sizeof buffer - n, ".%03dZ", static_cast<int>(milliseconds % 1000));
  return buffer;
}

// The checkpoint --load names, in any of io::find_checkpoint's forms: a --save directory through
// its tracker, an iteration directory, or a checkpoint file (one that holds parameters only, an
// mt-ckpt import/convert OUT.h5 or a --save-final file, is refused later unless --finetune). No
// checkpoint at all is an error, unless --load is the --save directory: Megatron's "--save DIR
// --load DIR" resumes when DIR holds a checkpoint and starts from scratch, with a warning, when it
// does not (the first run of a job that requeues itself); --exit-on-missing-checkpoint makes that an
// error too.
std::unique_ptr<mt::io::CheckpointReader> open_resume_checkpoint(const mt::tools::CheckpointFlags& ck, bool rank0) {
  if (ck.load.empty()) return nullptr;
  if (const std::optional<std::string> file = mt::io::find_checkpoint(ck.load, "--load " + ck.load)) {
    return std::make_unique<mt::io::CheckpointReader>(*file);
  }
  const std::string missing = std::filesystem::exists(ck.load)
                                  ? "no checkpoint (" + mt::io::tracker_path(ck.load) + " does not exist)"
                                  : "no checkpoint (no such directory)";
  if (ck.exit_on_missing_checkpoint) throw mt::Error("--load " + ck.load, missing + " and --exit-on-missing-checkpoint");
  const auto normal = [](const std::string& path) {  // "DIR", "DIR/" and "./DIR" alike, existing or not
    std::filesystem::path p = std::filesystem::absolute(path).lexically_normal();
    if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
    return std::filesystem::weakly_canonical(p);
  };
  if (ck.save.empty() || normal(ck.load) != normal(ck.save)) {
    throw mt::Error("--load " + ck.load, missing + ": to start from scratch drop --load, or give the same directory "
                                                   "as --save (it resumes when a checkpoint is there)");
  }
  if (rank0) mt::log::warn("mt-train: --load " + ck.load + ": " + missing + "; starting from scratch");
  return nullptr;
}

// What mt-train runs, checked: the model, the parallel layout and the training settings.
struct RunPlan {
  mt::model::ModelConfig model;
  mt::parallel::ParallelConfig parallel;
  mt::train::TrainConfig config;
};

// Exactly one data source, and the data flags that only mean something with token datasets.
void check_data_flags(mt::tools::ToolCli& cli, const TrainOptions& o) {
  const bool token_data = o.paths.any();
  const int sources = (o.mock_data ? 1 : 0) + (o.byte_data.empty() ? 0 : 1) + (token_data ? 1 : 0);
  if (sources != 1) throw mt::UsageError("data", "give exactly one of --mock-data, --byte-data FILE, --data-path PREFIX");
  if (!token_data && o.loader.needs_eod()) {
    throw mt::UsageError("--eod-mask-loss/--reset-position-ids/--reset-attention-mask", "need token datasets (--data-path)");
  }
  if (!token_data && (cli.app().count("--split") > 0 || !o.paths.data_cache_path.empty())) {
    throw mt::UsageError("--split/--data-cache-path", "apply to token datasets (--data-path) only");
  }
  if (o.paths.data_path.empty() && cli.app().count("--split") > 0) {
    throw mt::UsageError("--split", "splits --data-path datasets; the per-split paths are used whole");
  }
}

// The flags turned into the run's configs for a world of `world_size` ranks, refused by name
// where mt-train cannot run them.
RunPlan plan_run(mt::tools::ToolCli& cli, TrainOptions& o, int world_size) {
  RunPlan plan;
  plan.config = mt::tools::training_config(o.training);
  mt::train::validate_train_config(plan.config);  // first: an iteration count past 64 bits is named (issue 28 W7)
  check_data_flags(cli, o);
  if (o.model.preset.empty() && !o.model.num_layers) {
    throw mt::UsageError("--model", "give a preset or --num-layers and friends");
  }
  if (!o.byte_data.empty() && !o.model.vocab_size && o.model.preset.empty()) o.model.vocab_size = 256;
  plan.model = mt::tools::model_config(o.model);
  check_bert_flags(cli, o, plan.model);
  mt::train::check_supported(plan.model, o.parallel, mt::tools::backend_device(o.device));  // before validation: what mt-train cannot run is named first
  if (o.mock_data && !o.model.vocab_size && plan.model.vocab_size <= 0) {
    throw mt::UsageError("--vocab-size", "needed with --mock-data");
  }
  plan.parallel = o.parallel;
  for (const std::string& warning :
       mt::tools::validate_parallel(plan.parallel, plan.model, plan.config, world_size)) {
    mt::log::warn("mt-train: " + warning);
  }
  check_checkpoint_flags(o.checkpoint);
  if (!o.checkpoint.ckpt_format.empty() && !plan.parallel.use_megatron_fsdp) {
    throw mt::UsageError("--ckpt-format " + o.checkpoint.ckpt_format,
                         "needs --use-megatron-fsdp (mt writes its own layout-independent checkpoints)");
  }
  return plan;
}

// Everything the run will write, checked before any work, so a finished run never loses its
// result (rank 0 checks: the paths are shared).
void check_outputs_writable(const TrainOptions& o, bool rank0) {
  if (!rank0) return;
  if (!o.save_init.empty()) mt::check_writable("--save-init", o.save_init);
  if (!o.save_final.empty()) mt::check_writable("--save-final", o.save_final);
  if (!o.checkpoint.save.empty()) {
    std::error_code ignored;
    std::filesystem::create_directories(o.checkpoint.save, ignored);  // as Megatron's os.makedirs; checked just below
    mt::check_writable("--save", mt::io::tracker_path(o.checkpoint.save));
  }
}

// The output policy (io/output_policy.h), on rank 0 once the seed is known: --save-init and
// --save-final are never an input of the run (its data, the checkpoint it resumes, the one its
// --save tracker names) and overwrite an existing file only when it is this run's earlier
// parameters file or with --force; a --save directory that holds another run's checkpoints is
// refused unless the run resumes from it or --force, and never takes a tracker backwards.
void check_output_policy(const TrainOptions& o, const RunPlan& plan, const mt::io::CheckpointReader* resume, bool rank0) {
  if (!rank0) return;
  std::vector<mt::io::NamedInput> inputs{{"--byte-data", o.byte_data}};
  for (const auto* list : {&o.paths.data_path, &o.paths.train_data_path, &o.paths.valid_data_path, &o.paths.test_data_path}) {
    for (const std::string& prefix : *list) {
      for (const char* suffix : {"", ".bin", ".idx", ".h5"}) inputs.push_back({"--data-path", prefix + suffix});
    }
  }
  if (resume) inputs.push_back({"--load", resume->path()});
  const std::string& save = o.checkpoint.save;
  const int64_t latest = save.empty() ? -1 : mt::io::read_tracker(save).value_or(-1);  // -1: no tracker
  if (latest >= 0) inputs.push_back({"--save (its latest checkpoint)", mt::io::checkpoint_path(save, latest)});
  for (const auto& [flag, path] : {std::pair{"--save-init", o.save_init}, std::pair{"--save-final", o.save_final}}) {
    if (path.empty()) continue;
    mt::io::refuse_input_as_output(flag, path, inputs);
    mt::io::refuse_existing_output(flag, path, mt::train::earlier_parameters_of_run(path, plan.model, plan.config.seed),
                                   o.force);
  }
  if (latest < 0) return;
  const bool resumes_it = resume && !o.checkpoint.finetune && mt::io::same_file(o.checkpoint.load, save);
  if (!resumes_it && !o.force) {
    throw mt::UsageError("--save " + save, "holds another run's checkpoints (its tracker names iteration " +
                                               std::to_string(latest) + ") and this run does not resume from it; "
                                               "give --load " + save + " to resume it, another --save, or --force");
  }
  mt::train::check_tracker_moves_forward(save, resume && !o.checkpoint.finetune ? resume->state().iteration : 0);
}

// Unless --no-load-rng (or --finetune) the resumed checkpoint's seed is the run's (the data is
// built from the seed).
void adopt_checkpoint_seed(mt::tools::ToolCli& cli, const mt::io::CheckpointReader& resume,
                           const mt::tools::CheckpointFlags& ck, mt::train::TrainConfig& config, bool rank0) {
  if (ck.no_load_rng || ck.finetune || resume.state().seed == config.seed) return;
  if (cli.app().count("--seed") > 0 && rank0) {
    mt::log::info("mt-train: --seed " + std::to_string(config.seed) + " replaced by the checkpoint's " +
                  std::to_string(resume.state().seed) + " (--no-load-rng keeps the command line's)");
  }
  config.seed = resume.state().seed;
}

// The run's samples: token datasets through their sample index, mock tokens or a byte file.
std::unique_ptr<mt::data::SampleSource> open_data(const TrainOptions& o, RunPlan& plan, mt::comm::Communicator& world) {
  if (plan.model.bert) return open_bert_data(o, plan.config, plan.model);
  if (o.paths.any()) return open_token_data(o, plan.config, plan.model, world);
  if (plan.model.vocab_size <= 0) throw mt::UsageError("--vocab-size", "must be at least 1");
  plan.model.validate();
  return o.mock_data ? mt::data::make_mock_data(plan.model.vocab_size, plan.model.seq_length, plan.config.seed)
                     : mt::data::make_byte_data(o.byte_data, plan.model.seq_length);
}

// How a resumed checkpoint was loaded: the slowest rank's seconds, the file's bytes, when.
struct LoadReport {
  double seconds = 0;
  int64_t bytes = 0;
  std::chrono::system_clock::time_point at;
};

LoadReport load_resume(const mt::io::CheckpointReader& resume, mt::train::Trainer& trainer,
                       const mt::tools::CheckpointFlags& ck, mt::comm::Communicator& world, bool rank0) {
  mt::train::LoadOptions load;
  load.optimizer = !ck.no_load_optim;
  load.finetune = ck.finetune;
  load.scheduler = ck.override_opt_param_scheduler         ? mt::train::SchedulerOnLoad::override_with_run
                   : ck.use_checkpoint_opt_param_scheduler ? mt::train::SchedulerOnLoad::use_checkpoint
                                                           : mt::train::SchedulerOnLoad::check;
  const auto start = std::chrono::steady_clock::now();
  mt::train::load_checkpoint(resume, trainer, load);
  LoadReport report;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  world.all_reduce(&report.seconds, 1, mt::DType::f64, mt::comm::ReduceOp::max);  // the slowest rank's
  report.bytes = static_cast<int64_t>(std::filesystem::file_size(resume.path()));
  report.at = std::chrono::system_clock::now();
  char took[96];
  std::snprintf(took, sizeof took, " in %.3f s (%.1f MB, %.0f MB/s)", report.seconds, report.bytes / 1e6,
                report.bytes / 1e6 / report.seconds);
  if (rank0) {
    mt::log::info("mt-train: loaded " + resume.path() + " (iteration " + std::to_string(resume.state().iteration) + ")" +
                  (ck.finetune ? ", parameters only (--finetune): starting at iteration 0" : "") + took);
  }
  return report;
}

Record load_record(const mt::io::CheckpointReader& resume, const mt::tools::CheckpointFlags& ck, const LoadReport& load) {
  return Record{{"record", "ckpt"},
                {"event", "load"},
                {"iteration", resume.state().iteration},
                {"path", resume.path()},
                {"what", ck.finetune ? "parameters" : ck.no_load_optim ? "parameters+state" : "resumable"},
                {"bytes", load.bytes},
                {"seconds", load.seconds},
                {"mb_per_s", load.seconds > 0 ? load.bytes / 1e6 / load.seconds : 0},
                {"started", utc_time(load.at, load.seconds)},
                {"ended", utc_time(load.at, 0)}};
}

// The backend a run's ops run on, and for --device cuda the GPU this rank uses.
struct RunDevice {
  const mt::backend::Ops* ops = nullptr;
  std::optional<mt::backend::GpuInfo> gpu;
};

// --device's table; for cuda first the rank's GPU, one per rank: its index among this node's ranks
// (comm/node_ranks.h) modulo the GPUs visible (after CUDA_VISIBLE_DEVICES). Refused by name where
// the build has no CUDA backend or the machine no GPU. Multi-rank CUDA runs reduce over the MPI
// data groups through host staging (parallel/process_groups.h) until NCCL's communicators are wired.
RunDevice open_device(const TrainOptions& o) {
  RunDevice device;
  if (mt::tools::backend_device(o.device) == mt::tools::BackendDevice::cpu) {
    device.ops = &mt::backend::cpu_ops();
    return device;
  }
  mt::backend::select_cuda_device(mt::comm::MpiRuntime::local_rank());
  device.ops = &mt::backend::backend_ops(mt::backend::Device::cuda);
  device.gpu = mt::backend::selected_gpu();
  return device;
}

// MFU's peak: --peak-tflops, else --peak-device, else on CUDA the dense peak of the GPU the run
// uses (model and form factor), on the CPU the FMA probe of the cores used (the GEMM rate an
// efficiency beside it).
mt::tools::PeakSource run_peak(const TrainOptions& o, mt::Precision precision, const RunDevice& device) {
  if (device.gpu) return mt::tools::resolve_gpu_peak(o.training.peak_tflops, o.dry.peak_device, precision, device.gpu->name);
  return mt::tools::resolve_peak(o.training.peak_tflops, o.dry.peak_device, precision, mt::default_threads_per_rank());
}

// The run record that leads stdout: the tool, the configs, the data and the peak MFU is against.
Record run_record(mt::tools::ToolCli& cli, const RunPlan& plan, const mt::data::SampleSource& data,
                  const mt::tools::PeakSource& peak, const RunDevice& device) {
  Record run = mt::tools::run_record(cli);
  run["device"] = mt::backend::device_name(device.ops->device);
  if (device.gpu) mt::tools::add_gpu_fields(run, *device.gpu);
  run["model"] = model_record(plan.model);
  run["parallel"] = mt::parallel::to_json(plan.parallel);
  run["train"] = mt::train::to_json(plan.config);
  run["seed"] = plan.config.seed;
  run["precision"] = mt::precision_name(plan.config.precision);
  run["data"] = data.describe();
  run["flops_convention"] = mt::perf::convention_name(plan.config.flops_convention);
  run["flops_per_token"] = mt::perf::flops_per_token(plan.model, plan.config.flops_convention);
  mt::tools::add_peak_fields(run, peak);
  return run;
}

// A resumed run already at (or past) its last iteration trains nothing, as Megatron's loop; it says
// so, and its summary's loss and step figures are null, not 0 (issue 28 W9).
void say_nothing_to_train(const mt::train::Trainer& trainer) {
  const mt::train::TrainConfig& c = trainer.config();
  const std::string length = c.train_iters > 0 ? "--train-iters " + std::to_string(c.train_iters)
                                               : "--train-samples " + std::to_string(c.train_samples);
  mt::log::warn("mt-train: nothing to train: the checkpoint is at iteration " + std::to_string(trainer.iteration()) +
                ", and " + length + " ends the run at iteration " + std::to_string(trainer.total_iterations()) +
                " (give a larger " + length.substr(0, length.find(' ')) + " to train on)");
}

// The run's saves: --save checkpoints (at --save-interval and at the end, unless the last step
// is saved already), --save-init and --save-final parameter files, each with its ckpt record and
// log line. Saving is collective; each rank writes the slices the optimizer gives it
// (train/checkpointing.h).
class RunCheckpoints {
 public:
  RunCheckpoints(mt::tools::RecordWriter& writer, mt::train::Trainer& trainer, const mt::tools::CheckpointFlags& ck,
                 const mt::parallel::ParallelConfig& parallel, bool rank0)
      : writer_(writer), trainer_(trainer), ck_(ck), rank0_(rank0), saved_iteration_(trainer.iteration()) {
    options_.parallel_config = mt::parallel::to_json(parallel).dump();
  }

  void save_parameters(const std::string& path) {
    const mt::tools::SaveInProgress saving;  // a later signal waits for it (issue 28 L7)
    mt::train::SaveOptions options = options_;
    options.optimizer = false;
    options.resumable = false;
    record(mt::train::save_checkpoint_file(path, trainer_, options), "parameters");
  }
  void save_checkpoint() {
    const mt::tools::SaveInProgress saving;  // a later signal waits for it (issue 28 L7)
    mt::train::SaveOptions options = options_;
    options.optimizer = !ck_.no_save_optim;
    if (rank0_) {
      mt::log::info("mt-train: saving a checkpoint of iteration " + std::to_string(trainer_.iteration()) + " to " + ck_.save);
    }
    record(mt::train::save_checkpoint(ck_.save, trainer_, options), ck_.no_save_optim ? "parameters+state" : "resumable");
    saved_iteration_ = trainer_.iteration();
  }
  bool saves_after(int64_t iteration) const {
    return !ck_.save.empty() && ck_.save_interval && iteration % *ck_.save_interval == 0;
  }
  void at_iteration_end(int64_t iteration) {
    if (saves_after(iteration)) save_checkpoint();
  }
  // At the end, and when a signal stopped the run: the checkpoint to resume from.
  void at_run_end() {
    if (!ck_.save.empty() && trainer_.iteration() != saved_iteration_) save_checkpoint();
  }

 private:
  void record(const mt::train::SaveResult& saved, const std::string& what) {
    const auto saved_at = std::chrono::system_clock::now();
    const double mb_per_s = saved.seconds > 0 ? saved.bytes / 1e6 / saved.seconds : 0;
    writer_.write(Record{{"record", "ckpt"}, {"event", "save"}, {"iteration", trainer_.iteration()},
                         {"path", saved.path}, {"what", what}, {"bytes", saved.bytes}, {"seconds", saved.seconds},
                         {"mb_per_s", mb_per_s}, {"writers", saved.writers}, {"largest_share_bytes", saved.largest_share_bytes},
                         {"started", utc_time(saved_at, saved.seconds)}, {"ended", utc_time(saved_at, 0)}});
    char line[160];
    std::snprintf(line, sizeof line, " (iteration %lld, %.1f MB in %.3f s, %.0f MB/s)",
                  static_cast<long long>(trainer_.iteration()), saved.bytes / 1e6, saved.seconds, mb_per_s);
    if (rank0_) mt::log::info("mt-train: saved " + saved.path + line);
  }

  mt::tools::RecordWriter& writer_;
  mt::train::Trainer& trainer_;
  const mt::tools::CheckpointFlags& ck_;
  const bool rank0_;
  mt::train::SaveOptions options_;
  int64_t saved_iteration_;  // a loaded checkpoint counts as saved
};

// The step, eval and memory records, and the figures the summary record takes from the steps.
class StepRecords {
 public:
  explicit StepRecords(mt::tools::RecordWriter& writer) : writer_(writer) {}

  void step(const mt::train::StepStats& s) {
    const bool first_step = step_ms_.empty();
    last_ = s;
    step_ms_.push_back(s.step_ms);
    activation_peak_ = std::max(activation_peak_, s.mem_activations_bytes);
    Record record{{"record", "step"},
                         {"iteration", s.iteration},
                         {"consumed_samples", s.consumed_samples},
                         {"lm_loss", s.lm_loss},
                         {"grad_norm", s.grad_norm},
                         {"lr", s.lr},
                         {"loss_scale", s.loss_scale},
                         {"global_batch_size", s.global_batch_size},
                         {"step_ms", s.step_ms},
                         {"tokens_per_s", s.tokens_per_s},
                         {"tflops_per_device", s.tflops_per_device},
                         {"mfu", s.mfu},
                         {"mem_weights_bytes", s.mem_weights_bytes},
                         {"mem_grads_bytes", s.mem_grads_bytes},
                         {"mem_optim_bytes", s.mem_optim_bytes},
                         {"mem_activations_bytes", s.mem_activations_bytes},
                         {"skipped_iters", s.skipped_iters},
                         {"nan_iters", s.nan_iters},
                         {"mem_peak_bytes", s.mem_peak_bytes},
                         {"mem_peak_rank", s.mem_peak_rank},
                         {"comm_wait_ms", s.comm_wait_ms},
                         {"comm_share", s.comm_share},
                         {"compute_ms", s.compute_ms},
                         {"pipeline_ms", s.pipeline_ms}};
    add_watched(record, s);
    if (s.moe) add_moe(record, *s.moe);
    // Megatron's "mtp_<k> loss" as mtp_<k>_loss, one per MTP depth.
    for (size_t k = 0; k < s.mtp_losses.size(); ++k) record["mtp_" + std::to_string(k + 1) + "_loss"] = s.mtp_losses[k];
    if (s.sop_loss) record["sop_loss"] = *s.sop_loss;  // BERT with the binary head
    if (s.fsdp_gather_ms) {  // FSDP optim_grads_params
      record["fsdp_gather_ms"] = *s.fsdp_gather_ms;
      record["fsdp_gather_wait_ms"] = *s.fsdp_gather_wait_ms;
    }
    if (s.fsdp_reduce_ms) {  // FSDP optim_grads and optim_grads_params
      record["fsdp_reduce_ms"] = *s.fsdp_reduce_ms;
      record["fsdp_reduce_wait_ms"] = *s.fsdp_reduce_wait_ms;
    }
    writer_.write(record);
    if (first_step) write_memory(s);
  }
  void eval(const mt::train::EvalStats& e) {
    Record record{{"record", "eval"}, {"iteration", e.iteration}, {"lm_loss", e.lm_loss}, {"ppl", e.ppl}};
    if (e.sop_loss) record["sop_loss"] = *e.sop_loss;  // BERT with the binary head
    writer_.write(record);
  }
  // --log-params-norm, --log-num-zeros-in-grad and the timers (--timing-log-level): params_norm,
  // num_zeros and timers {"forward-backward": {"min_ms", "max_ms", "rank_ms"}, ...} in Megatron's
  // order (rank_ms: every world rank's, 0 where it did not run).
  static void add_watched(Record& record, const mt::train::StepStats& s) {
    if (s.params_norm) record["params_norm"] = *s.params_norm;
    if (s.num_zeros) record["num_zeros"] = *s.num_zeros;
    if (s.timers.empty()) return;
    Record timers = Record::object();
    for (const mt::train::TimerReading& t : s.timers) {
      timers[t.name] = Record{{"min_ms", t.min_ms}, {"max_ms", t.max_ms}, {"rank_ms", t.rank_ms}};
    }
    record["timers"] = std::move(timers);
  }
  // A MoE model's figures under Megatron's names: the balancing loss ("load_balancing_loss",
  // "seq_load_balancing_loss" or "global_load_balancing_loss": aux / coeff, the mean over MoE
  // layers) and "z_loss" when on, and "moe_layers": per MoE layer {"layer", "tokens_min",
  // "tokens_max", "tokens_cv"} (tokens per expert after dropping over the global batch), with its
  // losses under the same names with --moe-per-layer-logging.
  static void add_moe(Record& record, const mt::train::MoeStepStats& moe) {
    if (!moe.balancing_name.empty()) record[moe.balancing_name] = moe.balancing_loss;
    if (moe.z_loss) record["z_loss"] = *moe.z_loss;
    Record layers = Record::array();
    for (const mt::train::MoeLayerStats& l : moe.layers) {
      Record layer{{"layer", l.layer}, {"tokens_min", l.tokens_min}, {"tokens_max", l.tokens_max},
                   {"tokens_cv", l.tokens_cv}};
      if (moe.per_layer_losses && !moe.balancing_name.empty()) layer[moe.balancing_name] = l.load_balancing_loss;
      if (moe.per_layer_losses && moe.z_loss) layer["z_loss"] = l.z_loss;
      layers.push_back(std::move(layer));
    }
    record["moe_layers"] = std::move(layers);
  }
  // The run's high-water marks per stage, before the saves at the end.
  void at_run_end() { write_memory(last_); }

  // The summary: the last step's loss and counters, the median step after the first, the
  // activation peak, and what stopped the run early (a signal's or a flag's name; null: none).
  // With no step run (a finished run resumed, an early stop) the loss and step figures are null.
  void summary(const mt::train::Trainer& trainer, const RunPlan& plan, int world_size, const Record& stopped_by) {
    std::vector<double> steady(step_ms_.begin() + (step_ms_.size() > 1 ? 1 : 0), step_ms_.end());
    std::sort(steady.begin(), steady.end());
    const double median_ms = steady.empty() ? 0 : steady[steady.size() / 2];
    const double tokens_per_step = static_cast<double>(last_.global_batch_size) * plan.model.seq_length;
    const double flops_per_token = mt::perf::flops_per_token(plan.model, plan.config.flops_convention);
    Record summary{
        {"record", "summary"},
        {"iterations", trainer.iteration()},
        {"consumed_samples", trainer.consumed_samples()},
        {"lm_loss", last_.lm_loss},
        {"median_step_ms", median_ms},
        {"tokens_per_s", median_ms > 0 ? tokens_per_step / (median_ms / 1e3) : 0},
        {"tflops_per_device", median_ms > 0 ? flops_per_token * tokens_per_step / (median_ms / 1e3) / 1e12 / world_size : 0},
        {"mem_activations_peak_bytes", activation_peak_},
        {"skipped_iters", last_.skipped_iters},
        {"nan_iters", last_.nan_iters},
        {"stopped_by", stopped_by}};
    if (step_ms_.empty()) {
      for (const char* field : {"lm_loss", "median_step_ms", "tokens_per_s", "tflops_per_device"}) summary[field] = nullptr;
    }
    writer_.write(summary);
  }

 private:
  // One memory record per pipeline stage (its most loaded rank's high-water marks, gathered by
  // the trainer every step): after the run's first step and at its end.
  void write_memory(const mt::train::StepStats& s) {
    for (const mt::train::StageMemory& m : s.stage_memory) {
      writer_.write(Record{{"record", "memory"},
                           {"iteration", s.iteration},
                           {"stage", m.stage},
                           {"rank", m.rank},
                           {"weights_bytes", m.weights},
                           {"grads_bytes", m.grads},
                           {"optim_bytes", m.optimizer},
                           {"activations_bytes", m.activations},
                           {"comm_buffers_bytes", m.comm_buffers},
                           {"peak_bytes", m.peak}});
    }
  }

  mt::tools::RecordWriter& writer_;
  std::vector<double> step_ms_;
  mt::train::StepStats last_;
  int64_t activation_peak_ = 0;
};

// The TensorBoard event files of --tensorboard-dir, written by the last rank as Megatron's are
// (train/tensorboard_log.h); nothing on the other ranks or without the flag. Each run starts with a
// SessionLog START at its first iteration, so a rerun or resume into the same directory reads as
// one straight run.
class TensorBoardEvents {
 public:
  TensorBoardEvents(const TensorBoardFlags& flags, const mt::train::TrainConfig& config, const mt::train::Trainer& trainer,
                    bool writer_rank) {
    if (flags.options.dir.empty() || !writer_rank) return;
    mt::train::TensorBoardOptions options = flags.options;
    options.timers_interval = config.log_interval;
    options.log_throughput = config.log_throughput;
    options.log_loss_scale = !flags.no_log_loss_scale;
    log_ = std::make_unique<mt::train::TensorBoardLog>(
        options, [&trainer] { return allocator_memory(trainer.memory(), trainer.ops().device); });
    log_->resume(trainer.iteration(), trainer.consumed_samples());
    mt::log::info("mt-train: TensorBoard events in " + log_->path());
  }
  void step(const mt::train::StepStats& s) {
    if (log_) log_->step(s);
  }
  void eval(const mt::train::EvalStats& e) {
    if (log_) log_->eval(e);
  }
  // Before a checkpoint save, so a run killed after it resumes with every earlier event on disk.
  void flush() {
    if (log_) log_->flush();
  }

 private:
  // Reserved: on CUDA what the backend's caching pool holds from the driver; the CPU keeps no
  // allocator cache, so there what is reserved is what is allocated.
  static mt::train::AllocatorMemory allocator_memory(const mt::backend::MemoryLedger& ledger,
                                                     mt::backend::Device device) {
    mt::train::AllocatorMemory m;
    m.reserved_bytes =
        device == mt::backend::Device::cuda ? mt::backend::cuda_pool_reserved_bytes() : ledger.live_total();
    m.allocated_bytes = ledger.live_total();
    m.max_allocated_bytes = ledger.peak_total();
    m.allocated_count = ledger.live_count();
    return m;
  }

  std::unique_ptr<mt::train::TensorBoardLog> log_;
};

// The log line of a run stopped early by `by` (a signal's name or a flag with its value).
// A stop before the first step (a closed stdout found by the run record) has nothing to save.
bool saved_on_stop(const TrainOptions& o, const mt::train::Trainer& trainer) {
  return !o.checkpoint.save.empty() && trainer.iteration() > 0;
}

void log_stop(const std::string& by, const TrainOptions& o, const mt::train::Trainer& trainer, bool rank0) {
  const std::string& save = o.checkpoint.save;
  const std::string wrote = saved_on_stop(o, trainer) ? "; saved a checkpoint in " + save + " (resume with --load)" : "";
  if (rank0) {
    mt::log::info("mt-train: stopped by " + by + " after iteration " + std::to_string(trainer.iteration()) + " of " +
                  std::to_string(trainer.total_iterations()) + wrote +
                  (o.save_final.empty() ? "" : "; wrote " + o.save_final));
  }
}

// The exit code of a run a signal stopped: 75 (EX_TEMPFAIL) when a checkpoint to resume from was
// saved, so a batch system requeues the job (--save-final alone is not resumable), else 128 + it.
// A stop that stdout's reader caused is named by the write error ("Broken pipe").
int stopped_exit_code(int stop, const TrainOptions& o, const mt::train::Trainer& trainer, bool rank0,
                      const std::string& stdout_error) {
  log_stop(stdout_error.empty() ? mt::tools::signal_name(stop) : "stdout (" + stdout_error + ")", o, trainer, rank0);
  return saved_on_stop(o, trainer) ? 75 : 128 + stop;
}

// Megatron's planned stops as the trainer takes them (none when the flags are not given).
mt::train::ExitConditions exit_conditions(const ExitFlags& flags) {
  mt::train::ExitConditions exit;
  exit.interval = flags.interval.value_or(0);
  exit.duration_minutes = flags.duration_minutes.value_or(0);
  exit.started = flags.process_started;
  return exit;
}

// The exit code of a run --exit-interval or --exit-duration-in-mins stopped: 75 when --save saved
// a checkpoint to resume from (a launcher requeues, as after a signal), else 0 (Megatron's).
int planned_stop_exit_code(mt::train::StopReason reason, const TrainOptions& o, const mt::train::Trainer& trainer,
                           bool rank0) {
  char value[32];
  if (reason == mt::train::StopReason::exit_interval) {
    std::snprintf(value, sizeof value, " %lld", static_cast<long long>(o.exit.interval.value_or(0)));
  } else {
    std::snprintf(value, sizeof value, " %g", o.exit.duration_minutes.value_or(0));
  }
  log_stop(mt::train::stop_reason_name(reason) + value, o, trainer, rank0);
  return o.checkpoint.save.empty() ? 0 : 75;
}

// Flags that mean something only with --dry-run.
// The data groups' communicator for the run's device (MPI on the CPU, NCCL on CUDA), with
// --distributed-timeout-minutes bounding NCCL; on the CPU the flag has nothing to bound, and says so.
mt::comm::DataGroupFactory data_group_factory(const TrainOptions& o, const mt::backend::Ops& ops, bool rank0) {
  if (o.distributed_timeout_minutes && ops.device == mt::backend::Device::cpu && rank0) {
    mt::log::warn("mt-train: --distributed-timeout-minutes bounds NCCL's waits (--device cuda); MPI's are not bounded");
  }
  const double timeout_seconds = o.distributed_timeout_minutes ? 60.0 * *o.distributed_timeout_minutes
                                                               : mt::comm::kDefaultDistributedTimeoutSeconds;
  return mt::comm::data_group_factory(ops.device, timeout_seconds);
}

void refuse_dry_run_flags(const TrainOptions& o) {
  if (o.dry.world_size) {
    throw mt::UsageError("--world-size", "applies to --dry-run only (a run's world is the launcher's: mpirun -np N)");
  }
}

// ---- --dry-run: the run checked for --world-size ranks in this one process ----

// Whether a token dataset's files exist (X.h5, or X.bin and X.idx).
bool token_dataset_exists(const std::string& prefix) {
  namespace fs = std::filesystem;
  return fs::exists(prefix + ".h5") || (fs::exists(prefix + ".bin") && fs::exists(prefix + ".idx"));
}

// The input paths a dry run can check: those that exist are read as the run reads them (token
// datasets opened, their recorded vocabulary taken, the EOD flags checked against them; token ids
// are not scanned), each one that does not exist yet is a warning. Returns them with whether found.
Record check_plan_inputs(const TrainOptions& o, RunPlan& plan) {
  Record inputs = Record::array();
  auto note = [&](const std::string& flag, const std::string& path, bool found, const std::string& otherwise) {
    inputs.push_back(Record{{"flag", flag}, {"path", path}, {"found", found}});
    if (!found) mt::log::warn("mt-train: --dry-run: " + flag + " " + path + " does not exist yet; " + otherwise);
  };
  if (o.paths.any()) {
    const mt::data::DataConfig data = token_data_config(o, plan.config, plan.model);
    bool all_found = true;
    for (const std::string& prefix : mt::data::dataset_prefixes(data)) {
      const bool found = token_dataset_exists(prefix);
      note("token dataset", prefix, found, "not checked");
      all_found = all_found && found;
    }
    if (all_found) {
      const std::vector<mt::data::TokenDataset> datasets = mt::data::open_datasets(data);
      mt::data::loader_eod_id(datasets, o.loader);
      take_vocabulary(o, datasets, plan.model);
    } else if (!o.model.vocab_size && o.model.preset.empty()) {
      throw mt::UsageError("--vocab-size", "needed to plan: the token datasets that would record it do not exist yet");
    }
  }
  if (!o.byte_data.empty()) note("--byte-data", o.byte_data, std::filesystem::exists(o.byte_data), "not checked");
  if (!o.checkpoint.load.empty()) {
    note("--load", o.checkpoint.load,
         std::filesystem::is_regular_file(o.checkpoint.load) || mt::io::read_tracker(o.checkpoint.load).has_value(),
         "a run would start from scratch");
  }
  return inputs;
}

// The op table a planned run's memory is counted for: the CPU's, or for --device cuda the CPU's
// with the GEMM operands the CUDA backend takes (bf16 or fp16 bits, as its gemm_operand_type and
// mt-memreport's cluster model), since a dry run needs no GPU. Only its gemm_operand_type is asked.
const mt::backend::Ops& planning_ops(mt::tools::BackendDevice device) {
  if (device == mt::tools::BackendDevice::cpu) return mt::backend::cpu_ops();
  static const mt::backend::Ops cuda_plan = [] {
    mt::backend::Ops ops = mt::backend::cpu_ops();
    ops.name = "cuda (planned)";
    ops.device = mt::backend::Device::cuda;
    ops.gemm_operand_type = [](mt::Precision precision) {
      return precision == mt::Precision::bf16 ? mt::DType::bf16
             : precision == mt::Precision::fp16 ? mt::DType::f16
                                                : mt::DType::f32;
    };
    return ops;
  }();
  return cuda_plan;
}

// Each rank's memory checked as a run checks it before it allocates (train::training_memory_options
// into perf::check_training_memory): against --peak-device's memory per GPU (one rank per GPU), or
// this host's available memory shared by all the ranks. Returns the record's memory part;
// `refusal` gets the check's message when it does not fit.
Record check_plan_memory(const RunPlan& plan, const TrainOptions& o, int world_size, std::string& refusal) {
  const bool on_gpu = !o.dry.peak_device.empty();
  const int ranks_sharing = on_gpu ? 1 : world_size;
  const mt::perf::MemoryOptions options = mt::train::training_memory_options(
      plan.config, plan.parallel, ranks_sharing, planning_ops(mt::tools::backend_device(o.device)));
  Record memory;
  int64_t available = 0;
  if (on_gpu) {
    const mt::perf::Device& gpu = mt::perf::find_device(o.dry.peak_device);
    available = mt::perf::device_memory_bytes(gpu);
    memory["checked_against"] = gpu.name + ": " + mt::perf::gib(available) + " per GPU (" + gpu.source + ")";
  } else {
    available = mt::perf::available_memory_bytes();
    memory["checked_against"] = "this host's available memory";
  }
  memory["available_bytes"] = available;
  memory["ranks_sharing"] = ranks_sharing;
  memory["gemm_copy_of"] = options.ops->name;
  const mt::perf::TrainingMemory floor = mt::perf::memory_floor(plan.model, options);
  const mt::perf::TrainingMemory rank = floor.overflow ? floor : mt::perf::planned_memory(plan.model, options);
  memory["estimate"] = floor.overflow ? "floor (beyond 64-bit counts)" : "planned";
  memory["per_rank"] = Record{{"weights_bytes", rank.weights},         {"grads_bytes", rank.grads},
                              {"optim_bytes", rank.optimizer},         {"activations_bytes", rank.activations},
                              {"other_bytes", rank.other},             {"total_bytes", rank.total()}};
  try {
    mt::perf::check_training_memory(plan.model, options, available);
  } catch (const mt::Error& e) {
    refusal = e.what();
  }
  return memory;
}

// The plan's checks in the order a run makes them, each part of the record filled as it passes;
// throws what a run would throw, or leaves the memory check's refusal in `refusal`.
void plan_dry_run(mt::tools::ToolCli& cli, TrainOptions& o, int world_size, Record& record, std::string& refusal) {
  RunPlan plan = plan_run(cli, o, world_size);
  const mt::tools::BackendDevice backend = mt::tools::backend_device(o.device);
  if (backend == mt::tools::BackendDevice::cuda && o.dry.peak_device.empty()) {
    throw mt::UsageError("--device cuda", "--dry-run needs --peak-device NAME, the GPU whose memory each rank has");
  }
  record["inputs"] = check_plan_inputs(o, plan);
  if (plan.model.vocab_size <= 0) throw mt::UsageError("--vocab-size", "must be at least 1");
  plan.model.validate();
  mt::train::validate_train_config(plan.config);
  record["model"] = model_record(plan.model);
  record["parallel"] = mt::parallel::to_json(plan.parallel);
  record["train"] = mt::train::to_json(plan.config);
  record["precision"] = mt::precision_name(plan.config.precision);
  record["device"] = backend == mt::tools::BackendDevice::cuda ? "cuda" : "cpu";
  record["backend_built"] = backend == mt::tools::BackendDevice::cpu || mt::backend::cuda_built();
  if (!record["backend_built"].get<bool>()) {
    mt::log::warn("mt-train: --dry-run: this build has no CUDA backend (configure with -DMT_CUDA=ON): a run with "
                  "--device cuda refuses it here");
  }
  if (o.training.peak_tflops || !o.dry.peak_device.empty()) {
    mt::tools::add_peak_fields(record, mt::tools::resolve_peak(o.training.peak_tflops, o.dry.peak_device,
                                                               plan.config.precision, 1));
  }
  record["memory"] = check_plan_memory(plan, o, world_size, refusal);
}

// mt-train --dry-run --world-size N: one dry_run record on stdout (the run record's provenance,
// the configs as a run would train them, the inputs found, each rank's memory, the verdict);
// exit 0 when the run would run, else 2 with the reason on stderr. Needs no MPI and writes nothing.
int dry_run(mt::tools::ToolCli& cli, TrainOptions& o) {
  if (mt::comm::MpiRuntime::size() > 1) {
    throw mt::UsageError("--dry-run", "plans in one process: start it without mpirun or srun");
  }
  if (!o.dry.world_size) throw mt::UsageError("--dry-run", "needs --world-size N, the ranks the run would start");
  const int world_size = *o.dry.world_size;
  Record record = mt::tools::run_record(cli);
  record["record"] = "dry_run";
  record["world_size"] = world_size;
  std::string refusal;
  try {
    plan_dry_run(cli, o, world_size, record, refusal);
  } catch (const mt::Error& e) {
    refusal = e.what();
  }
  record["verdict"] = refusal.empty() ? "runs" : "refused";
  record["reason"] = refusal.empty() ? Record(nullptr) : Record(refusal);
  mt::tools::RecordWriter writer(cli.output_format(), stdout, true);
  writer.write(record);
  writer.finish();
  if (!refusal.empty()) throw mt::Error(refusal, "", mt::ExitCode::usage);
  mt::log::info("mt-train: --dry-run: the run would run on " + std::to_string(world_size) + " ranks");
  return 0;
}

int run(mt::tools::ToolCli& cli, TrainOptions& o) {
  if (o.dry.enabled) return dry_run(cli, o);
  refuse_dry_run_flags(o);
  mt::comm::refuse_unformed_world();
  // The control world: the data index's barrier, the process groups, the agreed values below.
  const std::unique_ptr<mt::comm::Communicator> world = mt::comm::make_world_communicator();
  const bool rank0 = world->rank() == 0;
  RunPlan plan = plan_run(cli, o, world->size());
  apply_watch_flags(o.watch, plan.config);
  const RunDevice device = open_device(o);
  const mt::backend::Ops& ops = *device.ops;  // the one table
  check_outputs_writable(o, rank0);
  // The checkpoint to resume from is opened first: its seed may be the run's, and the data is
  // built from the seed. Every rank reads the boxes its layout holds.
  std::unique_ptr<mt::io::CheckpointReader> resume = open_resume_checkpoint(o.checkpoint, rank0);
  if (resume) adopt_checkpoint_seed(cli, *resume, o.checkpoint, plan.config, rank0);
  check_output_policy(o, plan, resume.get(), rank0);
  // One run per --save directory (rank 0 holds the lock until the run ends).
  std::optional<mt::train::SaveDirectoryLock> save_lock;
  if (rank0 && !o.checkpoint.save.empty()) save_lock.emplace(o.checkpoint.save);
  const std::unique_ptr<mt::data::SampleSource> data = open_data(o, plan, *world);

  const mt::tools::PeakSource peak = run_peak(o, plan.config.precision, device);
  plan.config.peak_flops_per_second = peak.flops_per_device;
  // The world gives DP = world / (TP x PP x CP); every process group (control and data, the
  // data groups MPI on the table's stream) is made once, here. On CUDA the data groups are NCCL
  // communicators (comm/nccl_communicator.h), chosen per device by data_group_factory.
  const mt::parallel::ProcessGroups groups(*world, mt::parallel::RankGrid(plan.parallel), ops, ops.default_stream(),
                                           data_group_factory(o, ops, rank0));
  mt::train::Trainer trainer(plan.model, plan.config, *data, ops, &groups);  // refuses what cannot fit before allocating
  LoadReport loaded;
  if (resume) loaded = load_resume(*resume, trainer, o.checkpoint, *world, rank0);

  mt::tools::RecordWriter writer(cli.output_format(), stdout, rank0);
  writer.stop_run_on_write_error();  // a closed or unread stdout stops the run with a save (issue 28 L4, L5)
  writer.write_run(run_record(cli, plan, *data, peak, device));
  if (rank0) {
    mt::log::info("mt-train: " + plan.model.name + ", " + std::to_string(mt::model::parameter_count(plan.model)) +
                  " parameters, " + mt::precision_name(plan.config.precision) + ", " + data->describe() + ", " +
                  std::to_string(trainer.total_iterations()) + " iterations");
  }
  if (resume) {
    writer.write(load_record(*resume, o.checkpoint, loaded));
    resume.reset();  // the file is closed before any save may replace it
  }
  if (rank0 && trainer.iteration() >= trainer.total_iterations()) say_nothing_to_train(trainer);
  RunCheckpoints checkpoints(writer, trainer, o.checkpoint, plan.parallel, rank0);
  if (!o.save_init.empty()) checkpoints.save_parameters(o.save_init);

  StepRecords records(writer);
  TensorBoardEvents tensorboard(o.tensorboard, plan.config, trainer, world->rank() == world->size() - 1);
  mt::train::TrainObservers observers;
  observers.on_step = [&](const mt::train::StepStats& s) {
    records.step(s);
    tensorboard.step(s);
  };
  observers.on_eval = [&](const mt::train::EvalStats& e) {
    records.eval(e);
    tensorboard.eval(e);
  };
  observers.on_log_line = [rank0](const std::string& line) {
    if (rank0) mt::log::info(line);
  };
  observers.on_iteration_end = [&](int64_t iteration) {
    if (checkpoints.saves_after(iteration)) tensorboard.flush();
    checkpoints.at_iteration_end(iteration);
  };
  // From here a signal stops the run after the current step, and what it was asked to write is
  // written; a second signal exits at once.
  mt::tools::handle_signals("mt-train", mt::tools::SignalMode::graceful);
  trainer.run(observers, exit_conditions(o.exit));
  tensorboard.flush();
  records.at_run_end();
  checkpoints.at_run_end();
  if (!o.save_final.empty()) checkpoints.save_parameters(o.save_final);
  // The ranks agreed to stop at the same step; a signal that reached only some of them after the
  // last step is agreed here, so every rank exits with the same code.
  int stop = mt::stop_signal();
  world->all_reduce(&stop, 1, mt::DType::i32, mt::comm::ReduceOp::max);
  const bool planned_stop = stop == 0 && trainer.stopped();  // by --exit-interval or --exit-duration-in-mins
  const Record stopped_by = stop ? Record(mt::tools::signal_name(stop))
                            : planned_stop ? Record(mt::train::stop_reason_name(trainer.stop_reason()))
                                           : Record(nullptr);
  records.summary(trainer, plan, world->size(), stopped_by);
  writer.finish();
  if (stop != 0) {
    const int code = stopped_exit_code(stop, o, trainer, rank0, writer.write_error());
    mt::tools::exit_with_on_later_signal(code);  // srun's SIGTERM to the ranks still exiting keeps the 75
    world->barrier();  // rank 0's last line is out before any rank exits and mpirun ends the others (U9)
    return code;
  }
  return planned_stop ? planned_stop_exit_code(trainer.stop_reason(), o, trainer, rank0) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  TrainOptions options;
  return mt::tools::tool_main(
      argc, argv, "mt-train",
      "Pre-train a GPT-2, LLaMA, MoE or BERT model on the CPU with Megatron-LM's flags; JSONL records on stdout, log on stderr.",
      [&](mt::tools::ToolCli& cli) {
        mt::tools::refuse_unimplemented_megatron_flags(argc, argv);
        define(cli, options);
      },
      [&](mt::tools::ToolCli& cli) { return run(cli, options); });
}
