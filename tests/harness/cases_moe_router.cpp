// Cases of the MoE router's entries (see op_cases.h; contracts in kernels/cpu/moe_router.h) against
// double-precision loops written here from Megatron-Core's formulas: top-k under every score
// function (post-softmax, pre-softmax, sigmoid with and without expert bias, group-limited,
// scaled) on odd shapes (one row, E = 1..64, k = 1..E), its ties broken by lower index, and its
// backward against the analytic gradient and central differences with dropped entries; the aux
// loss's counts and probability sums per sequence and their backward; the z-loss; capacity
// dropping under both policies with and without padding, ties by lower row; token counts and the
// expert-bias update. Row-parallel entries are checked the same at any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "case_helpers.h"
#include "kernels/common/moe_router_params.h"
#include "op_cases.h"
#include "reference.h"

namespace mt::harness {
namespace {

using kernels::MoeDropPolicy;
using kernels::MoeScoreFunction;
using kernels::MoeTopkParams;

// --- reference loops --------------------------------------------------------------------------------

// Indices of the k largest values, descending, equal values by lower index.
std::vector<int32_t> ref_top(const std::vector<double>& values, int k) {
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return values[a] > values[b]; });
  order.resize(static_cast<size_t>(k));
  return order;
}

std::vector<double> ref_softmax(const std::vector<double>& x) {
  double max_value = -1e300, sum = 0;
  for (double v : x) max_value = std::max(max_value, v);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum += y[i] = std::exp(x[i] - max_value);
  for (double& v : y) v /= sum;
  return y;
}

double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The choosing scores of one row after the group mask (Megatron's group_limited_topk).
std::vector<double> ref_choosing_scores(const std::vector<double>& logits, const float* bias,
                                        const MoeTopkParams& p) {
  std::vector<double> choose = logits;
  if (p.score_function == MoeScoreFunction::sigmoid) {
    for (size_t e = 0; e < logits.size(); ++e) choose[e] = ref_sigmoid(logits[e]) + (bias ? bias[e] : 0.0);
  } else if (p.pre_softmax) {
    choose = ref_softmax(logits);
  }
  if (p.group_topk == 0) return choose;
  const int per_group = p.num_experts / p.num_groups;
  std::vector<double> group_scores(static_cast<size_t>(p.num_groups));
  for (int g = 0; g < p.num_groups; ++g) {
    const std::vector<double> group(choose.begin() + g * per_group, choose.begin() + (g + 1) * per_group);
    for (int32_t j : ref_top(group, p.topk / p.group_topk)) group_scores[static_cast<size_t>(g)] += group[j];
  }
  const std::vector<int32_t> kept = ref_top(group_scores, p.group_topk);
  for (int e = 0; e < p.num_experts; ++e) {
    if (std::find(kept.begin(), kept.end(), e / per_group) == kept.end()) choose[static_cast<size_t>(e)] = -INFINITY;
  }
  return choose;
}

// The gates (scaled) of one row's chosen experts.
std::vector<double> ref_gates(const std::vector<double>& logits, const std::vector<int32_t>& chosen,
                              const MoeTopkParams& p) {
  const size_t k = chosen.size();
  std::vector<double> gate(k);
  if (p.score_function == MoeScoreFunction::softmax && !p.pre_softmax) {
    for (size_t j = 0; j < k; ++j) gate[j] = logits[static_cast<size_t>(chosen[j])];
    gate = ref_softmax(gate);
  } else if (p.score_function == MoeScoreFunction::softmax) {
    const std::vector<double> scores = ref_softmax(logits);
    for (size_t j = 0; j < k; ++j) gate[j] = scores[static_cast<size_t>(chosen[j])];
  } else {
    double sum = 0;
    for (size_t j = 0; j < k; ++j) sum += gate[j] = ref_sigmoid(logits[static_cast<size_t>(chosen[j])]);
    if (k > 1)
      for (double& g : gate) g /= sum + 1e-20;
  }
  for (double& g : gate) g *= p.scaling_factor;
  return gate;
}

struct TopkReference {
  std::vector<int32_t> indices;
  std::vector<double> probs;
  std::vector<uint8_t> map;
};

TopkReference ref_topk(const std::vector<float>& logits, const std::vector<float>& bias, int64_t rows,
                       const MoeTopkParams& p) {
  const int experts = p.num_experts, k = p.topk;
  TopkReference out{std::vector<int32_t>(static_cast<size_t>(rows * k)),
                    std::vector<double>(static_cast<size_t>(rows * experts), 0.0),
                    std::vector<uint8_t>(static_cast<size_t>(rows * experts), 0)};
  for (int64_t t = 0; t < rows; ++t) {
    const std::vector<double> row(logits.begin() + t * experts, logits.begin() + (t + 1) * experts);
    const std::vector<int32_t> chosen = ref_top(ref_choosing_scores(row, bias.empty() ? nullptr : bias.data(), p), k);
    const std::vector<double> gate = ref_gates(row, chosen, p);
    for (int j = 0; j < k; ++j) {
      out.indices[static_cast<size_t>(t * k + j)] = chosen[static_cast<size_t>(j)];
      out.probs[static_cast<size_t>(t * experts + chosen[static_cast<size_t>(j)])] = gate[static_cast<size_t>(j)];
      out.map[static_cast<size_t>(t * experts + chosen[static_cast<size_t>(j)])] = 1;
    }
  }
  return out;
}

// The aux loss's scores of one row: softmax, or sigmoid normalised over E.
std::vector<double> ref_aux_scores(const std::vector<double>& logits, MoeScoreFunction function) {
  if (function == MoeScoreFunction::softmax) return ref_softmax(logits);
  std::vector<double> scores(logits.size());
  double sum = 0;
  for (size_t e = 0; e < logits.size(); ++e) sum += scores[e] = ref_sigmoid(logits[e]);
  for (double& s : scores) s /= sum + 1e-20;
  return scores;
}

std::vector<int64_t> sequence_row_ids(int64_t rows, int64_t sequence_length, int64_t sequences, uint32_t seed) {
  // Rows of several sequences in a shuffled order (as a CP rank's chunks), every sequence present.
  std::vector<int64_t> ids(static_cast<size_t>(rows));
  const auto draws = random_floats(static_cast<size_t>(rows), seed, 0.0f, 1.0f);
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t sequence = t < sequences ? t : static_cast<int64_t>(draws[static_cast<size_t>(t)] * sequences);
    ids[static_cast<size_t>(t)] = sequence * sequence_length + t % sequence_length;
  }
  return ids;
}

