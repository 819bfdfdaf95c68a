// Flags defined once (tools/common/flags.h): every group defines against the table, values outside
// a range are refused while parsing with one short line that says the range (issue 11 cases 6, 7,
// 13, 14), the groups' configs follow Megatron's defaults (the MoE flags included), values mt-train
// does not implement are refused by name (case 18), and --device names the backend, never a GPU
// model.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/common/flags.h"
#include "train/supported.h"

using namespace mt::tools;

namespace {

// mt-train's refusal of what it does not run yet (train/supported.h), for a dense model.
void check_supported_dense(const mt::parallel::ParallelConfig& parallel) {
  mt::train::check_supported(mt::model::preset("tiny-gpt"), parallel);
}

}  // namespace

namespace {

// Parses `args` with every group defined; returns CLI11's error text ("" when accepted).
struct AllFlags {
  ModelFlags model;
  mt::parallel::ParallelConfig parallel;
  TrainingFlags training;
  DataPathFlags data;
  MegatronCompatFlags compat;
  CheckpointFlags checkpoint;
  mt::text::TokenizerOptions tokenizer;
};

std::string parse_error(const std::vector<std::string>& args, AllFlags* flags = nullptr) {
  AllFlags local;
  AllFlags& f = flags ? *flags : local;
  CLI::App app("test", "test");
  add_model_flags(app, f.model);
  add_parallel_flags(app, f.parallel);
  add_training_flags(app, f.training);
  add_data_path_flags(app, f.data);
  add_megatron_compat_flags(app, f.compat, "compat");
  add_checkpoint_flags(app, f.checkpoint);
  add_tokenizer_flags(app, f.tokenizer, false);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Range, DescribesItselfAsTheErrorSays) {
  EXPECT_EQ(at_least(1).describe(), "at least 1");
  EXPECT_EQ(positive().describe(), "positive");
  EXPECT_EQ(between(0, 1, true).describe(), "in [0, 1)");
  EXPECT_EQ(between(0, 4294967295.0L).describe(), "in [0, 4294967295]");
  EXPECT_EQ(Range{}.describe(), "a finite number");
  EXPECT_FALSE(positive().contains(0));
  EXPECT_TRUE(positive().contains(1e-30L));
  EXPECT_FALSE(at_least(0).contains(std::numeric_limits<long double>::quiet_NaN()));
}

TEST(Flags, EveryGroupDefinesFromTheTable) { EXPECT_EQ(parse_error({}), ""); }

TEST(Flags, Issue11Case13RangeErrorsAreOneShortLineThatSaysTheRange) {
  EXPECT_EQ(parse_error({"--num-layers", "0"}), "--num-layers: must be at least 1 (got 0)");
  EXPECT_EQ(parse_error({"--num-layers", "x"}), "--num-layers: must be an integer, at least 1 (got x)");
  EXPECT_EQ(parse_error({"--num-layers", "1.5"}), "--num-layers: must be an integer, at least 1 (got 1.5)");
  EXPECT_EQ(parse_error({"--num-layers", "99999999999"}), "--num-layers: must be at most 2147483647 (got 99999999999)");
  EXPECT_EQ(parse_error({"--normalization", "BatchNorm"}),
            "--normalization: must be one of LayerNorm, RMSNorm (got BatchNorm)");
  EXPECT_EQ(parse_error({"--tokenizer-type", "X"}),
            "--tokenizer-type: must be one of GPT2BPETokenizer, TikTokenizer, HuggingFaceTokenizer, "
            "SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, BertWordPieceLowerCase, "
            "BertWordPieceCase (got X)");
  const FlagSpec workers = integer_flag("--workers", "threads", at_least(1));
  EXPECT_EQ(value_error(workers, "0"), "must be at least 1 (got 0)");
  EXPECT_EQ(value_error(workers, "1"), "");
}

TEST(Flags, Issue11Case14IterationAndSampleCountsMustBePositive) {
  for (const char* value : {"0", "-5"}) {
    EXPECT_EQ(parse_error({"--train-iters", value}),
              std::string("--train-iters: must be positive (got ") + value + ")");
  }
  EXPECT_EQ(parse_error({"--train-samples", "0"}), "--train-samples: must be positive (got 0)");
}

TEST(Flags, Issue11Case6RealFlagsRefuseNanInfAndMeaninglessValues) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--lr", "nan"}, "--lr: must be a finite number, at least 0 (got nan)"},
      {{"--lr", "inf"}, "--lr: must be a finite number, at least 0 (got inf)"},
      {{"--lr", "-1"}, "--lr: must be at least 0 (got -1)"},
      {{"--weight-decay", "nan"}, "--weight-decay: must be a finite number, at least 0 (got nan)"},
      {{"--init-method-std", "nan"}, "--init-method-std: must be a finite number, positive (got nan)"},
      {{"--init-method-std", "0"}, "--init-method-std: must be positive (got 0)"},
      {{"--rotary-base", "-1"}, "--rotary-base: must be positive (got -1)"},
      {{"--initial-loss-scale", "nan"}, "--initial-loss-scale: must be a finite number, positive (got nan)"},
      {{"--lr-warmup-fraction", "nan"}, "--lr-warmup-fraction: must be a finite number, in [0, 1] (got nan)"},
      {{"--lr-warmup-fraction", "1.5"}, "--lr-warmup-fraction: must be in [0, 1] (got 1.5)"},
      {{"--adam-beta2", "1"}, "--adam-beta2: must be in [0, 1) (got 1)"},
      {{"--adam-eps", "0"}, "--adam-eps: must be positive (got 0)"},
      {{"--clip-grad", "-inf"}, "--clip-grad: must be a finite number, at least 0 (got -inf)"},
      {{"--norm-epsilon", "inf"}, "--norm-epsilon: must be a finite number, positive (got inf)"},
      {{"--hidden-dropout", "1"}, "--hidden-dropout: must be in [0, 1) (got 1)"},
      {{"--min-loss-scale", "0"}, "--min-loss-scale: must be positive (got 0)"},
      {{"--loss-scale", "-2"}, "--loss-scale: must be positive (got -2)"},
      {{"--min-lr", "nan"}, "--min-lr: must be a finite number, at least 0 (got nan)"},
      {{"--peak-tflops", "nan"}, "--peak-tflops: must be a finite number, positive (got nan)"},
      {{"--norm-epsilon", "1e39"}, "--norm-epsilon: must be at most 3.4028234663852886e+38 (got 1e39)"},
  };
  for (const auto& [args, expected] : cases) EXPECT_EQ(parse_error(args), expected);
}

