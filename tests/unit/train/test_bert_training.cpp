// BERT trained by the Trainer on Megatron's masked samples (issue 25) against the model run outside
// the trainer: a small pre-split sentence dataset written here, data/bert_sample_source.h over it,
// and tiny-bert (vocabulary 40, sequence 32). The reference reads each sample straight from
// data/bert_dataset.h (Megatron-Core's BERTMaskedWordPieceDataset), turns it into a micro-batch by
// Megatron's meaning of its fields (labels where loss_mask is 1, the key length where padding_mask
// ends, types, is_random), and runs one model::Stage forward and backward per micro-batch with
// pretrain_bert.py's loss (lm = masked-token mean, + sop = sample mean; both / micro-batches):
//   - step 1's logged lm and sop losses (the initial parameters) and every grad of the step;
//   - step 2's losses from the trainer's parameters after step 1 (the next samples, fed right);
//   - the evaluation's losses (validation samples, mean over its micro-batches);
// with and without the binary head. Also the pieces of train/bert_step.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "backend/ops.h"
#include "core/error.h"
#include "data/bert_sample_source.h"
#include "data/token_dataset.h"
#include "model/layout.h"
#include "model/parallel_context.h"
#include "model/precision_gemm.h"
#include "model/stage.h"
#include "train/bert_step.h"
#include "train/trainer.h"

using namespace mt;

namespace {

constexpr int kVocab = 40;  // [PAD] [UNK] [CLS] [SEP] [MASK], words, "##" pieces (id % 4 == 1)
constexpr int kSeq = 32;

data::BertVocabulary vocabulary() {
  data::BertVocabulary v;
  v.is_subword.assign(kVocab, 0);
  for (int id = 5; id < kVocab; ++id) v.is_subword[id] = id % 4 == 1;
  v.cls = 2;
  v.sep = 3;
  v.mask = 4;
  v.pad = 0;
  return v;
}

// 60 documents of 1 to 6 sentences, each 2 to 12 tokens (words, sometimes followed by pieces).
void write_sentences(const std::string& prefix) {
  std::mt19937 random(7);
  auto writer = data::TokenDatasetWriter::create(prefix, data::TokenDatasetFormat::hdf5, kVocab);
  const auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random); };
  for (int d = 0; d < 60; ++d) {
    const int sentences = draw(1, 6);
    for (int s = 0; s < sentences; ++s) {
      std::vector<int32_t> sentence;
      const int length = draw(2, 12);
      while (static_cast<int>(sentence.size()) < length) {
        int word = draw(5, kVocab - 1);
        if (word % 4 == 1) word += 1;
        sentence.push_back(word);
        if (draw(0, 3) == 0) sentence.push_back(4 * draw(2, 9) + 1);  // a "##" piece
      }
      writer.add_sequence(sentence);
    }
    writer.end_document();
  }
  writer.finish();
}

model::ModelConfig tiny_bert(bool binary_head) {
  model::ModelConfig c = model::preset("tiny-bert");
  c.vocab_size = kVocab;
  c.seq_length = c.max_position_embeddings = kSeq;
  c.bert_binary_head = binary_head;
  return c;
}

train::TrainConfig training() {
  train::TrainConfig t;
  t.micro_batch_size = 2;
  t.global_batch_size = 4;  // two micro-batches per step
  t.train_iters = 2;
  t.lr = 1e-3;
  t.eval_interval = 2;
  t.eval_iters = 1;
  t.seed = 1234;
  return t;
}

