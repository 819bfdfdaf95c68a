// Communicator benchmark (a benchmark, not a test: it prints figures, asserts nothing).
//   1. Bus bandwidth of all-reduce, all-gather and reduce-scatter at a few sizes, with
//      nccl-tests' conventions: algbw = size / time (size = the full buffer), busbw = algbw x
//      2(n-1)/n for all-reduce and (n-1)/n for all-gather and reduce-scatter.
//   2. Overlap: a non-blocking fp32 all-reduce (a DP grad bucket) started before a compute loop of
//      sgemm chunks (kernels/cpu/gemm.h) and waited after it, under each progress strategy: none
//      (MPI moves data only at the final wait), test() between chunks, the progress thread at a
//      few poll intervals, and the thread with test() between chunks. Reported against compute
//      alone and communication alone (the same non-blocking all-reduce, waited at once):
//      hidden = (compute + comm - overlapped) / comm, the share of the communication time the
//      compute hid; and against the plain alternative, compute then a blocking all-reduce (MPI's
//      blocking algorithms are faster than its non-blocking ones). Runs are interleaved; figures
//      are medians.
// Usage: OMP_NUM_THREADS=1 mpirun -np 2 build/tests/mt_bench_comm_overlap [repeats]
//        [--thread-level funneled|multiple]   (the latter the default: MpiRuntime's level)
// On a shared machine other processes take the cores (the compute thread's printed share of its
// core says so); as root, `setsid bash -c 'echo -15 > /proc/self/autogroup; mpirun ...'` gives
// the benchmark's session the larger share for its minute.
#include <mpi.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "kernels/cpu/gemm.h"

namespace {

using Clock = std::chrono::steady_clock;
using mt::DType;
using mt::comm::Communicator;
using mt::comm::ReduceOp;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// CPU seconds this thread has run: against the wall clock it shows whether other processes took
// the core (a shared machine makes every wall-clock figure below unreliable).
double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The slowest rank's time: what a synchronous step sees.
double max_over_ranks(Communicator& comm, double value) {
  comm.all_reduce(&value, 1, DType::f64, ReduceOp::max);
  return value;
}

// One GEMM chunk of the compute loop: (n x n) x (n x n), about 2 n^3 flops.
struct GemmChunk {
  explicit GemmChunk(int64_t n_in) : n(n_in), a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f) {}
  void run() { mt::kernels::cpu::gemm_f32(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); }
  int64_t n;
  std::vector<float> a, b, c;
};

void print_bandwidths(Communicator& comm) {
  const int n = comm.size();
  if (comm.rank() == 0) {
    std::printf("\n# bus bandwidth, %d ranks (nccl-tests factors: all-reduce 2(n-1)/n, others (n-1)/n)\n", n);
    std::printf("%-15s %12s %12s %12s %12s\n", "operation", "size", "time us", "algbw GB/s", "busbw GB/s");
  }
  for (int64_t bytes : {int64_t{8} << 10, int64_t{256} << 10, int64_t{4} << 20, int64_t{25} << 20, int64_t{100} << 20}) {
    const int64_t count = bytes / 4 / n * n;  // floats, divisible by n
    std::vector<float> full(static_cast<size_t>(count), 1.0f), shard(static_cast<size_t>(count / n), 1.0f);
    struct Op {
      const char* name;
      double factor;
      std::function<void()> run;
    };
    const Op ops[] = {
        {"all_reduce", 2.0 * (n - 1) / n, [&] { comm.all_reduce(full.data(), count, DType::f32, ReduceOp::sum); }},
        {"all_gather", 1.0 * (n - 1) / n, [&] { comm.all_gather(shard.data(), full.data(), count / n, DType::f32); }},
        {"reduce_scatter", 1.0 * (n - 1) / n,
         [&] { comm.reduce_scatter(full.data(), shard.data(), count / n, DType::f32, ReduceOp::sum); }},
    };
    for (const Op& op : ops) {
      op.run();  // warm-up
      // As many iterations as fit in about 0.3 s (agreed across ranks), at least 3.
      comm.barrier();
      auto start = Clock::now();
      op.run();
      double first = max_over_ranks(comm, seconds_since(start));
      const int iterations = std::max(3, static_cast<int>(0.3 / std::max(first, 1e-6)));
      comm.barrier();
      start = Clock::now();
      for (int i = 0; i < iterations; ++i) op.run();
      const double each = max_over_ranks(comm, seconds_since(start)) / iterations;
      const double size = static_cast<double>(count) * 4;
      if (comm.rank() == 0) {
        std::printf("%-15s %10.2fMB %12.1f %12.2f %12.2f\n", op.name, size / 1e6, each * 1e6, size / each / 1e9,
                    size / each / 1e9 * op.factor);
      }
    }
  }
}

