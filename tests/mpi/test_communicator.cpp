// The MPI communicator under mpirun (2, 3 and 4 ranks): every operation on integer-valued data
// (exact in any reduction order, in every dtype), odd counts, groups made by split, non-blocking
// completion in any order, point-to-point rings with tags, blocked-time accounting and argument
// errors. Each test runs on three communicators: the world one make_world_communicator() gives
// (progress thread on), one without the progress thread, and one that passes at most 100
// elements per MPI call, so counts of 1023 cross the derived-datatype and chunking paths. The
// host-name exchange gives each rank the node-local index and count mpirun gives.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/mpi_runtime.h"
#include "comm/node_ranks.h"
#include "core/error.h"
#include "core/threads.h"
#include "kernels/common/half.h"

namespace {

using mt::DType;
using mt::comm::Communicator;
using mt::comm::ReduceOp;

// ---- communicators shared by the tests, made after MPI starts and freed before it finishes ----

std::vector<std::unique_ptr<Communicator>> g_comms;
const char* const kCommNames[] = {"World", "NoProgressThread", "Chunked100"};

class CommEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    g_comms.push_back(mt::comm::make_world_communicator());
    g_comms.push_back(mt::comm::make_world_communicator(/*progress_thread=*/false));
    mt::comm::MpiCommunicatorOptions chunked;
    chunked.max_count_per_call = 100;
    g_comms.push_back(mt::comm::make_mpi_communicator(MPI_COMM_WORLD, chunked));
  }
  void TearDown() override { g_comms.clear(); }
};
[[maybe_unused]] auto* const g_environment = ::testing::AddGlobalTestEnvironment(new CommEnvironment);

// ---- typed buffers of small integers: exact in every dtype, so any reduction order is exact ----

// Every dtype whose range holds the test pattern's negative values (so not u8 or u16).
const DType kAllTypes[] = {DType::f32, DType::f64, DType::i8, DType::i16, DType::i32, DType::i64, DType::bf16, DType::f16};
const int64_t kCounts[] = {0, 1, 7, 1023};

class Values {
 public:
  Values(DType dtype, int64_t count) : dtype_(dtype), bytes_(static_cast<size_t>(count) * mt::dtype_size(dtype)) {}
  void* data() { return bytes_.data(); }
  int64_t size() const { return static_cast<int64_t>(bytes_.size() / mt::dtype_size(dtype_)); }
  void set(int64_t i, double v) {
    unsigned char* p = bytes_.data() + i * static_cast<int64_t>(mt::dtype_size(dtype_));
    switch (dtype_) {
      case DType::f32: store(p, static_cast<float>(v)); break;
      case DType::f64: store(p, v); break;
      case DType::i32: store(p, static_cast<int32_t>(v)); break;
      case DType::i64: store(p, static_cast<int64_t>(v)); break;
      case DType::bf16: store(p, mt::kernels::fp32_to_bf16_bits(static_cast<float>(v))); break;
      case DType::f16: store(p, mt::kernels::fp32_to_fp16_bits(static_cast<float>(v))); break;
      case DType::u16: store(p, static_cast<uint16_t>(v)); break;
      case DType::u8: store(p, static_cast<uint8_t>(v)); break;
      case DType::i8: store(p, static_cast<int8_t>(v)); break;
      case DType::i16: store(p, static_cast<int16_t>(v)); break;
    }
  }
  double get(int64_t i) const {
    const unsigned char* p = bytes_.data() + i * static_cast<int64_t>(mt::dtype_size(dtype_));
    switch (dtype_) {
      case DType::f32: return load<float>(p);
      case DType::f64: return load<double>(p);
      case DType::i32: return load<int32_t>(p);
      case DType::i64: return static_cast<double>(load<int64_t>(p));
      case DType::bf16: return mt::kernels::bf16_bits_to_fp32(load<uint16_t>(p));
      case DType::f16: return mt::kernels::fp16_bits_to_fp32(load<uint16_t>(p));
      case DType::u16: return load<uint16_t>(p);
      case DType::u8: return load<uint8_t>(p);
      case DType::i8: return load<int8_t>(p);
      case DType::i16: return load<int16_t>(p);
    }
    return 0;
  }
  // Every element set to fn(i).
  template <typename Fn>
  Values& fill(Fn fn) {
    for (int64_t i = 0; i < size(); ++i) set(i, fn(i));
    return *this;
  }