MoeTopkParams make_params(int experts, int k, MoeScoreFunction function, bool pre_softmax = false, int groups = 0,
                          int group_topk = 0, float scaling = 1.0f) {
  MoeTopkParams p;
  p.num_experts = experts;
  p.topk = k;
  p.score_function = function;
  p.pre_softmax = pre_softmax;
  p.num_groups = groups;
  p.group_topk = group_topk;
  p.scaling_factor = scaling;
  return p;
}

std::string describe_params(const MoeTopkParams& p, int64_t rows, bool bias) {
  std::string text = shape_text({{"rows", rows}, {"E", p.num_experts}, {"k", p.topk}});
  text += p.score_function == MoeScoreFunction::sigmoid ? " sigmoid" : (p.pre_softmax ? " pre-softmax" : " softmax");
  if (bias) text += "+bias";
  if (p.group_topk > 0) text += " groups " + std::to_string(p.group_topk) + "/" + std::to_string(p.num_groups);
  if (p.scaling_factor != 1.0f) text += " scale " + std::to_string(p.scaling_factor).substr(0, 4);
  return text;
}

struct TopkShape {
  MoeTopkParams params;
  bool bias = false;
};

std::vector<TopkShape> topk_shapes() {
  using F = MoeScoreFunction;
  return {
      {make_params(1, 1, F::softmax, true)},
      {make_params(2, 1, F::softmax)},
      {make_params(8, 2, F::softmax)},
      {make_params(5, 5, F::softmax)},
      {make_params(64, 8, F::softmax)},
      {make_params(64, 64, F::softmax, true)},
      {make_params(8, 1, F::softmax, true)},
      {make_params(33, 6, F::softmax, true, 0, 0, 1.5f)},
      {make_params(8, 1, F::sigmoid)},
      {make_params(16, 4, F::sigmoid), true},
      {make_params(64, 8, F::sigmoid, false, 8, 4, 2.5f), true},  // DeepSeek-V3's routing, 1/4 size
      {make_params(16, 4, F::softmax, false, 4, 2)},
      {make_params(12, 3, F::softmax, true, 3, 1)},
      {make_params(12, 5, F::sigmoid, false, 4, 2), true},  // k / group_topk = 2, k odd
      {make_params(7, 7, F::sigmoid, false, 7, 7)},
  };
}

// --- top-k ----------------------------------------------------------------------------------------

void add_topk_forward(std::vector<OpCase>& cases) {
  uint32_t seed = 700;
  for (const TopkShape& shape : topk_shapes())
    for (int64_t rows : {1, 37}) {
      const MoeTopkParams p = shape.params;
      const bool with_bias = shape.bias;
      const uint32_t s = seed++;
      cases.push_back({.op = OpId::moe_router_topk,
                       .mode = CaseMode::forward,
                       .name = describe_params(p, rows, with_bias) + ": indices, map and probs",
                       .thread_count_independent = true,
                       .body = [p, rows, with_bias, s](CaseContext& c) {
                         const int experts = p.num_experts;
                         const auto logits = random_floats(static_cast<size_t>(rows * experts), s, -3.0f, 3.0f);
                         const auto bias = with_bias ? random_floats(static_cast<size_t>(experts), s + 1000, -0.3f, 0.3f)
                                                     : std::vector<float>{};
                         const DeviceArray<int32_t> indices = c.filled<int32_t>(rows * p.topk, -1);
                         const DeviceArray<float> probs = c.filled(rows * experts, 7.0f);
                         const DeviceArray<uint8_t> map = c.filled<uint8_t>(rows * experts, 9);
                         c.ops().moe_router_topk(c.upload(logits).data, with_bias ? c.upload(bias).data : nullptr,
                                                 rows, p, indices.data, probs.data, map.data, c.stream());
                         const TopkReference expected = ref_topk(logits, bias, rows, p);
                         c.expect_equal("topk_indices", c.download(indices, "indices"), expected.indices);
                         c.expect_equal("routing_map", c.download(map, "map"), expected.map);
                         c.expect_close("probs", c.download(probs, "probs"), expected.probs,
                                        tolerances(DType::f32).reference);
                       }});
    }
}

