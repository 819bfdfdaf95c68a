// Hugging Face export and import (io/hf_checkpoint.h): the import of an export gives back every
// parameter bit for bit (the vocabulary pad rows as zeros) for GPT-2 (tied and untied) and LLaMA
// (GQA, tied and untied) and Mixtral (tiny-mixtral: router and every expert); GPT-2's fused,
// transposed c_attn holds q, k and v where transformers reads them; Mixtral's expert e holds mt's
// gate in w1, up in w3 and fc2 in w2; config.json carries the model; what mt cannot represent is
// refused naming the field, and MoE settings HF's Mixtral cannot compute naming mt's flag.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "../error_text.h"
#include "../temp_dir.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/hf_checkpoint.h"
#include "io/safetensors.h"
#include "model/layout.h"

using namespace mt;

namespace {

model::ModelConfig tiny(const std::string& preset, bool untied, int groups = 0) {
  model::ModelConfig m = model::preset(preset);
  m.num_layers = 2;
  m.hidden_size = 32;
  m.num_attention_heads = 4;
  m.num_query_groups = groups;
  m.kv_channels = 0;
  m.ffn_hidden_size = 48;
  m.vocab_size = 101;
  m.make_vocab_size_divisible_by = 16;
  m.seq_length = 16;
  m.max_position_embeddings = 16;
  m.untie_embeddings_and_output_weights = untied;
  m.validate();
  return m;
}

// Every parameter of `m` and, with the expert bias, each MoE layer's router.expert_bias (a
// checkpoint buffer), with their global shapes.
std::vector<std::pair<std::string, std::vector<int64_t>>> checkpoint_tensors(const model::ModelConfig& m) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  for (const model::ParamEntry& entry : model::build_layout(m).entries) tensors.emplace_back(entry.name, entry.global_shape);
  for (int layer = 0; m.moe_router_enable_expert_bias && layer < m.num_layers + m.mtp_num_layers; ++layer) {
    if (m.is_moe_layer(layer)) tensors.emplace_back(model::layer_prefix(layer) + "mlp.router.expert_bias", std::vector<int64_t>{m.num_experts});
  }
  return tensors;
}

// Random values for every tensor of `m`, written as an mt checkpoint at `path`.
std::map<std::string, std::vector<float>> write_random_checkpoint(const model::ModelConfig& m, const std::string& path) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::map<std::string, std::vector<float>> values;
  io::CheckpointWriter writer(path);
  for (const auto& [name, shape] : checkpoint_tensors(m)) {
    std::vector<float>& v = values[name];
    v.resize(static_cast<size_t>(io::Box{std::vector<int64_t>(shape.size(), 0), shape}.elements()));
    for (float& x : v) x = normal(rng);
    writer.write_tensor("model/" + name, shape, {io::TensorSlice{io::Box{std::vector<int64_t>(shape.size(), 0), shape}, v.data()}});
  }
  io::CheckpointState state;
  state.resumable = false;
  state.has_optimizer = false;
  state.model_config = model::to_json(m).dump();
  writer.commit(state);
  return values;
}

std::vector<float> read_whole(const io::CheckpointReader& reader, const std::string& name, const std::vector<int64_t>& shape) {
  io::Box box{std::vector<int64_t>(shape.size(), 0), shape};
  std::vector<float> values(static_cast<size_t>(box.elements()));
  reader.read_box(name, shape, box, values.data());
  return values;
}

