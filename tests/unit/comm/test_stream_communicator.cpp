// Data communicators of one rank (comm/stream_communicator.h): a group of one bound to the CPU
// table and to the asynchronous CPU table (tests/backend/async_cpu_ops.h). Collectives copy
// between device buffers in stream order, requests complete in stream order, bad arguments are
// refused on the calling thread, a failure inside queued work comes back from synchronize, and
// split gives a data group of the same table. The multi-rank cases run under mpirun in
// tests/mpi/test_stream_communicator.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "comm/communicator.h"
#include "comm/stream_communicator.h"
#include "core/error.h"
#include "tests/backend/async_cpu_ops.h"

namespace {

using mt::DType;
using mt::backend::CopyKind;
using mt::backend::DeviceBuffer;
using mt::backend::MemoryCategory;
using mt::backend::Ops;
using mt::comm::ReduceOp;

class StreamCommunicatorOfOne : public ::testing::TestWithParam<bool> {
 protected:
  const Ops& ops() const { return GetParam() ? mt::test_backend::async_cpu_ops() : mt::backend::cpu_ops(); }
  mt::backend::Stream stream() const { return ops().default_stream(); }
  std::unique_ptr<mt::comm::Communicator> bound() const {
    return mt::comm::make_stream_communicator(mt::comm::make_single_communicator(), ops(), stream());
  }
  DeviceBuffer<float> device(const std::vector<float>& values) {
    held_.push_back(values);
    DeviceBuffer<float> buffer(ops(), static_cast<int64_t>(values.size()), MemoryCategory::comm_buffers);
    ops().copy(buffer.data(), held_.back().data(), static_cast<int64_t>(values.size() * sizeof(float)),
               CopyKind::host_to_device, stream());
    return buffer;
  }
  std::vector<float> host(const DeviceBuffer<float>& buffer) {
    std::vector<float> values(static_cast<size_t>(buffer.size()));
    ops().copy(values.data(), buffer.data(), buffer.size() * static_cast<int64_t>(sizeof(float)),
               CopyKind::device_to_host, stream());
    ops().synchronize(stream());
    return values;
  }

