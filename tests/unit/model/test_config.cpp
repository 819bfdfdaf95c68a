// Model presets, validation, parameter counts, FLOPs per token and JSON round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/config.h"

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
  ModelConfig every_other = mixtral;
  every_other.moe_layer_freq = 2;
  EXPECT_EQ(every_other.moe_layer_count(), 16);
  EXPECT_EQ(preset("gpt3-175b").num_layers, 96);
}

TEST(ModelConfig, TrainingRefusesWhatOnlyTheAccountingKnowsByName) {
  for (const char* name : {"mixtral-8x7b", "deepseek-v3"}) {
    const ModelConfig c = preset(name);
    try {
      c.check_trainable();
      FAIL() << name;
    } catch (const mt::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("not supported yet"), std::string::npos) << e.what();
    }
    EXPECT_THROW(parameter_count(c), mt::UsageError) << name;
  }
  ModelConfig mtp = preset("tiny-llama");
  mtp.mtp_num_layers = 1;
  EXPECT_THROW(mtp.check_trainable(), mt::UsageError);
  EXPECT_NO_THROW(preset("tiny-llama").check_trainable());
  ModelConfig bad = preset("mixtral-8x7b");
  bad.moe_router_topk = 9;
  EXPECT_THROW(bad.validate(), mt::UsageError);
  bad = preset("deepseek-v3");
  bad.num_query_groups = 8;
  EXPECT_THROW(bad.validate(), mt::UsageError);
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