void add_topk_properties(std::vector<OpCase>& cases) {
  cases.push_back({.op = OpId::moe_router_topk,
                   .mode = CaseMode::property,
                   .name = "ties go to the lower expert index (equal logits, equal group scores)",
                   .body = [](CaseContext& c) {
                     // Row 0: all equal; row 1: experts 3 and 5 tie at the top; groups of row 2 tie.
                     const int experts = 8;
                     std::vector<float> logits(3 * experts, 0.0f);
                     logits[experts + 3] = logits[experts + 5] = 1.0f;
                     for (int e = 0; e < experts; ++e) logits[2 * experts + e] = (e % 2) ? 0.5f : 0.25f;
                     const DeviceArray<float> d_logits = c.upload(logits);
                     const DeviceArray<int32_t> indices = c.allocated<int32_t>(3 * 3);
                     const DeviceArray<float> probs = c.allocated<float>(3 * experts);
                     const DeviceArray<uint8_t> map = c.allocated<uint8_t>(3 * experts);
                     c.ops().moe_router_topk(d_logits.data, nullptr, 3, make_params(experts, 3, MoeScoreFunction::softmax),
                                             indices.data, probs.data, map.data, c.stream());
                     c.expect_equal("plain top-3", c.download(indices, "plain"),
                                    std::vector<int32_t>{0, 1, 2, 3, 5, 0, 1, 3, 5});
                     const DeviceArray<int32_t> grouped = c.allocated<int32_t>(3 * 2);
                     c.ops().moe_router_topk(d_logits.data, nullptr, 3,
                                             make_params(experts, 2, MoeScoreFunction::softmax, false, 4, 1),
                                             grouped.data, probs.data, map.data, c.stream());
                     // Groups {0,1} {2,3} {4,5} {6,7}: row 0 all tie (group 0), row 1 groups 1 and
                     // 2 tie (group 1: experts 3, then 2), row 2 all groups tie (group 0: 1, 0).
                     c.expect_equal("group-limited top-2", c.download(grouped, "grouped"),
                                    std::vector<int32_t>{0, 1, 3, 2, 1, 0});
                   }});
  cases.push_back({.op = OpId::moe_router_topk,
                   .mode = CaseMode::property,
                   .name = "sigmoid with bias: the bias chooses, the gate is the unbiased score",
                   .body = [](CaseContext& c) {
                     const std::vector<float> logits{2.0f, 0.0f, -1.0f, 1.0f};
                     const std::vector<float> bias{-5.0f, 0.0f, 5.0f, 0.0f};
                     const DeviceArray<int32_t> indices = c.allocated<int32_t>(2);
                     const DeviceArray<float> probs = c.allocated<float>(4);
                     const DeviceArray<uint8_t> map = c.allocated<uint8_t>(4);
                     c.ops().moe_router_topk(c.upload(logits).data, c.upload(bias).data, 1,
                                             make_params(4, 2, MoeScoreFunction::sigmoid, false, 0, 0, 2.0f),
                                             indices.data, probs.data, map.data, c.stream());
                     c.expect_equal("chosen", c.download(indices, "indices"), std::vector<int32_t>{2, 3});
                     const double s2 = ref_sigmoid(-1.0), s3 = ref_sigmoid(1.0);
                     c.expect_close("probs", c.download(probs, "probs"),
                                    {0.0, 0.0, 2.0 * s2 / (s2 + s3), 2.0 * s3 / (s2 + s3)},
                                    tolerances(DType::f32).reference);
                   }});
}

// The probs of rows with fixed choices, as a function of one row's logits (for central
// differences), masked by the row's kept entries.
std::vector<double> ref_masked_probs_row(const std::vector<double>& row, const std::vector<int32_t>& chosen,
                                         const std::vector<uint8_t>& kept, const MoeTopkParams& p) {
  std::vector<double> out(row.size(), 0.0);
  const std::vector<double> gate = ref_gates(row, chosen, p);
  for (size_t j = 0; j < chosen.size(); ++j) {
    const size_t e = static_cast<size_t>(chosen[j]);
    if (kept[e]) out[e] = gate[j];
  }
  return out;
}

