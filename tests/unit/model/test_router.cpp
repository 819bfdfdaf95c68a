// The MoE router (model/moe/router.h) on the CPU table: the whole forward (z-loss, top-k, capacity
// dropping, aux losses, token counts) against double-precision loops written from Megatron's
// formulas; the backward against central differences of the reference objective (probs, aux
// loss and z-loss together); the aux loss at exactly 1.0 for perfectly balanced routing; the
// reductions over two thread ranks equal to one rank holding both halves (aux_loss,
// seq_aux_loss, global_aux_loss, z-loss, per-token scaling); the same bits on the asynchronous
// CPU table (device memory only through the table's copies); the global aux loss's running mean
// and reset; the expert-bias update; and each bad option refused by its flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "model/moe/router.h"
#include "tests/backend/async_cpu_ops.h"
#include "../thread_communicator.h"

using namespace mt;
using namespace mt::model::moe;

namespace {

const backend::Ops& cpu() { return backend::cpu_ops(); }

std::vector<float> random_floats(size_t n, uint32_t seed, float low = -2.0f, float high = 2.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(n);
  for (float& v : values) v = uniform(generator);
  return values;
}

// --- the reference: Megatron's routing() in double ----------------------------------------------------

std::vector<int32_t> top(const std::vector<double>& values, int k) {
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return values[a] > values[b]; });
  order.resize(static_cast<size_t>(k));
  return order;
}

std::vector<double> softmax(const std::vector<double>& x) {
  const double max_value = *std::max_element(x.begin(), x.end());
  std::vector<double> y(x.size());
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) sum += y[i] = std::exp(x[i] - max_value);
  for (double& v : y) v /= sum;
  return y;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double logsumexp(const std::vector<double>& x) {
  const double max_value = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (double v : x) sum += std::exp(v - max_value);
  return max_value + std::log(sum);
}

std::vector<double> row_of(const std::vector<double>& m, int64_t t, int cols) {
  return {m.begin() + t * cols, m.begin() + (t + 1) * cols};
}

std::vector<int32_t> choose(const std::vector<double>& logits, const std::vector<float>& bias, const RouterOptions& o) {
  std::vector<double> scores = logits;
  if (o.score_function == ScoreFunction::sigmoid) {
    for (size_t e = 0; e < scores.size(); ++e) scores[e] = sigmoid(logits[e]) + (bias.empty() ? 0.0 : bias[e]);
  } else if (o.pre_softmax) {
    scores = softmax(logits);
  }
  if (o.group_topk > 0) {
    const int per_group = o.num_experts / o.num_groups;
    std::vector<double> group_scores(static_cast<size_t>(o.num_groups), 0.0);
    for (int g = 0; g < o.num_groups; ++g) {
      const std::vector<double> group(scores.begin() + g * per_group, scores.begin() + (g + 1) * per_group);
      for (int32_t j : top(group, o.topk / o.group_topk)) group_scores[static_cast<size_t>(g)] += group[static_cast<size_t>(j)];
    }
    const auto kept = top(group_scores, o.group_topk);
    for (int e = 0; e < o.num_experts; ++e)
      if (std::find(kept.begin(), kept.end(), e / per_group) == kept.end()) scores[static_cast<size_t>(e)] = -INFINITY;
  }
  return top(scores, o.topk);
}

std::vector<double> gates(const std::vector<double>& logits, const std::vector<int32_t>& chosen, const RouterOptions& o) {
  std::vector<double> gate(chosen.size());
  if (o.score_function == ScoreFunction::softmax && !o.pre_softmax) {
    for (size_t j = 0; j < chosen.size(); ++j) gate[j] = logits[static_cast<size_t>(chosen[j])];
    gate = softmax(gate);
  } else if (o.score_function == ScoreFunction::softmax) {
    const auto s = softmax(logits);
    for (size_t j = 0; j < chosen.size(); ++j) gate[j] = s[static_cast<size_t>(chosen[j])];
  } else {
    double sum = 0;
    for (size_t j = 0; j < chosen.size(); ++j) sum += gate[j] = sigmoid(logits[static_cast<size_t>(chosen[j])]);
    if (chosen.size() > 1)
      for (double& g : gate) g /= sum + 1e-20;
  }
  for (double& g : gate) g *= o.topk_scaling_factor.value_or(1.0f);
  return gate;
}