void round_trip(const model::ModelConfig& m) {
  SCOPED_TRACE(m.name + (m.untie_embeddings_and_output_weights ? " untied" : " tied"));
  mt::testing::TempDir dir("mt_test_hf");
  const std::string original = (dir.path() / "original.h5").string(), imported = (dir.path() / "imported.h5").string();
  const auto values = write_random_checkpoint(m, original);
  const io::HfExportResult exported = io::export_hf(io::CheckpointReader(original), (dir.path() / "hf").string(), DType::f32);
  EXPECT_EQ(exported.tensors, static_cast<int64_t>(io::hf_tensors(m).size()));
  const io::HfImportResult result = io::import_hf((dir.path() / "hf").string(), imported, m.make_vocab_size_divisible_by);
  EXPECT_TRUE(result.ignored.empty());
  const io::CheckpointReader back(imported);
  EXPECT_FALSE(back.state().resumable);
  EXPECT_FALSE(back.state().has_optimizer);
  const model::ModelConfig again = model::config_from_json(nlohmann::json::parse(back.state().model_config));
  EXPECT_EQ(model::to_json(again).dump(), [&] {
    model::ModelConfig expected = m;
    expected.name = again.name;
    expected.seq_length = again.seq_length;
    expected.init_method_std = again.init_method_std;
    expected.hidden_dropout = again.hidden_dropout;
    expected.attention_dropout = again.attention_dropout;
    if (m.num_experts > 0 && !m.multi_latent_attention) {  // Mixtral's intermediate_size is the experts' width, imported as --ffn-hidden-size
      expected.ffn_hidden_size = m.moe_ffn();
      expected.moe_ffn_hidden_size = 0;
    }
    return model::to_json(expected).dump();
  }());
  int tensors = 0;
  for (const auto& [name, shape] : checkpoint_tensors(m)) {
    const std::vector<float> got = read_whole(back, "model/" + name, shape);
    const std::vector<float>& want = values.at(name);
    const bool vocabulary = shape[0] == m.padded_vocab_size() && name.find("position") == std::string::npos;
    const size_t real = vocabulary ? static_cast<size_t>(m.vocab_size * shape[1]) : want.size();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), real * sizeof(float)), 0) << name;
    for (size_t i = real; i < got.size(); ++i) ASSERT_EQ(got[i], 0.0f) << name << " pad element " << i;
    ++tensors;
  }
  EXPECT_EQ(result.tensors, tensors);
}

// tiny-deepseek at the test's sizes (MLA, a dense then a MoE layer with DeepSeek-V3's routing,
// 4 groups keeping 2 with top-4 so that each group's score is its best 2 experts, a shared
// expert) with one MTP depth.
model::ModelConfig deepseek_model() {
  model::ModelConfig m = tiny("tiny-deepseek", true);
  m.moe_router_topk = 4;
  m.mtp_num_layers = 1;
  m.validate();
  return m;
}

}  // namespace

TEST(HfCheckpoint, ImportOfExportIsBitIdentical) {
  round_trip(tiny("tiny-gpt", false));
  round_trip(tiny("tiny-gpt", true));
  round_trip(tiny("tiny-llama", true, 2));
  round_trip(tiny("tiny-llama", false, 4));
  round_trip(tiny("tiny-mixtral", false, 2));
  round_trip(tiny("tiny-mixtral", true, 4));
  // DeepSeek-V3-shaped: MLA, a dense layer then MoE with the expert bias and a shared expert; with
  // an MTP depth (tied and untied: its embed_tokens and shared_head.head are copies), and without
  // the compressed queries.
  model::ModelConfig deepseek = deepseek_model();
  round_trip(deepseek);
  deepseek.untie_embeddings_and_output_weights = false;
  deepseek.q_lora_rank = 0;
  round_trip(deepseek);
}