// Analytic gradient of sum(dprobs * probs * kept) with respect to the logits, chosen fixed.
std::vector<double> ref_topk_backward(const std::vector<float>& logits, const std::vector<int32_t>& indices,
                                      const std::vector<float>& dprobs, const std::vector<uint8_t>& kept,
                                      int64_t rows, const MoeTopkParams& p) {
  const int experts = p.num_experts, k = p.topk;
  std::vector<double> dlogits(static_cast<size_t>(rows * experts), 0.0);
  for (int64_t t = 0; t < rows; ++t) {
    const std::vector<double> row(logits.begin() + t * experts, logits.begin() + (t + 1) * experts);
    const std::vector<int32_t> chosen(indices.begin() + t * k, indices.begin() + (t + 1) * k);
    std::vector<double> dgate(static_cast<size_t>(k));
    for (int j = 0; j < k; ++j) {
      const size_t at = static_cast<size_t>(t * experts + chosen[static_cast<size_t>(j)]);
      dgate[static_cast<size_t>(j)] = kept[at] ? dprobs[at] * static_cast<double>(p.scaling_factor) : 0.0;
    }
    double* dl = dlogits.data() + t * experts;
    if (p.score_function == MoeScoreFunction::softmax && !p.pre_softmax) {
      MoeTopkParams unscaled = p;
      unscaled.scaling_factor = 1.0f;
      const std::vector<double> q = ref_gates(row, chosen, unscaled);
      double dot = 0;
      for (int j = 0; j < k; ++j) dot += q[static_cast<size_t>(j)] * dgate[static_cast<size_t>(j)];
      for (int j = 0; j < k; ++j) dl[chosen[static_cast<size_t>(j)]] = q[static_cast<size_t>(j)] * (dgate[static_cast<size_t>(j)] - dot);
    } else if (p.score_function == MoeScoreFunction::softmax) {
      const std::vector<double> s = ref_softmax(row);
      std::vector<double> ds(static_cast<size_t>(experts), 0.0);
      double dot = 0;
      for (int j = 0; j < k; ++j) {
        ds[static_cast<size_t>(chosen[static_cast<size_t>(j)])] = dgate[static_cast<size_t>(j)];
        dot += s[static_cast<size_t>(chosen[static_cast<size_t>(j)])] * dgate[static_cast<size_t>(j)];
      }
      for (int e = 0; e < experts; ++e) dl[e] = s[static_cast<size_t>(e)] * (ds[static_cast<size_t>(e)] - dot);
    } else {
      double sum = 0, weighted = 0;
      for (int j = 0; j < k; ++j) {
        const double s = ref_sigmoid(row[static_cast<size_t>(chosen[static_cast<size_t>(j)])]);
        sum += s;
        weighted += s * dgate[static_cast<size_t>(j)];
      }
      const double d = sum + 1e-20;
      for (int j = 0; j < k; ++j) {
        const double s = ref_sigmoid(row[static_cast<size_t>(chosen[static_cast<size_t>(j)])]);
        const double ds = k > 1 ? dgate[static_cast<size_t>(j)] / d - weighted / (d * d) : dgate[static_cast<size_t>(j)];
        dl[chosen[static_cast<size_t>(j)]] = ds * s * (1 - s);
      }
    }
  }
  return dlogits;
}

void add_topk_backward(std::vector<OpCase>& cases) {
  uint32_t seed = 800;
  for (const TopkShape& shape : topk_shapes()) {
    const MoeTopkParams p = shape.params;
    const bool with_bias = shape.bias;
    const int64_t rows = 13;
    const uint32_t s = seed++;
    // Inputs: the forward's choices, dprobs everywhere, and about a quarter of the chosen
    // entries dropped from the map.
    auto make_inputs = [p, rows, with_bias, s] {
      struct Inputs {
        std::vector<float> logits, dprobs;
        TopkReference forward;
        std::vector<uint8_t> kept;
      } in;
      const int experts = p.num_experts;
      in.logits = random_floats(static_cast<size_t>(rows * experts), s, -3.0f, 3.0f);
      in.dprobs = random_floats(static_cast<size_t>(rows * experts), s + 1);
      const auto bias = with_bias ? random_floats(static_cast<size_t>(experts), s + 2, -0.3f, 0.3f) : std::vector<float>{};
      in.forward = ref_topk(in.logits, bias, rows, p);
      in.kept = in.forward.map;
      const auto drops = random_floats(in.kept.size(), s + 3, 0.0f, 1.0f);
      for (size_t i = 0; i < in.kept.size(); ++i)
        if (drops[i] < 0.25f) in.kept[i] = 0;
      return in;
    };
    for (CaseMode mode : {CaseMode::backward, CaseMode::grad}) {
      cases.push_back({.op = OpId::moe_router_topk_backward,
                       .mode = mode,
                       .name = describe_params(p, rows, with_bias) +
                               (mode == CaseMode::grad ? ": central differences" : ": analytic, dropped entries"),
                       .thread_count_independent = mode == CaseMode::backward,
                       .body = [p, rows, make_inputs, mode](CaseContext& c) {
                         const auto in = make_inputs();
                         const int experts = p.num_experts;
                         const DeviceArray<float> dlogits = c.filled(rows * experts, 5.0f);  // written, not added
                         c.ops().moe_router_topk_backward(c.upload(in.logits).data, c.upload(in.forward.indices).data,
                                                          c.upload(in.dprobs).data, c.upload(in.kept).data, rows, p,
                                                          dlogits.data, c.stream());
                         const auto result = c.download(dlogits, "dlogits");
                         if (mode == CaseMode::backward) {
                           c.expect_close("dlogits", result,
                                          ref_topk_backward(in.logits, in.forward.indices, in.dprobs, in.kept, rows, p),
                                          tolerances(DType::f32).reference);
                           return;
                         }
                         std::vector<double> gradient(static_cast<size_t>(rows * experts));
                         for (int64_t t = 0; t < rows; ++t) {
                           const std::vector<int32_t> chosen(in.forward.indices.begin() + t * p.topk,
                                                             in.forward.indices.begin() + (t + 1) * p.topk);
                           const std::vector<uint8_t> kept(in.kept.begin() + t * experts,
                                                           in.kept.begin() + (t + 1) * experts);
                           const std::vector<double> row(in.logits.begin() + t * experts,
                                                         in.logits.begin() + (t + 1) * experts);
                           const std::vector<double> dy(in.dprobs.begin() + t * experts,
                                                        in.dprobs.begin() + (t + 1) * experts);
                           const auto g = numeric_gradient(
                               [&](const std::vector<double>& x) { return ref_masked_probs_row(x, chosen, kept, p); },
                               row, dy);
                           std::copy(g.begin(), g.end(), gradient.begin() + t * experts);
                         }
                         c.expect_close("dlogits", result, gradient, tolerances(DType::f32).finite_difference);
                       }});
    }
  }
}

