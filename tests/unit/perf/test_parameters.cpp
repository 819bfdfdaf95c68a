// Parameter accounting (lib/perf/parameters.h): published totals and active counts worked out by
// hand, and agreement with the model's own count.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "model/layout.h"
#include "perf/parameters.h"
#include "perf/flops.h"

using namespace mt::perf;
using mt::model::preset;

TEST(Parameters, DenseModelsAgreeWithTheModelsOwnCount) {
  for (const char* name : {"tiny-gpt", "tiny-llama", "gpt2-124m", "gpt2-345m", "gpt3-175b", "llama3-8b",
                           "llama3-70b", "llama3.1-405b"}) {
    const auto c = preset(name);
    EXPECT_EQ(count_parameters(c).total, mt::model::parameter_count(c)) << name;
    EXPECT_EQ(count_parameters(c, c.padded_vocab_size()).total, mt::model::parameter_count(c, true)) << name;
    EXPECT_EQ(count_parameters(c).active, count_parameters(c).total) << name;
  }
}

TEST(Parameters, GptThreeIsOneHundredSeventyFiveBillion) {
  // h = 12288, 96 layers, biases, LayerNorm, learned positions (2048), tied, V = 50257:
  // per layer 12 h^2 + 13 h = 1,811,939,328 + 159,744; embeddings 50257 h + 2048 h; final norm 2h.
  const int64_t h = 12288;
  const int64_t expected = 96 * (12 * h * h + 13 * h) + 50257 * h + 2048 * h + 2 * h;
  EXPECT_EQ(expected, 174604259328);
  EXPECT_EQ(count_parameters(preset("gpt3-175b")).total, expected);
}

TEST(Parameters, MixtralTotalAndActiveAsPublished) {
  // Mixtral 8x7B (46.7B total, 12.9B active): h 4096, 32 layers, GQA 32/8 heads of 128, experts
  // of ffn 14336 with SwiGLU (3 h f each), router h x 8, RMSNorm, untied V = 32000.
  const int64_t h = 4096, f = 14336;
  const int64_t attention = h * (4096 + 2 * 1024) + 4096 * h;  // 41,943,040
  const int64_t expert = 3 * h * f;                            // 176,160,768
  const int64_t shared_per_layer = attention + h * 8 + 2 * h;  // + router + two norms
  const int64_t outside = 2 * 32000 * h + h;
  const ParameterCounts small = count_parameters(preset("mixtral-8x7b"));
  EXPECT_EQ(small.total, 32 * (shared_per_layer + 8 * expert) + outside);
  EXPECT_EQ(small.total, 46702792704);
  EXPECT_EQ(small.active, 32 * (shared_per_layer + 2 * expert) + outside);
  EXPECT_EQ(small.active, 12879925248);
  EXPECT_EQ(small.by_group.at(ParamGroup::routed_experts), 32 * 8 * expert);
  // Mixtral 8x22B (141B total, 39B active): h 6144, 56 layers, 48/8 heads, ffn 16384, V = 32768.
  const ParameterCounts large = count_parameters(preset("mixtral-8x22b"));
  EXPECT_EQ(large.total, 140630071296);
  EXPECT_EQ(large.active, 39161468928);
}