std::vector<double> aux_scores(const std::vector<double>& logits, const RouterOptions& o) {
  if (o.score_function == ScoreFunction::softmax) return softmax(logits);
  std::vector<double> s(logits.size());
  double sum = 0;
  for (size_t e = 0; e < s.size(); ++e) sum += s[e] = sigmoid(logits[e]);
  for (double& v : s) v /= sum + 1e-20;
  return s;
}

struct Rows {
  int64_t count;
  std::vector<int64_t> ids;  // token ids (seq_aux_loss)
  int64_t sequence_length = 0, sequences = 0;
  RouterRows view() const { return {count, ids.empty() ? nullptr : ids.data(), sequence_length, sequences}; }
  int64_t group(int64_t t) const { return sequences > 0 ? ids[static_cast<size_t>(t)] / sequence_length : 0; }
};

Rows plain_rows(int64_t count) { return Rows{count, {}, 0, 0}; }

struct Reference {
  std::vector<int32_t> chosen;
  std::vector<double> probs;
  std::vector<uint8_t> map;
  std::vector<double> weights;  // aux counts per (group, expert), one rank = the whole group
  double aux_over_coeff = 0, z_mean = 0;
};

bool seq_aux(const RouterOptions& o) { return o.load_balancing_type == LoadBalancingType::seq_aux_loss; }

void drop(const RouterOptions& o, int64_t rows, Reference& r) {
  const int experts = o.num_experts;
  const int64_t capacity = static_cast<int64_t>(std::ceil(static_cast<double>(rows) * o.topk / experts * *o.capacity_factor));
  if (capacity >= rows) {
    if (o.pad_expert_input_to_capacity) std::fill(r.map.begin(), r.map.end(), uint8_t{1});
    return;
  }
  for (int e = 0; e < experts; ++e) {
    std::vector<double> key(static_cast<size_t>(rows));
    for (int64_t t = 0; t < rows; ++t) {
      const size_t at = static_cast<size_t>(t * experts + e);
      key[static_cast<size_t>(t)] = o.token_drop_policy == TokenDropPolicy::probs ? r.probs[at] : r.map[at];
    }
    std::vector<uint8_t> keep(static_cast<size_t>(rows), 0);
    for (int32_t t : top(key, static_cast<int>(capacity))) keep[static_cast<size_t>(t)] = 1;
    for (int64_t t = 0; t < rows; ++t) {
      const size_t at = static_cast<size_t>(t * experts + e);
      r.map[at] = o.pad_expert_input_to_capacity ? keep[static_cast<size_t>(t)] : (r.map[at] && keep[static_cast<size_t>(t)]);
      if (!r.map[at]) r.probs[at] = 0;
    }
  }
}

// One rank holding every row of its groups.
Reference reference_forward(const RouterOptions& o, const std::vector<float>& logits_f, const std::vector<float>& bias,
                            const Rows& rows) {
  const int experts = o.num_experts, k = o.topk;
  const std::vector<double> logits(logits_f.begin(), logits_f.end());
  Reference r;
  r.probs.assign(logits.size(), 0.0);
  r.map.assign(logits.size(), 0);
  for (int64_t t = 0; t < rows.count; ++t) {
    const auto row = row_of(logits, t, experts);
    const auto chosen = choose(row, bias, o);
    const auto gate = gates(row, chosen, o);
    for (int j = 0; j < k; ++j) {
      r.chosen.push_back(chosen[static_cast<size_t>(j)]);
      r.probs[static_cast<size_t>(t * experts + chosen[static_cast<size_t>(j)])] = gate[static_cast<size_t>(j)];
      r.map[static_cast<size_t>(t * experts + chosen[static_cast<size_t>(j)])] = 1;
    }
    const double lse = logsumexp(row);
    r.z_mean += lse * lse / static_cast<double>(rows.count);
  }
  if (o.capacity_factor) drop(o, rows.count, r);
  const int64_t groups = seq_aux(o) ? rows.sequences : 1;
  r.weights.assign(static_cast<size_t>(groups * experts), 0.0);
  std::vector<double> prob_sums(r.weights.size(), 0.0);
  for (int64_t t = 0; t < rows.count; ++t) {
    const auto p = aux_scores(row_of(logits, t, experts), o);
    const int64_t base = rows.group(t) * experts;
    for (int32_t e : top(p, k)) r.weights[static_cast<size_t>(base + e)] += 1;
    for (int e = 0; e < experts; ++e) prob_sums[static_cast<size_t>(base + e)] += p[static_cast<size_t>(e)];
  }
  const double total = seq_aux(o) ? static_cast<double>(rows.sequence_length) : static_cast<double>(rows.count);
  double dot = 0;
  for (size_t i = 0; i < prob_sums.size(); ++i) dot += prob_sums[i] * r.weights[i];
  r.aux_over_coeff = dot * experts / (k * total * total) / static_cast<double>(groups);
  return r;
}

