// Data communicators under mpirun (2 and 3 ranks): MPI bound to a stream
// (comm::make_mpi_data_group) on the CPU table and on the asynchronous CPU table
// (tests/backend/async_cpu_ops.h), where every buffer is device memory the host cannot touch
// between ops and no call waits for the stream. Every collective, blocking and non-blocking
// point-to-point rings, and in-place shards give the values a formula gives and the same bits on
// both tables; stream work issued before a collective is what it reduces and work issued after
// sees its result, without a synchronize between them.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "comm/communicator.h"
#include "tests/mpi/world.h"
#include "comm/stream_communicator.h"
#include "core/error.h"
#include "tests/backend/async_cpu_ops.h"

namespace {

using mt::DType;
using mt::backend::CopyKind;
using mt::backend::DeviceBuffer;
using mt::backend::MemoryCategory;
using mt::backend::Ops;
using mt::comm::Communicator;
using mt::comm::ReduceOp;

auto& g_world = mt::mpi_test::world_holder();
[[maybe_unused]] auto* const g_environment = ::testing::AddGlobalTestEnvironment(new mt::mpi_test::WorldEnvironment);

// Device buffers of one table and what comes back from them; host results are read after finish().
class Device {
 public:
  explicit Device(const Ops& ops) : ops_(ops), stream_(ops.default_stream()) {}

  float* upload(const std::vector<float>& host) {
    held_.push_back(host);
    float* device = zeros(host.size());
    ops_.copy(device, held_.back().data(), static_cast<int64_t>(host.size() * sizeof(float)), CopyKind::host_to_device,
              stream_);
    return device;
  }
  float* zeros(size_t n) { return buffers_.emplace_back(ops_, static_cast<int64_t>(n), MemoryCategory::comm_buffers).data(); }
  // Queues a copy back; the values are in results() after finish().
  void download(const float* device, size_t n) {
    auto& host = results_.emplace_back(n);
    ops_.copy(host.data(), device, static_cast<int64_t>(n * sizeof(float)), CopyKind::device_to_host, stream_);
  }
  const std::vector<std::vector<float>>& finish() {
    ops_.synchronize(stream_);
    return results_;
  }
  const Ops& ops() const { return ops_; }
  mt::backend::Stream stream() const { return stream_; }

