// The model spec (model/spec.h): what GPT-2 and LLaMA configs are made of, per pipeline rank and
// chunk; multi-token prediction beside the head; a chunk whose layers differ in MLP width,
// built from hand-made LayerSpecs, laid out by the layout and run by a stage (gradients against
// the double reference, recompute policies bit-identical, planned bytes equal to measured); and
// initial values that come from the init each block declares.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/init.h"
#include "model/layers/decoder_layer.h"
#include "model/stage.h"
#include "../tiny_models.h"
#include "reference_model.h"

using namespace mt;
using namespace mt::model;

namespace mt::model {
void PrintTo(const Init& init, std::ostream* out) {
  *out << (init.kind == Init::Kind::constant ? "constant " : init.kind == Init::Kind::normal ? "normal std " : "unset ")
       << init.value;
}
}  // namespace mt::model
using mt::testing::Data;
using mt::testing::make_data;
using mt::testing::WholeModel;

namespace {

ModelConfig tiny(bool llama, int layers = 2) { return mt::testing::gradient_model(llama, layers, 0.0f); }

// Decoder layer `layer` of the standard kinds with its own MLP width.
LayerSpec dense_layer(const ModelConfig& c, int layer, int64_t ffn) {
  return LayerSpec{.layer = layer,
                   .norm = NormPlacement::pre_norm,
                   .attention = {AttentionKind::self_attention},
                   .mlp = {MlpKind::dense, c.swiglu ? MlpActivation::swiglu : MlpActivation::gelu, ffn}};
}

// The whole model as one chunk whose layer i has MLP width widths[i].
ModelSpec mixed_widths(const ModelConfig& c, const std::vector<int64_t>& widths) {
  ModelSpec spec = model_spec(c);
  ChunkBlocks& chunk = spec.chunks.front();
  chunk.layers.clear();
  for (size_t i = 0; i < widths.size(); ++i) chunk.layers.push_back(dense_layer(c, static_cast<int>(i), widths[i]));
  return spec;
}

ParamLayout single_rank_layout(const ModelConfig& c, const ModelSpec& spec, int tp = 1, int tp_rank = 0) {
  parallel::ParallelConfig parallel;
  parallel.tensor_model_parallel_size = tp;
  parallel::RankCoordinates rank;
  rank.tp = tp_rank;
  return build_layout(c, parallel, rank, spec);
}

std::vector<float> grads_of(const ModelConfig& c, const ParamLayout& layout, const RecomputeConfig& recompute,
                            Precision precision, Data& data, int batch, int64_t* activation_bytes) {
  std::vector<float> params(static_cast<size_t>(layout.total_elements)), grads(params.size(), 0.0f);
  initialize_parameters(layout, 11, params.data());
  WholeModel model(c, layout, precision, recompute, batch, 5);
  model.bind(params.data(), grads.data());
  model.forward_backward(data.batch(batch, c.seq_length), 1.0f, 1);
  *activation_bytes = model.activation_bytes();
  return grads;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TEST(Spec, GptAndLlamaAreMadeOfTheirKinds) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt");
    const ModelConfig c = preset(llama ? "tiny-llama" : "tiny-gpt");
    const ModelSpec spec = model_spec(c);
    ASSERT_EQ(spec.chunks.size(), 1u);
    const ChunkBlocks& chunk = spec.chunks.front();
    EXPECT_EQ(chunk.first_layer, 0);
    EXPECT_EQ(chunk.last_layer, c.num_layers);
    ASSERT_TRUE(chunk.embedding && chunk.head);
    EXPECT_EQ(chunk.embedding->kind, llama ? EmbeddingKind::word : EmbeddingKind::word_and_learned_positions);
    EXPECT_EQ(chunk.embedding->tied_to_output, !llama);
    EXPECT_EQ(chunk.head->kind, HeadKind::language_model);
    EXPECT_EQ(chunk.head->output, llama ? OutputWeight::own : OutputWeight::tied_embedding);
    ASSERT_EQ(chunk.layers.size(), static_cast<size_t>(c.num_layers));
    for (int i = 0; i < c.num_layers; ++i) {
      const LayerSpec& layer = chunk.layers[static_cast<size_t>(i)];
      EXPECT_EQ(layer.layer, i);
      EXPECT_EQ(layer.norm, NormPlacement::pre_norm);
      EXPECT_EQ(layer.attention.kind, AttentionKind::self_attention);
      EXPECT_EQ(layer.mlp.kind, MlpKind::dense);
      EXPECT_EQ(layer.mlp.activation, llama ? MlpActivation::swiglu : MlpActivation::gelu);
      EXPECT_EQ(layer.mlp.ffn_hidden_size, c.ffn_hidden_size);
    }
  }
}