void print_latency(Communicator& comm) {
  double value = 1.0;
  for (int i = 0; i < 100; ++i) comm.all_reduce(&value, 1, DType::f64, ReduceOp::sum);
  comm.barrier();
  const int iterations = 2000;
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) comm.all_reduce(&value, 1, DType::f64, ReduceOp::sum);
  const double each = max_over_ranks(comm, seconds_since(start)) / iterations;
  if (comm.rank() == 0) std::printf("8-byte all_reduce latency: %.2f us\n", each * 1e6);
}

struct Strategy {
  std::string name;
  Communicator* comm;  // whose all_reduce_async carries the bucket
  bool test_between_chunks;
};

// One overlapped run: start the bucket, run `chunks` GEMMs (testing between them if asked), wait.
double overlapped(const Strategy& s, std::vector<float>& bucket, GemmChunk& gemm, int chunks) {
  s.comm->barrier();
  const auto start = Clock::now();
  auto request = s.comm->all_reduce_async(bucket.data(), static_cast<int64_t>(bucket.size()), DType::f32, ReduceOp::sum);
  for (int i = 0; i < chunks; ++i) {
    gemm.run();
    if (s.test_between_chunks) request->test();
  }
  request->wait();
  return max_over_ranks(*s.comm, seconds_since(start));
}

