// Model configuration, presets and parameter counts (see config.h).
#include "model/config.h"

#include <cctype>
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
  if (!(attention_dropout >= 0 && attention_dropout < 1)) {
    throw UsageError("--attention-dropout " + std::to_string(attention_dropout), "must be in [0, 1)");
  }
  // Written as !(x > 0) so that NaN fails too.
  if (!(norm_epsilon > 0) || std::isinf(norm_epsilon)) throw UsageError("--norm-epsilon", "must be positive");
  if (!(init_method_std > 0) || std::isinf(init_method_std)) throw UsageError("--init-method-std", "must be positive");
  if (!(rotary_base > 0) || std::isinf(rotary_base)) throw UsageError("--rotary-base", "must be positive");
  if (num_experts < 0) throw UsageError("--num-experts", "must be >= 0");
  if (num_experts > 0) validate_moe();
  validate_mla();
  if (mtp_num_layers < 0) throw UsageError("--mtp-num-layers", "must be >= 0");
  if (!std::isfinite(mtp_loss_scaling_factor)) throw UsageError("--mtp-loss-scaling-factor", "must be finite");
  validate_bert();
}

// BERT (issue 25): Megatron's BertModel as pretrain_bert.py builds it; what it does not combine with.
void ModelConfig::validate_bert() const {
  if (!bert) {
    if (!bert_binary_head) throw UsageError("--bert-no-binary-head", "is for BERT models only (--model tiny-bert, bert-345m)");
    return;
  }
  const std::string what = "BERT (model " + name + ")";
  if (position_embedding != PositionEmbedding::learned_absolute) {
    throw UsageError(what, "uses learned absolute positions (--position-embedding-type learned_absolute)");
  }
  if (normalization != Normalization::layernorm) throw UsageError(what, "uses LayerNorm (--normalization LayerNorm)");
  if (swiglu) throw UsageError(what, "uses a GELU MLP (not --swiglu)");
  if (num_experts > 0) throw UsageError(what, "has no mixture of experts (--num-experts)");
  if (multi_latent_attention) throw UsageError(what, "has no multi-latent attention");
  if (untie_embeddings_and_output_weights) {
    throw UsageError(what, "ties its output layer to the word embeddings (not --untie-embeddings-and-output-weights)");
  }
  if (!add_bias_linear) throw UsageError(what, "has linear biases (not --disable-bias-linear)");
  if (mtp_num_layers > 0) throw UsageError(what, "has no multi-token prediction (--mtp-num-layers)");
}

void ModelConfig::validate_moe() const {
  const std::string experts = std::to_string(num_experts);
  if (moe_router_topk < 1 || moe_router_topk > num_experts) {
    throw UsageError("--moe-router-topk " + std::to_string(moe_router_topk),
                     "must be in [1, --num-experts " + experts + "]");
  }
  if (moe_ffn_hidden_size < 0) throw UsageError("--moe-ffn-hidden-size", "must be positive");
  if (moe_shared_expert_intermediate_size < 0) {
    throw UsageError("--moe-shared-expert-intermediate-size", "must be >= 0");
  }
  if (moe_layer_freq < 1) throw UsageError("--moe-layer-freq", "must be at least 1");
  if (!moe_layer_pattern.empty() && static_cast<int>(moe_layer_pattern.size()) != num_layers) {
    throw UsageError("--moe-layer-freq", "the pattern has " + std::to_string(moe_layer_pattern.size()) +
                                             " entries for --num-layers " + std::to_string(num_layers));
  }
  for (int value : moe_layer_pattern) {
    if (value != 0 && value != 1) throw UsageError("--moe-layer-freq", "a pattern holds only 0 and 1");
  }
  if (!swiglu) throw UsageError("--num-experts " + experts, "experts are SwiGLU MLPs in mt: needs --swiglu");
  if (add_bias_linear) {
    throw UsageError("--add-bias-linear", "experts have no biases in mt: a MoE model needs --disable-bias-linear");
  }
  validate_moe_router();
  validate_moe_losses_and_capacity();
  if (moe_token_dispatcher_type == MoeDispatcher::flex) {
    throw UsageError("--moe-token-dispatcher-type flex", "not supported (alltoall; allgather runs through it)");
  }
}

