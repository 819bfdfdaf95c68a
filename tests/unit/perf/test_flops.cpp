// FLOPs conventions (lib/perf/flops.h) against values worked out by hand, each line of arithmetic
// written out, and against Megatron's and the Narayanan paper's published closed forms.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "perf/flops.h"

using namespace mt::perf;
using mt::model::preset;

namespace {

// tiny-llama: L 2, h 64, 4 heads of 16 (q = 64), 2 KV groups (kv = 32), SwiGLU ffn 176, untied,
// RMSNorm, no biases, V 256 (padded 256), s 64.
constexpr double kMlp = 6.0 * 64 * 176 * 3 * 2;             // 405,504: 6 h F x3 (SwiGLU) x L
constexpr double kAttnLinear = 6.0 * (64 * 128 + 64 * 64) * 2;  // 147,456: 6 (h (q + 2kv) + q h) x L
constexpr double kCoreHalved = 64.0 * 6 * 64 * 2;           // 49,152: s x 6 q x L (x2 QK^T/PV, /2 causal)
constexpr double kLogits = 6.0 * 64 * 256;                  // 98,304: 6 h V
// Parameters: 2 x (norms 2*64 + attention 12,288 + MLP 3*64*176) + 2 x 256*64 + 64 = 125,248.
constexpr double kParams = 2 * (128 + 12288 + 33792) + 2 * 256 * 64 + 64;

}  // namespace

TEST(Flops, EveryConventionOnATinyModelByHand) {
  const auto c = preset("tiny-llama");
  EXPECT_DOUBLE_EQ(flops_per_token(c, FlopsConvention::megatron), kMlp + kAttnLinear + kCoreHalved + kLogits);
  EXPECT_DOUBLE_EQ(flops_per_token(c, FlopsConvention::megatron), 700416);
  // megatron-2024: 12 L h q (1 + g/n) + 12 L s q (not halved) + 12 L h F x1.5 + 6 h V.
  EXPECT_DOUBLE_EQ(flops_per_token(c, FlopsConvention::megatron_2024),
                   12.0 * 2 * 64 * 64 * 1.5 + 12.0 * 2 * 64 * 64 + 12.0 * 2 * 64 * 176 * 1.5 + kLogits);
  EXPECT_DOUBLE_EQ(flops_per_token(c, FlopsConvention::megatron_2024), 749568);
  // narayanan: four passes over the layers, attention not halved, three over the logits.
  EXPECT_DOUBLE_EQ(flops_per_token(c, FlopsConvention::narayanan),
                   4.0 / 3 * (kMlp + kAttnLinear + 2 * kCoreHalved) + kLogits);
  EXPECT_DOUBLE_EQ(flops_per_token(c, FlopsConvention::narayanan), 966656);
  EXPECT_EQ(flops_parameter_count(c), kParams);
  EXPECT_DOUBLE_EQ(flops_per_token(c, FlopsConvention::six_n), 6 * kParams);
  EXPECT_DOUBLE_EQ(flops_per_token(c, FlopsConvention::six_n_attention), 6 * kParams + 12.0 * 2 * 64 * 64);
  EXPECT_DOUBLE_EQ(flops_per_token(c, FlopsConvention::six_n_causal_attention), 6 * kParams + 6.0 * 2 * 64 * 64);
  // A global batch of 3 sequences: per token x 3 x 64.
  EXPECT_DOUBLE_EQ(model_flops(c, 3, FlopsConvention::megatron).total(), 700416.0 * 3 * 64);
}

TEST(Flops, BreakdownParts) {
  const FlopsBreakdown f = model_flops(preset("tiny-llama"), 1, FlopsConvention::megatron);
  EXPECT_DOUBLE_EQ(f.dense_mlp, kMlp * 64);
  EXPECT_DOUBLE_EQ(f.attention_linear, kAttnLinear * 64);
  EXPECT_DOUBLE_EQ(f.attention_core, kCoreHalved * 64);
  EXPECT_DOUBLE_EQ(f.logits, kLogits * 64);
  EXPECT_DOUBLE_EQ(f.routed_experts + f.shared_experts + f.mtp + f.embedding + f.other, 0);
  // 6N files each parameter group's 6 x params under its part: the untied input embedding apart
  // from the output layer, norms under `other`.
  const FlopsBreakdown n = model_flops(preset("tiny-llama"), 1, FlopsConvention::six_n);
  EXPECT_DOUBLE_EQ(n.embedding, 6.0 * 256 * 64 * 64);
  EXPECT_DOUBLE_EQ(n.logits, 6.0 * 256 * 64 * 64);
  EXPECT_DOUBLE_EQ(n.other, 6.0 * (2 * 2 * 64 + 64) * 64);
}

