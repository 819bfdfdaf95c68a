// The fp32 equivalence bound of tests/mpi/training_equivalence.h on the schedules the equivalence
// suites train (10 steps, tiny GPT and LLaMA): runs that differ only in the order of their sums
// (mt's kernels at the x86-64-v2 and AVX2 levels) stay within it; a loss scaled by 1 + 1e-4 at one
// step is caught wherever the bound is below 1e-4 (through step 6 at LR 5e-3 after 2 warm-up
// steps, every step at LR 3e-3), and one token of one micro-batch left out of the loss is caught
// at its step.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "core/error.h"
#include "data/sample_source.h"
#include "kernels/cpu/isa.h"
#include "../../mpi/training_equivalence.h"
#include "../tiny_models.h"

using namespace mt;

namespace {

// Another source's samples with one counted token of training sample `sample` (the `counted`-th
// whose loss mask is set, from 0) left out of its micro-batch's loss.
class OneTokenLeftOut : public data::SampleSource {
 public:
  OneTokenLeftOut(const data::SampleSource& inner, int64_t sample, int counted)
      : inner_(inner), sample_(sample), counted_(counted) {}
  void sample(data::Split split, int64_t index, int32_t* tokens) const override { inner_.sample(split, index, tokens); }
  void rows(data::Split split, int64_t index, int seq_length, const data::SampleRows& out) const override {
    inner_.rows(split, index, seq_length, out);
    if (split != data::Split::train || index != sample_) return;
    int seen = 0;
    for (int t = 0; t < seq_length; ++t) {
      if (out.loss_mask[t] != 0.0f && seen++ == counted_) {
        out.loss_mask[t] = 0.0f;
        return;
      }
    }
    throw Error("OneTokenLeftOut", "sample " + std::to_string(sample_) + " counts too few tokens");
  }
  bool document_attention() const override { return inner_.document_attention(); }
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  std::string describe() const override { return "one token left out"; }

 private:
  const data::SampleSource& inner_;
  int64_t sample_;
  int counted_;
};

data::LoaderOptions eod_masked() {
  data::LoaderOptions options;
  options.eod_mask_loss = true;
  return options;
}

// The suites' schedule (LR 5e-3 after 2 warm-up steps) and the Bats suites' (LR 3e-3).
train::TrainConfig schedule(double lr) {
  train::TrainConfig config = equivalence::ten_step_config();
  config.lr = lr;
  return config;
}

class KernelLevel {
 public:
  explicit KernelLevel(kernels::CpuIsa isa) : saved_(kernels::active_isa()) { kernels::set_active_isa(isa); }
  ~KernelLevel() { kernels::set_active_isa(saved_); }

 private:
  kernels::CpuIsa saved_;
};

}  // namespace

TEST(EquivalenceBound, HoldsBetweenRunsThatSumInAnotherOrder) {
  if (kernels::detected_isa() < kernels::CpuIsa::avx2) GTEST_SKIP() << "this CPU has one kernel level";
  for (bool llama : {false, true}) {
    const model::ModelConfig model = mt::testing::trainer_model(llama, 0.1f);
    const equivalence::DocumentMockData data(model.vocab_size, model.seq_length, 5, eod_masked());
    const train::TrainConfig config = schedule(5e-3);
    equivalence::RunNumbers narrow, wide;
    {
      const KernelLevel level(kernels::CpuIsa::x86_64_v2);
      narrow = equivalence::train_numbers(model, config, data, nullptr);
    }
    {
      const KernelLevel level(kernels::CpuIsa::avx2);
      wide = equivalence::train_numbers(model, config, data, nullptr);
    }
    const std::optional<std::string> difference = equivalence::first_difference(narrow, wide, config.adam.eps);
    EXPECT_FALSE(difference.has_value()) << (llama ? "tiny-llama: " : "tiny-gpt: ") << difference.value_or("");
  }
}

TEST(EquivalenceBound, ALossScaledBy1e4AtOneStepIsCaughtWhereTheBoundIsBelow1e4) {
  const model::ModelConfig model = mt::testing::trainer_model(true, 0.1f);
  const equivalence::DocumentMockData data(model.vocab_size, model.seq_length, 5, eod_masked());
  for (const double lr : {5e-3, 3e-3}) {
    const train::TrainConfig config = schedule(lr);
    const equivalence::RunNumbers reference = equivalence::train_numbers(model, config, data, nullptr);
    ASSERT_EQ(reference.loss.size(), 10u);
    EXPECT_FALSE(equivalence::first_difference(reference, reference, config.adam.eps).has_value());
    double lr_sum = 0;
    int caught = 0;
    for (size_t step = 0; step < reference.loss.size(); ++step) {
      if (equivalence::equivalence_bound(lr_sum, config.adam.eps) < 1e-4) {
        equivalence::RunNumbers scaled = reference;
        scaled.loss[step] *= 1 + 1e-4;
        const std::optional<std::string> difference = equivalence::first_difference(scaled, reference, config.adam.eps);
        ASSERT_TRUE(difference.has_value()) << "LR " << lr << ", step " << step + 1;
        EXPECT_NE(difference->find("lm loss at iteration " + std::to_string(step + 1)), std::string::npos) << *difference;
        ++caught;
      }
      lr_sum += reference.lr[step];
    }
    // Steps 1 to 6 at LR 5e-3 (the bound passes 1e-4 at step 7), all 10 at LR 3e-3.
    EXPECT_EQ(caught, lr == 5e-3 ? 6 : 10) << "LR " << lr;
  }
}

TEST(EquivalenceBound, OneTokenOfOneMicroBatchLeftOutOfTheLossIsCaught) {
  for (bool llama : {false, true}) {
    const model::ModelConfig model = mt::testing::trainer_model(llama, 0.1f);
    const equivalence::DocumentMockData data(model.vocab_size, model.seq_length, 5, eod_masked());
    const train::TrainConfig config = schedule(5e-3);
    const equivalence::RunNumbers reference = equivalence::train_numbers(model, config, data, nullptr);
    // Step 8 reads training samples 56 to 63 (global batches of 8): a token of sample 59, in the
    // step's second micro-batch, leaves the loss. Step 8 is where the bound is loosest but one.
    for (const int counted : {0, 7}) {
      const OneTokenLeftOut dropped(data, 59, counted);
      const equivalence::RunNumbers run = equivalence::train_numbers(model, config, dropped, nullptr);
      for (size_t step = 0; step < 7; ++step) EXPECT_EQ(run.loss[step], reference.loss[step]) << "step " << step + 1;
      const std::optional<std::string> difference = equivalence::first_difference(run, reference, config.adam.eps);
      ASSERT_TRUE(difference.has_value()) << "counted token " << counted << (llama ? ", tiny-llama" : ", tiny-gpt");
      EXPECT_NE(difference->find("at iteration 8"), std::string::npos) << *difference;
    }
  }
}
