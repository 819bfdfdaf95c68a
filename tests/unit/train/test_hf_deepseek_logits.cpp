// mt's tiny-deepseek against transformers' DeepseekV3ForCausalLM: the committed logits of
// tests/golden/hf/tiny-deepseek-logits.h5 (make_hf_goldens.sh tiny-deepseek: mt-train --model
// tiny-deepseek --moe-router-topk 4 --mtp-num-layers 1 --save-init, exported by mt-ckpt export
// --format hf, run by transformers 4.53.3) equal mt's forward of the same initial parameters (same
// preset, same seed) within 1e-4 in fp32, the bound of the other HF goldens. The MLA projections'
// mapping, the interleaved rope part, the latent norms, the sigmoid router with its bias, groups
// and scaling, the shared expert and the dense first layer all show up in the logits. Needs no
// torch: only the .h5 golden.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "fixed_tokens.h"
#include "train/trainer.h"

using namespace mt;

namespace {

const std::string kGolden = MT_SOURCE_DIR "/tests/golden/hf/tiny-deepseek-logits.h5";

template <typename T>
struct Dataset {
  std::vector<hsize_t> shape;
  std::vector<T> values;
};

template <typename T>
Dataset<T> read_dataset(hid_t file, const std::string& name, hid_t type) {
  Dataset<T> d;
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (dataset < 0) throw std::runtime_error("golden dataset missing: " + name);
  const hid_t space = H5Dget_space(dataset);
  d.shape.resize(static_cast<size_t>(H5Sget_simple_extent_ndims(space)));
  H5Sget_simple_extent_dims(space, d.shape.data(), nullptr);
  d.values.resize(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
  H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.values.data());
  H5Sclose(space);
  H5Dclose(dataset);
  return d;
}

// The largest |mt - transformers| over the golden's logits, mt running `m` (the golden model's
// parameters: the initialisation depends on the shapes and the seed only).
double worst_difference(const model::ModelConfig& m, double* largest) {
  const hid_t file = H5Fopen(kGolden.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) throw std::runtime_error("missing " + kGolden + " (regenerate: tests/golden/hf/make_hf_goldens.sh tiny-deepseek)");
  const Dataset<int32_t> tokens = read_dataset<int32_t>(file, "tokens", H5T_NATIVE_INT32);
  const Dataset<float> expected = read_dataset<float>(file, "logits", H5T_NATIVE_FLOAT);
  H5Fclose(file);
  EXPECT_EQ(tokens.shape.size(), 2u);
  EXPECT_EQ(tokens.shape[1], static_cast<hsize_t>(m.seq_length));
  const int rows = static_cast<int>(tokens.shape[0]);
  EXPECT_EQ(expected.values.size(), static_cast<size_t>(rows) * m.seq_length * m.vocab_size);

  train::TrainConfig t;  // mt-train's defaults: seed 1234, fp32
  t.micro_batch_size = rows;
  t.global_batch_size = rows;
  t.train_iters = 1;
  t.eval_iters = 0;
  mt::testing::FixedTokens fixed(tokens.values, m.seq_length, m.vocab_size);
  train::Trainer trainer(m, t, fixed, backend::cpu_ops());
  std::vector<float> logits(expected.values.size());
  trainer.forward_logits(0, rows, logits.data());
  double worst = 0;
  *largest = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    worst = std::max(worst, std::fabs(double(logits[i]) - expected.values[i]));
    *largest = std::max(*largest, std::fabs(double(expected.values[i])));
  }
  return worst;
}

// The golden's model: tiny-deepseek (MLA with the latent norms, a dense layer then a MoE layer with
// the sigmoid router, expert bias, 4 groups and a shared expert, one MTP depth) routing to 4
// experts, so that Megatron scores each group by its best top-k / group-topk = 2 experts, as HF does.
model::ModelConfig golden_model() {
  model::ModelConfig m = model::preset("tiny-deepseek");
  m.moe_router_topk = 4;
  m.mtp_num_layers = 1;
  return m;
}

}  // namespace

TEST(HfDeepseek, TinyDeepseekInitialParametersMatchTransformersLogits) {
  double largest = 0;
  const double worst = worst_difference(golden_model(), &largest);
  EXPECT_LT(worst, 1e-4) << "max abs difference from transformers' logits (largest logit " << largest << ")";
}

// The golden sees the routing: keeping all 4 groups in mt (the golden keeps 2) chooses other
// experts, and the logits leave the bound.
TEST(HfDeepseek, RoutingToOtherGroupsLeavesTheBound) {
  model::ModelConfig m = golden_model();
  m.moe_router_group_topk = 4;
  double largest = 0;
  EXPECT_GT(worst_difference(m, &largest), 1e-3);
}
