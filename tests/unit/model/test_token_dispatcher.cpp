// The all-to-all token dispatcher (lib/model/moe/token_dispatcher.h) on ranks that are threads of
// this process (tests/unit/thread_communicator.h): EP 2 and 4, expert-TP 2, and EP 2 x expert-TP 2
// against the reference over all tokens (tests/unit/moe_dispatch_problem.h) - the experts' rows
// in the contract's order, combine, and both backwards - with an expert that receives no token, a
// whole EP rank whose experts receive none, and a source rank that sends none; EP layouts give
// the one-rank dispatcher's bits; two micro-batches in flight with their own states; buffers that
// grow and their memory categories; one host copy and wait per dispatch; refusals by name.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../moe_dispatch_problem.h"
#include "../thread_communicator.h"
#include "backend/memory.h"
#include "core/error.h"
#include "model/moe/token_dispatcher.h"

namespace mt::model {
namespace {

using testing::DispatchProblem;
using testing::DispatchRankResult;
using testing::ThreadCommunicator;
using testing::ThreadGroup;

// The groups of an EP x ETP world of threads: ep groups (one per etp), expert_tp groups (one per
// ep), and the whole world as expert_tp_ep (rank etp + ETP ep).
struct ThreadLayout {
  ThreadLayout(int ep, int etp) : ep_size(ep), etp_size(etp), world(ep * etp) {
    for (int i = 0; i < etp; ++i) ep_groups.push_back(std::make_unique<ThreadGroup>(ep));
    for (int q = 0; q < ep; ++q) etp_groups.push_back(std::make_unique<ThreadGroup>(etp));
  }
  int ep_size, etp_size;
  ThreadGroup world;
  std::vector<std::unique_ptr<ThreadGroup>> ep_groups, etp_groups;
};

// One rank's communicators and dispatcher.
struct ThreadRank {
  ThreadRank(ThreadLayout& layout, int rank, int experts, int64_t hidden, backend::MemoryLedger* ledger = nullptr)
      : etp(rank % layout.etp_size),
        ep(rank / layout.etp_size),
        ep_comm(*layout.ep_groups[etp], ep),
        etp_comm(*layout.etp_groups[ep], etp),
        world_comm(layout.world, rank),
        dispatcher(experts, hidden,
                   DispatcherGroups{.expert_parallel = layout.ep_size,
                                    .expert_tensor_parallel = layout.etp_size,
                                    .ep_rank = ep,
                                    .etp_rank = etp,
                                    .ep = layout.ep_size > 1 ? &ep_comm : nullptr,
                                    .expert_tp = layout.etp_size > 1 ? &etp_comm : nullptr,
                                    .expert_tp_ep = layout.ep_size * layout.etp_size > 1 ? &world_comm : nullptr},
                   backend::cpu_ops(), backend::cpu_ops().default_stream(), ledger) {}
  int etp, ep;
  ThreadCommunicator ep_comm, etp_comm, world_comm;
  TokenDispatcher dispatcher;
};

// Every rank's results for the problem under EP x ETP (index etp + ETP ep).
std::vector<DispatchRankResult> run_layout(const DispatchProblem& p, int ep_size, int etp_size) {
  ThreadLayout layout(ep_size, etp_size);
  std::vector<DispatchRankResult> results(static_cast<size_t>(ep_size * etp_size));
  testing::run_ranks(ep_size * etp_size, [&](int rank) {
    ThreadRank me(layout, rank, p.experts, p.hidden);
    DispatchState state;
    results[static_cast<size_t>(rank)] =
        testing::run_dispatch_rank(backend::cpu_ops(), me.dispatcher, p, rank, testing::etp_share(me.etp, etp_size),
                                   state);
  });
  return results;
}

struct Case {
  const char* name;
  int ep, etp;
  std::set<int> never_chosen;
  int silent_source;
};

void PrintTo(const Case& c, std::ostream* out) { *out << c.name; }

class TokenDispatcherLayouts : public ::testing::TestWithParam<Case> {};

TEST_P(TokenDispatcherLayouts, EqualReferenceOverAllTokensForwardAndBackward) {
  const Case& c = GetParam();
  const DispatchProblem p =
      testing::make_dispatch_problem(8, 2, 5, 13, c.ep * c.etp, c.never_chosen, c.silent_source, 2211);
  const testing::DispatchReference ref = testing::dispatch_reference(p);
  const auto results = run_layout(p, c.ep, c.etp);
  for (int ep = 0; ep < c.ep; ++ep)
    for (int etp = 0; etp < c.etp; ++etp) {
      SCOPED_TRACE("ep " + std::to_string(ep) + " etp " + std::to_string(etp));
      testing::check_dispatch_rank(p, ref, results[static_cast<size_t>(etp + c.etp * ep)], ep, etp, c.ep, c.etp);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TokenDispatcherLayouts,
    ::testing::Values(Case{"ep1", 1, 1, {}, -1}, Case{"ep2", 2, 1, {}, -1}, Case{"ep4", 4, 1, {}, -1},
                      Case{"etp2", 1, 2, {}, -1}, Case{"ep2_etp2", 2, 2, {}, -1},
                      Case{"ep2_expert3_gets_none", 2, 1, {3}, -1},
                      Case{"ep4_rank1_gets_none", 4, 1, {2, 3}, -1},
                      Case{"ep4_rank2_sends_none", 4, 1, {}, 2},
                      Case{"ep2_etp2_rank1_gets_none_rank0_sends_none", 2, 2, {4, 5, 6, 7}, 0}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// Under EP alone every token's copies are summed in the same (expert) order as on one rank: the
// same bits, not only within a tolerance.
TEST(TokenDispatcher, ExpertParallelGivesTheOneRankBits) {
  const DispatchProblem p = testing::make_dispatch_problem(8, 2, 6, 11, 4, {}, -1, 5);
  DispatchProblem one_rank = p;
  one_rank.sources = 1;
  one_rank.tokens_per_source = p.tokens();
  const DispatchRankResult whole = run_layout(one_rank, 1, 1)[0];
  for (int ep : {2, 4}) {
    DispatchProblem split = p;
    split.sources = ep;
    split.tokens_per_source = p.tokens() / ep;
    const auto results = run_layout(split, ep, 1);
    for (int rank = 0; rank < ep; ++rank) {
      const size_t first = static_cast<size_t>(rank * split.tokens_per_source * p.hidden);
      for (size_t i = 0; i < results[static_cast<size_t>(rank)].y.size(); ++i) {
        ASSERT_EQ(results[rank].y[i], whole.y[first + i]) << "EP " << ep << " rank " << rank;
        ASSERT_EQ(results[rank].dx[i], whole.dx[first + i]) << "EP " << ep << " rank " << rank;
      }
      const size_t first_prob = static_cast<size_t>(rank * split.tokens_per_source * p.experts);
      for (size_t i = 0; i < results[static_cast<size_t>(rank)].dprobs.size(); ++i) {
        ASSERT_EQ(results[rank].dprobs[i], whole.dprobs[first_prob + i]) << "EP " << ep << " rank " << rank;
      }
    }
  }
}

// Two micro-batches in flight (as under a pipeline schedule), each with its own state, combined
// and backpropagated in the other order; then a state reused for a larger micro-batch grows.
TEST(TokenDispatcher, StatesKeepEachMicroBatchAndBuffersGrow) {
  const DispatchProblem small = testing::make_dispatch_problem(4, 1, 3, 6, 2, {}, -1, 1);
  const DispatchProblem large = testing::make_dispatch_problem(4, 3, 3, 9, 2, {}, -1, 2);
  const auto small_ref = testing::dispatch_reference(small), large_ref = testing::dispatch_reference(large);
  ThreadLayout layout(2, 1);
  std::vector<int64_t> activations(2), activations_after(2), comm_peak(2);
  testing::run_ranks(2, [&](int rank) {
    const backend::Ops& cpu = backend::cpu_ops();
    backend::MemoryLedger ledger;
    ThreadRank me(layout, rank, 4, 3, &ledger);
    {
      DispatchState first, second;
      // Dispatch both, then run their combine and backward in reverse order.
      const testing::DispatchInputs small_inputs = testing::dispatch_source(cpu, me.dispatcher, small, rank, first);
      const auto large_result = testing::run_dispatch_rank(cpu, me.dispatcher, large, rank, 1.0f, second);
      testing::check_dispatch_rank(large, large_ref, large_result, rank, 0, 2, 1);
      // first still holds small's rows and splits after second went through the same dispatcher.
      const auto small_result = testing::finish_dispatch_rank(cpu, me.dispatcher, small, small_inputs, 1.0f, first);
      testing::check_dispatch_rank(small, small_ref, small_result, rank, 0, 2, 1);
      // first reused for the larger micro-batch: its buffers grow.
      const int64_t before = ledger.live(backend::MemoryCategory::activations);
      const auto reused_result = testing::run_dispatch_rank(cpu, me.dispatcher, large, rank, 1.0f, first);
      testing::check_dispatch_rank(large, large_ref, reused_result, rank, 0, 2, 1);
      activations[static_cast<size_t>(rank)] = ledger.live(backend::MemoryCategory::activations) - before;
    }
    activations_after[static_cast<size_t>(rank)] = ledger.live(backend::MemoryCategory::activations);
    comm_peak[static_cast<size_t>(rank)] = ledger.peak(backend::MemoryCategory::comm_buffers);
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_GT(activations[rank], 0) << "rank " << rank << ": the reused state did not grow";
    EXPECT_EQ(activations_after[rank], 0) << "rank " << rank << ": states' memory not returned";
    EXPECT_GT(comm_peak[rank], 0) << "rank " << rank << ": no workspace accounted as comm_buffers";
  }
}

// The CPU table counting, per thread, its device-to-host copies and synchronizes.
thread_local int device_to_host_copies = 0, synchronizes = 0;
const backend::Ops& counting_ops() {
  static const backend::Ops table = [] {
    backend::Ops ops = backend::cpu_ops();
    ops.copy = [](void* dst, const void* src, int64_t bytes, backend::CopyKind kind, backend::Stream stream) {
      if (kind == backend::CopyKind::device_to_host) ++device_to_host_copies;
      backend::cpu_ops().copy(dst, src, bytes, kind, stream);
    };
    ops.synchronize = [](backend::Stream stream) {
      ++synchronizes;
      backend::cpu_ops().synchronize(stream);
    };
    return ops;
  }();
  return table;
}

// Megatron's one sync: a dispatch copies the gathered counts to the host once and waits once;
// combine and both backwards only queue work.
TEST(TokenDispatcher, DispatchWaitsForTheHostOnceAndTheRestNever) {
  const DispatchProblem p = testing::make_dispatch_problem(8, 2, 5, 13, 2, {}, -1, 7);
  const backend::Ops& ops = counting_ops();
  ThreadLayout layout(2, 1);
  std::vector<int> dispatch_copies(2), dispatch_waits(2), later_copies(2), later_waits(2);
  testing::run_ranks(2, [&](int rank) {
    ThreadCommunicator ep_comm(*layout.ep_groups[0], rank), world_comm(layout.world, rank);
    TokenDispatcher dispatcher(
        8, 5, DispatcherGroups{.expert_parallel = 2, .ep_rank = rank, .ep = &ep_comm, .expert_tp_ep = &world_comm},
        ops, ops.default_stream());
    const int64_t s = p.tokens_per_source, c = p.hidden;
    DispatchState state;
    device_to_host_copies = synchronizes = 0;
    dispatcher.dispatch(p.x.data() + rank * s * c, p.probs.data() + rank * s * 8, p.map.data() + rank * s * 8, s,
                        state);
    dispatch_copies[rank] = device_to_host_copies;
    dispatch_waits[rank] = synchronizes;
    device_to_host_copies = synchronizes = 0;
    std::vector<float> rows(static_cast<size_t>(state.rows() * c), 1.0f), probs(static_cast<size_t>(state.rows()));
    std::vector<float> y(static_cast<size_t>(s * c)), dprobs(static_cast<size_t>(s * 8));
    dispatcher.combine(state, rows.data(), y.data());
    dispatcher.combine_backward(state, y.data(), rows.data());
    dispatcher.dispatch_backward(state, rows.data(), probs.data(), y.data(), dprobs.data());
    later_copies[rank] = device_to_host_copies;
    later_waits[rank] = synchronizes;
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(dispatch_copies[rank], 1) << "rank " << rank;
    EXPECT_EQ(dispatch_waits[rank], 1) << "rank " << rank;
    EXPECT_EQ(later_copies[rank], 0) << "rank " << rank;
    EXPECT_EQ(later_waits[rank], 0) << "rank " << rank;
  }
}

template <typename Call>
void expect_error_naming(const std::string& text, Call call) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one naming " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(TokenDispatcher, RefusesBadSetUpsByName) {
  const backend::Ops& cpu = backend::cpu_ops();
  const backend::Stream stream = cpu.default_stream();
  expect_error_naming("do not split over EP 3", [&] {
    TokenDispatcher(8, 4, DispatcherGroups{.expert_parallel = 3}, cpu, stream);
  });
  expect_error_naming("ep group: missing", [&] {
    TokenDispatcher(8, 4, DispatcherGroups{.expert_parallel = 2}, cpu, stream);
  });
  expect_error_naming("expert_tp_ep group: has 2 ranks and this is rank 1, expected 2 ranks and rank 0", [&] {
    ThreadGroup ep(2), world(2);
    testing::run_ranks(2, [&](int rank) {
      ThreadCommunicator ep_comm(ep, rank), world_comm(world, 1 - rank);
      if (rank != 0) return;
      TokenDispatcher(8, 4, DispatcherGroups{.expert_parallel = 2, .ep = &ep_comm, .expert_tp_ep = &world_comm}, cpu,
                      stream);
    });
  });
  backend::Ops without = cpu;
  without.moe_sort_chunks = nullptr;
  expect_error_naming("no moe_sort_chunks kernel", [&] { TokenDispatcher(8, 4, DispatcherGroups{}, without, stream); });
  TokenDispatcher one_rank(8, 4, DispatcherGroups{}, cpu, stream);
  DispatchState never_dispatched;
  std::vector<float> buffer(64);
  expect_error_naming("state has not been dispatched",
                      [&] { one_rank.combine(never_dispatched, buffer.data(), buffer.data()); });
}

}  // namespace
}  // namespace mt::model
