// Hugging Face export and import (see hf_checkpoint.h).
#include "io/hf_checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/temporary_file.h"
#include "io/safetensors.h"
#include "io/value_checks.h"
#include "kernels/common/yarn_rope.h"
#include "model/layout.h"

namespace mt::io {
namespace {

using model::ModelConfig;

// A float as JSON with its shortest decimal form (1e-05, not 9.99999974737875e-06).
double float_json(float value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  double parsed = 0;
  std::from_chars(text, result.ptr, parsed);
  return parsed;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (size_t d = 0; d < shape.size(); ++d) text += (d ? ", " : "") + std::to_string(shape[d]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

// The global shape of every parameter of `model`'s single-rank layout, by layout name.
// With the expert bias, each MoE layer's router.expert_bias (E) too: a checkpoint buffer the
// trainer keeps (train/checkpointing.h), not a parameter.
std::map<std::string, std::vector<int64_t>> parameter_shapes(const ModelConfig& model) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const model::ParamEntry& entry : model::build_layout(model).entries) {
    if (entry.replica == 0) shapes[entry.name] = entry.global_shape;
  }
  if (model.num_experts > 0 && model.moe_router_enable_expert_bias) {
    for (int layer = 0; layer < model.num_layers + model.mtp_num_layers; ++layer) {
      if (model.is_moe_layer(layer)) shapes[model::layer_prefix(layer) + "mlp.router.expert_bias"] = {model.num_experts};
    }
  }
  return shapes;
}

// The HF shape of `tensor`: its parts stacked along dimension 0 (vocabulary rows cut to the
// real vocabulary), transposed when HF stores the transpose.
std::vector<int64_t> hf_shape(const HfTensor& tensor, const ModelConfig& model,
                              const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::vector<int64_t> shape = shapes.at(tensor.mt_names.front());
  shape[0] = 0;
  for (const std::string& name : tensor.mt_names) shape[0] += tensor.vocabulary ? model.vocab_size : shapes.at(name)[0];
  if (tensor.transposed) std::swap(shape[0], shape[1]);
  return shape;
}

// (rows, cols) -> (cols, rows).
std::vector<float> transpose(const std::vector<float>& values, int64_t rows, int64_t cols) {
  std::vector<float> out(values.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = values[static_cast<size_t>(r * cols + c)];
  }
  return out;
}

int64_t row_width(const std::vector<int64_t>& shape) {
  int64_t width = 1;
  for (size_t d = 1; d < shape.size(); ++d) width *= shape[d];
  return width;
}

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(what, std::string("not JSON: ") + e.what());
  }
}

// Writes `text` to `path` under a temporary name, fsynced, renamed.
void write_text_file(const std::string& path, const std::string& text) {
  TemporaryFile temporary(path);
  {
    std::ofstream out(temporary.path(), std::ios::binary);
    out << text;
    out.flush();
    if (!out) throw Error(path, "cannot write " + temporary.path());
  }
  temporary.commit();
}

// The tensors of an HF directory: model.safetensors, or the shards model.safetensors.index.json names.
class HfWeights {
 public:
  explicit HfWeights(const std::string& directory) {
    const std::filesystem::path dir(directory);
    const std::filesystem::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
    if (std::filesystem::exists(single)) {
      source_ = single.string();
      add_file(single.string());
    } else if (std::filesystem::exists(index)) {
      source_ = "the shards of " + index.string();
      std::ifstream in(index);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const nlohmann::json parsed = parse_json(text, index.string());
      if (!parsed.contains("weight_map") || !parsed["weight_map"].is_object()) {
        throw Error(index.string(), "has no weight_map object");
      }
      std::map<std::string, bool> files;
      for (const auto& [name, file] : parsed["weight_map"].items()) files[file.get<std::string>()] = true;
      for (const auto& [file, unused] : files) add_file((dir / file).string());
    } else {
      throw Error(directory, "holds neither model.safetensors nor model.safetensors.index.json");
    }
  }
  const SafetensorsEntry* find(const std::string& name) const {
    const auto found = where_.find(name);
    return found == where_.end() ? nullptr : found->second.second;
  }
  std::vector<float> read(const std::string& name) const { return where_.at(name).first->read(name); }
  // Where a missing tensor would be: the one file, or the index of the shards.
  const std::string& source() const { return source_; }
  // Bytes no tensor covers (refused once the missing tensors are named: issue 28 U16).
  void refuse_holes() const {
    for (const auto& reader : readers_) {
      if (!reader->hole().empty()) throw Error(reader->hole(), "");
    }
  }
  std::vector<std::string> names() const {
    std::vector<std::string> names;
    for (const auto& [name, unused] : where_) names.push_back(name);
    return names;
  }

 private:
  void add_file(const std::string& path) {
    readers_.push_back(std::make_unique<SafetensorsReader>(path, SafetensorsReader::Holes::keep));
    for (const SafetensorsEntry& entry : readers_.back()->entries()) {
      if (where_.count(entry.name)) throw Error(path, "tensor " + entry.name + " is also in another shard");
      where_[entry.name] = {readers_.back().get(), &entry};
    }
  }
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsReader>> readers_;
  std::map<std::string, std::pair<const SafetensorsReader*, const SafetensorsEntry*>> where_;
};

// A config.json value: `key` must be present with the JSON type `get` accepts.
template <typename T>
T required(const nlohmann::json& config, const char* key, const std::string& path) {
  if (!config.contains(key) || config[key].is_null()) throw UsageError(path, std::string("config.json has no ") + key);
  try {
    return config[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    throw UsageError(path, std::string("config.json: ") + key + " has the wrong type");
  }
}

template <typename T>
T optional_value(const nlohmann::json& config, const char* key, T fallback, const std::string& path) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  return required<T>(config, key, path);
}

}  // namespace