// DeepSeek-V3's names: MLA's projections, the router with its bias, experts and shared experts, the
// MTP depth as model.layers.<L>. with DeepSeek's enorm / hnorm / eh_proj / shared_head names.
TEST(HfCheckpoint, DeepseekNamesTensorsAsDeepSeekV3Does) {
  const model::ModelConfig m = deepseek_model();
  EXPECT_EQ(io::hf_architecture(m), io::HfArchitecture::deepseek_v3);
  std::map<std::string, std::vector<std::string>> mt_of;
  for (const io::HfTensor& tensor : io::hf_tensors(m)) mt_of[tensor.name] = tensor.mt_names;
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"model.layers.0.self_attn.q_a_proj.weight", "decoder.layers.0.self_attention.linear_q_down_proj.weight"},
      {"model.layers.0.self_attn.q_a_layernorm.weight", "decoder.layers.0.self_attention.q_layernorm.weight"},
      {"model.layers.0.self_attn.q_b_proj.weight", "decoder.layers.0.self_attention.linear_q_up_proj.weight"},
      {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "decoder.layers.0.self_attention.linear_kv_down_proj.weight"},
      {"model.layers.0.self_attn.kv_a_layernorm.weight", "decoder.layers.0.self_attention.kv_layernorm.weight"},
      {"model.layers.0.self_attn.kv_b_proj.weight", "decoder.layers.0.self_attention.linear_kv_up_proj.weight"},
      {"model.layers.0.self_attn.o_proj.weight", "decoder.layers.0.self_attention.linear_proj.weight"},
      {"model.layers.0.mlp.gate_proj.weight", "decoder.layers.0.mlp.linear_fc1_gate.weight"},
      {"model.layers.1.mlp.gate.weight", "decoder.layers.1.mlp.router.weight"},
      {"model.layers.1.mlp.gate.e_score_correction_bias", "decoder.layers.1.mlp.router.expert_bias"},
      {"model.layers.1.mlp.experts.7.up_proj.weight", "decoder.layers.1.mlp.experts.7.linear_fc1_up.weight"},
      {"model.layers.1.mlp.shared_experts.down_proj.weight", "decoder.layers.1.mlp.shared_experts.linear_fc2.weight"},
      {"model.layers.2.enorm.weight", "mtp.layers.0.enorm.weight"},
      {"model.layers.2.hnorm.weight", "mtp.layers.0.hnorm.weight"},
      {"model.layers.2.eh_proj.weight", "mtp.layers.0.eh_proj.weight"},
      {"model.layers.2.shared_head.norm.weight", "mtp.layers.0.final_layernorm.weight"},
      {"model.layers.2.shared_head.head.weight", "output_layer.weight"},
      {"model.layers.2.embed_tokens.weight", "embedding.word_embeddings.weight"},
      {"model.layers.2.mlp.gate.e_score_correction_bias", "decoder.layers.2.mlp.router.expert_bias"},
      {"lm_head.weight", "output_layer.weight"},
  };
  for (const auto& [hf, mt] : expected) {
    ASSERT_TRUE(mt_of.count(hf)) << hf;
    EXPECT_EQ(mt_of[hf], std::vector<std::string>{mt}) << hf;
  }
  const nlohmann::ordered_json c = io::hf_config(m, DType::f32);
  EXPECT_EQ(c["model_type"], "deepseek_v3");
  EXPECT_EQ(c["first_k_dense_replace"], 1);
  EXPECT_EQ(c["n_routed_experts"], 8);
  EXPECT_EQ(c["n_shared_experts"], 1);
  EXPECT_EQ(c["n_group"], 4);
  EXPECT_EQ(c["topk_group"], 2);
  EXPECT_EQ(c["num_nextn_predict_layers"], 1);
  EXPECT_EQ(c["qk_nope_head_dim"], 16);
  EXPECT_EQ(c["qk_rope_head_dim"], 8);
}