// The objective the backward differentiates: sum(dprobs * probs) + factor (aux + z), with the
// choices, the kept map and the aux counts of the forward held fixed.
double reference_objective(const RouterOptions& o, const std::vector<double>& logits, const Reference& fixed,
                           const std::vector<float>& dprobs, const Rows& rows, double factor) {
  const int experts = o.num_experts, k = o.topk;
  double objective = 0, z = 0, aux = 0;
  for (int64_t t = 0; t < rows.count; ++t) {
    const auto row = row_of(logits, t, experts);
    const std::vector<int32_t> chosen(fixed.chosen.begin() + t * k, fixed.chosen.begin() + (t + 1) * k);
    const auto gate = gates(row, chosen, o);
    for (int j = 0; j < k; ++j) {
      const size_t at = static_cast<size_t>(t * experts + chosen[static_cast<size_t>(j)]);
      if (fixed.map[at]) objective += dprobs[at] * gate[static_cast<size_t>(j)];
    }
    const double lse = logsumexp(row);
    z += lse * lse / static_cast<double>(rows.count);
    const auto p = aux_scores(row, o);
    for (int e = 0; e < experts; ++e) aux += p[static_cast<size_t>(e)] * fixed.weights[static_cast<size_t>(rows.group(t) * experts + e)];
  }
  const int64_t groups = seq_aux(o) ? rows.sequences : 1;
  const double total = seq_aux(o) ? static_cast<double>(rows.sequence_length) : static_cast<double>(rows.count);
  if (o.aux_loss_coeff > 0) objective += factor * o.aux_loss_coeff * experts / (k * total * total) / groups * aux;
  if (o.z_loss_coeff) objective += factor * *o.z_loss_coeff * z;
  return objective;
}

// --- running the Router -----------------------------------------------------------------------------

struct RouterRun {
  std::vector<float> probs, dlogits, counts;
  std::vector<uint8_t> map;
  std::vector<int32_t> indices;
  std::vector<float> weights;
  RouterLossValues values;
};

RouterRun run_router(Router& router, const std::vector<float>& logits, const std::vector<float>& bias, const Rows& rows,
               const std::vector<float>& dprobs, float factor) {
  const int experts = router.options().num_experts;
  RouterRun run;
  const size_t n = static_cast<size_t>(rows.count * experts);
  run.probs.assign(n, -1.0f);
  run.map.assign(n, 7);
  run.indices.assign(static_cast<size_t>(router.saved_index_count(rows.count)), -1);
  run.weights.assign(static_cast<size_t>(router.aux_weight_count(rows.view())), -1.0f);
  run.counts.assign(static_cast<size_t>(experts), 0.0f);
  const RouterSaved saved{run.indices.data(), run.weights.empty() ? nullptr : run.weights.data()};
  run.values = router.forward(logits.data(), bias.empty() ? nullptr : bias.data(), rows.view(), true,
                              run.counts.data(), run.probs.data(), run.map.data(), saved);
  run.dlogits.assign(n, 9.0f);
  router.backward(logits.data(), run.map.data(), saved, rows.view(), dprobs.data(), factor, run.dlogits.data());
  return run;
}

Rows sequence_rows(int64_t sequences, int64_t sequence_length, uint32_t seed) {
  Rows rows{sequences * sequence_length, {}, sequence_length, sequences};
  rows.ids.resize(static_cast<size_t>(rows.count));
  std::iota(rows.ids.begin(), rows.ids.end(), int64_t{0});
  std::shuffle(rows.ids.begin(), rows.ids.end(), std::mt19937(seed));
  return rows;
}