 private:
  template <typename T>
  static void store(unsigned char* p, T v) {
    std::memcpy(p, &v, sizeof v);
  }
  template <typename T>
  static T load(const unsigned char* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  DType dtype_;
  std::vector<unsigned char> bytes_;
};

// Rank r's element i of a test pattern: small integers in [-4, 8] that are not monotonic in r (so
// max and min pick different ranks for different i); sums over 4 ranks stay below 2^8 (exact in
// bf16). The period 13 divides none of the counts, so blocks at different offsets differ.
double pattern(int r, int64_t i) { return static_cast<double>((r * 5 + i * 3) % 13) - 4; }

double reduce_pattern(ReduceOp op, int ranks, int64_t i, int64_t offset = 0) {
  double result = pattern(0, i + offset);
  for (int r = 1; r < ranks; ++r) {
    const double v = pattern(r, i + offset);
    result = op == ReduceOp::sum ? result + v : op == ReduceOp::max ? std::max(result, v) : std::min(result, v);
  }
  return result;
}

std::string label(DType dtype, int64_t count, const char* what = "") {
  return std::string(what) + " " + mt::dtype_name(dtype) + " count " + std::to_string(count);
}

class CommunicatorTest : public ::testing::TestWithParam<int> {
 protected:
  Communicator& comm() { return *g_comms.at(static_cast<size_t>(GetParam())); }
};

// ---- collectives ----

TEST_P(CommunicatorTest, AllReduceEveryDtypeOpAndCount) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  for (DType dtype : kAllTypes) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
      for (int64_t count : kCounts) {
        Values v(dtype, count);
        v.fill([&](int64_t i) { return pattern(r, i); });
        c.all_reduce(v.data(), count, dtype, op);
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(v.get(i), reduce_pattern(op, n, i)) << label(dtype, count) << " op " << static_cast<int>(op) << " i " << i;
        }
      }
    }
  }
}

TEST_P(CommunicatorTest, ReduceScatterIntoSeparateAndOwnBlock) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  for (DType dtype : kAllTypes) {
    for (int64_t count : kCounts) {
      Values full(dtype, count * n), shard(dtype, count);
      full.fill([&](int64_t i) { return pattern(r, i); });
      c.reduce_scatter(full.data(), shard.data(), count, dtype, ReduceOp::sum);
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(shard.get(i), reduce_pattern(ReduceOp::sum, n, i, r * count)) << label(dtype, count);
      }
      // In place: the shard is this rank's block of the full buffer.
      void* own_block = static_cast<unsigned char*>(full.data()) + r * count * static_cast<int64_t>(mt::dtype_size(dtype));
      c.reduce_scatter(full.data(), own_block, count, dtype, ReduceOp::max);
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(full.get(r * count + i), reduce_pattern(ReduceOp::max, n, i, r * count)) << label(dtype, count, "in place");
      }
    }
  }
}

TEST_P(CommunicatorTest, AllGatherFromSeparateAndOwnBlock) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  for (DType dtype : kAllTypes) {
    for (int64_t count : kCounts) {
      Values mine(dtype, count), all(dtype, count * n);
      mine.fill([&](int64_t i) { return pattern(r, i); });
      c.all_gather(mine.data(), all.data(), count, dtype);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(all.get(q * count + i), pattern(q, i)) << label(dtype, count);
      // In place: this rank's contribution already sits in its block.
      Values in_place(dtype, count * n);
      for (int64_t i = 0; i < count; ++i) in_place.set(r * count + i, pattern(r, i) + 1);
      c.all_gather(static_cast<unsigned char*>(in_place.data()) + r * count * static_cast<int64_t>(mt::dtype_size(dtype)),
                   in_place.data(), count, dtype);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(in_place.get(q * count + i), pattern(q, i) + 1) << label(dtype, count, "in place");
    }
  }
}

