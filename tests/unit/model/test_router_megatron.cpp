// mt's MoE router (lib/model/moe/router.h, on the CPU op table) against Megatron-Core's own router
// functions: tests/golden/moe/router_goldens.json, written by tests/golden/moe/make_router_goldens.py
// with megatron-core 0.16.1 and torch 2.6.0 on fixed random fp32 logits (versions and format in
// tests/golden/moe/README.md). A reference loop written from the same reading of Megatron shares
// its misreadings; these goldens come from Megatron's code itself: top-k routing (softmax,
// pre-softmax, sigmoid with expert bias, group-limited, scaling) and its backward, capacity
// dropping under both policies with and without padding, the three aux losses and the z-loss with
// their gradients w.r.t. the logits (over two thread ranks where Megatron reduces over a group),
// and the expert-bias update. fp32 values within 1e-6 relative; maps and the bias update exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/ops.h"
#include "core/error.h"
#include "model/moe/router.h"
#include "../thread_communicator.h"

namespace mt::model::moe {
namespace {

using nlohmann::json;

const json& goldens() {
  static const json parsed = [] {
    std::ifstream in(MT_SOURCE_DIR "/tests/golden/moe/router_goldens.json");
    if (!in) throw std::runtime_error("tests/golden/moe/router_goldens.json (written by make_router_goldens.py)");
    return json::parse(in);
  }();
  return parsed;
}

std::vector<float> floats(const json& values) {
  std::vector<float> out;
  out.reserve(values.size());
  for (const json& v : values) out.push_back(static_cast<float>(v.get<double>()));
  return out;
}

std::vector<uint8_t> flags(const json& values) {
  std::vector<uint8_t> out;
  out.reserve(values.size());
  for (const json& v : values) out.push_back(static_cast<uint8_t>(v.get<int>()));
  return out;
}

// The slice [index * count, (index + 1) * count) of a flat golden list.
std::vector<float> slice(const std::vector<float>& all, int64_t index, int64_t count) {
  return {all.begin() + index * count, all.begin() + (index + 1) * count};
}

// Within `relative` of the tensor's largest magnitude: fp32 sums in another order differ by a few
// ulps of their terms, and a gradient's small entries are differences of terms of the size of its
// large ones (softmax backward: p_i (g_i - sum_j p_j g_j)), so they carry that absolute error.
// Gradients get 2e-6: Megatron's own fp32 aux-loss gradient is up to 9.2e-7 of the largest entry
// away from a float64 evaluation of the same formula (global_aux_softmax, micro-batch 2), and mt's
// error adds to it.
constexpr double kGradTolerance = 2e-6;
void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, const std::string& what,
                  double relative = 1e-6) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double largest = 0.0;
  for (float e : expected) largest = std::max(largest, std::fabs(static_cast<double>(e)));
  int reported = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i];
    const double tolerance = relative * largest + 1e-30;
    if (std::fabs(actual[i] - e) > tolerance && reported++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: mt " << actual[i] << ", Megatron " << e;
    }
  }
}

void expect_value_close(double actual, double expected, const std::string& what, double relative = 1e-6) {
  EXPECT_NEAR(actual, expected, relative * std::fabs(expected)) << what;
}

ScoreFunction score_function_of(const json& c) { return parse_score_function(c["score_function"].get<std::string>()); }

// A router that only routes (no aux loss, no z-loss, dropless), the case's top-k settings.
RouterOptions routing_options(const json& c) {
  RouterOptions options;
  options.num_experts = c["experts"].get<int>();
  options.topk = c["topk"].get<int>();
  options.score_function = score_function_of(c);
  options.pre_softmax = c.value("pre_softmax", false);
  options.num_groups = c.value("num_groups", 0);
  options.group_topk = c.value("group_topk", 0);
  if (c.contains("scaling_factor") && !c["scaling_factor"].is_null()) {
    options.topk_scaling_factor = static_cast<float>(c["scaling_factor"].get<double>());
  }
  options.enable_expert_bias = c.contains("expert_bias") && !c["expert_bias"].is_null();
  options.load_balancing_type = LoadBalancingType::none;
  return options;
}

