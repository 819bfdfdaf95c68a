// TrainConfig as JSON (see trainer.h). Tested in tests/unit/train/test_train_config.cpp.
#include <string>
#include <utility>

#include "core/json_fields.h"
#include "train/trainer.h"

namespace mt::train {
namespace {

// The names of the enums, each once: written by to_json, read back by train_config_from_json.
const std::pair<optim::LrDecayStyle, const char*> kDecayStyles[] = {{optim::LrDecayStyle::constant, "constant"},
                                                                    {optim::LrDecayStyle::linear, "linear"},
                                                                    {optim::LrDecayStyle::cosine, "cosine"}};
const std::pair<Precision, const char*> kPrecisions[] = {
    {Precision::fp32, "fp32"}, {Precision::bf16, "bf16"}, {Precision::fp16, "fp16"}};
const std::pair<model::RecomputeGranularity, const char*> kGranularities[] = {  // none is null
    {model::RecomputeGranularity::selective, "selective"},
    {model::RecomputeGranularity::full, "full"}};
const std::pair<model::RecomputeMethod, const char*> kMethods[] = {{model::RecomputeMethod::uniform, "uniform"},
                                                                   {model::RecomputeMethod::block, "block"}};
using perf::FlopsConvention;
const std::pair<FlopsConvention, const char*> kConventions[] = {
    {FlopsConvention::megatron, perf::convention_name(FlopsConvention::megatron)},
    {FlopsConvention::megatron_2024, perf::convention_name(FlopsConvention::megatron_2024)},
    {FlopsConvention::narayanan, perf::convention_name(FlopsConvention::narayanan)},
    {FlopsConvention::six_n, perf::convention_name(FlopsConvention::six_n)},
    {FlopsConvention::six_n_attention, perf::convention_name(FlopsConvention::six_n_attention)},
    {FlopsConvention::six_n_causal_attention, perf::convention_name(FlopsConvention::six_n_causal_attention)}};

// Every field once, with Megatron's argument name (core/json_fields.h).
template <typename Visit, typename Config>
void visit_fields(Visit& visit, Config& c) {
  visit("micro_batch_size", c.micro_batch_size);
  visit("global_batch_size", c.global_batch_size);
  visit("train_iters", c.train_iters);
  visit("train_samples", c.train_samples);
  visit("lr", c.lr);
  visit("min_lr", c.min_lr);
  visit("lr_decay_style", c.lr_decay_style, kDecayStyles);
  visit("lr_warmup_iters", c.lr_warmup_iters);
  visit("lr_warmup_samples", c.lr_warmup_samples);
  visit("lr_warmup_fraction", c.lr_warmup_fraction);  // null: unset
  visit("lr_decay_iters", c.lr_decay_iters);
  visit("lr_decay_samples", c.lr_decay_samples);
  visit("weight_decay", c.adam.weight_decay);
  visit("adam_beta1", c.adam.beta1);
  visit("adam_beta2", c.adam.beta2);
  visit("adam_eps", c.adam.eps);
  visit("clip_grad", c.clip_grad);
  visit("precision", c.precision, kPrecisions);
  visit("loss_scale", c.loss_scale);  // null: dynamic
  visit("initial_loss_scale", c.initial_loss_scale);
  visit("min_loss_scale", c.min_loss_scale);
  visit("loss_scale_window", c.loss_scale_window);
  visit("hysteresis", c.hysteresis);
  visit("calculate_per_token_loss", c.calculate_per_token_loss);
  visit("check_for_nan_in_loss_and_grad", c.check_for_nan_in_loss_and_grad);
  visit("max_consecutive_skipped_iters", c.max_consecutive_skipped_iters);
  visit("log_interval", c.log_interval);
  visit("log_throughput", c.log_throughput);
  visit("eval_interval", c.eval_interval);
  visit("eval_iters", c.eval_iters);
  visit("seed", c.seed);
  visit("recompute_granularity", c.recompute.granularity, kGranularities);
  visit("recompute_method", c.recompute.method, kMethods);
  visit("recompute_num_layers", c.recompute.num_layers);
  visit("peak_flops_per_second", c.peak_flops_per_second);
  visit("flops_convention", c.flops_convention, kConventions);
}

}  // namespace

nlohmann::ordered_json to_json(const TrainConfig& c) {
  TrainConfig resolved = c;
  if (resolved.global_batch_size <= 0) resolved.global_batch_size = resolved.micro_batch_size;
  JsonWriter writer;
  visit_fields(writer, resolved);
  // Sentinels are written as Megatron's None.
  if (c.lr_warmup_fraction < 0) writer.json()["lr_warmup_fraction"] = nullptr;
  if (c.loss_scale <= 0) writer.json()["loss_scale"] = nullptr;
  return writer.json();
}

TrainConfig train_config_from_json(const nlohmann::json& json) {
  TrainConfig c;
  JsonFields fields(json, "training config");
  visit_fields(fields, c);
  fields.finish();
  validate_train_config(c);
  return c;
}

}  // namespace mt::train