RouterOptions mixtral_like() {
  RouterOptions o;
  o.num_experts = 8;
  o.topk = 2;
  o.aux_loss_coeff = 0.01f;
  o.z_loss_coeff = 0.001f;
  return o;
}

RouterOptions deepseek_like() {
  RouterOptions o;
  o.num_experts = 16;
  o.topk = 4;
  o.score_function = ScoreFunction::sigmoid;
  o.num_groups = 4;
  o.group_topk = 2;
  o.topk_scaling_factor = 2.5f;
  o.enable_expert_bias = true;
  o.load_balancing_type = LoadBalancingType::seq_aux_loss;
  o.aux_loss_coeff = 1e-4f;
  return o;
}

struct Scenario {
  std::string name;
  RouterOptions options;
  Rows rows;
  bool bias = false;
};

std::vector<Scenario> scenarios() {
  std::vector<Scenario> list;
  list.push_back({"mixtral aux_loss + z", mixtral_like(), plain_rows(24)});
  RouterOptions pre = mixtral_like();
  pre.pre_softmax = true;
  pre.topk = 1;
  pre.capacity_factor = 1.0;
  list.push_back({"pre-softmax k=1, capacity 1.0 probs", pre, plain_rows(24)});
  RouterOptions padded = mixtral_like();
  padded.capacity_factor = 0.75;
  padded.token_drop_policy = TokenDropPolicy::position;
  padded.pad_expert_input_to_capacity = true;
  list.push_back({"capacity 0.75 position, padded", padded, plain_rows(24)});
  list.push_back({"deepseek seq_aux_loss, groups, bias", deepseek_like(), sequence_rows(3, 8, 5), true});
  RouterOptions global = mixtral_like();
  global.score_function = ScoreFunction::sigmoid;
  global.load_balancing_type = LoadBalancingType::global_aux_loss;
  global.capacity_factor = 1.5;
  list.push_back({"sigmoid global_aux_loss, capacity 1.5", global, plain_rows(24)});
  return list;
}

TEST(Router, ForwardEqualsTheReferenceLoops) {
  for (const Scenario& s : scenarios()) {
    SCOPED_TRACE(s.name);
    const RouterOptions& o = s.options;
    const auto logits = random_floats(static_cast<size_t>(s.rows.count * o.num_experts), 11);
    const auto bias = s.bias ? random_floats(static_cast<size_t>(o.num_experts), 12, -0.1f, 0.1f) : std::vector<float>{};
    Router router(o, cpu(), cpu().default_stream(), {});
    const RouterRun run = run_router(router, logits, bias, s.rows, std::vector<float>(logits.size(), 0.0f), 1.0f);
    const Reference expected = reference_forward(o, logits, bias, s.rows);
    EXPECT_EQ(run.indices, expected.chosen);
    EXPECT_EQ(run.map, expected.map);
    for (size_t i = 0; i < run.probs.size(); ++i) ASSERT_NEAR(run.probs[i], expected.probs[i], 1e-6) << i;
    std::vector<float> counts(static_cast<size_t>(o.num_experts), 0.0f);
    for (size_t i = 0; i < expected.map.size(); ++i) counts[i % static_cast<size_t>(o.num_experts)] += expected.map[i];
    EXPECT_EQ(run.counts, counts) << "tokens per expert after dropping";
    ASSERT_TRUE(run.values.load_balancing.has_value());
    EXPECT_NEAR(*run.values.load_balancing, expected.aux_over_coeff, 1e-6 * expected.aux_over_coeff);
    EXPECT_EQ(run.values.z_loss.has_value(), o.z_loss_coeff.has_value());
    if (o.z_loss_coeff) {
      EXPECT_NEAR(*run.values.z_loss, expected.z_mean, 1e-6 * expected.z_mean);
    }
    for (size_t i = 0; i < run.weights.size(); ++i) EXPECT_EQ(run.weights[i], expected.weights[i]) << i;
  }
}

