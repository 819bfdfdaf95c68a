// Model configuration, presets and parameter counts (see config.h).
#include "model/config.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/json_fields.h"

namespace mt::model {

int64_t ModelConfig::padded_vocab_size() const {
  const int64_t multiple = make_vocab_size_divisible_by > 0 ? make_vocab_size_divisible_by : 1;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

void ModelConfig::validate() const {
  auto positive = [](int64_t value, const char* flag) {
    if (value <= 0) throw UsageError(flag, "must be positive (got " + std::to_string(value) + ")");
  };
  positive(num_layers, "--num-layers");
  positive(hidden_size, "--hidden-size");
  positive(ffn_hidden_size, "--ffn-hidden-size");
  positive(num_attention_heads, "--num-attention-heads");
  positive(seq_length, "--seq-length");
  positive(vocab_size, "--vocab-size");
  positive(make_vocab_size_divisible_by, "--make-vocab-size-divisible-by");
  if (vocab_size > (int64_t{1} << 31)) {
    throw UsageError("--vocab-size " + std::to_string(vocab_size), "must be at most 2147483648 (token ids are int32)");
  }
  if (kv_channels <= 0 && hidden_size % num_attention_heads != 0) {
    throw UsageError("--hidden-size " + std::to_string(hidden_size),
                     "not divisible by --num-attention-heads " + std::to_string(num_attention_heads) +
                         " (or set --kv-channels)");
  }
  if (query_groups() <= 0 || num_attention_heads % query_groups() != 0) {
    throw UsageError("--num-query-groups " + std::to_string(query_groups()),
                     "must divide --num-attention-heads " + std::to_string(num_attention_heads));
  }
  if (position_embedding == PositionEmbedding::rope && head_dim() % 2 != 0) {
    throw UsageError("--kv-channels " + std::to_string(head_dim()), "rotary embeddings need an even head dimension");
  }
  if (position_embedding == PositionEmbedding::learned_absolute && max_position_embeddings < seq_length) {
    throw UsageError("--seq-length " + std::to_string(seq_length),
                     "exceeds --max-position-embeddings " + std::to_string(max_position_embeddings));
  }
  if (!(hidden_dropout >= 0 && hidden_dropout < 1)) throw UsageError("--hidden-dropout", "must be in [0, 1)");
  if (attention_dropout != 0.0f) {
    throw UsageError("--attention-dropout " + std::to_string(attention_dropout),
                     "not supported: mt's fused attention kernel has no dropout (use 0)");
  }
  // Written as !(x > 0) so that NaN fails too.
  if (!(norm_epsilon > 0) || std::isinf(norm_epsilon)) throw UsageError("--norm-epsilon", "must be positive");
  if (!(init_method_std > 0) || std::isinf(init_method_std)) throw UsageError("--init-method-std", "must be positive");
  if (!(rotary_base > 0) || std::isinf(rotary_base)) throw UsageError("--rotary-base", "must be positive");
}

namespace {

ModelConfig gpt2(const std::string& name, int layers, int hidden, int heads) {
  ModelConfig c;
  c.name = name;
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.ffn_hidden_size = 4 * hidden;
  c.num_attention_heads = heads;
  c.num_query_groups = heads;
  c.seq_length = 1024;
  c.max_position_embeddings = 1024;
  c.vocab_size = 50257;
  c.hidden_dropout = 0.1f;  // Megatron's default
  return c;
}

ModelConfig llama3(const std::string& name, int layers, int hidden, int ffn, int heads) {
  ModelConfig c;
  c.name = name;
  c.num_layers = layers;
  c.hidden_size = hidden;
  c.ffn_hidden_size = ffn;
  c.num_attention_heads = heads;
  c.num_query_groups = 8;
  c.seq_length = 8192;
  c.max_position_embeddings = 8192;
  c.vocab_size = 128256;
  c.swiglu = true;
  c.normalization = Normalization::rmsnorm;
  c.norm_epsilon = 1e-5f;
  c.position_embedding = PositionEmbedding::rope;
  c.rotary_base = 500000.0f;
  c.untie_embeddings_and_output_weights = true;
  c.add_bias_linear = false;
  return c;
}

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names{"gpt2-124m", "gpt2-345m",   "llama3-8b", "llama3-70b",
                                              "llama3.1-405b", "tiny-gpt", "tiny-llama"};
  return names;
}

ModelConfig preset(const std::string& name) {
  if (name == "gpt2-124m") return gpt2(name, 12, 768, 12);
  if (name == "gpt2-345m") return gpt2(name, 24, 1024, 16);
  if (name == "llama3-8b") return llama3(name, 32, 4096, 14336, 32);
  if (name == "llama3-70b") return llama3(name, 80, 8192, 28672, 64);
  if (name == "llama3.1-405b") return llama3(name, 126, 16384, 53248, 128);
  if (name == "tiny-gpt") {
    ModelConfig c = gpt2(name, 2, 64, 4);
    c.seq_length = 64;
    c.max_position_embeddings = 64;
    c.vocab_size = 256;  // bytes: the demo trains on raw UTF-8 until a tokenizer lands
    c.make_vocab_size_divisible_by = 128;
    c.hidden_dropout = 0.0f;
    return c;
  }
  if (name == "tiny-llama") {
    ModelConfig c = llama3(name, 2, 64, 176, 4);
    c.num_query_groups = 2;
    c.seq_length = 64;
    c.max_position_embeddings = 64;
    c.vocab_size = 256;
    c.rotary_base = 10000.0f;
    return c;
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError("--model " + name, "unknown preset (" + known + ")");
}

long double parameter_count_wide(const ModelConfig& c, bool padded_vocabulary) {
  using Wide = long double;
  const Wide multiple = c.make_vocab_size_divisible_by > 0 ? c.make_vocab_size_divisible_by : 1;
  const Wide vocab = padded_vocabulary ? std::ceil(static_cast<Wide>(c.vocab_size) / multiple) * multiple
                                       : static_cast<Wide>(c.vocab_size);
  const Wide hidden = c.hidden_size, ffn = c.ffn_hidden_size, d = c.head_dim();
  const Wide q = c.num_attention_heads * d, kv = c.query_groups() * d;
  const Wide bias = c.add_bias_linear ? 1 : 0;
  const Wide norm = c.normalization == Normalization::layernorm ? 2 * hidden : hidden;
  Wide layer = norm + hidden * (q + 2 * kv) + bias * (q + 2 * kv) + q * hidden + bias * hidden;  // attention
  layer += norm + (c.swiglu ? 2 : 1) * ffn * hidden + bias * ffn + ffn * hidden + bias * hidden;  // MLP
  Wide total = c.num_layers * layer + norm + vocab * hidden;
  if (c.position_embedding == PositionEmbedding::learned_absolute) total += c.max_position_embeddings * hidden;
  if (c.untie_embeddings_and_output_weights) total += vocab * hidden;
  return total;
}

int64_t parameter_count(const ModelConfig& c, bool padded_vocabulary) {
  const long double total = parameter_count_wide(c, padded_vocabulary);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  return total < static_cast<long double>(kMax) ? static_cast<int64_t>(total) : kMax;
}

namespace {

const std::pair<Normalization, const char*> kNormalizations[] = {{Normalization::layernorm, "LayerNorm"},
                                                                 {Normalization::rmsnorm, "RMSNorm"}};
const std::pair<PositionEmbedding, const char*> kPositionEmbeddings[] = {
    {PositionEmbedding::learned_absolute, "learned_absolute"}, {PositionEmbedding::rope, "rope"}};

// Every field once, with Megatron's argument name (core/json_fields.h).
template <typename Visit, typename Config>
void visit_fields(Visit& visit, Config& c) {
  visit("name", c.name);
  visit("num_layers", c.num_layers);
  visit("hidden_size", c.hidden_size);
  visit("ffn_hidden_size", c.ffn_hidden_size);
  visit("num_attention_heads", c.num_attention_heads);
  visit("num_query_groups", c.num_query_groups);
  visit("kv_channels", c.kv_channels);
  visit("seq_length", c.seq_length);
  visit("max_position_embeddings", c.max_position_embeddings);
  visit("vocab_size", c.vocab_size);
  visit("make_vocab_size_divisible_by", c.make_vocab_size_divisible_by);
  visit("swiglu", c.swiglu);
  visit("normalization", c.normalization, kNormalizations);
  visit("norm_epsilon", c.norm_epsilon);
  visit("position_embedding_type", c.position_embedding, kPositionEmbeddings);
  visit("rotary_base", c.rotary_base);
  visit("untie_embeddings_and_output_weights", c.untie_embeddings_and_output_weights);
  visit("add_bias_linear", c.add_bias_linear);
  visit("init_method_std", c.init_method_std);
  visit("hidden_dropout", c.hidden_dropout);
  visit("attention_dropout", c.attention_dropout);
}

}  // namespace

nlohmann::ordered_json to_json(const ModelConfig& c) {
  ModelConfig resolved = c;  // head dimension and query groups as Megatron's arguments hold them
  if (c.num_attention_heads > 0) resolved.kv_channels = c.head_dim();
  resolved.num_query_groups = c.query_groups();
  JsonWriter writer;
  visit_fields(writer, resolved);
  return writer.json();
}

ModelConfig config_from_json(const nlohmann::json& json) {
  ModelConfig c;
  JsonFields fields(json, "model config");
  visit_fields(fields, c);
  fields.finish();
  c.validate();
  return c;
}

}  // namespace mt::model
