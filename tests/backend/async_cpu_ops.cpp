// The asynchronous CPU op table for tests (see async_cpu_ops.h): per-stream FIFO workers over the
// CPU table, an mprotect'ed arena for device memory, events and host functions in stream order.
#include "tests/backend/async_cpu_ops.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace mt::test_backend {
namespace {

using backend::CopyKind;
using backend::Event;
using backend::Ops;
using backend::Stream;
using Clock = std::chrono::steady_clock;

[[noreturn]] void fail_system(const char* call) {
  throw std::runtime_error(std::string("async cpu backend: ") + call + ": " + std::strerror(errno));
}

// ---- device memory ----------------------------------------------------------------------------

// Page-granular blocks of one reserved range, PROT_NONE unless an op is running (open()).
class Arena {
 public:
  Arena() {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* base = mmap(nullptr, kReserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) fail_system("mmap");
    base_ = static_cast<unsigned char*>(base);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* allocate(int64_t bytes) {
    const size_t size = (static_cast<size_t>(bytes) + page_ - 1) / page_ * page_;
    const std::lock_guard lock(mutex_);
    size_t offset = used_;
    auto fit = std::find_if(free_.begin(), free_.end(), [&](const auto& block) { return block.second >= size; });
    if (fit != free_.end()) {
      offset = fit->first;
      if (fit->second > size) free_[offset + size] = fit->second - size;
      free_.erase(fit);
    } else {
      if (used_ + size > kReserved) throw std::bad_alloc();
      used_ += size;
      // Pages that join the used range while ops run must be open to them too.
      if (open_ > 0 && mprotect(base_ + offset, size, PROT_READ | PROT_WRITE) != 0) fail_system("mprotect");
    }
    live_[offset] = size;
    return base_ + offset;
  }

  // Callers make sure no queued op uses the block any more.
  void release(void* data) {
    const std::lock_guard lock(mutex_);
    const auto block = live_.find(static_cast<size_t>(static_cast<unsigned char*>(data) - base_));
    if (block == live_.end()) throw std::invalid_argument("async cpu backend: release of memory it did not allocate");
    // Dropped pages read as zero when reused: allocations stay zero-filled without a host write.
    if (madvise(base_ + block->first, block->second, MADV_DONTNEED) != 0) fail_system("madvise");
    free_[block->first] = block->second;
    live_.erase(block);
  }

  bool contains(const void* pointer, int64_t bytes) const {
    const auto* p = static_cast<const unsigned char*>(pointer);
    return p >= base_ && p + std::max<int64_t>(bytes, 1) <= base_ + kReserved;
  }

  // Device access for one running op: the first opens the used pages, the last closes them.
  void open() {
    const std::lock_guard lock(mutex_);
    if (open_++ == 0 && used_ > 0 && mprotect(base_, used_, PROT_READ | PROT_WRITE) != 0) fail_system("mprotect");
  }
  void close() {
    const std::lock_guard lock(mutex_);
    if (--open_ == 0 && used_ > 0 && mprotect(base_, used_, PROT_NONE) != 0) fail_system("mprotect");
  }

 private:
  static constexpr size_t kReserved = size_t{32} << 30;  // address space only (MAP_NORESERVE)
  size_t page_ = 4096;
  unsigned char* base_ = nullptr;
  std::mutex mutex_;
  size_t used_ = 0;  // high-water mark of the blocks handed out
  int open_ = 0;
  std::map<size_t, size_t> free_, live_;  // offset -> bytes
};

// ---- streams ----------------------------------------------------------------------------------

struct Work {
  std::function<void()> run;
  bool device_access = false;  // a kernel or copy: runs with the arena open
};

// One stream: a worker thread running its queue in order.
class Worker {
 public:
  explicit Worker(Arena& arena) : arena_(arena), thread_([this] { loop(); }) {}
  ~Worker() {
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_arrived_.notify_all();
    thread_.join();
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void enqueue(Work work) {
    {
      const std::lock_guard lock(mutex_);
      queue_.push_back(std::move(work));
    }
    work_arrived_.notify_all();
  }

  // Blocks until everything queued so far has run; rethrows (and forgets) the first failure.
  void synchronize() {
    std::unique_lock lock(mutex_);
    wait_drained(lock);
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }
  // As synchronize, keeping a failure for the next synchronize (release may not throw).
  void drain() {
    std::unique_lock lock(mutex_);
    wait_drained(lock);
  }

  // Blocks until `done` holds (checked under the worker's lock after each item).
  template <typename Done>
  void wait_until(Done done) {
    std::unique_lock lock(mutex_);
    ++waiters_;
    work_arrived_.notify_all();
    drained_.wait(lock, [&] { return done(); });
    --waiters_;
  }

  void set_start_delay(std::chrono::microseconds delay) {
    const std::lock_guard lock(mutex_);
    start_delay_ = delay;
  }

 private:
  void wait_drained(std::unique_lock<std::mutex>& lock) {
    ++waiters_;
    work_arrived_.notify_all();  // a waiting host ends the start delay
    drained_.wait(lock, [&] { return queue_.empty() && !busy_; });
    --waiters_;
  }

  void loop() {
    std::unique_lock lock(mutex_);
    while (true) {
      work_arrived_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping
      if (start_delay_.count() > 0) {
        work_arrived_.wait_for(lock, start_delay_, [&] { return stopping_ || waiters_ > 0; });
      }
      while (!queue_.empty()) {
        Work work = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
        lock.unlock();
        run(work);
        lock.lock();
        busy_ = false;
        drained_.notify_all();
      }
    }
  }

  void run(Work& work) {
    if (work.device_access) arena_.open();
    try {
      work.run();
    } catch (...) {
      const std::lock_guard lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
    }
    if (work.device_access) arena_.close();
  }

  Arena& arena_;
  std::mutex mutex_;
  std::condition_variable work_arrived_, drained_;
  std::deque<Work> queue_;
  bool busy_ = false, stopping_ = false;
  int waiters_ = 0;
  std::chrono::microseconds start_delay_{0};
  std::exception_ptr failure_;
  std::thread thread_;
};

// The process's table state: the arena and the streams' workers.
class AsyncBackend {
 public:
  AsyncBackend() {
    workers_.push_back(std::make_unique<Worker>(arena_));
    default_worker_ = workers_.front().get();
  }