TEST(Flags, Issue11Case7ZeroCountsPeaksAndSeedsOutsideUint32AreRefused) {
  EXPECT_EQ(parse_error({"--global-batch-size", "0"}), "--global-batch-size: must be at least 1 (got 0)");
  EXPECT_EQ(parse_error({"--num-query-groups", "0"}), "--num-query-groups: must be at least 1 (got 0)");
  EXPECT_EQ(parse_error({"--ffn-hidden-size", "0"}), "--ffn-hidden-size: must be at least 1 (got 0)");
  EXPECT_EQ(parse_error({"--peak-tflops", "0"}), "--peak-tflops: must be positive (got 0)");
  EXPECT_EQ(parse_error({"--peak-tflops", "-1"}), "--peak-tflops: must be positive (got -1)");
  EXPECT_EQ(parse_error({"--seed", "-1"}), "--seed: must be in [0, 4294967295] (got -1)");
  EXPECT_EQ(parse_error({"--seed", "4294967296"}), "--seed: must be in [0, 4294967295] (got 4294967296)");
  AllFlags f;
  EXPECT_EQ(parse_error({"--seed", "4294967295"}, &f), "");
  EXPECT_EQ(f.training.config.seed, 4294967295u);
}

TEST(Flags, Issue11Case18MegatronDefaultsAreAcceptedAndOtherValuesRefusedByName) {
  AllFlags f;
  EXPECT_EQ(parse_error({"--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
                         "--context-parallel-size", "1", "--dataset-impl", "mmap", "--log-throughput",
                         "--transformer-impl", "local", "--use-mcore-models", "--exit-signal-handler"},
                        &f),
            "");
  EXPECT_NO_THROW(check_supported_dense(f.parallel));
  EXPECT_TRUE(f.training.config.log_throughput);
  EXPECT_EQ(parse_error({"--dataset-impl", "lazy"}),
            "--dataset-impl: lazy is not supported yet (mt implements mmap, infer)");
  EXPECT_EQ(parse_error({"--transformer-impl", "transformer_engine"}),
            "--transformer-impl: transformer_engine is not supported yet (mt implements local)");
  EXPECT_EQ(parse_error({"--tensor-model-parallel-size", "0"}),
            "--tensor-model-parallel-size: must be at least 1 (got 0)");
  // Tensor, sequence and data parallelism (issue 12) and pipeline parallelism with virtual and
  // uneven stages (issue 13) run; the rest is refused by name.
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--tensor-model-parallel-size", "2", "--sequence-parallel"},
                                             {"--use-distributed-optimizer", "--overlap-grad-reduce"},
                                             {"--use-distributed-optimizer", "--overlap-grad-reduce",
                                              "--overlap-param-gather"},
                                             {"--pipeline-model-parallel-size", "4",
                                              "--num-layers-per-virtual-pipeline-stage", "2",
                                              "--microbatch-group-size-per-virtual-pipeline-stage", "4"},
                                             {"--pipeline-model-parallel-size", "4",
                                              "--num-virtual-stages-per-pipeline-rank", "2",
                                              "--decoder-first-pipeline-num-layers", "1",
                                              "--decoder-last-pipeline-num-layers", "1"},
                                             {"--ddp-bucket-size", "1000", "--expert-tensor-parallel-size", "1"},
                                             {"--expert-model-parallel-size", "8", "--expert-tensor-parallel-size", "2"},
                                             {"--context-parallel-size", "2", "--sequence-parallel"}}) {
    AllFlags g;
    ASSERT_EQ(parse_error(args, &g), "");
    EXPECT_NO_THROW(check_supported_dense(g.parallel)) << args[0];
  }
  // Mixture-of-experts values mt does not run are refused by name while parsing.
  EXPECT_EQ(parse_error({"--moe-router-dtype", "fp64"}), "--moe-router-dtype: fp64 is not supported yet (mt implements fp32)");
  EXPECT_EQ(parse_error({"--moe-token-dispatcher-type", "flex"}),
            "--moe-token-dispatcher-type: flex is not supported yet (mt implements allgather, alltoall)");
  EXPECT_EQ(parse_error({"--moe-router-load-balancing-type", "sinkhorn"}),
            "--moe-router-load-balancing-type: sinkhorn is not supported yet (mt implements aux_loss, seq_aux_loss, "
            "global_aux_loss, none)");
  char arg0[] = "mt-train", fp8[] = "--fp8=hybrid";
  char* argv[] = {arg0, fp8};
  try {
    refuse_unimplemented_megatron_flags(2, argv);
    ADD_FAILURE() << "--fp8 accepted";
  } catch (const mt::UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--fp8: Megatron flag not supported yet");
  }
}

