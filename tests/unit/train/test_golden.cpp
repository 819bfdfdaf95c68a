// mt against PyTorch: the committed goldens of tests/golden (made by make_goldens.py from mt's
// own --save-init file) hold step-0 logits, every step's loss, grad norm and LR, and all
// parameters after the last step, for a tiny GPT-2 and a tiny LLaMA (GQA, odd vocabulary,
// warm-up + cosine, clipping, weight decay) trained on a learnable token stream, so the loss
// falls well below chance within the 10 steps. fp32 must match (logits abs 1e-5, the rest rel
// 1e-4); bf16 and fp16 must stay near the fp32 goldens on every step's loss and grad norm and on
// the final parameters (low_precision_tolerance below). And mt against transformers: the committed
// logits of tests/golden/hf (make_hf_goldens.sh: mt-train's --save-final of each case on mock data,
// exported by mt-ckpt export --format hf, run by GPT2LMHeadModel / LlamaForCausalLM) equal mt's
// forward of the same training within 1e-4 in fp32. Needs no torch: only the .h5 goldens.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../temp_dir.h"
#include "fixed_tokens.h"
#include "train/checkpointing.h"
#include "train/trainer.h"

using namespace mt;

namespace {

const std::string kGoldenDir = MT_SOURCE_DIR "/tests/golden";

template <typename T>
std::vector<T> read_dataset(hid_t file, const std::string& name, hid_t type) {
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (dataset < 0) throw std::runtime_error("golden dataset missing: " + name);
  const hid_t space = H5Dget_space(dataset);
  const hssize_t count = H5Sget_simple_extent_npoints(space);
  std::vector<T> values(static_cast<size_t>(count));
  H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
  H5Sclose(space);
  H5Dclose(dataset);
  return values;
}

struct Case {
  model::ModelConfig model;
  train::TrainConfig train;
  std::vector<int32_t> data_cycle;
};

Case load_case(const std::string& name) {
  std::ifstream in(kGoldenDir + "/cases.json");
  const auto all = nlohmann::json::parse(in);
  const auto& j = all.at(name);
  Case c;
  model::ModelConfig& m = c.model;
  const bool llama = j.at("model") == "llama";
  m = model::preset(llama ? "tiny-llama" : "tiny-gpt");
  m.name = name;
  m.num_layers = j.at("num_layers");
  m.hidden_size = j.at("hidden_size");
  m.ffn_hidden_size = j.at("ffn_hidden_size");
  m.num_attention_heads = j.at("num_attention_heads");
  m.num_query_groups = j.at("num_query_groups");
  m.vocab_size = j.at("vocab_size");
  m.make_vocab_size_divisible_by = j.at("make_vocab_size_divisible_by");
  m.seq_length = j.at("seq_length");
  m.max_position_embeddings = j.at("max_position_embeddings");
  m.norm_epsilon = j.at("norm_epsilon");
  m.init_method_std = j.at("init_method_std");
  m.hidden_dropout = 0.0f;
  if (llama) m.rotary_base = j.at("rotary_base");
  train::TrainConfig& t = c.train;
  t.micro_batch_size = j.at("micro_batch_size");
  t.global_batch_size = j.at("global_batch_size");
  t.train_iters = j.at("train_iters");
  t.lr = j.at("lr");
  t.min_lr = j.at("min_lr");
  t.lr_warmup_iters = j.at("lr_warmup_iters");
  t.lr_decay_style = optim::parse_decay_style(j.at("lr_decay_style"));
  t.adam.weight_decay = j.at("weight_decay");
  t.adam.beta1 = j.at("adam_beta1");
  t.adam.beta2 = j.at("adam_beta2");
  t.adam.eps = j.at("adam_eps");
  t.clip_grad = j.at("clip_grad");
  t.seed = j.at("seed");
  t.eval_iters = 0;
  c.data_cycle = j.at("data_cycle").get<std::vector<int32_t>>();
  return c;
}

// The goldens' learnable stream (make_goldens.py case_tokens): sample s reads the cycle from the
// phase its first mock-data token picks, token(s, t) = cycle[(mock(s, 0) + t) % cycle size].
class CycleData : public data::SampleSource {
 public:
  CycleData(const model::ModelConfig& m, uint64_t seed, std::vector<int32_t> cycle)
      : mock_(data::make_mock_data(m.vocab_size, m.seq_length, seed)), seq_length_(m.seq_length),
        cycle_(std::move(cycle)) {}
  void sample(data::Split split, int64_t index, int32_t* tokens) const override {
    mock_->sample(split, index, tokens);
    const int64_t phase = tokens[0];
    for (int t = 0; t <= seq_length_; ++t) tokens[t] = cycle_[static_cast<size_t>((phase + t) % cycle_.size())];
  }
  int64_t vocab_size() const override { return mock_->vocab_size(); }
  std::string describe() const override { return "cycle over " + mock_->describe(); }

