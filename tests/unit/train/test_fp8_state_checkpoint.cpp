// The FP8 scaling state in checkpoints and the FP8 GEMM selection in training (issue 23), on the
// CPU emulation: 4 steps straight equal 2 + save + load + 2 bit for bit (losses, grad norms,
// weights and the FP8 state, with a 4-step amax history under max, so the history matters); a
// checkpoint without FP8 state starts an FP8 run's scaling fresh (TE's empty extra_state), an FP8
// checkpoint loads into a run without --fp8-format and its next save holds no FP8 state;
// --first-last-layers-bf16 keeps only the middle layers in FP8 (all layers out equals the bf16
// run bit for bit); --no-fp8-wgrad keeps the first step's forward and changes the gradients; a
// checkpoint's amax history of another length is refused naming both lengths.
// The layout change (TP=2 saved, TP=1 loaded): tests/tools/mt-train-fp8.bats.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../error_text.h"
#include "../temp_dir.h"
#include "../tiny_models.h"
#include "data/sample_source.h"
#include "io/checkpoint.h"
#include "train/checkpointing.h"
#include "train/trainer.h"

using namespace mt;

namespace {

train::TrainConfig fp8_config(int iters, bool fp8) {
  train::TrainConfig t;
  t.micro_batch_size = 2;  // 32 tokens a micro-batch: a multiple of 16
  t.global_batch_size = 4;
  t.train_iters = iters;
  t.lr = 3e-3;
  t.eval_iters = 0;
  t.precision = Precision::bf16;
  t.fp8.enabled = fp8;
  t.fp8.amax_history_len = 4;
  t.fp8.amax_compute_algo = kernels::Fp8AmaxAlgo::max;
  return t;
}

struct Trace {
  std::vector<double> loss, grad_norm;
};

void run_steps(train::Trainer& trainer, int steps, Trace& trace) {
  for (int i = 0; i < steps; ++i) {
    const train::StepStats s = trainer.train_step();
    trace.loss.push_back(s.lm_loss);
    trace.grad_norm.push_back(s.grad_norm);
  }
}

Trace trained(const model::ModelConfig& model, const train::TrainConfig& t) {
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 3);
  train::Trainer trainer(model, t, *data, backend::cpu_ops());
  Trace trace;
  run_steps(trainer, t.train_iters, trace);
  return trace;
}

std::vector<uint64_t> bits(const std::vector<double>& values) {
  std::vector<uint64_t> out(values.size());
  std::memcpy(out.data(), values.data(), values.size() * sizeof(double));
  return out;
}

// Every linear's scale, scale_inv and amax history, in order.
std::vector<float> fp8_state(const model::Fp8Scaling& fp8) {
  std::vector<float> state;
  for (int64_t linear = 0; linear < fp8.linears(); ++linear) {
    for (model::Fp8Operand operand : {model::Fp8Operand::input, model::Fp8Operand::weight, model::Fp8Operand::output_grad}) {
      state.push_back(*fp8.scale(linear, operand));
      state.push_back(*fp8.scale_inv(linear, operand));
      const float* history = fp8.amax_history(linear, operand);
      state.insert(state.end(), history, history + fp8.config().amax_history_len);
    }
  }
  return state;
}

std::vector<float> parameters(train::Trainer& trainer) {
  return std::vector<float>(trainer.parameters(), trainer.parameters() + trainer.layout().total_elements);
}

io::CheckpointReader latest(const std::string& directory) {
  return io::CheckpointReader(io::checkpoint_path(directory, *io::read_tracker(directory)));
}

bool has_fp8_state(const io::CheckpointReader& checkpoint) {
  for (const io::TensorInfo& tensor : checkpoint.tensors()) {
    if (tensor.name.rfind("fp8/", 0) == 0) return true;
  }
  return false;
}

}  // namespace

TEST(Fp8State, AResumedFp8RunEqualsTheStraightRunBitForBit) {
  mt::testing::TempDir dir("mt_test_fp8_resume");
  const model::ModelConfig model = mt::testing::tiny_llama();  // SwiGLU: 7 FP8 linears a layer
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 3);
  Trace straight;
  train::Trainer whole(model, fp8_config(4, true), *data, backend::cpu_ops());
  run_steps(whole, 4, straight);

  Trace resumed;
  const std::string directory = dir.path().string();
  {
    train::Trainer first(model, fp8_config(4, true), *data, backend::cpu_ops());
    run_steps(first, 2, resumed);
    train::save_checkpoint(directory, first, {});
  }
  const io::CheckpointReader checkpoint = latest(directory);
  ASSERT_TRUE(checkpoint.has_tensor(train::fp8_state_tensor_name("decoder.layers.1.mlp.linear_fc2.weight")));
  train::Trainer second(model, fp8_config(4, true), *data, backend::cpu_ops());
  train::load_checkpoint(checkpoint, second, {});
  run_steps(second, 2, resumed);
  EXPECT_EQ(bits(resumed.loss), bits(straight.loss));
  EXPECT_EQ(bits(resumed.grad_norm), bits(straight.grad_norm));
  EXPECT_EQ(parameters(second), parameters(whole));
  EXPECT_EQ(fp8_state(*second.fp8_scaling()), fp8_state(*whole.fp8_scaling()));
}