namespace {

// What HF's MixtralForCausalLM computes in every layer: a SwiGLU expert MLP of
// intermediate_size, softmax over all experts, top-k, the k probabilities renormalised to sum 1,
// no token dropped. mt's (Megatron's) default softmax router takes the top-k of the logits and
// softmaxes over those k: the same experts (softmax is monotonic) and the same weights
// (exp(l_i) / sum_k exp(l_k) = p_i / sum_k p_k). Everything else changes the routing or adds
// parameters HF's Mixtral has no name for; it is refused naming mt's flag.
void check_mixtral_routing(const ModelConfig& m, const std::string& what) {
  auto refuse = [&](bool bad, const std::string& flag, const std::string& why) {
    if (bad) throw UsageError(what, flag + " has no Hugging Face export: " + why);
  };
  refuse(m.moe_router_enable_expert_bias, "--moe-router-enable-expert-bias", "MixtralForCausalLM's router has no bias");
  refuse(m.moe_router_score_function != model::MoeScoreFunction::softmax, "--moe-router-score-function sigmoid",
         "MixtralForCausalLM routes with a softmax");
  refuse(m.moe_router_pre_softmax, "--moe-router-pre-softmax",
         "Megatron keeps the top-k of the softmax over all experts unnormalised, MixtralForCausalLM renormalises them");
  refuse(m.moe_router_num_groups.has_value(), "--moe-router-num-groups", "MixtralForCausalLM has no group-limited routing");
  refuse(m.moe_topk_scaling() != 1.0f, "--moe-router-topk-scaling-factor", "MixtralForCausalLM does not scale the gates");
  refuse(m.moe_expert_capacity_factor.has_value(), "--moe-expert-capacity-factor",
         "MixtralForCausalLM drops no tokens");
  refuse(m.moe_shared_expert_intermediate_size > 0, "--moe-shared-expert-intermediate-size",
         "MixtralForCausalLM has no shared experts");
  refuse(m.moe_layer_count() != m.num_layers, "--moe-layer-freq",
         "MixtralForCausalLM has no dense layers between its MoE layers");
}

// The layers before the first MoE layer (DeepSeek's first_k_dense_replace); all of them without MoE.
int first_dense_layers(const ModelConfig& m) {
  for (int layer = 0; layer < m.num_layers; ++layer) {
    if (m.is_moe_layer(layer)) return layer;
  }
  return m.num_layers;
}

// What DeepseekV3ForCausalLM computes (see the header); the rest is refused naming mt's flag.
void check_deepseek(const ModelConfig& m, const std::string& what) {
  auto refuse = [&](bool bad, const std::string& flag, const std::string& why) {
    if (bad) throw UsageError(what, flag + " has no Hugging Face export: " + why);
  };
  refuse(!m.qk_layernorm, "--multi-latent-attention without --qk-layernorm",
         "DeepseekV3ForCausalLM always norms the latents (q_a_layernorm, kv_a_layernorm)");
  if (m.rope_type == model::RopeType::yarn) {
    refuse(std::llround(m.rotary_scaling_factor * m.original_max_position_embeddings) != m.max_position_embeddings,
           "--rotary-scaling-factor",
           "HF's YaRN takes its factor from max_position_embeddings / original_max_position_embeddings (" +
               std::to_string(m.max_position_embeddings) + " / " + std::to_string(m.original_max_position_embeddings) + ")");
  }
  if (m.num_experts == 0) return;
  refuse(m.moe_router_score_function != model::MoeScoreFunction::sigmoid, "--moe-router-score-function softmax",
         "DeepseekV3ForCausalLM routes with sigmoid scores");
  refuse(!m.moe_router_enable_expert_bias, "MoE without --moe-router-enable-expert-bias",
         "DeepseekV3ForCausalLM's router always adds e_score_correction_bias");
  refuse(m.moe_router_num_groups.has_value() && m.moe_router_topk != 2 * m.moe_router_group_topk.value_or(0),
         "--moe-router-group-topk " + std::to_string(m.moe_router_group_topk.value_or(0)),
         "DeepseekV3ForCausalLM scores each group by its best 2 experts, Megatron by its best top-k / group-topk (" +
             std::to_string(m.moe_router_topk) + " / " + std::to_string(m.moe_router_group_topk.value_or(0)) + ")");
  refuse(m.moe_expert_capacity_factor.has_value(), "--moe-expert-capacity-factor", "DeepseekV3ForCausalLM drops no tokens");
  refuse(m.moe_shared_expert_intermediate_size == 0 || m.moe_shared_expert_intermediate_size % m.moe_ffn() != 0,
         "--moe-shared-expert-intermediate-size " + std::to_string(m.moe_shared_expert_intermediate_size),
         "DeepseekV3ForCausalLM's shared experts are n_shared_experts >= 1 times --moe-ffn-hidden-size wide");
  for (int layer = first_dense_layers(m); layer < m.num_layers; ++layer) {
    refuse(!m.is_moe_layer(layer), "--moe-layer-freq", "DeepseekV3ForCausalLM's dense layers are its first ones only");
  }
}

}  // namespace