void ModelConfig::validate_moe_router() const {
  if (moe_router_dtype == MoeRouterDtype::fp64) {
    throw UsageError("--moe-router-dtype fp64", "not supported (the router computes in fp32)");
  }
  if (moe_router_group_topk && !moe_router_num_groups) {
    throw UsageError("--moe-router-group-topk", "needs --moe-router-num-groups");
  }
  if (moe_router_num_groups) {
    const int groups = *moe_router_num_groups;
    const std::string flag = "--moe-router-num-groups " + std::to_string(groups);
    if (groups < 1 || num_experts % groups != 0) {
      throw UsageError(flag, "must be positive and divide --num-experts " + std::to_string(num_experts));
    }
    if (!moe_router_group_topk) throw UsageError(flag, "needs --moe-router-group-topk");
    const int kept = *moe_router_group_topk;
    if (kept < 1 || kept > groups) {
      throw UsageError("--moe-router-group-topk " + std::to_string(kept), "must be in [1, " + flag + "]");
    }
    if (moe_router_topk > kept * (num_experts / groups)) {
      throw UsageError("--moe-router-topk " + std::to_string(moe_router_topk),
                       "exceeds the experts of the --moe-router-group-topk " + std::to_string(kept) + " groups kept");
    }
  }
  if (moe_router_topk_scaling_factor &&
      (!(*moe_router_topk_scaling_factor > 0) || std::isinf(*moe_router_topk_scaling_factor))) {
    throw UsageError("--moe-router-topk-scaling-factor", "must be positive");
  }
  if (moe_router_enable_expert_bias && moe_router_score_function != MoeScoreFunction::sigmoid) {
    throw UsageError("--moe-router-enable-expert-bias", "needs --moe-router-score-function sigmoid (as Megatron)");
  }
  if (!std::isfinite(moe_router_bias_update_rate)) {
    throw UsageError("--moe-router-bias-update-rate", "must be a finite number");
  }
}

void ModelConfig::validate_moe_losses_and_capacity() const {
  if (moe_router_load_balancing_type == MoeLoadBalancing::sinkhorn) {
    throw UsageError("--moe-router-load-balancing-type sinkhorn",
                     "not supported (aux_loss, seq_aux_loss, global_aux_loss, none)");
  }
  if (!(moe_aux_loss_coeff >= 0) || std::isinf(moe_aux_loss_coeff)) {
    throw UsageError("--moe-aux-loss-coeff", "must be >= 0 and finite");
  }
  if (moe_z_loss_coeff && (!(*moe_z_loss_coeff >= 0) || std::isinf(*moe_z_loss_coeff))) {
    throw UsageError("--moe-z-loss-coeff", "must be >= 0 and finite");
  }
  if (moe_expert_capacity_factor) {
    const float factor = *moe_expert_capacity_factor;
    if (!(factor > 0) || std::isinf(factor)) throw UsageError("--moe-expert-capacity-factor", "must be positive");
    if (moe_router_load_balancing_type == MoeLoadBalancing::sinkhorn) {  // Megatron's list of dropping-capable types
      throw UsageError("--moe-expert-capacity-factor",
                       "needs --moe-router-load-balancing-type aux_loss, seq_aux_loss, global_aux_loss or none");
    }
  } else if (moe_pad_expert_input_to_capacity) {
    throw UsageError("--moe-pad-expert-input-to-capacity", "needs --moe-expert-capacity-factor");
  }
}

