// The all-to-all token dispatcher (lib/model/moe/token_dispatcher.h) under mpirun, over MPI data
// communicators bound to the CPU table and to the asynchronous test table (tests/backend/
// async_cpu_ops.h: a value read from the host before its stream has run fails there): EP = the
// world (2 or 4 ranks), with and without an EP rank whose experts receive no token and a rank that
// sends none, and EP 2 x expert-TP 2 at 4 ranks, each rank against the reference over all tokens
// (tests/unit/moe_dispatch_problem.h, the same checks as the thread suite
// tests/unit/model/test_token_dispatcher.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "../unit/moe_dispatch_problem.h"
#include "backend/ops.h"
#include "comm/communicator.h"
#include "tests/mpi/world.h"
#include "comm/stream_communicator.h"
#include "model/moe/token_dispatcher.h"
#include "tests/mpi/on_each_table.h"

namespace {

auto& g_world = mt::mpi_test::world_holder();
const auto* const g_environment = ::testing::AddGlobalTestEnvironment(new mt::mpi_test::WorldEnvironment);

class TokenDispatcherMpi : public mt::mpi_test::OnEachTable {
 protected:
  TokenDispatcherMpi() : OnEachTable(std::chrono::milliseconds(5)) {}

  // The world as EP x ETP (rank = etp + ETP ep): this rank's results against the reference.
  void check_layout(int etp_size, const std::set<int>& never_chosen, int silent_source, uint32_t seed) {
    ASSERT_GT(g_world->size(), 1) << "run under mpirun";
    ASSERT_EQ(g_world->size() % etp_size, 0);
    const mt::backend::Stream stream = ops().default_stream();
    const int ep_size = g_world->size() / etp_size;
    const int rank = g_world->rank(), etp = rank % etp_size, ep = rank / etp_size;
    auto ep_control = g_world->split(etp, ep);
    auto etp_control = g_world->split(ep, etp);
    auto ep_group = mt::comm::make_mpi_data_group(*ep_control, ops(), stream);
    auto etp_group = mt::comm::make_mpi_data_group(*etp_control, ops(), stream);
    auto world_group = mt::comm::make_mpi_data_group(*g_world, ops(), stream);
    mt::model::TokenDispatcher dispatcher(
        8, 5,
        mt::model::DispatcherGroups{.expert_parallel = ep_size,
                                    .expert_tensor_parallel = etp_size,
                                    .ep_rank = ep,
                                    .etp_rank = etp,
                                    .ep = ep_size > 1 ? ep_group.get() : nullptr,
                                    .expert_tp = etp_size > 1 ? etp_group.get() : nullptr,
                                    .expert_tp_ep = world_group.get()},
        ops(), stream);
    const mt::testing::DispatchProblem p =
        mt::testing::make_dispatch_problem(8, 2, 5, 13, g_world->size(), never_chosen, silent_source, seed);
    mt::model::DispatchState state;
    const auto result =
        mt::testing::run_dispatch_rank(ops(), dispatcher, p, rank, mt::testing::etp_share(etp, etp_size), state);
    mt::testing::check_dispatch_rank(p, mt::testing::dispatch_reference(p), result, ep, etp, ep_size, etp_size);
  }
};

TEST_P(TokenDispatcherMpi, ExpertParallelOverTheWorldEqualsTheReference) { check_layout(1, {}, -1, 41); }

// EP rank 1's experts are never chosen (its all_to_allv receives nothing) and rank 0 routes no
// token (it sends nothing): every rank still takes part in every collective.
TEST_P(TokenDispatcherMpi, EmptyExpertRankAndSilentRank) {
  const int local = 8 / g_world->size();
  std::set<int> rank1_experts;
  for (int e = local; e < 2 * local; ++e) rank1_experts.insert(e);
  check_layout(1, rank1_experts, 0, 42);
}

TEST_P(TokenDispatcherMpi, ExpertParallelTimesExpertTensorParallel) {
  if (g_world->size() != 4) GTEST_SKIP() << "EP 2 x expert-TP 2 runs at 4 ranks";
  check_layout(2, {3}, 1, 43);
}

MT_INSTANTIATE_ON_EACH_TABLE(TokenDispatcherMpi);

}  // namespace
