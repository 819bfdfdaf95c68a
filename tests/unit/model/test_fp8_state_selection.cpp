// Which GEMMs quantize (issue 23), on the CPU emulation: --first-last-layers-bf16 leaves the first
// and last layers' weights out of Fp8Scaling (no FP8 state, the bf16 path), --no-fp8-wgrad runs
// the weight-gradient GEMM in the bf16 path (equal to a PrecisionGemm without FP8, bit for bit)
// while the forward and input-gradient GEMMs stay FP8 (equal to a run with FP8 wgrad), and the
// checkpoint pieces of a linear's state cover its (3, 2 + history) matrix once. Resume and
// training: tests/unit/train/test_fp8_state_checkpoint.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../error_text.h"
#include "backend/ops.h"
#include "core/error.h"
#include "model/fp8_scaling.h"
#include "model/layout.h"
#include "model/precision_gemm.h"

using namespace mt;

namespace {

constexpr int64_t kRows = 32, kIn = 64, kOut = 48;

std::vector<float> random_values(int64_t n, float magnitude, uint32_t seed) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0.0f, magnitude);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = normal(random);
  return values;
}

// One (out, in) weight per layer, layers [0, layers).
model::ParamLayout layered_layout(int layers) {
  model::ParamLayout layout;
  for (int layer = 0; layer < layers; ++layer) {
    model::ParamEntry entry;
    entry.name = "decoder.layers." + std::to_string(layer) + ".mlp.linear_fc1.weight";
    entry.layer = layer;
    entry.local_shape = {kOut, kIn};
    entry.numel = kOut * kIn;
    entry.offset = layout.total_elements;
    layout.entries.push_back(entry);
    layout.total_elements += entry.numel;
  }
  return layout;
}

model::Fp8Config fp8_config() {
  model::Fp8Config config;
  config.enabled = true;
  config.amax_history_len = 3;
  return config;
}

TEST(Fp8Selection, FirstLastLayersBf16LeavesThoseLayersWithoutFp8State) {
  const backend::Ops& ops = backend::cpu_ops();
  const model::ParamLayout layout = layered_layout(5);
  model::Fp8Config config = fp8_config();
  EXPECT_EQ(model::Fp8Scaling(ops, config, layout, 5).linears(), 5);
  config.first_last_layers_bf16 = true;  // Megatron's defaults: one layer at each end
  {
    const model::Fp8Scaling scaling(ops, config, layout, 5);
    ASSERT_EQ(scaling.linears(), 3);
    for (int64_t linear = 0; linear < 3; ++linear) {
      EXPECT_EQ(scaling.weight_name(linear), layout.entries[static_cast<size_t>(linear + 1)].name);
    }
    EXPECT_EQ(scaling.linear(layout.entries[0].offset), -1);
    EXPECT_EQ(scaling.linear(layout.entries[4].offset), -1);
  }
  config.num_layers_at_start_in_bf16 = 0;
  config.num_layers_at_end_in_bf16 = 2;
  const model::Fp8Scaling tail(ops, config, layout, 5);
  ASSERT_EQ(tail.linears(), 3);
  EXPECT_EQ(tail.weight_name(0), layout.entries[0].name);
  EXPECT_EQ(tail.weight_name(2), layout.entries[2].name);
  EXPECT_FALSE(model::layer_runs_in_fp8(config, 3, 5));
  EXPECT_TRUE(model::layer_runs_in_fp8(config, 2, 5));
  config.num_layers_at_end_in_bf16 = 6;
  EXPECT_EQ(mt::testing::error_text([&] { model::Fp8Scaling(ops, config, layout, 5); }),
            "--num-layers-at-end-in-bf16: 6 is not between 0 and the model's 5 layers");
}

// Multi-token prediction: an MTP depth's eh_proj and its layer's linears (layer id L + k) have FP8
// state whatever --first-last-layers-bf16 says (Megatron's MTP takes get_fp8_context without a
// layer number); the output layer and the word table's copy, which share depth 0's id, do not.
TEST(Fp8Selection, MtpDepthsLinearsRunInFp8ButNotTheOutputLayer) {
  model::ParamLayout layout = layered_layout(2);  // decoder layers 0 and 1 of a 1-layer model + 1 depth
  layout.entries[1].name = "decoder.layers.1.mlp.linear_fc1.weight";
  for (const char* name : {"mtp.layers.0.eh_proj.weight", "output_layer.weight", "embedding.word_embeddings.weight",
                           "mtp.layers.0.enorm.weight"}) {
    model::ParamEntry entry = layout.entries[1];
    entry.name = name;
    if (entry.name.find("enorm") != std::string::npos) entry.local_shape = {kIn};
    layout.entries.push_back(entry);
  }
  model::Fp8Config config = fp8_config();
  config.first_last_layers_bf16 = true;
  config.num_layers_at_start_in_bf16 = 0;
  config.num_layers_at_end_in_bf16 = 1;  // the model's one decoder layer in bf16, the depth still FP8
  std::vector<std::string> fp8;
  for (const model::ParamEntry& entry : layout.entries) {
    if (model::is_fp8_weight(config, entry, 1)) fp8.push_back(entry.name);
  }
  EXPECT_EQ(fp8, (std::vector<std::string>{"decoder.layers.1.mlp.linear_fc1.weight", "mtp.layers.0.eh_proj.weight"}));
}