// --- aux loss -------------------------------------------------------------------------------------

struct AuxShape {
  int64_t rows;
  int experts, topk;
  MoeScoreFunction function;
  int64_t sequences;  // 0: no row ids (one group)
};

std::vector<AuxShape> aux_shapes() {
  using F = MoeScoreFunction;
  return {{1, 1, 1, F::softmax, 0}, {37, 8, 2, F::softmax, 0}, {37, 64, 6, F::sigmoid, 0},
          {1, 5, 5, F::sigmoid, 1}, {40, 16, 4, F::softmax, 3}, {29, 12, 3, F::sigmoid, 4}};
}

void add_aux_loss(std::vector<OpCase>& cases) {
  uint32_t seed = 900;
  for (const AuxShape& shape : aux_shapes()) {
    const uint32_t s = seed++;
    const int64_t sequence_length = 16;
    const std::string name = shape_text({{"rows", shape.rows}, {"E", shape.experts}, {"k", shape.topk},
                                         {"sequences", shape.sequences}}) +
                             (shape.function == MoeScoreFunction::sigmoid ? " sigmoid" : " softmax");
    const int64_t groups = shape.sequences > 0 ? shape.sequences : 1;
    auto group_of = [shape, sequence_length](const std::vector<int64_t>& ids, int64_t t) {
      return shape.sequences > 0 ? ids[static_cast<size_t>(t)] / sequence_length : 0;
    };
    cases.push_back({.op = OpId::moe_router_aux_sums,
                     .mode = CaseMode::forward,
                     .name = name + ": counts of the plain top-k and sums of P per sequence",
                     .thread_count_independent = true,
                     .body = [shape, s, groups, group_of](CaseContext& c) {
                       const int experts = shape.experts;
                       const auto logits = random_floats(static_cast<size_t>(shape.rows * experts), s, -3.0f, 3.0f);
                       const auto ids = sequence_row_ids(shape.rows, sequence_length, groups, s + 1);
                       const DeviceArray<float> counts = c.filled(groups * experts, 3.0f);
                       const DeviceArray<float> sums = c.filled(groups * experts, 3.0f);
                       c.ops().moe_router_aux_sums(c.upload(logits).data, shape.rows, experts, shape.topk,
                                                   shape.function, shape.sequences > 0 ? c.upload(ids).data : nullptr,
                                                   sequence_length, groups, counts.data, sums.data, c.stream());
                       std::vector<float> expected_counts(static_cast<size_t>(groups * experts), 0.0f);
                       std::vector<double> expected_sums(static_cast<size_t>(groups * experts), 0.0);
                       for (int64_t t = 0; t < shape.rows; ++t) {
                         const std::vector<double> row(logits.begin() + t * experts, logits.begin() + (t + 1) * experts);
                         const auto scores = ref_aux_scores(row, shape.function);
                         const int64_t base = group_of(ids, t) * experts;
                         for (int32_t e : ref_top(scores, shape.topk)) expected_counts[static_cast<size_t>(base + e)] += 1;
                         for (int e = 0; e < experts; ++e) expected_sums[static_cast<size_t>(base + e)] += scores[static_cast<size_t>(e)];
                       }
                       c.expect_equal("counts", c.download(counts, "counts"), expected_counts);
                       c.expect_close("prob_sums", c.download(sums, "sums"), expected_sums,
                                      tolerances(DType::f32).reference);
                     }});
    for (CaseMode mode : {CaseMode::backward, CaseMode::grad}) {
      cases.push_back({.op = OpId::moe_router_aux_backward,
                       .mode = mode,
                       .name = name + (mode == CaseMode::grad ? ": central differences of sum P w"
                                                              : ": analytic, accumulated onto random values"),
                       .thread_count_independent = mode == CaseMode::backward,
                       .body = [shape, s, groups, group_of, mode](CaseContext& c) {
                         const int experts = shape.experts;
                         const int64_t n = shape.rows * experts;
                         const auto logits = random_floats(static_cast<size_t>(n), s, -3.0f, 3.0f);
                         const auto ids = sequence_row_ids(shape.rows, sequence_length, groups, s + 1);
                         const auto weights = random_floats(static_cast<size_t>(groups * experts), s + 2, 0.0f, 9.0f);
                         const auto start = random_floats(static_cast<size_t>(n), s + 3);
                         const float scale = 0.37f;
                         const DeviceArray<float> dlogits = c.upload(start);
                         c.ops().moe_router_aux_backward(c.upload(logits).data, shape.rows, experts, shape.function,
                                                         shape.sequences > 0 ? c.upload(ids).data : nullptr,
                                                         sequence_length, groups, c.upload(weights).data, scale,
                                                         dlogits.data, c.stream());
                         const auto result = c.download(dlogits, "dlogits");
                         std::vector<double> expected = to_double(start);
                         for (int64_t t = 0; t < shape.rows; ++t) {
                           const std::vector<double> row(logits.begin() + t * experts, logits.begin() + (t + 1) * experts);
                           const float* w = weights.data() + group_of(ids, t) * experts;
                           std::vector<double> g(static_cast<size_t>(experts));
                           if (mode == CaseMode::grad) {
                             g = numeric_gradient(
                                 [&](const std::vector<double>& x) {
                                   const auto p = ref_aux_scores(x, shape.function);
                                   double total = 0;
                                   for (int e = 0; e < experts; ++e) total += p[static_cast<size_t>(e)] * w[e];
                                   return std::vector<double>{total};
                                 },
                                 row, {static_cast<double>(scale)});
                           } else {
                             const auto p = ref_aux_scores(row, shape.function);
                             double mean = 0, sig_sum = 0;
                             for (int e = 0; e < experts; ++e) {
                               mean += p[static_cast<size_t>(e)] * w[e];
                               sig_sum += ref_sigmoid(row[static_cast<size_t>(e)]);
                             }
                             for (int e = 0; e < experts; ++e) {
                               const double sg = ref_sigmoid(row[static_cast<size_t>(e)]);
                               g[static_cast<size_t>(e)] =
                                   shape.function == MoeScoreFunction::softmax
                                       ? scale * p[static_cast<size_t>(e)] * (w[e] - mean)
                                       : scale * (w[e] - mean) / (sig_sum + 1e-20) * sg * (1 - sg);
                             }
                           }
                           for (int e = 0; e < experts; ++e) expected[static_cast<size_t>(t * experts + e)] += g[static_cast<size_t>(e)];
                         }
                         const double tol = mode == CaseMode::grad ? tolerances(DType::f32).finite_difference
                                                                   : tolerances(DType::f32).reference;
                         c.expect_close("dlogits", result, expected, tol, 0.1);
                       }});
    }
  }
  cases.push_back({.op = OpId::moe_router_aux_sums,
                   .mode = CaseMode::property,
                   .name = "a row id beyond the sequences is refused (by the stream's synchronize at the latest)",
                   .body = [](CaseContext& c) {
                     const std::vector<int64_t> ids{0, 40};
                     expect_refusal(c, "moe_router_aux_sums", "row id 40", [&] {
                       c.ops().moe_router_aux_sums(c.upload(random_floats(8, 1)).data, 2, 4, 1,
                                                   MoeScoreFunction::softmax, c.upload(ids).data, 16, 2,
                                                   c.allocated<float>(8).data, c.allocated<float>(8).data, c.stream());
                       c.ops().synchronize(c.stream());  // an asynchronous table throws here
                     });
                   }});
}

