// The model spec: one description of what a rank's model chunks are made of, built from the model
// config, that the parameter layout (model/layout.h build_layout) and the stage (model/stage.h)
// both walk, so no other place spells out the model's composition. Per chunk, in forward order:
// the embedding kind (first chunk of the model), per decoder layer a LayerSpec (its global index,
// its attention variant, its MLP variant with its own ffn width and activation, its norm
// placement), and the head kind (last chunk). Layers of one chunk may differ in kind and width.
//
// layer_spec() is the one place that maps the config to a layer's kinds (--moe-layer-freq
// patterns choose per layer between the dense MLP and the mixture of experts); its variants are
// self-attention, a dense GELU or SwiGLU MLP or a MoE MLP (model/layers/moe_mlp.h), pre-norm, and
// it throws mt::Error for a config it has no variant for. With --mtp-num-layers D the chunk that
// ends the model also holds the multi-token prediction block (model/layers/mtp.h) after its head:
// D transformer layers of global index num_layers + k, each specified by layer_spec like the
// decoder's (so MoE or dense as the last decoder layer, MLA where the model has it). BERT
// (ModelConfig::bert) is the same blocks with non-causal attention, token types in the embedding
// (binary head) and HeadKind::bert (model/layers/bert_head.h). The factories below build the block objects (model/layers/) from a spec: a new
// variant is a new enum value, one case in a factory of spec.cpp and the new block's own files.
// Tested in tests/unit/model/test_spec.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/config.h"

