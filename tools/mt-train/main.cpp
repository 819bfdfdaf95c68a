// mt-train: pre-train a GPT-2 or LLaMA model with Megatron-LM's flag names. Step, eval, ckpt and
// summary records on stdout (JSONL by default, led by the run record), Megatron's log line on
// stderr. Tested by tests/tools/mt-train.bats and tests/tools/conventions.bats.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>
#include <vector>

#include <mpi.h>

#include "comm/mpi_runtime.h"
#include "tools/common/data_flags.h"
#include "tools/common/tool_main.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "data/gpt_dataset.h"
#include "data/sample_source.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "perf/flops.h"
#include "perf/gemm_probe.h"
#include "train/trainer.h"

namespace {

using mt::tools::Record;

// Flags as Megatron spells them. Unset optionals keep the preset's value.
struct TrainOptions {
  std::string model;
  std::optional<int> num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups, kv_channels;
  std::optional<int> seq_length, max_position_embeddings, make_vocab_size_divisible_by;
  std::optional<int64_t> vocab_size;
  bool group_query_attention = false, swiglu = false, untie = false, disable_bias_linear = false;
  std::optional<std::string> normalization, position_embedding_type;
  std::optional<float> norm_epsilon, rotary_base, init_method_std, hidden_dropout, attention_dropout;

  mt::train::TrainConfig train;
  std::string lr_decay_style = "linear";
  std::string recompute_granularity, recompute_method = "uniform";
  bool bf16 = false, fp16 = false;
  double peak_tflops = 0;

  bool mock_data = false;
  std::string byte_data;
  mt::tools::DataPathFlags paths;
  std::string data_cache_path;
  mt::data::LoaderOptions loader;
  std::string save_init, save_final;
};

// Megatron flags mt does not implement (yet): naming one is a usage error that says so, never a
// silently ignored flag.
const std::set<std::string>& unsupported_megatron_flags() {
  static const std::set<std::string> flags{
      "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
      "--expert-model-parallel-size", "--virtual-pipeline-model-parallel-size",
      "--num-layers-per-virtual-pipeline-stage", "--sequence-parallel", "--use-distributed-optimizer",
      "--overlap-grad-reduce", "--overlap-param-gather", "--num-experts", "--moe-router-topk",
      "--moe-aux-loss-coeff", "--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file",
      "--save", "--load", "--save-interval", "--rampup-batch-size", "--data-args-path",
      "--per-split-data-args-path", "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files",
      "--full-validation", "--mid-level-dataset-surplus", "--num-dataset-builder-threads",
      "--object-storage-cache-path", "--s3-cache-path",
      "--fp8-format", "--fp8", "--use-flash-attn", "--transformer-impl", "--use-mcore-models",
      "--distributed-backend", "--exit-interval", "--exit-duration-in-mins", "--exit-signal-handler",
      "--tensorboard-dir", "--wandb-project", "--no-position-embedding", "--use-rotary-position-embeddings",
      "--apply-query-key-layer-scaling", "--attention-softmax-in-fp32", "--accumulate-allreduce-grads-in-fp32",
      "--num-workers", "--dataloader-type", "--optimizer", "--sgd-momentum", "--use-checkpoint-args",
      "--no-load-optim", "--no-load-rng", "--finetune", "--qk-layernorm", "--rotary-percent",
      "--rope-scaling", "--use-rope-scaling", "--start-weight-decay", "--end-weight-decay",
      "--weight-decay-incr-style", "--lr-wsd-decay-style", "--lr-wsd-decay-samples", "--lr-wsd-decay-iters",
      "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"};
  return flags;
}

void reject_unsupported_flags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (auto eq = arg.find('='); eq != std::string::npos) arg.resize(eq);
    if (unsupported_megatron_flags().count(arg)) {
      throw mt::UsageError(arg, "Megatron flag not supported by mt-train yet");
    }
  }
}

