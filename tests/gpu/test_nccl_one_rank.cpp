// GPU test of the NCCL data communicator (comm/nccl_communicator.h) on one rank: every collective
// and dtype against the obvious answer (a group of one reduces, gathers and scatters to what it
// holds), split, argument errors naming the operation, and a non-blocking operation ordered
// between stream work without a host wait. CTest label gpu; skipped without a CUDA device.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl_communicator.h"
#include "core/error.h"
#include "kernels/cuda/runtime.h"
#include "tests/gpu/nccl_test_support.h"

namespace mt::comm {
namespace {

using nccl_test::CudaBinding;
using nccl_test::DeviceBytes;
using nccl_test::first_difference;
using nccl_test::values;

class NcclOneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    binding_ = std::make_unique<CudaBinding>();
    control_ = make_single_communicator();
    group_ = nccl_data_group_factory(60.0)(*control_, binding_->table, binding_->bound());
  }
  cudaStream_t stream() const { return binding_->stream; }
  std::unique_ptr<CudaBinding> binding_;  // first made, last freed
  std::unique_ptr<Communicator> control_, group_;
};

constexpr int64_t kCount = 1037;  // not a multiple of anything NCCL tiles by

TEST_F(NcclOneRank, JoinsAsAGroupOfOne) {
  EXPECT_EQ(group_->rank(), 0);
  EXPECT_EQ(group_->size(), 1);
  EXPECT_GE(group_->wait_seconds(), 0.0);
}

TEST_F(NcclOneRank, AllReduceKeepsEveryDtypeAndOp) {
  for (DType dtype : nccl_test::kReducible) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      const auto input = values(dtype, kCount, 1);
      DeviceBytes data(input.size());
      data.upload(input, stream());
      group_->all_reduce(data.data(), kCount, dtype, op);
      EXPECT_EQ(first_difference(data.download(stream()), input, dtype), -1)
          << dtype_name(dtype) << " op " << int(op);
    }
  }
}

TEST_F(NcclOneRank, ReductionsOfInt16RefusedByName) {
  DeviceBytes data(8);
  try {
    group_->all_reduce(data.data(), 4, DType::i16, ReduceOp::sum);
    FAIL() << "NCCL reduced int16";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("all_reduce"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("int16"), std::string::npos) << error.what();
  }
}

TEST_F(NcclOneRank, ReduceScatterAndAllGatherCopyTheirBlock) {
  for (DType dtype : nccl_test::kReducible) {
    const auto input = values(dtype, kCount, 2);
    DeviceBytes send(input.size()), recv(input.size());
    send.upload(input, stream());
    group_->reduce_scatter(send.data(), recv.data(), kCount, dtype, ReduceOp::sum);
    EXPECT_EQ(first_difference(recv.download(stream()), input, dtype), -1) << "reduce_scatter " << dtype_name(dtype);
    group_->reduce_scatter(send.data(), send.data(), kCount, dtype, ReduceOp::max);  // in place
    EXPECT_EQ(first_difference(send.download(stream()), input, dtype), -1) << "in place " << dtype_name(dtype);
  }
  for (DType dtype : nccl_test::kAll) {
    const auto input = values(dtype, kCount, 3);
    DeviceBytes send(input.size()), recv(input.size());
    send.upload(input, stream());
    group_->all_gather(send.data(), recv.data(), kCount, dtype);
    EXPECT_EQ(first_difference(recv.download(stream()), input, dtype), -1) << "all_gather " << dtype_name(dtype);
    group_->all_gather(recv.data(), recv.data(), kCount, dtype);  // in place
    EXPECT_EQ(first_difference(recv.download(stream()), input, dtype), -1) << "in place " << dtype_name(dtype);
  }
}

