// Multi-latent attention (model/layers/mla_attention.h) against Megatron-Core's own
// MLASelfAttention: tests/golden/mla/mla_goldens.json, written by
// tests/golden/mla/make_mla_goldens.py (megatron-core 0.16.1 and CPU torch in a venv outside the
// repository; tests/golden/mla/README.md). Each case loads Megatron's weights by their names under
// decoder.layers.0.self_attention. (every tensor Megatron has must exist in mt's layout, with its
// shape, and mt may have no other), runs the layer's forward and backward on Megatron's input and
// output grad, and compares the output, the input grad and every weight grad. A reference written
// from the same reading of Megatron would share its misreadings (the RoPE interleave, the norms'
// placement, the softmax scale); this one is Megatron's code.
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
#include "model/layers/mla_attention.h"
#include "model/layout.h"
#include "model/parallel_context.h"
#include "model/precision_gemm.h"
#include "mla_golden_run.h"

using namespace mt;
using namespace mt::model;
using nlohmann::json;
using mt::model::testing::expect_close;
using mt::model::testing::mla_golden_config;
using mt::model::testing::MlaRun;
using mt::model::testing::run_mla_layer;

namespace {

const json& goldens() {
  static const json data = [] {
    std::ifstream in(MT_SOURCE_DIR "/tests/golden/mla/mla_goldens.json");
    if (!in) throw std::runtime_error("tests/golden/mla/mla_goldens.json (written by make_mla_goldens.py)");
    return json::parse(in);
  }();
  return data;
}

void check_case(const json& g) {
  const ModelConfig c = mla_golden_config(g);
  const ParamLayout layout = build_layout(c);
  const std::string prefix = layer_prefix(0) + "self_attention.";
  std::vector<float> params(static_cast<size_t>(layout.total_elements), 0.0f);
  for (const auto& [name, tensor] : g["weights"].items()) {
    const ParamEntry* entry = layout.try_find(prefix + name);
    ASSERT_NE(entry, nullptr) << "Megatron's " << name << " has no tensor of that name in mt";
    EXPECT_EQ(entry->global_shape, tensor["shape"].get<std::vector<int64_t>>()) << name;
    const std::vector<float> values = tensor["values"].get<std::vector<float>>();
    ASSERT_EQ(static_cast<int64_t>(values.size()), entry->numel) << name;
    std::copy(values.begin(), values.end(), params.begin() + entry->offset);
  }
  int mt_tensors = 0;
  for (const ParamEntry& e : layout.entries) mt_tensors += e.name.rfind(prefix, 0) == 0 ? 1 : 0;
  EXPECT_EQ(mt_tensors, static_cast<int>(g["weights"].size())) << "mt has tensors Megatron's MLA has not";

  const MlaRun run = run_mla_layer(c, layout, params, g);
  EXPECT_FLOAT_EQ(run.softmax_scale, static_cast<float>(g["softmax_scale"].get<double>()));

  const double tol = 1e-5;
  expect_close(run.y.data(), g["y"].get<std::vector<float>>(), tol, "output");
  expect_close(run.dx.data(), g["dx"].get<std::vector<float>>(), tol, "input grad");
  for (const auto& [name, values] : g["grads"].items()) {
    const ParamEntry& entry = layout.find(prefix + name);
    expect_close(run.grads.data() + entry.offset, values.get<std::vector<float>>(), tol, "grad of " + name);
  }
}

}  // namespace

TEST(MlaMegatron, GoldensNameTheirGenerator) {
  const json& generator = goldens()["generator"];
  EXPECT_EQ(generator["megatron_core"], "0.16.1");
  EXPECT_EQ(goldens()["cases"].size(), 2u);
}

TEST(MlaMegatron, ForwardAndBackwardMatchMegatronCore) {
  for (const json& g : goldens()["cases"]) {
    SCOPED_TRACE(g["name"].get<std::string>());
    check_case(g);
  }
}
