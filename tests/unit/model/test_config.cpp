// Model presets, validation, parameter counts, FLOPs per token and JSON round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "model/config.h"
#include "model/layout.h"

using namespace mt::model;

TEST(ModelConfig, PublishedParameterCountsOnTheUnpaddedVocabulary) {
  EXPECT_EQ(parameter_count(preset("gpt2-124m")), 124439808);
  EXPECT_EQ(parameter_count(preset("llama3-8b")), 8030261248);
  EXPECT_EQ(parameter_count(preset("llama3-70b")), 70553706496);
  EXPECT_EQ(parameter_count(preset("llama3.1-405b")), 405853388800);
}

TEST(ModelConfig, PresetShapesFollowThePublishedConfigs) {
  const ModelConfig gpt = preset("gpt2-345m");
  EXPECT_EQ(gpt.num_layers, 24);
  EXPECT_EQ(gpt.hidden_size, 1024);
  EXPECT_EQ(gpt.num_attention_heads, 16);
  const ModelConfig llama = preset("llama3-70b");
  EXPECT_EQ(llama.num_query_groups, 8);
  EXPECT_EQ(llama.ffn_hidden_size, 28672);
  EXPECT_FLOAT_EQ(llama.rotary_base, 500000.0f);
  EXPECT_TRUE(llama.swiglu);
  EXPECT_TRUE(llama.untie_embeddings_and_output_weights);
  EXPECT_FALSE(llama.add_bias_linear);
  EXPECT_THROW(preset("gpt5"), mt::UsageError);
}

TEST(ModelConfig, VocabularyPaddingIgnoresTheLayout) {
  ModelConfig c = preset("gpt2-124m");
  EXPECT_EQ(c.padded_vocab_size(), 50304);
  c.make_vocab_size_divisible_by = 16;
  c.vocab_size = 101;
  EXPECT_EQ(c.padded_vocab_size(), 112);
}

TEST(ModelConfig, ValidationNamesTheFlag) {
  ModelConfig c = preset("tiny-llama");
  c.num_query_groups = 3;
  try {
    c.validate();
    FAIL() << "expected a usage error";
  } catch (const mt::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--num-query-groups"), std::string::npos);
  }
  c = preset("tiny-gpt");
  c.seq_length = 65;
  EXPECT_THROW(c.validate(), mt::UsageError);
  c = preset("tiny-gpt");
  c.attention_dropout = 0.1f;
  EXPECT_NO_THROW(c.validate());
  for (float bad : {1.0f, -0.1f, std::nanf("")}) {
    c.attention_dropout = bad;
    try {
      c.validate();
      FAIL() << "expected a usage error for --attention-dropout " << bad;
    } catch (const mt::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--attention-dropout"), std::string::npos);
    }
  }
}