TEST(Flops, MegatronsWorkedNumbersForLlamaAndMixtral) {
  // LLaMA-3 8B at s 8192, V 128256: MLP 6*4096*14336*3*32 = 33.82e9, attention linear
  // 6*(4096*6144 + 4096*4096)*32 = 8.05e9, core 8192*6*4096*32 = 6.44e9, logits
  // 6*4096*128256 = 3.15e9: 51.47 GFLOP/token.
  const auto llama = preset("llama3-8b");
  EXPECT_DOUBLE_EQ(flops_per_token(llama, FlopsConvention::megatron),
                   6.0 * 4096 * 14336 * 3 * 32 + 6.0 * (4096.0 * 6144 + 4096.0 * 4096) * 32 + 8192.0 * 6 * 4096 * 32 +
                       6.0 * 4096 * 128256);
  EXPECT_NEAR(flops_per_token(llama, FlopsConvention::megatron) / 1e9, 51.47, 0.005);
  // Mixtral 8x7B top-2 at s 4096, V 32000: routed 6*4096*14336*2*3*32 = 67.65e9 instead of the MLP:
  // 79.7 GFLOP/token.
  EXPECT_NEAR(flops_per_token(preset("mixtral-8x7b"), FlopsConvention::megatron) / 1e9, 79.71, 0.005);
  // The pre-2025 formula counted the core attention twice: 6.44e9 more for LLaMA-3 8B.
  EXPECT_NEAR(flops_per_token(llama, FlopsConvention::megatron_2024) - flops_per_token(llama, FlopsConvention::megatron),
              8192.0 * 6 * 4096 * 32, 1);
}

TEST(Flops, NarayanansClosedFormForItsModels) {
  // The paper's 1.7B model (24 layers, h 2304, 24 heads, V 51200, s 2048, F = 4h, MHA):
  // 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
  auto c = preset("gpt2-124m");
  c.num_layers = 24;
  c.hidden_size = 2304;
  c.ffn_hidden_size = 4 * 2304;
  c.num_attention_heads = 24;
  c.num_query_groups = 24;
  c.seq_length = c.max_position_embeddings = 2048;
  c.vocab_size = 51200;
  const double B = 512, s = 2048, l = 24, h = 2304, V = 51200;
  EXPECT_NEAR(model_flops(c, B, FlopsConvention::narayanan).total() /
                  (96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))),
              1.0, 1e-12);
}

TEST(Flops, MoeMlaAndMtpInTheCurrentFormula) {
  // DeepSeek-V3 per token (s 4096, V padded 129280): MLA linear 6*(q_term + kv_term + h*64 + 128*128*h)
  // with q_term = 1536 (7168 + 128*192 + 1), kv_term = 512 (7168 + 128*256 + 1); core
  // s * 6 (128*192/2 + 128*128/2); 3 dense layers of 6 h 18432 x3; 58 MoE layers + 1 MTP layer
  // (like the last: MoE) of 6 h 2048 x (8 routed + 1 shared) x3; MTP 6 (3h + 2h^2); logits 6 h V x2.
  const auto v3 = preset("deepseek-v3");
  const double h = 7168, s = 4096;
  const double linear = 6 * (1536 * (h + 128 * 192 + 1) + 512 * (h + 128 * 256 + 1) + h * 64 + 128 * 128 * h);
  const double core = s * 6 * (128 * 192 / 2.0 + 128 * 128 / 2.0);
  const double expected = 62 * (linear + core) + 6 * h * 18432 * 3 * 3 + 6 * h * 2048 * 9 * 3 * 59 +
                          6 * (3 * h + 2 * h * h) + 6 * h * 129280 * 2;
  EXPECT_NEAR(flops_per_token(v3, FlopsConvention::megatron) / expected, 1.0, 1e-12);
  EXPECT_THROW(flops_per_token(v3, FlopsConvention::megatron_2024), mt::UsageError);
  // 6N on the active parameters.
  EXPECT_NEAR(flops_per_token(v3, FlopsConvention::six_n) / (6.0 * flops_parameter_count(v3)), 1.0, 1e-12);
}

TEST(Flops, MegatronVocabularyPadding) {
  // GPT-2 at TP 8 in Megatron pads 50257 to 51200 (mt: 50304); the logits term is 6 h V.
  const auto c = preset("gpt2-124m");
  EXPECT_DOUBLE_EQ(flops_per_token(c, FlopsConvention::megatron, 51200) - flops_per_token(c, FlopsConvention::megatron),
                   6.0 * 768 * (51200 - 50304));
}