// One router call's buffers on the CPU table (device pointers are host pointers there).
struct RouterCall {
  RouterCall(const Router& router, const RouterRows& rows)
      : probs(static_cast<size_t>(rows.rows * router.options().num_experts)),
        routing_map(probs.size()),
        dlogits(probs.size()),
        topk_indices(static_cast<size_t>(router.saved_index_count(rows.rows))),
        aux_weights(static_cast<size_t>(std::max<int64_t>(router.aux_weight_count(rows), 1))) {}
  RouterSaved saved() { return {topk_indices.data(), aux_weights.data()}; }

  std::vector<float> probs;
  std::vector<uint8_t> routing_map;
  std::vector<float> dlogits;
  std::vector<int32_t> topk_indices;
  std::vector<float> aux_weights;
};

TEST(RouterMegatron, GoldensWereMadeByMegatronCore) {
  const json& generator = goldens()["generator"];
  EXPECT_EQ(generator["megatron_core"].get<std::string>(), "0.16.1");
  EXPECT_FALSE(goldens()["topk_routing"].empty());
}

// topk_routing_with_score_function: probs, map, and d sum(grad_probs * probs) / d logits.
TEST(RouterMegatron, TopkRoutingAndItsBackwardMatchMegatron) {
  for (const json& c : goldens()["topk_routing"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    Router router(routing_options(c), backend::cpu_ops(), backend::Stream{}, RouterGroups{});
    const std::vector<float> logits = floats(c["logits"]);
    const std::vector<float> bias = c["expert_bias"].is_null() ? std::vector<float>{} : floats(c["expert_bias"]);
    const RouterRows rows{c["tokens"].get<int64_t>()};
    RouterCall call(router, rows);
    router.forward(logits.data(), bias.empty() ? nullptr : bias.data(), rows, true, nullptr,
                           call.probs.data(), call.routing_map.data(), call.saved());
    EXPECT_EQ(call.routing_map, flags(c["routing_map"])) << name << ": routing map";
    expect_close(call.probs, floats(c["probs"]), name + " probs");
    const std::vector<float> grad_probs = floats(c["grad_probs"]);
    router.backward(logits.data(), call.routing_map.data(), call.saved(), rows, grad_probs.data(), 0.0f,
                    call.dlogits.data());
    expect_close(call.dlogits, floats(c["grad_logits"]), name + " dlogits", kGradTolerance);
  }
}

// Megatron's TransformerConfig refuses post-softmax top-1 ("Please use --moe-router-pre-softmax
// when topk is 1": softmax over one logit has no gradient); mt refuses it by name too.
TEST(RouterMegatron, PostSoftmaxTopOneIsRefusedAsMegatronRefusesIt) {
  RouterOptions options;
  options.num_experts = 4;
  options.topk = 1;
  EXPECT_THROW(validate_router_options(options), UsageError);
  options.pre_softmax = true;
  EXPECT_NO_THROW(validate_router_options(options));
}

RouterOptions dropping_options(const json& c) {
  RouterOptions options = routing_options(c);
  options.capacity_factor = c["capacity_factor"].get<double>();
  options.token_drop_policy = parse_token_drop_policy(c["drop_policy"].get<std::string>());
  options.pad_expert_input_to_capacity = c["pad_to_capacity"].get<bool>();
  return options;
}

std::vector<float> column_sums(const std::vector<uint8_t>& map, int64_t rows, int experts) {
  std::vector<float> sums(static_cast<size_t>(experts), 0.0f);
  for (int64_t t = 0; t < rows; ++t) {
    for (int e = 0; e < experts; ++e) sums[static_cast<size_t>(e)] += map[static_cast<size_t>(t * experts + e)];
  }
  return sums;
}

// Megatron's final map with its choices among tied rows replaced by mt's rule. Megatron keeps an
// expert's `capacity` rows with torch.topk, whose order among equal values torch leaves
// unspecified (and which, on the CPU, keeps neither the earliest nor the latest of the tied rows):
// under policy position every routed row ties, and with padding every unrouted row does. Where the
// golden marks an entry `tied`, mt keeps the same NUMBER of the expert's tied rows as Megatron, but
// the lowest rows (the earliest tokens, as the issue asks); every other entry is Megatron's.
std::vector<uint8_t> megatron_map_with_lower_rows_among_ties(const json& c) {
  const int64_t tokens = c["tokens"].get<int64_t>();
  const int experts = c["experts"].get<int>();
  std::vector<uint8_t> map = flags(c["routing_map"]);
  const std::vector<uint8_t> tied = flags(c["tied"]);
  for (int e = 0; e < experts; ++e) {
    int64_t kept_among_tied = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      const size_t i = static_cast<size_t>(t * experts + e);
      if (tied[i]) kept_among_tied += map[i];
    }
    for (int64_t t = 0; t < tokens; ++t) {
      const size_t i = static_cast<size_t>(t * experts + e);
      if (tied[i]) map[i] = kept_among_tied-- > 0 ? 1 : 0;
    }
  }
  return map;
}