TEST_F(NcclOneRank, BroadcastAllToAllAndBarrier) {
  for (DType dtype : nccl_test::kAll) {
    const auto input = values(dtype, kCount, 4);
    DeviceBytes data(input.size()), out(input.size());
    data.upload(input, stream());
    group_->broadcast(data.data(), kCount, dtype, 0);
    EXPECT_EQ(first_difference(data.download(stream()), input, dtype), -1) << "broadcast " << dtype_name(dtype);
    group_->all_to_all(data.data(), out.data(), kCount, dtype);
    EXPECT_EQ(first_difference(out.download(stream()), input, dtype), -1) << "all_to_all " << dtype_name(dtype);
  }
  // all_to_allv: 400 elements from offset 600 of `send` land at offset 5 of `recv`.
  const DType dtype = DType::bf16;
  const auto input = values(dtype, kCount, 5);
  DeviceBytes send(input.size()), recv(input.size());
  send.upload(input, stream());
  recv.zero(stream());
  const int64_t send_count = 400, send_offset = 600, recv_offset = 5;
  group_->all_to_allv(send.data(), &send_count, &send_offset, recv.data(), &send_count, &recv_offset, dtype);
  const auto got = recv.download(stream());
  for (int64_t i = 0; i < kCount; ++i) {
    const bool moved = i >= recv_offset && i < recv_offset + send_count;
    const uint16_t want = moved ? nccl_test::element16(input, i - recv_offset + send_offset) : 0;
    ASSERT_EQ(nccl_test::element16(got, i), want) << "all_to_allv element " << i;
  }
  group_->barrier();
  nccl_test::check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
}

TEST_F(NcclOneRank, SplitMakesAWorkingGroup) {
  auto child = group_->split(7, 0);
  ASSERT_EQ(child->size(), 1);
  EXPECT_EQ(child->rank(), 0);
  const auto input = values(DType::f32, kCount, 6);
  DeviceBytes data(input.size());
  data.upload(input, stream());
  child->all_reduce(data.data(), kCount, DType::f32, ReduceOp::sum);
  EXPECT_EQ(first_difference(data.download(stream()), input, DType::f32), -1);
  EXPECT_THROW(group_->split(-1, 0), Error);
}

TEST_F(NcclOneRank, BadArgumentsNameTheOperation) {
  DeviceBytes data(16);
  const auto expect_error = [](const auto& call, const std::string& op) {
    try {
      call();
      FAIL() << op << " accepted a bad argument";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(op), std::string::npos) << error.what();
    }
  };
  expect_error([&] { group_->all_reduce(data.data(), -1, DType::f32, ReduceOp::sum); }, "all_reduce");
  expect_error([&] { group_->broadcast(data.data(), 1, DType::f32, 1); }, "broadcast");
  expect_error([&] { group_->send(data.data(), 1, DType::f32, 0, 0); }, "send");  // to oneself
  expect_error([&] { group_->recv_async(data.data(), 1, DType::f32, 1, 0); }, "recv_async");
  expect_error([&] { group_->send_async(data.data(), 1, DType::f32, 0, -1); }, "send_async");
}

// A non-blocking gather overlapped with stream work: the compute stream is held by a 500 ms host
// function, then copies the input into `send`; the gather issued after must wait for that copy
// (it reads zeros otherwise), the read queued after wait() sees its result, and neither the call
// nor wait() blocks the host (both return long before the stream is free).
TEST_F(NcclOneRank, NonBlockingOperationsFollowStreamOrder) {
  const int64_t count = 1 << 20;
  const auto input = values(DType::f32, count, 8);
  DeviceBytes source(input.size()), send(input.size()), recv(input.size()), other(input.size());
  source.upload(input, stream());
  send.zero(stream());
  recv.zero(stream());
  group_->all_gather_async(source.data(), other.data(), count, DType::f32)->wait();  // NCCL's first-use setup
  nccl_test::check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");

  const auto start = std::chrono::steady_clock::now();
  nccl_test::check(cudaLaunchHostFunc(
                       stream(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(500)); },
                       nullptr),
                   "cudaLaunchHostFunc");
  nccl_test::check(cudaMemcpyAsync(send.data(), source.data(), input.size(), cudaMemcpyDeviceToDevice, stream()),
                   "cudaMemcpyAsync");
  auto gather = group_->all_gather_async(send.data(), recv.data(), count, DType::f32);
  other.zero(stream());  // stream work between the call and its wait
  gather->wait();
  const double host_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(host_seconds, 0.25) << "the call or wait() blocked the host";
  EXPECT_EQ(first_difference(recv.download(stream()), input, DType::f32), -1) << "all_gather_async";
  EXPECT_TRUE(gather->test());

  auto reduction = group_->all_reduce_async(send.data(), count, DType::f32, ReduceOp::sum);
  auto scatter = group_->reduce_scatter_async(recv.data(), recv.data(), count, DType::f32, ReduceOp::sum);
  reduction->wait();
  scatter->wait();
  EXPECT_EQ(first_difference(send.download(stream()), input, DType::f32), -1) << "all_reduce_async";
  EXPECT_EQ(first_difference(recv.download(stream()), input, DType::f32), -1) << "reduce_scatter_async";
  EXPECT_TRUE(reduction->test());
}

}  // namespace
}  // namespace mt::comm