 private:
  std::unique_ptr<data::SampleSource> mock_;
  int seq_length_;
  std::vector<int32_t> cycle_;
};

// bf16 and fp16 against the fp32 goldens. Measured (both cases, native and emulated bf16 GEMMs),
// the worst over the 10 steps and over the tensors: bf16 loss 2.5e-4, grad norm 1.1e-3,
// parameters 1.3e-2 of the update; fp16 (loss scale 4096) loss 6e-5, grad norm 7.4e-4,
// parameters 1.6e-3 of the update. The bounds leave 4-9x headroom. A trainer that skips the
// update misses every one: its loss stays at chance (77% above the goldens' at step 10) and its
// parameters are off by the whole update (1.0); fp16 grads left multiplied by the loss scale
// miss the grad norm by 4096x.
struct Tolerance {
  double loss;       // |loss - golden| / golden, every step
  double grad_norm;  // |grad norm - golden| / golden, every step
  double update;     // per tensor, |final - golden final| / |golden final - init| (L2 norms)
};
Tolerance low_precision_tolerance(Precision precision) {
  return precision == Precision::bf16 ? Tolerance{2e-3, 1e-2, 5e-2} : Tolerance{5e-4, 5e-3, 1e-2};
}

// The key bias has an analytically zero gradient (a constant added to every score of a row
// cancels in the softmax), so both sides only accumulate round-off there, which Adam (eps 1e-8)
// turns into updates of up to lr * |g| / eps: compare it in absolute terms in fp32, and not at
// all in bf16/fp16, whose round-off there is pure noise.
bool zero_gradient(const std::string& name) { return name.find("linear_k.bias") != std::string::npos; }

void compare(const std::string& name, Precision precision) {
  SCOPED_TRACE(name + " " + precision_name(precision));
  Case c = load_case(name);
  c.train.precision = precision;
  // fp16: dynamic loss scaling from a scale these gradients never overflow (Megatron's 2^32
  // default would skip the first steps while it backs off), so every step is compared.
  if (precision == Precision::fp16) c.train.initial_loss_scale = 4096;
  const hid_t file = H5Fopen((kGoldenDir + "/" + name + ".h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0) << "missing golden " << name << ".h5 (regenerate: tests/golden/README.md)";
  const auto golden_logits = read_dataset<float>(file, "logits_step0", H5T_NATIVE_FLOAT);
  const auto golden_loss = read_dataset<double>(file, "lm_loss", H5T_NATIVE_DOUBLE);
  const auto golden_norm = read_dataset<double>(file, "grad_norm", H5T_NATIVE_DOUBLE);
  const auto golden_lr = read_dataset<double>(file, "lr", H5T_NATIVE_DOUBLE);
  // The goldens themselves learn: the last loss is well below chance (ln vocab_size).
  ASSERT_LT(golden_loss.back(), 0.7 * std::log(static_cast<double>(c.model.vocab_size))) << "goldens at chance";

  CycleData data(c.model, c.train.seed, c.data_cycle);
  train::Trainer trainer(c.model, c.train, data, backend::cpu_ops());
  const float* params = trainer.parameters();
  const std::vector<float> initial(params, params + trainer.layout().total_elements);
  if (precision == Precision::fp32) {
    std::vector<float> logits(golden_logits.size());
    trainer.forward_logits(0, c.train.global_batch_size, logits.data());
    double worst = 0;
    for (size_t i = 0; i < logits.size(); ++i) worst = std::max(worst, std::fabs(double(logits[i]) - golden_logits[i]));
    EXPECT_LT(worst, 1e-5) << "step-0 logits";
  }
  const Tolerance low = low_precision_tolerance(precision);
  for (size_t step = 0; step < golden_loss.size(); ++step) {
    const train::StepStats s = trainer.train_step();
    if (precision == Precision::fp32) {
      EXPECT_NEAR(s.lm_loss, golden_loss[step], 1e-4 * golden_loss[step]) << "loss at step " << step + 1;
      EXPECT_NEAR(s.grad_norm, golden_norm[step], 1e-4 * golden_norm[step]) << "grad norm at step " << step + 1;
      EXPECT_NEAR(s.lr, golden_lr[step], 1e-12 + 1e-9 * golden_lr[step]) << "lr at step " << step + 1;
    } else {
      EXPECT_FALSE(s.skipped) << "step " << step + 1 << " skipped";
      EXPECT_NEAR(s.lm_loss, golden_loss[step], low.loss * golden_loss[step]) << "loss at step " << step + 1;
      EXPECT_NEAR(s.grad_norm, golden_norm[step], low.grad_norm * golden_norm[step])
          << "grad norm at step " << step + 1;
    }
  }
  for (const auto& entry : trainer.layout().entries) {
    const auto expected = read_dataset<float>(file, "final/" + entry.name, H5T_NATIVE_FLOAT);
    ASSERT_EQ(static_cast<int64_t>(expected.size()), entry.numel) << entry.name;
    if (precision == Precision::fp32) {
      const double absolute = zero_gradient(entry.name) ? 1e-4 : 1e-6;
      int mismatches = 0;
      for (int64_t i = 0; i < entry.numel; ++i) {
        const double a = params[entry.offset + i], b = expected[static_cast<size_t>(i)];
        if (std::fabs(a - b) > 1e-4 * std::fabs(b) + absolute && ++mismatches <= 3) {
          ADD_FAILURE() << entry.name << "[" << i << "]: mt " << a << " vs torch " << b;
        }
      }
    } else if (!zero_gradient(entry.name)) {
      double error = 0, update = 0;
      for (int64_t i = 0; i < entry.numel; ++i) {
        const double golden = expected[static_cast<size_t>(i)];
        error += std::pow(params[entry.offset + i] - golden, 2);
        update += std::pow(golden - initial[static_cast<size_t>(entry.offset + i)], 2);
      }
      EXPECT_LT(std::sqrt(error), low.update * std::sqrt(update)) << entry.name << ": final parameters";
    }
  }
  H5Fclose(file);
}

std::vector<int64_t> dataset_shape(hid_t file, const std::string& name) {
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  const hid_t space = H5Dget_space(dataset);
  std::vector<hsize_t> dims(static_cast<size_t>(H5Sget_simple_extent_ndims(space)));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  H5Sclose(space);
  H5Dclose(dataset);
  return {dims.begin(), dims.end()};
}

// mt-train --mock-data with the case's flags (make_hf_goldens.sh), saved as --save-final does,
// loaded with --finetune into a model that reads the committed tokens: its logits against
// transformers' on the export of that checkpoint.
void compare_with_transformers(const std::string& name) {
  SCOPED_TRACE(name);
  const Case c = load_case(name);
  const hid_t file = H5Fopen((kGoldenDir + "/hf/" + name + "-logits.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(file, 0) << "missing tests/golden/hf/" << name << "-logits.h5 (regenerate: tests/golden/hf/make_hf_goldens.sh)";
  const std::vector<int64_t> shape = dataset_shape(file, "tokens");
  ASSERT_EQ(shape.size(), 2u);
  ASSERT_EQ(shape[1], c.model.seq_length);
  const auto tokens = read_dataset<int32_t>(file, "tokens", H5T_NATIVE_INT32);
  const auto expected = read_dataset<float>(file, "logits", H5T_NATIVE_FLOAT);
  H5Fclose(file);
  const int rows = static_cast<int>(shape[0]);
  ASSERT_EQ(expected.size(), static_cast<size_t>(rows * c.model.seq_length * c.model.vocab_size));

  mt::testing::TempDir dir("mt_test_hf_logits");
  const std::string checkpoint = (dir.path() / "final.h5").string();
  {
    const auto mock = data::make_mock_data(c.model.vocab_size, c.model.seq_length, c.train.seed);
    train::Trainer trainer(c.model, c.train, *mock, backend::cpu_ops());
    while (trainer.iteration() < trainer.total_iterations()) trainer.train_step();
    train::SaveOptions save;
    save.optimizer = false;
    save.resumable = false;
    train::save_checkpoint_file(checkpoint, trainer, save);
  }
  mt::testing::FixedTokens fixed(tokens, c.model.seq_length, c.model.vocab_size);
  train::Trainer trainer(c.model, c.train, fixed, backend::cpu_ops());
  train::LoadOptions load;
  load.finetune = true;
  train::load_checkpoint(io::CheckpointReader(checkpoint), trainer, load);
  std::vector<float> logits(expected.size());
  trainer.forward_logits(0, rows, logits.data());
  double worst = 0, largest = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    worst = std::max(worst, std::fabs(double(logits[i]) - expected[i]));
    largest = std::max(largest, std::fabs(double(expected[i])));
  }
  EXPECT_LT(worst, 1e-4) << "max abs difference from transformers' logits (largest logit " << largest << ")";
}

}  // namespace

TEST(Golden, TinyGpt2MatchesTransformersLogits) { compare_with_transformers("tiny-gpt2"); }
TEST(Golden, TinyLlamaMatchesTransformersLogits) { compare_with_transformers("tiny-llama"); }

TEST(Golden, TinyGpt2MatchesPyTorchInFp32) { compare("tiny-gpt2", Precision::fp32); }
TEST(Golden, TinyLlamaMatchesPyTorchInFp32) { compare("tiny-llama", Precision::fp32); }
TEST(Golden, TinyGpt2Bf16StaysNearFp32) { compare("tiny-gpt2", Precision::bf16); }
TEST(Golden, TinyLlamaBf16StaysNearFp32) { compare("tiny-llama", Precision::bf16); }
TEST(Golden, TinyGpt2Fp16StaysNearFp32) { compare("tiny-gpt2", Precision::fp16); }
TEST(Golden, TinyLlamaFp16StaysNearFp32) { compare("tiny-llama", Precision::fp16); }