// --- z-loss ---------------------------------------------------------------------------------------

double ref_logsumexp(const std::vector<double>& x) {
  double max_value = -1e300, sum = 0;
  for (double v : x) max_value = std::max(max_value, v);
  for (double v : x) sum += std::exp(v - max_value);
  return max_value + std::log(sum);
}

void add_z_loss(std::vector<OpCase>& cases) {
  uint32_t seed = 950;
  for (auto [rows, experts] : {std::pair<int64_t, int>{1, 1}, {37, 8}, {300, 64}}) {
    const uint32_t s = seed++;
    const std::string shape = shape_text({{"rows", rows}, {"E", experts}});
    cases.push_back({.op = OpId::moe_router_z_loss_sum,
                     .mode = CaseMode::forward,
                     .name = shape + ": sum of logsumexp^2, written",
                     .thread_count_independent = true,
                     .body = [rows, experts, s](CaseContext& c) {
                       const auto logits = random_floats(static_cast<size_t>(rows * experts), s, -4.0f, 4.0f);
                       const DeviceArray<double> sum = c.filled(1, 123.0);
                       c.ops().moe_router_z_loss_sum(c.upload(logits).data, rows, experts, sum.data, c.stream());
                       double expected = 0;
                       for (int64_t t = 0; t < rows; ++t) {
                         const double lse = ref_logsumexp(
                             std::vector<double>(logits.begin() + t * experts, logits.begin() + (t + 1) * experts));
                         expected += lse * lse;
                       }
                       const double result = c.download(sum, "sum")[0];
                       c.expect(std::abs(result - expected) <= 1e-12 * (1 + expected),
                                "z sum " + std::to_string(result) + ", expected " + std::to_string(expected));
                     }});
    for (CaseMode mode : {CaseMode::backward, CaseMode::grad}) {
      cases.push_back({.op = OpId::moe_router_z_loss_backward,
                       .mode = mode,
                       .name = shape + (mode == CaseMode::grad ? ": central differences" : ": accumulated, analytic"),
                       .thread_count_independent = mode == CaseMode::backward,
                       .body = [rows, experts, s, mode](CaseContext& c) {
                         const int64_t n = rows * experts;
                         const auto logits = random_floats(static_cast<size_t>(n), s, -4.0f, 4.0f);
                         const auto start = random_floats(static_cast<size_t>(n), s + 1);
                         const float scale = 0.01f;
                         const DeviceArray<float> dlogits = c.upload(start);
                         c.ops().moe_router_z_loss_backward(c.upload(logits).data, rows, experts, scale, dlogits.data,
                                                            c.stream());
                         std::vector<double> expected = to_double(start);
                         for (int64_t t = 0; t < rows; ++t) {
                           const std::vector<double> row(logits.begin() + t * experts, logits.begin() + (t + 1) * experts);
                           std::vector<double> g;
                           if (mode == CaseMode::grad) {
                             g = numeric_gradient(
                                 [](const std::vector<double>& x) {
                                   const double lse = ref_logsumexp(x);
                                   return std::vector<double>{lse * lse};
                                 },
                                 row, {static_cast<double>(scale)});
                           } else {
                             const double lse = ref_logsumexp(row);
                             const auto p = ref_softmax(row);
                             for (double v : p) g.push_back(scale * 2 * lse * v);
                           }
                           for (int e = 0; e < experts; ++e) expected[static_cast<size_t>(t * experts + e)] += g[static_cast<size_t>(e)];
                         }
                         c.expect_close("dlogits", c.download(dlogits, "dlogits"), expected,
                                        mode == CaseMode::grad ? tolerances(DType::f32).finite_difference
                                                               : tolerances(DType::f32).reference,
                                        0.1);
                       }});
    }
  }
}

