// The asynchronous CPU op table (tests/backend/async_cpu_ops.h) and the stream-order entries of
// the CPU table (host functions, events, backend/stream_timer.h): a program that calls every
// entry gives the CPU table's results bit for bit when queued; a host read or write of device
// memory between ops dies; a host read of a device_to_host copy's destination without a
// synchronize sees the stale value; host functions and events keep stream order and time the
// queued work, not its issue; queued failures come back from synchronize; pointers on the wrong
// side are refused by name; freed memory comes back zero-filled; and the op harness's whole case
// list passes on it.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "backend/stream_timer.h"
#include "harness/op_cases.h"
#include "harness/op_harness.h"
#include "kernels/common/half.h"
#include "tests/backend/async_cpu_ops.h"

using namespace mt;
using backend::CopyKind;
using backend::DeviceBuffer;
using backend::MemoryCategory;
using backend::Ops;

namespace {

const Ops& async_ops() { return test_backend::async_cpu_ops(); }

template <typename T>
std::vector<T> random_values(size_t n, uint32_t seed, double low, double high) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(low, high);
  std::vector<T> values(n);
  for (T& v : values) v = static_cast<T>(dist(rng));
  return values;
}

// Device copies of host arrays and host copies of device results for one table; the host arrays
// live until the program's end, as a queued copy reads them when the stream reaches it.
class Program {
 public:
  explicit Program(const Ops& ops) : ops_(ops), stream_(ops.default_stream()) {}

  template <typename T>
  T* upload(const std::vector<T>& host) {
    inputs_.push_back(std::make_unique<Holder<T>>(host));
    return allocate_copy(static_cast<Holder<T>&>(*inputs_.back()).values);
  }
  template <typename T>
  T* zeros(size_t n) {
    auto& buffer = buffers_.emplace_back(ops_, static_cast<int64_t>((n * sizeof(T) + 3) / 4), MemoryCategory::activations);
    return reinterpret_cast<T*>(buffer.data());
  }
  // Queues a copy of `n` elements back to the host; read them after finish().
  template <typename T>
  void download(const T* device, size_t n) {
    auto& bits = results_.emplace_back((n * sizeof(T) + 3) / 4);
    ops_.copy(bits.data(), device, static_cast<int64_t>(n * sizeof(T)), CopyKind::device_to_host, stream_);
  }
  std::vector<std::vector<uint32_t>> finish() {
    ops_.synchronize(stream_);
    return results_;
  }
  backend::Stream stream() const { return stream_; }

 private:
  struct HolderBase {
    virtual ~HolderBase() = default;
  };
  template <typename T>
  struct Holder : HolderBase {
    explicit Holder(const std::vector<T>& v) : values(v) {}
    std::vector<T> values;
  };
  template <typename T>
  T* allocate_copy(const std::vector<T>& host) {
    T* device = zeros<T>(host.size());
    ops_.copy(device, host.data(), static_cast<int64_t>(host.size() * sizeof(T)), CopyKind::host_to_device, stream_);
    return device;
  }

  const Ops& ops_;
  backend::Stream stream_;
  std::vector<std::unique_ptr<HolderBase>> inputs_;
  std::vector<DeviceBuffer<float>> buffers_;
  std::vector<std::vector<uint32_t>> results_;
};

