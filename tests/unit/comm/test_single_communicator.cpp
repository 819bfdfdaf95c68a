// The single-rank communicator: collectives are identities or copies (in place too), requests are
// complete at once, messages to oneself and bad arguments are errors naming the operation, split
// gives another group of one and a group of one is one node; make_world_communicator() is this one
// outside mpirun.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/node_ranks.h"
#include "core/error.h"

namespace {

using mt::DType;
using mt::comm::Communicator;
using mt::comm::ReduceOp;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const mt::Error& e) {
    return e.what();
  }
  return "no error";
}

std::vector<float> iota(size_t n, float first) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(SingleCommunicator, IsAGroupOfOne) {
  auto comm = mt::comm::make_single_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->wait_seconds(), 0.0);
  comm->barrier();
  comm->progress();
}

TEST(SingleCommunicator, ReductionsAreIdentities) {
  auto comm = mt::comm::make_single_communicator();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    auto v = iota(7, -3);
    comm->all_reduce(v.data(), 7, DType::f32, op);
    EXPECT_EQ(v, iota(7, -3));
    comm->all_reduce_async(v.data(), 7, DType::f32, op)->wait();
    EXPECT_EQ(v, iota(7, -3));
  }
  std::vector<int64_t> ints{5, -2, 9};
  comm->broadcast(ints.data(), 3, DType::i64, 0);
  EXPECT_EQ(ints, (std::vector<int64_t>{5, -2, 9}));
}

TEST(SingleCommunicator, DataMovementCopiesBetweenDistinctBuffers) {
  auto comm = mt::comm::make_single_communicator();
  const auto source = iota(1023, 1);
  for (int64_t count : {0, 1, 7, 1023}) {
    std::vector<float> out(1023, -1);
    comm->reduce_scatter(source.data(), out.data(), count, DType::f32, ReduceOp::sum);
    for (int64_t i = 0; i < 1023; ++i) ASSERT_EQ(out[i], i < count ? source[i] : -1) << count;
    std::fill(out.begin(), out.end(), -1);
    comm->all_gather(source.data(), out.data(), count, DType::f32);
    for (int64_t i = 0; i < 1023; ++i) ASSERT_EQ(out[i], i < count ? source[i] : -1) << count;
    std::fill(out.begin(), out.end(), -1);
    comm->all_to_all(source.data(), out.data(), count, DType::f32);
    for (int64_t i = 0; i < 1023; ++i) ASSERT_EQ(out[i], i < count ? source[i] : -1) << count;
    std::fill(out.begin(), out.end(), -1);
    comm->reduce_scatter_async(source.data(), out.data(), count, DType::f32, ReduceOp::max)->wait();
    comm->all_gather_async(source.data(), out.data(), count, DType::f32)->wait();
    for (int64_t i = 0; i < 1023; ++i) ASSERT_EQ(out[i], i < count ? source[i] : -1) << count;
  }
  // In place (the shard is the whole buffer): nothing moves.
  auto v = iota(5, 0);
  comm->reduce_scatter(v.data(), v.data(), 5, DType::f32, ReduceOp::sum);
  comm->all_gather(v.data(), v.data(), 5, DType::f32);
  EXPECT_EQ(v, iota(5, 0));
}

TEST(SingleCommunicator, AllToAllvCopiesAtOffsets) {
  auto comm = mt::comm::make_single_communicator();
  const std::vector<int32_t> send{0, 0, 4, 5, 6};
  std::vector<int32_t> recv(6, -1);
  const int64_t count = 3, send_offset = 2, recv_offset = 1;
  comm->all_to_allv(send.data(), &count, &send_offset, recv.data(), &count, &recv_offset, DType::i32);
  EXPECT_EQ(recv, (std::vector<int32_t>{-1, 4, 5, 6, -1, -1}));
  const int64_t other = 2;
  EXPECT_EQ(error_of([&] {
              comm->all_to_allv(send.data(), &count, &send_offset, recv.data(), &other, &recv_offset, DType::i32);
            }),
            "all_to_allv: rank 0 sends itself 3 elements but receives 2");
  const int64_t negative = -1;
  EXPECT_EQ(error_of([&] {
              comm->all_to_allv(send.data(), &count, &negative, recv.data(), &count, &recv_offset, DType::i32);
            }),
            "all_to_allv: negative count or offset for rank 0 (count 3, offset -1)");
}

TEST(SingleCommunicator, MessagesToOneselfAndBadArgumentsAreErrors) {
  auto comm = mt::comm::make_single_communicator();
  float x = 1;
  EXPECT_EQ(error_of([&] { comm->send(&x, 1, DType::f32, 0, 0); }), "send: rank 0 cannot message itself");
  EXPECT_EQ(error_of([&] { comm->recv(&x, 1, DType::f32, 0, 0); }), "recv: rank 0 cannot message itself");
  EXPECT_EQ(error_of([&] { comm->send_async(&x, 1, DType::f32, 0, 0); }), "send: rank 0 cannot message itself");
  EXPECT_EQ(error_of([&] { comm->recv_async(&x, 1, DType::f32, 1, 0); }), "recv: peer 1 is outside the group of 1");
  EXPECT_EQ(error_of([&] { comm->broadcast(&x, 1, DType::f32, 1); }), "broadcast: root 1 is outside the group of 1");
  EXPECT_EQ(error_of([&] { comm->all_reduce(&x, -4, DType::f32, ReduceOp::sum); }),
            "all_reduce: negative element count -4");
  EXPECT_EQ(error_of([&] { comm->all_gather(&x, &x, -1, DType::f32); }), "all_gather: negative element count -1");
  EXPECT_EQ(error_of([&] { comm->split(-1, 0); }), "split: negative color -1");
}

TEST(SingleCommunicator, RequestsAreCompleteAtOnce) {
  auto comm = mt::comm::make_single_communicator();
  std::vector<double> v{1.5, 2.5};
  auto request = comm->all_reduce_async(v.data(), 2, DType::f64, ReduceOp::sum);
  EXPECT_TRUE(request->test());
  request->wait();
  EXPECT_EQ(v, (std::vector<double>{1.5, 2.5}));
}

TEST(SingleCommunicator, SplitGivesAnotherGroupOfOne) {
  auto comm = mt::comm::make_single_communicator();
  auto child = comm->split(3, 7);
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->rank(), 0);
  std::vector<int32_t> v{4};
  child->all_reduce(v.data(), 1, DType::i32, ReduceOp::max);
  EXPECT_EQ(v[0], 4);
}

TEST(SingleCommunicator, AGroupOfOneIsOneRankOnOneNode) {
  auto comm = mt::comm::make_single_communicator();
  const mt::comm::NodeRanks node = mt::comm::exchange_node_ranks(*comm);
  EXPECT_EQ(node.local_rank, 0);
  EXPECT_EQ(node.local_count, 1);
  EXPECT_EQ(node.node, 0);
  EXPECT_EQ(node.nodes, 1);
  EXPECT_FALSE(mt::comm::host_name().empty());
}

TEST(SingleCommunicator, WorldOutsideMpirunIsASingleRank) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK")) GTEST_SKIP() << "started by a launcher";
  auto world = mt::comm::make_world_communicator();
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->rank(), 0);
}

}  // namespace
