// The op harness's runner for the CUDA op table (CTest label gpu): every case of tests/harness/ on
// backend::backend_ops(Device::cuda), one test per family of entries, against the same
// double-precision references and tolerances as the CPU table. Each family runs twice: plainly
// (the numbers), then on a copy of the table whose compute entries (fill, zero, convert,
// round_through, gemm and every fused kernel) each run inside a stream capture: the entry is
// called between cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) and
// cudaStreamEndCapture, and the captured graph is launched on the stream. An entry that
// synchronises, copies to or from pageable host memory or allocates breaks the capture; one that
// copies to or from pinned host memory, runs a host function or allocates through the stream
// leaves a node in the graph that is refused; the failure names the entry and the case. The
// entries that make the host wait by contract (backend::op_waits_for_stream) and the copies are
// not captured; the coverage table, printed when the binary ends, marks them ("waits"). The
// capture check is itself checked on entries broken on purpose (CaptureCheck.*). The MoE aux
// kernels' deferred row-id error is checked to reach only its own stream's synchronize
// (CudaTable.AuxRowIdErrorBelongsToItsStream); the fused GEMMs' choice between cuBLASLt's GELU
// epilogue and the unfused kernels by the fallback counter (CudaTable.GeluEpilogueFusesOrFallsBack).
// Every test is skipped, never passed, when no CUDA
// device is usable or the CUDA table is not built.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/op_list.h"
#include "backend/ops.h"
#include "backend/registry.h"
#include "harness/op_cases.h"
#include "harness/op_harness.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace {

using mt::backend::Ops;
using mt::backend::OpId;
using mt::backend::Stream;
using mt::harness::CaseOutcome;
using mt::harness::CaseStatus;
using mt::harness::describe;
using mt::harness::OpCase;

// --- the table, or why there is none -----------------------------------------------------------

struct CudaTable {
  const Ops* ops = nullptr;
  std::string missing;  // why there is no table (the skip message)
};

const CudaTable& cuda_table() {
  static const CudaTable table = [] {
    CudaTable found;
    if (mt::kernels::cuda::device_count() == 0) {
      found.missing = "no CUDA device";
      return found;
    }
    try {
      found.ops = &mt::backend::backend_ops(mt::backend::Device::cuda);
    } catch (const std::exception& e) {
      found.missing = std::string("no CUDA op table: ") + e.what();
    }
    return found;
  }();
  return table;
}

#define MT_REQUIRE_CUDA_TABLE() \
  if (!cuda_table().ops) GTEST_SKIP() << cuda_table().missing

void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(status));
}

// --- the capture check -----------------------------------------------------------------------

// What in a captured graph an entry may not leave: host work, host copies, allocations.
std::optional<std::string> forbidden_node(cudaGraphNode_t node) {
  cudaGraphNodeType type{};
  check_cuda(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType");
  switch (type) {
    case cudaGraphNodeTypeHost: return "runs a host function in the stream";
    case cudaGraphNodeTypeMemAlloc: return "allocates device memory on the stream";
    case cudaGraphNodeTypeMemFree: return "frees device memory on the stream";
    case cudaGraphNodeTypeMemcpy: {
      cudaMemcpy3DParms params{};
      const cudaError_t read = cudaGraphMemcpyNodeGetParams(node, &params);
      if (read != cudaSuccess) return std::string("copies with a memcpy node whose ends cannot be read: ") + cudaGetErrorString(read);
      if (params.kind == cudaMemcpyDeviceToDevice) return std::nullopt;
      if (params.kind != cudaMemcpyDefault) return "copies to or from host memory";
      for (const void* end : {params.srcPtr.ptr, params.dstPtr.ptr}) {
        if (!end) continue;  // an array end: device memory
        cudaPointerAttributes attributes{};
        check_cuda(cudaPointerGetAttributes(&attributes, end), "cudaPointerGetAttributes");
        if (attributes.type == cudaMemoryTypeHost || attributes.type == cudaMemoryTypeUnregistered)
          return "copies to or from host memory";
      }
      return std::nullopt;
    }
    default: return std::nullopt;  // kernels, memsets, events, empty nodes
  }
}

std::vector<cudaGraphNode_t> graph_nodes(cudaGraph_t graph) {
  size_t count = 0;
  check_cuda(cudaGraphGetNodes(graph, nullptr, &count), "cudaGraphGetNodes");
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0) check_cuda(cudaGraphGetNodes(graph, nodes.data(), &count), "cudaGraphGetNodes");
  return nodes;
}

