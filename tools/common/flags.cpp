// Flag specs, their checks and the table of shared flags (see flags.h).
#include "tools/common/flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "core/error.h"

namespace mt::tools {
namespace {

constexpr long double kInf = std::numeric_limits<long double>::infinity();

// A bound as the user would write it: integers without a fraction, others with %Lg.
std::string number_text(long double value) {
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  if (value == std::floor(value) && std::fabs(value) < 1e19L) {
    std::snprintf(buffer, sizeof buffer, "%.0Lf", value);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.17Lg", value);
  }
  return buffer;
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}

// An integer as written: optional sign and digits only (argparse's int(): no "1e3", no "1.0").
// Values beyond int64 come back as +-inf so the range check reports them.
std::optional<long double> parse_integer(const std::string& text) {
  size_t start = text[0] == '+' || text[0] == '-' ? 1 : 0;
  if (start == text.size() || text.find_first_not_of("0123456789", start) != std::string::npos) return std::nullopt;
  int64_t value = 0;
  const char* first = text.data() + (text[0] == '+' ? 1 : 0);
  const auto [end, error] = std::from_chars(first, text.data() + text.size(), value);
  if (error == std::errc::result_out_of_range) return text[0] == '-' ? -kInf : kInf;
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return static_cast<long double>(value);
}

// A real number as strtod reads it (so "nan" and "inf" parse, and are then refused as such).
std::optional<long double> parse_real(const std::string& text) {
  char* end = nullptr;
  const long double value = std::strtold(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0') return std::nullopt;
  return value;
}

}  // namespace

std::string Range::describe() const {
  const bool has_min = !std::isinf(min), has_max = !std::isinf(max);
  if (has_min && has_max) {
    return "in " + std::string(min_exclusive ? "(" : "[") + number_text(min) + ", " + number_text(max) +
           (max_exclusive ? ")" : "]");
  }
  if (has_min) {
    if (min == 0 && min_exclusive) return "positive";
    return (min_exclusive ? "greater than " : "at least ") + number_text(min);
  }
  if (has_max) return (max_exclusive ? "less than " : "at most ") + number_text(max);
  return "a finite number";
}

bool Range::contains(long double value) const {
  if (std::isnan(value)) return false;
  if (min_exclusive ? !(value > min) : !(value >= min)) return false;
  if (max_exclusive ? !(value < max) : !(value <= max)) return false;
  return true;
}

Range at_least(long double min) { return Range{min, kInf, false, false}; }
Range positive() { return Range{0, kInf, true, false}; }
Range between(long double min, long double max, bool max_exclusive) { return Range{min, max, false, max_exclusive}; }

FlagSpec integer_flag(std::string name, std::string help, Range range) {
  return FlagSpec{std::move(name), FlagKind::integer, std::move(help), range, {}, {}};
}
FlagSpec real_flag(std::string name, std::string help, Range range) {
  return FlagSpec{std::move(name), FlagKind::real, std::move(help), range, {}, {}};
}
FlagSpec toggle_flag(std::string name, std::string help) {
  return FlagSpec{std::move(name), FlagKind::toggle, std::move(help), {}, {}, {}};
}
FlagSpec text_flag(std::string name, std::string help, std::vector<std::string> choices,
                   std::vector<std::string> supported) {
  return FlagSpec{std::move(name), FlagKind::text, std::move(help), {}, std::move(choices), std::move(supported)};
}
FlagSpec list_flag(std::string name, std::string help) {
  return FlagSpec{std::move(name), FlagKind::list, std::move(help), {}, {}, {}};
}

std::string value_error(const FlagSpec& spec, const std::string& text) { return value_error(spec, text, -kInf, kInf); }

std::string value_error(const FlagSpec& spec, const std::string& text, long double type_min, long double type_max) {
  const std::string got = " (got " + (text.empty() ? std::string("nothing") : text) + ")";
  if (spec.kind == FlagKind::text) {
    auto listed = [&](const std::vector<std::string>& values) {
      return std::find(values.begin(), values.end(), text) != values.end();
    };
    if (!spec.choices.empty() && !listed(spec.choices)) return "must be one of " + join(spec.choices, ", ") + got;
    if (!spec.supported.empty() && !listed(spec.supported)) {
      return text + " is not supported yet (mt implements " + join(spec.supported, ", ") + ")";
    }
    return "";
  }
  if (spec.kind != FlagKind::integer && spec.kind != FlagKind::real) return "";
  const bool integer = spec.kind == FlagKind::integer;
  const std::optional<long double> value = text.empty() ? std::nullopt
                                           : integer    ? parse_integer(text)
                                                        : parse_real(text);
  const std::string range = spec.range.describe();
  if (!value) return (integer ? "must be an integer, " : "must be a number, ") + range + got;
  if (!integer && !std::isfinite(*value)) {
    return "must be a finite number" + (range == "a finite number" ? std::string() : ", " + range) + got;
  }
  if (!spec.range.contains(*value)) return "must be " + range + got;
  if (*value > type_max) return "must be at most " + number_text(type_max) + got;
  if (*value < type_min) return "must be at least " + number_text(type_min) + got;
  return "";
}

namespace detail {

void check_kind(const FlagSpec& spec, FlagKind bound_kind) {
  if (spec.kind != bound_kind) throw std::logic_error(spec.name + ": bound to a value of another kind");
}

CLI::Validator value_check(const FlagSpec& spec, long double type_min, long double type_max) {
  std::string description = spec.kind == FlagKind::text
                                ? (spec.choices.empty() ? "" : "one of " + join(spec.choices, ", "))
                                : spec.range.describe();
  return CLI::Validator(
      [spec, type_min, type_max](std::string& text) { return value_error(spec, text, type_min, type_max); },
      description == "a finite number" ? "" : description);
}

}  // namespace detail

// The shared flags. Megatron's spellings and, where Megatron checks one, its range; where it does
// not (argparse takes any int or float), the range in which the value means something.
const FlagSpec& flag_spec(std::string_view name) {
  static const std::vector<FlagSpec> table{
      // model
      text_flag("--model", "Preset; the model flags below override its values", model::preset_names()),
      integer_flag("--num-layers", "Transformer layers", at_least(1)),
      integer_flag("--hidden-size", "Hidden size", at_least(1)),
      integer_flag("--ffn-hidden-size", "MLP hidden size (default 4 x hidden)", at_least(1)),
      integer_flag("--num-attention-heads", "Attention heads", at_least(1)),
      toggle_flag("--group-query-attention", "Use grouped-query attention"),
      integer_flag("--num-query-groups", "Key/value head groups (with --group-query-attention)", at_least(1)),
      integer_flag("--kv-channels", "Head dimension (default hidden / heads)", at_least(1)),
      integer_flag("--seq-length", "Sequence length (tokens per sample)", at_least(1)),
      integer_flag("--max-position-embeddings", "Learned position table size (default: the sequence length)",
                   at_least(1)),
      integer_flag("--vocab-size", "Vocabulary size (default: the data's or the preset's)", between(1, 2147483648.0L)),
      integer_flag("--make-vocab-size-divisible-by",
                   "Pad the vocabulary to a multiple of this, independent of TP (default 128)", at_least(1)),
      toggle_flag("--swiglu", "SwiGLU MLP"),
      text_flag("--normalization", "Normalisation layers", {"LayerNorm", "RMSNorm"}),
      real_flag("--norm-epsilon", "Normalisation epsilon", positive()),
      text_flag("--position-embedding-type", "Position embeddings", {"learned_absolute", "rope"}),
      real_flag("--rotary-base", "RoPE base", positive()),
      toggle_flag("--untie-embeddings-and-output-weights", "Separate output layer"),
      toggle_flag("--disable-bias-linear", "No biases in linear layers"),
      real_flag("--init-method-std", "Std of the normal initialisation", positive()),
      real_flag("--hidden-dropout", "Dropout after attention, MLP and embedding", between(0, 1, true)),
      real_flag("--attention-dropout", "Dropout on the attention probabilities, inside the fused kernel",
                between(0, 1, true)),
      // mixture of experts (Megatron's names and defaults; model/config.h holds the values)
      integer_flag("--num-experts", "Experts per MoE layer (default: none, every MLP dense)", at_least(1)),
      integer_flag("--moe-router-topk", "Experts each token is routed to (default 2)", at_least(1)),
      integer_flag("--moe-ffn-hidden-size", "Hidden size of each expert's SwiGLU MLP (default --ffn-hidden-size)",
                   at_least(1)),
      integer_flag("--moe-shared-expert-intermediate-size",
                   "Hidden size of the shared experts' MLP, run on every token (default: none)", at_least(1)),
      text_flag("--moe-layer-freq", "Which layers are MoE: N (layer i when i % N == 0; default 1), a list [1,0,1,...] "
                                    "or Python's ([0]*3+[1]*58)"),
      text_flag("--moe-router-score-function", "Router scores: softmax (Mixtral) or sigmoid (DeepSeek-V3)",
                {"softmax", "sigmoid"}),
      toggle_flag("--moe-router-pre-softmax",
                  "Softmax over all experts before the top-k, not renormalised (default: top-k on the logits, then "
                  "softmax over the k); no effect with sigmoid"),
      integer_flag("--moe-router-num-groups", "Group-limited routing: contiguous expert groups (default: none)",
                   at_least(1)),
      integer_flag("--moe-router-group-topk", "Group-limited routing: groups each token may use", at_least(1)),
      real_flag("--moe-router-topk-scaling-factor", "Multiplies the routing probabilities (default 1)", positive()),
      toggle_flag("--moe-router-enable-expert-bias",
                  "Aux-loss-free balancing: a per-expert bias added to the sigmoid scores for choosing only, moved "
                  "once per global batch towards the mean load"),
      real_flag("--moe-router-bias-update-rate", "Step of the expert bias update (default 1e-3)", at_least(0)),
      text_flag("--moe-router-dtype", "Precision of the router's logits and everything after them",
                {"fp32", "fp64"}, {"fp32"}),
      text_flag("--moe-router-load-balancing-type",
                "Auxiliary load-balancing loss: per micro-batch (aux_loss, the default), per sequence "
                "(seq_aux_loss), over the global batch (global_aux_loss, layout-dependent by design) or none",
                {"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"},
                {"aux_loss", "seq_aux_loss", "global_aux_loss", "none"}),
      real_flag("--moe-aux-loss-coeff", "Weight of the load-balancing loss (default 0)", at_least(0)),
      real_flag("--moe-z-loss-coeff", "Weight of the router z-loss (default: none)", at_least(0)),
      real_flag("--moe-expert-capacity-factor",
                "Capacity per expert as a multiple of the mean load; tokens over it are dropped (default: dropless)",
                positive()),
      text_flag("--moe-token-drop-policy",
                "Which tokens an over-capacity expert keeps: the highest probabilities (probs) or the earliest "
                "tokens (position)",
                {"probs", "position"}),
      toggle_flag("--moe-pad-expert-input-to-capacity", "Pad each expert's input to its capacity (needs a capacity "
                                                         "factor)"),
      toggle_flag("--moe-grouped-gemm", "One grouped GEMM over the local experts (default: a loop over them, "
                                        "Megatron's SequentialMLP; the same numbers)"),
      text_flag("--moe-token-dispatcher-type",
                "Token dispatcher: alltoall; allgather (Megatron's default) runs through the all-to-all dispatcher "
                "with identical numbers (the run record names the one asked for)",
                {"allgather", "alltoall", "flex"}, {"allgather", "alltoall"}),
      // multi-token prediction (Megatron's names and defaults; model/layers/mtp.h)
      integer_flag("--mtp-num-layers",
                   "Multi-token prediction depths after the decoder, each a layer like the last (default: none)",
                   at_least(1)),
      toggle_flag("--bert-no-binary-head",
                  "BERT without the sentence-order head (no token types, pooler or binary head; one segment per "
                  "sample, no sop loss)"),
      real_flag("--mtp-loss-scaling-factor",
                "Weight lambda of the MTP losses: lambda / depths x their sum joins the LM loss (default 0.1)",
                Range{}),
      // multi-latent attention (Megatron's names and defaults; model/layers/mla_attention.h)
      toggle_flag("--multi-latent-attention",
                  "DeepSeek's multi-latent attention: low-rank q and kv, a RoPE key shared by all heads"),
      integer_flag("--q-lora-rank", "MLA: rank of the compressed queries (default: none, queries not compressed)",
                   at_least(1)),
      integer_flag("--kv-lora-rank", "MLA: rank of the compressed keys and values (default 32)", at_least(1)),
      integer_flag("--qk-head-dim", "MLA: query/key head size without RoPE (default 128)", at_least(1)),
      integer_flag("--qk-pos-emb-head-dim", "MLA: query/key head size with RoPE (default 64)", at_least(1)),
      integer_flag("--v-head-dim", "MLA: value head size (default 128)", at_least(1)),
      toggle_flag("--qk-layernorm", "MLA: RMSNorm on the q and kv latents (with --multi-latent-attention only)"),
      text_flag("--rope-type",
                "RoPE variant: rope or yarn (multi-latent attention only, as Megatron; without the flag "
                "--multi-latent-attention takes Megatron's MLA default, yarn, which at --rotary-scaling-factor 1 "
                "rotates as RoPE)",
                {"rope", "yarn"}, {"rope", "yarn"}),
      real_flag("--rotary-scaling-factor",
                "YaRN: context extension factor (default 1); with MLA also its softmax scale "
                "(0.1 * --mscale-all-dim * ln factor + 1)^2 / sqrt(qk head dim)",
                positive()),
      real_flag("--mscale", "YaRN: mscale of the cos/sin concentration factor (default 1.0)", Range{}),
      real_flag("--mscale-all-dim", "YaRN: mscale_all_dim of the concentration factor and MLA's softmax scale (default 0.0)",
                Range{}),
      integer_flag("--yarn-original-max-position-embeddings",
                   "YaRN: the context length before extension (default 4096, Megatron-Core 0.16.1's fixed value)",
                   at_least(1)),
      real_flag("--yarn-beta-fast", "YaRN: rotations where the ramp starts (default 32)", positive()),
      real_flag("--yarn-beta-slow", "YaRN: rotations where the ramp ends (default 1)", positive()),
      // parallel
      integer_flag("--tensor-model-parallel-size", "Tensor-parallel degree (TP)", at_least(1)),
      integer_flag("--pipeline-model-parallel-size", "Pipeline stages (PP)", at_least(1)),
      integer_flag("--context-parallel-size", "Context-parallel degree (CP)", at_least(1)),
      integer_flag("--expert-model-parallel-size", "Expert-parallel degree (EP)", at_least(1)),
      integer_flag("--expert-tensor-parallel-size", "Tensor-parallel degree of the experts (default: TP)", at_least(1)),
      toggle_flag("--sequence-parallel", "Sequence parallelism in the TP group"),
      integer_flag("--num-layers-per-virtual-pipeline-stage", "Layers per virtual pipeline stage (interleaving)",
                   at_least(1)),
      integer_flag("--num-virtual-stages-per-pipeline-rank", "Virtual pipeline stages per rank (interleaving)",
                   at_least(1)),
      integer_flag("--decoder-first-pipeline-num-layers", "Layers on the first pipeline stage (uneven split)",
                   at_least(1)),
      integer_flag("--decoder-last-pipeline-num-layers", "Layers on the last pipeline stage (uneven split)",
                   at_least(1)),
      integer_flag("--microbatch-group-size-per-virtual-pipeline-stage",
                   "Micro-batches per group of the interleaved schedule (default: PP)", at_least(1)),
      toggle_flag("--use-distributed-optimizer", "Shard optimizer states over data-parallel ranks (ZeRO-1)"),
      toggle_flag("--overlap-grad-reduce",
                  "Overlap the grad reduction with backward (Megatron-FSDP: each unit's reduce-scatter with the next "
                  "unit's backward)"),
      toggle_flag("--overlap-param-gather", "Overlap the parameter all-gather with forward"),
      integer_flag("--ddp-bucket-size", "Elements per data-parallel grad bucket", at_least(1)),
      // Megatron-FSDP (issue 25)
      toggle_flag("--use-megatron-fsdp",
                  "Megatron-FSDP: --data-parallel-sharding-strategy decides what DP x CP shards (units: one "
                  "transformer layer each, a MoE layer's experts their own over expert-DP, the root the "
                  "embedding and the head)"),
      toggle_flag("--use-custom-fsdp", "Deprecated alias of --use-megatron-fsdp (with Megatron's warning)"),
      text_flag("--data-parallel-sharding-strategy",
                "With --use-megatron-fsdp: no_shard (plain DP), optim (the distributed optimizer), optim_grads "
                "(+ grads reduce-scattered per unit), optim_grads_params (+ parameters gathered per unit; default)",
                {"no_shard", "optim", "optim_grads", "optim_grads_params"}),
      toggle_flag("--no-fsdp-prefetch",
                  "With optim_grads_params: gather each unit only when it is used, without starting the next "
                  "unit's gather early (mt's own flag; Megatron-FSDP always prefetches)"),
      integer_flag("--num-distributed-optimizer-instances",
                   "Hybrid sharding: refused above 1 (mt shards over the whole DP x CP group)", at_least(1)),
      text_flag("--outer-dp-sharding-strategy", "Hybrid sharding's outer strategy: refused (no hybrid sharding)",
                {"no_shard", "optim"}),
      // training
      integer_flag("--micro-batch-size", "Samples per micro-batch", at_least(1)),
      integer_flag("--global-batch-size", "Samples per step (default: the micro-batch; micro-batches accumulate)",
                   at_least(1)),
      integer_flag("--train-iters", "Iterations to train", positive()),
      integer_flag("--train-samples", "Samples to train (instead of --train-iters)", positive()),
      real_flag("--lr", "Peak learning rate", at_least(0)),
      real_flag("--min-lr", "Learning rate at the end of the decay", at_least(0)),
      text_flag("--lr-decay-style", "Decay after the warm-up", {"constant", "linear", "cosine"}),
      integer_flag("--lr-warmup-iters", "Warm-up iterations", at_least(0)),
      integer_flag("--lr-warmup-samples", "Warm-up samples", at_least(0)),
      real_flag("--lr-warmup-fraction", "Warm-up as a fraction of the decay", between(0, 1)),
      integer_flag("--lr-decay-iters", "Decay iterations (default: the run)", at_least(1)),
      integer_flag("--lr-decay-samples", "Decay samples (default: the run)", at_least(1)),
      real_flag("--weight-decay", "AdamW decoupled weight decay (not on biases and norms)", at_least(0)),
      real_flag("--adam-beta1", "AdamW beta1", between(0, 1, true)),
      real_flag("--adam-beta2", "AdamW beta2", between(0, 1, true)),
      real_flag("--adam-eps", "AdamW epsilon", positive()),
      real_flag("--clip-grad", "Clip the global grad norm to this (0: off)", at_least(0)),
      toggle_flag("--bf16", "bf16 GEMM inputs, fp32 master weights"),
      toggle_flag("--fp16", "fp16 GEMM inputs with loss scaling"),
      // FP8 (issue 23): Transformer Engine's delayed scaling on the decoder layers' linears
      text_flag("--fp8-format",
                "FP8 linears in the transformer layers (with --bf16/--fp16): e4m3 everywhere, or hybrid (e5m2 grads)",
                {"e4m3", "hybrid"}),
      text_flag("--fp8-recipe", "FP8 scaling recipe (delayed only; tensorwise, mxfp8, blockwise are refused)",
                {"delayed", "tensorwise", "mxfp8", "blockwise"}),
      integer_flag("--fp8-margin", "Scale = FP8 max / amax / 2^margin", at_least(0)),
      integer_flag("--fp8-amax-history-len", "Steps of amax history per FP8 tensor", at_least(1)),
      text_flag("--fp8-amax-compute-algo", "Amax a scale comes from: the most recent, or the max of the history",
                {"most_recent", "max"}),
      toggle_flag("--fp8-param-gather", "Refused: FP8 parameter all-gather is not supported"),
      toggle_flag("--first-last-layers-bf16",
                  "With --fp8-format: the first and last transformer layers' linears stay in --bf16/--fp16"),
      integer_flag("--num-layers-at-start-in-bf16", "Layers at the start kept out of FP8 (default 1)", at_least(0)),
      integer_flag("--num-layers-at-end-in-bf16", "Layers at the end kept out of FP8 (default 1)", at_least(0)),
      toggle_flag("--no-fp8-wgrad", "With --fp8-format: weight-gradient GEMMs in --bf16/--fp16, not FP8"),
      real_flag("--loss-scale", "Static loss scale for --fp16 (default: dynamic)", positive()),
      real_flag("--initial-loss-scale", "Dynamic scaler's start", positive()),
      real_flag("--min-loss-scale", "Dynamic scaler's floor", positive()),
      integer_flag("--loss-scale-window", "Clean steps before the scale doubles", at_least(1)),
      integer_flag("--hysteresis", "Overflows before the scale halves", at_least(1)),
      toggle_flag("--calculate-per-token-loss", "Normalise the loss by all tokens of the step, not per micro-batch"),
      toggle_flag(
          "--check-for-nan-in-loss-and-grad",
          "Stop with an error naming the iteration on a NaN/Inf loss or grad outside fp16 loss scaling (the default)"),
      toggle_flag("--no-check-for-nan-in-loss-and-grad",
                  "Skip and count (nan_iters) steps with a NaN/Inf loss or grad instead of stopping"),
      integer_flag("--max-consecutive-skipped-iters",
                   "Stop after this many steps in a row skipped (fp16 overflow at a loss scale that cannot go "
                   "lower, or --no-check-for-nan-in-loss-and-grad); 0: never (mt's own)",
                   at_least(0)),
      text_flag("--recompute-granularity", "Activation recompute: full, or selective (core attention)",
                {"full", "selective"}),
      text_flag("--recompute-method", "With full recompute: uniform chunks or a block of layers", {"uniform", "block"}),
      integer_flag("--recompute-num-layers", "Layers per chunk (uniform) or recomputed (block)", at_least(1)),
      // numpy's RandomState (Megatron's shuffles) takes seeds below 2^32.
      integer_flag("--seed", "Seed of initialisation, dropout, mock data and the data shuffles",
                   between(0, 4294967295.0L)),
      integer_flag("--log-interval", "Iterations between log lines on stderr", at_least(1)),
      toggle_flag("--log-throughput", "Add Megatron's 'throughput per GPU (TFLOP/s/GPU)' to the log line"),
      toggle_flag("--moe-per-layer-logging",
                  "Each MoE layer's aux and z-loss values in the step record and TensorBoard (moe/<name>_layer_<i>), "
                  "besides their mean over the layers"),
      integer_flag("--eval-interval", "Iterations between evaluations", at_least(1)),
      integer_flag("--eval-iters", "Global batches per evaluation (0: none)", at_least(0)),
      real_flag("--peak-tflops",
                "Dense peak TFLOP/s per device (or CPU rank) for MFU (default: this CPU's register-only FMA probe "
                "over the cores a rank uses)",
                positive()),
      text_flag("--flops-convention", "FLOPs convention of TFLOP/s and MFU (docs/accounting.md)",
                {"megatron", "megatron-2024", "narayanan", "6N", "6N+12LCT", "6N+6LCT"}),
      // data
      list_flag(
          "--data-path",
          "Token datasets: PREFIX (X.h5 or X.bin/.idx), PREFIX..., or a weighted blend W1 PREFIX1 W2 PREFIX2 ..."),
      list_flag("--train-data-path", "Training split's datasets (instead of --data-path and --split)"),
      list_flag("--valid-data-path", "Validation split's datasets"),
      list_flag("--test-data-path", "Test split's datasets"),
      text_flag("--split", "Train/valid/test proportions of each --data-path dataset, in sequences"),
      text_flag("--data-cache-path",
                "Directory of md5-named sample indices (default PREFIX/cache/GPTDataset_indices of the first dataset)"),
      toggle_flag("--mock-data", "Deterministic synthetic tokens"),
      text_flag("--byte-data", "Train on a text file's UTF-8 bytes (vocabulary 256)"),
      text_flag("--save-init", "Write the initial parameters (HDF5 checkpoint layout)"),
      text_flag("--save-final", "Write the final parameters (HDF5 checkpoint layout)"),
      toggle_flag("--force", "Overwrite an existing output that is not this run's own earlier output (an input is "
                             "never overwritten, a --save tracker never moves backwards)"),
      toggle_flag("--eod-mask-loss", "No loss where the input token is end-of-document"),
      toggle_flag("--reset-position-ids", "Positions restart after each end-of-document"),
      toggle_flag("--reset-attention-mask", "Attention stays inside each document (end-of-document boundaries)"),
      // checkpoints
      text_flag("--save", "Checkpoint directory: DIR/iter_NNNNNNN/checkpoint.h5 every --save-interval iterations, at "
                          "the end and on a signal; DIR/latest_checkpointed_iteration.txt names the newest"),
      text_flag("--ckpt-format",
                "Megatron's checkpoint format: fsdp_dtensor accepted with --use-megatron-fsdp (mt writes its own "
                "layout-independent HDF5 checkpoints either way); the others are not supported",
                {"torch", "torch_dist", "torch_dcp", "fsdp_dtensor"}, {"fsdp_dtensor"}),
      integer_flag("--save-interval", "Iterations between checkpoints (default: only at the end and on a signal)",
                   at_least(1)),
      text_flag("--load", "Checkpoint to resume from: a --save directory (the iteration its tracker names), an "
                                "iter_NNNNNNN directory or a checkpoint file; with --finetune also a parameters-only "
                                "file (mt-ckpt import/convert, --save-final). No checkpoint there is an error unless "
                                "it is the --save directory (then a fresh start)"),
      toggle_flag("--finetune", "Load the parameters only and start at iteration 0 with a fresh optimizer"),
      toggle_flag("--no-load-optim", "Do not load the optimizer state (Adam moments and step, fp16 loss scaler)"),
      toggle_flag("--no-save-optim", "Do not save the optimizer state (such a checkpoint resumes only with "
                                     "--no-load-optim or --finetune)"),
      toggle_flag("--no-load-rng", "Keep the command line's --seed (mt's randomness is keyed by the seed alone; "
                                   "by default the checkpoint's seed is used)"),
      toggle_flag("--exit-on-missing-checkpoint",
                  "With --load: an error, not a fresh start, when the directory has no checkpoint"),
      // issue 28 W3: Megatron's OptimizerParamScheduler on resume
      toggle_flag("--override-opt_param-scheduler",
                  "With --load: continue on this run's LR schedule (--lr, --min-lr, --lr-decay-style, warm-up, "
                  "decay, --weight-decay, --train-iters x --global-batch-size) where the checkpoint's differs "
                  "(by default a difference is refused, naming each field)"),
      toggle_flag("--use-checkpoint-opt_param-scheduler",
                  "With --load: continue on the checkpoint's LR schedule, ignoring this run's schedule flags (the "
                  "run's length stays --train-iters)"),
      // tokenizer
      text_flag("--tokenizer-type", "Tokenizer",
                {"GPT2BPETokenizer", "TikTokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer",
                 "GPTSentencePieceTokenizer", "Llama2Tokenizer", "BertWordPieceLowerCase", "BertWordPieceCase"}),
      text_flag("--vocab-file", "GPT2BPETokenizer: encoder.json; BertWordPieceLowerCase/BertWordPieceCase: vocab.txt"),
      text_flag("--merge-file", "GPT2BPETokenizer: vocab.bpe"),
      text_flag("--tokenizer-model",
                "TikTokenizer: a tiktoken rank file (cl100k_base.tiktoken, LLaMA-3 tokenizer.model) or Megatron's "
                "TikTokenizer JSON; HuggingFaceTokenizer: tokenizer.json; SentencePieceTokenizer, "
                "GPTSentencePieceTokenizer, Llama2Tokenizer: a SentencePiece BPE .model"),
      text_flag("--tiktoken-pattern", "TikTokenizer pre-tokenizer: Megatron's patterns (default: the file's own)",
                {"v1", "v2"}),
      integer_flag("--tiktoken-num-special-tokens",
                   "Megatron TikTokenizer JSON: special ids placed before the vocabulary", at_least(0)),
      toggle_flag("--tokenizer-hf-no-include-special-tokens",
                  "HuggingFaceTokenizer: leave out the special tokens of tokenizer.json's post-processor template "
                  "(e.g. LLaMA-3's BOS; BertWordPiece*: [CLS] and [SEP]), which every sequence gets by default, "
                  "as in Megatron"),
      // the backend (add_device_flag checks the value)
      text_flag("--device", "Backend to run on: cpu, or cuda (one GPU per rank; needs a build with the CUDA "
                            "backend and a GPU); a GPU model for peak figures is --peak-device"),
      // mt-train's plan and planned stops (issue 24)
      toggle_flag("--dry-run", "Check the run for --world-size ranks in one process without MPI and print its plan "
                               "(exit 0: it would run, 2: it would not)"),
      integer_flag("--exit-interval", "Stop after an iteration that is a multiple of this, saving with --save "
                                      "(Megatron's)", at_least(1)),
      real_flag("--exit-duration-in-mins", "Stop after the first iteration that ends this many minutes after the "
                                           "process started, saving with --save (Megatron's)", positive()),
      // the accounting tools (mt-mfu, mt-memreport)
      integer_flag("--world-size", "Ranks a launcher would start (the data-parallel size follows from it)", at_least(1)),
      text_flag("--from-log", "mt-train's JSONL records (- for stdin): the run's configs and its measured steps"),
      list_flag("--sweep", "FLAG=a,b,c: one record per value (repeat for every combination)"),
      real_flag("--step-time", "Seconds per iteration (Megatron's log prints milliseconds)", positive()),
      text_flag("--peak-device",
                "Accelerator of the dense peak table (perf/peak.h: h100, a100, ...) whose peak MFU divides by, "
                "instead of this CPU's FMA probe"),
      text_flag("--predict", "Predict step time and MFU on this cluster (study/predict.h)"),
      text_flag("--plan", "Rank the layouts that fit --world-size devices of this cluster by predicted throughput"),
      integer_flag("--top", "Layouts --plan prints", at_least(1)),
      text_flag("--memory-estimate", "Memory --plan checks layouts with: mt's engine or Megatron's formula",
                {"mt", "megatron"}),
      // Megatron options whose default (or common) value is what mt always does: accepted with
      // that value, so Megatron's scripts run; any other value is refused as not supported yet.
      text_flag("--dataset-impl", "Legacy dataset reader: mt memory-maps .bin/.idx (mmap; infer finds the same)",
                {"mmap", "infer", "lazy", "cached"}, {"mmap", "infer"}),
      text_flag("--dataloader-type", "Sampler: Megatron's MegatronPretrainingSampler (single)",
                {"single", "cyclic", "external"}, {"single"}),
      text_flag("--optimizer", "Optimizer: AdamW (Megatron's adam)", {"adam", "sgd"}, {"adam"}),
      text_flag("--transformer-impl", "Layer implementation: mt's own kernels (local)", {"local", "transformer_engine"},
                {"local"}),
      toggle_flag("--use-mcore-models", "Accepted: mt's model is Megatron-Core's GPT model"),
      toggle_flag("--use-flash-attn", "Accepted: mt's attention is always one fused (flash-style) kernel"),
      toggle_flag("--attention-softmax-in-fp32", "Accepted: mt's softmax is always fp32"),
      toggle_flag("--accumulate-allreduce-grads-in-fp32", "Accepted: mt's gradients are always fp32"),
      toggle_flag(
          "--exit-signal-handler",
          "Accepted: mt-train always stops cleanly on SIGTERM, SIGINT, SIGHUP and SIGUSR1 (Megatron's is opt-in)"),
  };
  for (const auto& spec : table) {
    if (spec.name == name) return spec;
  }
  throw std::logic_error("flag " + std::string(name) + " is not in the table of tools/common/flags.cpp");
}

// Megatron flags mt has no implementation of yet. Flags mt parses but does not run with every
// value are not here: they are parsed with their ranges and refused by value in the one list of
// what mt-train does not run yet (train/supported.h), so degree 1 works today.
void refuse_unimplemented_megatron_flags(int argc, char** argv) {
  static const std::set<std::string> flags{
      "--virtual-pipeline-model-parallel-size", "--moe-router-force-load-balancing", "--moe-input-jitter-eps",
      "--moe-shared-expert-overlap", "--moe-shared-expert-gate", "--moe-permute-fusion", "--moe-router-fusion",
      "--moe-use-legacy-grouped-gemm", "--moe-extended-tp", "--moe-use-upcycling", "--moe-layer-recompute",
      "--rampup-batch-size", "--data-args-path", "--per-split-data-args-path",
      "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--full-validation",
      "--mid-level-dataset-surplus", "--num-dataset-builder-threads", "--object-storage-cache-path",
      "--s3-cache-path", "--fp8", "--distributed-backend", "--wandb-project", "--no-position-embedding",
      "--use-rotary-position-embeddings", "--apply-query-key-layer-scaling", "--num-workers", "--sgd-momentum",
      "--use-checkpoint-args",
      "--rotary-percent", "--rope-scaling", "--use-rope-scaling", "--start-weight-decay", "--end-weight-decay",
      "--weight-decay-incr-style", "--lr-wsd-decay-style", "--lr-wsd-decay-samples", "--lr-wsd-decay-iters",
      "--tp-comm-overlap",
      "--cp-comm-type", "--recompute-modules"};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (auto eq = arg.find('='); eq != std::string::npos) arg.resize(eq);
    if (flags.count(arg)) throw UsageError(arg, "Megatron flag not supported yet");
    if (arg == "--use-torch-fsdp2") {
      throw UsageError(arg, "not supported (torch FSDP2 is not mt's: use --use-megatron-fsdp)");
    }
  }
}

}  // namespace mt::tools