std::vector<float> masked(const std::vector<float>& probs, const std::vector<uint8_t>& map) {
  std::vector<float> out(probs.size());
  for (size_t i = 0; i < probs.size(); ++i) out[i] = map[i] ? probs[i] : 0.0f;
  return out;
}

// apply_router_token_dropping on Megatron's own top-k output (the op entry), and the Router from
// the logits (routing, then dropping, then the expert-bias counts of the final map), against
// Megatron's output with ties resolved as megatron_map_with_lower_rows_among_ties says.
TEST(RouterMegatron, TokenDroppingMatchesMegatron) {
  const backend::Ops& ops = backend::cpu_ops();
  for (const json& c : goldens()["token_dropping"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const int64_t tokens = c["tokens"].get<int64_t>();
    const int experts = c["experts"].get<int>();
    const RouterOptions options = dropping_options(c);
    EXPECT_EQ(expert_capacity(options, tokens), c["capacity"].get<int64_t>()) << name;
    const std::vector<uint8_t> expected_map = megatron_map_with_lower_rows_among_ties(c);
    if (c["ties_by_lower_row"].get<bool>()) {
      ASSERT_EQ(expected_map, flags(c["routing_map"])) << name;
    }
    const std::vector<float> expected_probs = masked(floats(c["probs_in"]), expected_map);
    expect_close(masked(floats(c["probs_in"]), flags(c["routing_map"])), floats(c["probs"]), name + " golden");

    std::vector<float> probs = floats(c["probs_in"]);
    std::vector<uint8_t> routing_map = flags(c["routing_map_in"]);
    ops.moe_router_capacity_drop(probs.data(), routing_map.data(), tokens, experts, c["capacity"].get<int64_t>(),
                                 options.token_drop_policy == TokenDropPolicy::probs ? kernels::MoeDropPolicy::probs
                                                                                     : kernels::MoeDropPolicy::position,
                                 options.pad_expert_input_to_capacity, backend::Stream{});
    EXPECT_EQ(routing_map, expected_map) << name << ": op entry's map";
    expect_close(probs, expected_probs, name + " op entry's probs");

    Router router(options, ops, backend::Stream{}, RouterGroups{});
    const std::vector<float> logits = floats(c["logits"]);
    const RouterRows rows{tokens};
    RouterCall call(router, rows);
    std::vector<float> tokens_per_expert(static_cast<size_t>(experts), 0.0f);
    router.forward(logits.data(), nullptr, rows, true, tokens_per_expert.data(), call.probs.data(),
                   call.routing_map.data(), call.saved());
    EXPECT_EQ(call.routing_map, expected_map) << name << ": Router's map";
    expect_close(call.probs, expected_probs, name + " Router's probs");
    EXPECT_EQ(tokens_per_expert, column_sums(expected_map, tokens, experts)) << name << ": counts";
  }
}

// Runs body(rank, communicator) on `ranks` threads (communicator null for one rank: alone).
void on_ranks(int ranks, const std::function<void(int, comm::Communicator*)>& body) {
  if (ranks == 1) {
    body(0, nullptr);
    return;
  }
  testing::ThreadGroup group(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&group, &body, r] {
      testing::ThreadCommunicator communicator(group, r);
      body(r, &communicator);
    });
  }
  for (std::thread& t : threads) t.join();
}