TEST(Parameters, DeepSeekV3MainModelIs671BillionWith37Active) {
  // MLA (h 7168, 128 heads, q_lora 1536, kv_lora 512, qk 128 + rope 64, v 128) with RMSNorm:
  //   q: 1536 (7168 + 128*192 + 1) = 48,760,320; kv: 512 (7168 + 128*256 + 1) + 7168*64 = 20,906,496;
  //   o: 128*128*7168 = 117,440,512; together 187,107,328 per layer.
  // 3 dense layers (ffn 18432): 3*7168*18432 = 396,361,728; 58 MoE layers: 256 routed + 1 shared
  // experts of 3*7168*2048 = 44,040,192, router 7168*256 = 1,835,008; two norms 14,336 a layer;
  // untied embeddings 2 * 129280 * 7168 and the final norm.
  const int64_t attention = 187107328, expert = 44040192, norms = 14336, router = 1835008;
  const int64_t dense = attention + 396361728 + norms;
  const int64_t moe = attention + 257 * expert + router + norms;
  const int64_t moe_active = attention + 9 * expert + router + norms;
  const int64_t outside = 2 * int64_t{129280} * 7168 + 7168;
  auto v3 = preset("deepseek-v3");
  v3.mtp_num_layers = 0;
  const ParameterCounts main_model = count_parameters(v3);
  EXPECT_EQ(main_model.total, 3 * dense + 58 * moe + outside);
  EXPECT_EQ(main_model.total, 671026404352);  // "671B total parameters"
  EXPECT_EQ(main_model.active, 3 * dense + 58 * moe_active + outside);
  EXPECT_EQ(main_model.active, 37552282624);  // "37B activated for each token"
  // The MTP module: one MoE layer like the last plus enorm, hnorm, its final norm and the
  // 2h -> h projection (it shares the embedding and output layer).
  const ParameterCounts with_mtp = count_parameters(preset("deepseek-v3"));
  EXPECT_EQ(with_mtp.total - main_model.total, moe + 3 * 7168 + 2 * int64_t{7168} * 7168);
  EXPECT_EQ(with_mtp.active - main_model.active, moe_active + 3 * 7168 + 2 * int64_t{7168} * 7168);
}

// Issue 22: the accounting mt-mfu and mt-memreport use counts what mt-train builds. Models with
// multi-token prediction depths (dense, MoE and MLA ones) count what the single-rank layout lays
// out, on the padded vocabulary.
TEST(Parameters, MultiTokenPredictionCountsWhatTheLayoutLaysOut) {
  for (const char* name : {"tiny-llama", "tiny-gpt", "tiny-deepseek", "tiny-mixtral"}) {
    for (int depths : {1, 2}) {
      mt::model::ModelConfig c = preset(name);
      c.mtp_num_layers = depths;
      EXPECT_EQ(count_parameters(c, c.padded_vocab_size()).total, mt::model::build_layout(c).parameter_elements())
          << name << " with " << depths << " MTP depths";
    }
  }
}

TEST(Parameters, EmbeddingShare) {
  // GPT-2 124M: (50257 + 1024) x 768 of 124,439,808.
  const ParameterCounts gpt2 = count_parameters(preset("gpt2-124m"));
  EXPECT_EQ(gpt2.embedding, (50257 + 1024) * 768);
  EXPECT_NEAR(gpt2.embedding_share(), 0.3164, 1e-4);
  // LLaMA-3 8B: two 128256 x 4096 matrices of 8,030,261,248.
  EXPECT_NEAR(count_parameters(preset("llama3-8b")).embedding_share(), 2.0 * 128256 * 4096 / 8030261248, 1e-12);
}

// BERT (issue 25): the token types and heads are counted as lib/model lays them out, with and
// without the binary head; the 6N count leaves the token-type lookups out as it does positions.
TEST(Parameters, BertCountsItsHeadsAndTokenTypesAsTheModelDoes) {
  for (const char* name : {"tiny-bert", "bert-345m"}) {
    for (const bool binary_head : {true, false}) {
      auto c = preset(name);
      c.bert_binary_head = binary_head;
      EXPECT_EQ(count_parameters(c).total, mt::model::parameter_count(c)) << name << binary_head;
      EXPECT_EQ(count_parameters(c, c.padded_vocab_size()).total, mt::model::parameter_count(c, true)) << name;
      const int64_t h = c.hidden_size;
      const auto groups = count_parameters(c).by_group;
      EXPECT_EQ(groups.count(ParamGroup::token_type_embeddings) ? groups.at(ParamGroup::token_type_embeddings) : 0,
                binary_head ? 2 * h : 0);
      // dense (+bias) and LayerNorm, the vocabulary bias; the pooler (+bias) and the 2-way head (+bias)
      EXPECT_EQ(groups.at(ParamGroup::bert_head),
                h * h + 3 * h + c.vocab_size + (binary_head ? h * h + h + 2 * h + 2 : 0));
      EXPECT_EQ(flops_parameter_count(c), count_parameters(c).total - c.max_position_embeddings * h -
                                              (binary_head ? 2 * h : 0));
    }
  }
  // BERT-345M: 24 x 12.6M layers + 30522 x 1024 words + 512 x 1024 positions + heads = 336.2M.
  EXPECT_EQ(count_parameters(preset("bert-345m")).total, 336226108);
}