TEST(Router, BackwardEqualsCentralDifferencesOfProbsAuxAndZLoss) {
  for (const Scenario& s : scenarios()) {
    SCOPED_TRACE(s.name);
    RouterOptions o = s.options;
    o.aux_loss_coeff = 0.3f;  // large enough that the aux loss's share of the gradient is checked
    o.z_loss_coeff = 0.02f;
    const auto logits = random_floats(static_cast<size_t>(s.rows.count * o.num_experts), 21);
    const auto bias = s.bias ? random_floats(static_cast<size_t>(o.num_experts), 22, -0.1f, 0.1f) : std::vector<float>{};
    const auto dprobs = random_floats(logits.size(), 23, -1.0f, 1.0f);
    const float factor = 0.7f;
    Router router(o, cpu(), cpu().default_stream(), {});
    const RouterRun run = run_router(router, logits, bias, s.rows, dprobs, factor);
    const Reference fixed = reference_forward(o, logits, bias, s.rows);
    std::vector<double> at(logits.begin(), logits.end());
    double worst = 0;
    for (size_t i = 0; i < at.size(); ++i) {
      const double h = 1e-6;
      std::vector<double> plus = at, minus = at;
      plus[i] += h;
      minus[i] -= h;
      const double numeric = (reference_objective(o, plus, fixed, dprobs, s.rows, factor) -
                              reference_objective(o, minus, fixed, dprobs, s.rows, factor)) /
                             (2 * h);
      worst = std::max(worst, std::abs(run.dlogits[i] - numeric));
      ASSERT_NEAR(run.dlogits[i], numeric, 2e-5 * (1 + std::abs(numeric))) << "logit " << i;
    }
    EXPECT_LT(worst, 1e-4);
  }
}

TEST(Router, AuxLossIsOneForPerfectlyBalancedRouting) {
  // 8 rows, 8 experts, top-2: row t prefers experts t and t+1 (mod 8) with different margins, so
  // every expert gets 2 tokens (f_i = 1/E) while the probabilities are far from uniform.
  RouterOptions o = mixtral_like();
  o.z_loss_coeff.reset();
  const int experts = 8;
  std::vector<float> logits(static_cast<size_t>(experts * experts), 0.0f);
  for (int t = 0; t < experts; ++t) {
    logits[static_cast<size_t>(t * experts + t)] = 3.0f + 0.1f * t;
    logits[static_cast<size_t>(t * experts + (t + 1) % experts)] = 2.0f - 0.05f * t;
  }
  for (LoadBalancingType type : {LoadBalancingType::aux_loss, LoadBalancingType::global_aux_loss}) {
    o.load_balancing_type = type;
    Router router(o, cpu(), cpu().default_stream(), {});
    const RouterRun run = run_router(router, logits, {}, plain_rows(experts), std::vector<float>(logits.size(), 0.0f), 1.0f);
    EXPECT_NEAR(*run.values.load_balancing, 1.0, 1e-6) << load_balancing_type_name(type);
  }
  // All of it routed to experts 0 and 1: the loss rises above 1.
  std::vector<float> collapsed(static_cast<size_t>(experts * experts), 0.0f);
  for (int t = 0; t < experts; ++t) collapsed[static_cast<size_t>(t * experts)] = collapsed[static_cast<size_t>(t * experts + 1)] = 3.0f;
  o.load_balancing_type = LoadBalancingType::aux_loss;
  Router router(o, cpu(), cpu().default_stream(), {});
  const RouterRun run = run_router(router, collapsed, {}, plain_rows(experts), std::vector<float>(collapsed.size(), 0.0f), 1.0f);
  EXPECT_GT(*run.values.load_balancing, 3.0);
}

