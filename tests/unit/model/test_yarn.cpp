// YaRN rotary embeddings (kernels/common/yarn_rope.h, the CPU rope_yarn_* entries, MLA's
// --rope-type yarn and softmax mscale in model/layers/mla_attention.h) against Megatron-Core's own
// YarnRotaryEmbedding and MLASelfAttention: tests/golden/yarn/yarn_goldens.json, written by
// tests/golden/yarn/make_yarn_goldens.py (megatron-core 0.16.1 and CPU torch in a venv outside the
// repository; tests/golden/yarn/README.md). The tables: the inverse frequencies (the ramp between
// interpolation and extrapolation), the concentration factor and MLA's softmax mscale of four
// settings (DeepSeek-V3's, Megatron's CLI defaults, a concentration other than 1, a ramp whose
// ends meet), and cos/sin at positions up to 8191 as the op table rotates a unit vector. The
// layers: MLA with YaRN forward and backward. Also the config's YaRN rules and the deepseek-v3
// preset's settings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "core/error.h"
#include "kernels/common/yarn_rope.h"
#include "model/config.h"
#include "model/layers/mla_attention.h"
#include "model/layout.h"
#include "model/parallel_context.h"
#include "model/precision_gemm.h"
#include "mla_golden_run.h"

using namespace mt;
using namespace mt::model;
using nlohmann::json;
using mt::model::testing::mla_golden_config;
using mt::model::testing::MlaRun;
using mt::model::testing::run_mla_layer;

namespace {

const json& goldens() {
  static const json data = [] {
    std::ifstream in(MT_SOURCE_DIR "/tests/golden/yarn/yarn_goldens.json");
    if (!in) throw std::runtime_error("tests/golden/yarn/yarn_goldens.json (written by make_yarn_goldens.py)");
    return json::parse(in);
  }();
  return data;
}

kernels::YarnRope yarn_of(const json& g) {
  kernels::YarnRope yarn;
  yarn.base = g.contains("base") ? g["base"].get<double>() : 10000.0;
  yarn.scaling_factor = g["factor"];
  yarn.original_max_position_embeddings = g["original"];
  yarn.beta_fast = g["beta_fast"];
  yarn.beta_slow = g["beta_slow"];
  yarn.concentration = kernels::yarn_concentration(g["factor"], g["mscale"], g["mscale_all_dim"]);
  return yarn;
}

// |a - b| <= tol * max(|b|, floor), elementwise.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol, double floor,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < b.size(); ++i) {
    ASSERT_LE(std::fabs(double(a[i]) - b[i]), tol * std::max<double>(std::fabs(b[i]), floor))
        << what << "[" << i << "]: mt " << a[i] << ", Megatron " << b[i];
  }
}

TEST(Yarn, GoldensNameTheirGenerator) {
  const json& generator = goldens()["generator"];
  EXPECT_EQ(generator["megatron_core"], "0.16.1");
  EXPECT_EQ(goldens()["tables"].size(), 4u);
  EXPECT_EQ(goldens()["mla"].size(), 2u);
}

// The frequencies (ramp between Megatron's inv_freq_inter and inv_freq_extra), the concentration
// factor and MLA's softmax mscale, as Megatron computes them.
TEST(Yarn, FrequenciesAndFactorsMatchMegatronCore) {
  for (const json& g : goldens()["tables"]) {
    SCOPED_TRACE(g["name"].get<std::string>());
    const kernels::YarnRope yarn = yarn_of(g);
    const int dim = g["dim"];
    std::vector<float> inv_freq(dim / 2);
    kernels::yarn_inv_freq(yarn, dim, inv_freq.data());
    expect_close(inv_freq, g["inv_freq"].get<std::vector<float>>(), 3e-7, 0.0, "inv_freq");
    EXPECT_FLOAT_EQ(yarn.concentration, static_cast<float>(g["concentration"].get<double>()));
    EXPECT_NEAR(kernels::yarn_mscale(g["factor"], g["mscale_all_dim"]), g["softmax_mscale"].get<double>(), 1e-15);
  }
}

// cos and sin times the concentration: the CPU entry rotating (1, .., 1, 0, .., 0) at each position
// gives (cos, sin) of every dimension; its backward (the transpose) gives (cos, -sin).
TEST(Yarn, RotationMatchesMegatronCoreTables) {
  const backend::Ops& ops = backend::cpu_ops();
  for (const json& g : goldens()["tables"]) {
    SCOPED_TRACE(g["name"].get<std::string>());
    const kernels::YarnRope yarn = yarn_of(g);
    const int dim = g["dim"], half = dim / 2;
    const std::vector<int32_t> positions = g["positions"].get<std::vector<int32_t>>();
    const int64_t rows = static_cast<int64_t>(positions.size());
    std::vector<float> x(static_cast<size_t>(rows * dim), 0.0f);
    for (int64_t r = 0; r < rows; ++r) std::fill_n(x.begin() + r * dim, half, 1.0f);
    std::vector<float> back = x;
    ops.rope_yarn_forward(x.data(), rows, dim, 1, dim, positions.data(), yarn, ops.default_stream());
    ops.rope_yarn_backward(back.data(), rows, dim, 1, dim, positions.data(), yarn, ops.default_stream());
    ops.synchronize(ops.default_stream());
    std::vector<float> cos_values, sin_values, back_cos, back_minus_sin;
    for (int64_t r = 0; r < rows; ++r) {
      for (int i = 0; i < half; ++i) {
        cos_values.push_back(x[r * dim + i]);
        sin_values.push_back(x[r * dim + half + i]);
        back_cos.push_back(back[r * dim + i]);
        back_minus_sin.push_back(-back[r * dim + half + i]);
      }
    }
    // Angles up to 8191 rad in fp32: the same float angle in both, cos/sin to a few ulps.
    const double tol = 1e-5;
    expect_close(cos_values, g["cos"].get<std::vector<float>>(), tol, 1.0, "cos");
    expect_close(sin_values, g["sin"].get<std::vector<float>>(), tol, 1.0, "sin");
    expect_close(back_cos, g["cos"].get<std::vector<float>>(), tol, 1.0, "backward's cos");
    expect_close(back_minus_sin, g["sin"].get<std::vector<float>>(), tol, 1.0, "backward's sin");
  }
}

