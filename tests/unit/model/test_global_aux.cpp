// global_aux_loss (model/moe/router.h, Megatron-Core's TopKRouter._apply_global_aux_loss) over
// two global batches of several micro-batches: each micro-batch's logged value and the counts it
// weighs P with against a double loop written from Megatron's formula (the running mean of the
// counts since the last reset_global_aux_loss_tracker), the reset between the batches showing
// (the second batch's first micro-batch weighs by its own counts only); activation recompute
// (the micro-batches' forwards first, then each one's recompute before its backward, as a
// pipeline runs them) adding nothing and giving the first forwards' weights and gradients bit
// for bit; and the ga_steps count. Layouts (DP = 2 against one rank) are checked through
// mt-train in tests/tools/mt-train-mpi.bats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "model/moe/router.h"

using namespace mt;
using namespace mt::model::moe;

namespace {

constexpr int kExperts = 8, kTopk = 2;
constexpr int64_t kRows = 12;
constexpr float kCoeff = 0.01f;

std::vector<float> random_logits(uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<float> values(static_cast<size_t>(kRows * kExperts));
  for (float& v : values) v = uniform(generator);
  return values;
}

// Megatron's formula in double: P = softmax over E, counts = plain top-k of P, c = running mean
// of the counts over the micro-batches since the reset, aux / coeff = E / (k T^2) sum_i
// (sum_t P_ti) c_i with T = the rows (one rank: |tp_dp_cp| = 1).
struct Reference {
  std::vector<double> counts_sum = std::vector<double>(kExperts, 0.0);
  int steps = 0;

  // The micro-batch's weights c and logged aux / coeff.
  std::pair<std::vector<double>, double> next(const std::vector<float>& logits) {
    std::vector<double> prob_sums(kExperts, 0.0);
    for (int64_t t = 0; t < kRows; ++t) {
      std::vector<double> p(kExperts);
      double max_logit = -INFINITY, sum = 0;
      for (int e = 0; e < kExperts; ++e) max_logit = std::max(max_logit, double(logits[t * kExperts + e]));
      for (int e = 0; e < kExperts; ++e) sum += p[e] = std::exp(logits[t * kExperts + e] - max_logit);
      for (int e = 0; e < kExperts; ++e) prob_sums[e] += p[e] /= sum;
      std::vector<int> order(kExperts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
      for (int j = 0; j < kTopk; ++j) counts_sum[order[j]] += 1;
    }
    ++steps;
    std::vector<double> c(kExperts);
    double dot = 0;
    for (int e = 0; e < kExperts; ++e) dot += prob_sums[e] * (c[e] = counts_sum[e] / steps);
    return {c, kExperts / (kTopk * double(kRows) * kRows) * dot};
  }
  void reset() {
    std::fill(counts_sum.begin(), counts_sum.end(), 0.0);
    steps = 0;
  }
};

RouterOptions global_options() {
  RouterOptions o;
  o.num_experts = kExperts;
  o.topk = kTopk;
  o.load_balancing_type = LoadBalancingType::global_aux_loss;
  o.aux_loss_coeff = kCoeff;
  return o;
}

// One micro-batch's forward (first or recompute) and backward on the CPU table.
struct Pass {
  std::vector<float> probs, weights, dlogits;
  std::vector<uint8_t> map;
  std::vector<int32_t> indices;
  RouterLossValues values;
};

Pass forward(Router& router, const std::vector<float>& logits, bool recompute) {
  Pass pass;
  const size_t n = logits.size();
  pass.probs.assign(n, 0.0f);
  pass.map.assign(n, 0);
  pass.indices.assign(static_cast<size_t>(router.saved_index_count(kRows)), -1);
  const RouterRows rows{kRows, nullptr, kRows, 1};
  pass.weights.assign(static_cast<size_t>(router.aux_weight_count(rows)), -1.0f);
  pass.values = router.forward(logits.data(), nullptr, rows, true, nullptr, pass.probs.data(), pass.map.data(),
                               {pass.indices.data(), pass.weights.data()}, recompute);
  return pass;
}

void backward(Router& router, const std::vector<float>& logits, Pass& pass) {
  const RouterRows rows{kRows, nullptr, kRows, 1};
  const std::vector<float> dprobs(logits.size(), 0.0f);  // the aux loss's gradient alone
  pass.dlogits.assign(logits.size(), 0.0f);
  router.backward(logits.data(), pass.map.data(), {pass.indices.data(), pass.weights.data()}, rows, dprobs.data(),
                  1.0f, pass.dlogits.data());
}

TEST(GlobalAuxLoss, TwoGlobalBatchesFollowTheRunningMeanAndTheReset) {
  const backend::Ops& ops = backend::cpu_ops();
  Router router(global_options(), ops, ops.default_stream(), {});
  Reference reference;
  uint32_t seed = 100;
  for (int batch : {3, 2}) {  // micro-batches per global batch
    for (int m = 0; m < batch; ++m) {
      SCOPED_TRACE("global batch of " + std::to_string(batch) + ", micro-batch " + std::to_string(m));
      const auto logits = random_logits(seed++);
      const Pass pass = forward(router, logits, false);
      const auto [weights, aux_over_coeff] = reference.next(logits);
      EXPECT_EQ(router.global_aux_steps(), m + 1);
      for (int e = 0; e < kExperts; ++e) EXPECT_FLOAT_EQ(pass.weights[e], static_cast<float>(weights[e])) << e;
      ASSERT_TRUE(pass.values.load_balancing.has_value());
      EXPECT_NEAR(*pass.values.load_balancing, aux_over_coeff, 1e-6 * aux_over_coeff);
    }
    // finalize_model_grads: the next global batch starts from its own counts.
    router.reset_global_aux_counts();
    reference.reset();
    EXPECT_EQ(router.global_aux_steps(), 0);
  }
}

TEST(GlobalAuxLoss, RecomputeReusesTheFirstForwardsWeightsAndCountsNothing) {
  const backend::Ops& ops = backend::cpu_ops();
  const std::vector<std::vector<float>> micro = {random_logits(1), random_logits(2), random_logits(3)};
  // Without recompute: forward, backward per micro-batch.
  Router plain(global_options(), ops, ops.default_stream(), {});
  std::vector<Pass> expected;
  for (const auto& logits : micro) {
    expected.push_back(forward(plain, logits, false));
    backward(plain, logits, expected.back());
  }
  // With recompute, as a pipeline runs it: every first forward, then per micro-batch the
  // recompute forward and its backward.
  Router recomputed(global_options(), ops, ops.default_stream(), {});
  for (const auto& logits : micro) forward(recomputed, logits, false);
  for (size_t m = 0; m < micro.size(); ++m) {
    Pass again = forward(recomputed, micro[m], true);
    backward(recomputed, micro[m], again);
    EXPECT_EQ(recomputed.global_aux_steps(), 3) << "a recompute adds no micro-batch";
    EXPECT_EQ(again.weights, expected[m].weights) << "micro-batch " << m;
    EXPECT_EQ(again.dlogits, expected[m].dlogits) << "micro-batch " << m;
    EXPECT_EQ(again.values.load_balancing, expected[m].values.load_balancing) << "micro-batch " << m;
  }
  // A recompute with no first forward since the reset is a bug, not a silent zero weight.
  recomputed.reset_global_aux_counts();
  EXPECT_THROW(forward(recomputed, micro[0], true), Error);
}

}  // namespace