 private:
  const Ops& ops_;
  mt::backend::Stream stream_;
  std::vector<std::vector<float>> held_;
  std::vector<DeviceBuffer<float>> buffers_;
  std::vector<std::vector<float>> results_;
};

// Rank r's values: small integers, exact under any summation order.
std::vector<float> values_of(int rank, size_t n, int salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((rank + 1) * 10 + static_cast<int>(i % 7) - salt);
  return v;
}

// Every collective on `data` (bound to d's table), with the formula each result must equal.
std::vector<std::vector<float>> run_collectives(Device& d, Communicator& data) {
  const int n = data.size(), me = data.rank();
  const size_t count = 37;
  const Ops& ops = d.ops();
  const auto s = d.stream();

  // Stream order: the fill before the all-reduce is what it sums, the scale after sees the sum.
  float* summed = d.zeros(count);
  ops.fill(summed, count, static_cast<float>(me + 1), s);
  data.all_reduce(summed, count, DType::f32, ReduceOp::sum);
  ops.scale_inplace(summed, count, 2.0f, s);
  d.download(summed, count);

  float* maxed = d.upload(values_of(me, count, 0));
  data.all_reduce(maxed, count, DType::f32, ReduceOp::max);
  d.download(maxed, count);

  float* full = d.upload(values_of(me, count * n, 1));
  float* shard = d.zeros(count);
  data.reduce_scatter(full, shard, count, DType::f32, ReduceOp::sum);
  d.download(shard, count);
  float* in_place = d.upload(values_of(me, count * n, 2));
  data.reduce_scatter(in_place, in_place + count * me, count, DType::f32, ReduceOp::sum);
  d.download(in_place + count * me, count);

  float* gathered = d.zeros(count * n);
  data.all_gather(d.upload(values_of(me, count, 3)), gathered, count, DType::f32);
  d.download(gathered, count * n);
  float* gathered_in_place = d.upload(values_of(me, count * n, 4));
  data.all_gather(gathered_in_place + count * me, gathered_in_place, count, DType::f32);
  d.download(gathered_in_place, count * n);

  float* swapped = d.zeros(count * n);
  data.all_to_all(d.upload(values_of(me, count * n, 5)), swapped, count, DType::f32);
  d.download(swapped, count * n);

  // all_to_allv: rank r sends q + 1 elements to rank q at offset 3 q (gaps between pieces).
  std::vector<int64_t> send_counts(n), send_offsets(n), recv_counts(n), recv_offsets(n);
  for (int q = 0; q < n; ++q) {
    send_counts[q] = q + 1;
    send_offsets[q] = 3 * q + q * q;
    recv_counts[q] = me + 1;
    recv_offsets[q] = 2 * q * (me + 2);
  }
  float* varied = d.zeros(size_t(2 * n * (me + 2)));
  ops.fill(varied, 2 * n * (me + 2), -1.0f, s);  // the gaps keep this
  data.all_to_allv(d.upload(values_of(me, size_t(4 * n + n * n), 6)), send_counts.data(), send_offsets.data(), varied,
                   recv_counts.data(), recv_offsets.data(), DType::f32);
  send_counts.assign(n, -7);  // read during the call: changing the arrays after it changes nothing
  d.download(varied, size_t(2 * n * (me + 2)));

  for (int root = 0; root < n; ++root) {
    float* broadcast = d.upload(values_of(me, count, 7 + root));
    data.broadcast(broadcast, count, DType::f32, root);
    d.download(broadcast, count);
  }
  data.barrier();
  return d.finish();
}

// The values run_collectives must give, from the formula.
std::vector<std::vector<float>> expected_collectives(int n, int me) {
  const size_t count = 37;
  std::vector<std::vector<float>> want;
  want.emplace_back(count, 2.0f * n * (n + 1) / 2);
  want.push_back(values_of(n - 1, count, 0));
  for (int salt : {1, 2}) {
    std::vector<float> shard(count, 0.0f);
    for (int r = 0; r < n; ++r) {
      const auto all = values_of(r, count * n, salt);
      for (size_t i = 0; i < count; ++i) shard[i] += all[count * me + i];
    }
    want.push_back(shard);
  }
  std::vector<float> gathered;
  for (int r = 0; r < n; ++r) {
    const auto v = values_of(r, count, 3);
    gathered.insert(gathered.end(), v.begin(), v.end());
  }
  want.push_back(gathered);
  std::vector<float> in_place;
  for (int r = 0; r < n; ++r) {
    const auto all = values_of(r, count * n, 4);
    in_place.insert(in_place.end(), all.begin() + count * r, all.begin() + count * (r + 1));
  }
  want.push_back(in_place);
  std::vector<float> swapped;
  for (int r = 0; r < n; ++r) {
    const auto all = values_of(r, count * n, 5);
    swapped.insert(swapped.end(), all.begin() + count * me, all.begin() + count * (me + 1));
  }
  want.push_back(swapped);
  std::vector<float> varied(size_t(2 * n * (me + 2)), -1.0f);
  for (int r = 0; r < n; ++r) {
    const auto sent = values_of(r, size_t(4 * n + n * n), 6);
    for (int i = 0; i <= me; ++i) varied[size_t(2 * r * (me + 2) + i)] = sent[size_t(3 * me + me * me + i)];
  }
  want.push_back(varied);
  for (int root = 0; root < n; ++root) want.push_back(values_of(root, count, 7 + root));
  return want;
}

// A ring of messages each way, blocking and non-blocking, with stream work between posting and
// waiting; then non-blocking collectives in place.
std::vector<std::vector<float>> run_messages(Device& d, Communicator& data) {
  const int n = data.size(), me = data.rank();
  const int next = (me + 1) % n, previous = (me + n - 1) % n;
  const size_t count = 1000;  // beyond OpenMPI's eager limit over shared memory
  const Ops& ops = d.ops();
  const auto s = d.stream();

  float* outgoing = d.upload(values_of(me, count, 0));
  float* incoming = d.zeros(count);
  if (me % 2 == 0) {
    data.send(outgoing, count, DType::f32, next, 3);
    data.recv(incoming, count, DType::f32, previous, 3);
  } else {
    data.recv(incoming, count, DType::f32, previous, 3);
    data.send(outgoing, count, DType::f32, next, 3);
  }
  d.download(incoming, count);

  float* busy = d.upload(values_of(me, count, 1));
  float* received = d.zeros(count);
  auto send = data.send_async(outgoing, count, DType::f32, next, 5);
  auto recv = data.recv_async(received, count, DType::f32, previous, 5);
  ops.scale_inplace(busy, count, 3.0f, s);  // computes while the messages travel
  recv->wait();
  send->wait();
  ops.add_inplace(received, busy, count, s);  // after wait(): sees the message
  d.download(received, count);

  float* summed = d.upload(values_of(me, count, 2));
  float* full = d.upload(values_of(me, count * n, 3));
  float* gathered = d.upload(values_of(me, count * n, 4));
  auto reduce = data.all_reduce_async(summed, count, DType::f32, ReduceOp::sum);
  auto scatter = data.reduce_scatter_async(full, full + count * me, count, DType::f32, ReduceOp::sum);
  auto gather = data.all_gather_async(gathered + count * me, gathered, count, DType::f32);
  gather->wait();
  scatter->wait();
  reduce->wait();
  d.download(summed, count);
  d.download(full + count * me, count);
  d.download(gathered, count * n);
  auto results = d.finish();
  for (auto* request : {send.get(), recv.get(), reduce.get(), scatter.get(), gather.get()}) {
    EXPECT_TRUE(request->test()) << "completed after wait() and a synchronize";
  }
  return results;
}

std::vector<std::vector<float>> expected_messages(int n, int me) {
  const size_t count = 1000;
  const int previous = (me + n - 1) % n;
  std::vector<std::vector<float>> want;
  want.push_back(values_of(previous, count, 0));
  std::vector<float> received = values_of(previous, count, 0);
  const auto busy = values_of(me, count, 1);
  for (size_t i = 0; i < count; ++i) received[i] += 3.0f * busy[i];
  want.push_back(received);
  std::vector<float> summed(count, 0.0f), shard(count, 0.0f), gathered;
  for (int r = 0; r < n; ++r) {
    const auto a = values_of(r, count, 2), full = values_of(r, count * n, 3), g = values_of(r, count * n, 4);
    for (size_t i = 0; i < count; ++i) {
      summed[i] += a[i];
      shard[i] += full[count * me + i];
    }
    gathered.insert(gathered.end(), g.begin() + count * r, g.begin() + count * (r + 1));
  }
  want.push_back(summed);
  want.push_back(shard);
  want.push_back(gathered);
  return want;
}

void expect_same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size()) << "result " << i;
    for (size_t j = 0; j < a[i].size(); ++j) {
      ASSERT_EQ(std::bit_cast<uint32_t>(a[i][j]), std::bit_cast<uint32_t>(b[i][j])) << "result " << i << " at " << j;
    }
  }
}

