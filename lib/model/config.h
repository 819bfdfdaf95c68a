// Model configuration: the shape and flavour of a transformer (GPT-2, GPT-3 and LLaMA families,
// Mixtral/DeepSeek-style mixture-of-experts, DeepSeek's multi-latent attention and
// multi-token prediction, Megatron's BERT), the named presets, validation, parameter counts of the dense models
// mt-train runs (lib/perf/parameters.h counts every architecture), and JSON (the run record and
// checkpoints carry it). Tested in tests/unit/model/test_config.cpp and
// tests/unit/perf/test_parameters.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt::model {

enum class Normalization { layernorm, rmsnorm };
enum class PositionEmbedding { learned_absolute, rope };
// --rope-type (Megatron-Core 0.16.1): RoPE, or YaRN (yarn: multi-latent attention only; Megatron
// refuses it for other attention: "Common attention only support rope_type=rope").
enum class RopeType { rope, yarn };

// --moe-router-load-balancing-type (Megatron's names). sinkhorn parses and is refused by validate().
enum class MoeLoadBalancing { aux_loss, seq_aux_loss, global_aux_loss, sinkhorn, none };
// --moe-router-score-function.
enum class MoeScoreFunction { softmax, sigmoid };
// --moe-router-dtype: the router GEMM and everything after it run in fp32 always; Megatron's default
// (None: the params dtype) is not offered, fp64 parses and is refused by validate().
enum class MoeRouterDtype { fp32, fp64 };
// --moe-token-dispatcher-type. allgather (Megatron's default, what a script without the flag asks
// for) runs through the all-to-all dispatcher: the numbers are identical by construction (both
// compute sum_k p * expert(x) on the same rows); the run record keeps the name asked for.
// flex (DeepEP/HybridEP) parses and is refused by validate().
enum class MoeDispatcher { allgather, alltoall, flex };
// --moe-token-drop-policy: which tokens an over-capacity expert keeps: the highest routing
// probabilities, or the earliest tokens by token index (row of the router call).
enum class MoeDropPolicy { probs, position };

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

  // Mixture of experts, with Megatron's flags, names and defaults (the facts note's sec. 1; the
  // JSON keys are these field names). Every expert is a bias-free SwiGLU MLP (MoE needs --swiglu
  // and refuses --add-bias-linear). The parallel sizes (--expert-model-parallel-size,
  // --expert-tensor-parallel-size) live in parallel::ParallelConfig.
  int num_experts = 0;                          // --num-experts; 0: every MLP is dense
  int moe_router_topk = 2;                      // --moe-router-topk
  int moe_ffn_hidden_size = 0;                  // --moe-ffn-hidden-size; 0: --ffn-hidden-size
  int moe_shared_expert_intermediate_size = 0;  // --moe-shared-expert-intermediate-size; 0: none
  int moe_layer_freq = 1;                       // --moe-layer-freq N: layer i is MoE iff i % N == 0
  std::vector<int> moe_layer_pattern;           // --moe-layer-freq "([0]*3+[1]*58)": a 0/1 per layer, overrides N
  // Router.
  MoeScoreFunction moe_router_score_function = MoeScoreFunction::softmax;  // --moe-router-score-function
  bool moe_router_pre_softmax = false;              // --moe-router-pre-softmax (softmax over all E before top-k)
  std::optional<int> moe_router_num_groups;         // --moe-router-num-groups G (None: no group-limited routing)
  std::optional<int> moe_router_group_topk;         // --moe-router-group-topk g (groups kept; needs G)
  std::optional<float> moe_router_topk_scaling_factor;  // --moe-router-topk-scaling-factor (None: 1)
  bool moe_router_enable_expert_bias = false;       // --moe-router-enable-expert-bias (sigmoid only)
  float moe_router_bias_update_rate = 1e-3f;        // --moe-router-bias-update-rate
  MoeRouterDtype moe_router_dtype = MoeRouterDtype::fp32;  // --moe-router-dtype
  // Auxiliary losses.
  MoeLoadBalancing moe_router_load_balancing_type = MoeLoadBalancing::aux_loss;  // --moe-router-load-balancing-type
  float moe_aux_loss_coeff = 0.0f;                  // --moe-aux-loss-coeff
  std::optional<float> moe_z_loss_coeff;            // --moe-z-loss-coeff (None: no z-loss)
  // Capacity (token dropping); None: dropless.
  std::optional<float> moe_expert_capacity_factor;  // --moe-expert-capacity-factor
  MoeDropPolicy moe_token_drop_policy = MoeDropPolicy::probs;  // --moe-token-drop-policy
  bool moe_pad_expert_input_to_capacity = false;    // --moe-pad-expert-input-to-capacity
  // Experts and dispatch.
  bool moe_grouped_gemm = false;  // --moe-grouped-gemm: one grouped GEMM over the local experts, else the loop
  MoeDispatcher moe_token_dispatcher_type = MoeDispatcher::allgather;  // --moe-token-dispatcher-type
  // Multi-latent attention (--multi-latent-attention), DeepSeek-V2/V3 style.
  bool multi_latent_attention = false;
  int q_lora_rank = 0;          // --q-lora-rank; 0: queries not compressed (Megatron's None)
  int kv_lora_rank = 0;         // --kv-lora-rank
  int qk_head_dim = 0;          // --qk-head-dim: the part of a query/key head without RoPE
  int qk_pos_emb_head_dim = 0;  // --qk-pos-emb-head-dim: the RoPE part
  int v_head_dim = 0;           // --v-head-dim
  bool qk_layernorm = false;    // --qk-layernorm: MLA's latent RMSNorms (q_layernorm, kv_layernorm); MLA only
  // YaRN (issue 22; kernels/common/yarn_rope.h) on MLA's rotary part, MLATransformerConfig's fields.
  // --rope-type yarn with the factor, original length, betas and mscales below; without the flag
  // the preset's choice, and for --multi-latent-attention given on the command line Megatron's
  // MLA default, yarn (at --rotary-scaling-factor 1 its frequencies are RoPE's up to rounding and
  // its factors 1). Megatron 0.16.1 has no flags for the original length and the betas (fixed at
  // these defaults there); mt takes them under later Megatron's names --yarn-*.
  RopeType rope_type = RopeType::rope;           // --rope-type
  double rotary_scaling_factor = 1.0;            // --rotary-scaling-factor (also MLA's softmax mscale)
  double mscale = 1.0;                           // --mscale
  double mscale_all_dim = 0.0;                   // --mscale-all-dim (also MLA's softmax mscale)
  int original_max_position_embeddings = 4096;   // --yarn-original-max-position-embeddings
  double yarn_beta_fast = 32.0;                  // --yarn-beta-fast
  double yarn_beta_slow = 1.0;                   // --yarn-beta-slow
  // Multi-token prediction (--mtp-num-layers): extra layers after the decoder, each MoE or dense
  // like the last decoder layer, sharing the embedding and output layer (model/layers/mtp.h).
  int mtp_num_layers = 0;
  float mtp_loss_scaling_factor = 0.1f;  // --mtp-loss-scaling-factor: lambda, the MTP losses' weight
  // BERT (Megatron's BertModel, trained by pretrain_bert.py; presets tiny-bert and bert-345m): a
  // pre-LN encoder with bidirectional attention under the padding mask, learned positions, the LM
  // head (dense, GELU, LayerNorm, output tied to the word embeddings plus a vocabulary bias) and,
  // with the binary head, token-type embeddings and the pooler + sentence-order head.
  bool bert = false;
  bool bert_binary_head = true;  // --bert-no-binary-head clears it

  int head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  int query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  // Padded to a multiple of make_vocab_size_divisible_by, independent of the parallel layout.
  int64_t padded_vocab_size() const;
  int moe_ffn() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_hidden_size; }
  float moe_topk_scaling() const { return moe_router_topk_scaling_factor.value_or(1.0f); }
  float moe_z_loss() const { return moe_z_loss_coeff.value_or(0.0f); }
  // Whether the router computes an auxiliary load-balancing loss (a balancing type with a loss and
  // a non-zero coefficient).
  bool moe_has_aux_loss() const;
  // Whether decoder layer `layer` has a MoE MLP; MTP layers (layer >= num_layers) follow the last.
  bool is_moe_layer(int layer) const;
  int moe_layer_count() const;  // among the num_layers decoder layers
  // Throws mt::UsageError naming the offending flag(s). For MoE: E % groups, group_topk <= groups,
  // the expert bias only with sigmoid, capacity only with a dropping-capable balancing type,
  // padding only with capacity; fp64 router, flex dispatcher and sinkhorn refused by name.
  void validate() const;
  // The layout's and parameter_count's assertion: mt::UsageError when the model has layers
  // lib/model does not build (none today: multi-token prediction is built, issue 22). Users are
  // refused earlier, by flag, by the one list of what mt-train does not run yet (train/supported.h).
  void check_trainable() const;

 private:
  void validate_moe() const;
  void validate_moe_router() const;
  void validate_moe_losses_and_capacity() const;
  void validate_mla() const;
  void validate_bert() const;
  void validate_yarn() const;
};