// What DeepseekV3ForCausalLM cannot compute, refused naming mt's flag; the mt-only training
// settings (z-loss) export.
TEST(HfCheckpoint, DeepseekRefusesWhatItsRouterAndAttentionDoNotCompute) {
  const model::ModelConfig base = deepseek_model();
  const std::vector<std::pair<std::string, void (*)(model::ModelConfig&)>> cases = {
      {"--multi-latent-attention without --qk-layernorm", [](model::ModelConfig& m) { m.qk_layernorm = false; }},
      {"--moe-router-score-function softmax",
       [](model::ModelConfig& m) {
         m.moe_router_score_function = model::MoeScoreFunction::softmax;
         m.moe_router_enable_expert_bias = false;
       }},
      {"MoE without --moe-router-enable-expert-bias", [](model::ModelConfig& m) { m.moe_router_enable_expert_bias = false; }},
      {"--moe-router-group-topk 1", [](model::ModelConfig& m) { m.moe_router_group_topk = 1; }},
      {"--moe-expert-capacity-factor", [](model::ModelConfig& m) { m.moe_expert_capacity_factor = 1.0f; }},
      {"--moe-shared-expert-intermediate-size 0", [](model::ModelConfig& m) { m.moe_shared_expert_intermediate_size = 0; }},
      {"--moe-layer-freq", [](model::ModelConfig& m) { m.moe_layer_pattern = {1, 0}; }},
      {"--rotary-scaling-factor", [](model::ModelConfig& m) {
         m.rope_type = model::RopeType::yarn;
         m.rotary_scaling_factor = 40;
       }},
  };
  for (const auto& [flag, change] : cases) {
    model::ModelConfig m = base;
    change(m);
    const std::string text = mt::testing::error_text([&] { io::hf_architecture(m); });
    EXPECT_NE(text.find(flag + " has no Hugging Face export"), std::string::npos) << flag << ": " << text;
  }
  model::ModelConfig z_loss = base;
  z_loss.moe_z_loss_coeff = 1e-3f;
  EXPECT_EQ(io::hf_architecture(z_loss), io::HfArchitecture::deepseek_v3);
}

// An import whose MTP layer's copy of the word table differs from model.embed_tokens is refused by name.
TEST(HfCheckpoint, DeepseekImportRefusesAnMtpEmbeddingCopyThatDiffers) {
  const model::ModelConfig m = deepseek_model();
  mt::testing::TempDir dir("mt_test_hf");
  const std::string original = (dir.path() / "original.h5").string();
  write_random_checkpoint(m, original);
  const std::string hf = (dir.path() / "hf").string();
  io::export_hf(io::CheckpointReader(original), hf, DType::f32);
  io::SafetensorsWriter writer;
  const io::SafetensorsReader reader((std::filesystem::path(hf) / "model.safetensors").string());
  for (const io::SafetensorsEntry& entry : reader.entries()) {
    std::vector<float> values = reader.read(entry.name);
    if (entry.name == "model.layers.2.embed_tokens.weight") values[5] += 1.0f;
    writer.add(entry.name, DType::f32, entry.shape, std::move(values));
  }
  writer.write((std::filesystem::path(hf) / "model.safetensors").string(), {{"format", "pt"}});
  const std::string text = mt::testing::error_text(
      [&] { io::import_hf(hf, (dir.path() / "imported.h5").string(), m.make_vocab_size_divisible_by); });
  EXPECT_NE(text.find("model.layers.2.embed_tokens.weight differs from model.embed_tokens.weight"), std::string::npos)
      << text;
}