// What one rank's router gave for one micro-batch of an aux-loss or z-loss case.
struct RankResult {
  double logged = 0.0;
  std::vector<float> dlogits;
};

// TopKRouter's aux losses: per (micro-batch, rank) the gradient w.r.t. that rank's logits, and the
// logged value (aux / coeff summed over the reduce group). seq_aux_loss: the golden's rank r holds
// positions [r s, (r+1) s) of each of the `batch` sequences (Megatron's [s/TP, b] split), rows
// sample-major, so its row ids are b * (s ranks) + r s + position.
TEST(RouterMegatron, AuxLossesAndTheirGradientsMatchMegatron) {
  for (const json& c : goldens()["aux_loss"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const int ranks = c["ranks"].get<int>();
    const int micro_batches = c["micro_batches"].get<int>();
    const int64_t tokens = c["tokens"].get<int64_t>();
    const int experts = c["experts"].get<int>();
    const int64_t seq_length = c["seq_length"].get<int64_t>();
    const int64_t batch = c["batch"].get<int64_t>();
    const double coeff = c["coeff"].get<double>();
    const LoadBalancingType type = parse_load_balancing_type(c["type"].get<std::string>());
    RouterOptions options = routing_options(c);
    options.load_balancing_type = type;
    options.aux_loss_coeff = static_cast<float>(coeff);
    const std::vector<float> logits = floats(c["logits"]);
    const int64_t count = tokens * experts;
    std::vector<RankResult> results(static_cast<size_t>(micro_batches * ranks));
    on_ranks(ranks, [&](int rank, comm::Communicator* group) {
      RouterGroups groups;
      (type == LoadBalancingType::global_aux_loss ? groups.tp_dp_cp : groups.tp_cp) = group;
      Router router(options, backend::cpu_ops(), backend::Stream{}, groups);
      std::vector<int64_t> row_ids(static_cast<size_t>(tokens));
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t s = 0; s < seq_length; ++s) {
          row_ids[static_cast<size_t>(b * seq_length + s)] = b * seq_length * ranks + rank * seq_length + s;
        }
      }
      RouterRows rows{tokens};
      if (type == LoadBalancingType::seq_aux_loss) rows = {tokens, row_ids.data(), seq_length * ranks, batch};
      const std::vector<float> zeros(static_cast<size_t>(count), 0.0f);
      for (int m = 0; m < micro_batches; ++m) {
        const std::vector<float> mine = slice(logits, m * ranks + rank, count);
        RouterCall call(router, rows);
        const RouterLossValues values = router.forward(mine.data(), nullptr, rows, true, nullptr, call.probs.data(),
                                                       call.routing_map.data(), call.saved());
        router.backward(mine.data(), call.routing_map.data(), call.saved(), rows, zeros.data(), 1.0f,
                        call.dlogits.data());
        RankResult& result = results[static_cast<size_t>(m * ranks + rank)];
        result.logged = values.load_balancing.value_or(std::nan(""));
        result.dlogits = call.dlogits;
      }
    });
    const std::vector<float> golden_values = floats(c["values"]);
    const std::vector<float> golden_grads = floats(c["grad_logits"]);
    for (int m = 0; m < micro_batches; ++m) {
      double group_sum = 0.0;
      for (int r = 0; r < ranks; ++r) group_sum += golden_values[static_cast<size_t>(m * ranks + r)];
      for (int r = 0; r < ranks; ++r) {
        const std::string where = name + " micro-batch " + std::to_string(m) + " rank " + std::to_string(r);
        const RankResult& result = results[static_cast<size_t>(m * ranks + r)];
        expect_value_close(result.logged, group_sum / coeff, where + " logged aux / coeff");
        expect_close(result.dlogits, slice(golden_grads, m * ranks + r, count), where + " dlogits", kGradTolerance);
      }
    }
  }
}