// Every entry of the table once, on device memory, chained as a model step chains them; the bits
// of every result (device results copied back, host results as they come).
std::vector<std::vector<uint32_t>> run_every_entry(const Ops& ops) {
  Program d(ops);
  const backend::Stream s = d.stream();
  const int64_t rows = 6;
  const int cols = 16, ffn = 8, heads = 2, head_dim = 8, vocab = 11;
  const auto fx = random_values<float>(rows * cols, 1, -1, 1), fw = random_values<float>(cols, 2, 0.5, 1.5);
  const auto fb = random_values<float>(cols, 3, -0.2, 0.2), fdy = random_values<float>(rows * cols, 4, -1, 1);
  float* x = d.upload(fx);
  float* w = d.upload(fw);
  float* b = d.upload(fb);
  float* dy = d.upload(fdy);

  // Norms, activations.
  float *y = d.zeros<float>(rows * cols), *mean = d.zeros<float>(rows), *rstd = d.zeros<float>(rows);
  float *dx = d.zeros<float>(rows * cols), *dw = d.zeros<float>(cols), *db = d.zeros<float>(cols);
  ops.layernorm_forward(x, w, b, y, mean, rstd, rows, cols, 1e-5f, s);
  ops.layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, rows, cols, s);
  d.download(y, rows * cols);
  d.download(mean, rows);
  d.download(rstd, rows);
  d.download(dx, rows * cols);
  d.download(dw, cols);
  d.download(db, cols);
  float *ry = d.zeros<float>(rows * cols), *rr = d.zeros<float>(rows), *rdx = d.zeros<float>(rows * cols);
  float* rdw = d.zeros<float>(cols);
  ops.rmsnorm_forward(x, w, ry, rr, rows, cols, 1e-6f, s);
  ops.rmsnorm_backward(dy, x, w, rr, rdx, rdw, rows, cols, s);
  d.download(ry, rows * cols);
  d.download(rdx, rows * cols);
  d.download(rdw, cols);
  float *gy = d.zeros<float>(rows * cols), *gdx = d.zeros<float>(rows * cols);
  ops.gelu_forward(y, gy, rows * cols, s);
  ops.gelu_backward(dy, y, gdx, rows * cols, s);
  d.download(gy, rows * cols);
  d.download(gdx, rows * cols);
  float *sy = d.zeros<float>(rows * ffn), *sdx = d.zeros<float>(rows * cols);
  ops.swiglu_forward(x, sy, rows, ffn, s);  // (rows, 2 ffn) = (rows, cols)
  ops.swiglu_backward(dy, x, sdx, rows, ffn, s);
  d.download(sy, rows * ffn);
  d.download(sdx, rows * cols);

  // Rotary embedding and attention over one sample of `rows` tokens, q | k | v packed per row.
  std::vector<int32_t> positions_host(rows), docs_host(rows);
  for (int64_t r = 0; r < rows; ++r) {
    positions_host[r] = static_cast<int32_t>(r);
    docs_host[r] = r < 3 ? 0 : 3;
  }
  const int32_t* positions = d.upload(positions_host);
  const int32_t* docs = d.upload(docs_host);
  const int64_t qkv_width = 3 * heads * head_dim;
  float* qkv = d.upload(random_values<float>(rows * qkv_width, 5, -1, 1));
  ops.rope_forward(qkv, rows, qkv_width, 2 * heads, head_dim, positions, 10000.0f, s);
  kernels::AttentionShape shape;
  shape.q_len = shape.kv_len = static_cast<int>(rows);
  shape.q_heads = shape.kv_heads = heads;
  shape.head_dim = head_dim;
  shape.q_stride = shape.k_stride = shape.v_stride = qkv_width;
  shape.o_stride = heads * head_dim;
  shape.scale = 0.35f;
  const int64_t q_off = 0, k_off = heads * head_dim, v_off = 2 * heads * head_dim;
  float *out = d.zeros<float>(rows * heads * head_dim), *lse = d.zeros<float>(heads * rows);
  ops.attention_forward(shape, qkv + q_off, qkv + k_off, qkv + v_off, docs, out, lse, s);
  float* dout = d.upload(random_values<float>(rows * heads * head_dim, 6, -1, 1));
  float* dqkv = d.zeros<float>(rows * qkv_width);
  ops.attention_backward(shape, qkv + q_off, qkv + k_off, qkv + v_off, docs, out, dout, lse, dqkv + q_off,
                         dqkv + k_off, dqkv + v_off, s);
  const float* part_out = d.upload(random_values<float>(rows * heads * head_dim, 7, -1, 1));
  const float* part_lse = d.upload(random_values<float>(heads * rows, 8, -1, 1));
  ops.attention_merge(shape, out, lse, part_out, part_lse, s);
  ops.rope_backward(dqkv, rows, qkv_width, 2 * heads, head_dim, positions, 10000.0f, s);
  d.download(out, rows * heads * head_dim);
  d.download(lse, heads * rows);
  d.download(dqkv, rows * qkv_width);

  // Embedding, GEMM to logits, cross-entropy.
  std::vector<int32_t> tokens_host = {3, 0, 10, 7, 3, 5};
  const int32_t* tokens = d.upload(tokens_host);
  const int64_t ld = 12;  // the vocabulary padded to 12 rows of wte and columns of the logits
  float* wte = d.upload(random_values<float>(ld * cols, 9, -1, 1));
  float* wpe = d.upload(random_values<float>(rows * cols, 10, -1, 1));
  float* emb = d.zeros<float>(rows * cols);
  ops.embedding_forward(tokens, positions, wte, wpe, emb, rows, cols, 0, vocab, s);
  float *dwte = d.zeros<float>(vocab * cols), *dwpe = d.zeros<float>(rows * cols);
  ops.embedding_backward(tokens, positions, dy, dwte, dwpe, rows, cols, 0, vocab, s);
  d.download(emb, rows * cols);
  d.download(dwte, vocab * cols);
  d.download(dwpe, rows * cols);
  float* logits = d.zeros<float>(rows * ld);
  ops.gemm(false, true, rows, ld, cols, 1.0f, emb, cols, wte, cols, 0.0f, logits, ld,
           ops.gemm_operand_type(Precision::fp32), s);
  float *row_max = d.zeros<float>(rows), *row_sumexp = d.zeros<float>(rows), *target = d.zeros<float>(rows);
  ops.xent_row_max(logits, rows, ld, vocab, row_max, s);
  ops.xent_row_sumexp(logits, rows, ld, vocab, row_max, row_sumexp, s);
  ops.xent_target_logit(logits, rows, ld, vocab, 0, tokens, target, s);
  const float* mask = d.upload(std::vector<float>{1, 1, 0, 1, 1, 1});
  double* loss_sums = d.zeros<double>(2);
  ops.xent_loss_sums(row_max, row_sumexp, target, mask, rows, loss_sums, loss_sums + 1, s);
  d.download(loss_sums, 2);
  const float* dloss = d.upload(std::vector<float>(rows, 0.25f));
  ops.xent_backward(logits, rows, ld, vocab, 0, tokens, row_max, row_sumexp, dloss, s);
  d.download(logits, rows * ld);

  // Elementwise, bias, reductions, dropout.
  ops.add_inplace(emb, dx, rows * cols, s);
  ops.scale_inplace(emb, rows * cols, 0.75f, s);
  ops.bias_add(emb, b, rows, cols, s);
  float* dbias = d.zeros<float>(cols);
  ops.bias_backward(emb, dbias, rows, cols, s);
  d.download(emb, rows * cols);
  d.download(dbias, cols);
  double* sum_squares = d.zeros<double>(1);
  ops.sum_squares(emb, rows * cols, sum_squares, s);
  d.download(sum_squares, 1);
  int32_t* finite = d.upload(std::vector<int32_t>{1});
  ops.all_finite(emb, rows * cols, finite, s);
  d.download(finite, 1);
  std::vector<int64_t> row_ids_host(rows);
  for (int64_t r = 0; r < rows; ++r) row_ids_host[r] = 100 + r;
  const int64_t* row_ids = d.upload(row_ids_host);
  kernels::DropoutKey key;
  key.seed = 7;
  key.p = 0.3f;
  ops.dropout_forward(emb, rows, cols, row_ids, 4, key, s);
  ops.dropout_backward(gdx, rows, cols, row_ids, 4, key, s);
  d.download(emb, rows * cols);
  d.download(gdx, rows * cols);

  // Optimizer, conversions, fills and copies.
  float *m1 = d.zeros<float>(rows * cols), *m2 = d.zeros<float>(rows * cols);
  uint16_t* bf16 = d.zeros<uint16_t>(rows * cols);
  kernels::AdamWParams adam;
  adam.lr = 0.01f;
  adam.weight_decay = 0.1f;
  adam.bias_correction1 = 0.1f;
  adam.bias_correction2 = 0.001f;
  ops.adamw_update(wpe, bf16, dx, m1, m2, rows * cols, adam, s);
  d.download(wpe, rows * cols);
  d.download(m2, rows * cols);
  d.download(bf16, rows * cols);
  uint16_t* half = d.zeros<uint16_t>(rows * cols);
  float* widened = d.zeros<float>(rows * cols);
  ops.convert(y, DType::f32, half, DType::f16, rows * cols, s);
  ops.convert(half, DType::f16, widened, DType::f32, rows * cols, s);
  d.download(widened, rows * cols);
  ops.round_through(y, widened, rows * cols, DType::bf16, s);
  d.download(widened, rows * cols);
  ops.fill(widened, rows * cols, 2.5f, s);
  ops.zero(widened + 3, 5 * sizeof(float), s);
  float* block = d.zeros<float>(rows * 4);
  ops.copy_2d(block, 4 * sizeof(float), widened + 1, cols * sizeof(float), 4 * sizeof(float), rows,
              CopyKind::device_to_device, s);
  ops.copy(block + 1, y, 3 * sizeof(float), CopyKind::device_to_device, s);
  d.download(block, rows * 4);
  std::vector<float> host_rows(rows * 2, -1.0f);
  ops.copy_2d(host_rows.data(), 2 * sizeof(float), y + 5, cols * sizeof(float), 2 * sizeof(float), rows,
              CopyKind::device_to_host, s);
  auto results = d.finish();
  results.emplace_back(host_rows.size());
  for (size_t i = 0; i < host_rows.size(); ++i) results.back()[i] = std::bit_cast<uint32_t>(host_rows[i]);
  return results;
}

}  // namespace