TEST(Flags, ModelFlagsOverrideThePresetWithMegatronDefaults) {
  AllFlags f;
  ASSERT_EQ(parse_error({"--model", "tiny-gpt", "--hidden-size", "96", "--num-attention-heads", "6"}, &f), "");
  const mt::model::ModelConfig c = model_config(f.model);
  EXPECT_EQ(c.name, "tiny-gpt");
  EXPECT_EQ(c.hidden_size, 96);
  EXPECT_EQ(c.num_query_groups, 6);  // heads changed, no GQA: one group per head
  EXPECT_EQ(c.kv_channels, 16);
  EXPECT_EQ(c.ffn_hidden_size, 256);  // the preset's, not 4 x the new hidden
  AllFlags g;
  ASSERT_EQ(
      parse_error({"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "8"}, &g),
      "");
  const mt::model::ModelConfig custom = model_config(g.model);
  EXPECT_EQ(custom.name, "custom");
  EXPECT_EQ(custom.ffn_hidden_size, 128);
  EXPECT_EQ(custom.max_position_embeddings, 8);
  AllFlags h;
  ASSERT_EQ(parse_error({"--model", "tiny-gpt", "--num-query-groups", "2"}, &h), "");
  EXPECT_THROW(model_config(h.model), mt::UsageError);  // needs --group-query-attention
}

TEST(Flags, MoeFlagsSetTheModelConfigWithMegatronNames) {
  AllFlags f;
  ASSERT_EQ(parse_error({"--model", "tiny-gpt", "--swiglu", "--num-experts", "8", "--moe-router-topk", "4",
                         "--moe-ffn-hidden-size", "48", "--moe-shared-expert-intermediate-size", "32",
                         "--moe-layer-freq", "([0]*1+[1]*1)", "--moe-router-score-function", "sigmoid",
                         "--moe-router-num-groups", "4", "--moe-router-group-topk", "2",
                         "--moe-router-topk-scaling-factor", "2.5", "--moe-router-enable-expert-bias",
                         "--moe-router-bias-update-rate", "0.01", "--moe-router-dtype", "fp32",
                         "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-4",
                         "--moe-z-loss-coeff", "1e-3", "--moe-expert-capacity-factor", "1.5",
                         "--moe-token-drop-policy", "position", "--moe-pad-expert-input-to-capacity",
                         "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall", "--moe-per-layer-logging"},
                        &f),
            "");
  const mt::model::ModelConfig c = model_config(f.model);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.moe_router_topk, 4);
  EXPECT_EQ(c.moe_ffn_hidden_size, 48);
  EXPECT_EQ(c.moe_shared_expert_intermediate_size, 32);
  EXPECT_EQ(c.moe_layer_pattern, (std::vector<int>{0, 1}));
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_EQ(c.moe_router_score_function, mt::model::MoeScoreFunction::sigmoid);
  EXPECT_EQ(c.moe_router_num_groups, 4);
  EXPECT_EQ(c.moe_router_group_topk, 2);
  EXPECT_EQ(c.moe_router_topk_scaling_factor, 2.5f);
  EXPECT_TRUE(c.moe_router_enable_expert_bias);
  EXPECT_EQ(c.moe_router_bias_update_rate, 0.01f);
  EXPECT_EQ(c.moe_router_load_balancing_type, mt::model::MoeLoadBalancing::seq_aux_loss);
  EXPECT_EQ(c.moe_aux_loss_coeff, 1e-4f);
  EXPECT_EQ(c.moe_z_loss_coeff, 1e-3f);
  EXPECT_EQ(c.moe_expert_capacity_factor, 1.5f);
  EXPECT_EQ(c.moe_token_drop_policy, mt::model::MoeDropPolicy::position);
  EXPECT_TRUE(c.moe_pad_expert_input_to_capacity);
  EXPECT_TRUE(c.moe_grouped_gemm);
  EXPECT_EQ(c.moe_token_dispatcher_type, mt::model::MoeDispatcher::alltoall);
  EXPECT_TRUE(training_config(f.training).moe_per_layer_logging);
  // Megatron's defaults where nothing is given; an integer --moe-layer-freq is N.
  AllFlags g;
  ASSERT_EQ(parse_error({"--model", "tiny-gpt", "--num-experts", "4", "--moe-layer-freq", "2"}, &g), "");
  const mt::model::ModelConfig d = model_config(g.model);
  EXPECT_EQ(d.moe_router_topk, 2);
  EXPECT_EQ(d.moe_layer_freq, 2);
  EXPECT_TRUE(d.moe_layer_pattern.empty());
  EXPECT_EQ(d.moe_router_load_balancing_type, mt::model::MoeLoadBalancing::aux_loss);
  EXPECT_EQ(d.moe_aux_loss_coeff, 0.0f);
  EXPECT_FALSE(d.moe_z_loss_coeff.has_value());
  EXPECT_FALSE(d.moe_expert_capacity_factor.has_value());
  EXPECT_EQ(d.moe_token_dispatcher_type, mt::model::MoeDispatcher::allgather);
  // Megatron's list forms are refused by name; bad values while parsing.
  AllFlags h;
  ASSERT_EQ(parse_error({"--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss"}, &h), "");
  try {
    model_config(h.model);
    ADD_FAILURE() << "a list of balancing types accepted";
  } catch (const mt::UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--moe-router-load-balancing-type aux_loss seq_aux_loss: a list (one per loss) "
                                     "is not supported yet; give one value");
  }
  EXPECT_EQ(parse_error({"--moe-aux-loss-coeff", "-1"}), "--moe-aux-loss-coeff: must be at least 0 (got -1)");
  EXPECT_EQ(parse_error({"--num-experts", "0"}), "--num-experts: must be at least 1 (got 0)");
  AllFlags k;
  ASSERT_EQ(parse_error({"--model", "tiny-gpt", "--moe-layer-freq", "[1,2]"}, &k), "");
  EXPECT_THROW(model_config(k.model), mt::UsageError);
}