// TopKRouter.apply_z_loss: z_loss_func with coeff / |tp_cp|; its gradient per rank, and the logged
// value (z / (coeff / |tp_cp|) averaged over tp_cp).
TEST(RouterMegatron, ZLossAndItsGradientMatchMegatron) {
  for (const json& c : goldens()["z_loss"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const int ranks = c["ranks"].get<int>();
    const int64_t tokens = c["tokens"].get<int64_t>();
    const int experts = c["experts"].get<int>();
    const double coeff = c["coeff"].get<double>();
    RouterOptions options;
    options.num_experts = experts;
    options.topk = 2;
    options.load_balancing_type = LoadBalancingType::none;
    options.z_loss_coeff = static_cast<float>(coeff);
    const std::vector<float> logits = floats(c["logits"]);
    const int64_t count = tokens * experts;
    std::vector<RankResult> results(static_cast<size_t>(ranks));
    on_ranks(ranks, [&](int rank, comm::Communicator* group) {
      Router router(options, backend::cpu_ops(), backend::Stream{}, RouterGroups{group, nullptr});
      const RouterRows rows{tokens};
      const std::vector<float> mine = slice(logits, rank, count);
      const std::vector<float> zeros(static_cast<size_t>(count), 0.0f);
      RouterCall call(router, rows);
      const RouterLossValues values = router.forward(mine.data(), nullptr, rows, true, nullptr, call.probs.data(),
                                                     call.routing_map.data(), call.saved());
      router.backward(mine.data(), call.routing_map.data(), call.saved(), rows, zeros.data(), 1.0f,
                      call.dlogits.data());
      results[static_cast<size_t>(rank)] = {values.z_loss.value_or(std::nan("")), call.dlogits};
    });
    const std::vector<float> golden_values = floats(c["values"]);
    double logged = 0.0;
    for (float v : golden_values) logged += v / (coeff / ranks) / ranks;
    const std::vector<float> golden_grads = floats(c["grad_logits"]);
    for (int r = 0; r < ranks; ++r) {
      const std::string where = name + " rank " + std::to_string(r);
      expect_value_close(results[static_cast<size_t>(r)].logged, logged, where + " logged z / coeff");
      expect_close(results[static_cast<size_t>(r)].dlogits, slice(golden_grads, r, count), where + " dlogits",
                   kGradTolerance);
    }
  }
}

RouterOptions full_router_options(const json& c) {
  RouterOptions options = routing_options(c);
  options.load_balancing_type = parse_load_balancing_type(c["load_balancing_type"].get<std::string>());
  options.aux_loss_coeff = static_cast<float>(c["aux_loss_coeff"].get<double>());
  options.calculate_per_token_loss = c["calculate_per_token_loss"].get<bool>();
  if (!c["z_loss_coeff"].is_null()) options.z_loss_coeff = static_cast<float>(c["z_loss_coeff"].get<double>());
  if (!c["capacity_factor"].is_null()) {
    options.capacity_factor = c["capacity_factor"].get<double>();
    options.token_drop_policy = parse_token_drop_policy(c["drop_policy"].get<std::string>());
    options.pad_expert_input_to_capacity = c["pad_to_capacity"].get<bool>();
  }
  return options;
}

void expect_logged(const std::optional<double>& mt, const json& megatron, const std::string& what) {
  if (megatron.is_null()) {
    EXPECT_FALSE(mt.has_value()) << what << " logged by mt, not by Megatron";
  } else {
    ASSERT_TRUE(mt.has_value()) << what << " logged by Megatron, not by mt";
    expect_value_close(*mt, megatron.get<double>(), what);
  }
}

// TopKRouter.routing itself (one rank), every step at once in Megatron's order: z-loss, top-k
// (groups, bias, scaling), capacity, aux loss, expert-bias counts; then the probs' backward with
// the attached losses' gradients times the trainer's scale (MoEAuxLossAutoScaler's
// main_loss_backward_scale, and the local tokens under --calculate-per-token-loss), and the logged
// aux / coeff and z / coeff.
TEST(RouterMegatron, WholeTopKRouterMatchesMegatron) {
  for (const json& c : goldens()["full_router"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const int experts = c["experts"].get<int>();
    const int64_t tokens = c["tokens"].get<int64_t>();
    const int64_t count = tokens * experts;
    const RouterOptions options = full_router_options(c);
    Router router(options, backend::cpu_ops(), backend::Stream{}, RouterGroups{});
    std::vector<int64_t> row_ids(static_cast<size_t>(tokens));
    for (int64_t t = 0; t < tokens; ++t) row_ids[static_cast<size_t>(t)] = t;
    RouterRows rows{tokens};
    if (options.load_balancing_type == LoadBalancingType::seq_aux_loss) {
      rows = {tokens, row_ids.data(), c["seq_length"].get<int64_t>(), c["batch"].get<int64_t>()};
    }
    const std::vector<float> bias = c["expert_bias"].is_null() ? std::vector<float>{} : floats(c["expert_bias"]);
    std::vector<float> tokens_per_expert(static_cast<size_t>(experts), 0.0f);
    const std::vector<float> logits = floats(c["logits"]), grad_probs = floats(c["grad_probs"]);
    const std::vector<float> probs = floats(c["probs"]), grads = floats(c["grad_logits"]);
    const std::vector<uint8_t> maps = flags(c["routing_map"]);
    for (int m = 0; m < c["micro_batches"].get<int>(); ++m) {
      const std::string where = name + " micro-batch " + std::to_string(m);
      const std::vector<float> mine = slice(logits, m, count);
      RouterCall call(router, rows);
      const RouterLossValues values =
          router.forward(mine.data(), bias.empty() ? nullptr : bias.data(), rows, true,
                         bias.empty() ? nullptr : tokens_per_expert.data(), call.probs.data(),
                         call.routing_map.data(), call.saved());
      EXPECT_EQ(call.routing_map, std::vector<uint8_t>(maps.begin() + m * count, maps.begin() + (m + 1) * count))
          << where << ": routing map";
      expect_close(call.probs, slice(probs, m, count), where + " probs");
      expect_logged(values.load_balancing, c["logged_aux"][static_cast<size_t>(m)], where + " aux / coeff");
      expect_logged(values.z_loss, c["logged_z"][static_cast<size_t>(m)], where + " z / coeff");
      const std::vector<float> upstream = slice(grad_probs, m, count);
      router.backward(mine.data(), call.routing_map.data(), call.saved(), rows, upstream.data(),
                      static_cast<float>(c["backward_scale"].get<double>()), call.dlogits.data());
      expect_close(call.dlogits, slice(grads, m, count), where + " dlogits", kGradTolerance);
    }
    if (!bias.empty()) {
      EXPECT_EQ(tokens_per_expert, floats(c["tokens_per_expert"])) << name << ": bias counts";
    }
  }
}

// get_updated_expert_bias on counts summed over TP x DP x CP: exact (a step of +-rate, or none at
// the mean).
TEST(RouterMegatron, ExpertBiasUpdateMatchesMegatron) {
  for (const json& c : goldens()["expert_bias_update"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const int experts = c["experts"].get<int>();
    const std::vector<float> counts = floats(c["counts"]);
    const std::vector<float> per_rank = floats(c["counts_per_rank"]);
    std::vector<float> summed(static_cast<size_t>(experts), 0.0f);
    for (size_t i = 0; i < per_rank.size(); ++i) summed[i % static_cast<size_t>(experts)] += per_rank[i];
    ASSERT_EQ(summed, counts) << name;
    std::vector<float> bias = floats(c["expert_bias"]);
    update_expert_bias(backend::cpu_ops(), backend::Stream{}, bias.data(), counts.data(), experts,
                       static_cast<float>(c["rate"].get<double>()));
    EXPECT_EQ(bias, floats(c["updated"])) << name;
  }
}

}  // namespace
}  // namespace mt::model::moe
