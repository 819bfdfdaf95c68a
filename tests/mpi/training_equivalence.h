// What an MPI suite needs to compare a parallel layout's training with one rank's: the world
// communicator (made after MPI starts, by a gtest environment), mock data with documents, the
// per-step numbers of a run, the one-rank reference (trained once, on world rank 0, and broadcast,
// so oversubscribed ranks do not all repeat it) and the comparison within a relative tolerance.
// Used by tests/mpi/test_data_parallel.cpp and tests/mpi/test_context_parallel_training.cpp.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "data/gpt_dataset.h"
#include "data/sample_source.h"
#include "parallel/process_groups.h"
#include "train/trainer.h"

namespace mt::equivalence {

// The world communicator of the suite, alive between the environment's SetUp and TearDown.
inline std::unique_ptr<comm::Communicator>& world_holder() {
  static std::unique_ptr<comm::Communicator> world;
  return world;
}
inline comm::Communicator& world() { return *world_holder(); }

class WorldEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { world_holder() = comm::make_world_communicator(); }
  void TearDown() override { world_holder().reset(); }
};

// Mock tokens where every token divisible by `eod_every` becomes the end of document (id 0), so
// samples hold several documents crossing any chunk border; Megatron's loader masks and
// positions (--eod-mask-loss, --reset-position-ids, --reset-attention-mask) from `options`.
class DocumentMockData : public data::SampleSource {
 public:
  DocumentMockData(int64_t vocab, int seq, int eod_every, const data::LoaderOptions& options)
      : inner_(data::make_mock_data(vocab, seq, 77)), eod_every_(eod_every), options_(options) {}
  void sample(data::Split split, int64_t index, int32_t* tokens) const override { inner_->sample(split, index, tokens); }
  void rows(data::Split split, int64_t index, int seq_length, const data::SampleRows& out) const override {
    inner_->rows(split, index, seq_length, out);
    for (int t = 0; t < seq_length; ++t) {
      if (out.tokens[t] % eod_every_ == 0) out.tokens[t] = kEod;
      if (out.labels[t] % eod_every_ == 0) out.labels[t] = kEod;
    }
    data::ltor_masks_and_positions(std::span<const int32_t>(out.tokens, static_cast<size_t>(seq_length)), kEod,
                                   options_, out.loss_mask, out.positions, out.doc_start);
  }
  bool document_attention() const override { return options_.reset_attention_mask; }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  std::string describe() const override { return "mock data with documents"; }

 private:
  static constexpr int32_t kEod = 0;
  std::unique_ptr<data::SampleSource> inner_;
  int eod_every_;
  data::LoaderOptions options_;
};

// The equivalence runs' schedule: micro-batches of 2 in global batches of 8, 10 steps at LR 5e-3
// after 2 warm-up steps, 2 evaluations of 2 batches.
inline train::TrainConfig ten_step_config() {
  train::TrainConfig config;
  config.micro_batch_size = 2;
  config.global_batch_size = 8;
  config.train_iters = 10;
  config.lr = 5e-3;
  config.lr_warmup_iters = 2;
  config.eval_interval = 5;
  config.eval_iters = 2;
  return config;
}

// Per-step loss and grad norm, and the evaluation losses, of a run.
struct RunNumbers {
  std::vector<double> loss, grad_norm, eval_loss;
};

inline RunNumbers train_numbers(const model::ModelConfig& model, const train::TrainConfig& config,
                                const data::SampleSource& data, const parallel::ProcessGroups* groups) {
  train::Trainer trainer(model, config, data, groups);
  RunNumbers numbers;
  train::TrainObservers observers;
  observers.on_step = [&](const train::StepStats& s) {
    numbers.loss.push_back(s.lm_loss);
    numbers.grad_norm.push_back(s.grad_norm);
  };
  observers.on_eval = [&](const train::EvalStats& e) { numbers.eval_loss.push_back(e.lm_loss); };
  trainer.run(observers);
  return numbers;
}

// The one-rank run, trained on world rank 0 and sent to every rank.
inline RunNumbers one_rank_numbers(const model::ModelConfig& model, const train::TrainConfig& config,
                                   const data::SampleSource& data) {
  RunNumbers numbers;
  if (world().rank() == 0) numbers = train_numbers(model, config, data, nullptr);
  for (std::vector<double>* series : {&numbers.loss, &numbers.grad_norm, &numbers.eval_loss}) {
    int64_t size = static_cast<int64_t>(series->size());
    world().broadcast(&size, 1, DType::i64, 0);
    series->resize(static_cast<size_t>(size));
    world().broadcast(series->data(), size, DType::f64, 0);
  }
  return numbers;
}

inline void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(std::fabs(got[i] - want[i]), tolerance * std::fabs(want[i]))
        << what << " at " << i + 1 << ": " << got[i] << " vs one rank's " << want[i];
  }
}

// Every step's loss and grad norm and every evaluation loss within `tolerance` relative.
inline void expect_same_numbers(const RunNumbers& got, const RunNumbers& want, double tolerance) {
  expect_close(got.loss, want.loss, tolerance, "lm loss");
  expect_close(got.grad_norm, want.grad_norm, tolerance, "grad norm");
  expect_close(got.eval_loss, want.eval_loss, tolerance, "eval loss");
}

}  // namespace mt::equivalence