TEST_P(CommunicatorTest, AllToAllSwapsBlocks) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  for (DType dtype : {DType::f32, DType::i64, DType::bf16}) {
    for (int64_t count : kCounts) {
      Values send(dtype, count * n), recv(dtype, count * n);
      send.fill([&](int64_t i) { return pattern(r * n + static_cast<int>(i / std::max<int64_t>(count, 1)), i); });
      c.all_to_all(send.data(), recv.data(), count, dtype);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(recv.get(q * count + i), pattern(q * n + r, r * count + i)) << label(dtype, count);
        }
    }
  }
}

// Rank s sends rank d this many elements: uneven, some zero, one crossing 100 (the chunked limit).
int64_t piece(int s, int d, int64_t scale) { return ((s * 3 + d * 2) % 5) * scale + (s == d ? 0 : 1); }

TEST_P(CommunicatorTest, AllToAllvWithUnevenCountsAndScatteredOffsets) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  for (int64_t scale : {int64_t{0}, int64_t{3}, int64_t{60}}) {
    for (DType dtype : {DType::f64, DType::i32, DType::f16}) {
      std::vector<int64_t> send_counts(n), send_offsets(n), recv_counts(n), recv_offsets(n);
      // Pieces stored in reverse rank order with a gap of 2 elements before each.
      int64_t send_total = 0, recv_total = 0;
      for (int q = n - 1; q >= 0; --q) {
        send_counts[q] = piece(r, q, scale);
        send_offsets[q] = send_total + 2;
        send_total += send_counts[q] + 2;
        recv_counts[q] = piece(q, r, scale);
        recv_offsets[q] = recv_total + 2;
        recv_total += recv_counts[q] + 2;
      }
      Values send(dtype, send_total), recv(dtype, recv_total);
      send.fill([](int64_t) { return -7; });
      recv.fill([](int64_t) { return -9; });  // the gaps must keep this
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < send_counts[q]; ++i) send.set(send_offsets[q] + i, pattern(r * n + q, i));
      c.all_to_allv(send.data(), send_counts.data(), send_offsets.data(), recv.data(), recv_counts.data(),
                    recv_offsets.data(), dtype);
      std::vector<bool> in_piece(static_cast<size_t>(recv_total), false);
      for (int q = 0; q < n; ++q)
        for (int64_t i = 0; i < recv_counts[q]; ++i) {
          in_piece[static_cast<size_t>(recv_offsets[q] + i)] = true;
          ASSERT_EQ(recv.get(recv_offsets[q] + i), pattern(q * n + r, i)) << "from " << q << " scale " << scale;
        }
      for (int64_t i = 0; i < recv_total; ++i) {
        if (!in_piece[static_cast<size_t>(i)]) {
          ASSERT_EQ(recv.get(i), -9) << "gap element " << i << " overwritten";
        }
      }
    }
  }
}

TEST_P(CommunicatorTest, BroadcastFromEveryRoot) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  for (int root = 0; root < n; ++root) {
    for (DType dtype : {DType::f32, DType::i32, DType::bf16}) {
      for (int64_t count : kCounts) {
        Values v(dtype, count);
        v.fill([&](int64_t i) { return r == root ? pattern(root, i) : 99; });
        c.broadcast(v.data(), count, dtype, root);
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(v.get(i), pattern(root, i)) << label(dtype, count) << " root " << root;
      }
    }
  }
}

TEST_P(CommunicatorTest, BroadcastTextFromEveryRoot) {
  Communicator& c = comm();
  for (int root = 0; root < c.size(); ++root) {
    // Longer and shorter than the root's, and empty.
    std::string text = c.rank() == root ? "from rank " + std::to_string(root) : std::string(c.rank() * 40, 'x');
    mt::comm::broadcast_text(c, text, root);
    EXPECT_EQ(text, "from rank " + std::to_string(root));
    std::string empty = c.rank() == root ? "" : "not empty";
    mt::comm::broadcast_text(c, empty, root);
    EXPECT_EQ(empty, "");
  }
}

// ---- blocked time ----