// Runs `work` (one entry) captured on `stream`, then launches what it captured on the stream and
// waits for it (the waiting is the harness's, not the entry's). Throws a line naming `entry` when
// the capture breaks or the graph holds a forbidden node.
void run_captured(const char* entry, Stream stream, const std::function<void()>& work) {
  auto* cuda_stream = static_cast<cudaStream_t>(stream.handle);
  const std::string where = std::string(entry) + " under stream capture";
  check_cuda(cudaStreamBeginCapture(cuda_stream, cudaStreamCaptureModeGlobal), where + ": cudaStreamBeginCapture");
  std::string thrown;
  std::exception_ptr refusal;  // an argument the entry refused before queuing anything
  try {
    work();
  } catch (const std::invalid_argument& e) {
    thrown = e.what();
    refusal = std::current_exception();
  } catch (const std::exception& e) {
    thrown = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(cuda_stream, &graph);
  cudaGetLastError();  // a broken capture leaves its error behind; it is reported here
  if (refusal && ended == cudaSuccess) {
    // The entry refused its arguments (a refusal case) and left the capture intact: the
    // refusal is the entry's answer, so it reaches the case as the entry threw it.
    if (graph) cudaGraphDestroy(graph);
    std::rethrow_exception(refusal);
  }
  if (!thrown.empty() || ended != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    throw std::runtime_error(where + " broke the capture (it synchronises, copies to or from pageable host memory, "
                             "or allocates): " + (thrown.empty() ? "" : "the entry threw \"" + thrown + "\"; ") +
                             "cudaStreamEndCapture: " + cudaGetErrorString(ended));
  }
  std::string refused;
  try {
    for (cudaGraphNode_t node : graph_nodes(graph)) {
      if (const auto why = forbidden_node(node)) refused = *why;
    }
  } catch (const std::exception& e) {
    refused = std::string("its captured graph cannot be read: ") + e.what();
  }
  if (!refused.empty()) {
    cudaGraphDestroy(graph);
    throw std::runtime_error(where + ": " + refused);
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check_cuda(instantiated, where + ": cudaGraphInstantiate");
  const cudaError_t launched = cudaGraphLaunch(exec, cuda_stream);
  const cudaError_t finished = cudaStreamSynchronize(cuda_stream);
  cudaGraphExecDestroy(exec);
  check_cuda(launched, where + ": cudaGraphLaunch");
  check_cuda(finished, where + ": the captured graph's run");
}

// The table whose entries the captured copy calls (set before any captured entry runs).
const Ops* g_captured_from = nullptr;

template <typename... Args>
Stream stream_among(const Args&... args) {
  Stream stream{};
  (
      [&] {
        if constexpr (std::is_same_v<Args, Stream>) stream = args;
      }(),
      ...);
  return stream;
}

// The entry `Member` of g_captured_from, run under run_captured.
template <auto Member, typename Entry>
struct Captured;
template <auto Member, typename R, typename... Args>
struct Captured<Member, R (*)(Args...)> {
  static R call(Args... args) {
    const Ops& real = *g_captured_from;
    if constexpr (std::is_void_v<R>) {
      run_captured(entry_name, stream_among(args...), [&] { (real.*Member)(args...); });
    } else {  // never captured (captured_entry says which are); instantiated for every entry
      R result{};
      run_captured(entry_name, stream_among(args...), [&] { result = (real.*Member)(args...); });
      return result;
    }
  }
  static const char* entry_name;
};
template <auto Member, typename R, typename... Args>
const char* Captured<Member, R (*)(Args...)>::entry_name = nullptr;

// The entries that only queue stream work and touch no host memory by contract: every one from
// fill on, but gemm_operand_type (a query).
bool captured_entry(OpId op) {
  if (op == OpId::gemm_operand_type) return false;
  return static_cast<int>(op) >= static_cast<int>(OpId::fill);
}

// A stream for the capture when the table's default stream is the legacy one (which cannot be
// captured): a blocking stream, so it still orders after work the table queues on the legacy
// stream outside any capture (allocate's zero fill, say).
Stream capture_stream() {
  static const Stream stream = [] {
    cudaStream_t created = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&created, cudaStreamDefault), "cudaStreamCreateWithFlags");
    return Stream{created};
  }();
  return stream;
}

