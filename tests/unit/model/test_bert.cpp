// BERT (ModelConfig::bert: model/layers/bert_head.h, the non-causal attention, the token-type
// embedding) against Megatron-Core's own BertModel: tests/golden/bert/bert_goldens.json, written by
// tests/golden/bert/make_bert_goldens.py (megatron-core 0.16.1 and CPU torch in a venv outside the
// repository; tests/golden/bert/README.md). Each case loads Megatron's weights by name into a
// one-rank layout (every tensor of mt's layout must be in the golden and the golden may have no
// other), runs a stage's forward and backward on Megatron's batch (padding, token types, masked
// positions, sentence order) with pretrain_bert.py's loss (lm loss = masked-token mean, plus the
// sop loss's sample mean with the binary head), and compares the lm and sop losses and every
// weight grad; the same on two tensor-parallel ranks (threads over an in-process communicator),
// each grad against its shard of Megatron's, with and without sequence parallelism; on two
// pipeline stages (the head's own copy of the tied embedding). Beside it: the
// presets' shapes and parameter counts, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "core/error.h"
#include "model/layers/embedding.h"
#include "model/layout.h"
#include "model/stage.h"
#include "../thread_communicator.h"

using namespace mt;
using namespace mt::model;
using nlohmann::json;
using mt::testing::ThreadCommunicator;
using mt::testing::ThreadGroup;