// Megatron's samples of one micro-batch as the model's arrays, read from BertDataset directly.
struct ReferenceBatch {
  ReferenceBatch(const data::BertDataset& dataset, int64_t first, int count) : batch(count) {
    for (int b = 0; b < count; ++b) {
      const data::BertSample s = dataset.sample(first + b);
      int32_t length = 0;
      for (int t = 0; t < kSeq; ++t) {
        tokens.push_back(static_cast<int32_t>(s.tokens[t]));
        labels.push_back(s.loss_mask[t] == 1 ? static_cast<int32_t>(s.labels[t]) : 0);
        loss_mask.push_back(static_cast<float>(s.loss_mask[t]));
        types.push_back(s.padding_mask[t] == 1 ? static_cast<int32_t>(s.types[t]) : 0);
        positions.push_back(t);
        row_ids.push_back((first + b) * kSeq + t);
        if (s.padding_mask[t] == 1) length = t + 1;
      }
      key_lengths.push_back(length);
      order.push_back(s.is_random ? 1 : 0);
    }
  }
  model::MicroBatch micro(bool binary_head, double* loss_sums, double* sop_sums) const {
    model::MicroBatch m{batch, kSeq, tokens.data(), labels.data(), loss_mask.data(), positions.data(), nullptr,
                        row_ids.data(), loss_sums};
    m.key_lengths = key_lengths.data();
    if (binary_head) {
      m.token_types = types.data();
      m.sentence_order = order.data();
      m.sop_sums = sop_sums;
    }
    return m;
  }
  int batch;
  std::vector<int32_t> tokens, labels, types, positions, key_lengths, order;
  std::vector<float> loss_mask;
  std::vector<int64_t> row_ids;
};

struct ReferenceStep {
  double lm = 0, sop = 0;  // means over the micro-batches
  std::vector<float> grads;
};

// pretrain_bert.py's step on `params`: micro-batches of 2 from `first`, forward (and backward when
// `backward`) through one stage; grads of lm/M + sop/M summed over the M micro-batches.
ReferenceStep reference_step(const model::ModelConfig& config, const model::ParamLayout& layout,
                             const std::vector<float>& params, const data::BertDataset& dataset, int64_t first,
                             int micro_batches, bool backward) {
  const backend::Ops& ops = backend::cpu_ops();
  model::GemmWeights weights(ops, Precision::fp32, layout.total_elements);
  weights.refresh(params.data());
  model::StageOptions options;
  options.micro_batch_size = 2;
  const model::ParallelContext single;
  model::Stage stage(config, layout, 0, single, ops, weights, options);
  ReferenceStep step;
  step.grads.assign(params.size(), 0.0f);
  stage.bind(params.data(), step.grads.data());
  stage.set_sop_loss_grad_factor(static_cast<float>(1.0 / micro_batches));
  for (int m = 0; m < micro_batches; ++m) {
    const ReferenceBatch batch(dataset, first + 2 * m, 2);
    double loss_sums[2] = {0, 0}, sop_sums[2] = {0, 0};
    stage.forward(0, batch.micro(config.bert_binary_head, loss_sums, sop_sums), nullptr, model::ForwardPass{1, backward});
    step.lm += loss_sums[0] / loss_sums[1] / micro_batches;
    if (config.bert_binary_head) step.sop += sop_sums[0] / sop_sums[1] / micro_batches;
    if (backward) stage.backward(0, nullptr, static_cast<float>(1.0 / (loss_sums[1] * micro_batches)));
  }
  return step;
}

std::vector<float> copy_of(const float* values, int64_t count) { return {values, values + count}; }

void expect_close(const std::string& what, const std::vector<float>& actual, const std::vector<float>& expected,
                  double tolerance) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 1e-6, worst = 0;
  for (float e : expected) scale = std::max(scale, std::abs(double(e)));
  for (size_t i = 0; i < actual.size(); ++i) worst = std::max(worst, std::abs(double(actual[i]) - expected[i]));
  EXPECT_LE(worst, tolerance * scale) << what;
}

