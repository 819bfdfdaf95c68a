// Model FLOPs of a global batch under the conventions published figures use, by part, and the
// hardware FLOPs a run executes (recompute included). Conventions (docs/accounting.md has the
// formulas and where each comes from):
//   megatron       Megatron-LM's num_floating_point_operations today (2025-03 on): GQA, SwiGLU,
//                  MoE routed and shared experts, MLA, MTP, logits over the padded vocabulary,
//                  causal core attention halved. The default. BERT (mt's own extension, Megatron
//                  counts BERT as GPT): core attention not halved (bidirectional), and the heads
//                  after the final norm: the LM head's dense over every token, the pooler and the
//                  sentence-order head over each sample's first token (the logits as GPT's).
//   megatron-2024  the same function before 2025-03-06: core attention not halved, every layer's
//                  MLP counted with the MoE width x top-k; no MLA or MTP.
//   narayanan      Narayanan et al. 2021 (arXiv 2104.04473, appendix): four passes over every
//                  layer (forward, two backward GEMMs, the full-recompute forward), three over the
//                  logits, attention not halved: 96 B s l h^2 (1 + s/6h + V/16lh) for its models.
//   6N             6 x active parameters (position and token-type embeddings excluded, a tied output layer once)
//   6N+12LCT       6N + 12 x layers x attention width x sequence (PaLM's; attention not halved)
//   6N+6LCT        6N + 6 x layers x attention width x sequence (causal)
// Tested against hand-computed values in tests/unit/perf/test_flops.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/recompute.h"

namespace mt::perf {

enum class FlopsConvention { megatron, megatron_2024, narayanan, six_n, six_n_attention, six_n_causal_attention };

const char* convention_name(FlopsConvention convention);
const std::vector<FlopsConvention>& flops_conventions();
// Throws mt::UsageError naming --flops-convention and the known names.
FlopsConvention parse_flops_convention(const std::string& name);

// FLOPs of one global batch (forward and backward), by part. The 6N conventions put each
// parameter group's 6 x params x tokens in its part (norms and the router in `other`).
struct FlopsBreakdown {
  double dense_mlp = 0;
  double routed_experts = 0;
  double shared_experts = 0;
  double attention_linear = 0;  // QKV (or MLA's projections) and the output projection
  double attention_core = 0;    // QK^T and PV
  double mtp = 0;               // MTP modules' norms and projections
  double logits = 0;            // the output layer (and a tied embedding)
  double bert_heads = 0;        // BERT: the LM head's dense, the pooler, the sentence-order head
  double embedding = 0;         // 6N only: an untied input embedding counted as a GEMM
  double other = 0;             // 6N only: norms, router
  // Everything done per decoder (or MTP) layer.
  double layers() const { return dense_mlp + routed_experts + shared_experts + attention_linear + attention_core; }
  double total() const { return layers() + mtp + logits + bert_heads + embedding + other; }
};

// `sequences` samples of model.seq_length tokens; `vocab` is the logits' width for the Megatron
// conventions (0: the model's padded vocabulary; study/rank_parameters.h's megatron_padded_vocab()
// when reproducing Megatron's logs). The 6N conventions count parameters on the real vocabulary.
FlopsBreakdown model_flops(const model::ModelConfig& model, double sequences, FlopsConvention convention,
                           int64_t vocab = 0);
double flops_per_token(const model::ModelConfig& model, FlopsConvention convention, int64_t vocab = 0);
// The N of the 6N conventions: active parameters without position (and token-type) embeddings.
int64_t flops_parameter_count(const model::ModelConfig& model);

// FLOPs executed: Megatron's current count plus what recompute repeats: full recompute runs the
// forward of every recomputed layer again (a third of its forward + backward; with the block
// method min(num_layers, layers_per_chunk) of every chunk), selective the core attention's.
double hardware_flops(const model::ModelConfig& model, double sequences, const model::RecomputeConfig& recompute,
                      int layers_per_chunk, int64_t vocab = 0);

// Megatron's "throughput per GPU": FLOPs / (step time x world size), in TFLOP/s.
double tflops_per_device(double flops, double step_seconds, int world_size);
// Model FLOPs utilisation: FLOPs / (step time x the summed peak of the devices or cores used).
double model_flops_utilization(double flops, double step_seconds, double peak_flops_total);

}  // namespace mt::perf