// A copy of `real` whose captured entries run under run_captured, on a stream that can be
// captured when real's default stream cannot.
Ops captured_copy(const Ops& real) {
  g_captured_from = &real;
  Ops copy = real;
#define MT_CAPTURE_ENTRY(entry)                                                          \
  if (captured_entry(OpId::entry) && real.entry) {                                        \
    using Wrapper = Captured<&Ops::entry, decltype(Ops::entry)>;                          \
    Wrapper::entry_name = #entry;                                                         \
    copy.entry = &Wrapper::call;                                                          \
  }
  MT_BACKEND_OPS(MT_CAPTURE_ENTRY)
#undef MT_CAPTURE_ENTRY
  const void* handle = real.default_stream().handle;
  if (!handle || handle == static_cast<const void*>(cudaStreamLegacy))
    copy.default_stream = [] { return capture_stream(); };
  return copy;
}

// --- coverage, printed when the binary ends -----------------------------------------------------

class CoveragePrinter : public testing::Environment {
 public:
  void TearDown() override {
    if (!cuda_table().ops) {
      std::cout << "cuda table: not run (" << cuda_table().missing << ")\n";
      return;
    }
    mt::harness::Coverage coverage(*cuda_table().ops, mt::harness::op_cases());
    for (const auto& [op_case, outcome] : outcomes()) coverage.add(*op_case, outcome);
    coverage.print(std::cout, "cuda table (waits: the host waits for the stream by contract, not captured; ran/passed: "
                              "the plain runs of this process)");
    std::cout << "captured entries (no host copy, sync or allocation): ";
    for (int i = 0; i < mt::backend::kOpCount; ++i) {
      if (captured_entry(static_cast<OpId>(i))) std::cout << mt::backend::op_name(static_cast<OpId>(i)) << " ";
    }
    std::cout << "\n";
  }
  static std::vector<std::pair<const OpCase*, CaseOutcome>>& outcomes() {
    static std::vector<std::pair<const OpCase*, CaseOutcome>> runs;
    return runs;
  }
};
[[maybe_unused]] testing::Environment* const g_coverage_printer = testing::AddGlobalTestEnvironment(new CoveragePrinter);

// --- the runs -----------------------------------------------------------------------------------

std::vector<std::string> families() {
  std::vector<std::string> names;
  for (const OpCase& op_case : mt::harness::op_cases()) {
    const std::string family = mt::harness::op_family(op_case.op);
    if (std::find(names.begin(), names.end(), family) == names.end()) names.push_back(family);
  }
  return names;
}

std::vector<const OpCase*> cases_of(const std::string& family) {
  std::vector<const OpCase*> cases;
  for (const OpCase& op_case : mt::harness::op_cases()) {
    if (op_case.measures_host_memory) continue;  // host RSS says nothing of device memory
    if (mt::harness::op_family(op_case.op) == family) cases.push_back(&op_case);
  }
  return cases;
}

// Every case of the family on `ops`: a gtest failure per failed check, prefixed with `pass`
// (none when `pass` is empty).
std::vector<CaseOutcome> run_family(const Ops& ops, const std::string& family, const std::string& pass) {
  std::vector<CaseOutcome> outcomes;
  for (const OpCase* op_case : cases_of(family)) {
    CaseOutcome outcome = mt::harness::run_case(ops, *op_case);
    if (!pass.empty())
      for (const std::string& failure : outcome.failures)
        ADD_FAILURE() << pass << " " << describe(*op_case) << ": " << failure;
    outcomes.push_back(std::move(outcome));
  }
  return outcomes;
}