void print_overlap(Communicator& plain, std::vector<Strategy>& strategies, int repeats) {
  const bool root = plain.rank() == 0;
  GemmChunk gemm(256);
  for (int i = 0; i < 5; ++i) gemm.run();
  plain.barrier();
  auto start = Clock::now();
  for (int i = 0; i < 50; ++i) gemm.run();
  const double chunk_seconds = max_over_ranks(plain, seconds_since(start)) / 50;
  if (root) {
    std::printf("\n# overlap: fp32 all-reduce of a bucket during sgemm chunks (256^3, %.2f ms each, %.1f GFLOP/s)\n",
                chunk_seconds * 1e3, 2.0 * 256 * 256 * 256 / chunk_seconds / 1e9);
  }
  for (int64_t megabytes : {25, 100}) {
    std::vector<float> bucket(static_cast<size_t>(megabytes << 20) / 4, 1.0f);
    // Communication alone (the same non-blocking all-reduce, waited at once), to size the compute.
    auto comm_alone = [&] {
      plain.barrier();
      const auto t0 = Clock::now();
      plain.all_reduce_async(bucket.data(), static_cast<int64_t>(bucket.size()), DType::f32, ReduceOp::sum)->wait();
      return max_over_ranks(plain, seconds_since(t0));
    };
    comm_alone();
    const double comm_estimate = comm_alone();
    // Compute about 1.5x the communication: enough to hide all of it.
    const int chunks = std::max(4, static_cast<int>(1.5 * comm_estimate / chunk_seconds));
    std::vector<double> compute_times, comm_times, blocking_times, sequential_times, cpu_shares;
    auto compute_alone = [&] {
      plain.barrier();
      const auto t0 = Clock::now();
      const double cpu0 = thread_cpu_seconds();
      for (int i = 0; i < chunks; ++i) gemm.run();
      const double wall = seconds_since(t0);
      double share = (thread_cpu_seconds() - cpu0) / wall;
      plain.all_reduce(&share, 1, DType::f64, ReduceOp::min);
      cpu_shares.push_back(share);
      return max_over_ranks(plain, wall);
    };
    std::vector<std::vector<double>> times(strategies.size());
    for (int r = 0; r < repeats; ++r) {
      compute_times.push_back(compute_alone());
      comm_times.push_back(comm_alone());
      plain.barrier();
      const auto t0 = Clock::now();
      plain.all_reduce(bucket.data(), static_cast<int64_t>(bucket.size()), DType::f32, ReduceOp::sum);
      blocking_times.push_back(max_over_ranks(plain, seconds_since(t0)));
      plain.barrier();
      const auto t1 = Clock::now();
      for (int i = 0; i < chunks; ++i) gemm.run();
      plain.all_reduce(bucket.data(), static_cast<int64_t>(bucket.size()), DType::f32, ReduceOp::sum);
      sequential_times.push_back(max_over_ranks(plain, seconds_since(t1)));
      for (size_t s = 0; s < strategies.size(); ++s) times[s].push_back(overlapped(strategies[s], bucket, gemm, chunks));
    }
    const double compute = median(compute_times), comm = median(comm_times), sequential = median(sequential_times);
    if (root) {
      std::printf("\nbucket %lld MB: compute alone %.1f ms (%d chunks), all_reduce_async alone %.1f ms, "
                  "blocking all_reduce %.1f ms; compute then blocking all_reduce %.1f ms\n",
                  static_cast<long long>(megabytes), compute * 1e3, chunks, comm * 1e3, median(blocking_times) * 1e3,
                  sequential * 1e3);
      std::printf("compute thread's share of the core while computing alone: %.0f%% (below ~95%%, other processes "
                  "took the core and the figures below are unreliable)\n",
                  100.0 * median(cpu_shares));
      std::printf("%-34s %10s %11s %8s %15s\n", "strategy", "wall ms", "vs compute", "hidden", "vs sequential");
      for (size_t s = 0; s < strategies.size(); ++s) {
        const double wall = median(times[s]);
        std::printf("%-34s %10.1f %10.2fx %7.0f%% %14.2fx\n", strategies[s].name.c_str(), wall * 1e3, wall / compute,
                    100.0 * (compute + comm - wall) / comm, wall / sequential);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 5;
  int level = MPI_THREAD_MULTIPLE;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--thread-level" && i + 1 < argc) {
      level = std::string(argv[++i]) == "funneled" ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE;
    } else {
      repeats = std::max(1, std::atoi(arg.c_str()));
    }
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, level, &provided);
  {
    mt::comm::MpiCommunicatorOptions no_thread;
    no_thread.progress_thread = false;
    auto plain = mt::comm::make_mpi_communicator(MPI_COMM_WORLD, no_thread);
    if (plain->rank() == 0) {
      std::printf("# %d ranks, MPI thread level %s\n", plain->size(),
                  provided == MPI_THREAD_MULTIPLE ? "MULTIPLE" : provided == MPI_THREAD_FUNNELED ? "FUNNELED" : "other");
    }
    print_latency(*plain);
    print_bandwidths(*plain);
    std::vector<std::unique_ptr<Communicator>> threaded;
    std::vector<Strategy> strategies = {{"none (wait at the end)", plain.get(), false},
                                        {"test() between chunks", plain.get(), true}};
    if (provided == MPI_THREAD_MULTIPLE) {
      for (int interval_us : {100, 300, 1000, 3000}) {
        mt::comm::MpiCommunicatorOptions options;
        options.progress_interval = std::chrono::microseconds(interval_us);
        threaded.push_back(mt::comm::make_mpi_communicator(MPI_COMM_WORLD, options));
        strategies.push_back({"progress thread, " + std::to_string(interval_us) + " us", threaded.back().get(), false});
      }
      strategies.push_back({"progress thread 1000 us + test()", threaded[2].get(), true});
    }
    print_overlap(*plain, strategies, repeats);
  }
  MPI_Finalize();
  return 0;
}