TEST_P(CommunicatorTest, WaitSecondsGrowsWhileARankIsLate) {
  Communicator& c = comm();
  // Ranks other than 0 wait for rank 0 twice, in a blocking barrier and in a request's wait().
  // wait_seconds() must grow by the time each call was blocked, measured around the call here;
  // rank 0's sleep makes that time long. A rank that arrives late blocks for less, and both
  // measures shrink together; but a rank descheduled between the call's own clock and this one
  // (an oversubscribed, loaded machine) measures more here than inside. So an attempt is judged
  // on every rank, and up to five are made: the accounting must match in one of them, where a
  // communicator that did not count blocked time would fail every attempt.
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  const auto late = std::chrono::milliseconds(300);
  const auto near = [](double accounted, double measured) {
    return std::abs(accounted - measured) <= 0.1 * measured + 0.005;
  };
  int matched_everywhere = 0;
  double accounted_barrier = 0, measured_barrier = 0, accounted_wait = 0, measured_wait = 0;
  for (int attempt = 0; attempt < 5 && !matched_everywhere; ++attempt) {
    c.barrier();
    const double before_barrier = c.wait_seconds();
    if (c.rank() == 0) std::this_thread::sleep_for(late);
    const auto barrier_start = Clock::now();
    c.barrier();
    measured_barrier = seconds_since(barrier_start);
    const double before_wait = c.wait_seconds();
    accounted_barrier = before_wait - before_barrier;
    float value = 1;
    if (c.rank() == 0) std::this_thread::sleep_for(late);
    auto request = c.all_reduce_async(&value, 1, DType::f32, ReduceOp::sum);
    const auto wait_start = Clock::now();
    request->wait();
    measured_wait = seconds_since(wait_start);
    accounted_wait = c.wait_seconds() - before_wait;
    ASSERT_EQ(value, c.size());
    int matched = c.rank() == 0 || (near(accounted_barrier, measured_barrier) && near(accounted_wait, measured_wait));
    c.all_reduce(&matched, 1, DType::i32, ReduceOp::min);
    matched_everywhere = matched;
  }
  EXPECT_TRUE(matched_everywhere) << "rank " << c.rank() << ", last attempt: barrier accounted " << accounted_barrier
                                  << " s, measured " << measured_barrier << " s; wait accounted " << accounted_wait
                                  << " s, measured " << measured_wait << " s";
}

// ---- point to point ----

TEST_P(CommunicatorTest, BlockingRingWithTags) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank(), next = (r + 1) % n, previous = (r + n - 1) % n;
  for (int64_t count : kCounts) {
    Values out(DType::i64, count), in(DType::i64, count);
    out.fill([&](int64_t i) { return pattern(r, i); });
    // Even ranks send first and odd ranks receive first, so blocking calls cannot deadlock.
    if (r % 2 == 0) {
      c.send(out.data(), count, DType::i64, next, 40 + r);
      c.recv(in.data(), count, DType::i64, previous, 40 + previous);
    } else {
      c.recv(in.data(), count, DType::i64, previous, 40 + previous);
      c.send(out.data(), count, DType::i64, next, 40 + r);
    }
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(in.get(i), pattern(previous, i)) << "count " << count;
  }
}

TEST_P(CommunicatorTest, AsyncRingMatchesByTagNotOrder) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank(), next = (r + 1) % n, previous = (r + n - 1) % n;
  const int64_t count = 1023;
  Values first(DType::f32, count), second(DType::f32, count), got_first(DType::f32, count), got_second(DType::f32, count);
  first.fill([&](int64_t i) { return pattern(r, i); });
  second.fill([&](int64_t i) { return pattern(r + 1, i); });
  // Receives posted tag 2 first, sends issued tag 1 first, completions waited in yet another order.
  auto receive_second = c.recv_async(got_second.data(), count, DType::f32, previous, 2);
  auto receive_first = c.recv_async(got_first.data(), count, DType::f32, previous, 1);
  auto send_first = c.send_async(first.data(), count, DType::f32, next, 1);
  auto send_second = c.send_async(second.data(), count, DType::f32, next, 2);
  receive_first->wait();
  while (!receive_second->test()) {
  }
  send_second->wait();
  send_first->wait();
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(got_first.get(i), pattern(previous, i));
    ASSERT_EQ(got_second.get(i), pattern(previous + 1, i));
  }
}