template <typename Run, typename Expected>
void check_on_both_tables(Run run, Expected expected) {
  ASSERT_GT(g_world->size(), 1) << "run under mpirun";
  const Ops* const tables[] = {&mt::backend::cpu_ops(), &mt::test_backend::async_cpu_ops()};
  std::vector<std::vector<std::vector<float>>> results;
  for (const Ops* table : tables) {
    const Ops& ops = *table;
    SCOPED_TRACE(ops.name);
    Device d(ops);
    auto data = mt::comm::make_mpi_data_group(*g_world, ops, d.stream());
    results.push_back(run(d, *data));
    expect_same_bits(results.back(), expected(g_world->size(), g_world->rank()));
  }
  expect_same_bits(results[0], results[1]);
}

TEST(StreamCommunicator, CollectivesGiveTheFormulaOnBothTables) { check_on_both_tables(run_collectives, expected_collectives); }

TEST(StreamCommunicator, MessagesAndNonBlockingShardsGiveTheFormulaOnBothTables) {
  check_on_both_tables(run_messages, expected_messages);
}

// On the asynchronous table a request is not complete before the stream has reached it, and
// wait() returns without blocking the host (the worker's start is held back for a second).
TEST(StreamCommunicator, NonBlockingOperationsCompleteInStreamOrder) {
  const Ops& ops = mt::test_backend::async_cpu_ops();
  Device d(ops);
  auto data = mt::comm::make_mpi_data_group(*g_world, ops, d.stream());
  float* values = d.upload(values_of(data->rank(), 8, 0));
  mt::test_backend::set_async_start_delay(std::chrono::seconds(1));
  const auto start = std::chrono::steady_clock::now();
  auto request = data->all_reduce_async(values, 8, DType::f32, ReduceOp::sum);
  const bool done_before_the_stream_ran = request->test();
  request->wait();
  const double host_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  d.download(values, 8);
  const auto results = d.finish();
  mt::test_backend::set_async_start_delay(std::chrono::microseconds(0));
  EXPECT_FALSE(done_before_the_stream_ran);
  EXPECT_LT(host_seconds, 0.5) << "wait() blocked the host";
  EXPECT_TRUE(request->test());
  std::vector<float> want(8, 0.0f);
  for (int r = 0; r < data->size(); ++r) {
    const auto v = values_of(r, 8, 0);
    for (size_t i = 0; i < 8; ++i) want[i] += v[i];
  }
  EXPECT_EQ(results[0], want);
}