// Megatron's --moe-layer-freq value: an integer N, a list "[1,0,1]" or an expression of
// repeated lists "([0]*3+[1]*58)"; returns the per-layer 0/1 pattern for `num_layers` layers.
std::vector<int> parse_moe_layer_freq(const std::string& text, int num_layers);

// Known preset names, in --help order.
const std::vector<std::string>& preset_names();
// The preset's config; throws mt::UsageError for an unknown name.
ModelConfig preset(const std::string& name);

// Parameters of a model mt-train runs (check_trainable() must pass; every expert counted, the
// router weight too, the expert bias not: it is a buffer), counted on the real
// (unpadded) vocabulary unless padded; saturated at INT64_MAX (mt-train refuses such a model
// before anything uses the count).
int64_t parameter_count(const ModelConfig& config, bool padded_vocabulary = false);
// The same in long double: exact below 2^64, and no overflow for any counts (the memory check).
long double parameter_count_wide(const ModelConfig& config, bool padded_vocabulary = false);

// The config as JSON with Megatron's argument names (kv_channels and num_query_groups resolved),
// and back: unknown keys, wrong types and invalid values are mt::UsageError naming the key;
// missing keys keep ModelConfig's defaults. config_from_json(to_json(c)) equals c resolved.
nlohmann::ordered_json to_json(const ModelConfig& config);
ModelConfig config_from_json(const nlohmann::json& json);

}  // namespace mt::model