template <typename T>
void apply(const std::optional<T>& value, T& target) {
  if (value) target = *value;
}

mt::model::ModelConfig build_model_config(const TrainOptions& o) {
  mt::model::ModelConfig c;
  if (!o.model.empty()) c = mt::model::preset(o.model);
  apply(o.num_layers, c.num_layers);
  apply(o.hidden_size, c.hidden_size);
  apply(o.ffn_hidden_size, c.ffn_hidden_size);
  apply(o.num_attention_heads, c.num_attention_heads);
  apply(o.kv_channels, c.kv_channels);
  apply(o.seq_length, c.seq_length);
  apply(o.max_position_embeddings, c.max_position_embeddings);
  apply(o.make_vocab_size_divisible_by, c.make_vocab_size_divisible_by);
  apply(o.vocab_size, c.vocab_size);
  apply(o.norm_epsilon, c.norm_epsilon);
  apply(o.rotary_base, c.rotary_base);
  apply(o.init_method_std, c.init_method_std);
  apply(o.hidden_dropout, c.hidden_dropout);
  apply(o.attention_dropout, c.attention_dropout);
  if (o.num_attention_heads && !o.num_query_groups && !o.group_query_attention) c.num_query_groups = c.num_attention_heads;
  if (o.num_query_groups) {
    if (!o.group_query_attention && *o.num_query_groups != c.num_attention_heads) {
      throw mt::UsageError("--num-query-groups", "needs --group-query-attention (as in Megatron)");
    }
    c.num_query_groups = *o.num_query_groups;
  }
  if (o.swiglu) c.swiglu = true;
  if (o.untie) c.untie_embeddings_and_output_weights = true;
  if (o.disable_bias_linear) c.add_bias_linear = false;
  if (o.normalization) {
    if (*o.normalization == "LayerNorm") c.normalization = mt::model::Normalization::layernorm;
    else if (*o.normalization == "RMSNorm") c.normalization = mt::model::Normalization::rmsnorm;
    else throw mt::UsageError("--normalization " + *o.normalization, "unknown (LayerNorm, RMSNorm)");
  }
  if (o.position_embedding_type) {
    if (*o.position_embedding_type == "learned_absolute") c.position_embedding = mt::model::PositionEmbedding::learned_absolute;
    else if (*o.position_embedding_type == "rope") c.position_embedding = mt::model::PositionEmbedding::rope;
    else throw mt::UsageError("--position-embedding-type " + *o.position_embedding_type, "unknown (learned_absolute, rope)");
  }
  if (c.name.empty() || o.model.empty()) c.name = "custom";
  if (c.max_position_embeddings == 0) c.max_position_embeddings = c.seq_length;
  if (c.ffn_hidden_size == 0) c.ffn_hidden_size = 4 * c.hidden_size;
  if (c.num_query_groups == 0) c.num_query_groups = c.num_attention_heads;
  return c;
}

Record model_json(const mt::model::ModelConfig& c) {
  return Record{{"name", c.name},
                {"num_layers", c.num_layers},
                {"hidden_size", c.hidden_size},
                {"ffn_hidden_size", c.ffn_hidden_size},
                {"num_attention_heads", c.num_attention_heads},
                {"num_query_groups", c.query_groups()},
                {"kv_channels", c.head_dim()},
                {"seq_length", c.seq_length},
                {"max_position_embeddings", c.max_position_embeddings},
                {"vocab_size", c.vocab_size},
                {"padded_vocab_size", c.padded_vocab_size()},
                {"swiglu", c.swiglu},
                {"normalization", c.normalization == mt::model::Normalization::layernorm ? "LayerNorm" : "RMSNorm"},
                {"norm_epsilon", c.norm_epsilon},
                {"position_embedding_type",
                 c.position_embedding == mt::model::PositionEmbedding::rope ? "rope" : "learned_absolute"},
                {"rotary_base", c.rotary_base},
                {"untie_embeddings_and_output_weights", c.untie_embeddings_and_output_weights},
                {"add_bias_linear", c.add_bias_linear},
                {"init_method_std", c.init_method_std},
                {"parameters", mt::model::parameter_count(c)}};
}