// Issue 22: the MLA flags with Megatron's names; --multi-latent-attention alone takes Megatron's
// defaults (arguments.py), rope type yarn at factor 1 included; the YaRN flags set their fields.
TEST(Flags, MlaFlagsSetTheModelConfigWithMegatronDefaults) {
  AllFlags f;
  ASSERT_EQ(parse_error({"--model", "tiny-llama", "--multi-latent-attention"}, &f), "");
  mt::model::ModelConfig c = model_config(f.model);
  EXPECT_TRUE(c.multi_latent_attention);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_head_dim, 128);
  EXPECT_EQ(c.qk_pos_emb_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_FALSE(c.qk_layernorm);
  EXPECT_EQ(c.rope_type, mt::model::RopeType::yarn);  // MLATransformerConfig's default
  EXPECT_EQ(c.rotary_scaling_factor, 1.0);
  EXPECT_EQ(c.mscale, 1.0);
  EXPECT_EQ(c.mscale_all_dim, 0.0);
  EXPECT_EQ(c.original_max_position_embeddings, 4096);
  AllFlags g;
  ASSERT_EQ(parse_error({"--model", "tiny-llama", "--multi-latent-attention", "--q-lora-rank", "12", "--kv-lora-rank",
                         "10", "--qk-head-dim", "6", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8",
                         "--qk-layernorm", "--rope-type", "rope"},
                        &g),
            "");
  c = model_config(g.model);
  EXPECT_EQ(c.q_lora_rank, 12);
  EXPECT_EQ(c.kv_lora_rank, 10);
  EXPECT_EQ(c.qk_head_dim, 6);
  EXPECT_EQ(c.qk_pos_emb_head_dim, 4);
  EXPECT_EQ(c.v_head_dim, 8);
  EXPECT_TRUE(c.qk_layernorm);
  EXPECT_EQ(c.rope_type, mt::model::RopeType::rope);
  AllFlags y;
  ASSERT_EQ(parse_error({"--model", "tiny-deepseek", "--rope-type", "yarn", "--rotary-scaling-factor", "40", "--mscale",
                         "0.9", "--mscale-all-dim", "0.8", "--yarn-original-max-position-embeddings", "2048",
                         "--yarn-beta-fast", "16", "--yarn-beta-slow", "2"},
                        &y),
            "");
  c = model_config(y.model);
  EXPECT_EQ(c.rope_type, mt::model::RopeType::yarn);
  EXPECT_EQ(c.rotary_scaling_factor, 40.0);
  EXPECT_EQ(c.mscale, 0.9);
  EXPECT_EQ(c.mscale_all_dim, 0.8);
  EXPECT_EQ(c.original_max_position_embeddings, 2048);
  EXPECT_EQ(c.yarn_beta_fast, 16.0);
  EXPECT_EQ(c.yarn_beta_slow, 2.0);
  AllFlags preset_rope;  // an MLA preset keeps its rope type without --rope-type
  ASSERT_EQ(parse_error({"--model", "tiny-deepseek"}, &preset_rope), "");
  EXPECT_EQ(model_config(preset_rope.model).rope_type, mt::model::RopeType::rope);
  EXPECT_NE(parse_error({"--rotary-scaling-factor", "0"}), "");
}