bool ModelConfig::moe_has_aux_loss() const {
  const bool with_loss = moe_router_load_balancing_type == MoeLoadBalancing::aux_loss ||
                         moe_router_load_balancing_type == MoeLoadBalancing::seq_aux_loss ||
                         moe_router_load_balancing_type == MoeLoadBalancing::global_aux_loss;
  return num_experts > 0 && with_loss && moe_aux_loss_coeff != 0.0f;
}

void ModelConfig::check_trainable() const {
  // Every block of the config has a layer variant in model/spec.h (multi-token prediction too).
}

// YaRN (issue 22): Megatron-Core 0.16.1 takes --rope-type yarn with multi-latent attention only;
// the values must make finite frequencies.
void ModelConfig::validate_yarn() const {
  if (rope_type == RopeType::yarn && !multi_latent_attention) {
    throw UsageError("--rope-type yarn", "needs --multi-latent-attention (Megatron: common attention only supports rope)");
  }
  if (!(rotary_scaling_factor > 0.0) || !std::isfinite(rotary_scaling_factor)) {
    throw UsageError("--rotary-scaling-factor", "must be a positive number");
  }
  if (!std::isfinite(mscale)) throw UsageError("--mscale", "must be a finite number");
  if (!std::isfinite(mscale_all_dim)) throw UsageError("--mscale-all-dim", "must be a finite number");
  if (rope_type != RopeType::yarn) return;
  if (original_max_position_embeddings < 1) {
    throw UsageError("--yarn-original-max-position-embeddings", "must be positive");
  }
  if (!(yarn_beta_fast > 0.0) || !std::isfinite(yarn_beta_fast)) {
    throw UsageError("--yarn-beta-fast", "must be a positive number");
  }
  if (!(yarn_beta_slow > 0.0) || !std::isfinite(yarn_beta_slow)) {
    throw UsageError("--yarn-beta-slow", "must be a positive number");
  }
}

// Multi-latent attention (issue 22): Megatron's MLA flags and what MLA excludes.
void ModelConfig::validate_mla() const {
  validate_yarn();
  if (!multi_latent_attention) {
    if (qk_layernorm) throw UsageError("--qk-layernorm", "is supported with --multi-latent-attention only");
    return;
  }
  auto positive = [](int value, const char* flag) {
    if (value <= 0) throw UsageError(flag, "must be positive");
  };
  positive(kv_lora_rank, "--kv-lora-rank");
  positive(qk_head_dim, "--qk-head-dim");
  positive(qk_pos_emb_head_dim, "--qk-pos-emb-head-dim");
  positive(v_head_dim, "--v-head-dim");
  if (q_lora_rank < 0) throw UsageError("--q-lora-rank", "must be >= 0");
  if (qk_pos_emb_head_dim % 2 != 0) throw UsageError("--qk-pos-emb-head-dim", "rotary embeddings need an even size");
  if (query_groups() != num_attention_heads) {
    throw UsageError("--multi-latent-attention", "excludes --num-query-groups (as in Megatron)");
  }
  if (position_embedding != PositionEmbedding::rope) {
    throw UsageError("--multi-latent-attention", "needs --position-embedding-type rope (its decoupled RoPE key)");
  }
  if (qk_layernorm && normalization != Normalization::rmsnorm) {
    throw UsageError("--qk-layernorm", "with --multi-latent-attention needs --normalization RMSNorm (its latent norms)");
  }
}

bool ModelConfig::is_moe_layer(int layer) const {
  if (num_experts <= 0) return false;
  if (layer >= num_layers) layer = num_layers - 1;
  if (!moe_layer_pattern.empty()) return moe_layer_pattern[static_cast<size_t>(layer)] == 1;
  return layer % moe_layer_freq == 0;
}

int ModelConfig::moe_layer_count() const {
  if (num_experts <= 0 || num_layers <= 0) return 0;
  if (moe_layer_pattern.empty()) return moe_layer_freq > 0 ? (num_layers - 1) / moe_layer_freq + 1 : 0;  // 0, N, 2N, ...
  int count = 0;
  for (int value : moe_layer_pattern) count += value == 1 ? 1 : 0;
  return count;
}

