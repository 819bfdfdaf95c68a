// What binding a communicator to the CPU table's stream costs per call: a tight loop of small
// blocking all-reduces (one float, and 256 floats) through the control world
// (make_world_communicator: MPI with its progress thread) and through the data communicator made
// from it (comm::make_mpi_data_group on the CPU table), rounds interleaved, medians of the
// microseconds per call. On the CPU table the binding keeps the host communicator (a duplicate
// of the world's), so the two should time alike; a forwarding wrapper measured 5 ns per call
// here. Without a launcher the world is a group of one, so the loop times the binding alone, free
// of MPI's noise (nanoseconds per call). Built against a tree without
// stream_communicator.h (the build before it) it times the control world alone, the same loop,
// for a before/after comparison.
//   mpirun -np 2 build/tests/mt_bench_stream_communicator [--calls N] [--rounds R]
//   build/tests/mt_bench_stream_communicator --calls 10000000
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_runtime.h"
#if __has_include("comm/stream_communicator.h")
#include "backend/ops.h"
#include "comm/stream_communicator.h"
#define MT_BENCH_HAS_DATA_GROUPS 1
#endif

namespace {

using mt::comm::Communicator;

// Microseconds per call of `calls` all-reduces of `count` elements.
double microseconds_per_call(Communicator& group, std::vector<float>& values, int calls) {
  group.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) {
    group.all_reduce(values.data(), static_cast<int64_t>(values.size()), mt::DType::f32, mt::comm::ReduceOp::max);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return seconds * 1e6 / calls;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int calls = 20000, rounds = 11;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--calls") == 0) calls = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
  }
  mt::comm::MpiRuntime::init();
  {
    const std::unique_ptr<Communicator> control = mt::comm::make_world_communicator();
#ifdef MT_BENCH_HAS_DATA_GROUPS
    const mt::backend::Ops& ops = mt::backend::cpu_ops();
    const std::unique_ptr<Communicator> data = mt::comm::make_mpi_data_group(*control, ops, ops.default_stream());
#endif
    for (const size_t count : {size_t{1}, size_t{256}}) {
      std::vector<float> values(count, static_cast<float>(control->rank()));
      std::vector<double> control_us, data_us;
      for (int round = 0; round < rounds; ++round) {
        control_us.push_back(microseconds_per_call(*control, values, calls));
#ifdef MT_BENCH_HAS_DATA_GROUPS
        data_us.push_back(microseconds_per_call(*data, values, calls));
#endif
      }
      if (control->rank() != 0) continue;
      const double scale = control->size() == 1 ? 1e3 : 1.0;  // a group of one: nanoseconds
      const char* unit = control->size() == 1 ? "ns" : "us";
      std::printf("all_reduce of %zu floats, %d ranks, %d calls x %d rounds: control %.4f %s/call", count,
                  control->size(), calls, rounds, median(control_us) * scale, unit);
      if (!data_us.empty()) {
        std::printf(", data (CPU stream) %.4f %s/call, data/control %.4f", median(data_us) * scale, unit,
                    median(data_us) / median(control_us));
      }
      std::printf("\n");
    }
  }
  mt::comm::MpiRuntime::finalize();
  return 0;
}