// The op harness's whole case list (tests/harness/) on the asynchronous table, as on every table:
// every case the CPU runs passes here too, with inputs and results moved only through the
// table's copies and the host touching device memory never.
TEST(AsyncCpuOps, TheOpHarnessCasesPassOnIt) {
  std::ostringstream failures;
  const harness::Coverage coverage = harness::run_cases(async_ops(), harness::op_cases(), failures);
  EXPECT_EQ(coverage.failed(), 0) << failures.str();
  int ran = 0;
  for (const harness::CoverageRow& row : coverage.rows()) {
    EXPECT_TRUE(row.filled) << backend::op_name(row.op);
    ran += row.ran;
  }
  EXPECT_GT(ran, 200);
}

TEST(AsyncCpuOps, EveryEntryGivesTheCpuTablesBitsWhenQueued) {
  const auto cpu = run_every_entry(backend::cpu_ops());
  const auto queued = run_every_entry(async_ops());
  ASSERT_EQ(cpu.size(), queued.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_EQ(cpu[i], queued[i]) << "result " << i;
  EXPECT_GT(cpu.size(), 30u);
  EXPECT_STREQ(async_ops().name, "async-cpu");
  EXPECT_FALSE(async_ops().synchronous);
}

// A fill queued, the stream synchronized: the host then reads the arena between ops.
TEST(AsyncCpuOpsDeathTest, AHostReadOfDeviceMemoryFails) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the table's worker threads do not survive fork alone
  const auto read_after_fill = [] {
    const Ops& ops = async_ops();
    DeviceBuffer<float> buffer(ops, 64, MemoryCategory::activations);
    ops.fill(buffer.data(), 64, 1.0f, ops.default_stream());
    ops.synchronize(ops.default_stream());
    const volatile float* device = buffer.data();
    return device[7];
  };
  EXPECT_DEATH(read_after_fill(), "");
  const auto write_between_ops = [] {
    const Ops& ops = async_ops();
    DeviceBuffer<float> buffer(ops, 64, MemoryCategory::activations);
    volatile float* device = buffer.data();
    device[0] = 3.0f;
  };
  EXPECT_DEATH(write_between_ops(), "");
}

