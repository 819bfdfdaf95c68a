// The tiny models the model, trainer and MPI suites run, defined once: GPT-2-shaped (tied
// embeddings, LayerNorm, learned positions) or LLaMA-shaped (untied, RMSNorm, RoPE, GQA with 2
// query groups), with mixture-of-experts or multi-latent attention variants. Used by
// tests/unit/model, tests/unit/train, tests/mpi and tests/gpu.
#pragma once

#include "model/config.h"

namespace mt::testing {

// Two layers, hidden 32, vocabulary 50 padded to 64, sequences of 16: small enough for many
// training runs per test.
inline model::ModelConfig trainer_model(bool llama, float hidden_dropout = 0.0f) {
  model::ModelConfig c = model::preset(llama ? "tiny-llama" : "tiny-gpt");
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = llama ? 2 : 4;
  c.ffn_hidden_size = 48;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 16;
  c.seq_length = 16;
  c.max_position_embeddings = 16;
  c.hidden_dropout = hidden_dropout;
  return c;
}

inline model::ModelConfig tiny_llama() { return trainer_model(true); }

// The LLaMA-shaped trainer model with tiny-mixtral's routing (8 experts of width 32, top-2,
// aux_loss 1e-2, the all-to-all dispatcher) and a z-loss of 1e-3; deepseek_router swaps in
// DeepSeek-V3's router on the grouped GEMM: sigmoid scores with the expert bias (moved every global
// batch), 4 groups of which 2 are kept, scaling 2.5, seq_aux_loss. Used by
// tests/unit/train/test_trainer_async.cpp and tests/gpu/test_cuda_training.cpp.
inline model::ModelConfig trainer_moe_model(bool deepseek_router) {
  model::ModelConfig c = trainer_model(true);
  const model::ModelConfig mixtral = model::preset("tiny-mixtral");
  c.num_experts = mixtral.num_experts;
  c.moe_router_topk = mixtral.moe_router_topk;
  c.moe_router_load_balancing_type = mixtral.moe_router_load_balancing_type;
  c.moe_aux_loss_coeff = mixtral.moe_aux_loss_coeff;
  c.moe_token_dispatcher_type = mixtral.moe_token_dispatcher_type;
  c.moe_ffn_hidden_size = mixtral.moe_ffn_hidden_size;
  c.moe_z_loss_coeff = 1e-3f;
  if (deepseek_router) {
    c.moe_grouped_gemm = true;
    c.moe_router_score_function = model::MoeScoreFunction::sigmoid;
    c.moe_router_enable_expert_bias = true;
    c.moe_router_num_groups = 4;
    c.moe_router_group_topk = 2;
    c.moe_router_topk_scaling_factor = 2.5f;
    c.moe_router_load_balancing_type = model::MoeLoadBalancing::seq_aux_loss;
  }
  return c;
}

// The LLaMA-shaped trainer model with multi-latent attention (4 heads, --q-lora-rank 8
// --kv-lora-rank 6 --qk-head-dim 4 --qk-pos-emb-head-dim 4 --v-head-dim 6 --qk-layernorm); yarn
// adds --rope-type yarn at factor 4 over an original context of 8 with a concentration factor other
// than 1 (mscale_all_dim 0.707). Used by tests/mpi/test_mla_training.cpp and
// tests/gpu/test_cuda_training.cpp.
inline model::ModelConfig tiny_mla(bool yarn) {
  model::ModelConfig c = trainer_model(true);
  c.num_query_groups = c.num_attention_heads;
  c.multi_latent_attention = true;
  c.q_lora_rank = 8;
  c.kv_lora_rank = 6;
  c.qk_head_dim = 4;
  c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 6;
  c.qk_layernorm = true;
  if (yarn) {
    c.rope_type = model::RopeType::yarn;
    c.rotary_scaling_factor = 4.0;
    c.original_max_position_embeddings = 8;
    c.mscale_all_dim = 0.707;
  }
  c.validate();
  return c;
}

// Hidden 16, vocabulary 37 padded to 40, sequences of 9, for gradient and layout checks; the
// initialisation is wide enough that every path carries gradient.
inline model::ModelConfig gradient_model(bool llama, int layers, float hidden_dropout) {
  model::ModelConfig c = model::preset(llama ? "tiny-llama" : "tiny-gpt");
  c.num_layers = layers;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = llama ? 2 : 4;
  c.ffn_hidden_size = 24;
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 8;
  c.seq_length = 9;
  c.max_position_embeddings = 9;
  c.init_method_std = 0.2f;
  c.hidden_dropout = hidden_dropout;
  return c;
}

}  // namespace mt::testing
