// Model configuration: the shape and flavour of a transformer (GPT-2 or LLaMA family), the
// named presets (the published GPT-2 and LLaMA-3 shapes), validation, and parameter counts.
// Tested in tests/unit/model/test_config.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::model {

enum class Normalization { layernorm, rmsnorm };
enum class PositionEmbedding { learned_absolute, rope };

struct ModelConfig {
  std::string name = "custom";
  int num_layers = 0;
  int hidden_size = 0;
  int ffn_hidden_size = 0;
  int num_attention_heads = 0;
  int num_query_groups = 0;  // = heads for multi-head attention
  int kv_channels = 0;       // head dim; 0 = hidden / heads
  int seq_length = 0;
  int max_position_embeddings = 0;
  int64_t vocab_size = 0;    // real vocabulary (the tokenizer's)
  int make_vocab_size_divisible_by = 128;
  bool swiglu = false;
  Normalization normalization = Normalization::layernorm;
  float norm_epsilon = 1e-5f;
  PositionEmbedding position_embedding = PositionEmbedding::learned_absolute;
  float rotary_base = 10000.0f;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;
  float init_method_std = 0.02f;
  float hidden_dropout = 0.0f;
  float attention_dropout = 0.0f;

  int head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  int query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  // Padded to a multiple of make_vocab_size_divisible_by, independent of the parallel layout.
  int64_t padded_vocab_size() const;
  // Throws mt::UsageError naming the offending flag(s).
  void validate() const;
};

// Known preset names, in --help order.
const std::vector<std::string>& preset_names();
// The preset's config; throws mt::UsageError for an unknown name.
ModelConfig preset(const std::string& name);

// Parameters of the whole model, counted on the real (unpadded) vocabulary unless padded.
int64_t parameter_count(const ModelConfig& config, bool padded_vocabulary = false);

}  // namespace mt::model