void check_training_equals_the_model_outside_it(bool binary_head) {
  mt::testing::TempDir directory("mt_test_bert_training");
  const std::string prefix = (directory.path() / "sentences").string();
  write_sentences(prefix);
  const model::ModelConfig config = tiny_bert(binary_head);
  const train::TrainConfig t = training();
  data::BertSourceConfig source;
  source.path = prefix;
  source.split = "80,20,0";
  source.dataset.index.seq_length = kSeq;
  source.dataset.index.seed = static_cast<int64_t>(t.seed);
  source.dataset.index.binary_head = binary_head;
  source.num_samples = {8, 4, 0};
  const data::BertSampleSource data(source, vocabulary());
  const data::BertDataset& train_split = data.split_dataset(data::Split::train);
  const data::BertDataset& valid_split = data.split_dataset(data::Split::valid);

  train::Trainer trainer(config, t, data, backend::cpu_ops());
  const int64_t n = trainer.layout().total_elements;
  const std::vector<float> initial = copy_of(trainer.parameters(), n);
  const train::StepStats first = trainer.train_step();
  const ReferenceStep expected = reference_step(config, trainer.layout(), initial, train_split, 0, 2, true);
  EXPECT_NEAR(first.lm_loss, expected.lm, 1e-6 * expected.lm);
  ASSERT_EQ(first.sop_loss.has_value(), binary_head);
  if (binary_head) {
    EXPECT_NEAR(*first.sop_loss, expected.sop, 1e-6 * expected.sop);
  }
  expect_close("step 1 grads", copy_of(trainer.gradients(), n), expected.grads, 1e-5);

  const std::vector<float> after_first = copy_of(trainer.parameters(), n);
  EXPECT_NE(after_first, initial);
  const train::StepStats second = trainer.train_step();
  const ReferenceStep next = reference_step(config, trainer.layout(), after_first, train_split, 4, 2, false);
  EXPECT_NEAR(second.lm_loss, next.lm, 1e-6 * next.lm);
  if (binary_head) {
    EXPECT_NEAR(*second.sop_loss, next.sop, 1e-6 * next.sop);
  }
  EXPECT_NE(second.lm_loss, first.lm_loss);

  const std::vector<float> after_second = copy_of(trainer.parameters(), n);
  const train::EvalStats eval = trainer.evaluate();
  const ReferenceStep valid = reference_step(config, trainer.layout(), after_second, valid_split, 0, 2, false);
  EXPECT_NEAR(eval.lm_loss, valid.lm, 1e-6 * valid.lm);
  EXPECT_NEAR(eval.ppl, std::exp(valid.lm), 1e-6 * std::exp(valid.lm));
  ASSERT_EQ(eval.sop_loss.has_value(), binary_head);
  if (binary_head) {
    EXPECT_NEAR(*eval.sop_loss, valid.sop, 1e-6 * valid.sop);
  }
}

}  // namespace

TEST(BertTraining, LossesGradsAndEvaluationEqualTheModelRunOutsideTheTrainerWithTheBinaryHead) {
  check_training_equals_the_model_outside_it(true);
}

TEST(BertTraining, LossesGradsAndEvaluationEqualTheModelRunOutsideTheTrainerWithoutTheBinaryHead) {
  check_training_equals_the_model_outside_it(false);
}

TEST(BertStep, LoggedLossesAreMeansOfTheMicroBatchMeans) {
  // Two micro-batches: (lm 6 over 3 tokens, sop 1 over 2 samples), (lm 1 over 4, sop 3 over 2).
  const std::vector<double> sums{6, 3, 1, 2, 1, 4, 3, 2};
  const train::BertLossSums local = train::bert_loss_sums(sums);
  EXPECT_DOUBLE_EQ(local.lm, 2.0 + 0.25);
  EXPECT_DOUBLE_EQ(local.sop, 0.5 + 1.5);
  const train::BertLosses losses = train::bert_logged_losses(local, 2, true);
  EXPECT_DOUBLE_EQ(losses.lm, 1.125);
  EXPECT_DOUBLE_EQ(*losses.sop, 1.0);
  EXPECT_FALSE(train::bert_logged_losses(local, 2, false).sop.has_value());
  // A stage before the last adds zeros; a micro-batch without masked tokens adds 0.
  EXPECT_DOUBLE_EQ(train::bert_loss_sums(std::vector<double>(8, 0.0)).lm, 0.0);
  EXPECT_THROW(train::bert_loss_sums(std::vector<double>(6, 1.0)), mt::Error);
  EXPECT_FLOAT_EQ(train::bert_sop_grad_factor(8.0, 4.0), 2.0f);
}