TEST(Flags, TrainingFlagsNamesAndCombinations) {
  AllFlags f;
  ASSERT_EQ(parse_error({"--bf16", "--lr-decay-style", "cosine", "--recompute-granularity", "full",
                         "--recompute-method", "block", "--no-check-for-nan-in-loss-and-grad", "--peak-tflops", "2"},
                        &f),
            "");
  const mt::train::TrainConfig c = training_config(f.training);
  EXPECT_EQ(c.precision, mt::Precision::bf16);
  EXPECT_EQ(c.lr_decay_style, mt::optim::LrDecayStyle::cosine);
  EXPECT_EQ(c.recompute.method, mt::model::RecomputeMethod::block);
  EXPECT_FALSE(c.check_for_nan_in_loss_and_grad);
  EXPECT_DOUBLE_EQ(c.peak_flops_per_second, 2e12);
  AllFlags g;
  ASSERT_EQ(parse_error({}, &g), "");
  EXPECT_TRUE(training_config(g.training).check_for_nan_in_loss_and_grad);  // Megatron's default
  // Issue 15: FLOPs are Megatron's num_floating_point_operations unless --flops-convention names another.
  EXPECT_EQ(training_config(g.training).flops_convention, mt::perf::FlopsConvention::megatron);
  EXPECT_EQ(mt::train::TrainConfig{}.flops_convention, mt::perf::FlopsConvention::megatron);
  AllFlags six_n;
  ASSERT_EQ(parse_error({"--flops-convention", "6N+6LCT"}, &six_n), "");
  EXPECT_EQ(training_config(six_n.training).flops_convention, mt::perf::FlopsConvention::six_n_causal_attention);
  EXPECT_NE(parse_error({"--flops-convention", "7N"}), "");
  AllFlags both;
  ASSERT_EQ(parse_error({"--bf16", "--fp16"}, &both), "");
  EXPECT_THROW(training_config(both.training), mt::UsageError);
  AllFlags block;
  ASSERT_EQ(parse_error({"--recompute-method", "block"}, &block), "");
  EXPECT_THROW(training_config(block.training), mt::UsageError);
}