  Arena& arena() { return arena_; }
  Worker& worker(Stream stream) { return stream.handle ? *static_cast<Worker*>(stream.handle) : *default_worker_; }
  Stream default_stream() { return Stream{default_worker_}; }
  Stream new_stream() {
    const std::lock_guard lock(mutex_);
    workers_.push_back(std::make_unique<Worker>(arena_));
    workers_.back()->set_start_delay(start_delay_);
    return Stream{workers_.back().get()};
  }
  void drain_all() {
    const std::lock_guard lock(mutex_);
    for (auto& worker : workers_) worker->drain();
  }
  void set_start_delay(std::chrono::microseconds delay) {
    const std::lock_guard lock(mutex_);
    start_delay_ = delay;
    for (auto& worker : workers_) worker->set_start_delay(delay);
  }

 private:
  Arena arena_;  // outlives the workers (declared first)
  std::mutex mutex_;
  std::vector<std::unique_ptr<Worker>> workers_;
  Worker* default_worker_ = nullptr;
  std::chrono::microseconds start_delay_{0};
};

AsyncBackend& state() {
  static AsyncBackend backend;
  return backend;
}

void check_device(const char* entry, const void* pointer, int64_t bytes = 1) {
  if (pointer && !state().arena().contains(pointer, bytes)) {
    throw std::invalid_argument(std::string("async cpu backend: ") + entry +
                                " got a pointer outside device memory");
  }
}

void check_host(const char* entry, const void* pointer) {
  if (pointer && state().arena().contains(pointer, 1)) {
    throw std::invalid_argument(std::string("async cpu backend: ") + entry +
                                "'s host side points into device memory");
  }
}

// ---- kernel entries: the CPU table's, queued --------------------------------------------------

template <size_t N>
struct EntryName {
  constexpr EntryName(const char (&text)[N]) { std::copy_n(text, N, value); }
  char value[N];
};

// Checks every pointer argument except those `HostArgs` marks (bit i: argument i is host memory).
template <EntryName Name, uint32_t HostArgs, typename... Args, size_t... I>
void check_pointers(std::index_sequence<I...>, const Args&... args) {
  const auto check_one = [](size_t index, const auto& arg) {
    if constexpr (std::is_pointer_v<std::decay_t<decltype(arg)>>) {
      if (((HostArgs >> index) & 1u) == 0) check_device(Name.value, arg);
    }
  };
  (check_one(I, args), ...);
}

template <typename... Args>
Stream stream_of(const Args&... args) {
  return std::get<sizeof...(Args) - 1>(std::forward_as_tuple(args...));
}

// An entry that returns nothing: its CPU kernel queued on the stream (the last argument).
template <EntryName Name, auto Member, typename Signature>
struct Queued;
template <EntryName Name, auto Member, typename... Args>
struct Queued<Name, Member, void (*)(Args...)> {
  static void run(Args... args) {
    check_pointers<Name, 0>(std::index_sequence_for<Args...>{}, args...);
    const Stream stream = stream_of(args...);
    state().worker(stream).enqueue(Work{[values = std::make_tuple(std::decay_t<Args>(args)...)]() mutable {
                                          std::apply(backend::cpu_ops().*Member, values);
                                        },
                                        true});
  }
};

#define MT_QUEUED(entry) &Queued<#entry, &Ops::entry, decltype(Ops::entry)>::run

// ---- memory, streams, copies ------------------------------------------------------------------

void* allocate(int64_t bytes, backend::MemoryCategory) { return bytes > 0 ? state().arena().allocate(bytes) : nullptr; }

void release(void* data, int64_t, backend::MemoryCategory) {
  if (!data) return;
  state().drain_all();  // as cudaFree: no queued op may still use it (failures stay for synchronize)
  state().arena().release(data);
}

Stream default_stream() { return state().default_stream(); }

// Host waits asked for (synchronize and synchronize_event calls), for tests that count them.
std::atomic<int64_t> host_waits{0};

void synchronize(Stream stream) {
  ++host_waits;
  state().worker(stream).synchronize();
}

// A copy's sides checked by its kind: device memory where the kind says device, host elsewhere.
void check_copy(const char* entry, void* dst, const void* src, int64_t dst_extent, int64_t src_extent, CopyKind kind) {
  if (kind == CopyKind::host_to_device) {
    check_host(entry, src);
  } else {
    check_device(entry, src, src_extent);
  }
  if (kind == CopyKind::device_to_host) {
    check_host(entry, dst);
  } else {
    check_device(entry, dst, dst_extent);
  }
}

void copy(void* dst, const void* src, int64_t bytes, CopyKind kind, Stream stream) {
  if (bytes <= 0) return;
  check_copy("copy", dst, src, bytes, bytes, kind);
  state().worker(stream).enqueue(Work{[=] { backend::cpu_ops().copy(dst, src, bytes, kind, Stream{}); }, true});
}

void copy_2d(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width_bytes, int64_t rows,
             CopyKind kind, Stream stream) {
  if (rows <= 0 || width_bytes <= 0) return;
  check_copy("copy_2d", dst, src, (rows - 1) * dst_pitch + width_bytes, (rows - 1) * src_pitch + width_bytes, kind);
  state().worker(stream).enqueue(Work{[=] {
                                        backend::cpu_ops().copy_2d(dst, dst_pitch, src, src_pitch, width_bytes, rows,
                                                                   kind, Stream{});
                                      },
                                      true});
}

// ---- stream order: host functions and events ---------------------------------------------------

void launch_host_function(Stream stream, backend::HostFunction function, void* argument) {
  state().worker(stream).enqueue(Work{[function, argument] { function(argument); }, false});
}

// An event: how many records were issued, how many the stream has reached, and the clock at the
// last one reached. Queued records share it, so destroying an event with a record in flight is safe.
struct EventState {
  std::mutex mutex;
  uint64_t issued = 0, reached = 0;
  Clock::time_point time;
  Worker* worker = nullptr;
};
using EventHandle = std::shared_ptr<EventState>;

EventHandle& handle_of(Event event) { return *static_cast<EventHandle*>(event.handle); }

Event create_event() { return Event{new EventHandle(std::make_shared<EventState>())}; }

void destroy_event(Event event) { delete static_cast<EventHandle*>(event.handle); }

void record_event(Event event, Stream stream) {
  EventHandle shared = handle_of(event);
  Worker& worker = state().worker(stream);
  uint64_t record = 0;
  {
    const std::lock_guard lock(shared->mutex);
    record = ++shared->issued;
    shared->worker = &worker;
  }
  worker.enqueue(Work{[shared, record] {
                        const std::lock_guard lock(shared->mutex);
                        shared->time = Clock::now();
                        shared->reached = std::max(shared->reached, record);
                      },
                      false});
}

void synchronize_event(Event event) {
  ++host_waits;
  const EventHandle shared = handle_of(event);
  Worker* worker = nullptr;
  uint64_t issued = 0;
  {
    const std::lock_guard lock(shared->mutex);
    worker = shared->worker;
    issued = shared->issued;
  }
  if (!worker) return;  // never recorded
  worker->wait_until([&] {
    const std::lock_guard lock(shared->mutex);
    return shared->reached >= issued;
  });
}

double elapsed_seconds(Event start, Event end) {
  const auto time_of = [](Event event) {
    const EventHandle& shared = handle_of(event);
    const std::lock_guard lock(shared->mutex);
    if (shared->issued == 0 || shared->reached < shared->issued) {
      throw std::logic_error("async cpu backend: elapsed_seconds between events not both recorded and completed");
    }
    return shared->time;
  };
  return std::chrono::duration<double>(time_of(end) - time_of(start)).count();
}

// ---- the table --------------------------------------------------------------------------------

DType gemm_operand_type(Precision precision) { return backend::cpu_ops().gemm_operand_type(precision); }

// It runs the CPU's kernels, so it supports what the CPU does.
bool supports(backend::OpId op, DType dtype) { return backend::cpu_ops().supports(op, dtype); }

// Element types the CPU would refuse are refused when the op is issued, as a device backend
// checks its arguments at launch: the error belongs to the call, not to a later synchronize.
[[noreturn]] void refuse(const std::string& what) { throw std::invalid_argument("async cpu backend: " + what); }

void convert(const void* in, DType in_type, void* out, DType out_type, int64_t n, Stream stream) {
  const bool half = [](DType t) { return t == DType::bf16 || t == DType::f16; }(in_type == DType::f32 ? out_type : in_type);
  if (!half || (in_type != DType::f32 && out_type != DType::f32)) {
    refuse(std::string("no conversion from ") + dtype_name(in_type) + " to " + dtype_name(out_type));
  }
  Queued<"convert", &Ops::convert, decltype(Ops::convert)>::run(in, in_type, out, out_type, n, stream);
}

void round_through(const float* in, float* out, int64_t n, DType through, Stream stream) {
  if (!supports(backend::OpId::round_through, through)) {
    refuse(std::string("no conversion from float32 to ") + dtype_name(through));
  }
  Queued<"round_through", &Ops::round_through, decltype(Ops::round_through)>::run(in, out, n, through, stream);
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
          const void* b, int64_t ldb, float beta, float* c, int64_t ldc, DType operand_type, Stream stream) {
  if (!supports(backend::OpId::gemm, operand_type)) refuse(std::string("no GEMM on ") + dtype_name(operand_type) + " operands");
  Queued<"gemm", &Ops::gemm, decltype(Ops::gemm)>::run(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, operand_type, stream);
}

void gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
               const void* b, int64_t ldb, const float* bias, float* c, DType operand_type, Stream stream) {
  if (!supports(backend::OpId::gemm_bias, operand_type)) refuse(std::string("no GEMM on ") + dtype_name(operand_type) + " operands");
  Queued<"gemm_bias", &Ops::gemm_bias, decltype(Ops::gemm_bias)>::run(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, c, operand_type, stream);
}

void gemm_bias_gelu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                    const void* b, int64_t ldb, const float* bias, float* pre, float* y, DType operand_type,
                    Stream stream) {
  if (!supports(backend::OpId::gemm_bias_gelu, operand_type)) refuse(std::string("no GEMM on ") + dtype_name(operand_type) + " operands");
  Queued<"gemm_bias_gelu", &Ops::gemm_bias_gelu, decltype(Ops::gemm_bias_gelu)>::run(trans_a, trans_b, m, n, k, a, lda, b, ldb, bias, pre, y, operand_type, stream);
}

// The MoE experts' grouped GEMMs: their counts are host memory (backend/ops.h), copied when the op
// is queued, as a device backend copies them before it returns; the operands are device memory.
void check_grouped_gemm(const char* entry, backend::OpId op, DType operand_type, const int64_t* counts, const void* a,
                        const void* b, const float* c) {
  if (!supports(op, operand_type)) refuse(std::string("no grouped GEMM on ") + dtype_name(operand_type) + " operands");
  check_host(entry, counts);
  for (const void* pointer : {a, b, static_cast<const void*>(c)}) check_device(entry, pointer);
}

void grouped_gemm(bool trans_b, int64_t groups, const int64_t* group_rows, int64_t n, int64_t k, float alpha,
                  const void* a, int64_t lda, const void* b, int64_t ldb, int64_t b_group_stride, float beta, float* c,
                  int64_t ldc, DType operand_type, Stream stream) {
  check_grouped_gemm("grouped_gemm", backend::OpId::grouped_gemm, operand_type, group_rows, a, b, c);
  std::vector<int64_t> counts(group_rows, group_rows + groups);
  state().worker(stream).enqueue(Work{[=, counts = std::move(counts)] {
                                        backend::cpu_ops().grouped_gemm(trans_b, groups, counts.data(), n, k, alpha, a,
                                                                        lda, b, ldb, b_group_stride, beta, c, ldc,
                                                                        operand_type, Stream{});
                                      },
                                      true});
}

void grouped_gemm_ragged_k(int64_t groups, const int64_t* group_depths, int64_t m, int64_t n, float alpha,
                           const void* a, int64_t lda, const void* b, int64_t ldb, float beta, float* c, int64_t ldc,
                           int64_t c_group_stride, DType operand_type, Stream stream) {
  check_grouped_gemm("grouped_gemm_ragged_k", backend::OpId::grouped_gemm_ragged_k, operand_type, group_depths, a, b, c);
  std::vector<int64_t> depths(group_depths, group_depths + groups);
  state().worker(stream).enqueue(Work{[=, depths = std::move(depths)] {
                                        backend::cpu_ops().grouped_gemm_ragged_k(groups, depths.data(), m, n, alpha, a,
                                                                                 lda, b, ldb, beta, c, ldc,
                                                                                 c_group_stride, operand_type, Stream{});
                                      },
                                      true});
}

const Ops& table() {
  static const Ops ops{
      .name = "async-cpu",
      .device = backend::Device::cpu,
      .synchronous = false,
      .supports = supports,
      .allocate = allocate,
      .release = release,
      .default_stream = default_stream,
      .synchronize = synchronize,
      .launch_host_function = launch_host_function,
      .create_event = create_event,
      .destroy_event = destroy_event,
      .record_event = record_event,
      .synchronize_event = synchronize_event,
      .elapsed_seconds = elapsed_seconds,
      .copy = copy,
      .copy_2d = copy_2d,
      .fill = MT_QUEUED(fill),
      .zero = MT_QUEUED(zero),
      .convert = convert,
      .round_through = round_through,
      .gemm_operand_type = gemm_operand_type,
      .gemm = gemm,
      .gemm_bias = gemm_bias,
      .gemm_bias_gelu = gemm_bias_gelu,
      .layernorm_forward = MT_QUEUED(layernorm_forward),
      .layernorm_backward = MT_QUEUED(layernorm_backward),
      .rmsnorm_forward = MT_QUEUED(rmsnorm_forward),
      .rmsnorm_backward = MT_QUEUED(rmsnorm_backward),
      .gelu_forward = MT_QUEUED(gelu_forward),
      .gelu_backward = MT_QUEUED(gelu_backward),
      .gelu_erf_forward = MT_QUEUED(gelu_erf_forward),
      .gelu_erf_backward = MT_QUEUED(gelu_erf_backward),
      .tanh_forward = MT_QUEUED(tanh_forward),
      .tanh_backward = MT_QUEUED(tanh_backward),
      .swiglu_forward = MT_QUEUED(swiglu_forward),
      .swiglu_backward = MT_QUEUED(swiglu_backward),
      .rope_forward = MT_QUEUED(rope_forward),
      .rope_backward = MT_QUEUED(rope_backward),
      .rope_yarn_forward = MT_QUEUED(rope_yarn_forward),
      .rope_yarn_backward = MT_QUEUED(rope_yarn_backward),
      .attention_forward = MT_QUEUED(attention_forward),
      .attention_backward = MT_QUEUED(attention_backward),
      .attention_merge = MT_QUEUED(attention_merge),
      .embedding_forward = MT_QUEUED(embedding_forward),
      .embedding_backward = MT_QUEUED(embedding_backward),
      .xent_row_max = MT_QUEUED(xent_row_max),
      .xent_row_sumexp = MT_QUEUED(xent_row_sumexp),
      .xent_target_logit = MT_QUEUED(xent_target_logit),
      .xent_backward = MT_QUEUED(xent_backward),
      .xent_loss_sums = MT_QUEUED(xent_loss_sums),
      .add_inplace = MT_QUEUED(add_inplace),
      .scale_inplace = MT_QUEUED(scale_inplace),
      .bias_add = MT_QUEUED(bias_add),
      .bias_backward = MT_QUEUED(bias_backward),
      .sum_squares = MT_QUEUED(sum_squares),
      .all_finite = MT_QUEUED(all_finite),
      .dropout_forward = MT_QUEUED(dropout_forward),
      .dropout_backward = MT_QUEUED(dropout_backward),
      .adamw_update = MT_QUEUED(adamw_update),
      .moe_router_topk = MT_QUEUED(moe_router_topk),
      .moe_router_topk_backward = MT_QUEUED(moe_router_topk_backward),
      .moe_router_aux_sums = MT_QUEUED(moe_router_aux_sums),
      .moe_router_aux_backward = MT_QUEUED(moe_router_aux_backward),
      .moe_router_z_loss_sum = MT_QUEUED(moe_router_z_loss_sum),
      .moe_router_z_loss_backward = MT_QUEUED(moe_router_z_loss_backward),
      .moe_router_capacity_drop = MT_QUEUED(moe_router_capacity_drop),
      .moe_router_tokens_per_expert = MT_QUEUED(moe_router_tokens_per_expert),
      .moe_router_expert_bias_update = MT_QUEUED(moe_router_expert_bias_update),
      .grouped_gemm = grouped_gemm,
      .grouped_gemm_ragged_k = grouped_gemm_ragged_k,
      .moe_scale_rows = MT_QUEUED(moe_scale_rows),
      .moe_scale_rows_backward = MT_QUEUED(moe_scale_rows_backward),
      // MoE token dispatcher
      .moe_expert_counts = MT_QUEUED(moe_expert_counts),
      .moe_route_index = MT_QUEUED(moe_route_index),
      .moe_permute_rows = MT_QUEUED(moe_permute_rows),
      .moe_unpermute_rows = MT_QUEUED(moe_unpermute_rows),
      .moe_unroute_probs = MT_QUEUED(moe_unroute_probs),
      .moe_sort_chunks = MT_QUEUED(moe_sort_chunks),
      // FP8 (issue 23)
      .fp8_quantize = MT_QUEUED(fp8_quantize),
      .fp8_transpose = MT_QUEUED(fp8_transpose),
      .gemm_fp8 = MT_QUEUED(gemm_fp8),
      .fp8_update_scales = MT_QUEUED(fp8_update_scales),
  };
  return ops;
}

}  // namespace

const backend::Ops& async_cpu_ops() {
  state();  // the workers start with the table
  return table();
}

backend::Stream new_async_stream() { return state().new_stream(); }

void set_async_start_delay(std::chrono::microseconds delay) { state().set_start_delay(delay); }

bool is_async_device_memory(const void* pointer, int64_t bytes) { return state().arena().contains(pointer, bytes); }

int64_t async_host_waits() { return host_waits.load(); }

}  // namespace mt::test_backend