class CudaTableFamily : public testing::TestWithParam<std::string> {};

TEST_P(CudaTableFamily, RunsEveryCaseAgainstTheReference) {
  MT_REQUIRE_CUDA_TABLE();
  const std::vector<const OpCase*> cases = cases_of(GetParam());
  ASSERT_FALSE(cases.empty());
  std::vector<CaseOutcome> outcomes = run_family(*cuda_table().ops, GetParam(), "plain");
  for (size_t i = 0; i < cases.size(); ++i) CoveragePrinter::outcomes().emplace_back(cases[i], std::move(outcomes[i]));
}

TEST_P(CudaTableFamily, EntriesOnlyQueueStreamWork) {
  MT_REQUIRE_CUDA_TABLE();
  const Ops& real = *cuda_table().ops;
  // One-time set-up (handles, scratch) happens outside the capture; failures are the other test's.
  for (const CaseOutcome& warm_up : run_family(real, GetParam(), "")) {
    if (warm_up.status == CaseStatus::failed)
      GTEST_SKIP() << "the plain runs fail (RunsEveryCaseAgainstTheReference says how)";
  }
  const Ops captured = captured_copy(real);
  run_family(captured, GetParam(), "captured");
}

INSTANTIATE_TEST_SUITE_P(EveryFamily, CudaTableFamily, testing::ValuesIn(families()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

// Every entry filled (the mixture-of-experts ones included: kernels/cuda/moe_*.cu), and every case
// run except those on dtypes the table says it lacks.
TEST(CudaTable, FillsEveryEntry) {
  MT_REQUIRE_CUDA_TABLE();
  const Ops& ops = *cuda_table().ops;
  EXPECT_EQ(ops.device, mt::backend::Device::cuda);
  EXPECT_FALSE(ops.synchronous);
  for (int i = 0; i < mt::backend::kOpCount; ++i) {
    const auto op = static_cast<OpId>(i);
    EXPECT_NE(mt::backend::op_entry(ops, op), nullptr) << mt::backend::op_name(op) << " is not filled";
  }
  for (const OpCase& op_case : mt::harness::op_cases()) {
    if (op_case.mode == mt::harness::CaseMode::refusal || op_case.measures_host_memory) continue;
    if (ops.supports(op_case.op, op_case.dtype) || op_case.dtype != mt::DType::f32) continue;
    ADD_FAILURE() << describe(op_case) << ": the CUDA table does not support f32 for this entry";
  }
}

// --- the MoE aux kernels' deferred row-id error ------------------------------------------------

// A row id outside the aux sums' groups is thrown by the synchronize of the stream the kernel ran
// on, once; a synchronize of another stream neither throws it nor clears it.
TEST(CudaTable, AuxRowIdErrorBelongsToItsStream) {
  MT_REQUIRE_CUDA_TABLE();
  const Ops& ops = *cuda_table().ops;
  const Stream other = ops.default_stream();
  cudaStream_t created = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  const Stream owner{created};
  const std::vector<int64_t> ids{0, 40};  // row 1 is in sequence 2 of the 2 (length 16)
  const std::vector<float> logits{0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};  // (2, 4)
  const int64_t ids_bytes = int64_t(ids.size() * sizeof(int64_t));
  const int64_t logits_bytes = int64_t(logits.size() * sizeof(float));
  const int64_t sums_bytes = 16 * int64_t{sizeof(float)};  // counts (2, 4), then prob sums (2, 4)
  const auto category = mt::backend::MemoryCategory::activations;
  auto* device_ids = static_cast<int64_t*>(ops.allocate(ids_bytes, category));
  auto* device_logits = static_cast<float*>(ops.allocate(logits_bytes, category));
  auto* sums = static_cast<float*>(ops.allocate(sums_bytes, category));
  ops.copy(device_ids, ids.data(), ids_bytes, mt::backend::CopyKind::host_to_device, other);
  ops.copy(device_logits, logits.data(), logits_bytes, mt::backend::CopyKind::host_to_device, other);
  ops.synchronize(other);
  ops.moe_router_aux_sums(device_logits, 2, 4, 1, mt::kernels::MoeScoreFunction::softmax, device_ids, 16, 2, sums,
                          sums + 8, owner);
  check_cuda(cudaStreamSynchronize(created), "cudaStreamSynchronize");  // drained, the error not yet taken
  EXPECT_NO_THROW(ops.synchronize(other)) << "another stream's synchronize took the owner's row-id error";
  try {
    ops.synchronize(owner);
    ADD_FAILURE() << "the owner's synchronize did not throw the row-id error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("row id 40"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(ops.synchronize(owner)) << "the row-id error was not cleared when thrown";
  ops.release(sums, sums_bytes, category);
  ops.release(device_logits, logits_bytes, category);
  ops.release(device_ids, ids_bytes, category);
  check_cuda(cudaStreamDestroy(created), "cudaStreamDestroy");
}

// --- the fused GEMMs: epilogue or fallback -----------------------------------------------------

// gemm_bias_gelu runs cuBLASLt's GELU epilogue where it takes the shape (bf16 operands, n = 64)
// and the unfused kernels where the aux leading dimension is not a multiple of 8 (n = 13): the
// fallback counter tells which ran (the op harness's gemm family checks the numbers of both).
// Whether f32 and f16 operands get an epilogue is printed, not required.
TEST(CudaTable, GeluEpilogueFusesOrFallsBack) {
  MT_REQUIRE_CUDA_TABLE();
  const Ops& ops = *cuda_table().ops;
  const Stream stream = ops.default_stream();
  const int64_t m = 32, k = 64, widest = 64;
  const auto category = mt::backend::MemoryCategory::activations;
  const int64_t bytes[] = {m * k * 4, widest * k * 4, widest * 4, m * widest * 4, m * widest * 4};
  void* buffers[5] = {};
  for (int i = 0; i < 5; ++i) buffers[i] = ops.allocate(bytes[i], category);  // zero-filled
  const auto fallbacks = [&](int64_t n, mt::DType type) {
    const int64_t before = mt::kernels::cuda::gemm_epilogue_fallback_calls();
    ops.gemm_bias_gelu(false, true, m, n, k, buffers[0], k, buffers[1], k, static_cast<const float*>(buffers[2]),
                       static_cast<float*>(buffers[3]), static_cast<float*>(buffers[4]), type, stream);
    ops.synchronize(stream);
    return mt::kernels::cuda::gemm_epilogue_fallback_calls() - before;
  };
  EXPECT_EQ(fallbacks(13, mt::DType::bf16), 1) << "n = 13 cannot take the GELU epilogue's aux";
  EXPECT_EQ(fallbacks(widest, mt::DType::bf16), 0) << "bf16 operands, n = 64: no GELU epilogue";
  for (mt::DType type : {mt::DType::f32, mt::DType::f16}) {
    std::cout << "[epilogue] gemm_bias_gelu on " << mt::dtype_name(type) << " operands, n = 64: "
              << (fallbacks(widest, type) == 0 ? "cuBLASLt epilogue" : "unfused fallback") << "\n";
  }
  for (int i = 0; i < 5; ++i) ops.release(buffers[i], bytes[i], category);
}

// --- the capture check on entries broken on purpose ----------------------------------------------

// Each broken entry runs the table's scale_inplace, then does what no entry may; the captured copy
// of a table holding it must refuse it, naming scale_inplace.
enum class Breach { synchronise, copy_to_pageable_host, copy_to_pinned_host, host_function, allocate };
Breach g_breach = Breach::synchronise;
const Ops* g_unbroken = nullptr;

void noop_host_function(void*) {}

// One pinned host float, made before any capture (cudaMallocHost may not run inside one).
float* pinned_host_float() {
  static float* const pinned = [] {
    void* host = nullptr;
    check_cuda(cudaMallocHost(&host, sizeof(float)), "cudaMallocHost");
    return static_cast<float*>(host);
  }();
  return pinned;
}

void broken_scale_inplace(float* x, int64_t n, float s, Stream stream) {
  g_unbroken->scale_inplace(x, n, s, stream);
  auto* cuda_stream = static_cast<cudaStream_t>(stream.handle);
  float pageable_value = 0;
  void* allocated = nullptr;
  switch (g_breach) {
    case Breach::synchronise: check_cuda(cudaStreamSynchronize(cuda_stream), "cudaStreamSynchronize"); break;
    case Breach::copy_to_pageable_host:
      check_cuda(cudaMemcpyAsync(&pageable_value, x, sizeof(float), cudaMemcpyDeviceToHost, cuda_stream),
                 "cudaMemcpyAsync");
      break;
    case Breach::copy_to_pinned_host:
      check_cuda(cudaMemcpyAsync(pinned_host_float(), x, sizeof(float), cudaMemcpyDeviceToHost, cuda_stream),
                 "cudaMemcpyAsync");
      break;
    case Breach::host_function:
      check_cuda(cudaLaunchHostFunc(cuda_stream, noop_host_function, nullptr), "cudaLaunchHostFunc");
      break;
    case Breach::allocate:
      check_cuda(cudaMallocAsync(&allocated, 256, cuda_stream), "cudaMallocAsync");
      check_cuda(cudaFreeAsync(allocated, cuda_stream), "cudaFreeAsync");
      break;
  }
}

// Runs scale_inplace through the captured copy of a table whose entry breaches as told; returns
// the captured run's error ("" when it passed).
std::string captured_breach(Breach breach) {
  g_unbroken = cuda_table().ops;
  pinned_host_float();
  Ops broken = *cuda_table().ops;
  broken.scale_inplace = broken_scale_inplace;
  const Ops captured = captured_copy(broken);
  g_breach = breach;
  const Stream stream = captured.default_stream();
  const int64_t n = 37;
  void* x = captured.allocate(n * sizeof(float), mt::backend::MemoryCategory::activations);
  std::string error;
  try {
    captured.scale_inplace(static_cast<float*>(x), n, 2.0f, stream);
  } catch (const std::exception& e) {
    error = e.what();
  }
  captured.synchronize(stream);
  captured.release(x, n * sizeof(float), mt::backend::MemoryCategory::activations);
  return error;
}

class CaptureCheck : public testing::TestWithParam<Breach> {};

TEST_P(CaptureCheck, RefusesAnEntryThatLeavesTheStream) {
  MT_REQUIRE_CUDA_TABLE();
  const std::string error = captured_breach(GetParam());
  EXPECT_NE(error.find("scale_inplace under stream capture"), std::string::npos) << "got: \"" << error << "\"";
}

TEST(CaptureCheck, PassesTheUnbrokenEntry) {
  MT_REQUIRE_CUDA_TABLE();
  const Ops captured = captured_copy(*cuda_table().ops);
  const Stream stream = captured.default_stream();
  const int64_t n = 37;
  auto* x = static_cast<float*>(captured.allocate(n * sizeof(float), mt::backend::MemoryCategory::activations));
  captured.fill(x, n, 1.5f, stream);
  captured.scale_inplace(x, n, 2.0f, stream);
  std::vector<float> host(n);
  captured.copy(host.data(), x, n * sizeof(float), mt::backend::CopyKind::device_to_host, stream);
  captured.synchronize(stream);
  captured.release(x, n * sizeof(float), mt::backend::MemoryCategory::activations);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(host[size_t(i)], 3.0f) << "x[" << i << "]";
}

std::string breach_name(const testing::TestParamInfo<Breach>& info) {
  switch (info.param) {
    case Breach::synchronise: return "synchronise";
    case Breach::copy_to_pageable_host: return "copy_to_pageable_host";
    case Breach::copy_to_pinned_host: return "copy_to_pinned_host";
    case Breach::host_function: return "host_function";
    case Breach::allocate: return "allocate";
  }
  return "unknown";
}

INSTANTIATE_TEST_SUITE_P(EveryBreach, CaptureCheck,
                         testing::Values(Breach::synchronise, Breach::copy_to_pageable_host,
                                         Breach::copy_to_pinned_host, Breach::host_function, Breach::allocate),
                         breach_name);

}  // namespace