TEST(Spec, PipelineRanksHoldTheirChunksEndsAndTheTiedCopy) {
  ModelConfig c = preset("tiny-gpt");
  c.num_layers = 4;
  parallel::ParallelConfig pp2;
  pp2.pipeline_model_parallel_size = 2;
  pp2.num_virtual_stages_per_pipeline_rank = 2;
  // Virtual stage v = chunk * 2 + pp rank holds layer v.
  const ModelSpec first = model_spec(c, pipeline_chunks(c, pp2, 0));
  const ModelSpec last = model_spec(c, pipeline_chunks(c, pp2, 1));
  ASSERT_EQ(first.chunks.size(), 2u);
  ASSERT_EQ(last.chunks.size(), 2u);
  EXPECT_TRUE(first.chunks[0].embedding.has_value());
  EXPECT_FALSE(first.chunks[1].embedding || first.chunks[0].head || first.chunks[1].head);
  EXPECT_FALSE(last.chunks[0].embedding || last.chunks[1].embedding || last.chunks[0].head);
  ASSERT_TRUE(last.chunks[1].head.has_value());
  EXPECT_EQ(last.chunks[1].head->output, OutputWeight::tied_copy);  // the embedding is on rank 0
  for (int chunk = 0; chunk < 2; ++chunk) {
    ASSERT_EQ(first.chunks[static_cast<size_t>(chunk)].layers.size(), 1u);
    EXPECT_EQ(first.chunks[static_cast<size_t>(chunk)].layers[0].layer, chunk * 2);
    EXPECT_EQ(last.chunks[static_cast<size_t>(chunk)].layers[0].layer, chunk * 2 + 1);
  }
  // The layout holds the spec it walked; the tied copy is declared by the head.
  const ParamLayout layout = build_layout(c, pp2, parallel::RankCoordinates{.pp = 1}, pipeline_chunks(c, pp2, 1));
  EXPECT_EQ(layout.chunks[1].spec.head->output, OutputWeight::tied_copy);
  EXPECT_TRUE(layout.find("embedding.word_embeddings.weight").tied_copy);
  // Untied: the last rank's head has its own output layer.
  c.untie_embeddings_and_output_weights = true;
  EXPECT_EQ(model_spec(c, pipeline_chunks(c, pp2, 1)).chunks[1].head->output, OutputWeight::own);
}