HfArchitecture hf_architecture(const ModelConfig& m) {
  const std::string what = "model " + m.name;
  const bool llama_shaped = m.normalization == model::Normalization::rmsnorm &&
                            m.position_embedding == model::PositionEmbedding::rope && m.swiglu && !m.add_bias_linear;
  if (m.multi_latent_attention) {
    if (!llama_shaped) {
      throw UsageError(what, "--multi-latent-attention exports as DeepseekV3ForCausalLM only (RMSNorm, rope, SwiGLU, "
                             "no biases)");
    }
    check_deepseek(m, what);
    return HfArchitecture::deepseek_v3;
  }
  if (m.mtp_num_layers > 0) {
    throw UsageError(what, "--mtp-num-layers has no Hugging Face export without --multi-latent-attention "
                           "(DeepseekV3ForCausalLM, the architecture with MTP layers, has MLA)");
  }
  if (m.head_dim() * m.num_attention_heads != m.hidden_size) {
    throw UsageError(what, "kv_channels x num_attention_heads differs from hidden_size, which GPT2LMHeadModel, "
                           "LlamaForCausalLM and MixtralForCausalLM cannot express");
  }
  if (m.num_experts > 0) {
    if (!llama_shaped) {
      throw UsageError(what, "mixture of experts exports as MixtralForCausalLM only (RMSNorm, rope, SwiGLU, no biases)");
    }
    check_mixtral_routing(m, what);
    return HfArchitecture::mixtral;
  }
  if (m.normalization == model::Normalization::layernorm && m.position_embedding == model::PositionEmbedding::learned_absolute &&
      !m.swiglu && m.add_bias_linear && m.query_groups() == m.num_attention_heads) {
    return HfArchitecture::gpt2;
  }
  if (llama_shaped) return HfArchitecture::llama;
  throw UsageError(what, "no Hugging Face architecture matches (GPT2LMHeadModel: LayerNorm, learned positions, GELU, "
                         "biases, no GQA; LlamaForCausalLM: RMSNorm, rope, SwiGLU, no biases)");
}

const char* hf_architecture_name(HfArchitecture architecture) {
  switch (architecture) {
    case HfArchitecture::gpt2: return "GPT2LMHeadModel";
    case HfArchitecture::llama: return "LlamaForCausalLM";
    case HfArchitecture::mixtral: return "MixtralForCausalLM";
    case HfArchitecture::deepseek_v3: return "DeepseekV3ForCausalLM";
  }
  return "";
}

namespace {

// DeepseekV3ForCausalLM's tensors (see the header): layers 0 .. L-1, then each MTP depth as layer L + k.
std::vector<HfTensor> deepseek_tensors(const ModelConfig& m) {
  std::vector<HfTensor> t;
  auto add = [&](std::string hf, std::string mt, bool vocabulary = false, bool copy = false) {
    t.push_back(HfTensor{std::move(hf), {std::move(mt)}, false, vocabulary, copy});
  };
  // A SwiGLU MLP: HF's gate/up/down projections under `hf`, mt's fc1 gate/up and fc2 under `mt`.
  auto add_mlp = [&](const std::string& hf, const std::string& mt) {
    add(hf + "gate_proj.weight", mt + "linear_fc1_gate.weight");
    add(hf + "up_proj.weight", mt + "linear_fc1_up.weight");
    add(hf + "down_proj.weight", mt + "linear_fc2.weight");
  };
  const std::string output = m.untie_embeddings_and_output_weights ? "output_layer.weight" : "embedding.word_embeddings.weight";
  add("model.embed_tokens.weight", "embedding.word_embeddings.weight", true);
  for (int layer = 0; layer < m.num_layers + m.mtp_num_layers; ++layer) {
    const std::string mt = model::layer_prefix(layer), hf = "model.layers." + std::to_string(layer) + ".";
    const std::string attention = mt + "self_attention.";
    add(hf + "input_layernorm.weight", mt + "input_layernorm.weight");
    if (m.q_lora_rank > 0) {
      add(hf + "self_attn.q_a_proj.weight", attention + "linear_q_down_proj.weight");
      add(hf + "self_attn.q_a_layernorm.weight", attention + "q_layernorm.weight");
      add(hf + "self_attn.q_b_proj.weight", attention + "linear_q_up_proj.weight");
    } else {
      add(hf + "self_attn.q_proj.weight", attention + "linear_q_proj.weight");
    }
    add(hf + "self_attn.kv_a_proj_with_mqa.weight", attention + "linear_kv_down_proj.weight");
    add(hf + "self_attn.kv_a_layernorm.weight", attention + "kv_layernorm.weight");
    add(hf + "self_attn.kv_b_proj.weight", attention + "linear_kv_up_proj.weight");
    add(hf + "self_attn.o_proj.weight", attention + "linear_proj.weight");
    add(hf + "post_attention_layernorm.weight", mt + "pre_mlp_layernorm.weight");
    if (!m.is_moe_layer(layer)) {
      add_mlp(hf + "mlp.", mt + "mlp.");
    } else {
      add(hf + "mlp.gate.weight", mt + "mlp.router.weight");
      add(hf + "mlp.gate.e_score_correction_bias", mt + "mlp.router.expert_bias");
      for (int e = 0; e < m.num_experts; ++e) {
        add_mlp(hf + "mlp.experts." + std::to_string(e) + ".", mt + "mlp.experts." + std::to_string(e) + ".");
      }
      add_mlp(hf + "mlp.shared_experts.", mt + "mlp.shared_experts.");
    }
    if (layer < m.num_layers) continue;
    const std::string depth = "mtp.layers." + std::to_string(layer - m.num_layers) + ".";
    add(hf + "enorm.weight", depth + "enorm.weight");
    add(hf + "hnorm.weight", depth + "hnorm.weight");
    add(hf + "eh_proj.weight", depth + "eh_proj.weight");
    add(hf + "shared_head.norm.weight", depth + "final_layernorm.weight");
    add(hf + "embed_tokens.weight", "embedding.word_embeddings.weight", true, true);
    add(hf + "shared_head.head.weight", output, true, true);
  }
  add("model.norm.weight", "decoder.final_layernorm.weight");
  if (m.untie_embeddings_and_output_weights) add("lm_head.weight", "output_layer.weight", true);
  return t;
}

}  // namespace

