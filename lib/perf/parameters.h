// Parameter accounting for every architecture mt knows (dense GPT/LLaMA, MoE, MLA, MTP, BERT): the
// model as blocks of parameters by kind and by how they are split over ranks, and from them
// the total, active (MoE: top-k of the routed experts) and embedding share; the FLOPs
// conventions count from them. For dense models the blocks split exactly as model/layout.h lays
// them out (column-parallel biases split over TP, row-parallel biases and norms replicated), so
// one rank's count (study/rank_parameters.h) equals its layout table's parameter_elements().
// Tested in tests/unit/perf/test_parameters.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"

namespace mt::perf {

enum class ParamGroup {
  word_embeddings,
  position_embeddings,
  output_layer,    // untied only; a tied model's output layer is the word embedding
  attention,       // projections (and their biases); MLA's down/up projections and their norms
  dense_mlp,
  routed_experts,  // all experts of a MoE layer
  shared_experts,
  router,
  norms,           // the layer norms around attention and MLP, the final norm
  mtp_projection,  // a multi-token-prediction module's norms and its (2h -> h) projection
  // BERT (issue 25): the token-type table (2 rows, with the binary head), and the heads after the
  // final norm: the LM head's dense (h -> h) and LayerNorm, the vocabulary bias (split over TP
  // like the vocabulary), the pooler (h -> h) and the sentence-order head (h -> 2).
  token_type_embeddings,
  bert_head,
};
const char* group_name(ParamGroup group);

enum class ParamSplit {
  tensor_parallel,  // sharded over TP (column- or row-parallel)
  replicated,       // a full copy on every TP rank
  expert,           // experts spread over EP ranks, each sharded over expert-TP
};

// Parameters of one kind in one place: a decoder layer (0..L-1), an MTP layer (L..L+M-1) or
// outside the layers (-1: embeddings, output layer and final norm).
struct ParamBlock {
  ParamGroup group;
  ParamSplit split;
  int layer = -1;
  int64_t elements = 0;
};

// Throws mt::UsageError for a model the accounting does not describe (none today: BERT's heads and
// token types are counted since issue 25). Every entry point of lib/perf and lib/study that reads
// a model calls it through parameter_blocks or model_flops.
void check_accounted(const model::ModelConfig& model);

// The model's parameters over a vocabulary of `vocab` rows (the real vocabulary for published
// counts, the padded one for what is allocated).
std::vector<ParamBlock> parameter_blocks(const model::ModelConfig& model, int64_t vocab);

struct ParameterCounts {
  int64_t total = 0;
  int64_t active = 0;     // used per token: routed experts count top-k of E
  int64_t embedding = 0;  // word and position embeddings and an untied output layer
  std::map<ParamGroup, int64_t> by_group;
  double embedding_share() const { return total > 0 ? static_cast<double>(embedding) / total : 0; }
};
ParameterCounts count_parameters(const model::ModelConfig& model, int64_t vocab);
// On the real vocabulary, as models publish their sizes.
ParameterCounts count_parameters(const model::ModelConfig& model);

}  // namespace mt::perf