TEST_P(CommunicatorTest, RecvOfTheWrongLengthFailsByName) {
  Communicator& c = comm();
  std::vector<int32_t> buffer(8, 0);
  if (c.rank() == 0) c.send(buffer.data(), 3, DType::i32, 1, 5);
  if (c.rank() == 1) {
    try {
      c.recv(buffer.data(), 5, DType::i32, 0, 5);
      ADD_FAILURE() << "a 3-element message received as 5 elements";
    } catch (const mt::Error& e) {
      EXPECT_NE(std::string(e.what()).find("has 3 elements, expected 5"), std::string::npos) << e.what();
    }
  }
  c.barrier();
}

TEST_P(CommunicatorTest, BadArgumentsAreErrorsNamingTheOperation) {
  Communicator& c = comm();
  const int n = c.size();
  float x = 0;
  auto message_of = [](auto fn) {
    try {
      fn();
    } catch (const mt::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message_of([&] { c.send(&x, 1, DType::f32, c.rank(), 0); }),
            "send: rank " + std::to_string(c.rank()) + " cannot message itself");
  EXPECT_EQ(message_of([&] { c.recv(&x, 1, DType::f32, n, 0); }),
            "recv: peer " + std::to_string(n) + " is outside the group of " + std::to_string(n));
  EXPECT_EQ(message_of([&] { c.send_async(&x, 1, DType::f32, (c.rank() + 1) % n, -1); }).rfind("send_async: tag -1", 0), 0u);
  EXPECT_EQ(message_of([&] { c.all_reduce(&x, -1, DType::f32, ReduceOp::sum); }), "all_reduce: negative element count -1");
  EXPECT_EQ(message_of([&] { c.broadcast(&x, 1, DType::f32, -1); }),
            "broadcast: root -1 is outside the group of " + std::to_string(n));
  EXPECT_EQ(message_of([&] { c.split(-2, 0); }), "split: negative color -2");
  std::vector<float> full(static_cast<size_t>(2 * n));
  // A shard that overlaps the full buffer off a block boundary.
  const void* misaligned = reinterpret_cast<const unsigned char*>(full.data()) + 2;
  EXPECT_NE(message_of([&] { c.all_gather(misaligned, full.data(), 1, DType::f32); }).find("not block"), std::string::npos);
}

// ---- non-blocking collectives ----

TEST_P(CommunicatorTest, NonBlockingCompleteInAnyOrder) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  const int64_t count = 1023;
  Values a(DType::f32, count), b(DType::i64, count), d(DType::bf16, count), shard(DType::f64, count), full(DType::f64, count * n),
      mine(DType::i32, count), gathered(DType::i32, count * n);
  a.fill([&](int64_t i) { return pattern(r, i); });
  b.fill([&](int64_t i) { return pattern(r, i); });
  d.fill([&](int64_t i) { return pattern(r, i); });
  full.fill([&](int64_t i) { return pattern(r, i); });
  mine.fill([&](int64_t i) { return pattern(r, i); });
  auto reduce_a = c.all_reduce_async(a.data(), count, DType::f32, ReduceOp::sum);
  auto reduce_b = c.all_reduce_async(b.data(), count, DType::i64, ReduceOp::max);
  auto scatter = c.reduce_scatter_async(full.data(), shard.data(), count, DType::f64, ReduceOp::sum);
  auto gather = c.all_gather_async(mine.data(), gathered.data(), count, DType::i32);
  auto reduce_d = c.all_reduce_async(d.data(), count, DType::bf16, ReduceOp::min);
  // Last started, first completed; then test() loops; one left for its destructor.
  gather->wait();
  while (!reduce_b->test()) c.progress();
  while (!scatter->test()) {
  }
  EXPECT_TRUE(scatter->test());  // stays complete
  reduce_a->wait();
  reduce_a->wait();  // waiting twice is harmless
  reduce_d.reset();  // the destructor waits
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(a.get(i), reduce_pattern(ReduceOp::sum, n, i));
    ASSERT_EQ(b.get(i), reduce_pattern(ReduceOp::max, n, i));
    ASSERT_EQ(d.get(i), reduce_pattern(ReduceOp::min, n, i));
    ASSERT_EQ(shard.get(i), reduce_pattern(ReduceOp::sum, n, i, r * count));
    for (int q = 0; q < n; ++q) ASSERT_EQ(gathered.get(q * count + i), pattern(q, i));
  }
}