namespace {

const json& goldens() {
  static const json data = [] {
    std::ifstream in(MT_SOURCE_DIR "/tests/golden/bert/bert_goldens.json");
    if (!in) throw std::runtime_error("tests/golden/bert/bert_goldens.json (written by make_bert_goldens.py)");
    return json::parse(in);
  }();
  return data;
}

const json& golden_case(const std::string& name) {
  for (const json& c : goldens()["cases"]) {
    if (c["name"] == name) return c;
  }
  throw std::runtime_error("no golden case " + name);
}

ModelConfig config_of(const json& g) {
  ModelConfig c = preset("tiny-bert");
  c.name = g["name"];
  c.num_layers = g["layers"];
  c.hidden_size = g["hidden"];
  c.ffn_hidden_size = g["ffn"];
  c.num_attention_heads = g["heads"];
  c.num_query_groups = c.num_attention_heads;
  c.seq_length = g["seq"];
  c.max_position_embeddings = g["max_pos"];
  c.vocab_size = g["vocab"];
  c.make_vocab_size_divisible_by = static_cast<int>(c.vocab_size);  // no padding columns
  c.norm_epsilon = 1e-5f;
  c.bert_binary_head = g["binary_head"];
  return c;
}

template <typename T>
std::vector<T> values(const json& array) {
  return array.get<std::vector<T>>();
}

// The golden batch as a micro-batch (its arrays owned here).
struct GoldenBatch {
  explicit GoldenBatch(const json& g, const ModelConfig& config)
      : batch(static_cast<int>(g["lengths"].size())),
        tokens(values<int32_t>(g["tokens"])),
        labels(values<int32_t>(g["labels"])),
        types(values<int32_t>(g["token_types"])),
        order(values<int32_t>(g["is_random"])),
        key_lengths(values<int32_t>(g["lengths"])),
        loss_mask(values<float>(g["loss_mask"])),
        binary_head(config.bert_binary_head) {
    for (int r = 0; r < batch * config.seq_length; ++r) {
      positions.push_back(r % config.seq_length);
      row_ids.push_back(r);
    }
  }
  // The micro-batch adding its loss sums to `loss_sums` and `sop_sums` (two doubles each: the
  // CPU table's device memory is the host's).
  MicroBatch micro_batch(int seq, double* loss_sums, double* sop_sums) const {
    MicroBatch micro{batch, seq, tokens.data(), labels.data(), loss_mask.data(), positions.data(), nullptr,
                     row_ids.data(), loss_sums};
    micro.key_lengths = key_lengths.data();
    if (binary_head) {
      micro.token_types = types.data();
      micro.sentence_order = order.data();
      micro.sop_sums = sop_sums;
    }
    return micro;
  }
  int batch;
  std::vector<int32_t> tokens, labels, types, order, key_lengths, positions;
  std::vector<float> loss_mask;
  std::vector<int64_t> row_ids;
  bool binary_head;
};

// One rank's run of the golden batch: its layout, losses and grads.
struct BertRun {
  double lm_loss = 0, sop_loss = 0;
  ParamLayout layout;
  std::vector<float> grads;
  std::vector<float> grad_of(const std::string& name) const {
    const ParamEntry& e = layout.find(name);
    return {grads.begin() + e.offset, grads.begin() + e.offset + e.numel};
  }
};

// Forward and backward of the golden batch through a stage of `layout` holding `params`, with
// pretrain_bert.py's loss: d(lm + sop) where lm is the masked tokens' mean and sop the samples'.
BertRun run_stage(const ModelConfig& config, ParamLayout layout, std::vector<float> params,
                  const ParallelContext& parallel, const GoldenBatch& golden) {
  BertRun run;
  run.layout = std::move(layout);
  run.grads.assign(params.size(), 0.0f);
  const backend::Ops& ops = backend::cpu_ops();
  GemmWeights weights(ops, Precision::fp32, run.layout.total_elements);
  weights.refresh(params.data());
  StageOptions options;
  options.micro_batch_size = golden.batch;
  Stage stage(config, run.layout, 0, parallel, ops, weights, options);
  stage.bind(params.data(), run.grads.data());
  double loss_sums[2] = {0, 0}, sop_sums[2] = {0, 0};
  stage.forward(0, golden.micro_batch(config.seq_length, loss_sums, sop_sums), nullptr, ForwardPass{1, true});
  run.lm_loss = loss_sums[0] / loss_sums[1];
  run.sop_loss = config.bert_binary_head ? sop_sums[0] / sop_sums[1] : 0.0;
  stage.set_sop_loss_grad_factor(1.0f);  // d(lm + sop) / d sop
  stage.backward(0, nullptr, static_cast<float>(1.0 / loss_sums[1]));
  return run;
}

// The golden's weights in `layout` (one rank, whole tensors).
std::vector<float> golden_params(const json& g, const ParamLayout& layout) {
  std::vector<float> params(static_cast<size_t>(layout.total_elements), 0.0f);
  for (const ParamEntry& e : layout.entries) {
    if (!g["weights"].contains(e.name)) throw std::runtime_error("the golden has no " + e.name);
    const std::vector<float> w = values<float>(g["weights"][e.name]["values"]);
    if (static_cast<int64_t>(w.size()) != e.numel) throw std::runtime_error(e.name + ": golden size differs");
    std::copy(w.begin(), w.end(), params.begin() + e.offset);
  }
  EXPECT_EQ(g["weights"].size(), layout.entries.size()) << "the golden has tensors mt's layout has not";
  return params;
}

BertRun run_golden(const json& g, const ModelConfig& config) {
  const ParamLayout layout = build_layout(config);
  const ParallelContext single;
  return run_stage(config, layout, golden_params(g, layout), single, GoldenBatch(g, config));
}

// max |actual - expected| <= tol max(max |expected|, floor).
void expect_close(const std::string& what, const std::vector<float>& actual, const std::vector<float>& expected,
                  double tol, double floor = 1e-3) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = floor, worst = 0;
  size_t at = 0;
  for (float e : expected) scale = std::max(scale, std::abs(double(e)));
  for (size_t i = 0; i < actual.size(); ++i) {
    const double d = std::abs(double(actual[i]) - expected[i]);
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  EXPECT_LE(worst, tol * scale) << what << "[" << at << "] = " << actual[at] << ", Megatron " << expected[at];
}

void expect_matches_megatron(const std::string& name) {
  const json& g = golden_case(name);
  const ModelConfig config = config_of(g);
  const BertRun run = run_golden(g, config);
  EXPECT_NEAR(run.lm_loss, g["lm_loss"].get<double>(), 1e-5 * g["lm_loss"].get<double>());
  if (config.bert_binary_head) {
    EXPECT_NEAR(run.sop_loss, g["sop_loss"].get<double>(), 1e-5 * g["sop_loss"].get<double>());
  }
  // Floor 1e-2: the key biases' grads vanish analytically (a softmax does not see a bias added to
  // every score of its row), so both sides hold rounding only.
  for (const ParamEntry& e : run.layout.entries) {
    expect_close(e.name + " grad", run.grad_of(e.name), values<float>(g["grads"][e.name]), 1e-4, 1e-2);
  }
}

TEST(BertMegatron, LossesAndEveryGradMatchMegatronCoreBertModelWithTheBinaryHead) {
  expect_matches_megatron("binary_head");
}

TEST(BertMegatron, LossesAndEveryGradMatchMegatronCoreBertModelWithoutTheBinaryHead) {
  expect_matches_megatron("no_binary_head");
}

// This rank's slice of a whole (single-rank) tensor: rows or columns of its shard.
std::vector<float> shard_of(const ParamEntry& shard, const ParamEntry& whole, const std::vector<float>& buffer) {
  std::vector<float> slice;
  const int64_t cols = whole.global_shape.size() == 2 ? whole.global_shape[1] : 1;
  const int64_t local_cols = shard.local_shape.size() == 2 ? shard.local_shape[1] : 1;
  for (int64_t i = 0; i < shard.numel; ++i) {
    const int64_t row = i / local_cols + (shard.shard_dim == 0 ? shard.shard_offset : 0);
    const int64_t col = i % local_cols + (shard.shard_dim == 1 ? shard.shard_offset : 0);
    slice.push_back(buffer[static_cast<size_t>(whole.offset + row * cols + col)]);
  }
  return slice;
}

// Tensor parallelism over two threads: each rank's losses are Megatron's, and its grads are its
// shard of Megatron's (the replicated LM head, pooler and binary head whole on both; the word
// embedding, its vocabulary bias and the heads split). With sequence parallelism each rank holds
// half of the rows from the embedding to the LM head's LayerNorm (sample 1's first token on rank
// 0 of the binary-head case's 18 rows each, sample 2's on rank 1), so the replicated tensors the
// layout sums over TP (norms, biases of row-parallel linears, the LM head's dense) are compared
// as the two ranks' sum, as Megatron's finalize_model_grads all-reduces them; the pooler and
// the binary head (gathered rows) and the position and token-type tables (full rows) whole on each.
void expect_tensor_parallel_matches_megatron(const std::string& name, bool sequence_parallel) {
  const json& g = golden_case(name);
  const ModelConfig config = config_of(g);
  const GoldenBatch golden(g, config);
  const ParamLayout whole = build_layout(config);
  const std::vector<float> whole_params = golden_params(g, whole);
  std::vector<float> whole_grads(whole_params.size(), 0.0f);
  for (const ParamEntry& e : whole.entries) {
    const std::vector<float> grad = values<float>(g["grads"][e.name]);
    std::copy(grad.begin(), grad.end(), whole_grads.begin() + e.offset);
  }
  ThreadGroup group(2);
  BertRun runs[2];
  std::exception_ptr failures[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadCommunicator tensor_group(group, r);
        const ParallelContext parallel(&tensor_group, sequence_parallel);
        parallel::ParallelConfig layout_config;
        layout_config.tensor_model_parallel_size = 2;
        layout_config.sequence_parallel = sequence_parallel;
        parallel::RankCoordinates rank;
        rank.tp = r;
        const ParamLayout layout = build_layout(config, layout_config, rank, {{0, config.num_layers, true, true}});
        std::vector<float> params(static_cast<size_t>(layout.total_elements), 0.0f);
        for (const ParamEntry& e : layout.entries) {
          const std::vector<float> slice = shard_of(e, whole.find(e.name), whole_params);
          std::copy(slice.begin(), slice.end(), params.begin() + e.offset);
        }
        runs[r] = run_stage(config, layout, params, parallel, golden);
      } catch (...) {
        failures[r] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  const std::string what = sequence_parallel ? " grad (TP 2, SP)" : " grad (TP 2)";
  int summed = 0;
  for (const BertRun& run : runs) {
    EXPECT_NEAR(run.lm_loss, g["lm_loss"].get<double>(), 1e-5 * g["lm_loss"].get<double>());
    if (config.bert_binary_head) {
      EXPECT_NEAR(run.sop_loss, g["sop_loss"].get<double>(), 1e-5 * g["sop_loss"].get<double>());
    }
    for (const ParamEntry& e : run.layout.entries) {
      std::vector<float> grad = run.grad_of(e.name);
      if (e.reduce_over_tensor_parallel) {
        const std::vector<float> other = runs[&run == &runs[0] ? 1 : 0].grad_of(e.name);
        for (size_t i = 0; i < grad.size(); ++i) grad[i] += other[i];
        ++summed;
      }
      expect_close(e.name + what, grad, shard_of(e, whole.find(e.name), whole_grads), 1e-4, 1e-2);
    }
  }
  if (sequence_parallel) {
    EXPECT_TRUE(runs[0].layout.find("lm_head.dense.weight").reduce_over_tensor_parallel);
    EXPECT_GT(summed, 0);
  } else {
    EXPECT_EQ(summed, 0);
  }
}

TEST(BertMegatron, TensorParallelOverTwoRanksMatchesMegatronWithTheBinaryHead) {
  expect_tensor_parallel_matches_megatron("binary_head", false);
}

TEST(BertMegatron, TensorParallelOverTwoRanksMatchesMegatronWithoutTheBinaryHead) {
  expect_tensor_parallel_matches_megatron("no_binary_head", false);
}

TEST(BertMegatron, SequenceParallelOverTwoRanksMatchesMegatronWithTheBinaryHead) {
  expect_tensor_parallel_matches_megatron("binary_head", true);
}

TEST(BertMegatron, SequenceParallelOverTwoRanksMatchesMegatronWithoutTheBinaryHead) {
  expect_tensor_parallel_matches_megatron("no_binary_head", true);
}

// Pipeline parallelism: layer 0 with the embedding on one stage, layer 1 with the head (and its
// own copy of the tied word embedding) on the next, the activation and its grad handed over by
// hand. The losses are Megatron's; every grad is Megatron's, the word embedding's as the sum of
// the two stages' copies (Megatron all-reduces them).
void expect_pipeline_matches_megatron(const std::string& name) {
  const json& g = golden_case(name);
  const ModelConfig config = config_of(g);
  ASSERT_EQ(config.num_layers, 2);
  const GoldenBatch golden(g, config);
  const ParamLayout whole = build_layout(config);
  const std::vector<float> whole_params = golden_params(g, whole);
  parallel::ParallelConfig pipeline;
  pipeline.pipeline_model_parallel_size = 2;
  const std::vector<std::vector<ChunkSpec>> stage_chunks = {{{0, 1, true, false}}, {{1, 2, false, true}}};
  const backend::Ops& ops = backend::cpu_ops();
  const ParallelContext single;
  std::vector<BertRun> runs(2);
  std::vector<std::vector<float>> params(2);
  std::vector<std::unique_ptr<GemmWeights>> weights;
  std::vector<std::unique_ptr<Stage>> stages;
  StageOptions options;
  options.micro_batch_size = golden.batch;
  for (int stage = 0; stage < 2; ++stage) {
    parallel::RankCoordinates rank;
    rank.pp = stage;
    BertRun& run = runs[static_cast<size_t>(stage)];
    run.layout = build_layout(config, pipeline, rank, stage_chunks[static_cast<size_t>(stage)]);
    params[static_cast<size_t>(stage)].assign(static_cast<size_t>(run.layout.total_elements), 0.0f);
    run.grads.assign(params[static_cast<size_t>(stage)].size(), 0.0f);
    for (const ParamEntry& e : run.layout.entries) {
      const ParamEntry& source = whole.find(e.name);
      std::copy(whole_params.begin() + source.offset, whole_params.begin() + source.offset + source.numel,
                params[static_cast<size_t>(stage)].begin() + e.offset);
    }
    weights.push_back(std::make_unique<GemmWeights>(ops, Precision::fp32, run.layout.total_elements));
    weights.back()->refresh(params[static_cast<size_t>(stage)].data());
    stages.push_back(std::make_unique<Stage>(config, run.layout, 0, single, ops, *weights.back(), options));
    stages.back()->bind(params[static_cast<size_t>(stage)].data(), run.grads.data());
  }
  double loss_sums[2] = {0, 0}, sop_sums[2] = {0, 0};
  const MicroBatch micro = golden.micro_batch(config.seq_length, loss_sums, sop_sums);
  const StageOutput first = stages[0]->forward(0, micro, nullptr, ForwardPass{1, true});
  stages[1]->forward(0, micro, first.activation, ForwardPass{1, true});
  EXPECT_NEAR(loss_sums[0] / loss_sums[1], g["lm_loss"].get<double>(), 1e-5 * g["lm_loss"].get<double>());
  if (config.bert_binary_head) {
    EXPECT_NEAR(sop_sums[0] / sop_sums[1], g["sop_loss"].get<double>(), 1e-5 * g["sop_loss"].get<double>());
  }
  stages[1]->set_sop_loss_grad_factor(1.0f);
  const float scale = static_cast<float>(1.0 / loss_sums[1]);
  const float* d_activation = stages[1]->backward(0, nullptr, scale);
  stages[0]->backward(0, d_activation, scale);

  std::vector<std::string> seen;
  for (const BertRun& run : runs) {
    for (const ParamEntry& e : run.layout.entries) {
      std::vector<float> grad = run.grad_of(e.name);
      if (e.name == Embedding::kWordEmbeddings) {
        if (std::find(seen.begin(), seen.end(), e.name) != seen.end()) continue;
        const std::vector<float> other = runs[1].grad_of(e.name);
        for (size_t i = 0; i < grad.size(); ++i) grad[i] += other[i];
      }
      seen.push_back(e.name);
      expect_close(e.name + " grad (PP 2)", grad, values<float>(g["grads"][e.name]), 1e-4, 1e-2);
    }
  }
  EXPECT_EQ(seen.size(), whole.entries.size()) << "the stages do not hold every tensor once";
}

TEST(BertMegatron, PipelineOfTwoStagesMatchesMegatronWithTheBinaryHead) {
  expect_pipeline_matches_megatron("binary_head");
}

TEST(BertMegatron, PipelineOfTwoStagesMatchesMegatronWithoutTheBinaryHead) {
  expect_pipeline_matches_megatron("no_binary_head");
}

TEST(BertConfig, PresetsHaveMegatronsShapesAndTheirParameterCountsAreTheLayouts) {
  const ModelConfig big = preset("bert-345m");
  EXPECT_TRUE(big.bert);
  EXPECT_TRUE(big.bert_binary_head);
  EXPECT_EQ(big.num_layers, 24);
  EXPECT_EQ(big.hidden_size, 1024);
  EXPECT_EQ(big.num_attention_heads, 16);
  EXPECT_EQ(big.ffn_hidden_size, 4096);
  EXPECT_EQ(big.seq_length, 512);
  EXPECT_EQ(big.max_position_embeddings, 512);
  EXPECT_EQ(big.padded_vocab_size(), 30592);  // the uncased WordPiece 30522, padded to 128
  for (bool binary : {true, false}) {
    ModelConfig c = preset("tiny-bert");
    c.bert_binary_head = binary;
    const ParamLayout layout = build_layout(c);
    int64_t elements = 0;
    for (const ParamEntry& e : layout.entries) elements += e.numel;
    EXPECT_EQ(parameter_count(c, true), elements) << "binary head " << binary;
  }
  // 336M: Megatron's "345M" (the published name) with the binary head.
  EXPECT_EQ(parameter_count(big, true), 336'297'858);
}

TEST(BertConfig, RefusesWhatMegatronsBertIsNot) {
  ModelConfig gpt = preset("tiny-gpt");
  gpt.bert_binary_head = false;
  EXPECT_THROW(gpt.validate(), UsageError);  // --bert-no-binary-head without BERT
  ModelConfig c = preset("tiny-bert");
  c.swiglu = true;
  EXPECT_THROW(c.validate(), UsageError);
  c = preset("tiny-bert");
  c.untie_embeddings_and_output_weights = true;
  EXPECT_THROW(c.validate(), UsageError);
  c = preset("tiny-bert");
  c.position_embedding = PositionEmbedding::rope;
  EXPECT_THROW(c.validate(), UsageError);
  EXPECT_NO_THROW(preset("tiny-bert").validate());
  EXPECT_NO_THROW(preset("bert-345m").validate());
}

}  // namespace
