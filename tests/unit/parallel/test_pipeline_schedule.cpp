// Pipeline schedules: warm-up counts against Megatron's formulas, Megatron's worked example of the
// interleaved table, and a simulator that runs every rank's action list at once over a grid of
// (p, v, m, G) with point-to-point semantics of two strengths (SendSemantics below). The schedule
// must finish (no deadlock), every message must meet the receive it was meant for (same pass,
// micro-batch and virtual stage), every micro-batch must run forward then backward through every
// chunk exactly once, and the activation slots must match the formulas of megatron-facts. And
// every rank's order against Megatron's, as tests/golden/pipeline_orders.py derives it from
// Megatron's schedule table (committed as tests/golden/pipeline_orders.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "parallel/pipeline_schedule.h"

namespace {

using mt::parallel::pipeline_actions;
using mt::parallel::ActivationSlotPool;
using mt::parallel::pipeline_activation_slots;
using mt::parallel::pipeline_slot_pools;
using mt::parallel::pipeline_warmup_passes;
using mt::parallel::PipelineAction;
using mt::parallel::PipelinePass;
using mt::parallel::PipelineShape;

// One point-to-point operation: `rank` sends to or receives from `peer` the input of
// (pass, micro-batch, virtual stage of the receiving pass).
struct Message {
  bool send;
  int rank;
  int peer;
  PipelinePass pass;
  int micro_batch;
  int receiver_stage;
  bool operator<(const Message& o) const {
    return std::tie(send, rank, peer, pass, micro_batch, receiver_stage) <
           std::tie(o.send, o.rank, o.peer, o.pass, o.micro_batch, o.receiver_stage);
  }
  bool matches(const Message& o) const {
    return send != o.send && rank == o.peer && peer == o.rank && pass == o.pass && micro_batch == o.micro_batch &&
           receiver_stage == o.receiver_stage;
  }
};

int virtual_stage(const PipelineShape& shape, int rank, const PipelineAction& a) {
  return a.chunk * shape.stages + rank;
}

std::optional<Message> receive_of(const PipelineShape& shape, int rank, const PipelineAction& a) {
  if (a.recv_from < 0) return std::nullopt;
  return Message{false, rank, a.recv_from, a.pass, a.micro_batch, virtual_stage(shape, rank, a)};
}

std::optional<Message> send_of(const PipelineShape& shape, int rank, const PipelineAction& a) {
  if (a.send_to < 0) return std::nullopt;
  const int step = a.pass == PipelinePass::forward ? 1 : -1;
  return Message{true, rank, a.send_to, a.pass, a.micro_batch, virtual_stage(shape, rank, a) + step};
}

// How sends behave. rendezvous: each rank posts the send of its last output together with the
// receive of its next input as one batch (Megatron's send_forward_recv_backward /
// batch_isend_irecv) and waits until every operation of the batch has met its partner's (a send
// completes only when the matching receive is posted). buffered: a send is posted after the pass
// and never blocks the sender (MPI_Isend, waited at the end of the step); a receive blocks until
// the message it names (by tag) has been sent.
enum class SendSemantics { rendezvous, buffered };

struct SimulationResult {
  bool finished = false;
  std::string failure;
  std::vector<int> activation_slots;  // per rank: most forwards held at once
};

// Records one pass of rank r in `result`; false (with result.failure) when it breaks an order.
struct PassLedger {
  std::vector<std::map<std::pair<int, int>, int>> forwards, backwards;  // (mb, chunk) -> runs
  std::vector<int> held;
  explicit PassLedger(int p) : forwards(p), backwards(p), held(p, 0) {}

  bool run(int r, const PipelineAction& a, SimulationResult& result) {
    const std::pair<int, int> key{a.micro_batch, a.chunk};
    if (a.pass == PipelinePass::forward) {
      ++forwards[r][key];
      result.activation_slots[r] = std::max(result.activation_slots[r], ++held[r]);
      return true;
    }
    if (forwards[r][key] != 1) {
      result.failure = "rank " + std::to_string(r) + " runs " + to_string(a) + " before its forward";
      return false;
    }
    ++backwards[r][key];
    --held[r];
    return true;
  }