std::vector<int> parse_moe_layer_freq(const std::string& text, int num_layers) {
  const UsageError bad("--moe-layer-freq " + text, "expected N, [0,1,...] or ([0]*3+[1]*58)");
  std::string s;
  for (char ch : text) {
    if (!std::isspace(static_cast<unsigned char>(ch))) s += ch;
  }
  if (s.empty()) throw bad;
  std::vector<int> pattern;
  if (std::isdigit(static_cast<unsigned char>(s[0]))) {
    size_t used = 0;
    int every = 0;
    try {
      every = std::stoi(s, &used);
    } catch (const std::exception&) {
      throw bad;
    }
    if (used != s.size() || every < 1) throw bad;
    for (int layer = 0; layer < num_layers; ++layer) pattern.push_back(layer % every == 0 ? 1 : 0);
    return pattern;
  }
  if (s.front() == '(' && s.back() == ')') s = s.substr(1, s.size() - 2);
  // Terms "[a,b,...]" or "[a,b,...]*k", joined by '+'.
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '[') throw bad;
    const size_t close = s.find(']', i);
    if (close == std::string::npos) throw bad;
    std::vector<int> term;
    for (size_t j = i + 1; j < close; ++j) {
      if (s[j] == '0' || s[j] == '1') term.push_back(s[j] - '0');
      else if (s[j] != ',') throw bad;
    }
    if (term.empty()) throw bad;
    i = close + 1;
    long repeat = 1;
    if (i < s.size() && s[i] == '*') {
      size_t used = 0;
      try {
        repeat = std::stol(s.substr(i + 1), &used);
      } catch (const std::exception&) {
        throw bad;
      }
      if (repeat < 0 || repeat > 1000000) throw bad;
      i += 1 + used;
    }
    for (long r = 0; r < repeat; ++r) pattern.insert(pattern.end(), term.begin(), term.end());
    if (i < s.size()) {
      if (s[i] != '+') throw bad;
      ++i;
    }
  }
  if (static_cast<int>(pattern.size()) != num_layers) {
    throw UsageError("--moe-layer-freq " + text, "gives " + std::to_string(pattern.size()) +
                                                     " layers, the model has " + std::to_string(num_layers));
  }
  return pattern;
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
  c.hidden_dropout = 0.1f;     // Megatron's default
  c.attention_dropout = 0.1f;  // Megatron's default
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

// Mixtral's experts and Megatron's recipe routing for it (facts note sec. 6 rows 7-8): 8 experts,
// top-2, aux_loss 1e-2, the all-to-all dispatcher.
void add_mixtral_routing(ModelConfig& c) {
  c.num_experts = 8;
  c.moe_router_topk = 2;
  c.moe_router_load_balancing_type = MoeLoadBalancing::aux_loss;
  c.moe_aux_loss_coeff = 1e-2f;
  c.moe_token_dispatcher_type = MoeDispatcher::alltoall;
}

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names{"gpt2-124m",     "gpt2-345m",   "gpt3-175b",     "llama3-8b",
                                              "llama3-70b",    "llama3.1-405b", "mixtral-8x7b", "mixtral-8x22b",
                                              "deepseek-v3",   "tiny-gpt",    "tiny-llama",  "tiny-mixtral",
                                              "tiny-deepseek", "bert-345m",   "tiny-bert"};
  return names;
}