std::vector<HfTensor> hf_tensors(const ModelConfig& m) {
  const HfArchitecture architecture = hf_architecture(m);
  if (architecture == HfArchitecture::deepseek_v3) return deepseek_tensors(m);
  std::vector<HfTensor> t;
  auto add = [&](std::string hf, std::vector<std::string> mt, bool transposed = false, bool vocabulary = false) {
    t.push_back(HfTensor{std::move(hf), std::move(mt), transposed, vocabulary});
  };
  const bool tied = !m.untie_embeddings_and_output_weights;
  if (architecture == HfArchitecture::gpt2) {
    add("transformer.wte.weight", {"embedding.word_embeddings.weight"}, false, true);
    add("transformer.wpe.weight", {"embedding.position_embeddings.weight"});
    for (int layer = 0; layer < m.num_layers; ++layer) {
      const std::string mt = model::layer_prefix(layer), hf = "transformer.h." + std::to_string(layer) + ".";
      for (const char* field : {"weight", "bias"}) {
        const std::string f = field;
        const bool weight = f == "weight";
        add(hf + "ln_1." + f, {mt + "input_layernorm." + f});
        add(hf + "attn.c_attn." + f,
            {mt + "self_attention.linear_q." + f, mt + "self_attention.linear_k." + f, mt + "self_attention.linear_v." + f},
            weight);
        add(hf + "attn.c_proj." + f, {mt + "self_attention.linear_proj." + f}, weight);
        add(hf + "ln_2." + f, {mt + "pre_mlp_layernorm." + f});
        add(hf + "mlp.c_fc." + f, {mt + "mlp.linear_fc1." + f}, weight);
        add(hf + "mlp.c_proj." + f, {mt + "mlp.linear_fc2." + f}, weight);
      }
    }
    add("transformer.ln_f.weight", {"decoder.final_layernorm.weight"});
    add("transformer.ln_f.bias", {"decoder.final_layernorm.bias"});
  } else {
    add("model.embed_tokens.weight", {"embedding.word_embeddings.weight"}, false, true);
    for (int layer = 0; layer < m.num_layers; ++layer) {
      const std::string mt = model::layer_prefix(layer), hf = "model.layers." + std::to_string(layer) + ".";
      add(hf + "input_layernorm.weight", {mt + "input_layernorm.weight"});
      add(hf + "self_attn.q_proj.weight", {mt + "self_attention.linear_q.weight"});
      add(hf + "self_attn.k_proj.weight", {mt + "self_attention.linear_k.weight"});
      add(hf + "self_attn.v_proj.weight", {mt + "self_attention.linear_v.weight"});
      add(hf + "self_attn.o_proj.weight", {mt + "self_attention.linear_proj.weight"});
      add(hf + "post_attention_layernorm.weight", {mt + "pre_mlp_layernorm.weight"});
      if (architecture == HfArchitecture::llama) {
        add(hf + "mlp.gate_proj.weight", {mt + "mlp.linear_fc1_gate.weight"});
        add(hf + "mlp.up_proj.weight", {mt + "mlp.linear_fc1_up.weight"});
        add(hf + "mlp.down_proj.weight", {mt + "mlp.linear_fc2.weight"});
        continue;
      }
      // Mixtral's expert: w2(silu(w1 x) * w3 x), so w1 is the gate, w3 the up projection.
      add(hf + "block_sparse_moe.gate.weight", {mt + "mlp.router.weight"});
      for (int e = 0; e < m.num_experts; ++e) {
        const std::string hf_expert = hf + "block_sparse_moe.experts." + std::to_string(e) + ".";
        const std::string mt_expert = mt + "mlp.experts." + std::to_string(e) + ".";
        add(hf_expert + "w1.weight", {mt_expert + "linear_fc1_gate.weight"});
        add(hf_expert + "w2.weight", {mt_expert + "linear_fc2.weight"});
        add(hf_expert + "w3.weight", {mt_expert + "linear_fc1_up.weight"});
      }
    }
    add("model.norm.weight", {"decoder.final_layernorm.weight"});
  }
  if (!tied) add("lm_head.weight", {"output_layer.weight"}, false, true);
  return t;
}

namespace {

// DeepseekV3Config's fields of `m` (the architecture checked).
void deepseek_config(const ModelConfig& m, nlohmann::ordered_json& c) {
  const bool moe = m.num_experts > 0;
  c["model_type"] = "deepseek_v3";
  c["vocab_size"] = m.vocab_size;
  c["hidden_size"] = m.hidden_size;
  c["intermediate_size"] = m.ffn_hidden_size;
  c["moe_intermediate_size"] = moe ? m.moe_ffn() : m.ffn_hidden_size;
  c["num_hidden_layers"] = m.num_layers;
  c["num_attention_heads"] = m.num_attention_heads;
  c["num_key_value_heads"] = m.num_attention_heads;
  c["n_shared_experts"] = moe ? m.moe_shared_expert_intermediate_size / m.moe_ffn() : 0;
  c["n_routed_experts"] = moe ? m.num_experts : 0;
  c["routed_scaling_factor"] = float_json(m.moe_topk_scaling());
  c["kv_lora_rank"] = m.kv_lora_rank;
  c["q_lora_rank"] = m.q_lora_rank > 0 ? nlohmann::ordered_json(m.q_lora_rank) : nlohmann::ordered_json(nullptr);
  c["qk_rope_head_dim"] = m.qk_pos_emb_head_dim;
  c["v_head_dim"] = m.v_head_dim;
  c["qk_nope_head_dim"] = m.qk_head_dim;
  c["n_group"] = m.moe_router_num_groups.value_or(1);
  c["topk_group"] = m.moe_router_group_topk.value_or(1);
  c["num_experts_per_tok"] = moe ? m.moe_router_topk : 0;
  c["first_k_dense_replace"] = first_dense_layers(m);
  c["norm_topk_prob"] = m.moe_router_topk > 1;  // Megatron's sigmoid router normalises for k > 1
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = m.max_position_embeddings;
  c["rms_norm_eps"] = float_json(m.norm_epsilon);
  c["rope_theta"] = float_json(m.rotary_base);
  if (m.rope_type == model::RopeType::yarn) {
    c["rope_scaling"] = {{"type", "yarn"},
                         {"factor", m.rotary_scaling_factor},
                         {"original_max_position_embeddings", m.original_max_position_embeddings},
                         {"beta_fast", m.yarn_beta_fast},
                         {"beta_slow", m.yarn_beta_slow},
                         {"mscale", m.mscale},
                         {"mscale_all_dim", m.mscale_all_dim},
                         {"attention_factor", static_cast<double>(kernels::yarn_concentration(
                                                  m.rotary_scaling_factor, m.mscale, m.mscale_all_dim))}};
  } else {
    c["rope_scaling"] = nullptr;
  }
  c["rope_interleave"] = true;
  c["attention_bias"] = false;
  c["attention_dropout"] = float_json(m.attention_dropout);
  c["num_nextn_predict_layers"] = m.mtp_num_layers;
  // DeepSeek's own training keys (transformers keeps and ignores them).
  c["aux_loss_alpha"] = float_json(m.moe_aux_loss_coeff);
  c["seq_aux"] = m.moe_router_load_balancing_type == model::MoeLoadBalancing::seq_aux_loss;
}

}  // namespace