// Two thread ranks, each holding half the rows (seq_aux_loss: half of every sequence, as CP
// splits them), against one rank holding all: the same probs and maps, dlogits and logged values.
void expect_two_ranks_equal_one(RouterOptions o, const Rows& all, bool bias_on) {
  const int experts = o.num_experts;
  const auto logits = random_floats(static_cast<size_t>(all.count * experts), 31);
  const auto bias = bias_on ? random_floats(static_cast<size_t>(experts), 32, -0.1f, 0.1f) : std::vector<float>{};
  const auto dprobs = random_floats(logits.size(), 33, -1.0f, 1.0f);
  Router single(o, cpu(), cpu().default_stream(), {});
  const RouterRun one = run_router(single, logits, bias, all, dprobs, 0.5f);

  const int64_t half = all.count / 2;
  std::vector<RouterRun> halves(2);
  mt::testing::ThreadGroup group(2);
  mt::testing::run_ranks(2, [&](int rank) {
    mt::testing::ThreadCommunicator communicator(group, rank);
    RouterGroups groups{&communicator, &communicator};
    Router router(o, cpu(), cpu().default_stream(), groups);
    const size_t begin = static_cast<size_t>(rank * half * experts), end = begin + static_cast<size_t>(half * experts);
    Rows mine{half, {}, all.sequence_length, all.sequences};
    if (!all.ids.empty()) mine.ids.assign(all.ids.begin() + rank * half, all.ids.begin() + (rank + 1) * half);
    halves[static_cast<size_t>(rank)] =
        run_router(router, {logits.begin() + static_cast<ptrdiff_t>(begin), logits.begin() + static_cast<ptrdiff_t>(end)},
                   bias, mine, {dprobs.begin() + static_cast<ptrdiff_t>(begin), dprobs.begin() + static_cast<ptrdiff_t>(end)},
                   0.5f);
  });
  std::vector<float> dlogits = halves[0].dlogits;
  dlogits.insert(dlogits.end(), halves[1].dlogits.begin(), halves[1].dlogits.end());
  std::vector<uint8_t> map = halves[0].map;
  map.insert(map.end(), halves[1].map.begin(), halves[1].map.end());
  EXPECT_EQ(map, one.map);
  for (size_t i = 0; i < dlogits.size(); ++i) ASSERT_NEAR(dlogits[i], one.dlogits[i], 2e-6 * (1 + std::abs(one.dlogits[i]))) << i;
  for (const RouterRun& h : halves) {
    EXPECT_NEAR(*h.values.load_balancing, *one.values.load_balancing, 1e-5 * *one.values.load_balancing);
    if (o.z_loss_coeff) {
      EXPECT_NEAR(*h.values.z_loss, *one.values.z_loss, 1e-5 * *one.values.z_loss);
    }
    EXPECT_EQ(h.weights, one.weights);
  }
}

TEST(Router, ReductionsOverTwoThreadRanksEqualOneRankHoldingBoth) {
  RouterOptions aux = mixtral_like();
  {
    SCOPED_TRACE("aux_loss + z");
    expect_two_ranks_equal_one(aux, plain_rows(24), false);
  }
  {
    SCOPED_TRACE("aux_loss + z, per-token loss");
    aux.calculate_per_token_loss = true;
    expect_two_ranks_equal_one(aux, plain_rows(24), false);
  }
  {
    SCOPED_TRACE("seq_aux_loss, rows of each sequence on both ranks");
    expect_two_ranks_equal_one(deepseek_like(), sequence_rows(3, 8, 7), true);
  }
  {
    SCOPED_TRACE("global_aux_loss over tp_dp_cp");
    RouterOptions global = mixtral_like();
    global.load_balancing_type = LoadBalancingType::global_aux_loss;
    expect_two_ranks_equal_one(global, plain_rows(24), false);
  }
}

// The Router on `ops` with every tensor in the table's device memory, copied in and out.
template <typename T>
backend::DeviceBuffer<T> upload(const backend::Ops& ops, const std::vector<T>& values) {
  backend::DeviceBuffer<T> buffer(ops, static_cast<int64_t>(values.size()), backend::MemoryCategory::activations);
  if (!values.empty()) {
    ops.copy(buffer.data(), values.data(), static_cast<int64_t>(values.size() * sizeof(T)),
             backend::CopyKind::host_to_device, ops.default_stream());
  }
  return buffer;
}

template <typename T>
std::vector<T> download(const backend::Ops& ops, const backend::DeviceBuffer<T>& buffer) {
  std::vector<T> values(static_cast<size_t>(buffer.size()));
  ops.copy(values.data(), buffer.data(), static_cast<int64_t>(values.size() * sizeof(T)),
           backend::CopyKind::device_to_host, ops.default_stream());
  ops.synchronize(ops.default_stream());
  return values;
}