// --- capacity, counts, bias -------------------------------------------------------------------------

// Megatron's apply_router_token_dropping with mt's tie order (see moe_router.h).
void ref_capacity_drop(std::vector<float>& probs, std::vector<uint8_t>& map, int64_t rows, int experts,
                       int64_t capacity, MoeDropPolicy policy, bool pad) {
  for (int e = 0; e < experts; ++e) {
    std::vector<uint8_t> keep(static_cast<size_t>(rows), 1);
    if (capacity < rows) {
      std::vector<double> key(static_cast<size_t>(rows));
      for (int64_t t = 0; t < rows; ++t) {
        key[static_cast<size_t>(t)] = policy == MoeDropPolicy::probs ? probs[static_cast<size_t>(t * experts + e)]
                                                                     : map[static_cast<size_t>(t * experts + e)];
      }
      std::fill(keep.begin(), keep.end(), uint8_t{0});
      for (int32_t t : ref_top(key, static_cast<int>(capacity))) keep[static_cast<size_t>(t)] = 1;
    }
    for (int64_t t = 0; t < rows; ++t) {
      uint8_t& m = map[static_cast<size_t>(t * experts + e)];
      m = pad ? keep[static_cast<size_t>(t)] : static_cast<uint8_t>(m && keep[static_cast<size_t>(t)]);
      if (!m) probs[static_cast<size_t>(t * experts + e)] = 0.0f;
    }
  }
}