nlohmann::ordered_json hf_config(const ModelConfig& m, DType dtype) {
  const HfArchitecture architecture = hf_architecture(m);
  nlohmann::ordered_json c;
  c["architectures"] = {hf_architecture_name(architecture)};
  if (architecture == HfArchitecture::deepseek_v3) {
    deepseek_config(m, c);
  } else if (architecture == HfArchitecture::gpt2) {
    c["model_type"] = "gpt2";
    c["vocab_size"] = m.vocab_size;
    c["n_positions"] = m.max_position_embeddings;
    c["n_embd"] = m.hidden_size;
    c["n_layer"] = m.num_layers;
    c["n_head"] = m.num_attention_heads;
    c["n_inner"] = m.ffn_hidden_size;
    c["activation_function"] = "gelu_new";  // GELU's tanh approximation, as mt's
    c["layer_norm_epsilon"] = float_json(m.norm_epsilon);
    c["resid_pdrop"] = float_json(m.hidden_dropout);
    c["embd_pdrop"] = float_json(m.hidden_dropout);
    c["attn_pdrop"] = float_json(m.attention_dropout);
    c["scale_attn_weights"] = true;
    c["scale_attn_by_inverse_layer_idx"] = false;
  } else {
    const bool mixtral = architecture == HfArchitecture::mixtral;
    c["model_type"] = mixtral ? "mixtral" : "llama";
    c["vocab_size"] = m.vocab_size;
    c["hidden_size"] = m.hidden_size;
    c["intermediate_size"] = mixtral ? m.moe_ffn() : m.ffn_hidden_size;
    c["num_hidden_layers"] = m.num_layers;
    c["num_attention_heads"] = m.num_attention_heads;
    c["num_key_value_heads"] = m.query_groups();
    c["max_position_embeddings"] = m.max_position_embeddings;
    c["rms_norm_eps"] = float_json(m.norm_epsilon);
    c["rope_theta"] = float_json(m.rotary_base);
    c["hidden_act"] = "silu";
    c["attention_dropout"] = float_json(m.attention_dropout);
    if (mixtral) {
      c["sliding_window"] = nullptr;
      c["num_local_experts"] = m.num_experts;
      c["num_experts_per_tok"] = m.moe_router_topk;
      // The training-time load-balancing coefficient (transformers adds its aux loss only with
      // output_router_logits, and reduces it its own way); nothing of it changes the logits.
      c["router_aux_loss_coef"] = float_json(m.moe_aux_loss_coeff);
      c["output_router_logits"] = false;
      c["router_jitter_noise"] = 0.0;
    } else {
      c["rope_scaling"] = nullptr;
      c["attention_bias"] = false;
      c["mlp_bias"] = false;
    }
  }
  c["initializer_range"] = float_json(m.init_method_std);
  c["tie_word_embeddings"] = !m.untie_embeddings_and_output_weights;
  c["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : dtype == DType::f16 ? "float16" : "float32";
  c["use_cache"] = true;
  return c;
}

namespace {

void refuse_field_unless(bool ok, const std::string& path, const std::string& key, const std::string& why) {
  if (!ok) throw UsageError(path, "config.json: " + key + " " + why);
}

// The fields LlamaForCausalLM and MixtralForCausalLM share (attention, norms, rope).
void llama_from_hf(const nlohmann::json& c, const std::string& path, ModelConfig& m) {
  const bool mixtral = optional_value<std::string>(c, "model_type", "", path) == "mixtral";
  m.name = mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM";
  m.num_layers = required<int>(c, "num_hidden_layers", path);
  m.hidden_size = required<int>(c, "hidden_size", path);
  m.num_attention_heads = required<int>(c, "num_attention_heads", path);
  m.num_query_groups = optional_value<int>(c, "num_key_value_heads", m.num_attention_heads, path);
  m.ffn_hidden_size = required<int>(c, "intermediate_size", path);
  m.max_position_embeddings = required<int>(c, "max_position_embeddings", path);
  m.norm_epsilon = static_cast<float>(optional_value<double>(c, "rms_norm_eps", mixtral ? 1e-5 : 1e-6, path));
  m.rotary_base = static_cast<float>(optional_value<double>(c, "rope_theta", mixtral ? 1e6 : 10000.0, path));
  m.attention_dropout = static_cast<float>(optional_value<double>(c, "attention_dropout", 0.0, path));
  m.hidden_dropout = 0.0f;
  m.normalization = model::Normalization::rmsnorm;
  m.position_embedding = model::PositionEmbedding::rope;
  m.swiglu = true;
  m.add_bias_linear = false;
  const std::string activation = optional_value<std::string>(c, "hidden_act", "silu", path);
  refuse_field_unless(activation == "silu", path, "hidden_act", "is " + activation + "; mt's SwiGLU uses silu");
  refuse_field_unless(!optional_value<bool>(c, "attention_bias", false, path), path, "attention_bias",
                "is true; mt's LLaMA has no biases");
  refuse_field_unless(!optional_value<bool>(c, "mlp_bias", false, path), path, "mlp_bias", "is true; mt's LLaMA has no biases");
  refuse_field_unless(!c.contains("rope_scaling") || c["rope_scaling"].is_null(), path, "rope_scaling",
                "is set; mt implements plain RoPE only");
  refuse_field_unless(optional_value<int>(c, "head_dim", m.hidden_size / std::max(1, m.num_attention_heads), path) *
                        m.num_attention_heads == m.hidden_size,
                path, "head_dim", "times num_attention_heads differs from hidden_size, which mt's import does not handle");
  m.untie_embeddings_and_output_weights = !optional_value<bool>(c, "tie_word_embeddings", false, path);
}

// MixtralForCausalLM's experts and router: every layer MoE, intermediate_size per expert, the
// softmax router mt runs by default (see check_mixtral_routing), dropless; router_aux_loss_coef
// becomes --moe-aux-loss-coeff with aux_loss balancing, the all-to-all dispatcher as mt's presets.
void mixtral_from_hf(const nlohmann::json& c, const std::string& path, ModelConfig& m) {
  m.num_experts = required<int>(c, "num_local_experts", path);
  m.moe_router_topk = optional_value<int>(c, "num_experts_per_tok", 2, path);
  m.moe_ffn_hidden_size = 0;  // the experts take --ffn-hidden-size (intermediate_size), as the mixtral presets
  m.moe_router_load_balancing_type = model::MoeLoadBalancing::aux_loss;
  m.moe_aux_loss_coeff = static_cast<float>(optional_value<double>(c, "router_aux_loss_coef", 0.001, path));
  m.moe_token_dispatcher_type = model::MoeDispatcher::alltoall;
  refuse_field_unless(optional_value<double>(c, "router_jitter_noise", 0.0, path) == 0.0, path, "router_jitter_noise",
                "is not 0; mt's router adds no noise");
  refuse_field_unless(!c.contains("sliding_window") || c["sliding_window"].is_null(), path, "sliding_window",
                "is set; mt's attention is causal over the whole sequence");
}

// DeepseekV3ForCausalLM (see the header): MLA with the latent norms, the first
// first_k_dense_replace layers dense, the rest MoE with Megatron's sigmoid router, the expert bias
// and shared experts; num_nextn_predict_layers MTP depths; YaRN from rope_scaling.
void deepseek_from_hf(const nlohmann::json& c, const std::string& path, ModelConfig& m) {
  m.name = "DeepseekV3ForCausalLM";
  m.num_layers = required<int>(c, "num_hidden_layers", path);
  m.hidden_size = required<int>(c, "hidden_size", path);
  m.num_attention_heads = required<int>(c, "num_attention_heads", path);
  m.num_query_groups = m.num_attention_heads;
  m.ffn_hidden_size = required<int>(c, "intermediate_size", path);
  m.max_position_embeddings = required<int>(c, "max_position_embeddings", path);
  m.norm_epsilon = static_cast<float>(optional_value<double>(c, "rms_norm_eps", 1e-6, path));
  m.rotary_base = static_cast<float>(optional_value<double>(c, "rope_theta", 10000.0, path));
  m.attention_dropout = static_cast<float>(optional_value<double>(c, "attention_dropout", 0.0, path));
  m.hidden_dropout = 0.0f;
  m.normalization = model::Normalization::rmsnorm;
  m.position_embedding = model::PositionEmbedding::rope;
  m.swiglu = true;
  m.add_bias_linear = false;
  m.multi_latent_attention = true;
  m.qk_layernorm = true;
  m.q_lora_rank = optional_value<int>(c, "q_lora_rank", 0, path);
  m.kv_lora_rank = required<int>(c, "kv_lora_rank", path);
  m.qk_head_dim = required<int>(c, "qk_nope_head_dim", path);
  m.qk_pos_emb_head_dim = required<int>(c, "qk_rope_head_dim", path);
  m.v_head_dim = required<int>(c, "v_head_dim", path);
  m.mtp_num_layers = optional_value<int>(c, "num_nextn_predict_layers", 0, path);
  m.untie_embeddings_and_output_weights = !optional_value<bool>(c, "tie_word_embeddings", false, path);
  refuse_field_unless(optional_value<std::string>(c, "hidden_act", "silu", path) == "silu", path, "hidden_act",
                      "is not silu; mt's SwiGLU uses silu");
  refuse_field_unless(!optional_value<bool>(c, "attention_bias", false, path), path, "attention_bias",
                      "is true; mt's MLA has no biases");
  refuse_field_unless(optional_value<bool>(c, "rope_interleave", true, path), path, "rope_interleave",
                      "is false; mt rotates MLA's rope part interleaved, as DeepSeek-V3's weights are laid out");
  refuse_field_unless(optional_value<int>(c, "num_key_value_heads", m.num_attention_heads, path) == m.num_attention_heads,
                      path, "num_key_value_heads", "differs from num_attention_heads; MLA has no query groups");
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
    const nlohmann::json& r = c["rope_scaling"];
    const std::string type = optional_value<std::string>(r, "type", optional_value<std::string>(r, "rope_type", "", path), path);
    refuse_field_unless(type == "yarn", path, "rope_scaling", "is " + type + "; mt implements YaRN");
    m.rope_type = model::RopeType::yarn;
    m.rotary_scaling_factor = required<double>(r, "factor", path);
    m.original_max_position_embeddings = required<int>(r, "original_max_position_embeddings", path);
    m.yarn_beta_fast = optional_value<double>(r, "beta_fast", 32.0, path);
    m.yarn_beta_slow = optional_value<double>(r, "beta_slow", 1.0, path);
    m.mscale = optional_value<double>(r, "mscale", 1.0, path);
    m.mscale_all_dim = optional_value<double>(r, "mscale_all_dim", 0.0, path);
  }
  const int experts = optional_value<int>(c, "n_routed_experts", 0, path);
  const int dense = std::min(optional_value<int>(c, "first_k_dense_replace", 0, path), m.num_layers);
  if (experts == 0 || dense == m.num_layers) return;
  m.num_experts = experts;
  m.moe_router_topk = required<int>(c, "num_experts_per_tok", path);
  m.moe_ffn_hidden_size = required<int>(c, "moe_intermediate_size", path);
  m.moe_shared_expert_intermediate_size = m.moe_ffn_hidden_size * required<int>(c, "n_shared_experts", path);
  m.moe_layer_pattern.assign(static_cast<size_t>(m.num_layers), 1);
  std::fill(m.moe_layer_pattern.begin(), m.moe_layer_pattern.begin() + dense, 0);
  m.moe_router_score_function = model::MoeScoreFunction::sigmoid;
  m.moe_router_enable_expert_bias = true;
  m.moe_router_topk_scaling_factor = static_cast<float>(optional_value<double>(c, "routed_scaling_factor", 1.0, path));
  const int groups = optional_value<int>(c, "n_group", 1, path);
  if (groups > 1) {
    m.moe_router_num_groups = groups;
    m.moe_router_group_topk = optional_value<int>(c, "topk_group", 1, path);
  }
  refuse_field_unless(optional_value<bool>(c, "norm_topk_prob", true, path) == (m.moe_router_topk > 1), path,
                      "norm_topk_prob", "differs from Megatron's sigmoid router, which normalises the gates when k > 1");
  m.moe_router_load_balancing_type =
      optional_value<bool>(c, "seq_aux", true, path) ? model::MoeLoadBalancing::seq_aux_loss : model::MoeLoadBalancing::aux_loss;
  m.moe_aux_loss_coeff = static_cast<float>(optional_value<double>(c, "aux_loss_alpha", 0.0, path));
  m.moe_token_dispatcher_type = model::MoeDispatcher::alltoall;
}

}  // namespace