// Token datasets through a sample index: found in the cache directory under the md5 of its
// parameters (stale ones refused), else built there. Under MPI rank 0 builds while the others
// wait, then every rank reads it. Sets the model's vocabulary from the data unless --vocab-size.
std::unique_ptr<mt::data::SampleSource> open_token_data(const TrainOptions& o, const mt::train::TrainConfig& config,
                                                        mt::model::ModelConfig& model) {
  mt::data::DataConfig data;
  mt::tools::apply_data_path_flags(o.paths, data);
  data.seq_length = model.seq_length;
  data.seed = static_cast<int64_t>(config.seed);
  const int64_t global = config.global_batch_size > 0 ? config.global_batch_size : config.micro_batch_size;
  data.num_samples = mt::data::megatron_num_samples(config.train_iters, config.train_samples, global,
                                                    config.eval_interval, config.eval_iters);
  mt::data::validate_data_config(data);
  std::vector<mt::data::TokenDataset> datasets = mt::data::open_datasets(data);
  mt::data::loader_eod_id(datasets, o.loader);  // refuse EOD flags the data cannot serve before building
  if (!o.vocab_size) {
    int64_t vocab = 0;
    for (const auto& dataset : datasets) {
      vocab = dataset.vocab_size() < 0 || vocab < 0 ? -1 : std::max(vocab, dataset.vocab_size());
    }
    if (vocab > 0) model.vocab_size = vocab;
    else if (o.model.empty()) throw mt::UsageError("--vocab-size", "needed: the token datasets (.bin/.idx) record none");
  }
  if (model.vocab_size <= 0) throw mt::UsageError("--vocab-size", "must be positive");
  model.validate();
  const std::string directory = o.data_cache_path.empty() ? mt::data::default_cache_dir(data) : o.data_cache_path;
  const std::string path = (std::filesystem::path(directory) / mt::data::index_file_name(data)).string();
  const bool builder = mt::comm::MpiRuntime::rank() == 0;
  bool built = false;
  mt::data::SampleIndex index;
  if (builder) index = mt::data::load_or_build_index(data, datasets, path, true, &built);
  if (mt::comm::MpiRuntime::active()) MPI_Barrier(MPI_COMM_WORLD);
  if (!builder) index = mt::data::load_or_build_index(data, datasets, path, false);
  mt::log::info(std::string("mt-train: ") + (built ? "built sample index " : "using sample index ") + path);
  return std::make_unique<mt::data::GptSampleSource>(std::move(datasets), std::move(index), path, model.seq_length,
                                                     o.loader);
}