RouterRun run_on_device(const backend::Ops& ops, const RouterOptions& o, const std::vector<float>& logits,
                        const std::vector<float>& bias, const Rows& rows, const std::vector<float>& dprobs) {
  const backend::Stream stream = ops.default_stream();
  Router router(o, ops, stream, {});
  const auto d_logits = upload(ops, logits), d_bias = upload(ops, bias), d_dprobs = upload(ops, dprobs);
  const auto d_ids = upload(ops, rows.ids);
  const RouterRows view{rows.count, rows.ids.empty() ? nullptr : d_ids.data(), rows.sequence_length, rows.sequences};
  const int64_t n = static_cast<int64_t>(logits.size());
  backend::DeviceBuffer<float> probs(ops, n, backend::MemoryCategory::activations),
      dlogits(ops, n, backend::MemoryCategory::activations),
      counts(ops, o.num_experts, backend::MemoryCategory::activations),
      weights(ops, std::max<int64_t>(1, router.aux_weight_count(view)), backend::MemoryCategory::activations);
  backend::DeviceBuffer<uint8_t> map(ops, n, backend::MemoryCategory::activations);
  backend::DeviceBuffer<int32_t> indices(ops, router.saved_index_count(rows.count), backend::MemoryCategory::activations);
  const RouterSaved saved{indices.data(), weights.data()};
  RouterRun run;
  run.values = router.forward(d_logits.data(), bias.empty() ? nullptr : d_bias.data(), view, true, counts.data(),
                              probs.data(), map.data(), saved);
  router.backward(d_logits.data(), map.data(), saved, view, d_dprobs.data(), 0.5f, dlogits.data());
  run.probs = download(ops, probs);
  run.map = download(ops, map);
  run.indices = download(ops, indices);
  run.counts = download(ops, counts);
  run.weights = download(ops, weights);
  run.dlogits = download(ops, dlogits);
  return run;
}

TEST(Router, TheAsynchronousTableGivesTheCpuTablesBits) {
  for (const Scenario& s : scenarios()) {
    SCOPED_TRACE(s.name);
    const RouterOptions& o = s.options;
    const auto logits = random_floats(static_cast<size_t>(s.rows.count * o.num_experts), 61);
    const auto bias = s.bias ? random_floats(static_cast<size_t>(o.num_experts), 62, -0.1f, 0.1f) : std::vector<float>{};
    const auto dprobs = random_floats(logits.size(), 63, -1.0f, 1.0f);
    const RouterRun expected = run_on_device(cpu(), o, logits, bias, s.rows, dprobs);
    const RouterRun queued = run_on_device(mt::test_backend::async_cpu_ops(), o, logits, bias, s.rows, dprobs);
    EXPECT_EQ(queued.probs, expected.probs);
    EXPECT_EQ(queued.map, expected.map);
    EXPECT_EQ(queued.indices, expected.indices);
    EXPECT_EQ(queued.counts, expected.counts);
    EXPECT_EQ(queued.weights, expected.weights);
    EXPECT_EQ(queued.dlogits, expected.dlogits);
    EXPECT_EQ(queued.values.load_balancing, expected.values.load_balancing);
    EXPECT_EQ(queued.values.z_loss, expected.values.z_loss);
  }
}

TEST(Router, GlobalAuxLossWeighsByTheRunningMeanUntilReset) {
  RouterOptions o = mixtral_like();
  o.load_balancing_type = LoadBalancingType::global_aux_loss;
  o.z_loss_coeff.reset();
  Router router(o, cpu(), cpu().default_stream(), {});
  const auto first = random_floats(16 * 8, 41), second = random_floats(16 * 8, 42);
  const std::vector<float> zeros(first.size(), 0.0f);
  const RouterRun a = run_router(router, first, {}, plain_rows(16), zeros, 1.0f);
  const RouterRun b = run_router(router, second, {}, plain_rows(16), zeros, 1.0f);
  const Reference ra = reference_forward(o, first, {}, plain_rows(16)), rb = reference_forward(o, second, {}, plain_rows(16));
  for (size_t i = 0; i < b.weights.size(); ++i) {
    EXPECT_EQ(a.weights[i], ra.weights[i]);
    EXPECT_FLOAT_EQ(b.weights[i], (ra.weights[i] + rb.weights[i]) / 2) << "micro-batch 2 weighs by the mean of both";
  }
  router.reset_global_aux_counts();
  const RouterRun c = run_router(router, second, {}, plain_rows(16), zeros, 1.0f);
  for (size_t i = 0; i < c.weights.size(); ++i) EXPECT_EQ(c.weights[i], rb.weights[i]) << "after reset";
}