ModelConfig model_config_from_hf(const nlohmann::json& c, const std::string& path, int make_vocab_size_divisible_by) {
  const std::string model_type = optional_value<std::string>(c, "model_type", "", path);
  ModelConfig m;
  m.make_vocab_size_divisible_by = make_vocab_size_divisible_by;
  m.vocab_size = required<int64_t>(c, "vocab_size", path);
  m.init_method_std = static_cast<float>(optional_value<double>(c, "initializer_range", 0.02, path));
  auto refuse_unless = [&](bool ok, const std::string& key, const std::string& why) {
    if (!ok) throw UsageError(path, "config.json: " + key + " " + why);
  };
  if (model_type == "gpt2") {
    m.name = "GPT2LMHeadModel";
    m.num_layers = required<int>(c, "n_layer", path);
    m.hidden_size = required<int>(c, "n_embd", path);
    m.num_attention_heads = required<int>(c, "n_head", path);
    m.ffn_hidden_size = optional_value<int>(c, "n_inner", 4 * m.hidden_size, path);
    m.max_position_embeddings = required<int>(c, "n_positions", path);
    m.norm_epsilon = static_cast<float>(optional_value<double>(c, "layer_norm_epsilon", 1e-5, path));
    // mt (as Megatron) has one hidden dropout for the embedding, attention and MLP outputs:
    // resid_pdrop; embd_pdrop (transformers' default equals it) has no flag of its own.
    m.hidden_dropout = static_cast<float>(optional_value<double>(c, "resid_pdrop", 0.1, path));
    m.attention_dropout = static_cast<float>(optional_value<double>(c, "attn_pdrop", 0.1, path));
    const std::string activation = optional_value<std::string>(c, "activation_function", "gelu_new", path);
    refuse_unless(activation == "gelu_new" || activation == "gelu_pytorch_tanh", "activation_function",
                  "is " + activation + "; mt's MLP uses GELU's tanh approximation (gelu_new)");
    refuse_unless(optional_value<bool>(c, "scale_attn_weights", true, path), "scale_attn_weights",
                  "is false; mt scales attention by 1/sqrt(head_dim)");
    refuse_unless(!optional_value<bool>(c, "scale_attn_by_inverse_layer_idx", false, path),
                  "scale_attn_by_inverse_layer_idx", "is true, which mt does not implement");
    m.untie_embeddings_and_output_weights = !optional_value<bool>(c, "tie_word_embeddings", true, path);
  } else if (model_type == "llama" || model_type == "mixtral") {
    llama_from_hf(c, path, m);
    if (model_type == "mixtral") mixtral_from_hf(c, path, m);
  } else if (model_type == "deepseek_v3") {
    deepseek_from_hf(c, path, m);
  } else {
    throw Error(path, "model_type '" + model_type + "' is not imported (mt imports gpt2, llama, mixtral and deepseek_v3)");
  }
  m.seq_length = m.max_position_embeddings;
  if (m.num_query_groups == 0) m.num_query_groups = m.num_attention_heads;
  try {
    m.validate();
  } catch (const Error& e) {
    throw UsageError(path, std::string("config.json gives an invalid model: ") + e.what());
  }
  hf_architecture(m);
  return m;
}