TEST(Flops, GptTwoConventionMatchesTheBaselineNotes) {
  const auto c = preset("gpt2-124m");
  EXPECT_EQ(flops_parameter_count(c), 123653376);  // positions excluded, tied head once
  auto short_seq = c;
  short_seq.seq_length = 64;
  // 191.7 GFLOP per step at B=4, T=64 (6N + 12LCT).
  EXPECT_NEAR(model_flops(short_seq, 4, FlopsConvention::six_n_attention).total() / 1e9, 191.7, 0.1);
}

TEST(Flops, HardwareFlopsAddWhatRecomputeRepeats) {
  const auto c = preset("tiny-llama");
  using mt::model::RecomputeGranularity;
  using mt::model::RecomputeMethod;
  const double model = 700416.0 * 64, layers = (kMlp + kAttnLinear + kCoreHalved) * 64;
  EXPECT_DOUBLE_EQ(hardware_flops(c, 1, {}, 2), model);
  EXPECT_DOUBLE_EQ(hardware_flops(c, 1, {RecomputeGranularity::full, RecomputeMethod::uniform, 1}, 2), model + layers / 3);
  EXPECT_DOUBLE_EQ(hardware_flops(c, 1, {RecomputeGranularity::full, RecomputeMethod::block, 1}, 2), model + layers / 6);
  EXPECT_DOUBLE_EQ(hardware_flops(c, 1, {RecomputeGranularity::selective, RecomputeMethod::uniform, 1}, 2),
                   model + kCoreHalved * 64 / 3);
}

TEST(Flops, ThroughputAndUtilization) {
  // Megatron: FLOPs / (time x world) per device; MFU against the summed peak.
  EXPECT_DOUBLE_EQ(tflops_per_device(8e15, 2.0, 4), 1000);
  EXPECT_DOUBLE_EQ(model_flops_utilization(8e15, 2.0, 4 * 989.5e12), 1e15 / 989.5e12);
  EXPECT_EQ(parse_flops_convention("6N+6LCT"), FlopsConvention::six_n_causal_attention);
  for (FlopsConvention convention : flops_conventions()) {
    EXPECT_EQ(parse_flops_convention(convention_name(convention)), convention);
  }
  EXPECT_THROW(parse_flops_convention("palm"), mt::UsageError);
}

// BERT (issue 25) by hand, tiny-bert: L 2, h 64, 4 heads of 16 (q = kv = 64), GELU ffn 256, V 30522
// padded to 30592, s 64. Core attention is not halved (bidirectional); the LM head's dense h -> h
// runs on every token, the pooler h -> h and the sentence-order head h -> 2 on one token per sample.
TEST(Flops, TinyBertByHand) {
  const auto c = preset("tiny-bert");
  const double mlp = 6.0 * 64 * 256 * 2 * 2;                // 393,216: 6 h F x2 (fc1, fc2) x L
  const double linear = 6.0 * (64 * 192 + 64 * 64) * 2;      // 196,608: 6 (h (q + 2kv) + q h) x L
  const double core = 64.0 * 12 * 64 * 2;                    // 98,304: s x 12 q x L, not halved
  const double logits = 6.0 * 64 * 30592;                    // 11,747,328: 6 h V (padded)
  const double lm_dense = 6.0 * 64 * 64;                     // 24,576 per token
  const double pooler_and_binary = 6.0 * (64 * 64 + 64 * 2);  // 25,344 per sample
  const FlopsBreakdown f = model_flops(c, 3, FlopsConvention::megatron);
  EXPECT_DOUBLE_EQ(f.dense_mlp, mlp * 3 * 64);
  EXPECT_DOUBLE_EQ(f.attention_linear, linear * 3 * 64);
  EXPECT_DOUBLE_EQ(f.attention_core, core * 3 * 64);
  EXPECT_DOUBLE_EQ(f.logits, logits * 3 * 64);
  EXPECT_DOUBLE_EQ(f.bert_heads, lm_dense * 3 * 64 + pooler_and_binary * 3);
  EXPECT_DOUBLE_EQ(flops_per_token(c, FlopsConvention::megatron), 12460428);  // the parts' sum, + 25,344 / 64
  // Without the binary head: no pooler or sentence-order head.
  auto no_head = c;
  no_head.bert_binary_head = false;
  EXPECT_DOUBLE_EQ(model_flops(no_head, 1, FlopsConvention::megatron).bert_heads, lm_dense * 64);
  // narayanan: attention already whole, only the 4/3 on the layers.
  EXPECT_DOUBLE_EQ(model_flops(c, 1, FlopsConvention::narayanan).attention_core, 4.0 / 3 * core * 64);
  // A GPT of the same shape halves the core attention and has no heads.
  auto gpt = preset("tiny-gpt");
  EXPECT_DOUBLE_EQ(model_flops(gpt, 1, FlopsConvention::megatron).bert_heads, 0);
}