namespace mt::model {

class ParamDeclarations;
struct ParamLayout;
class Embedding;
class DecoderLayer;
class OutputHead;
class MlpVariant;
class MoeMlp;
class MtpBlock;

// A model chunk: decoder layers [first_layer, last_layer) and whether it holds the model's ends.
struct ChunkSpec {
  int first_layer = 0;
  int last_layer = 0;
  bool has_embedding = true;  // the model's first chunk (first pipeline stage, virtual stage 0)
  bool has_output = true;     // the model's last chunk (last pipeline stage, last virtual stage)
};

enum class EmbeddingKind {
  word,                        // a vocab-parallel word table (rotary models)
  word_and_learned_positions,  // plus a learned absolute position table (GPT-2)
};

struct EmbeddingSpec {
  EmbeddingKind kind = EmbeddingKind::word;
  bool tied_to_output = true;  // the output layer multiplies with the word table
  bool token_types = false;    // BERT with the binary head: a 2-row token-type table added too
  // Multi-token prediction under pipeline parallelism: the last stage keeps a copy of the word
  // table for the MTP depths' lookups, whose grads are summed with this one's (as a tied output's).
  bool shared_with_mtp = false;
};

enum class AttentionKind {
  self_attention,  // q/k/v projections, RoPE from the config, causal GQA core, output projection
  multi_latent,    // DeepSeek's MLA (--multi-latent-attention): low-rank q and kv, decoupled RoPE key
};

struct AttentionSpec {
  AttentionKind kind = AttentionKind::self_attention;
  bool causal = true;  // false: BERT's bidirectional attention under the padding mask
};

enum class MlpKind {
  dense,  // fc1, activation, fc2
  moe,    // router, token dispatcher, local SwiGLU experts, optional shared experts
};

enum class MlpActivation { gelu, swiglu };

struct MlpSpec {
  MlpKind kind = MlpKind::dense;
  MlpActivation activation = MlpActivation::gelu;
  int64_t ffn_hidden_size = 0;  // global width of the MLP's hidden layer (moe: of each expert)
  int64_t shared_expert_ffn_hidden_size = 0;  // moe: the shared experts' width (0: none)
};

// Where a decoder layer's norms sit: the decoder-layer implementation the factory builds.
enum class NormPlacement {
  pre_norm,  // x + attention(norm(x)), then x + mlp(norm(x)) (GPT, LLaMA)
};

struct LayerSpec {
  int layer = 0;  // global decoder layer index
  NormPlacement norm = NormPlacement::pre_norm;
  AttentionSpec attention;
  MlpSpec mlp;
};

enum class HeadKind {
  language_model,  // final norm, output layer over the padded vocabulary, vocab-parallel cross-entropy
  bert,            // final norm, BERT's LM head and vocabulary bias, and the pooler + binary head
};

// The output layer's weight.
enum class OutputWeight {
  own,             // output_layer.weight (untied)
  tied_embedding,  // the word embedding, held by a chunk of this rank
  tied_copy,       // this rank's own copy of the tied word embedding (another stage embeds)
};

struct HeadSpec {
  HeadKind kind = HeadKind::language_model;
  OutputWeight output = OutputWeight::tied_embedding;
  bool binary_head = false;  // bert: the pooler and the sentence-order head
};

// One chunk of the spec: its layer range and ends, and its blocks in forward order.
struct ChunkBlocks : ChunkSpec {
  std::optional<EmbeddingSpec> embedding;  // iff has_embedding
  std::vector<LayerSpec> layers;           // layers first_layer .. last_layer - 1, in order
  std::optional<HeadSpec> head;            // iff has_output
  // Multi-token prediction (only beside the head): per depth k its transformer layer's spec
  // (global index num_layers + k); empty without --mtp-num-layers.
  std::vector<LayerSpec> mtp_layers;
  // What the MTP depths look up (with mtp_layers): the rank's word embedding, or, when no chunk of
  // the rank embeds (a pipeline's last stage, Megatron's mtp_process stage), its own copy of the
  // word table, declared by the head when the output layer is tied (OutputWeight::tied_copy) and
  // by the MTP block otherwise.
  std::optional<EmbeddingSpec> mtp_embedding;
  bool mtp_embedding_copy = false;
};

// The chunks a rank holds, in order.
struct ModelSpec {
  std::vector<ChunkBlocks> chunks;
};

// The spec of decoder layer `layer` of `config` (throws mt::Error when no variant fits).
LayerSpec layer_spec(const ModelConfig& config, int layer);
// The spec of `chunks` on one rank (a tied output layer takes a copy of the word embedding when
// none of the chunks embeds), and of the whole model as one chunk.
ModelSpec model_spec(const ModelConfig& config, const std::vector<ChunkSpec>& chunks);
ModelSpec model_spec(const ModelConfig& config);
// Throws mt::Error unless every chunk's blocks match its range and ends.
void check_spec(const ModelSpec& spec);

// The block objects of one chunk, made from its spec by the factories. Made unbound, they
// declare their parameters; bound to a layout (bind), they run.
struct ChunkModules {
  std::unique_ptr<Embedding> embedding;  // when the chunk embeds
  std::vector<std::unique_ptr<DecoderLayer>> layers;
  std::unique_ptr<OutputHead> head;      // when the chunk ends the model
  std::unique_ptr<MtpBlock> mtp;         // beside the head, with --mtp-num-layers
  std::vector<MoeMlp*> moe_layers;       // the MoE MLPs of `layers` and then of `mtp`, in layer order (owned there)

  ChunkModules();
  ~ChunkModules();
  ChunkModules(ChunkModules&&) noexcept;
  ChunkModules& operator=(ChunkModules&&) noexcept;
};

// The factories: each switch over a kind builds its variant's block.
std::unique_ptr<Embedding> make_embedding(const EmbeddingSpec& spec, const ModelConfig& config);
std::unique_ptr<DecoderLayer> make_decoder_layer(const LayerSpec& spec, const ModelConfig& config);
std::unique_ptr<MlpVariant> make_mlp(const MlpSpec& spec, const ModelConfig& config, int layer);
// The layer around an MLP made by make_mlp.
std::unique_ptr<DecoderLayer> make_decoder_layer(const LayerSpec& spec, const ModelConfig& config,
                                                 std::unique_ptr<MlpVariant> mlp);
std::unique_ptr<OutputHead> make_head(const HeadSpec& spec, const ModelConfig& config);

// A chunk's blocks, unbound.
ChunkModules make_chunk(const ChunkBlocks& chunk, const ModelConfig& config);
// The same bound to `layout` (which holds their parameters).
ChunkModules make_chunk(const ChunkBlocks& chunk, const ModelConfig& config, const ParamLayout& layout);
// The chunk's parameters in forward order (the declaration walk build_layout runs).
void declare_parameters(const ChunkModules& chunk, ParamDeclarations& declarations);

}  // namespace mt::model