TEST(ModelConfig, MoeLayerFrequencyInMegatronsSpellings) {
  EXPECT_EQ(parse_moe_layer_freq("2", 5), (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_EQ(parse_moe_layer_freq("[0, 1,1]", 3), (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("([0]*2+[1]*3)", 5), (std::vector<int>{0, 0, 1, 1, 1}));
  EXPECT_EQ(parse_moe_layer_freq("[1,0]*2+[1]", 5), (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_THROW(parse_moe_layer_freq("([0]*3+[1]*57)", 61), mt::UsageError);  // 60 layers for 61
  EXPECT_THROW(parse_moe_layer_freq("[0,2]", 2), mt::UsageError);
  EXPECT_THROW(parse_moe_layer_freq("0", 2), mt::UsageError);
  EXPECT_THROW(parse_moe_layer_freq("[1]*x", 1), mt::UsageError);
  EXPECT_THROW(parse_moe_layer_freq("", 1), mt::UsageError);
}

TEST(ModelConfig, MixtureOfExpertsAndLatentAttentionPresets) {
  const ModelConfig mixtral = preset("mixtral-8x7b");
  EXPECT_EQ(mixtral.num_experts, 8);
  EXPECT_EQ(mixtral.moe_router_topk, 2);
  EXPECT_EQ(mixtral.moe_ffn(), 14336);
  EXPECT_EQ(mixtral.moe_layer_count(), 32);
  const ModelConfig v3 = preset("deepseek-v3");
  EXPECT_EQ(v3.moe_layer_count(), 58);
  EXPECT_FALSE(v3.is_moe_layer(2));
  EXPECT_TRUE(v3.is_moe_layer(3));
  EXPECT_TRUE(v3.is_moe_layer(61));  // the MTP layer is like the last decoder layer
  EXPECT_EQ(v3.moe_ffn(), 2048);
  EXPECT_TRUE(v3.multi_latent_attention);
  EXPECT_NO_THROW(v3.validate());
  // Megatron's recipes: Mixtral with aux_loss 1e-2 at seq 4096, DeepSeek-V3's grouped sigmoid routing.
  EXPECT_EQ(mixtral.moe_router_load_balancing_type, MoeLoadBalancing::aux_loss);
  EXPECT_FLOAT_EQ(mixtral.moe_aux_loss_coeff, 1e-2f);
  EXPECT_EQ(preset("mixtral-8x22b").seq_length, 4096);
  EXPECT_EQ(v3.moe_router_score_function, MoeScoreFunction::sigmoid);
  EXPECT_TRUE(v3.moe_router_enable_expert_bias);
  EXPECT_EQ(v3.moe_router_num_groups, 8);
  EXPECT_EQ(v3.moe_router_group_topk, 4);
  EXPECT_FLOAT_EQ(v3.moe_topk_scaling(), 2.5f);
  EXPECT_EQ(v3.moe_router_load_balancing_type, MoeLoadBalancing::seq_aux_loss);
  EXPECT_FLOAT_EQ(v3.moe_aux_loss_coeff, 1e-4f);
  EXPECT_FLOAT_EQ(v3.moe_router_bias_update_rate, 1e-3f);
  const ModelConfig tiny = preset("tiny-mixtral");
  EXPECT_EQ(tiny.num_experts, 8);
  EXPECT_EQ(tiny.moe_router_topk, 2);
  EXPECT_EQ(tiny.moe_layer_count(), tiny.num_layers);
  EXPECT_TRUE(tiny.moe_has_aux_loss());
  EXPECT_NO_THROW(tiny.check_trainable());
  // Megatron's defaults for a model that only sets --num-experts.
  ModelConfig defaults;
  EXPECT_EQ(defaults.moe_router_load_balancing_type, MoeLoadBalancing::aux_loss);
  EXPECT_EQ(defaults.moe_aux_loss_coeff, 0.0f);
  EXPECT_EQ(defaults.moe_token_dispatcher_type, MoeDispatcher::allgather);
  EXPECT_EQ(defaults.moe_token_drop_policy, MoeDropPolicy::probs);
  EXPECT_FALSE(defaults.moe_expert_capacity_factor.has_value());
  EXPECT_FLOAT_EQ(defaults.moe_topk_scaling(), 1.0f);
  ModelConfig every_other = mixtral;
  every_other.moe_layer_freq = 2;
  EXPECT_EQ(every_other.moe_layer_count(), 16);
  EXPECT_EQ(preset("gpt3-175b").num_layers, 96);
}

TEST(ModelConfig, EveryPresetIsBuiltAndCountedAsItsLayoutLaysItOut) {
  // Multi-token prediction is built (issue 22): DeepSeek-V3 trains, and the count of a model with
  // MTP depths equals its single-rank layout's (each depth: a layer like the last, enorm, hnorm,
  // the final norm and eh_proj; the word embedding and output layer shared).
  EXPECT_NO_THROW(preset("deepseek-v3").check_trainable());
  for (const char* name : {"tiny-llama", "tiny-gpt", "tiny-deepseek", "tiny-mixtral"}) {
    for (int depths : {0, 1, 2}) {
      ModelConfig mtp = preset(name);
      mtp.mtp_num_layers = depths;
      EXPECT_EQ(parameter_count(mtp, true), build_layout(mtp).parameter_elements()) << name << " " << depths;
    }
  }
  ModelConfig mtp = preset("tiny-llama");
  mtp.mtp_num_layers = 1;
  EXPECT_NO_THROW(mtp.check_trainable());
  EXPECT_NO_THROW(preset("tiny-llama").check_trainable());
  // Mixture of experts trains: every expert and the router counted (Mistral's 46.7B).
  EXPECT_NO_THROW(preset("mixtral-8x7b").check_trainable());
  EXPECT_EQ(parameter_count(preset("mixtral-8x7b")), 46702792704);
  ModelConfig half_moe = preset("tiny-mixtral");
  half_moe.moe_layer_freq = 2;  // layer 0 MoE, layer 1 dense (ffn 176)
  const int64_t h = 64, router = 8 * h, experts = 8 * 3 * 32 * h, dense = 3 * 176 * h;
  EXPECT_EQ(parameter_count(half_moe) - parameter_count(preset("tiny-llama")), router + experts - dense);
  ModelConfig bad = preset("mixtral-8x7b");
  bad.moe_router_topk = 9;
  EXPECT_THROW(bad.validate(), mt::UsageError);
  bad = preset("deepseek-v3");
  bad.num_query_groups = 8;
  EXPECT_THROW(bad.validate(), mt::UsageError);
}

// Each invalid MoE setting is refused by validate() with a message naming `flag`.
static void expect_moe_refused(const std::function<void(ModelConfig&)>& change, const std::string& flag) {
  ModelConfig c = preset("tiny-mixtral");
  change(c);
  try {
    c.validate();
    ADD_FAILURE() << "accepted; expected a refusal naming " << flag;
  } catch (const mt::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, MixtureOfExpertsValidationNamesTheFlag) {
  EXPECT_NO_THROW(preset("tiny-mixtral").validate());
  expect_moe_refused([](ModelConfig& c) { c.moe_router_dtype = MoeRouterDtype::fp64; }, "--moe-router-dtype fp64");
  expect_moe_refused([](ModelConfig& c) { c.moe_token_dispatcher_type = MoeDispatcher::flex; },
                     "--moe-token-dispatcher-type flex");
  expect_moe_refused([](ModelConfig& c) { c.moe_router_load_balancing_type = MoeLoadBalancing::sinkhorn; },
                     "--moe-router-load-balancing-type sinkhorn");
  expect_moe_refused([](ModelConfig& c) { c.moe_router_num_groups = 3; c.moe_router_group_topk = 1; },
                     "--moe-router-num-groups 3");
  expect_moe_refused([](ModelConfig& c) { c.moe_router_num_groups = 4; c.moe_router_group_topk = 5; },
                     "--moe-router-group-topk 5");
  expect_moe_refused([](ModelConfig& c) { c.moe_router_num_groups = 4; }, "--moe-router-group-topk");
  expect_moe_refused([](ModelConfig& c) { c.moe_router_group_topk = 2; }, "--moe-router-num-groups");
  expect_moe_refused([](ModelConfig& c) { c.moe_router_num_groups = 4; c.moe_router_group_topk = 1; c.moe_router_topk = 3; },
                     "--moe-router-topk 3");
  expect_moe_refused([](ModelConfig& c) { c.moe_router_enable_expert_bias = true; }, "--moe-router-score-function sigmoid");
  expect_moe_refused([](ModelConfig& c) { c.moe_router_topk_scaling_factor = 0.0f; }, "--moe-router-topk-scaling-factor");
  expect_moe_refused([](ModelConfig& c) { c.moe_aux_loss_coeff = -1.0f; }, "--moe-aux-loss-coeff");
  expect_moe_refused([](ModelConfig& c) { c.moe_z_loss_coeff = -1.0f; }, "--moe-z-loss-coeff");
  expect_moe_refused([](ModelConfig& c) { c.moe_expert_capacity_factor = 0.0f; }, "--moe-expert-capacity-factor");
  expect_moe_refused([](ModelConfig& c) { c.moe_pad_expert_input_to_capacity = true; },
                     "--moe-pad-expert-input-to-capacity");
  expect_moe_refused([](ModelConfig& c) { c.add_bias_linear = true; }, "--add-bias-linear");
  expect_moe_refused([](ModelConfig& c) { c.swiglu = false; }, "--swiglu");
  // Accepted: grouped sigmoid routing with the bias, capacity with padding, allgather.
  ModelConfig good = preset("tiny-mixtral");
  good.moe_router_score_function = MoeScoreFunction::sigmoid;
  good.moe_router_enable_expert_bias = true;
  good.moe_router_num_groups = 4;
  good.moe_router_group_topk = 2;
  good.moe_expert_capacity_factor = 1.0f;
  good.moe_pad_expert_input_to_capacity = true;
  good.moe_token_dispatcher_type = MoeDispatcher::allgather;
  EXPECT_NO_THROW(good.validate());
  EXPECT_EQ(to_json(config_from_json(to_json(good))), to_json(good));
  EXPECT_EQ(to_json(good)["moe_router_num_groups"], 4);
  EXPECT_EQ(to_json(good)["moe_token_dispatcher_type"], "allgather");
  EXPECT_TRUE(to_json(preset("tiny-mixtral"))["moe_expert_capacity_factor"].is_null());  // Megatron's None
}

TEST(ModelConfig, JsonRoundTripOfEveryPresetAndACustomModel) {
  for (const auto& name : preset_names()) {
    const ModelConfig c = preset(name);
    EXPECT_EQ(to_json(config_from_json(to_json(c))), to_json(c)) << name;
  }
  ModelConfig custom = preset("tiny-llama");
  custom.name = "custom";
  custom.kv_channels = 8;
  custom.num_query_groups = 4;
  custom.hidden_dropout = 0.25f;
  custom.make_vocab_size_divisible_by = 64;
  const ModelConfig back = config_from_json(to_json(custom));
  EXPECT_EQ(to_json(back), to_json(custom));
  EXPECT_EQ(back.head_dim(), 8);
  EXPECT_EQ(back.normalization, Normalization::rmsnorm);
  EXPECT_EQ(back.position_embedding, PositionEmbedding::rope);
  EXPECT_EQ(to_json(custom)["normalization"], "RMSNorm");
  EXPECT_EQ(to_json(preset("gpt2-124m"))["kv_channels"], 64);  // resolved, as Megatron's args
}

TEST(ModelConfig, JsonRefusesUnknownKeysWrongTypesAndInvalidModels) {
  nlohmann::json json = to_json(preset("tiny-gpt"));
  json["num_layer"] = 3;
  EXPECT_THROW(config_from_json(json), mt::UsageError);
  json = to_json(preset("tiny-gpt"));
  json["normalization"] = "BatchNorm";
  EXPECT_THROW(config_from_json(json), mt::UsageError);
  json = to_json(preset("tiny-gpt"));
  json["num_layers"] = 0;
  EXPECT_THROW(config_from_json(json), mt::UsageError);
  json = to_json(preset("tiny-gpt"));
  json["init_method_std"] = -1;
  EXPECT_THROW(config_from_json(json), mt::UsageError);
}

TEST(ModelConfig, ParameterCountsNeverOverflow) {
  ModelConfig c = preset("tiny-gpt");
  c.hidden_size = 65536;
  c.num_attention_heads = 1;
  c.num_query_groups = 1;
  c.num_layers = 2147483647;
  const long double wide = parameter_count_wide(c, true);
  EXPECT_GT(wide, 1e19L);
  EXPECT_EQ(parameter_count(c), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(static_cast<int64_t>(parameter_count_wide(preset("llama3-70b"))), parameter_count(preset("llama3-70b")));
}