// Arguments are checked on the calling thread; a failure inside queued MPI work comes back from
// the stream's synchronize. A split of a data group is a data group of the same table.
TEST(StreamCommunicator, ErrorsAndSplitOnTheAsynchronousTable) {
  const Ops& ops = mt::test_backend::async_cpu_ops();
  Device d(ops);
  auto data = mt::comm::make_mpi_data_group(*g_world, ops, d.stream());
  float* values = d.zeros(4);
  EXPECT_THROW(data->all_reduce(values, -1, DType::f32, ReduceOp::sum), mt::Error);
  EXPECT_THROW(data->send(values, 4, DType::f32, data->rank(), 0), mt::Error);
  EXPECT_THROW(data->broadcast(values, 4, DType::f32, data->size()), mt::Error);
  // A message longer than the receive expects: the length check fails on the receiving rank.
  const int next = (data->rank() + 1) % data->size(), previous = (data->rank() + data->size() - 1) % data->size();
  auto send = data->send_async(values, 4, DType::f32, next, 9);
  data->recv(values, 2, DType::f32, previous, 9);
  send->wait();
  EXPECT_THROW(ops.synchronize(d.stream()), mt::Error);
  auto half = data->split(data->rank() % 2, data->rank());
  float* ones = d.zeros(3);
  ops.fill(ones, 3, 1.0f, d.stream());
  half->all_reduce(ones, 3, DType::f32, ReduceOp::sum);
  d.download(ones, 3);
  const auto results = d.finish();
  EXPECT_EQ(results[0], std::vector<float>(3, static_cast<float>(half->size())));
  EXPECT_EQ(half->size(), (data->size() + 1 - data->rank() % 2) / 2);
}

}  // namespace
