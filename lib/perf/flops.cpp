// FLOPs conventions (see flops.h).
#include "perf/flops.h"

#include <algorithm>

#include "core/error.h"
#include "perf/parameters.h"

namespace mt::perf {

namespace {

struct ConventionName {
  FlopsConvention convention;
  const char* name;
};
constexpr ConventionName kNames[] = {
    {FlopsConvention::megatron, "megatron"},     {FlopsConvention::megatron_2024, "megatron-2024"},
    {FlopsConvention::narayanan, "narayanan"},   {FlopsConvention::six_n, "6N"},
    {FlopsConvention::six_n_attention, "6N+12LCT"}, {FlopsConvention::six_n_causal_attention, "6N+6LCT"},
};

// Layers counted as MoE and as dense, MTP layers included (each like the last decoder layer).
struct LayerMix {
  double moe = 0, dense = 0, attention = 0;
};
LayerMix layer_mix(const model::ModelConfig& m) {
  LayerMix mix;
  mix.moe = m.moe_layer_count() + (m.is_moe_layer(m.num_layers - 1) ? m.mtp_num_layers : 0);
  mix.dense = m.num_layers + m.mtp_num_layers - mix.moe;
  mix.attention = m.num_layers + m.mtp_num_layers;
  return mix;
}

// BERT's heads after the final norm, forward and backward (6 per multiply-add): the LM head's
// dense h -> h on every token, and with the binary head the pooler h -> h and the sentence-order
// head h -> 2 on each sample's first token. 0 for other models.
double bert_head_flops(const model::ModelConfig& m, double sequences) {
  if (!m.bert) return 0;
  const double h = m.hidden_size, tokens = sequences * m.seq_length;
  return 6 * tokens * h * h + (m.bert_binary_head ? 6 * sequences * (h * h + 2 * h) : 0);
}

// Megatron's current num_floating_point_operations, BSHD (every sample seq_length tokens).
FlopsBreakdown megatron_current(const model::ModelConfig& m, double sequences, int64_t vocab) {
  const double s = m.seq_length, tokens = sequences * s, squares = sequences * s * s;
  const double h = m.hidden_size, ffn_factor = m.swiglu ? 3 : 2;
  const LayerMix mix = layer_mix(m);
  FlopsBreakdown f;
  f.dense_mlp = 6 * tokens * h * m.ffn_hidden_size * ffn_factor * mix.dense;
  if (m.num_experts > 0) {
    f.routed_experts = 6 * tokens * h * static_cast<double>(m.moe_ffn()) * m.moe_router_topk * ffn_factor * mix.moe;
    f.shared_experts = 6 * tokens * h * static_cast<double>(m.moe_shared_expert_intermediate_size) * ffn_factor * mix.moe;
  }
  const double n = m.num_attention_heads;
  double linear = 0, core = 0;  // per token, per layer (core: per squared sequence length)
  if (m.multi_latent_attention) {
    const double qk = m.qk_head_dim + m.qk_pos_emb_head_dim;
    const double q_term = m.q_lora_rank > 0 ? m.q_lora_rank * (h + n * qk + 1) : h * n * qk;
    linear = 6 * (q_term + m.kv_lora_rank * (h + n * (m.qk_head_dim + m.v_head_dim) + 1) +
                  h * m.qk_pos_emb_head_dim + n * m.v_head_dim * h);
    core = 6 * (n * qk / 2 + n * m.v_head_dim / 2);
  } else {
    const double q = n * m.head_dim(), kv = static_cast<double>(m.query_groups()) * m.head_dim();
    linear = 6 * (h * (q + 2 * kv) + q * h);
    core = m.bert ? 12 * q : 6 * q;  // x2 for QK^T and PV, /2 for the causal mask (BERT has none)
  }
  f.attention_linear = tokens * linear * mix.attention;
  f.attention_core = squares * core * mix.attention;
  f.mtp = 6 * tokens * m.mtp_num_layers * (3 * h + 2 * h * h);
  f.logits = 6 * tokens * h * static_cast<double>(vocab) * (m.mtp_num_layers + 1);
  f.bert_heads = bert_head_flops(m, sequences);
  return f;
}

// Before 2025-03-06: one expression over all layers, core attention not halved.
FlopsBreakdown megatron_2024(const model::ModelConfig& m, double sequences, int64_t vocab) {
  if (m.multi_latent_attention || m.mtp_num_layers > 0) {
    throw UsageError("--flops-convention megatron-2024", "predates multi-latent attention and MTP (use megatron)");
  }
  const double s = m.seq_length, tokens = sequences * s, layers = m.num_layers, h = m.hidden_size;
  const double glu = m.swiglu ? 1.5 : 1.0;
  const double q = static_cast<double>(m.num_attention_heads) * m.head_dim();
  const double groups_ratio = static_cast<double>(m.query_groups()) / m.num_attention_heads;
  FlopsBreakdown f;
  f.attention_linear = 12 * tokens * layers * h * q * (1 + groups_ratio);
  f.attention_core = 12 * tokens * layers * s * q;
  const double mlp = 12 * tokens * layers * h * static_cast<double>(m.moe_ffn()) *
                     (m.num_experts > 0 ? m.moe_router_topk : 1) * glu;
  (m.num_experts > 0 ? f.routed_experts : f.dense_mlp) = mlp;
  f.shared_experts = 12 * tokens * layers * h * static_cast<double>(m.moe_shared_expert_intermediate_size) * glu;
  f.logits = 6 * tokens * h * static_cast<double>(vocab);
  f.bert_heads = bert_head_flops(m, sequences);
  return f;
}

// 6N with each parameter group's share in its part; `attention` adds 12 (or 6) L q T per token.
FlopsBreakdown six_n(const model::ModelConfig& m, double sequences, double attention_factor) {
  const double tokens = sequences * m.seq_length;
  const ParameterCounts counts = count_parameters(m);
  FlopsBreakdown f;
  for (const auto& [group, elements] : counts.by_group) {
    double active = static_cast<double>(elements);
    if (group == ParamGroup::routed_experts) active = active / m.num_experts * m.moe_router_topk;
    const double flops = 6 * tokens * active;
    switch (group) {
      case ParamGroup::word_embeddings:
        (m.untie_embeddings_and_output_weights ? f.embedding : f.logits) += flops;
        break;
      case ParamGroup::position_embeddings:
      case ParamGroup::token_type_embeddings: break;  // lookups
      case ParamGroup::bert_head: f.bert_heads += flops; break;
      case ParamGroup::output_layer: f.logits += flops; break;
      case ParamGroup::attention: f.attention_linear += flops; break;
      case ParamGroup::dense_mlp: f.dense_mlp += flops; break;
      case ParamGroup::routed_experts: f.routed_experts += flops; break;
      case ParamGroup::shared_experts: f.shared_experts += flops; break;
      case ParamGroup::mtp_projection: f.mtp += flops; break;
      case ParamGroup::router:
      case ParamGroup::norms: f.other += flops; break;
    }
  }
  // Attention width: heads x head dim; MLA's QK and V widths averaged.
  const double n = m.num_attention_heads;
  const double width = m.multi_latent_attention ? n * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim) / 2
                                                : n * m.head_dim();
  f.attention_core = attention_factor * (m.num_layers + m.mtp_num_layers) * width * m.seq_length * tokens;
  return f;
}

}  // namespace