TEST_P(CommunicatorTest, BlockingCallsWhileABucketIsInFlight) {
  // The caller's blocking calls run while the progress thread (where there is one) drives the
  // bucket: both threads inside MPI at once.
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  std::vector<float> bucket(1 << 18);
  for (size_t i = 0; i < bucket.size(); ++i) bucket[i] = static_cast<float>(pattern(r, static_cast<int64_t>(i)));
  auto request = c.all_reduce_async(bucket.data(), static_cast<int64_t>(bucket.size()), DType::f32, ReduceOp::sum);
  for (int round = 0; round < 20; ++round) {
    int64_t value = r + round;
    c.all_reduce(&value, 1, DType::i64, ReduceOp::sum);
    ASSERT_EQ(value, n * (n - 1) / 2 + n * round);
    int32_t token = r;
    c.broadcast(&token, 1, DType::i32, round % n);
    ASSERT_EQ(token, round % n);
  }
  c.barrier();
  request->wait();
  for (size_t i = 0; i < bucket.size(); ++i) {
    ASSERT_EQ(bucket[i], reduce_pattern(ReduceOp::sum, n, static_cast<int64_t>(i))) << i;
  }
}

TEST_P(CommunicatorTest, NonBlockingInPlaceShardsAndZeroCounts) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  const int64_t count = 257;
  Values grads(DType::f32, count * n), params(DType::f32, count * n);
  grads.fill([&](int64_t i) { return pattern(r, i); });
  for (int64_t i = 0; i < count; ++i) params.set(r * count + i, pattern(r, i));
  const int64_t block_bytes = count * 4;
  auto scatter = c.reduce_scatter_async(grads.data(), static_cast<unsigned char*>(grads.data()) + r * block_bytes, count,
                                        DType::f32, ReduceOp::sum);
  auto gather = c.all_gather_async(static_cast<unsigned char*>(params.data()) + r * block_bytes, params.data(), count,
                                   DType::f32);
  auto nothing = c.all_reduce_async(nullptr, 0, DType::f32, ReduceOp::sum);
  EXPECT_TRUE(nothing->test());
  scatter->wait();
  gather->wait();
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(grads.get(r * count + i), reduce_pattern(ReduceOp::sum, n, i, r * count));
    for (int q = 0; q < n; ++q) ASSERT_EQ(params.get(q * count + i), pattern(q, i));
  }
}

// ---- groups ----

// The world ranks of a group's members, in group order.
std::vector<int> members(Communicator& group, int world_rank) {
  std::vector<int> ranks(static_cast<size_t>(group.size()));
  group.all_gather(&world_rank, ranks.data(), 1, DType::i32);
  return ranks;
}

TEST_P(CommunicatorTest, SplitByColorOrderedByKey) {
  Communicator& c = comm();
  const int n = c.size(), r = c.rank();
  // Uneven colors at odd sizes (r % 2), reversed order by key.
  auto halves = c.split(r % 2, -r);
  std::vector<int> expected;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == r % 2) expected.push_back(q);
  EXPECT_EQ(members(*halves, r), expected);
  EXPECT_EQ(halves->rank(), static_cast<int>(std::find(expected.begin(), expected.end(), r) - expected.begin()));
  // A rank alone: rank 0 in a group of one, the rest together; collectives still work.
  auto alone = c.split(r == 0 ? 0 : 1, 0);
  EXPECT_EQ(alone->size(), r == 0 ? 1 : n - 1);
  int64_t value = r + 1;
  alone->all_reduce(&value, 1, DType::i64, ReduceOp::sum);
  EXPECT_EQ(value, r == 0 ? 1 : n * (n + 1) / 2 - 1);
  if (r == 0) {
    EXPECT_THROW(alone->send(&value, 1, DType::i64, 0, 0), mt::Error);
  }
  // Nested: split a split again.
  auto nested = halves->split(halves->rank() == 0 ? 0 : 1, 0);
  EXPECT_EQ(nested->size(), halves->rank() == 0 ? 1 : halves->size() - 1);
  // Blocked time is per group: a group's calls do not count on its parent.
  EXPECT_GE(halves->wait_seconds(), 0.0);
}

