// The model spec and the factories of its blocks (see spec.h).
#include "model/spec.h"

#include "core/error.h"
#include "model/layers/attention.h"
#include "model/layers/bert_head.h"
#include "model/layers/embedding.h"
#include "model/layers/mla_attention.h"
#include "model/layers/mlp.h"
#include "model/layers/moe_mlp.h"
#include "model/layers/mtp.h"
#include "model/layers/output_head.h"
#include "model/layers/pre_norm_layer.h"
#include "model/layout.h"

namespace mt::model {
namespace {

std::string range_name(const ChunkSpec& chunk) {
  return "chunk of layers [" + std::to_string(chunk.first_layer) + ", " + std::to_string(chunk.last_layer) + ")";
}

std::unique_ptr<AttentionVariant> make_attention(const AttentionSpec& spec, const ModelConfig& config, int layer) {
  switch (spec.kind) {
    case AttentionKind::self_attention:
      return std::make_unique<SelfAttention>(config, layer, spec.causal);
    case AttentionKind::multi_latent:
      return std::make_unique<MlaAttention>(config, layer);
  }
  throw Error("decoder layer " + std::to_string(layer), "has an attention kind the spec does not know");
}

}  // namespace

std::unique_ptr<MlpVariant> make_mlp(const MlpSpec& spec, const ModelConfig& config, int layer) {
  switch (spec.kind) {
    case MlpKind::dense:
      return std::make_unique<Mlp>(config, spec, layer);
    case MlpKind::moe:
      return std::make_unique<MoeMlp>(config, spec, layer);
  }
  throw Error("decoder layer " + std::to_string(layer), "has an MLP kind the spec does not know");
}

LayerSpec layer_spec(const ModelConfig& config, int layer) {
  const std::string what = "decoder layer " + std::to_string(layer);
  LayerSpec spec;
  spec.layer = layer;
  spec.norm = NormPlacement::pre_norm;
  spec.attention.kind = config.multi_latent_attention ? AttentionKind::multi_latent : AttentionKind::self_attention;
  spec.attention.causal = !config.bert;
  spec.mlp.activation = config.swiglu ? MlpActivation::swiglu : MlpActivation::gelu;
  if (config.is_moe_layer(layer)) {
    if (!config.swiglu) throw Error(what, "has MoE experts, which are SwiGLU MLPs (--swiglu)");
    spec.mlp.kind = MlpKind::moe;
    spec.mlp.ffn_hidden_size = config.moe_ffn();
    spec.mlp.shared_expert_ffn_hidden_size = config.moe_shared_expert_intermediate_size;
  } else {
    spec.mlp.kind = MlpKind::dense;
    spec.mlp.ffn_hidden_size = config.ffn_hidden_size;
  }
  return spec;
}

ModelSpec model_spec(const ModelConfig& config, const std::vector<ChunkSpec>& chunks) {
  bool embedding_here = false, output_here = false;
  for (const ChunkSpec& chunk : chunks) {
    embedding_here = embedding_here || chunk.has_embedding;
    output_here = output_here || chunk.has_output;
  }
  const bool tied = !config.untie_embeddings_and_output_weights;
  const bool positions = config.position_embedding == PositionEmbedding::learned_absolute;
  const EmbeddingKind embedding_kind = positions ? EmbeddingKind::word_and_learned_positions : EmbeddingKind::word;
  ModelSpec spec;
  for (const ChunkSpec& range : chunks) {
    ChunkBlocks chunk;
    static_cast<ChunkSpec&>(chunk) = range;
    if (range.has_embedding) {
      chunk.embedding = EmbeddingSpec{embedding_kind, tied, config.bert && config.bert_binary_head,
                                      config.mtp_num_layers > 0 && !output_here};
    }
    for (int layer = range.first_layer; layer < range.last_layer; ++layer) {
      chunk.layers.push_back(layer_spec(config, layer));
    }
    if (range.has_output) {
      const OutputWeight output = !tied ? OutputWeight::own
                                  : embedding_here ? OutputWeight::tied_embedding
                                                   : OutputWeight::tied_copy;
      chunk.head = config.bert ? HeadSpec{HeadKind::bert, output, config.bert_binary_head}
                               : HeadSpec{HeadKind::language_model, output};
      for (int depth = 0; depth < config.mtp_num_layers; ++depth) {
        chunk.mtp_layers.push_back(layer_spec(config, config.num_layers + depth));
      }
      if (config.mtp_num_layers > 0) {
        // The lookups of a stage without the embedding read its copy of the word table (a learned
        // position table has no copy: check_spec refuses it).
        chunk.mtp_embedding = EmbeddingSpec{embedding_kind, tied, config.bert && config.bert_binary_head, false};
        chunk.mtp_embedding_copy = !embedding_here;
      }
    }
    spec.chunks.push_back(std::move(chunk));
  }
  return spec;
}

ModelSpec model_spec(const ModelConfig& config) {
  return model_spec(config, std::vector<ChunkSpec>{{0, config.num_layers, true, true}});
}

void check_spec(const ModelSpec& spec) {
  for (const ChunkBlocks& chunk : spec.chunks) {
    const std::string what = range_name(chunk);
    if (chunk.embedding.has_value() != chunk.has_embedding) {
      throw Error(what, chunk.has_embedding ? "embeds but has no embedding block" : "has an embedding block");
    }
    if (chunk.head.has_value() != chunk.has_output) {
      throw Error(what, chunk.has_output ? "ends the model but has no head block" : "has a head block");
    }
    if (static_cast<int>(chunk.layers.size()) != chunk.last_layer - chunk.first_layer) {
      throw Error(what, "has " + std::to_string(chunk.layers.size()) + " layer specs");
    }
    for (size_t i = 0; i < chunk.layers.size(); ++i) {
      const LayerSpec& layer = chunk.layers[i];
      if (layer.layer != chunk.first_layer + static_cast<int>(i)) {
        throw Error(what, "lists layer " + std::to_string(layer.layer) + " in place of " +
                              std::to_string(chunk.first_layer + static_cast<int>(i)));
      }
      if (layer.mlp.ffn_hidden_size <= 0) {
        throw Error("decoder layer " + std::to_string(layer.layer), "has no MLP width");
      }
    }
    if (!chunk.mtp_layers.empty() && !chunk.head) throw Error(what, "has multi-token prediction without the head");
    if (chunk.mtp_layers.empty() != !chunk.mtp_embedding.has_value()) {
      throw Error(what, chunk.mtp_layers.empty() ? "has an MTP embedding without MTP layers"
                                                 : "has multi-token prediction without an embedding to look up");
    }
    if (chunk.mtp_embedding_copy && chunk.mtp_embedding->kind != EmbeddingKind::word) {
      throw Error(what, "has multi-token prediction on a stage without the embedding and a learned position table "
                        "(only the word table has a copy on the last stage)");
    }
    if (chunk.head && chunk.head->output == OutputWeight::tied_embedding) {
      bool embedded = false;
      for (const ChunkBlocks& other : spec.chunks) embedded = embedded || other.embedding.has_value();
      if (!embedded) throw Error(what, "ties its output layer to a word embedding no chunk of the rank holds");
    }
  }
}

ChunkModules::ChunkModules() = default;
ChunkModules::~ChunkModules() = default;
ChunkModules::ChunkModules(ChunkModules&&) noexcept = default;
ChunkModules& ChunkModules::operator=(ChunkModules&&) noexcept = default;

std::unique_ptr<Embedding> make_embedding(const EmbeddingSpec& spec, const ModelConfig& config) {
  switch (spec.kind) {
    case EmbeddingKind::word:
    case EmbeddingKind::word_and_learned_positions:
      return std::make_unique<Embedding>(config, spec);
  }
  throw Error("the model spec", "has an embedding kind it does not know");
}

std::unique_ptr<DecoderLayer> make_decoder_layer(const LayerSpec& spec, const ModelConfig& config) {
  return make_decoder_layer(spec, config, make_mlp(spec.mlp, config, spec.layer));
}

std::unique_ptr<DecoderLayer> make_decoder_layer(const LayerSpec& spec, const ModelConfig& config,
                                                 std::unique_ptr<MlpVariant> mlp) {
  switch (spec.norm) {
    case NormPlacement::pre_norm:
      return std::make_unique<PreNormLayer>(config, spec.layer, make_attention(spec.attention, config, spec.layer),
                                            std::move(mlp));
  }
  throw Error("decoder layer " + std::to_string(spec.layer), "has a norm placement the spec does not know");
}

std::unique_ptr<OutputHead> make_head(const HeadSpec& spec, const ModelConfig& config) {
  switch (spec.kind) {
    case HeadKind::language_model:
      return std::make_unique<OutputHead>(config, spec);
    case HeadKind::bert:
      return std::make_unique<BertHead>(config, spec);
  }
  throw Error("the model spec", "has a head kind it does not know");
}

ChunkModules make_chunk(const ChunkBlocks& chunk, const ModelConfig& config) {
  ChunkModules modules;
  if (chunk.embedding) modules.embedding = make_embedding(*chunk.embedding, config);
  for (const LayerSpec& layer : chunk.layers) {
    std::unique_ptr<MlpVariant> mlp = make_mlp(layer.mlp, config, layer.layer);
    if (layer.mlp.kind == MlpKind::moe) modules.moe_layers.push_back(static_cast<MoeMlp*>(mlp.get()));
    modules.layers.push_back(make_decoder_layer(layer, config, std::move(mlp)));
  }
  if (chunk.head) modules.head = make_head(*chunk.head, config);
  if (!chunk.mtp_layers.empty()) {
    std::vector<std::unique_ptr<DecoderLayer>> mtp_layers;
    for (const LayerSpec& layer : chunk.mtp_layers) {
      std::unique_ptr<MlpVariant> mlp = make_mlp(layer.mlp, config, layer.layer);
      if (layer.mlp.kind == MlpKind::moe) modules.moe_layers.push_back(static_cast<MoeMlp*>(mlp.get()));
      mtp_layers.push_back(make_decoder_layer(layer, config, std::move(mlp)));
    }
    modules.mtp = std::make_unique<MtpBlock>(config, *chunk.mtp_embedding, *chunk.head, chunk.mtp_embedding_copy,
                                             std::move(mtp_layers));
  }
  return modules;
}

ChunkModules make_chunk(const ChunkBlocks& chunk, const ModelConfig& config, const ParamLayout& layout) {
  ChunkModules modules = make_chunk(chunk, config);
  if (modules.embedding) modules.embedding->bind(layout);
  for (auto& layer : modules.layers) layer->bind(layout);
  if (modules.head) modules.head->bind(layout);
  if (modules.mtp) modules.mtp->bind(layout);
  return modules;
}

void declare_parameters(const ChunkModules& chunk, ParamDeclarations& declarations) {
  if (chunk.embedding) chunk.embedding->declare(declarations);
  for (const auto& layer : chunk.layers) layer->declare(declarations);
  if (chunk.head) chunk.head->declare(declarations);
  if (chunk.mtp) chunk.mtp->declare(declarations);
}

}  // namespace mt::model