TEST(Flags, ParallelFlagsAreValidatedForTheModelAndTheWorld) {
  AllFlags f;
  ASSERT_EQ(parse_error({"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--global-batch-size", "4"},
                        &f),
            "");
  mt::model::ModelConfig model = mt::model::preset("tiny-gpt");
  mt::parallel::ParallelConfig parallel = f.parallel;
  EXPECT_TRUE(validate_parallel(parallel, model, f.training.config, 8).empty());
  EXPECT_EQ(parallel.data_parallel_size, 2);
  parallel = f.parallel;
  EXPECT_THROW(validate_parallel(parallel, model, f.training.config, 6), mt::UsageError);
  // At TP 1 --sequence-parallel is turned off with Megatron's warning, so mt-train accepts it.
  AllFlags sp;
  ASSERT_EQ(parse_error({"--sequence-parallel"}, &sp), "");
  EXPECT_NO_THROW(check_supported_dense(sp.parallel));
  const std::vector<std::string> warnings = validate_parallel(sp.parallel, model, sp.training.config, 1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("--sequence-parallel"), std::string::npos) << warnings[0];
  EXPECT_FALSE(sp.parallel.sequence_parallel);
}

// Megatron's checkpoint flags (issue 14), spelled as Megatron spells them.
TEST(Flags, CheckpointFlagsBindAndCheckTheirRanges) {
  AllFlags f;
  EXPECT_EQ(parse_error({"--save", "ck", "--save-interval", "5", "--load", "in", "--finetune", "--no-load-optim",
                         "--no-save-optim", "--no-load-rng", "--exit-on-missing-checkpoint"},
                        &f),
            "");
  EXPECT_EQ(f.checkpoint.save, "ck");
  EXPECT_EQ(f.checkpoint.load, "in");
  EXPECT_EQ(f.checkpoint.save_interval, 5);
  EXPECT_TRUE(f.checkpoint.finetune && f.checkpoint.no_load_optim && f.checkpoint.no_save_optim &&
              f.checkpoint.no_load_rng && f.checkpoint.exit_on_missing_checkpoint);
  EXPECT_EQ(parse_error({"--save-interval", "0"}), "--save-interval: must be at least 1 (got 0)");
}

TEST(Flags, AKindMismatchIsAProgrammingError) {
  CLI::App app("test", "test");
  double wrong = 0;
  EXPECT_THROW(add_flag(app, "--num-layers", wrong), std::logic_error);
  EXPECT_THROW(flag_spec("--no-such-flag"), std::logic_error);
}

TEST(Flags, DeviceNamesTheBackendAndRefusesAGpuModelWithAHint) {
  std::optional<std::string> device;
  auto parse = [&](const std::vector<std::string>& args) {
    CLI::App app("test", "test");
    device.reset();
    add_device_flag(app, device);
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
    return backend_device(device);
  };
  EXPECT_EQ(parse({}), BackendDevice::cpu);
  EXPECT_EQ(parse({"--device", "cpu"}), BackendDevice::cpu);
  EXPECT_EQ(parse({"--device", "cuda"}), BackendDevice::cuda);
  // The old use of the flag (mt-mfu's peak table) is refused while parsing, by name, with the new one.
  try {
    parse({"--device", "H100"});
    ADD_FAILURE() << "--device H100 accepted";
  } catch (const mt::UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--device H100: a GPU model for peaks is --peak-device H100; --device names the backend, cpu or cuda");
  }
  EXPECT_THROW(backend_device(std::string("gpu")), mt::UsageError);
}