namespace {

// DeepSeek-V3-shaped for tests (issue 22): tiny LLaMA's size with multi-latent attention and latent
// norms, the first layer dense and the second MoE with DeepSeek-V3's routing (sigmoid scores with
// the expert bias, group-limited top-k, scaling, sequence-wise aux loss) and a shared expert. No
// multi-token prediction unless --mtp-num-layers asks for it (the deepseek-v3 preset has one depth); plain RoPE
// (--rope-type rope), not DeepSeek-V3's YaRN.
ModelConfig tiny_deepseek() {
  ModelConfig c = preset("tiny-llama");
  c.name = "tiny-deepseek";
  c.num_query_groups = c.num_attention_heads;  // MLA has no query groups
  c.multi_latent_attention = true;
  c.q_lora_rank = 32;
  c.kv_lora_rank = 16;
  c.qk_head_dim = 16;
  c.qk_pos_emb_head_dim = 8;
  c.v_head_dim = 16;
  c.qk_layernorm = true;
  c.num_experts = 8;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 32;
  c.moe_shared_expert_intermediate_size = 32;
  c.moe_layer_pattern = parse_moe_layer_freq("([0]*1+[1]*1)", c.num_layers);  // the first layer dense
  c.moe_router_score_function = MoeScoreFunction::sigmoid;
  c.moe_router_enable_expert_bias = true;
  c.moe_router_bias_update_rate = 1e-3f;
  c.moe_router_num_groups = 4;
  c.moe_router_group_topk = 2;
  c.moe_router_topk_scaling_factor = 2.5f;
  c.moe_router_load_balancing_type = MoeLoadBalancing::seq_aux_loss;
  c.moe_aux_loss_coeff = 1e-4f;
  c.moe_token_dispatcher_type = MoeDispatcher::alltoall;
  return c;
}

}  // namespace