ModelConfig mla_config(const json& g) {
  ModelConfig c = mla_golden_config(g);
  c.rope_type = RopeType::yarn;
  c.rotary_scaling_factor = g["factor"];
  c.original_max_position_embeddings = g["original"];
  c.yarn_beta_fast = g["beta_fast"];
  c.yarn_beta_slow = g["beta_slow"];
  c.mscale = g["mscale"];
  c.mscale_all_dim = g["mscale_all_dim"];
  c.validate();
  return c;
}

void check_mla_case(const json& g) {
  const ModelConfig c = mla_config(g);
  const ParamLayout layout = build_layout(c);
  const std::string prefix = layer_prefix(0) + "self_attention.";
  std::vector<float> params(static_cast<size_t>(layout.total_elements), 0.0f);
  for (const auto& [name, tensor] : g["weights"].items()) {
    const ParamEntry& entry = layout.find(prefix + name);
    const std::vector<float> values = tensor["values"].get<std::vector<float>>();
    ASSERT_EQ(static_cast<int64_t>(values.size()), entry.numel) << name;
    std::copy(values.begin(), values.end(), params.begin() + entry.offset);
  }
  const MlaRun run = run_mla_layer(c, layout, params, g);
  EXPECT_FLOAT_EQ(run.softmax_scale, static_cast<float>(g["softmax_scale"].get<double>()));

  const double tol = 1e-5;
  mt::model::testing::expect_close(run.y.data(), g["y"].get<std::vector<float>>(), tol, "output");
  mt::model::testing::expect_close(run.dx.data(), g["dx"].get<std::vector<float>>(), tol, "input grad");
  for (const auto& [name, values] : g["grads"].items()) {
    const ParamEntry& entry = layout.find(prefix + name);
    mt::model::testing::expect_close(run.grads.data() + entry.offset, values.get<std::vector<float>>(), tol, "grad of " + name);
  }
}

TEST(Yarn, MlaLayerMatchesMegatronCore) {
  for (const json& g : goldens()["mla"]) {
    SCOPED_TRACE(g["name"].get<std::string>());
    check_mla_case(g);
  }
}

// DeepSeek-V3's published YaRN (HF config.json's rope_scaling) and its softmax scale, 0.1352
// (facts note sec. 3.1), not 1/sqrt(192).
TEST(Yarn, DeepSeekV3PresetCarriesItsYarn) {
  const ModelConfig c = preset("deepseek-v3");
  EXPECT_EQ(c.rope_type, RopeType::yarn);
  EXPECT_EQ(c.rotary_scaling_factor, 40.0);
  EXPECT_EQ(c.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.yarn_beta_fast, 32.0);
  EXPECT_EQ(c.yarn_beta_slow, 1.0);
  EXPECT_EQ(c.mscale, 1.0);
  EXPECT_EQ(c.mscale_all_dim, 1.0);
  const MlaAttention mla(c, 0);
  EXPECT_NEAR(mla.softmax_scale(), 0.135234, 1e-6);
  EXPECT_EQ(preset("tiny-deepseek").rope_type, RopeType::rope);
}

TEST(Yarn, ConfigRefusesWhatMegatronRefuses) {
  ModelConfig dense = preset("tiny-llama");
  dense.rope_type = RopeType::yarn;
  try {
    dense.validate();
    FAIL() << "yarn without MLA accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--rope-type yarn"), std::string::npos) << e.what();
  }
  ModelConfig mla = preset("tiny-deepseek");
  mla.rope_type = RopeType::yarn;
  EXPECT_NO_THROW(mla.validate());
  mla.rotary_scaling_factor = 0.0;
  EXPECT_THROW(mla.validate(), UsageError);
  mla.rotary_scaling_factor = 40.0;
  mla.yarn_beta_slow = -1.0;
  EXPECT_THROW(mla.validate(), UsageError);
}

// The YaRN fields travel in the config's JSON (run records, checkpoints); a checkpoint that
// predates them loads as RoPE.
TEST(Yarn, ConfigJsonRoundTrips) {
  const ModelConfig c = preset("deepseek-v3");
  const ModelConfig back = config_from_json(to_json(c));
  EXPECT_EQ(back.rope_type, RopeType::yarn);
  EXPECT_EQ(back.rotary_scaling_factor, 40.0);
  EXPECT_EQ(back.mscale_all_dim, 1.0);
  nlohmann::json old = to_json(preset("tiny-deepseek"));
  for (const char* key : {"rope_type", "rotary_scaling_factor", "mscale", "mscale_all_dim",
                          "original_max_position_embeddings", "yarn_beta_fast", "yarn_beta_slow"}) {
    ASSERT_TRUE(old.contains(key)) << key;
    old.erase(key);
  }
  EXPECT_EQ(config_from_json(old).rope_type, RopeType::rope);
}

}  // namespace