// Three PrecisionGemms over the same weight and inputs: FP8 with FP8 wgrad, FP8 with --no-fp8-wgrad,
// and no FP8 (the bf16 path).
struct WgradCase {
  const backend::Ops& ops = backend::cpu_ops();
  model::ParamLayout layout = layered_layout(1);
  std::vector<float> weight = random_values(kOut * kIn, 0.05f, 1);  // (out, in)
  std::vector<float> x = random_values(kRows * kIn, 1.0f, 2);       // (rows, in)
  std::vector<float> dy = random_values(kRows * kOut, 1e-3f, 3);    // (rows, out)
  model::GemmWeights weights{ops, Precision::bf16, kOut * kIn};

  struct Run {
    std::unique_ptr<model::Fp8Scaling> scaling;
    std::unique_ptr<model::PrecisionGemm> gemm;
    std::vector<float> grads = std::vector<float>(static_cast<size_t>(kOut * kIn), 0.0f);
    std::vector<float> operands0 = std::vector<float>(static_cast<size_t>(kRows * kIn), 0.0f);
    std::vector<float> operands1 = std::vector<float>(static_cast<size_t>(kRows * kIn), 0.0f);
    std::vector<float> y = std::vector<float>(static_cast<size_t>(kRows * kOut), 0.0f);
    std::vector<float> dx = std::vector<float>(static_cast<size_t>(kRows * kIn), 0.0f);
  };

  WgradCase() { weights.refresh(weight.data()); }

  // One step (forward, both backward GEMMs, the scale update), then the same products again with
  // the updated scales; the grads accumulate both.
  void run(Run& run, const model::Fp8Config* fp8) {
    if (fp8) run.scaling = std::make_unique<model::Fp8Scaling>(ops, *fp8, layout, 1);
    run.gemm = std::make_unique<model::PrecisionGemm>(ops, weights);
    run.gemm->bind(weight.data(), run.grads.data());
    run.gemm->set_operand_buffers(run.operands0.data(), run.operands1.data());
    run.gemm->set_fp8(run.scaling.get());
    for (int step = 0; step < 2; ++step) {
      run.gemm->linear_forward(x.data(), kRows, kIn, 0, kOut, run.y.data());
      run.gemm->linear_backward_input(dy.data(), kRows, kOut, 0, kIn, run.dx.data());
      run.gemm->linear_backward_weight(dy.data(), x.data(), kRows, kOut, kIn, 0);
      if (run.scaling) run.scaling->update_scales();
    }
  }
};

TEST(Fp8Selection, NoFp8WgradRunsTheWeightGradientInBf16AndTheOtherGemmsInFp8) {
  WgradCase c;
  model::Fp8Config fp8 = fp8_config();
  WgradCase::Run with_wgrad, without_wgrad, bf16;
  c.run(with_wgrad, &fp8);
  fp8.wgrad = false;
  c.run(without_wgrad, &fp8);
  c.run(bf16, nullptr);
  EXPECT_EQ(without_wgrad.grads, bf16.grads) << "--no-fp8-wgrad: the weight gradient is the bf16 path's";
  EXPECT_NE(with_wgrad.grads, bf16.grads) << "FP8 wgrad should round differently from bf16";
  EXPECT_EQ(without_wgrad.y, with_wgrad.y) << "the forward GEMM stays FP8";
  EXPECT_EQ(without_wgrad.dx, with_wgrad.dx) << "the input-gradient GEMM stays FP8";
  EXPECT_NE(without_wgrad.y, bf16.y);
  // The scales still follow the input's and the output grad's amaxes (from the FP8 GEMMs).
  for (model::Fp8Operand operand : {model::Fp8Operand::input, model::Fp8Operand::weight, model::Fp8Operand::output_grad}) {
    EXPECT_EQ(*without_wgrad.scaling->scale(0, operand), *with_wgrad.scaling->scale(0, operand));
    EXPECT_NE(*without_wgrad.scaling->scale(0, operand), 1.0f);
  }
}

TEST(Fp8Selection, StatePiecesCoverALinearsCheckpointMatrixOnce) {
  const backend::Ops& ops = backend::cpu_ops();
  const model::ParamLayout layout = layered_layout(2);
  model::Fp8Scaling scaling(ops, fp8_config(), layout, 2);
  const int64_t columns = scaling.state_columns();
  ASSERT_EQ(columns, 2 + 3);
  for (int64_t linear = 0; linear < scaling.linears(); ++linear) {
    std::vector<int> covered(static_cast<size_t>(3 * columns), 0);
    for (const model::Fp8Scaling::StatePiece& piece : scaling.state_pieces(linear)) {
      for (int64_t r = 0; r < piece.rows; ++r) {
        for (int64_t c = 0; c < piece.columns; ++c) ++covered[static_cast<size_t>((piece.row + r) * columns + piece.column + c)];
      }
      const model::Fp8Operand operand = piece.row == 0 ? model::Fp8Operand::input : model::Fp8Operand::output_grad;
      const float* expected = piece.column == 0   ? scaling.scale(linear, operand)
                              : piece.column == 1 ? scaling.scale_inv(linear, operand)
                                                  : scaling.amax_history(linear, operand);
      EXPECT_EQ(piece.data, expected) << "linear " << linear << " row " << piece.row << " column " << piece.column;
      if (piece.rows == 2 && piece.column >= 2) {
        EXPECT_EQ(piece.data + piece.columns, scaling.amax_history(linear, model::Fp8Operand::weight));
      } else if (piece.rows == 2) {
        EXPECT_EQ(piece.data + 1, piece.column == 0 ? scaling.scale(linear, model::Fp8Operand::weight)
                                                    : scaling.scale_inv(linear, model::Fp8Operand::weight));
      }
    }
    EXPECT_EQ(covered, std::vector<int>(covered.size(), 1));
  }
}

}  // namespace