TEST(Spec, MapsEveryLayerKindItHasAVariantFor) {
  // Multi-token prediction: beside the head, one layer spec per depth (global index L + k) like
  // the last decoder layer's, and its MoE MLPs listed after the decoder's.
  ModelConfig mtp = preset("tiny-deepseek");
  mtp.mtp_num_layers = 2;
  const ChunkBlocks whole = model_spec(mtp).chunks[0];
  ASSERT_EQ(whole.mtp_layers.size(), 2u);
  EXPECT_EQ(whole.mtp_layers[1].layer, 3);
  EXPECT_EQ(whole.mtp_layers[1].mlp.kind, MlpKind::moe);
  EXPECT_EQ(whole.mtp_layers[1].attention.kind, AttentionKind::multi_latent);
  EXPECT_EQ(make_chunk(whole, mtp).moe_layers.size(), 3u);
  EXPECT_TRUE(model_spec(mtp, {{0, 1, true, false}}).chunks[0].mtp_layers.empty());
  // A chunk with the head but not the word embedding (a pipeline's last stage) holds it over its
  // own copy of the word table, declared by the block (untied head), summed with the first stage's;
  // a learned position table has no copy there.
  const ChunkBlocks last = model_spec(mtp, {{1, 2, false, true}}).chunks[0];
  EXPECT_TRUE(last.mtp_embedding_copy);
  EXPECT_NO_THROW(check_spec(model_spec(mtp, {{1, 2, false, true}})));
  parallel::ParallelConfig pp2;
  pp2.pipeline_model_parallel_size = 2;
  parallel::RankCoordinates rank;
  rank.pp = 1;
  const ParamLayout layout = build_layout(mtp, pp2, rank, pipeline_chunks(mtp, pp2, 1));
  EXPECT_TRUE(layout.find("embedding.word_embeddings.weight").tied_copy);
  EXPECT_TRUE(layout.find("embedding.word_embeddings.weight").reduce_over_embedding_group);
  rank.pp = 0;
  EXPECT_TRUE(build_layout(mtp, pp2, rank, pipeline_chunks(mtp, pp2, 0))
                  .find("embedding.word_embeddings.weight")
                  .reduce_over_embedding_group);
  ModelConfig positions = preset("tiny-gpt");
  positions.mtp_num_layers = 1;
  EXPECT_THROW(check_spec(model_spec(positions, {{1, 2, false, true}})), Error);
  // A --moe-layer-freq pattern chooses per layer: a dense MLP, or experts of --moe-ffn-hidden-size
  // with the shared experts' width.
  ModelConfig moe = preset("tiny-mixtral");
  moe.moe_layer_pattern = {0, 1};
  moe.moe_shared_expert_intermediate_size = 48;
  EXPECT_EQ(layer_spec(moe, 0).mlp.kind, MlpKind::dense);
  EXPECT_EQ(layer_spec(moe, 0).mlp.ffn_hidden_size, 176);
  const MlpSpec experts = layer_spec(moe, 1).mlp;
  EXPECT_EQ(experts.kind, MlpKind::moe);
  EXPECT_EQ(experts.ffn_hidden_size, 32);
  EXPECT_EQ(experts.shared_expert_ffn_hidden_size, 48);
  EXPECT_EQ(make_chunk(model_spec(moe).chunks[0], moe).moe_layers.size(), 1u);
  // Multi-latent attention is a variant of its own.
  ModelConfig mla = preset("tiny-llama");
  mla.multi_latent_attention = true;
  mla.kv_lora_rank = 8;
  mla.qk_head_dim = 8;
  mla.qk_pos_emb_head_dim = 4;
  mla.v_head_dim = 8;
  mla.num_query_groups = mla.num_attention_heads;
  EXPECT_EQ(layer_spec(mla, 0).attention.kind, AttentionKind::multi_latent);
  EXPECT_EQ(layer_spec(preset("tiny-llama"), 0).attention.kind, AttentionKind::self_attention);
}

TEST(Spec, RefusesBlocksThatDoNotMatchTheirChunk) {
  const ModelConfig c = tiny(false);
  ModelSpec missing_layer = model_spec(c);
  missing_layer.chunks[0].layers.pop_back();
  EXPECT_THROW(single_rank_layout(c, missing_layer), Error);
  ModelSpec misplaced = model_spec(c);
  std::swap(misplaced.chunks[0].layers[0], misplaced.chunks[0].layers[1]);
  EXPECT_THROW(single_rank_layout(c, misplaced), Error);
  ModelSpec headless = model_spec(c);
  headless.chunks[0].head.reset();
  EXPECT_THROW(single_rank_layout(c, headless), Error);
  ModelSpec no_width = mixed_widths(c, {24, 0});
  EXPECT_THROW(single_rank_layout(c, no_width), Error);
}