HfExportResult export_hf(const CheckpointReader& checkpoint, const std::string& directory, DType dtype) {
  ModelConfig m;
  try {
    m = model::config_from_json(parse_json(checkpoint.state().model_config, checkpoint.path() + ": model_config"));
  } catch (const Error& e) {
    throw Error(checkpoint.path(), std::string("attribute model_config: ") + e.what());
  }
  HfExportResult result;
  result.architecture = hf_architecture(m);
  const std::map<std::string, std::vector<int64_t>> shapes = parameter_shapes(m);
  SafetensorsWriter writer;
  for (const HfTensor& tensor : hf_tensors(m)) {
    std::vector<float> stacked;
    for (const std::string& name : tensor.mt_names) {
      const std::vector<int64_t>& shape = shapes.at(name);
      Box box{std::vector<int64_t>(shape.size(), 0), shape};
      if (tensor.vocabulary) box.extent[0] = m.vocab_size;  // the pad rows stay behind
      std::vector<float> values(static_cast<size_t>(box.elements()));
      checkpoint.read_box("model/" + name, shape, box, values.data());
      stacked.insert(stacked.end(), values.begin(), values.end());
    }
    const std::vector<int64_t> shape = hf_shape(tensor, m, shapes);
    if (tensor.transposed) stacked = transpose(stacked, shape[1], shape[0]);
    writer.add(tensor.name, dtype, shape, std::move(stacked));
    ++result.tensors;
  }
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) throw Error(directory, "cannot create the directory: " + error.message());
  const std::filesystem::path dir(directory);
  result.bytes = writer.write((dir / "model.safetensors").string(), {{"format", "pt"}});
  write_text_file((dir / "config.json").string(), hf_config(m, dtype).dump(2) + "\n");
  return result;
}