void define(mt::tools::ToolCli& cli, TrainOptions& o) {
  CLI::App& app = cli.app();
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // argparse: the last one wins
  app.footer(
      "Data: token datasets (--data-path, or --train/valid/test-data-path) through a sample index found in, or\n"
      "built into, --data-cache-path under the md5 of its parameters (mt-shard build writes the same file); or\n"
      "--mock-data (Philox tokens) or --byte-data FILE (a text file's UTF-8 bytes as tokens, vocabulary 256).\n"
      "Megatron flags mt does not implement yet are refused by name.\n"
      "Precision: --bf16 rounds every GEMM input to bf16 (fp32 accumulation, fp32 master weights, grads and Adam\n"
      "states); --fp16 rounds them to fp16 with a loss scaler. Records: run, step, eval, ckpt, summary (docs/DESIGN.md).");
  app.add_option("--model", o.model, "Preset: gpt2-124m, gpt2-345m, llama3-8b, llama3-70b, llama3.1-405b, tiny-gpt, "
                                     "tiny-llama (flags below override)");
  auto* m = "Model";
  app.add_option("--num-layers", o.num_layers, "Transformer layers")->group(m);
  app.add_option("--hidden-size", o.hidden_size, "Hidden size")->group(m);
  app.add_option("--ffn-hidden-size", o.ffn_hidden_size, "MLP hidden size (default 4 x hidden)")->group(m);
  app.add_option("--num-attention-heads", o.num_attention_heads, "Attention heads")->group(m);
  app.add_flag("--group-query-attention", o.group_query_attention, "Use grouped-query attention")->group(m);
  app.add_option("--num-query-groups", o.num_query_groups, "Key/value head groups (with --group-query-attention)")->group(m);
  app.add_option("--kv-channels", o.kv_channels, "Head dimension (default hidden / heads)")->group(m);
  app.add_option("--seq-length", o.seq_length, "Sequence length")->group(m);
  app.add_option("--max-position-embeddings", o.max_position_embeddings, "Learned position table size")->group(m);
  app.add_option("--vocab-size", o.vocab_size, "Vocabulary size (default: the data's or the preset's)")->group(m);
  app.add_option("--make-vocab-size-divisible-by", o.make_vocab_size_divisible_by,
                 "Pad the vocabulary to a multiple of this, independent of TP (default 128)")->group(m);
  app.add_flag("--swiglu", o.swiglu, "SwiGLU MLP")->group(m);
  app.add_option("--normalization", o.normalization, "LayerNorm or RMSNorm")->group(m);
  app.add_option("--norm-epsilon", o.norm_epsilon, "Normalisation epsilon")->group(m);
  app.add_option("--position-embedding-type", o.position_embedding_type, "learned_absolute or rope")->group(m);
  app.add_option("--rotary-base", o.rotary_base, "RoPE base")->group(m);
  app.add_flag("--untie-embeddings-and-output-weights", o.untie, "Separate output layer")->group(m);
  app.add_flag("--disable-bias-linear", o.disable_bias_linear, "No biases in linear layers")->group(m);
  app.add_option("--init-method-std", o.init_method_std, "Std of the normal initialisation")->group(m);
  app.add_option("--hidden-dropout", o.hidden_dropout, "Dropout after attention, MLP and embedding")->group(m);
  app.add_option("--attention-dropout", o.attention_dropout,
                 "Attention-probability dropout: only 0 is supported (the fused kernel has none)")->group(m);

  auto* t = "Training";
  mt::train::TrainConfig& c = o.train;
  app.add_option("--micro-batch-size", c.micro_batch_size, "Samples per micro-batch")->group(t)->capture_default_str();
  app.add_option("--global-batch-size", c.global_batch_size, "Samples per step (micro-batches accumulate)")->group(t);
  app.add_option("--train-iters", c.train_iters, "Iterations to train")->group(t);
  app.add_option("--train-samples", c.train_samples, "Samples to train (instead of --train-iters)")->group(t);
  app.add_option("--lr", c.lr, "Peak learning rate")->group(t)->capture_default_str();
  app.add_option("--min-lr", c.min_lr, "Learning rate at the end of the decay")->group(t)->capture_default_str();
  app.add_option("--lr-decay-style", o.lr_decay_style, "constant, linear or cosine")->group(t)->capture_default_str();
  app.add_option("--lr-warmup-iters", c.lr_warmup_iters, "Warm-up iterations")->group(t);
  app.add_option("--lr-warmup-samples", c.lr_warmup_samples, "Warm-up samples")->group(t);
  app.add_option("--lr-warmup-fraction", c.lr_warmup_fraction, "Warm-up as a fraction of the decay")->group(t);
  app.add_option("--lr-decay-iters", c.lr_decay_iters, "Decay iterations (default: the run)")->group(t);
  app.add_option("--lr-decay-samples", c.lr_decay_samples, "Decay samples (default: the run)")->group(t);
  app.add_option("--weight-decay", c.adam.weight_decay, "AdamW decoupled weight decay (not on biases and norms)")
      ->group(t)->capture_default_str();
  app.add_option("--adam-beta1", c.adam.beta1, "AdamW beta1")->group(t)->capture_default_str();
  app.add_option("--adam-beta2", c.adam.beta2, "AdamW beta2")->group(t)->capture_default_str();
  app.add_option("--adam-eps", c.adam.eps, "AdamW epsilon")->group(t)->capture_default_str();
  app.add_option("--clip-grad", c.clip_grad, "Clip the global grad norm to this (0: off)")->group(t)->capture_default_str();
  app.add_flag("--bf16", o.bf16, "bf16 GEMM inputs, fp32 master weights")->group(t);
  app.add_flag("--fp16", o.fp16, "fp16 GEMM inputs with loss scaling")->group(t);
  app.add_option("--loss-scale", c.loss_scale, "Static loss scale for --fp16 (default: dynamic)")->group(t);
  app.add_option("--initial-loss-scale", c.initial_loss_scale, "Dynamic scaler's start")->group(t)->capture_default_str();
  app.add_option("--min-loss-scale", c.min_loss_scale, "Dynamic scaler's floor")->group(t)->capture_default_str();
  app.add_option("--loss-scale-window", c.loss_scale_window, "Clean steps before the scale doubles")->group(t)->capture_default_str();
  app.add_option("--hysteresis", c.hysteresis, "Overflows before the scale halves")->group(t)->capture_default_str();
  app.add_flag("--calculate-per-token-loss", c.calculate_per_token_loss,
               "Normalise the loss by all tokens of the step, not per micro-batch")->group(t);
  app.add_flag("--check-for-nan-in-loss-and-grad", c.check_for_nan_in_loss_and_grad,
               "Stop with an error on a NaN/Inf loss or grad (otherwise the step is skipped and counted)")->group(t);
  app.add_option("--recompute-granularity", o.recompute_granularity, "full or selective (core attention)")->group(t);
  app.add_option("--recompute-method", o.recompute_method, "uniform or block (with full)")->group(t)->capture_default_str();
  app.add_option("--recompute-num-layers", c.recompute.num_layers, "Layers per chunk (uniform) or recomputed (block)")
      ->group(t)->capture_default_str();
  app.add_option("--seed", c.seed, "Seed of initialisation, dropout and mock data")->group(t)->capture_default_str();
  app.add_option("--log-interval", c.log_interval, "Iterations between log lines on stderr")->group(t)->capture_default_str();
  app.add_option("--eval-interval", c.eval_interval, "Iterations between evaluations")->group(t)->capture_default_str();
  app.add_option("--eval-iters", c.eval_iters, "Global batches per evaluation (0: none)")->group(t)->capture_default_str();
  app.add_option("--peak-tflops", o.peak_tflops, "Peak TFLOP/s per device for MFU (default: measured by a GEMM probe)")
      ->group(t);

  auto* d = "Data and output";
  app.add_flag("--mock-data", o.mock_data, "Deterministic synthetic tokens")->group(d);
  app.add_option("--byte-data", o.byte_data, "Train on a text file's UTF-8 bytes (vocabulary 256)")->group(d);
  mt::tools::add_data_path_flags(app, o.paths, d);
  app.add_option("--data-cache-path", o.data_cache_path,
                 "Directory of sample indices (default PREFIX/cache/GPTDataset_indices of the first dataset)")->group(d);
  app.add_flag("--eod-mask-loss", o.loader.eod_mask_loss, "No loss where the input token is end-of-document")->group(d);
  app.add_flag("--reset-position-ids", o.loader.reset_position_ids, "Positions restart after each end-of-document")
      ->group(d);
  app.add_flag("--reset-attention-mask", o.loader.reset_attention_mask,
               "Attention stays inside each document (end-of-document boundaries)")->group(d);
  app.add_option("--save-init", o.save_init, "Write the initial parameters (HDF5 checkpoint layout)")->group(d);
  app.add_option("--save-final", o.save_final, "Write the final parameters (HDF5 checkpoint layout)")->group(d);
  cli.add_output_format(app, mt::tools::OutputFormat::jsonl);
}