TEST(Spec, LayersOfOneChunkHaveTheirOwnMlpWidths) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt");
    const ModelConfig c = tiny(llama);
    const ModelSpec spec = mixed_widths(c, {24, 40});
    const std::string fc2 = ".mlp.linear_fc2.weight";
    for (int tp : {1, 2}) {
      const ParamLayout layout = single_rank_layout(c, spec, tp, tp - 1);
      EXPECT_EQ(layout.find("decoder.layers.0" + fc2).global_shape, (std::vector<int64_t>{16, 24}));
      EXPECT_EQ(layout.find("decoder.layers.1" + fc2).global_shape, (std::vector<int64_t>{16, 40}));
      EXPECT_EQ(layout.find("decoder.layers.1" + fc2).local_shape, (std::vector<int64_t>{16, 40 / tp}));
      const std::string fc1 = llama ? ".mlp.linear_fc1_up.weight" : ".mlp.linear_fc1.weight";
      EXPECT_EQ(layout.find("decoder.layers.0" + fc1).local_shape, (std::vector<int64_t>{24 / tp, 16}));
      EXPECT_EQ(layout.find("decoder.layers.1" + fc1).local_shape, (std::vector<int64_t>{40 / tp, 16}));
      // The layer objects read their widths from the layout: SwiGLU's fc1 is [gate | up].
      const ChunkModules blocks = make_chunk(layout.chunks[0].spec, c, layout);
      const int64_t qkv_rows = (llama ? 32 : 48) / tp, fc1_rows = (llama ? 2 : 1) * 40 / tp;
      EXPECT_EQ(blocks.layers[0]->widest_gemm_operand(), std::max<int64_t>({16, qkv_rows, (llama ? 2 : 1) * 24 / tp}));
      EXPECT_EQ(blocks.layers[1]->widest_gemm_operand(), std::max<int64_t>({16, qkv_rows, fc1_rows}));
    }
    // TP must divide every layer's width.
    EXPECT_THROW(single_rank_layout(c, mixed_widths(c, {24, 39}), 2, 0), UsageError);
  }
}

TEST(Spec, AChunkOfTwoMlpWidthsMatchesTheDoubleReference) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt");
    const ModelConfig c = tiny(llama);
    mt::testing::check_gradients_against_double_reference(c, single_rank_layout(c, mixed_widths(c, {24, 40})), 2);
  }
}

TEST(Spec, AChunkOfMixedWidthsRecomputesBitIdenticallyAndPlansItsBytes) {
  for (bool llama : {false, true}) {
    ModelConfig c = tiny(llama, 4);
    const ParamLayout layout = single_rank_layout(c, mixed_widths(c, {24, 56, 8, 40}));
    Data data = make_data(c, 2, 4);
    const int64_t rows = 2 * c.seq_length;
    for (Precision precision : {Precision::fp32, Precision::bf16}) {
      SCOPED_TRACE(std::string(llama ? "llama " : "gpt ") + precision_name(precision));
      std::vector<float> reference;
      for (const RecomputeConfig& recompute :
           {RecomputeConfig{}, RecomputeConfig{RecomputeGranularity::selective, RecomputeMethod::uniform, 1},
            RecomputeConfig{RecomputeGranularity::full, RecomputeMethod::uniform, 1},
            RecomputeConfig{RecomputeGranularity::full, RecomputeMethod::uniform, 3},
            RecomputeConfig{RecomputeGranularity::full, RecomputeMethod::block, 2}}) {
        SCOPED_TRACE("recompute " + std::to_string(static_cast<int>(recompute.granularity)) + " " +
                     std::to_string(recompute.num_layers));
        int64_t measured = 0;
        const std::vector<float> grads = grads_of(c, layout, recompute, precision, data, 2, &measured);
        if (reference.empty()) reference = grads;
        EXPECT_EQ(grads, reference);
        EXPECT_EQ(measured, planned_activation_bytes(c, layout, 0, rows, 1, precision, recompute, 1));
      }
    }
  }
}