TEST(Fp8State, ACheckpointWithoutFp8StateStartsTheScalingFreshAndAnFp8OneLoadsWithoutFp8) {
  mt::testing::TempDir dir("mt_test_fp8_mixed");
  const model::ModelConfig model = mt::testing::tiny_llama();
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 3);
  const std::string bf16_dir = dir.file("bf16"), fp8_dir = dir.file("fp8"), again_dir = dir.file("again");
  {
    train::Trainer bf16(model, fp8_config(4, false), *data, backend::cpu_ops());
    bf16.train_step();
    train::save_checkpoint(bf16_dir, bf16, {});
  }
  EXPECT_FALSE(has_fp8_state(latest(bf16_dir)));
  train::Trainer fp8(model, fp8_config(4, true), *data, backend::cpu_ops());
  const std::vector<float> fresh = fp8_state(*fp8.fp8_scaling());
  train::load_checkpoint(latest(bf16_dir), fp8, {});
  EXPECT_EQ(fp8_state(*fp8.fp8_scaling()), fresh) << "scale 1, an empty history: TE's empty extra_state";
  fp8.train_step();
  EXPECT_NE(fp8_state(*fp8.fp8_scaling()), fresh);
  train::save_checkpoint(fp8_dir, fp8, {});
  EXPECT_TRUE(has_fp8_state(latest(fp8_dir)));

  train::Trainer without(model, fp8_config(4, false), *data, backend::cpu_ops());
  train::load_checkpoint(latest(fp8_dir), without, {});
  EXPECT_EQ(parameters(without), parameters(fp8));
  EXPECT_EQ(without.iteration(), 2);
  without.train_step();
  train::save_checkpoint(again_dir, without, {});
  EXPECT_FALSE(has_fp8_state(latest(again_dir))) << "a run without FP8 drops the state, as TE's next save does";
}

TEST(Fp8State, FirstLastLayersBf16QuantizesOnlyTheMiddleLayers) {
  model::ModelConfig model = mt::testing::tiny_llama();
  model.num_layers = 3;
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 3);
  train::TrainConfig middle = fp8_config(3, true);
  middle.fp8.first_last_layers_bf16 = true;  // one layer at each end (Megatron's defaults)
  {
    train::Trainer trainer(model, middle, *data, backend::cpu_ops());
    const model::Fp8Scaling& fp8 = *trainer.fp8_scaling();
    ASSERT_GT(fp8.linears(), 0);
    for (int64_t linear = 0; linear < fp8.linears(); ++linear) {
      EXPECT_EQ(fp8.weight_name(linear).rfind("decoder.layers.1.", 0), 0u) << fp8.weight_name(linear);
    }
    trainer.train_step();
    int used = 0;
    for (int64_t linear = 0; linear < fp8.linears(); ++linear) used += fp8.amax_history(linear, model::Fp8Operand::input)[0] > 0;
    EXPECT_EQ(used, 4) << "qkv, projection, fc1, fc2 of layer 1 gathered amaxes";
  }
  const Trace bf16 = trained(model, fp8_config(3, false));
  const Trace all_fp8 = trained(model, fp8_config(3, true));
  const Trace only_middle = trained(model, middle);
  EXPECT_NE(only_middle.loss, bf16.loss);
  EXPECT_NE(only_middle.loss, all_fp8.loss);
  train::TrainConfig none = middle;
  none.fp8.num_layers_at_start_in_bf16 = 2;  // layers 0, 1 at the start and 2 at the end: no FP8 layer
  const Trace no_fp8_layer = trained(model, none);
  EXPECT_EQ(bits(no_fp8_layer.loss), bits(bf16.loss)) << "the layers out of FP8 run the bf16 path exactly";
  EXPECT_EQ(bits(no_fp8_layer.grad_norm), bits(bf16.grad_norm));
}

TEST(Fp8State, NoFp8WgradKeepsTheForwardAndChangesTheWeightGradients) {
  const model::ModelConfig model = mt::testing::tiny_llama();
  train::TrainConfig no_wgrad = fp8_config(3, true);
  no_wgrad.fp8.wgrad = false;
  const Trace fp8 = trained(model, fp8_config(3, true));
  const Trace bf16_wgrad = trained(model, no_wgrad);
  EXPECT_EQ(bits({bf16_wgrad.loss[0]}), bits({fp8.loss[0]})) << "the first forward is the same FP8 forward";
  EXPECT_NE(bf16_wgrad.grad_norm[0], fp8.grad_norm[0]) << "the weight gradients came from another GEMM";
  EXPECT_NE(bf16_wgrad.loss, fp8.loss);
}

TEST(Fp8State, AHistoryOfAnotherLengthIsRefusedByName) {
  mt::testing::TempDir dir("mt_test_fp8_history");
  const model::ModelConfig model = mt::testing::tiny_llama();
  auto data = data::make_mock_data(model.vocab_size, model.seq_length, 3);
  {
    train::Trainer saved(model, fp8_config(4, true), *data, backend::cpu_ops());
    saved.train_step();
    train::save_checkpoint(dir.path().string(), saved, {});
  }
  train::TrainConfig shorter = fp8_config(4, true);
  shorter.fp8.amax_history_len = 2;
  train::Trainer trainer(model, shorter, *data, backend::cpu_ops());
  const std::string error = mt::testing::error_text([&] { train::load_checkpoint(latest(dir.path().string()), trainer, {}); });
  EXPECT_NE(error.find("fp8/decoder.layers.0."), std::string::npos) << error;
  EXPECT_NE(error.find("holds an amax history of 4 steps, this run's --fp8-amax-history-len is 2"), std::string::npos)
      << error;
}