void add_capacity(std::vector<OpCase>& cases) {
  uint32_t seed = 980;
  for (MoeDropPolicy policy : {MoeDropPolicy::probs, MoeDropPolicy::position})
    for (bool pad : {false, true})
      for (auto [rows, experts, k, capacity] :
           {std::tuple<int64_t, int, int, int64_t>{1, 4, 2, 1}, {40, 8, 2, 7}, {40, 8, 2, 40}, {33, 5, 3, 4},
            {64, 64, 8, 1}}) {
        const uint32_t s = seed++;
        const std::string name = shape_text({{"rows", rows}, {"E", experts}, {"k", k}, {"capacity", capacity}}) +
                                 (policy == MoeDropPolicy::probs ? " probs" : " position") +
                                 (pad ? " padded" : "");
        cases.push_back({.op = OpId::moe_router_capacity_drop,
                         .mode = CaseMode::forward,
                         .name = name,
                         .also_uses = {OpId::moe_router_topk},
                         .thread_count_independent = true,
                         .body = [=](CaseContext& c) {
                           auto logits = random_floats(static_cast<size_t>(rows * experts), s, -2.0f, 2.0f);
                           // Quantised logits: equal probs across rows, so the tie order matters.
                           for (float& v : logits) v = std::round(v * 2.0f) / 2.0f;
                           const MoeTopkParams p = make_params(experts, k, MoeScoreFunction::softmax, true);
                           const DeviceArray<float> probs = c.allocated<float>(rows * experts);
                           const DeviceArray<uint8_t> map = c.allocated<uint8_t>(rows * experts);
                           c.ops().moe_router_topk(c.upload(logits).data, nullptr, rows, p,
                                                   c.allocated<int32_t>(rows * k).data, probs.data, map.data,
                                                   c.stream());
                           auto expected_probs = c.download(probs, "probs before");
                           auto expected_map = c.download(map, "map before");
                           c.ops().moe_router_capacity_drop(probs.data, map.data, rows, experts, capacity, policy, pad,
                                                            c.stream());
                           ref_capacity_drop(expected_probs, expected_map, rows, experts, capacity, policy, pad);
                           c.expect_equal("routing_map", c.download(map, "map"), expected_map);
                           c.expect_equal("probs", c.download(probs, "probs"), expected_probs);
                         }});
      }
  cases.push_back({.op = OpId::moe_router_capacity_drop,
                   .mode = CaseMode::property,
                   .name = "position keeps each expert's earliest routed rows; probs the highest, ties by row",
                   .body = [](CaseContext& c) {
                     // One expert, 5 rows, routed rows 1, 2, 4; capacity 2.
                     const std::vector<uint8_t> map0{0, 1, 1, 0, 1};
                     const std::vector<float> probs0{0.0f, 0.5f, 0.9f, 0.0f, 0.7f};
                     const std::vector<float> tied{0.0f, 0.5f, 0.9f, 0.0f, 0.5f};
                     auto dropped_map = [&](const std::vector<float>& p0, MoeDropPolicy policy) {
                       const DeviceArray<float> probs = c.upload(p0);
                       const DeviceArray<uint8_t> map = c.upload(map0);
                       c.ops().moe_router_capacity_drop(probs.data, map.data, 5, 1, 2, policy, false, c.stream());
                       return c.download(map, "map");
                     };
                     c.expect_equal("position", dropped_map(probs0, MoeDropPolicy::position),
                                    std::vector<uint8_t>{0, 1, 1, 0, 0});
                     c.expect_equal("probs", dropped_map(probs0, MoeDropPolicy::probs),
                                    std::vector<uint8_t>{0, 0, 1, 0, 1});
                     c.expect_equal("probs with a tie", dropped_map(tied, MoeDropPolicy::probs),
                                    std::vector<uint8_t>{0, 1, 1, 0, 0});
                     // Capacity 4 with padding: 3 routed rows, then the earliest unrouted row (0).
                     const DeviceArray<float> probs = c.upload(probs0);
                     const DeviceArray<uint8_t> map = c.upload(map0);
                     c.ops().moe_router_capacity_drop(probs.data, map.data, 5, 1, 4, MoeDropPolicy::position, true,
                                                      c.stream());
                     c.expect_equal("padded map", c.download(map, "padded"), std::vector<uint8_t>{1, 1, 1, 0, 1});
                     c.expect_equal("padded probs", c.download(probs, "padded probs"), probs0);
                   }});
}

void add_counts_and_bias(std::vector<OpCase>& cases) {
  for (auto [rows, experts] : {std::pair<int64_t, int>{1, 1}, {37, 8}, {300, 64}}) {
    cases.push_back({.op = OpId::moe_router_tokens_per_expert,
                     .mode = CaseMode::accumulate,
                     .name = shape_text({{"rows", rows}, {"E", experts}}) + ": column sums added twice",
                     .body = [rows, experts](CaseContext& c) {
                       const auto draws = random_floats(static_cast<size_t>(rows * experts), 990, 0.0f, 1.0f);
                       std::vector<uint8_t> map(draws.size());
                       for (size_t i = 0; i < map.size(); ++i) map[i] = draws[i] < 0.3f;
                       const DeviceArray<uint8_t> d_map = c.upload(map);
                       const DeviceArray<float> counts = c.filled(experts, 2.0f);
                       for (int call = 0; call < 2; ++call)
                         c.ops().moe_router_tokens_per_expert(d_map.data, rows, experts, counts.data, c.stream());
                       std::vector<float> expected(static_cast<size_t>(experts), 2.0f);
                       for (int64_t t = 0; t < rows; ++t)
                         for (int e = 0; e < experts; ++e) expected[static_cast<size_t>(e)] += 2.0f * map[static_cast<size_t>(t * experts + e)];
                       c.expect_equal("counts", c.download(counts, "counts"), expected);
                     }});
  }
  cases.push_back({.op = OpId::moe_router_expert_bias_update,
                   .mode = CaseMode::forward,
                   .name = "b += rate sign(mean - c), sign(0) = 0",
                   .body = [](CaseContext& c) {
                     const std::vector<float> counts{10, 2, 6, 6, 0, 12};  // mean 6
                     const std::vector<float> bias0{0.1f, -0.2f, 0.0f, 0.3f, 0.5f, -0.5f};
                     const DeviceArray<float> bias = c.upload(bias0);
                     c.ops().moe_router_expert_bias_update(bias.data, c.upload(counts).data, 6, 1e-3f, c.stream());
                     const std::vector<float> expected{0.1f - 1e-3f, -0.2f + 1e-3f, 0.0f, 0.3f, 0.5f + 1e-3f,
                                                       -0.5f - 1e-3f};
                     c.expect_equal("bias", c.download(bias, "bias"), expected);
                   }});
}

}  // namespace

void add_moe_router_cases(std::vector<OpCase>& cases) {
  add_topk_forward(cases);
  add_topk_properties(cases);
  add_topk_backward(cases);
  add_aux_loss(cases);
  add_z_loss(cases);
  add_capacity(cases);
  add_counts_and_bias(cases);
}

}  // namespace mt::harness