TEST(Spec, AChunkOfMixedWidthsHoldsAsManyBytesInAnyLayerOrder) {
  const ModelConfig c = tiny(true, 3);
  const RecomputeConfig full{RecomputeGranularity::full, RecomputeMethod::uniform, 3};
  auto planned = [&](const std::vector<int64_t>& widths, const RecomputeConfig& recompute) {
    return planned_activation_bytes(c, single_rank_layout(c, mixed_widths(c, widths)), 0, 2 * c.seq_length, 1,
                                    Precision::fp32, recompute, 1);
  };
  // Without recompute each slot keeps every layer's own saved set: between the narrowest and the
  // widest uniform chunk, in any order.
  const int64_t mixed = planned({8, 56, 24}, {});
  EXPECT_EQ(mixed, planned({56, 24, 8}, {}));
  EXPECT_LT(planned({8, 8, 8}, {}), mixed);
  EXPECT_LT(mixed, planned({56, 56, 56}, {}));
  // Full recompute of the whole chunk as one group: the slots keep only its input, and the
  // scratch sets and the workspace are sized by the widest layer, so the chunk plans as much as
  // one of only that layer's width.
  EXPECT_EQ(planned({8, 56, 24}, full), planned({56, 56, 56}, full));
  EXPECT_LT(planned({8, 8, 8}, full), planned({8, 56, 24}, full));
}

TEST(Init, ComesFromTheKindEachBlockDeclares) {
  for (const char* name : {"tiny-gpt", "tiny-llama"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = preset(name);
    const ParamLayout layout = build_layout(c);
    const double weight_std = c.init_method_std;
    const double output_std = weight_std / std::sqrt(2.0 * c.num_layers);
    for (const ParamEntry& e : layout.entries) {
      SCOPED_TRACE(e.name);
      if (e.name.find("layernorm") != std::string::npos && ends_with(e.name, ".weight")) {
        EXPECT_EQ(e.init, Init::constant(1.0f));
      } else if (ends_with(e.name, ".bias")) {
        EXPECT_EQ(e.init, Init::constant(0.0f));
      } else if (ends_with(e.name, "linear_proj.weight") || ends_with(e.name, "linear_fc2.weight")) {
        EXPECT_EQ(e.init, Init::normal(output_std));
      } else {
        EXPECT_EQ(e.init, Init::normal(weight_std));
      }
    }
  }
}

TEST(Init, WritesWhatTheEntryDeclares) {
  const ModelConfig c = preset("tiny-gpt");
  ParamLayout layout = build_layout(c);
  std::vector<float> standard(static_cast<size_t>(layout.total_elements)), changed(standard.size());
  initialize_parameters(layout, 3, standard.data());
  ParamEntry& fc1 = const_cast<ParamEntry&>(layout.find("decoder.layers.0.mlp.linear_fc1.weight"));
  ParamEntry& norm = const_cast<ParamEntry&>(layout.find("decoder.final_layernorm.weight"));
  fc1.init = Init::constant(0.25f);
  norm.init = Init::normal(2 * c.init_method_std);
  initialize_parameters(layout, 3, changed.data());
  for (int64_t i = 0; i < fc1.numel; ++i) ASSERT_EQ(changed[static_cast<size_t>(fc1.offset + i)], 0.25f);
  double square = 0;
  for (int64_t i = 0; i < norm.numel; ++i) square += std::pow(changed[static_cast<size_t>(norm.offset + i)], 2);
  EXPECT_NEAR(std::sqrt(square / static_cast<double>(norm.numel)), 2 * c.init_method_std, 0.3 * c.init_method_std);
  // Everything else is as before (the streams are keyed by name, not by position).
  for (const ParamEntry& e : layout.entries) {
    if (&e == &fc1 || &e == &norm) continue;
    for (int64_t i = 0; i < e.numel; ++i) {
      ASSERT_EQ(changed[static_cast<size_t>(e.offset + i)], standard[static_cast<size_t>(e.offset + i)]) << e.name;
    }
  }
  // An entry without an init is refused.
  fc1.init = Init{};
  EXPECT_THROW(initialize_parameters(layout, 3, changed.data()), Error);
}