// A device_to_host copy is queued behind work the worker has not started: without a synchronize
// the host buffer still holds what it held, with one it holds the copy.
TEST(AsyncCpuOps, AMissingSynchronizeReadsAStaleValue) {
  const Ops& ops = async_ops();
  const backend::Stream s = ops.default_stream();
  test_backend::set_async_start_delay(std::chrono::seconds(2));
  DeviceBuffer<float> buffer(ops, 4, MemoryCategory::activations);
  float host[4] = {0, 0, 0, 0};
  ops.fill(buffer.data(), 4, 7.0f, s);
  ops.copy(host, buffer.data(), sizeof host, CopyKind::device_to_host, s);
  const float unsynchronized = host[2];
  const auto start = std::chrono::steady_clock::now();
  ops.synchronize(s);  // ends the worker's start delay at once
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const float synchronized = host[2];
  test_backend::set_async_start_delay(std::chrono::microseconds(0));
  EXPECT_EQ(unsynchronized, 0.0f) << "the copy ran before the host read: the table is not asynchronous";
  EXPECT_EQ(synchronized, 7.0f);
  EXPECT_LT(waited, 1.0);
}

TEST(AsyncCpuOps, HostFunctionsAndEventsKeepStreamOrder) {
  const Ops& ops = async_ops();
  const backend::Stream s = ops.default_stream();
  DeviceBuffer<float> buffer(ops, 8, MemoryCategory::activations);
  struct Seen {
    std::vector<std::string> order;
  } seen;
  ops.launch_host_function(s, [](void* p) { static_cast<Seen*>(p)->order.push_back("first"); }, &seen);
  ops.fill(buffer.data(), 8, 1.0f, s);
  ops.launch_host_function(s, [](void* p) { static_cast<Seen*>(p)->order.push_back("second"); }, &seen);
  ops.synchronize(s);
  EXPECT_EQ(seen.order, (std::vector<std::string>{"first", "second"}));

  // A queued sleep timed by events measures the sleep; a host clock around the calls does not.
  backend::StreamTimer timer(ops, s);
  const auto issued = std::chrono::steady_clock::now();
  timer.start();
  ops.launch_host_function(s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }, nullptr);
  timer.stop();
  const double host_clock = std::chrono::duration<double>(std::chrono::steady_clock::now() - issued).count();
  EXPECT_GE(timer.seconds(), 0.295);
  EXPECT_LT(host_clock, 0.2);

  // Elapsed time needs both events recorded and reached.
  const backend::Event unrecorded = ops.create_event();
  const backend::Event recorded = ops.create_event();
  ops.record_event(recorded, s);
  ops.synchronize_event(recorded);
  EXPECT_THROW(ops.elapsed_seconds(unrecorded, recorded), std::logic_error);
  ops.destroy_event(unrecorded);
  ops.destroy_event(recorded);
}

