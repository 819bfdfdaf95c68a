// Hugging Face export and import (io/hf_checkpoint.h): the import of an export gives back every
// parameter bit for bit (the vocabulary pad rows as zeros) for GPT-2 (tied and untied) and LLaMA
// (GQA, tied and untied); GPT-2's fused, transposed c_attn holds q, k and v where transformers
// reads them; config.json carries the model; what mt cannot represent is refused naming the field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
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

// Random values for every parameter of `m`, written as an mt checkpoint at `path`.
std::map<std::string, std::vector<float>> write_random_checkpoint(const model::ModelConfig& m, const std::string& path) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::map<std::string, std::vector<float>> values;
  io::CheckpointWriter writer(path);
  for (const model::ParamEntry& entry : model::build_layout(m).entries) {
    std::vector<float>& v = values[entry.name];
    v.resize(static_cast<size_t>(entry.numel));
    for (float& x : v) x = normal(rng);
    writer.write_tensor("model/" + entry.name, entry.global_shape,
                        {io::TensorSlice{io::Box{std::vector<int64_t>(entry.global_shape.size(), 0), entry.global_shape}, v.data()}});
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
    return model::to_json(expected).dump();
  }());
  int tensors = 0;
  for (const model::ParamEntry& entry : model::build_layout(m).entries) {
    const std::vector<float> got = read_whole(back, "model/" + entry.name, entry.global_shape);
    const std::vector<float>& want = values.at(entry.name);
    const bool vocabulary = entry.global_shape[0] == m.padded_vocab_size() && entry.name.find("position") == std::string::npos;
    const size_t real = vocabulary ? static_cast<size_t>(m.vocab_size * entry.global_shape[1]) : want.size();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), real * sizeof(float)), 0) << entry.name;
    for (size_t i = real; i < got.size(); ++i) ASSERT_EQ(got[i], 0.0f) << entry.name << " pad element " << i;
    ++tensors;
  }
  EXPECT_EQ(result.tensors, tensors);
}

}  // namespace

TEST(HfCheckpoint, ImportOfExportIsBitIdentical) {
  round_trip(tiny("tiny-gpt", false));
  round_trip(tiny("tiny-gpt", true));
  round_trip(tiny("tiny-llama", true, 2));
  round_trip(tiny("tiny-llama", false, 4));
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
