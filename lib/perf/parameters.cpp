// Parameter blocks and counts (see parameters.h).
#include "perf/parameters.h"

#include "core/error.h"

namespace mt::perf {

const char* group_name(ParamGroup group) {
  switch (group) {
    case ParamGroup::word_embeddings: return "word_embeddings";
    case ParamGroup::position_embeddings: return "position_embeddings";
    case ParamGroup::output_layer: return "output_layer";
    case ParamGroup::attention: return "attention";
    case ParamGroup::dense_mlp: return "dense_mlp";
    case ParamGroup::routed_experts: return "routed_experts";
    case ParamGroup::shared_experts: return "shared_experts";
    case ParamGroup::router: return "router";
    case ParamGroup::norms: return "norms";
    case ParamGroup::mtp_projection: return "mtp_projection";
    case ParamGroup::token_type_embeddings: return "token_type_embeddings";
    case ParamGroup::bert_head: return "bert_head";
  }
  return "?";
}

namespace {

using model::ModelConfig;

// One decoder (or MTP) layer's blocks.
void add_layer(const ModelConfig& m, int layer, std::vector<ParamBlock>& blocks) {
  const int64_t h = m.hidden_size, n = m.num_attention_heads, d = m.head_dim(), g = m.query_groups();
  const int64_t bias = m.add_bias_linear ? 1 : 0;
  const int64_t norm = m.normalization == model::Normalization::layernorm ? 2 * h : h;
  auto add = [&](ParamGroup group, ParamSplit split, int64_t elements) {
    if (elements > 0) blocks.push_back(ParamBlock{group, split, layer, elements});
  };
  using G = ParamGroup;
  using S = ParamSplit;
  add(G::norms, S::replicated, 2 * norm);  // input_layernorm, pre_mlp_layernorm

  if (m.multi_latent_attention) {
    // TE's placement: down projections and their norms duplicated on every TP rank, up and
    // output projections split.
    // The latent norms exist with --qk-layernorm only (RMSNorm: one weight per feature).
    const int64_t q_head = m.qk_head_dim + m.qk_pos_emb_head_dim;
    const int64_t latent_norms = m.qk_layernorm ? 1 : 0;
    if (m.q_lora_rank > 0) {
      add(G::attention, S::replicated, h * m.q_lora_rank + latent_norms * m.q_lora_rank);
      add(G::attention, S::tensor_parallel, m.q_lora_rank * n * q_head);
    } else {
      add(G::attention, S::tensor_parallel, h * n * q_head);
    }
    add(G::attention, S::replicated, h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + latent_norms * m.kv_lora_rank);
    add(G::attention, S::tensor_parallel, m.kv_lora_rank * n * (m.qk_head_dim + m.v_head_dim) + n * m.v_head_dim * h);
    add(G::attention, S::replicated, bias * h);  // linear_proj's bias
  } else {
    const int64_t q = n * d, kv = g * d;
    add(G::attention, S::tensor_parallel, h * (q + 2 * kv) + bias * (q + 2 * kv) + q * h);  // qkv (+bias), proj
    add(G::attention, S::replicated, bias * h);                                              // proj bias
  }

  // An MLP of width f: fc1 (2f rows with SwiGLU) and its bias split, fc2 split, fc2's bias not.
  const int64_t up = m.swiglu ? 2 : 1;
  auto mlp_split = [&](int64_t f) { return up * f * h + bias * up * f + f * h; };
  if (m.is_moe_layer(layer)) {
    const int64_t experts = m.num_experts, f = m.moe_ffn();
    add(G::router, S::replicated, h * experts + bias * experts);
    add(G::routed_experts, S::expert, experts * (mlp_split(f) + bias * h));
    if (m.moe_shared_expert_intermediate_size > 0) {
      add(G::shared_experts, S::tensor_parallel, mlp_split(m.moe_shared_expert_intermediate_size));
      add(G::shared_experts, S::replicated, bias * h);
    }
  } else {
    add(G::dense_mlp, S::tensor_parallel, mlp_split(m.ffn_hidden_size));
    add(G::dense_mlp, S::replicated, bias * h);
  }
  if (layer >= m.num_layers) {
    // MTP module: enorm, hnorm and its final norm, and the eh projection (2h -> h, column-parallel).
    add(G::mtp_projection, S::replicated, 3 * norm);
    add(G::mtp_projection, S::tensor_parallel, 2 * h * h);
  }
}

}  // namespace

void check_accounted(const ModelConfig& m) {
  m.check_trainable();  // every model lib/model builds is accounted (BERT too, since issue 25)
}

namespace {

// BERT's token types and heads as model/layers/embedding.h and bert_head.h declare them.
void add_bert_blocks(const ModelConfig& m, int64_t vocab, std::vector<ParamBlock>& blocks) {
  const int64_t h = m.hidden_size;
  using G = ParamGroup;
  using S = ParamSplit;
  blocks.push_back({G::bert_head, S::replicated, -1, h * h + h + 2 * h});  // LM head: dense (+bias), LayerNorm
  blocks.push_back({G::bert_head, S::tensor_parallel, -1, vocab});         // the vocabulary bias
  if (!m.bert_binary_head) return;
  blocks.push_back({G::token_type_embeddings, S::replicated, -1, 2 * h});
  blocks.push_back({G::bert_head, S::replicated, -1, h * h + h + 2 * h + 2});  // pooler, binary head
}

}  // namespace

std::vector<ParamBlock> parameter_blocks(const ModelConfig& m, int64_t vocab) {
  m.validate();
  check_accounted(m);
  const int64_t h = m.hidden_size;
  const int64_t norm = m.normalization == model::Normalization::layernorm ? 2 * h : h;
  std::vector<ParamBlock> blocks;
  blocks.push_back({ParamGroup::word_embeddings, ParamSplit::tensor_parallel, -1, vocab * h});
  if (m.position_embedding == model::PositionEmbedding::learned_absolute) {
    blocks.push_back({ParamGroup::position_embeddings, ParamSplit::replicated, -1,
                      static_cast<int64_t>(m.max_position_embeddings) * h});
  }
  for (int layer = 0; layer < m.num_layers + m.mtp_num_layers; ++layer) add_layer(m, layer, blocks);
  blocks.push_back({ParamGroup::norms, ParamSplit::replicated, -1, norm});  // final norm
  if (m.untie_embeddings_and_output_weights) {
    blocks.push_back({ParamGroup::output_layer, ParamSplit::tensor_parallel, -1, vocab * h});
  }
  if (m.bert) add_bert_blocks(m, vocab, blocks);
  return blocks;
}

ParameterCounts count_parameters(const ModelConfig& m, int64_t vocab) {
  ParameterCounts counts;
  for (const ParamBlock& block : parameter_blocks(m, vocab)) {
    counts.total += block.elements;
    counts.by_group[block.group] += block.elements;
    counts.active += block.group == ParamGroup::routed_experts ? block.elements / m.num_experts * m.moe_router_topk
                                                               : block.elements;
    if (block.group == ParamGroup::word_embeddings || block.group == ParamGroup::position_embeddings ||
        block.group == ParamGroup::output_layer) {
      counts.embedding += block.elements;
    }
  }
  return counts;
}

ParameterCounts count_parameters(const ModelConfig& m) { return count_parameters(m, m.vocab_size); }

}  // namespace mt::perf