 private:
  std::vector<std::vector<float>> held_;
};

TEST_P(StreamCommunicatorOfOne, CollectivesCopyInStreamOrder) {
  auto group = bound();
  EXPECT_EQ(group->size(), 1);
  EXPECT_EQ(group->rank(), 0);
  auto a = device({1, 2, 3, 4});
  group->all_reduce(a.data(), 4, DType::f32, ReduceOp::sum);
  ops().scale_inplace(a.data(), 4, 2.0f, stream());  // after the collective, in stream order
  EXPECT_EQ(host(a), (std::vector<float>{2, 4, 6, 8}));

  auto b = device({0, 0, 0});
  group->reduce_scatter(a.data(), b.data(), 3, DType::f32, ReduceOp::sum);
  EXPECT_EQ(host(b), (std::vector<float>{2, 4, 6}));
  group->all_gather(a.data() + 1, b.data(), 3, DType::f32);
  EXPECT_EQ(host(b), (std::vector<float>{4, 6, 8}));
  group->all_to_all(a.data(), b.data(), 2, DType::f32);
  EXPECT_EQ(host(b), (std::vector<float>{2, 4, 8}));
  const int64_t send_count = 2, send_offset = 1, recv_count = 2, recv_offset = 0;
  group->all_to_allv(a.data(), &send_count, &send_offset, b.data(), &recv_count, &recv_offset, DType::f32);
  EXPECT_EQ(host(b), (std::vector<float>{4, 6, 8}));
  group->broadcast(b.data(), 3, DType::f32, 0);
  group->barrier();
  EXPECT_EQ(host(b), (std::vector<float>{4, 6, 8}));
  EXPECT_EQ(group->wait_seconds(), 0.0);
}

TEST_P(StreamCommunicatorOfOne, RequestsCompleteInStreamOrder) {
  auto group = bound();
  auto a = device({1, 2, 3, 4});
  auto b = device({0, 0, 0, 0});
  auto reduce = group->all_reduce_async(a.data(), 4, DType::f32, ReduceOp::max);
  auto scatter = group->reduce_scatter_async(a.data(), b.data(), 4, DType::f32, ReduceOp::sum);
  scatter->wait();
  reduce->wait();
  ops().add_inplace(b.data(), a.data(), 4, stream());
  EXPECT_EQ(host(b), (std::vector<float>{2, 4, 6, 8}));
  EXPECT_TRUE(reduce->test());
  EXPECT_TRUE(scatter->test());
  auto gather = group->all_gather_async(b.data() + 1, a.data(), 2, DType::f32);
  gather.reset();  // destroying it waits, in stream order
  EXPECT_EQ(host(a), (std::vector<float>{4, 6, 3, 4}));
}

TEST_P(StreamCommunicatorOfOne, BadArgumentsAreRefusedAtTheCall) {
  auto group = bound();
  auto a = device({1, 2, 3, 4});
  EXPECT_THROW(group->all_reduce(a.data(), -1, DType::f32, ReduceOp::sum), mt::Error);
  EXPECT_THROW(group->send(a.data(), 4, DType::f32, 0, 0), mt::Error);  // to itself
  EXPECT_THROW(group->recv_async(a.data(), 4, DType::f32, 1, 0), mt::Error);
  EXPECT_THROW(group->broadcast(a.data(), 4, DType::f32, 1), mt::Error);
  // Counts the single rank cannot satisfy: the host communicator refuses them, on the CPU at the
  // call, on the asynchronous table from the stream's synchronize.
  const int64_t send_count = 2, recv_count = 3, offset = 0;
  const auto mismatched = [&] {
    group->all_to_allv(a.data(), &send_count, &offset, a.data(), &recv_count, &offset, DType::f32);
    ops().synchronize(stream());
  };
  EXPECT_THROW(mismatched(), mt::Error);
  EXPECT_NO_THROW(ops().synchronize(stream()));
}

TEST_P(StreamCommunicatorOfOne, SplitGivesADataGroupOfTheSameTable) {
  auto group = bound();
  auto child = group->split(2, 0);
  EXPECT_EQ(child->size(), 1);
  auto a = device({5, 6});
  child->all_reduce(a.data(), 2, DType::f32, ReduceOp::sum);
  ops().scale_inplace(a.data(), 2, -1.0f, stream());
  EXPECT_EQ(host(a), (std::vector<float>{-5, -6}));
}

INSTANTIATE_TEST_SUITE_P(Tables, StreamCommunicatorOfOne, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "AsyncCpu" : "Cpu"; });

// On the synchronous CPU table program order is stream order: the binding keeps the host
// communicator itself (no call pays for it); an asynchronous table gets a communicator of its own.
TEST(StreamCommunicatorOfOneBinding, TheSynchronousTableKeepsTheHostCommunicator) {
  auto host = mt::comm::make_single_communicator();
  const mt::comm::Communicator* raw = host.get();
  const Ops& cpu = mt::backend::cpu_ops();
  EXPECT_EQ(mt::comm::make_stream_communicator(std::move(host), cpu, cpu.default_stream()).get(), raw);
  host = mt::comm::make_single_communicator();
  raw = host.get();
  const Ops& async = mt::test_backend::async_cpu_ops();
  EXPECT_NE(mt::comm::make_stream_communicator(std::move(host), async, async.default_stream()).get(), raw);
}

// Before the stream has reached it a request is not complete, and wait() does not block the host.
TEST(StreamCommunicatorOfOneAsync, ARequestIsNotCompleteBeforeTheStreamReachesIt) {
  const Ops& ops = mt::test_backend::async_cpu_ops();
  auto group = mt::comm::make_stream_communicator(mt::comm::make_single_communicator(), ops, ops.default_stream());
  DeviceBuffer<float> a(ops, 4, MemoryCategory::comm_buffers);
  mt::test_backend::set_async_start_delay(std::chrono::seconds(1));
  auto request = group->all_reduce_async(a.data(), 4, DType::f32, ReduceOp::sum);
  const bool early = request->test();
  const auto start = std::chrono::steady_clock::now();
  request->wait();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ops.synchronize(ops.default_stream());
  mt::test_backend::set_async_start_delay(std::chrono::microseconds(0));
  EXPECT_FALSE(early);
  EXPECT_LT(waited, 0.5);
  EXPECT_TRUE(request->test());
}

}  // namespace