TEST_P(CommunicatorTest, TwoByTwoGridsBothWays) {
  Communicator& c = comm();
  if (c.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int r = c.rank();
  auto rows = c.split(r / 2, r);     // {0,1} {2,3}
  auto columns = c.split(r % 2, r);  // {0,2} {1,3}
  EXPECT_EQ(members(*rows, r), (std::vector<int>{r / 2 * 2, r / 2 * 2 + 1}));
  EXPECT_EQ(members(*columns, r), (std::vector<int>{r % 2, r % 2 + 2}));
  // Reductions in both directions give the grid's row and column sums, and then the total.
  double value = r + 1;
  rows->all_reduce(&value, 1, DType::f64, ReduceOp::sum);
  EXPECT_EQ(value, r < 2 ? 3 : 7);
  columns->all_reduce(&value, 1, DType::f64, ReduceOp::sum);
  EXPECT_EQ(value, 10);
}

TEST_P(CommunicatorTest, ProgressThreadRunsOnlyWhereAsked) {
  Communicator& c = comm();
  int provided = 0;
  MPI_Query_thread(&provided);
  const bool expected = GetParam() != 1 && provided == MPI_THREAD_MULTIPLE;
  EXPECT_EQ(mt::comm::has_progress_thread(c), expected);
  EXPECT_EQ(provided, MPI_THREAD_MULTIPLE) << "MpiRuntime asks for MPI_THREAD_MULTIPLE";
  const long long before = mt::comm::progress_thread_polls(c);
  std::vector<float> bucket(1 << 16, 1.0f);
  auto request = c.all_reduce_async(bucket.data(), static_cast<int64_t>(bucket.size()), DType::f32, ReduceOp::sum);
  // The thread polls every millisecond while the request is in flight; on a loaded machine it may
  // not be scheduled for a while, so give it up to 10 s before the wait completes the request.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  while (expected && mt::comm::progress_thread_polls(c) == before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  request->wait();
  EXPECT_EQ(bucket[0], c.size());
  if (expected) {
    EXPECT_GT(mt::comm::progress_thread_polls(c), before);
  }
}

INSTANTIATE_TEST_SUITE_P(Mpi, CommunicatorTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& info) { return kCommNames[info.param]; });

// ---- the local rank from the ranks themselves (comm/node_ranks.h) ----

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : -1;
}

// Every rank of this job runs on this one machine: the host-name exchange must agree with what
// mpirun says, and MpiRuntime::init has recorded it where threads per rank are decided.
TEST(NodeRanks, HostNameExchangeMatchesTheLaunchersLocalRanks) {
  ASSERT_GT(env_int("OMPI_COMM_WORLD_LOCAL_SIZE"), 0) << "run under Open MPI's mpirun";
  const mt::comm::NodeRanks node = mt::comm::exchange_node_ranks(*g_comms[0]);
  EXPECT_EQ(node.local_count, env_int("OMPI_COMM_WORLD_LOCAL_SIZE"));
  EXPECT_EQ(node.local_rank, env_int("OMPI_COMM_WORLD_LOCAL_RANK"));
  EXPECT_EQ(node.nodes, 1);
  EXPECT_EQ(node.node, 0);
  EXPECT_EQ(mt::comm::MpiRuntime::local_size(), node.local_count);
  EXPECT_EQ(mt::comm::MpiRuntime::local_rank(), node.local_rank);
  // The count threads per rank use came from the exchange, not from the variables.
  const std::string saved = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int without_variable = mt::local_rank_count();
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", saved.c_str(), 1);
  EXPECT_EQ(without_variable, node.local_count);
}

// Made-up host names: ranks 0, 2, 4, ... on node "even", the others on node "odd".
TEST(NodeRanks, RanksSharingAHostNameShareANode) {
  Communicator& world = *g_comms[0];
  const int n = world.size(), me = world.rank();
  const mt::comm::NodeRanks node = mt::comm::exchange_node_ranks(world, me % 2 == 0 ? "even" : "odd");
  EXPECT_EQ(node.nodes, std::min(n, 2));
  EXPECT_EQ(node.node, me % 2);
  EXPECT_EQ(node.local_rank, me / 2);
  EXPECT_EQ(node.local_count, me % 2 == 0 ? (n + 1) / 2 : n / 2);
  EXPECT_THROW(mt::comm::exchange_node_ranks(world, std::string(300, 'x')), mt::Error);
}

}  // namespace