ModelConfig preset(const std::string& name) {
  if (name == "gpt2-124m") return gpt2(name, 12, 768, 12);
  if (name == "gpt2-345m") return gpt2(name, 24, 1024, 16);
  if (name == "llama3-8b") return llama3(name, 32, 4096, 14336, 32);
  if (name == "llama3-70b") return llama3(name, 80, 8192, 28672, 64);
  if (name == "llama3.1-405b") return llama3(name, 126, 16384, 53248, 128);
  if (name == "gpt3-175b") {
    ModelConfig c = gpt2(name, 96, 12288, 96);  // Brown et al. 2020, Table 2.1
    c.seq_length = 2048;
    c.max_position_embeddings = 2048;
    return c;
  }
  if (name == "mixtral-8x7b" || name == "mixtral-8x22b") {
    // Mistral AI's released config.json files; Megatron's examples/mixtral.
    const bool small = name == "mixtral-8x7b";
    // Megatron's recipes (facts note sec. 6 rows 7-8) train both at seq 4096 with aux_loss 1e-2
    // and the all-to-all dispatcher (HF's router_aux_loss_coef differs: 0.02 and 0.001).
    ModelConfig c = small ? llama3(name, 32, 4096, 14336, 32) : llama3(name, 56, 6144, 16384, 48);
    c.vocab_size = small ? 32000 : 32768;
    c.seq_length = 4096;
    c.max_position_embeddings = small ? 32768 : 65536;
    c.rotary_base = 1000000.0f;
    add_mixtral_routing(c);
    return c;
  }
  if (name == "deepseek-v3") {
    // DeepSeek-V3 technical report (arXiv 2412.19437) and its released config.json.
    ModelConfig c = llama3(name, 61, 7168, 18432, 128);
    c.num_query_groups = 128;
    c.kv_channels = 128;
    c.vocab_size = 129280;
    c.seq_length = 4096;
    c.max_position_embeddings = 4096;
    c.norm_epsilon = 1e-6f;
    c.rotary_base = 10000.0f;
    c.num_experts = 256;
    c.moe_router_topk = 8;
    c.moe_ffn_hidden_size = 2048;
    c.moe_shared_expert_intermediate_size = 2048;
    c.moe_layer_pattern = parse_moe_layer_freq("([0]*3+[1]*58)", 61);  // the first 3 layers dense
    // Routing as Megatron's DeepSeek-V3 recipe (facts note sec. 7): sigmoid scores with the
    // aux-loss-free expert bias, 8 groups of which 4 are kept, gates scaled by 2.5, and the
    // sequence-wise balance loss at 1e-4.
    c.moe_router_score_function = MoeScoreFunction::sigmoid;
    c.moe_router_enable_expert_bias = true;
    c.moe_router_bias_update_rate = 1e-3f;
    c.moe_router_num_groups = 8;
    c.moe_router_group_topk = 4;
    c.moe_router_topk_scaling_factor = 2.5f;
    c.moe_router_load_balancing_type = MoeLoadBalancing::seq_aux_loss;
    c.moe_aux_loss_coeff = 1e-4f;
    c.moe_token_dispatcher_type = MoeDispatcher::alltoall;
    c.multi_latent_attention = true;
    c.q_lora_rank = 1536;
    c.kv_lora_rank = 512;
    c.qk_head_dim = 128;
    c.qk_pos_emb_head_dim = 64;
    c.v_head_dim = 128;
    c.qk_layernorm = true;  // the latent norms (q_a_layernorm, kv_a_layernorm in HF's DeepSeek-V3)
    // YaRN as HF's config.json and Megatron's DeepSeek-V3 recipes (facts note sec. 3.2, 7): applied
    // from the start, as Megatron's recipes train the 4K phase (DeepSeek's paper adds YaRN only
    // for its context extension); softmax scale 0.1352 instead of 1/sqrt(192).
    c.rope_type = RopeType::yarn;
    c.rotary_scaling_factor = 40.0;
    c.original_max_position_embeddings = 4096;
    c.yarn_beta_fast = 32.0;
    c.yarn_beta_slow = 1.0;
    c.mscale = 1.0;
    c.mscale_all_dim = 1.0;
    c.mtp_num_layers = 1;
    return c;
  }
  if (name == "tiny-gpt") {
    ModelConfig c = gpt2(name, 2, 64, 4);
    c.seq_length = 64;
    c.max_position_embeddings = 64;
    c.vocab_size = 256;  // bytes: the demo trains on raw UTF-8 until a tokenizer lands
    c.make_vocab_size_divisible_by = 128;
    c.hidden_dropout = 0.0f;
    c.attention_dropout = 0.0f;
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
  if (name == "tiny-mixtral") {
    // Mixtral-shaped for tests: every layer MoE, 8 experts of width 32, top-2, aux_loss 1e-2.
    ModelConfig c = preset("tiny-llama");
    c.name = name;
    add_mixtral_routing(c);
    c.moe_ffn_hidden_size = 32;
    return c;
  }
  if (name == "tiny-deepseek") return tiny_deepseek();
  if (name == "bert-345m" || name == "tiny-bert") {
    // Megatron's BERT-345M (examples/bert/train_bert_340m_distributed.sh): 24 layers, hidden 1024,
    // 16 heads, FFN 4096, seq 512, the uncased WordPiece vocabulary (30522, padded to 30592).
    const bool tiny = name == "tiny-bert";
    ModelConfig c = tiny ? gpt2(name, 2, 64, 4) : gpt2(name, 24, 1024, 16);
    c.seq_length = tiny ? 64 : 512;
    c.max_position_embeddings = c.seq_length;
    c.vocab_size = 30522;
    c.make_vocab_size_divisible_by = 128;
    if (tiny) c.hidden_dropout = c.attention_dropout = 0.0f;
    c.bert = true;
    return c;
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError("--model " + name, "unknown preset (" + known + ")");
}

namespace {

// The tensors of model/layers/mla_attention.h: q (direct or down, latent norm, up), kv down,
// latent norm, kv up, output projection (and its bias).
long double mla_attention_parameters(const ModelConfig& c) {
  using Wide = long double;
  const Wide hidden = c.hidden_size, heads = c.num_attention_heads;
  const Wide q_head = c.qk_head_dim + c.qk_pos_emb_head_dim;
  const Wide norms = c.qk_layernorm ? 1 : 0;
  const Wide q = c.q_lora_rank > 0
                     ? hidden * c.q_lora_rank + norms * c.q_lora_rank + static_cast<Wide>(c.q_lora_rank) * heads * q_head
                     : hidden * heads * q_head;
  const Wide kv = hidden * (c.kv_lora_rank + c.qk_pos_emb_head_dim) + norms * c.kv_lora_rank +
                  static_cast<Wide>(c.kv_lora_rank) * heads * (c.qk_head_dim + c.v_head_dim);
  const Wide out = heads * c.v_head_dim * hidden + (c.add_bias_linear ? hidden : 0);
  return q + kv + out;
}

}  // namespace

long double parameter_count_wide(const ModelConfig& c, bool padded_vocabulary) {
  c.check_trainable();
  using Wide = long double;
  const Wide multiple = c.make_vocab_size_divisible_by > 0 ? c.make_vocab_size_divisible_by : 1;
  const Wide vocab = padded_vocabulary ? std::ceil(static_cast<Wide>(c.vocab_size) / multiple) * multiple
                                       : static_cast<Wide>(c.vocab_size);
  const Wide hidden = c.hidden_size, ffn = c.ffn_hidden_size, d = c.head_dim();
  const Wide q = c.num_attention_heads * d, kv = c.query_groups() * d;
  const Wide bias = c.add_bias_linear ? 1 : 0;
  const Wide norm = c.normalization == Normalization::layernorm ? 2 * hidden : hidden;
  Wide layer = norm + hidden * (q + 2 * kv) + bias * (q + 2 * kv) + q * hidden + bias * hidden;  // attention
  if (c.multi_latent_attention) layer = norm + mla_attention_parameters(c);
  const Wide dense_mlp = (c.swiglu ? 2 : 1) * ffn * hidden + bias * ffn + ffn * hidden + bias * hidden;
  const Wide experts = static_cast<Wide>(c.num_experts) * 3 * c.moe_ffn() * hidden;    // SwiGLU, no biases
  const Wide shared = static_cast<Wide>(3) * c.moe_shared_expert_intermediate_size * hidden;
  const Wide moe_mlp = static_cast<Wide>(c.num_experts) * hidden + experts + shared;  // + router
  layer += norm;
  const Wide moe_layers = c.moe_layer_count();
  Wide total = c.num_layers * layer + moe_layers * moe_mlp + (c.num_layers - moe_layers) * dense_mlp;
  // Multi-token prediction: per depth a layer like the last decoder layer, enorm, hnorm, the
  // final norm and eh_proj (2h -> h, no bias); embedding and output layer shared.
  const Wide mtp_mlp = c.is_moe_layer(c.num_layers) ? moe_mlp : dense_mlp;
  total += static_cast<Wide>(c.mtp_num_layers) * (layer + mtp_mlp + 3 * norm + 2 * hidden * hidden);
  total += norm + vocab * hidden;
  if (c.position_embedding == PositionEmbedding::learned_absolute) total += c.max_position_embeddings * hidden;
  if (c.untie_embeddings_and_output_weights) total += vocab * hidden;
  if (c.bert) {
    // The LM head (dense, LayerNorm, the vocabulary bias); with the binary head the token types,
    // the pooler and the 2-way classifier.
    total += hidden * hidden + hidden + 2 * hidden + vocab;
    if (c.bert_binary_head) total += 2 * hidden + hidden * hidden + hidden + 2 * hidden + 2;
  }
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
const std::pair<RopeType, const char*> kRopeTypes[] = {{RopeType::rope, "rope"}, {RopeType::yarn, "yarn"}};
const std::pair<MoeScoreFunction, const char*> kScoreFunctions[] = {{MoeScoreFunction::softmax, "softmax"},
                                                                    {MoeScoreFunction::sigmoid, "sigmoid"}};
const std::pair<MoeRouterDtype, const char*> kRouterDtypes[] = {{MoeRouterDtype::fp32, "fp32"},
                                                                {MoeRouterDtype::fp64, "fp64"}};
const std::pair<MoeLoadBalancing, const char*> kLoadBalancing[] = {{MoeLoadBalancing::aux_loss, "aux_loss"},
                                                                   {MoeLoadBalancing::seq_aux_loss, "seq_aux_loss"},
                                                                   {MoeLoadBalancing::global_aux_loss, "global_aux_loss"},
                                                                   {MoeLoadBalancing::sinkhorn, "sinkhorn"},
                                                                   {MoeLoadBalancing::none, "none"}};
const std::pair<MoeDropPolicy, const char*> kDropPolicies[] = {{MoeDropPolicy::probs, "probs"},
                                                               {MoeDropPolicy::position, "position"}};
const std::pair<MoeDispatcher, const char*> kDispatchers[] = {
    {MoeDispatcher::allgather, "allgather"}, {MoeDispatcher::alltoall, "alltoall"}, {MoeDispatcher::flex, "flex"}};

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
  visit("num_experts", c.num_experts);
  visit("moe_router_topk", c.moe_router_topk);
  visit("moe_ffn_hidden_size", c.moe_ffn_hidden_size);
  visit("moe_shared_expert_intermediate_size", c.moe_shared_expert_intermediate_size);
  visit("moe_layer_freq", c.moe_layer_freq);
  visit("moe_layer_pattern", c.moe_layer_pattern);
  visit("moe_router_score_function", c.moe_router_score_function, kScoreFunctions);
  visit("moe_router_pre_softmax", c.moe_router_pre_softmax);
  visit("moe_router_num_groups", c.moe_router_num_groups);
  visit("moe_router_group_topk", c.moe_router_group_topk);
  visit("moe_router_topk_scaling_factor", c.moe_router_topk_scaling_factor);
  visit("moe_router_enable_expert_bias", c.moe_router_enable_expert_bias);
  visit("moe_router_bias_update_rate", c.moe_router_bias_update_rate);
  visit("moe_router_dtype", c.moe_router_dtype, kRouterDtypes);
  visit("moe_router_load_balancing_type", c.moe_router_load_balancing_type, kLoadBalancing);
  visit("moe_aux_loss_coeff", c.moe_aux_loss_coeff);
  visit("moe_z_loss_coeff", c.moe_z_loss_coeff);
  visit("moe_expert_capacity_factor", c.moe_expert_capacity_factor);
  visit("moe_token_drop_policy", c.moe_token_drop_policy, kDropPolicies);
  visit("moe_pad_expert_input_to_capacity", c.moe_pad_expert_input_to_capacity);
  visit("moe_grouped_gemm", c.moe_grouped_gemm);
  visit("moe_token_dispatcher_type", c.moe_token_dispatcher_type, kDispatchers);
  visit("multi_latent_attention", c.multi_latent_attention);
  visit("q_lora_rank", c.q_lora_rank);
  visit("kv_lora_rank", c.kv_lora_rank);
  visit("qk_head_dim", c.qk_head_dim);
  visit("qk_pos_emb_head_dim", c.qk_pos_emb_head_dim);
  visit("v_head_dim", c.v_head_dim);
  visit("qk_layernorm", c.qk_layernorm);
  visit("rope_type", c.rope_type, kRopeTypes);
  visit("rotary_scaling_factor", c.rotary_scaling_factor);
  visit("mscale", c.mscale);
  visit("mscale_all_dim", c.mscale_all_dim);
  visit("original_max_position_embeddings", c.original_max_position_embeddings);
  visit("yarn_beta_fast", c.yarn_beta_fast);
  visit("yarn_beta_slow", c.yarn_beta_slow);
  visit("mtp_num_layers", c.mtp_num_layers);
  visit("mtp_loss_scaling_factor", c.mtp_loss_scaling_factor);
  visit("bert", c.bert);
  visit("bert_binary_head", c.bert_binary_head);
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