TEST(AsyncCpuOps, TheCpuTableRunsHostFunctionsAtOnceAndTimesWithTheHostClock) {
  const Ops& ops = backend::cpu_ops();
  const backend::Stream s = ops.default_stream();
  int calls = 0;
  ops.launch_host_function(s, [](void* p) { ++*static_cast<int*>(p); }, &calls);
  EXPECT_EQ(calls, 1);
  EXPECT_THROW(ops.launch_host_function(s, [](void*) { throw std::runtime_error("in a host function"); }, nullptr),
               std::runtime_error);
  backend::StreamTimer timer(ops, s);
  timer.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  timer.stop();
  EXPECT_GE(timer.seconds(), 0.019);
  const backend::Event never = ops.create_event();
  EXPECT_THROW(ops.elapsed_seconds(never, never), std::logic_error);
  ops.destroy_event(never);
}

TEST(AsyncCpuOps, QueuedFailuresComeBackFromSynchronize) {
  const Ops& ops = async_ops();
  const backend::Stream s = ops.default_stream();
  ops.launch_host_function(s, [](void*) { throw std::runtime_error("failed in stream order"); }, nullptr);
  EXPECT_THROW(ops.synchronize(s), std::runtime_error);
  EXPECT_NO_THROW(ops.synchronize(s));  // reported once
  // Element types it cannot run are refused when issued, as a device backend checks arguments at
  // launch, and nothing is left for the next synchronize.
  DeviceBuffer<float> buffer(ops, 4, MemoryCategory::activations);
  EXPECT_THROW(ops.convert(buffer.data(), DType::i32, buffer.data(), DType::f32, 4, s), std::invalid_argument);
  EXPECT_NO_THROW(ops.synchronize(s));
}

TEST(AsyncCpuOps, PointersOnTheWrongSideAreRefusedByName) {
  const Ops& ops = async_ops();
  const backend::Stream s = ops.default_stream();
  DeviceBuffer<float> buffer(ops, 16, MemoryCategory::activations);
  DeviceBuffer<double> d_sum(ops, 1, MemoryCategory::activations);
  std::vector<float> host(16, 1.0f);
  EXPECT_TRUE(test_backend::is_async_device_memory(buffer.data(), 16 * sizeof(float)));
  EXPECT_FALSE(test_backend::is_async_device_memory(host.data()));
  try {
    ops.add_inplace(buffer.data(), host.data(), 16, s);
    FAIL() << "a host pointer reached a kernel";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("add_inplace"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops.copy(host.data(), buffer.data(), 64, CopyKind::host_to_device, s), std::invalid_argument);
  EXPECT_THROW(ops.copy(buffer.data(), host.data(), 64, CopyKind::device_to_host, s), std::invalid_argument);
  double* sum = d_sum.data();
  EXPECT_THROW(ops.sum_squares(host.data(), 16, sum, s), std::invalid_argument);
  double host_sum = 0;
  EXPECT_THROW(ops.sum_squares(buffer.data(), 16, &host_sum, s), std::invalid_argument);
  ops.synchronize(s);
}

TEST(AsyncCpuOps, FreedMemoryComesBackZeroFilled) {
  const Ops& ops = async_ops();
  const backend::Stream s = ops.default_stream();
  std::vector<const void*> before;
  {
    std::vector<DeviceBuffer<float>> buffers;
    for (int i = 0; i < 8; ++i) {
      buffers.emplace_back(ops, 1000, MemoryCategory::weights);
      ops.fill(buffers.back().data(), 1000, 9.0f, s);
      before.push_back(buffers.back().data());
    }
  }
  std::vector<DeviceBuffer<float>> again;
  int reused = 0;
  std::vector<std::vector<float>> host(8, std::vector<float>(1000, -1.0f));
  for (int i = 0; i < 8; ++i) {
    again.emplace_back(ops, 1000, MemoryCategory::weights);
    reused += std::find(before.begin(), before.end(), again.back().data()) != before.end();
    ops.copy(host[i].data(), again.back().data(), 4000, CopyKind::device_to_host, s);
  }
  ops.synchronize(s);
  EXPECT_GT(reused, 0) << "no freed page was handed out again";
  for (const auto& values : host) EXPECT_EQ(values, std::vector<float>(1000, 0.0f));
}