int run(mt::tools::ToolCli& cli, TrainOptions& o) {
  if (mt::comm::MpiRuntime::size() > 1) {
    throw mt::UsageError("world size " + std::to_string(mt::comm::MpiRuntime::size()),
                         "mt-train runs on one rank until data/tensor/pipeline parallelism land");
  }
  if (o.bf16 && o.fp16) throw mt::UsageError("--bf16/--fp16", "choose one");
  mt::train::TrainConfig config = o.train;
  config.precision = o.bf16 ? mt::Precision::bf16 : o.fp16 ? mt::Precision::fp16 : mt::Precision::fp32;
  config.lr_decay_style = mt::optim::parse_decay_style(o.lr_decay_style);
  if (!o.recompute_granularity.empty()) {
    if (o.recompute_granularity == "full") config.recompute.granularity = mt::model::RecomputeGranularity::full;
    else if (o.recompute_granularity == "selective") config.recompute.granularity = mt::model::RecomputeGranularity::selective;
    else throw mt::UsageError("--recompute-granularity " + o.recompute_granularity, "unknown (full, selective)");
  }
  if (o.recompute_method == "uniform") config.recompute.method = mt::model::RecomputeMethod::uniform;
  else if (o.recompute_method == "block") config.recompute.method = mt::model::RecomputeMethod::block;
  else throw mt::UsageError("--recompute-method " + o.recompute_method, "unknown (uniform, block)");
  if (o.recompute_method == "block" && config.recompute.granularity != mt::model::RecomputeGranularity::full) {
    throw mt::UsageError("--recompute-method block", "needs --recompute-granularity full");
  }

  const bool token_data = o.paths.any();
  const int sources = (o.mock_data ? 1 : 0) + (o.byte_data.empty() ? 0 : 1) + (token_data ? 1 : 0);
  if (sources != 1) throw mt::UsageError("data", "give exactly one of --mock-data, --byte-data FILE, --data-path PREFIX");
  if (!token_data && o.loader.needs_eod()) {
    throw mt::UsageError("--eod-mask-loss/--reset-position-ids/--reset-attention-mask", "need token datasets (--data-path)");
  }
  if (!token_data && (cli.app().count("--split") > 0 || !o.data_cache_path.empty())) {
    throw mt::UsageError("--split/--data-cache-path", "apply to token datasets (--data-path) only");
  }
  if (o.paths.data_path.empty() && cli.app().count("--split") > 0) {
    throw mt::UsageError("--split", "splits --data-path datasets; the per-split paths are used whole");
  }
  if (o.model.empty() && !o.num_layers) throw mt::UsageError("--model", "give a preset or --num-layers and friends");
  if (!o.byte_data.empty() && !o.vocab_size && o.model.empty()) o.vocab_size = 256;
  mt::model::ModelConfig model = build_model_config(o);
  if (o.mock_data && !o.vocab_size && model.vocab_size <= 0) throw mt::UsageError("--vocab-size", "needed with --mock-data");

  std::unique_ptr<mt::data::SampleSource> data;
  if (token_data) {
    data = open_token_data(o, config, model);
  } else {
    if (model.vocab_size <= 0) throw mt::UsageError("--vocab-size", "must be positive");
    model.validate();
    data = o.mock_data ? mt::data::make_mock_data(model.vocab_size, model.seq_length, config.seed)
                       : mt::data::make_byte_data(o.byte_data, model.seq_length);
  }

  const bool peak_from_flag = o.peak_tflops > 0;
  config.peak_flops_per_second = peak_from_flag ? o.peak_tflops * 1e12 : mt::perf::measure_gemm_flops(config.precision);

  mt::train::Trainer trainer(model, config, *data);
  const bool rank0 = true;
  mt::tools::RecordWriter writer(cli.output_format(), stdout, rank0);
  Record run = mt::tools::run_record(cli);
  run["model"] = model_json(model);
  run["precision"] = mt::precision_name(config.precision);
  run["data"] = data->describe();
  run["flops_convention"] = mt::perf::convention_name(config.flops_convention);
  run["flops_per_token"] = mt::perf::flops_per_token(model, config.flops_convention);
  run["peak_tflops"] = config.peak_flops_per_second / 1e12;
  run["peak_source"] = peak_from_flag ? "--peak-tflops" : "measured (2048^3 GEMM probe)";
  writer.write_run(run);
  mt::log::info("mt-train: " + model.name + ", " + std::to_string(mt::model::parameter_count(model)) +
                " parameters, " + mt::precision_name(config.precision) + ", " + data->describe() + ", " +
                std::to_string(trainer.total_iterations()) + " iterations");

  nlohmann::json config_json = model_json(model);
  auto save = [&](const std::string& path) {
    mt::io::CheckpointInfo info;
    info.iteration = trainer.iteration();
    info.consumed_samples = trainer.consumed_samples();
    info.config_json = config_json.dump();
    mt::io::write_parameters(path, trainer.layout(), trainer.parameters(), info);
    writer.write(Record{{"record", "ckpt"}, {"iteration", info.iteration}, {"path", path}, {"what", "parameters"}});
  };
  if (!o.save_init.empty()) save(o.save_init);

  std::vector<double> step_ms;
  mt::train::StepStats last;
  int64_t activation_peak = 0;
  mt::train::TrainObservers observers;
  observers.on_step = [&](const mt::train::StepStats& s) {
    last = s;
    step_ms.push_back(s.step_ms);
    activation_peak = std::max(activation_peak, s.mem_activations_bytes);
    writer.write(Record{{"record", "step"},
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
                        {"nan_iters", s.nan_iters}});
  };
  observers.on_eval = [&](const mt::train::EvalStats& e) {
    writer.write(Record{{"record", "eval"}, {"iteration", e.iteration}, {"lm_loss", e.lm_loss}, {"ppl", e.ppl}});
  };
  observers.on_log_line = [](const std::string& line) { mt::log::info(line); };
  trainer.run(observers);
  if (!o.save_final.empty()) save(o.save_final);

  std::vector<double> steady(step_ms.begin() + (step_ms.size() > 1 ? 1 : 0), step_ms.end());
  std::sort(steady.begin(), steady.end());
  const double median_ms = steady.empty() ? 0 : steady[steady.size() / 2];
  const double tokens_per_step = static_cast<double>(last.global_batch_size) * model.seq_length;
  writer.write(Record{{"record", "summary"},
                      {"iterations", last.iteration},
                      {"consumed_samples", last.consumed_samples},
                      {"lm_loss", last.lm_loss},
                      {"median_step_ms", median_ms},
                      {"tokens_per_s", median_ms > 0 ? tokens_per_step / (median_ms / 1e3) : 0},
                      {"tflops_per_device",
                       median_ms > 0 ? mt::perf::flops_per_token(model, config.flops_convention) * tokens_per_step /
                                           (median_ms / 1e3) / 1e12
                                     : 0},
                      {"mem_activations_peak_bytes", activation_peak},
                      {"skipped_iters", last.skipped_iters},
                      {"nan_iters", last.nan_iters}});
  writer.finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  TrainOptions options;
  return mt::tools::tool_main(
      argc, argv, "mt-train",
      "Pre-train a GPT-2 or LLaMA model on the CPU with Megatron-LM's flags; JSONL records on stdout, log on stderr.",
      [&](mt::tools::ToolCli& cli) {
        reject_unsupported_flags(argc, argv);
        define(cli, options);
      },
      [&](mt::tools::ToolCli& cli) { return run(cli, options); });
}
