// What the Hugging Face logits goldens share (tests/unit/train/test_hf_mixtral_logits.cpp and
// tests/unit/train/test_hf_deepseek_logits.cpp, which are its tests): reading a golden's tokens and
// logits from its .h5 and the largest difference from mt's forward of the same initial parameters.
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "fixed_tokens.h"
#include "train/trainer.h"

namespace mt::testing {

template <typename T>
struct Dataset {
  std::vector<hsize_t> shape;
  std::vector<T> values;
};

template <typename T>
inline Dataset<T> read_dataset(hid_t file, const std::string& name, hid_t type) {
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

// The largest |mt - transformers| over the logits of `golden` (tests/golden/hf/<preset>-logits.h5,
// made by make_hf_goldens.sh <preset>), mt running `m` from its initial parameters (which depend on
// the shapes and the seed only); *largest is the largest |logit| of the golden.
inline double worst_hf_logits_difference(const std::string& preset, const model::ModelConfig& m, double* largest) {
  const std::string golden = MT_SOURCE_DIR "/tests/golden/hf/" + preset + "-logits.h5";
  const hid_t file = H5Fopen(golden.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) throw std::runtime_error("missing " + golden + " (regenerate: tests/golden/hf/make_hf_goldens.sh " + preset + ")");
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

}  // namespace mt::testing