const char* convention_name(FlopsConvention convention) {
  for (const auto& entry : kNames) {
    if (entry.convention == convention) return entry.name;
  }
  return "?";
}

const std::vector<FlopsConvention>& flops_conventions() {
  static const std::vector<FlopsConvention> all = [] {
    std::vector<FlopsConvention> list;
    for (const auto& entry : kNames) list.push_back(entry.convention);
    return list;
  }();
  return all;
}

FlopsConvention parse_flops_convention(const std::string& name) {
  std::string known;
  for (const auto& entry : kNames) {
    if (name == entry.name) return entry.convention;
    known += (known.empty() ? "" : ", ") + std::string(entry.name);
  }
  throw UsageError("--flops-convention " + name, "unknown (" + known + ")");
}

FlopsBreakdown model_flops(const model::ModelConfig& m, double sequences, FlopsConvention convention, int64_t vocab) {
  m.validate();
  check_accounted(m);
  if (vocab <= 0) vocab = m.padded_vocab_size();
  switch (convention) {
    case FlopsConvention::megatron: return megatron_current(m, sequences, vocab);
    case FlopsConvention::megatron_2024: return megatron_2024(m, sequences, vocab);
    case FlopsConvention::narayanan: {
      // Four passes over the layers instead of three, core attention not halved (BERT's never is).
      FlopsBreakdown f = megatron_current(m, sequences, vocab);
      if (!m.bert) f.attention_core *= 2;
      for (double* part : {&f.dense_mlp, &f.routed_experts, &f.shared_experts, &f.attention_linear, &f.attention_core,
                           &f.mtp}) {
        *part *= 4.0 / 3.0;
      }
      return f;
    }
    case FlopsConvention::six_n: return six_n(m, sequences, 0);
    case FlopsConvention::six_n_attention: return six_n(m, sequences, 12);
    case FlopsConvention::six_n_causal_attention: return six_n(m, sequences, 6);
  }
  return {};
}

double flops_per_token(const model::ModelConfig& m, FlopsConvention convention, int64_t vocab) {
  return model_flops(m, 1, convention, vocab).total() / m.seq_length;
}

int64_t flops_parameter_count(const model::ModelConfig& m) {
  const ParameterCounts counts = count_parameters(m);
  int64_t lookups = 0;  // position and token-type embeddings
  for (const ParamGroup group : {ParamGroup::position_embeddings, ParamGroup::token_type_embeddings}) {
    const auto found = counts.by_group.find(group);
    if (found != counts.by_group.end()) lookups += found->second;
  }
  return counts.active - lookups;
}

double hardware_flops(const model::ModelConfig& m, double sequences, const model::RecomputeConfig& recompute,
                      int layers_per_chunk, int64_t vocab) {
  const FlopsBreakdown f = model_flops(m, sequences, FlopsConvention::megatron, vocab);
  double repeated = 0;
  if (recompute.granularity == model::RecomputeGranularity::full) {
    double fraction = 1;
    if (recompute.method == model::RecomputeMethod::block && layers_per_chunk > 0) {
      fraction = static_cast<double>(std::min(recompute.num_layers, layers_per_chunk)) / layers_per_chunk;
    }
    repeated = fraction * (f.layers() + f.mtp) / 3;
  } else if (recompute.granularity == model::RecomputeGranularity::selective) {
    repeated = f.attention_core / 3;
  }
  return f.total() + repeated;
}

double tflops_per_device(double flops, double step_seconds, int world_size) {
  return step_seconds > 0 && world_size > 0 ? flops / (step_seconds * world_size) / 1e12 : 0;
}

double model_flops_utilization(double flops, double step_seconds, double peak_flops_total) {
  return step_seconds > 0 && peak_flops_total > 0 ? flops / (step_seconds * peak_flops_total) : 0;
}

}  // namespace mt::perf