HfImportResult import_hf(const std::string& directory, const std::string& path, int make_vocab_size_divisible_by) {
  const std::string config_path = (std::filesystem::path(directory) / "config.json").string();
  std::ifstream in(config_path);
  if (!in) throw Error(config_path, "cannot open (an HF model directory holds config.json)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  HfImportResult result;
  result.model = model_config_from_hf(parse_json(text, config_path), config_path, make_vocab_size_divisible_by);
  const ModelConfig& m = result.model;
  const HfWeights weights(directory);
  const std::map<std::string, std::vector<int64_t>> shapes = parameter_shapes(m);
  std::vector<HfTensor> tensors = hf_tensors(m);
  // Released GPT-2 files name the tensors without the "transformer." of GPT2LMHeadModel.
  const bool unprefixed = weights.find("transformer.wte.weight") == nullptr && weights.find("wte.weight") != nullptr;
  // Every tensor the model needs is named when missing before the file's layout is judged: a
  // tensor deleted from the header leaves a hole, which would name the wrong tensor (U16).
  for (HfTensor& tensor : tensors) {
    if (unprefixed && tensor.name.rfind("transformer.", 0) == 0) tensor.name.erase(0, std::string("transformer.").size());
    const SafetensorsEntry* entry = weights.find(tensor.name);
    if (entry == nullptr) throw Error("tensor " + tensor.name, "missing from " + weights.source());
    const std::vector<int64_t> shape = hf_shape(tensor, m, shapes);
    if (entry->shape != shape) {
      throw Error(directory, "tensor " + tensor.name + " has shape " + shape_text(entry->shape) + ", config.json's model needs " +
                                 shape_text(shape));
    }
  }
  weights.refuse_holes();
  std::map<std::string, bool> used;
  CheckpointWriter writer(path);
  std::map<std::string, std::string> first_hf_name;  // mt tensor -> the HF tensor it was read from
  for (const HfTensor& tensor : tensors) {
    const std::vector<int64_t> shape = hf_shape(tensor, m, shapes);
    used[tensor.name] = true;
    if (tensor.copy) continue;  // checked against the tensor it copies below
    std::vector<float> stacked = weights.read(tensor.name);
    first_hf_name.emplace(tensor.mt_names.front(), tensor.name);
    check_finite(directory, tensor.name, stacked.data(), static_cast<int64_t>(stacked.size()),
                 " (mt imports finite weights only)");
    if (tensor.transposed) stacked = transpose(stacked, shape[0], shape[1]);
    int64_t row = 0;
    for (const std::string& name : tensor.mt_names) {
      const std::vector<int64_t>& mt_shape = shapes.at(name);
      const int64_t width = row_width(mt_shape), rows = tensor.vocabulary ? m.vocab_size : mt_shape[0];
      std::vector<float> values(static_cast<size_t>(mt_shape[0] * width), 0.0f);  // pad rows stay zero
      std::copy(stacked.begin() + row * width, stacked.begin() + (row + rows) * width, values.begin());
      row += rows;
      writer.write_tensor("model/" + name, mt_shape,
                          {TensorSlice{Box{std::vector<int64_t>(mt_shape.size(), 0), mt_shape}, values.data()}});
      ++result.tensors;
    }
  }
  for (const HfTensor& tensor : tensors) {
    if (!tensor.copy) continue;
    // mt holds one table: the copy must be it, bit for bit.
    const std::string& original = first_hf_name.at(tensor.mt_names.front());
    const std::vector<float> kept = weights.read(original), copy = weights.read(tensor.name);
    if (kept.size() != copy.size() || std::memcmp(kept.data(), copy.data(), kept.size() * sizeof(float)) != 0) {
      throw UsageError(directory, "tensor " + tensor.name + " differs from " + original +
                                      ", of which mt keeps one table (DeepSeek-V3's MTP layer shares it)");
    }
  }
  for (const std::string& name : weights.names()) {
    if (!used.count(name)) result.ignored.push_back(name);
  }
  CheckpointState state;
  state.resumable = false;
  state.has_optimizer = false;
  state.model_config = model::to_json(m).dump();
  result.bytes = writer.commit(state);
  return result;
}

}  // namespace mt::io