TEST(Router, EvaluationForwardComputesNoLossAndCountsOnlyWhenAsked) {
  const RouterOptions o = mixtral_like();
  Router router(o, cpu(), cpu().default_stream(), {});
  const auto logits = random_floats(10 * 8, 51);
  std::vector<float> probs(logits.size()), counts(8, 1.0f);
  std::vector<uint8_t> map(logits.size());
  std::vector<int32_t> indices(20);
  const Rows rows = plain_rows(10);
  const RouterLossValues values =
      router.forward(logits.data(), nullptr, rows.view(), false, nullptr, probs.data(), map.data(), {indices.data(), nullptr});
  EXPECT_FALSE(values.load_balancing.has_value());
  EXPECT_FALSE(values.z_loss.has_value());
  router.forward(logits.data(), nullptr, rows.view(), false, counts.data(), probs.data(), map.data(), {indices.data(), nullptr});
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0.0f), 8.0f + 10 * 2) << "each row adds k counts";
}

TEST(Router, CapacityIsMegatronsCeilOfRowsTimesKOverETimesFactor) {
  RouterOptions o = mixtral_like();
  o.capacity_factor = 1.25;
  EXPECT_EQ(expert_capacity(o, 24), 8);   // 24*2/8*1.25 = 7.5
  EXPECT_EQ(expert_capacity(o, 32), 10);  // 10 exactly
  EXPECT_EQ(expert_capacity(o, 1), 1);
}

TEST(Router, ExpertBiasMovesTowardTheMeanCount) {
  std::vector<float> bias{0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<float> counts{1, 7, 4, 4};  // mean 4
  update_expert_bias(cpu(), cpu().default_stream(), bias.data(), counts.data(), 4, 0.001f);
  EXPECT_EQ(bias, (std::vector<float>{0.001f, -0.001f, 0.0f, 0.0f}));
}

TEST(Router, BadOptionsAreRefusedByFlag) {
  auto refused = [](const std::function<void(RouterOptions&)>& change, const std::string& flag) {
    RouterOptions o = mixtral_like();
    change(o);
    try {
      validate_router_options(o);
      ADD_FAILURE() << "accepted a bad " << flag;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  refused([](RouterOptions& o) { o.num_experts = 0; }, "--num-experts");
  refused([](RouterOptions& o) { o.topk = 9; }, "--moe-router-topk");
  refused([](RouterOptions& o) { o.topk = 1; }, "--moe-router-topk");  // post-softmax k = 1
  refused([](RouterOptions& o) { o.group_topk = 2; }, "--moe-router-group-topk");
  refused([](RouterOptions& o) { o.num_groups = 3, o.group_topk = 1; }, "--moe-router-num-groups");
  refused([](RouterOptions& o) { o.num_groups = 4, o.group_topk = 5; }, "--moe-router-group-topk");
  refused([](RouterOptions& o) { o.topk = 4, o.num_groups = 4, o.group_topk = 1; }, "--moe-router-topk");
  refused([](RouterOptions& o) { o.enable_expert_bias = true; }, "--moe-router-enable-expert-bias");
  refused([](RouterOptions& o) { o.topk_scaling_factor = 0.0f; }, "--moe-router-topk-scaling-factor");
  refused([](RouterOptions& o) { o.aux_loss_coeff = -1; }, "--moe-aux-loss-coeff");
  refused([](RouterOptions& o) { o.z_loss_coeff = -1.0f; }, "--moe-z-loss-coeff");
  refused([](RouterOptions& o) { o.capacity_factor = 0.0; }, "--moe-expert-capacity-factor");
  refused([](RouterOptions& o) { o.pad_expert_input_to_capacity = true; }, "--moe-pad-expert-input-to-capacity");
  EXPECT_THROW(parse_score_function("sqrtsoftplus"), UsageError);
  EXPECT_THROW(parse_load_balancing_type("sinkhorn"), UsageError);
  EXPECT_THROW(parse_token_drop_policy("random"), UsageError);
  EXPECT_EQ(parse_load_balancing_type("seq_aux_loss"), LoadBalancingType::seq_aux_loss);
  EXPECT_STREQ(load_balancing_log_name(LoadBalancingType::global_aux_loss), "global_load_balancing_loss");
}

}  // namespace