TEST(HfCheckpoint, MixtralNamesEveryExpertAsTransformersReadsIt) {
  const model::ModelConfig m = tiny("tiny-mixtral", false, 2);
  ASSERT_EQ(m.num_experts, 8);
  mt::testing::TempDir dir("mt_test_hf_mixtral");
  const std::string original = (dir.path() / "original.h5").string();
  const auto values = write_random_checkpoint(m, original);
  const io::HfExportResult exported = io::export_hf(io::CheckpointReader(original), (dir.path() / "hf").string(), DType::f32);
  EXPECT_EQ(exported.architecture, io::HfArchitecture::mixtral);
  // embed (tied: no lm_head), norm; per layer 2 norms, q/k/v/o, the gate and 8 experts x 3
  EXPECT_EQ(exported.tensors, 2 + 2 * (2 + 4 + 1 + 8 * 3));
  const io::SafetensorsReader weights((dir.path() / "hf" / "model.safetensors").string());
  auto expect_same = [&](const std::string& hf, const std::string& mt, std::vector<int64_t> shape) {
    const io::SafetensorsEntry* entry = weights.find(hf);
    ASSERT_NE(entry, nullptr) << hf;
    EXPECT_EQ(entry->shape, shape) << hf;
    const std::vector<float> got = weights.read(hf);
    const std::vector<float>& want = values.at(mt);
    ASSERT_EQ(got.size(), want.size()) << hf;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << hf << " is not " << mt;
  };
  for (int layer = 0; layer < 2; ++layer) {
    const std::string hf = "model.layers." + std::to_string(layer) + ".block_sparse_moe.";
    const std::string mt = "decoder.layers." + std::to_string(layer) + ".mlp.";
    expect_same(hf + "gate.weight", mt + "router.weight", {8, 32});
    for (int e = 0; e < 8; ++e) {
      const std::string hf_expert = hf + "experts." + std::to_string(e) + ".", mt_expert = mt + "experts." + std::to_string(e) + ".";
      expect_same(hf_expert + "w1.weight", mt_expert + "linear_fc1_gate.weight", {32, 32});
      expect_same(hf_expert + "w3.weight", mt_expert + "linear_fc1_up.weight", {32, 32});
      expect_same(hf_expert + "w2.weight", mt_expert + "linear_fc2.weight", {32, 32});
    }
  }
  EXPECT_EQ(weights.find("model.layers.0.mlp.gate_proj.weight"), nullptr);
  std::ifstream in(dir.path() / "hf" / "config.json");
  const auto config = nlohmann::json::parse(in);
  EXPECT_EQ(config["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(config["model_type"], "mixtral");
  EXPECT_EQ(config["num_local_experts"], 8);
  EXPECT_EQ(config["num_experts_per_tok"], 2);
  EXPECT_EQ(config["intermediate_size"], 32);  // the experts' width, not --ffn-hidden-size
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["router_aux_loss_coef"], 0.01);
  EXPECT_EQ(config["router_jitter_noise"], 0.0);
  EXPECT_TRUE(config["sliding_window"].is_null());
  EXPECT_FALSE(config.contains("rope_scaling"));
}

// Each MoE setting whose routing or parameters MixtralForCausalLM cannot reproduce, refused by
// its flag; the default softmax router (top-k of the logits, softmax over k) exports.
TEST(HfCheckpoint, MixtralRefusesWhatItsRouterDoesNotCompute) {
  const model::ModelConfig base = tiny("tiny-mixtral", false, 2);
  EXPECT_EQ(io::hf_architecture(base), io::HfArchitecture::mixtral);
  auto refusal = [&](void (*change)(model::ModelConfig&)) {
    model::ModelConfig m = base;
    change(m);
    return mt::testing::error_text([&] { io::hf_architecture(m); });
  };
  const std::vector<std::pair<std::string, void (*)(model::ModelConfig&)>> cases = {
      {"--moe-router-pre-softmax", [](model::ModelConfig& m) { m.moe_router_pre_softmax = true; }},
      {"--moe-router-score-function sigmoid",
       [](model::ModelConfig& m) { m.moe_router_score_function = model::MoeScoreFunction::sigmoid; }},
      {"--moe-router-enable-expert-bias",
       [](model::ModelConfig& m) {
         m.moe_router_score_function = model::MoeScoreFunction::sigmoid;
         m.moe_router_enable_expert_bias = true;
       }},
      {"--moe-router-num-groups",
       [](model::ModelConfig& m) {
         m.moe_router_num_groups = 4;
         m.moe_router_group_topk = 2;
       }},
      {"--moe-router-topk-scaling-factor", [](model::ModelConfig& m) { m.moe_router_topk_scaling_factor = 2.5f; }},
      {"--moe-expert-capacity-factor", [](model::ModelConfig& m) { m.moe_expert_capacity_factor = 1.0f; }},
      {"--moe-shared-expert-intermediate-size", [](model::ModelConfig& m) { m.moe_shared_expert_intermediate_size = 32; }},
      {"--moe-layer-freq", [](model::ModelConfig& m) { m.moe_layer_freq = 2; }},
      {"--multi-latent-attention without --qk-layernorm", [](model::ModelConfig& m) { m.multi_latent_attention = true; }},
      {"--mtp-num-layers", [](model::ModelConfig& m) { m.mtp_num_layers = 1; }},
  };
  for (const auto& [flag, change] : cases) {
    const std::string text = refusal(change);
    EXPECT_NE(text.find(flag + " has no Hugging Face export"), std::string::npos) << flag << ": " << text;
  }
  // Ignored by HF's forward and so carried or not at all: training-only router settings.
  model::ModelConfig z_loss = base;
  z_loss.moe_z_loss_coeff = 1e-3f;
  EXPECT_EQ(io::hf_architecture(z_loss), io::HfArchitecture::mixtral);
}

TEST(HfCheckpoint, MixtralImportRefusesWhatMtDoesNotRun) {
  const nlohmann::json mixtral = {{"model_type", "mixtral"},      {"vocab_size", 100},        {"hidden_size", 32},
                                  {"intermediate_size", 24},      {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                                  {"num_key_value_heads", 2},     {"max_position_embeddings", 64},
                                  {"num_local_experts", 4},       {"num_experts_per_tok", 2}, {"router_aux_loss_coef", 0.02},
                                  {"sliding_window", nullptr}};
  const model::ModelConfig m = io::model_config_from_hf(mixtral, "c.json", 128);
  EXPECT_EQ(m.num_experts, 4);
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_EQ(m.moe_ffn(), 24);
  EXPECT_EQ(m.moe_ffn_hidden_size, 0);  // as the mixtral-8x7b preset: the experts take --ffn-hidden-size
  EXPECT_EQ(m.moe_layer_count(), 2);
  EXPECT_FLOAT_EQ(m.moe_aux_loss_coeff, 0.02f);
  EXPECT_FLOAT_EQ(m.rotary_base, 1e6f);  // MixtralConfig's default rope_theta
  EXPECT_FALSE(m.moe_router_pre_softmax);
  EXPECT_EQ(io::hf_architecture(m), io::HfArchitecture::mixtral);
  auto refusal = [](const nlohmann::json& c) {
    return mt::testing::error_text([&] { io::model_config_from_hf(c, "c.json", 128); });
  };
  nlohmann::json jitter = mixtral;
  jitter["router_jitter_noise"] = 0.1;
  EXPECT_NE(refusal(jitter).find("router_jitter_noise is not 0"), std::string::npos) << refusal(jitter);
  nlohmann::json sliding = mixtral;
  sliding["sliding_window"] = 4096;
  EXPECT_NE(refusal(sliding).find("sliding_window is set"), std::string::npos) << refusal(sliding);
  nlohmann::json no_experts = mixtral;
  no_experts.erase("num_local_experts");
  EXPECT_NE(refusal(no_experts).find("config.json has no num_local_experts"), std::string::npos);
  nlohmann::json too_many = mixtral;
  too_many["num_experts_per_tok"] = 5;
  EXPECT_NE(refusal(too_many).find("moe-router-topk"), std::string::npos) << refusal(too_many);
}

TEST(HfCheckpoint, Gpt2FusesAndTransposesAsTransformersReads) {
  const model::ModelConfig m = tiny("tiny-gpt", false);
  mt::testing::TempDir dir("mt_test_hf_gpt2");
  const std::string original = (dir.path() / "original.h5").string();
  const auto values = write_random_checkpoint(m, original);
  io::export_hf(io::CheckpointReader(original), (dir.path() / "hf").string(), DType::f32);
  const io::SafetensorsReader weights((dir.path() / "hf" / "model.safetensors").string());
  EXPECT_EQ(weights.find("lm_head.weight"), nullptr) << "tied: transformers ties lm_head to wte";
  const io::SafetensorsEntry* c_attn = weights.find("transformer.h.1.attn.c_attn.weight");
  ASSERT_NE(c_attn, nullptr);
  EXPECT_EQ(c_attn->shape, (std::vector<int64_t>{32, 96}));  // Conv1D: (in, 3 * out)
  const std::vector<float> fused = weights.read("transformer.h.1.attn.c_attn.weight");
  const std::vector<float>& k = values.at("decoder.layers.1.self_attention.linear_k.weight");  // (out, in)
  for (int in = 0; in < 32; ++in) {
    for (int out = 0; out < 32; ++out) ASSERT_EQ(fused[static_cast<size_t>(in * 96 + 32 + out)], k[static_cast<size_t>(out * 32 + in)]);
  }
  EXPECT_EQ(weights.find("transformer.wte.weight")->shape, (std::vector<int64_t>{101, 32}));  // pad rows dropped
  std::ifstream in(dir.path() / "hf" / "config.json");
  const auto config = nlohmann::json::parse(in);
  EXPECT_EQ(config["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(config["vocab_size"], 101);
  EXPECT_EQ(config["n_inner"], 48);
  EXPECT_EQ(config["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(config["tie_word_embeddings"], true);
}

TEST(HfCheckpoint, RefusesWhatMtCannotRepresent) {
  nlohmann::json llama = {{"model_type", "llama"},     {"vocab_size", 100},          {"hidden_size", 32},
                          {"intermediate_size", 48},   {"num_hidden_layers", 2},     {"num_attention_heads", 4},
                          {"num_key_value_heads", 2},  {"max_position_embeddings", 64}};
  const model::ModelConfig m = io::model_config_from_hf(llama, "c.json", 128);
  EXPECT_EQ(m.padded_vocab_size(), 128);
  EXPECT_EQ(m.query_groups(), 2);
  EXPECT_TRUE(m.untie_embeddings_and_output_weights);  // LLaMA: untied unless tie_word_embeddings
  auto refusal = [](const nlohmann::json& c) {
    return mt::testing::error_text([&] { io::model_config_from_hf(c, "c.json", 128); });
  };
  nlohmann::json scaled = llama;
  scaled["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  EXPECT_NE(refusal(scaled).find("rope_scaling is set"), std::string::npos) << refusal(scaled);
  nlohmann::json biased = llama;
  biased["attention_bias"] = true;
  EXPECT_NE(refusal(biased).find("attention_bias"), std::string::npos);
  nlohmann::json missing = llama;
  missing.erase("hidden_size");
  EXPECT_NE(refusal(missing).find("config.json has no hidden_size"), std::string::npos);
  const nlohmann::json gelu = {{"model_type", "gpt2"}, {"vocab_size", 100}, {"n_embd", 32}, {"n_layer", 2},
                               {"n_head", 4},          {"n_positions", 64}, {"activation_function", "gelu"}};
  EXPECT_NE(refusal(gelu).find("activation_function is gelu"), std::string::npos);
  EXPECT_NE(refusal({{"model_type", "bert"}, {"vocab_size", 10}}).find("model_type 'bert'"), std::string::npos);
  model::ModelConfig gelu_llama = tiny("tiny-llama", false);
  gelu_llama.swiglu = false;
  EXPECT_NE(mt::testing::error_text([&] { io::hf_architecture(gelu_llama); }).find("no Hugging Face architecture"), std::string::npos);
}

// transformers' default GPT2Config (attn_pdrop, resid_pdrop, embd_pdrop 0.1), as the released GPT-2
// models carry, and a LLaMA config with attention_dropout: imported with their dropouts, valid
// models (no refusal for a training-time setting); export writes mt's values back.
TEST(HfCheckpoint, ImportTakesTheDropoutsAndExportWritesThem) {
  const nlohmann::json gpt2 = {{"model_type", "gpt2"}, {"vocab_size", 50257}, {"n_embd", 768},   {"n_layer", 12},
                               {"n_head", 12},         {"n_positions", 1024}, {"attn_pdrop", 0.1}, {"resid_pdrop", 0.1},
                               {"embd_pdrop", 0.1}};
  const model::ModelConfig g = io::model_config_from_hf(gpt2, "c.json", 128);
  EXPECT_FLOAT_EQ(g.attention_dropout, 0.1f);
  EXPECT_FLOAT_EQ(g.hidden_dropout, 0.1f);
  EXPECT_NO_THROW(g.validate());
  nlohmann::json llama = {{"model_type", "llama"},    {"vocab_size", 100},      {"hidden_size", 32},
                          {"intermediate_size", 48},  {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                          {"num_key_value_heads", 2}, {"max_position_embeddings", 64}, {"attention_dropout", 0.25}};
  const model::ModelConfig l = io::model_config_from_hf(llama, "c.json", 128);
  EXPECT_FLOAT_EQ(l.attention_dropout, 0.25f);
  EXPECT_NO_THROW(l.validate());
  model::ModelConfig m = tiny("tiny-gpt", false);
  m.hidden_dropout = 0.2f;
  m.attention_dropout = 0.3f;
  EXPECT_FLOAT_EQ(io::hf_config(m, DType::f32).at("attn_pdrop").get<float>(), 0.3f);
  EXPECT_FLOAT_EQ(io::hf_config(m, DType::f32).at("resid_pdrop").get<float>(), 0.2f);
  EXPECT_FLOAT_EQ(io::hf_config(m, DType::f32).at("embd_pdrop").get<float>(), 0.2f);
  model::ModelConfig n = tiny("tiny-llama", false, 2);
  n.attention_dropout = 0.3f;
  EXPECT_FLOAT_EQ(io::hf_config(n, DType::f32).at("attention_dropout").get<float>(), 0.3f);
}

TEST(HfCheckpoint, ImportRefusesAShapeThatDisagreesWithConfig) {
  const model::ModelConfig m = tiny("tiny-llama", false, 2);
  mt::testing::TempDir dir("mt_test_hf_shape");
  const std::string original = (dir.path() / "original.h5").string();
  write_random_checkpoint(m, original);
  const std::string hf = (dir.path() / "hf").string();
  io::export_hf(io::CheckpointReader(original), hf, DType::bf16);
  std::ifstream in(hf + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  in.close();
  config["intermediate_size"] = 64;
  std::ofstream(hf + "/config.json") << config.dump();
  EXPECT_NE(mt::testing::error_text([&] { io::import_hf(hf, (dir.path() / "x.h5").string(), 16); })
                .find("tensor model.layers.0.mlp.gate_proj.weight has shape (48, 32), config.json's model needs (64, 32)"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "x.h5"));
}

// Mistral AI's released Mixtral-8x7B-v0.1 config.json imports as mt's mixtral-8x7b preset (so
// mt-train --model mixtral-8x7b loads the import), but for what the two rightly disagree on:
// HF's router_aux_loss_coef 0.02 against Megatron's recipe 1e-2, and the training length.
TEST(HfCheckpoint, ReleasedMixtral8x7bConfigIsThePreset) {
  const nlohmann::json released = {
      {"architectures", {"MixtralForCausalLM"}}, {"model_type", "mixtral"},  {"vocab_size", 32000},
      {"hidden_size", 4096},                     {"intermediate_size", 14336}, {"num_hidden_layers", 32},
      {"num_attention_heads", 32},               {"num_key_value_heads", 8},  {"max_position_embeddings", 32768},
      {"rms_norm_eps", 1e-5},                    {"rope_theta", 1e6},         {"sliding_window", nullptr},
      {"num_local_experts", 8},                  {"num_experts_per_tok", 2},  {"router_aux_loss_coef", 0.02},
      {"output_router_logits", false},           {"tie_word_embeddings", false}, {"hidden_act", "silu"},
      {"attention_dropout", 0.0},                {"initializer_range", 0.02}};
  model::ModelConfig imported = io::model_config_from_hf(released, "config.json", 128);
  const model::ModelConfig preset = model::preset("mixtral-8x7b");
  EXPECT_FLOAT_EQ(imported.moe_aux_loss_coeff, 0.02f);
  imported.name = preset.name;
  imported.seq_length = preset.seq_length;
  imported.moe_aux_loss_coeff = preset.moe_aux_loss_coeff;
  imported.make_vocab_size_divisible_by = preset.make_vocab_size_divisible_by;
  EXPECT_EQ(model::to_json(imported).dump(), model::to_json(preset).dump());
  const nlohmann::ordered_json exported = io::hf_config(preset, DType::bf16);
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "max_position_embeddings", "num_local_experts", "num_experts_per_tok",
                          "vocab_size", "rope_theta", "rms_norm_eps", "sliding_window", "tie_word_embeddings"}) {
    EXPECT_EQ(exported.at(key), released.at(key)) << key;
  }
}