  // Every (micro-batch, chunk) once forward and (unless forward-only) once backward.
  bool complete(const PipelineShape& shape, SimulationResult& result) {
    for (int r = 0; r < shape.stages; ++r) {
      for (int mb = 0; mb < shape.micro_batches; ++mb) {
        for (int c = 0; c < shape.chunks; ++c) {
          const int fwd = forwards[r][{mb, c}], bwd = backwards[r][{mb, c}];
          if (fwd != 1 || bwd != (shape.forward_only ? 0 : 1)) {
            result.failure = "rank " + std::to_string(r) + " ran micro-batch " + std::to_string(mb) + " chunk " +
                             std::to_string(c) + " forward " + std::to_string(fwd) + "x, backward " +
                             std::to_string(bwd) + "x";
            return false;
          }
        }
      }
    }
    return true;
  }
};

std::string deadlock(const std::vector<size_t>& position) {
  std::string state = "deadlock:";
  for (size_t r = 0; r < position.size(); ++r) {
    state += " rank " + std::to_string(r) + " stuck at step " + std::to_string(position[r]) + ";";
  }
  return state;
}

// Rendezvous: batch i of a rank = {send of action i-1's output, receive of action i's input};
// action i runs once batch i has completed; a final batch sends the last output.
using ActionLists = std::vector<std::vector<PipelineAction>>;

SimulationResult simulate_rendezvous(const PipelineShape& shape, const ActionLists& lists) {
  const int p = shape.stages;
  std::vector<size_t> next_batch(p, 0);         // batch index being waited on
  std::vector<std::vector<Message>> posted(p);  // its operations not yet matched
  PassLedger ledger(p);
  SimulationResult result;
  result.activation_slots.assign(p, 0);

  const auto post = [&](int r) {
    const size_t i = next_batch[r];
    posted[r].clear();
    if (i > 0) {
      if (auto s = send_of(shape, r, lists[r][i - 1])) posted[r].push_back(*s);
    }
    if (i < lists[r].size()) {
      if (auto m = receive_of(shape, r, lists[r][i])) posted[r].push_back(*m);
    }
  };
  for (int r = 0; r < p; ++r) post(r);

  for (;;) {
    bool progress = false;
    // Match operations posted at the same time on both sides.
    for (int r = 0; r < p; ++r) {
      for (size_t a = 0; a < posted[r].size();) {
        const Message op = posted[r][a];
        auto& peer_ops = posted[op.peer];
        auto partner = std::find_if(peer_ops.begin(), peer_ops.end(), [&](const Message& o) { return op.matches(o); });
        if (partner == peer_ops.end()) {
          ++a;
          continue;
        }
        peer_ops.erase(partner);
        posted[r].erase(posted[r].begin() + static_cast<long>(a));
        progress = true;
      }
    }
    // Ranks whose batch completed run their next action and post the following batch.
    bool all_done = true;
    for (int r = 0; r < p; ++r) {
      if (next_batch[r] > lists[r].size()) continue;  // finished
      all_done = false;
      if (!posted[r].empty()) continue;
      const size_t i = next_batch[r];
      if (i < lists[r].size() && !ledger.run(r, lists[r][i], result)) return result;
      ++next_batch[r];
      if (next_batch[r] <= lists[r].size()) post(r);
      progress = true;
    }
    if (all_done) break;
    if (!progress) {
      result.failure = deadlock(next_batch);
      return result;
    }
  }
  result.finished = ledger.complete(shape, result);
  return result;
}

// Buffered: receives block in program order until their message has been sent.
SimulationResult simulate_buffered(const PipelineShape& shape, const ActionLists& lists) {
  const int p = shape.stages;
  std::vector<size_t> next(p, 0);
  std::set<Message> in_flight;  // sends not yet received, stored as the receive they wait for
  PassLedger ledger(p);
  SimulationResult result;
  result.activation_slots.assign(p, 0);
  for (;;) {
    bool progress = false, all_done = true;
    for (int r = 0; r < p; ++r) {
      while (next[r] < lists[r].size()) {
        const PipelineAction& a = lists[r][next[r]];
        if (auto receive = receive_of(shape, r, a)) {
          auto message = in_flight.find(*receive);
          if (message == in_flight.end()) break;  // blocked
          in_flight.erase(message);
        }
        if (!ledger.run(r, a, result)) return result;
        if (auto send = send_of(shape, r, a)) {
          in_flight.insert(Message{false, send->peer, r, send->pass, send->micro_batch, send->receiver_stage});
        }
        ++next[r];
        progress = true;
      }
      all_done = all_done && next[r] == lists[r].size();
    }
    if (all_done) break;
    if (!progress) {
      result.failure = deadlock(next);
      return result;
    }
  }
  result.finished = in_flight.empty() && ledger.complete(shape, result);
  if (!in_flight.empty()) result.failure = std::to_string(in_flight.size()) + " messages never received";
  return result;
}

SimulationResult simulate(const PipelineShape& shape, const ActionLists& lists,
                          SendSemantics semantics) {
  return semantics == SendSemantics::rendezvous ? simulate_rendezvous(shape, lists) : simulate_buffered(shape, lists);
}

ActionLists all_lists(const PipelineShape& shape) {
  ActionLists lists;
  for (int r = 0; r < shape.stages; ++r) lists.push_back(pipeline_actions(shape, r));
  return lists;
}

std::string order(const std::vector<PipelineAction>& actions) {
  std::string text;
  for (const PipelineAction& a : actions) text += (text.empty() ? "" : " ") + to_string(a);
  return text;
}

bool megatron_accepts(int p, int v, int m, int g) {
  if (v == 1) return true;
  return p <= g && g <= m && (m % g == 0 || m % g >= p);
}

// Every accepted (p, v, m, G) with p <= 5, v <= 3, m <= 12.
std::vector<PipelineShape> shape_grid() {
  std::vector<PipelineShape> grid;
  for (int p = 1; p <= 5; ++p) {
    for (int v = 1; v <= (p == 1 ? 1 : 3); ++v) {
      for (int m = 1; m <= 12; ++m) {
        for (int g = (v == 1 ? p : 1); g <= (v == 1 ? p : m); ++g) {
          if (megatron_accepts(p, v, m, g)) grid.push_back({p, v, m, g, false});
        }
      }
    }
  }
  return grid;
}

std::string describe(const PipelineShape& s) {
  return "p=" + std::to_string(s.stages) + " v=" + std::to_string(s.chunks) + " m=" + std::to_string(s.micro_batches) +
         " G=" + std::to_string(s.group_size);
}

TEST(PipelineSchedule, WarmupFollowsMegatronsFormulas) {
  for (const PipelineShape& s : shape_grid()) {
    for (int r = 0; r < s.stages; ++r) {
      const int total = s.micro_batches * s.chunks;
      // schedules.py: 1F1B min(p - r - 1, m); interleaved min(2 (p - r - 1) + (v - 1) G, m v).
      const int expected = s.chunks == 1 ? std::min(s.stages - r - 1, s.micro_batches)
                                         : std::min(2 * (s.stages - r - 1) + (s.chunks - 1) * s.group_size, total);
      ASSERT_EQ(pipeline_warmup_passes(s, r), expected) << describe(s) << " rank " << r;
      // The list starts with exactly that many forwards (then a backward, unless all are warm-up).
      const auto actions = pipeline_actions(s, r);
      ASSERT_EQ(actions.size(), size_t(2 * total));
      int leading_forwards = 0;
      while (leading_forwards < total && actions[size_t(leading_forwards)].pass == PipelinePass::forward) {
        ++leading_forwards;
      }
      ASSERT_EQ(leading_forwards, expected == total ? total : expected + 1) << describe(s) << " rank " << r;
    }
  }
}

TEST(PipelineSchedule, EveryAcceptedShapeRunsToCompletionWithoutDeadlock) {
  int shapes = 0;
  for (const PipelineShape& s : shape_grid()) {
    const auto lists = all_lists(s);
    const SimulationResult buffered = simulate(s, lists, SendSemantics::buffered);
    ASSERT_TRUE(buffered.finished) << describe(s) << ": " << buffered.failure;
    if (s.chunks == 1) {  // 1F1B also runs with blocking sends
      const SimulationResult rendezvous = simulate(s, lists, SendSemantics::rendezvous);
      ASSERT_TRUE(rendezvous.finished) << describe(s) << ": " << rendezvous.failure;
    }
    ++shapes;
  }
  EXPECT_EQ(shapes, 278);  // p <= 5, v <= 3, m <= 12, every G Megatron accepts
}

TEST(PipelineSchedule, InterleavedNeedsSendsThatDoNotBlock) {
  // The first rank pushes G chunk-0 forwards before it receives chunk 1's first input from the
  // last rank, whose send of that input is still waiting: with blocking sends it hangs, as
  // Megatron's would without NCCL's buffered sends. The trainer posts sends non-blocking.
  PipelineShape s{2, 2, 4, 4, true};
  EXPECT_FALSE(simulate(s, all_lists(s), SendSemantics::rendezvous).finished);
  EXPECT_TRUE(simulate(s, all_lists(s), SendSemantics::buffered).finished);
}

TEST(PipelineSchedule, ForwardOnlyRunsEveryForwardInTableOrder) {
  for (PipelineShape s : shape_grid()) {
    s.forward_only = true;
    const auto lists = all_lists(s);
    for (const auto& actions : lists) {
      ASSERT_EQ(actions.size(), size_t(s.micro_batches * s.chunks));
      for (const PipelineAction& a : actions) ASSERT_EQ(a.pass, PipelinePass::forward);
    }
    const SimulationResult result = simulate(s, lists, SendSemantics::buffered);
    ASSERT_TRUE(result.finished) << describe(s) << ": " << result.failure;
  }
}

TEST(PipelineSchedule, ActivationSlotsMatchTheFormulas) {
  for (const PipelineShape& s : shape_grid()) {
    const auto lists = all_lists(s);
    const SimulationResult result = simulate(s, lists, SendSemantics::buffered);
    ASSERT_TRUE(result.finished) << describe(s);
    for (int r = 0; r < s.stages; ++r) {
      const int slots = pipeline_activation_slots(lists[size_t(r)]);
      ASSERT_EQ(slots, result.activation_slots[size_t(r)]) << describe(s) << " rank " << r;
      if (s.chunks == 1) {
        // megatron-facts: 1F1B stage r stores at most min(p - r, m) micro-batches.
        ASSERT_EQ(slots, std::min(s.stages - r, s.micro_batches)) << describe(s) << " rank " << r;
      } else {
        // Interleaved: warm-up forwards plus the steady state's one forward ahead, capped at m v.
        const int warmup = 2 * (s.stages - r - 1) + (s.chunks - 1) * s.group_size;
        ASSERT_EQ(slots, std::min(warmup + 1, s.micro_batches * s.chunks)) << describe(s) << " rank " << r;
      }
    }
  }
}

TEST(PipelineSchedule, ActivationSlotsPerChunkSumToAtLeastTheRanksAndCountThatChunkOnly) {
  // PP2 VP2 m=5 G=3, rank 0 (order below): chunk 0 runs F0.0 .. F4.0 before B0.0, chunk 1
  // holds F0.1 F1.1 F2.1 at most; the rank as a whole never more than 6.
  const std::vector<PipelineAction> actions = pipeline_actions({2, 2, 5, 3, false}, 0);
  EXPECT_EQ(pipeline_activation_slots(actions, 0), 5);
  EXPECT_EQ(pipeline_activation_slots(actions, 1), 3);
  EXPECT_EQ(pipeline_activation_slots(actions), 6);
  for (const PipelineShape& s : shape_grid()) {
    for (int r = 0; r < s.stages; ++r) {
      const auto list = pipeline_actions(s, r);
      int sum = 0;
      for (int c = 0; c < s.chunks; ++c) sum += pipeline_activation_slots(list, c);
      ASSERT_GE(sum, pipeline_activation_slots(list)) << describe(s) << " rank " << r;
      if (s.chunks == 1) {
        ASSERT_EQ(pipeline_activation_slots(list, 0), pipeline_activation_slots(list));
      }
    }
  }
}

TEST(PipelineSchedule, InterleavedFirstStageMemoryIsMegatronsPenalty) {
  // With G = p and enough micro-batches, rank 0 holds p v + p - 1 chunk activations of L/(p v)
  // layers each: p micro-batches of L/p layers times 1 + (p - 1)/(p v) (Korthikanti et al.).
  for (int p = 2; p <= 4; ++p) {
    for (int v = 2; v <= 3; ++v) {
      const PipelineShape s{p, v, 4 * p, p, false};
      const int slots = pipeline_activation_slots(pipeline_actions(s, 0));
      EXPECT_DOUBLE_EQ(double(slots) / (p * v), 1.0 + double(p - 1) / (p * v)) << describe(s);
    }
  }
}

TEST(PipelineSchedule, MegatronsWorkedExampleOfTheInterleavedTable) {
  // megatron-facts section 6: PP2 VP2 m=5 G=3 runs micro-batches 0 1 2 0 1 2 3 4 3 4 through
  // chunks 0 0 0 1 1 1 0 0 1 1. Rank 1 warms up 2 (2-1-1) + 1*3 = 3 forwards.
  const PipelineShape s{2, 2, 5, 3, false};
  EXPECT_EQ(order(pipeline_actions(s, 1)),
            "F0.0 F1.0 F2.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.0 B0.0 F4.0 B1.0 F3.1 B2.0 F4.1 B3.1 B4.1 B3.0 B4.0");
  // Rank 0 warms up 2 + 3 = 5 forwards.
  EXPECT_EQ(order(pipeline_actions(s, 0)),
            "F0.0 F1.0 F2.0 F0.1 F1.1 F2.1 B0.1 F3.0 B1.1 F4.0 B2.1 F3.1 B0.0 F4.1 B1.0 B2.0 B3.1 B4.1 B3.0 B4.0");
}

TEST(PipelineSchedule, OneFOneBOrderAndPartners) {
  const PipelineShape s{4, 1, 6, 4, false};
  EXPECT_EQ(order(pipeline_actions(s, 0)), "F0.0 F1.0 F2.0 F3.0 B0.0 F4.0 B1.0 F5.0 B2.0 B3.0 B4.0 B5.0");
  EXPECT_EQ(order(pipeline_actions(s, 3)), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 F4.0 B4.0 F5.0 B5.0");
  // Rank 1: activations from rank 0, to rank 2; grads from rank 2, to rank 0.
  const auto middle = pipeline_actions(s, 1);
  EXPECT_EQ(middle.front(), (PipelineAction{PipelinePass::forward, 0, 0, 0, 2}));
  EXPECT_EQ(middle.back(), (PipelineAction{PipelinePass::backward, 5, 0, 2, 0}));
  // The ends of the model: no input for the first forward, no output for the first stage's grads.
  EXPECT_EQ(pipeline_actions(s, 0).front(), (PipelineAction{PipelinePass::forward, 0, 0, -1, 1}));
  EXPECT_EQ(pipeline_actions(s, 3).front(), (PipelineAction{PipelinePass::forward, 0, 0, 2, -1}));
  EXPECT_EQ(pipeline_actions(s, 3)[1], (PipelineAction{PipelinePass::backward, 0, 0, -1, 2}));
}

TEST(PipelineSchedule, VirtualStagesWrapFromTheLastRankToTheFirst) {
  const PipelineShape s{2, 2, 2, 2, false};
  const auto last = pipeline_actions(s, 1);
  // Rank 1 chunk 0 (virtual stage 1) feeds rank 0 chunk 1 (virtual stage 2).
  EXPECT_EQ(last.front(), (PipelineAction{PipelinePass::forward, 0, 0, 0, 0}));
  const auto first = pipeline_actions(s, 0);
  const auto chunk1 = std::find_if(first.begin(), first.end(), [](const PipelineAction& a) {
    return a.pass == PipelinePass::forward && a.chunk == 1;
  });
  ASSERT_NE(chunk1, first.end());
  EXPECT_EQ(*chunk1, (PipelineAction{PipelinePass::forward, 0, 1, 1, 1}));
}

TEST(PipelineSchedule, TheSimulatorCatchesBrokenOrders) {
  const PipelineShape s{3, 1, 4, 3, false};
  auto lists = all_lists(s);
  ASSERT_TRUE(simulate(s, lists, SendSemantics::rendezvous).finished);
  // Blocking sends: the middle rank waiting for micro-batch 1 while micro-batch 0 is offered.
  std::swap(lists[1][0], lists[1][1]);
  EXPECT_FALSE(simulate(s, lists, SendSemantics::rendezvous).finished);
  // The first rank sending micro-batch 2 before 1.
  lists = all_lists(s);
  std::swap(lists[0][1], lists[0][2]);
  EXPECT_FALSE(simulate(s, lists, SendSemantics::rendezvous).finished);
  // Either semantics: the first rank waiting for micro-batch 0's grad before sending its forward.
  lists = all_lists(s);
  std::rotate(lists[0].begin(), lists[0].begin() + 3, lists[0].begin() + 4);  // B0 first
  EXPECT_EQ(to_string(lists[0][0]), "B0.0");
  EXPECT_FALSE(simulate(s, lists, SendSemantics::buffered).finished);
  EXPECT_FALSE(simulate(s, lists, SendSemantics::rendezvous).finished);
  // The last stage running a backward before its forward.
  lists = all_lists(s);
  std::swap(lists[2][0], lists[2][1]);
  const SimulationResult early = simulate(s, lists, SendSemantics::buffered);
  EXPECT_FALSE(early.finished);
  EXPECT_NE(early.failure.find("before its forward"), std::string::npos) << early.failure;
  // A backward never run.
  lists = all_lists(s);
  lists[2].pop_back();
  EXPECT_FALSE(simulate(s, lists, SendSemantics::buffered).finished);
  lists[0].pop_back();
  lists[1].pop_back();
  const SimulationResult missing = simulate(s, lists, SendSemantics::buffered);
  EXPECT_FALSE(missing.finished);
  EXPECT_NE(missing.failure.find("backward 0x"), std::string::npos) << missing.failure;
}

TEST(PipelineSchedule, ShapesMegatronRejectsAreErrors) {
  EXPECT_THROW(pipeline_actions({1, 2, 4, 1, false}, 0), mt::Error);  // virtual stages without a pipeline
  EXPECT_THROW(pipeline_actions({2, 2, 4, 1, false}, 0), mt::Error);  // G < p
  EXPECT_THROW(pipeline_actions({2, 2, 4, 5, false}, 0), mt::Error);  // G > m
  EXPECT_THROW(pipeline_actions({3, 2, 7, 3, false}, 0), mt::Error);  // 7 mod 3 = 1 < p
  EXPECT_THROW(pipeline_actions({2, 1, 4, 2, false}, 2), mt::Error);  // no rank 2
  EXPECT_NO_THROW(pipeline_actions({3, 2, 8, 4, false}, 0));           // 8 mod 4 = 0
}

TEST(PipelineSchedule, ShapeComesFromTheParallelConfig) {
  mt::parallel::ParallelConfig c;
  c.pipeline_model_parallel_size = 4;
  c.num_layers_per_virtual_pipeline_stage = 2;
  const PipelineShape s = mt::parallel::pipeline_shape(c, 16, 8);
  EXPECT_EQ(s.stages, 4);
  EXPECT_EQ(s.chunks, 2);
  EXPECT_EQ(s.micro_batches, 8);
  EXPECT_EQ(s.group_size, 4);  // default G = p
  EXPECT_FALSE(s.forward_only);
}

}  // namespace

TEST(PipelineSchedule, EveryRanksOrderEqualsMegatronsFromTheGoldenFile) {
  std::ifstream in(MT_SOURCE_DIR "/tests/golden/pipeline_orders.json");
  ASSERT_TRUE(in) << "tests/golden/pipeline_orders.json (written by tests/golden/pipeline_orders.py)";
  const auto golden = nlohmann::json::parse(in);
  int cases = 0;
  for (const auto& c : golden.at("cases")) {
    PipelineShape s;
    s.stages = c.at("p").get<int>();
    s.chunks = c.at("v").get<int>();
    s.micro_batches = c.at("m").get<int>();
    s.group_size = c.at("G").is_null() ? 1 : c.at("G").get<int>();
    s.forward_only = c.at("forward_only").get<bool>();
    ASSERT_EQ(c.at("ranks").size(), static_cast<size_t>(s.stages)) << describe(s);
    for (int r = 0; r < s.stages; ++r) {
      const std::vector<PipelineAction> actions = pipeline_actions(s, r);
      EXPECT_EQ(order(actions), c.at("ranks").at(static_cast<size_t>(r)).get<std::string>())
          << describe(s) << " rank " << r;
      // Every micro-batch runs forward (and, training, backward) exactly once on every chunk.
      std::map<std::tuple<PipelinePass, int, int>, int> runs;
      for (const PipelineAction& a : actions) ++runs[{a.pass, a.micro_batch, a.chunk}];
      for (int mb = 0; mb < s.micro_batches; ++mb) {
        for (int chunk = 0; chunk < s.chunks; ++chunk) {
          EXPECT_EQ((runs[{PipelinePass::forward, mb, chunk}]), 1) << describe(s) << " rank " << r << " F" << mb << "." << chunk;
          EXPECT_EQ((runs[{PipelinePass::backward, mb, chunk}]), s.forward_only ? 0 : 1)
              << describe(s) << " rank " << r << " B" << mb << "." << chunk;
        }
      }
      EXPECT_EQ(actions.size(), static_cast<size_t>(s.micro_batches * s.chunks * (s.forward_only ? 1 : 2)));
    }
    ++cases;
  }
  EXPECT_GE(cases, 4);
}

TEST(PipelineSchedule, ChunksOfEqualSlotsShareOnePoolOfTheRanksPeak) {
  // PP2 VP2 m=4 G=2, rank 0: chunk 0 holds 4 micro-batches at once, chunk 1 two, the rank 5
  // (F0.0 F1.0 F0.1 F1.1 F2.0 before B0.1): one shared pool of 5 slots instead of 4 + 2.
  const std::vector<PipelineAction> actions = pipeline_actions({2, 2, 4, 2, false}, 0);
  ASSERT_EQ(pipeline_activation_slots(actions, 0), 4);
  ASSERT_EQ(pipeline_activation_slots(actions, 1), 2);
  const auto pools = pipeline_slot_pools(actions, {100, 100});
  ASSERT_EQ(pools.size(), 1u);
  EXPECT_EQ(pools[0], (ActivationSlotPool{{0, 1}, 5, 100}));
  EXPECT_EQ(pools[0].slots, pipeline_activation_slots(actions));
  // A chunk whose slots are much larger (the output layer's logits) keeps its own pool: sharing
  // would make all 5 slots that large (5 x 400 > 4 x 100 + 2 x 400).
  const auto apart = pipeline_slot_pools(actions, {100, 400});
  ASSERT_EQ(apart.size(), 2u);
  EXPECT_EQ(apart[0], (ActivationSlotPool{{0}, 4, 100}));
  EXPECT_EQ(apart[1], (ActivationSlotPool{{1}, 2, 400}));
  // Slightly larger: sharing still saves (5 x 120 < 4 x 100 + 2 x 120).
  EXPECT_EQ(pipeline_slot_pools(actions, {100, 120}).size(), 1u);

  for (const PipelineShape& s : shape_grid()) {
    for (int r = 0; r < s.stages; ++r) {
      const auto list = pipeline_actions(s, r);
      const std::vector<int64_t> equal(static_cast<size_t>(s.chunks), 64);
      const auto shared = pipeline_slot_pools(list, equal);
      // Equal slots: one pool of exactly the rank's peak in flight, never more than the chunks'
      // peaks summed.
      ASSERT_EQ(shared.size(), 1u) << describe(s) << " rank " << r;
      ASSERT_EQ(shared[0].slots, pipeline_activation_slots(list)) << describe(s) << " rank " << r;
      int per_chunk = 0;
      for (int c = 0; c < s.chunks; ++c) per_chunk += pipeline_activation_slots(list, c);
      ASSERT_LE(shared[0].slots, per_chunk) << describe(s) << " rank " << r;
      // Every chunk in exactly one pool; unequal slots never cost more than a pool per chunk.
      std::vector<int64_t> unequal;
      int64_t per_chunk_floats = 0;
      for (int c = 0; c < s.chunks; ++c) {
        unequal.push_back(64 * (1 + (c * 7 + r) % 5));
        per_chunk_floats += pipeline_activation_slots(list, c) * unequal.back();
      }
      int64_t floats = 0;
      std::vector<int> seen(static_cast<size_t>(s.chunks), 0);
      for (const ActivationSlotPool& pool : pipeline_slot_pools(list, unequal)) {
        floats += pool.floats();
        for (int c : pool.chunks) ++seen[static_cast<size_t>(c)];
        ASSERT_EQ(pool.slots, pipeline_activation_slots(list, pool.chunks));
      }
      ASSERT_LE(floats, per_chunk_floats) << describe(s) << " rank " << r;
      for (int c = 0; c < s.chunks; ++c) ASSERT_EQ(seen[static_cast<size_t>(c)], 1) << describe(s) << " chunk " << c;
    }
  }
}
