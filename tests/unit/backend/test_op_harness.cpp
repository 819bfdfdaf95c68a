// The op harness's runner for the CPU op table (the per-ISA CPU instantiation): every case of
// tests/harness/ on backend::cpu_ops() at every ISA level this CPU has (up to MT_CPU_ISA), one
// test per level and family of entries. Cases that promise thread-count independence run again
// on one thread and must give the same bits; the memory-measuring case runs first in its test's
// process. Beside the list: every entry has cases and the CPU fills every entry (the coverage
// table is printed), the CPU runs every case but those on dtypes it says it lacks (each refused by
// name), the CPU table's fused entries run the kernels of the active ISA level, the fused GEMM
// entries give the bits of gemm, bias_add and gelu_forward called in turn, and bf16 GEMM operands
// only where oneDNN has a native bf16 matmul.
//   mt_test_op_harness --coverage   runs every case at every level and prints the coverage table
#include <gtest/gtest.h>
#include <malloc.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "backend/op_list.h"
#include "backend/ops.h"
#include "harness/op_cases.h"
#include "harness/op_harness.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"

namespace {

using mt::DType;
using mt::backend::OpId;
using mt::harness::CaseMode;
using mt::harness::CaseOutcome;
using mt::harness::CaseStatus;
using mt::harness::describe;
using mt::harness::OpCase;
using mt::kernels::CpuIsa;

// Every level from x86-64-v2 up to the active one (MT_CPU_ISA lowers it).
std::vector<CpuIsa> cpu_levels() {
  std::vector<CpuIsa> levels;
  for (CpuIsa isa : {CpuIsa::x86_64_v2, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16}) {
    if (static_cast<int>(isa) <= static_cast<int>(mt::kernels::active_isa())) levels.push_back(isa);
  }
  return levels;
}

std::vector<std::string> families() {
  std::vector<std::string> names;
  for (const OpCase& op_case : mt::harness::op_cases()) {
    const std::string family = mt::harness::op_family(op_case.op);
    if (std::find(names.begin(), names.end(), family) == names.end()) names.push_back(family);
  }
  return names;
}

long peak_rss_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// Runs `body` with an OpenMP team of `threads`, restoring the previous size.
template <typename Body>
auto with_threads(int threads, Body&& body) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto result = body();
  omp_set_num_threads(saved);
  return result;
}

// One case on the CPU table as a gtest failure per failed check; a thread-count-independent case
// runs on at least two threads, then on one, and the two runs' results must have the same bits.
void run_on_cpu(const OpCase& op_case) {
  SCOPED_TRACE(describe(op_case));
  const mt::backend::Ops& ops = mt::backend::cpu_ops();
  mt::harness::RunOptions options;
  options.keep_results = op_case.thread_count_independent;
  if (op_case.measures_host_memory) options.peak_rss_kib = peak_rss_kib;
  const int threads = std::max(2, omp_get_max_threads());
  const CaseOutcome outcome = with_threads(threads, [&] { return mt::harness::run_case(ops, op_case, options); });
  if (outcome.status == CaseStatus::unsupported) return;  // OpHarness.CpuRunsEveryCaseItSupports
  for (const std::string& failure : outcome.failures) ADD_FAILURE() << failure;
  if (!op_case.thread_count_independent || outcome.status != CaseStatus::passed) return;
  const CaseOutcome one_thread = with_threads(1, [&] { return mt::harness::run_case(ops, op_case, options); });
  for (const std::string& difference : mt::harness::compare_results(outcome, one_thread)) {
    ADD_FAILURE() << "1 thread against " << threads << ": " << difference;
  }
}

struct LevelAndFamily {
  CpuIsa isa;
  std::string family;
};

void PrintTo(const LevelAndFamily& param, std::ostream* out) {
  *out << mt::kernels::isa_name(param.isa) << " " << param.family;
}

class CpuTable : public testing::TestWithParam<LevelAndFamily> {};

TEST_P(CpuTable, RunsEveryCaseOfTheFamily) {
  mt::kernels::set_active_isa(GetParam().isa);
  std::vector<const OpCase*> cases;
  for (const OpCase& op_case : mt::harness::op_cases()) {
    if (mt::harness::op_family(op_case.op) == GetParam().family) cases.push_back(&op_case);
  }
  // The process's peak memory is a high-water mark: measure before anything else raised it.
  std::stable_partition(cases.begin(), cases.end(), [](const OpCase* c) { return c->measures_host_memory; });
  ASSERT_FALSE(cases.empty());
  for (const OpCase* op_case : cases) run_on_cpu(*op_case);
}

std::vector<LevelAndFamily> levels_and_families() {
  std::vector<LevelAndFamily> params;
  for (CpuIsa isa : cpu_levels())
    for (const std::string& family : families()) params.push_back({isa, family});
  return params;
}

std::string level_name(CpuIsa isa) {
  std::string name = mt::kernels::isa_name(isa);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(EveryIsaLevel, CpuTable, testing::ValuesIn(levels_and_families()),
                         [](const testing::TestParamInfo<LevelAndFamily>& info) {
                           return level_name(info.param.isa) + "_" + info.param.family;
                         });

// --- the list and the CPU's coverage ----------------------------------------------------------------

TEST(OpHarness, EveryEntryHasACaseAndTheCpuFillsEveryEntry) {
  const mt::backend::Ops& ops = mt::backend::cpu_ops();
  EXPECT_STREQ(ops.name, "cpu");
  EXPECT_EQ(ops.device, mt::backend::Device::cpu);
  EXPECT_EQ(ops.default_stream().handle, nullptr);  // the CPU runs ops to completion
  const mt::harness::Coverage coverage(ops, mt::harness::op_cases());
  coverage.print(std::cout, "cpu table (cases per entry; runs: mt_test_op_harness --coverage)");
  ASSERT_EQ(coverage.rows().size(), static_cast<size_t>(mt::backend::kOpCount));
  for (const mt::harness::CoverageRow& row : coverage.rows()) {
    const char* name = mt::backend::op_name(row.op);
    EXPECT_TRUE(row.filled) << name;
    EXPECT_GT(row.cases - row.cases_by_mode[static_cast<int>(CaseMode::refusal)], 0) << name << " has no case";
  }
}

// A case the CPU does not run is on an (entry, dtype) it says it does not support, and a refusal
// case checks that the entry refuses that dtype by name: supports() is what the CPU really runs.
TEST(OpHarness, CpuRunsEveryCaseItSupportsAndRefusesTheRest) {
  const mt::backend::Ops& ops = mt::backend::cpu_ops();
  std::set<std::pair<OpId, DType>> refused;
  for (const OpCase& op_case : mt::harness::op_cases()) {
    if (op_case.mode == CaseMode::refusal && mt::harness::runs_case(ops, op_case))
      refused.insert({op_case.op, op_case.dtype});
  }
  for (const OpCase& op_case : mt::harness::op_cases()) {
    if (op_case.mode == CaseMode::refusal || mt::harness::runs_case(ops, op_case)) continue;
    EXPECT_TRUE(refused.count({op_case.op, op_case.dtype})) << describe(op_case) << ": not run and not refused";
  }
  EXPECT_TRUE(ops.supports(OpId::gemm, DType::f32));
  EXPECT_TRUE(ops.supports(OpId::gemm, DType::bf16));  // native or widened, on every CPU
  EXPECT_FALSE(ops.supports(OpId::gemm, DType::f16));
  EXPECT_TRUE(ops.supports(OpId::convert, DType::f16));
  EXPECT_FALSE(ops.supports(OpId::layernorm_forward, DType::bf16));
}

TEST(OpHarness, OpNamesAndEntriesFollowTheList) {
  const mt::backend::Ops& ops = mt::backend::cpu_ops();
  std::set<const void*> entries;
  for (int i = 0; i < mt::backend::kOpCount; ++i) {
    const auto op = static_cast<OpId>(i);
    EXPECT_EQ(mt::backend::op_from_name(mt::backend::op_name(op)), op);
    entries.insert(mt::backend::op_entry(ops, op));
  }
  EXPECT_EQ(entries.size(), static_cast<size_t>(mt::backend::kOpCount));  // each id its own entry
  EXPECT_EQ(mt::backend::op_entry(ops, OpId::gemm), reinterpret_cast<const void*>(ops.gemm));
  EXPECT_EQ(mt::backend::op_entry(ops, OpId::adamw_update), reinterpret_cast<const void*>(ops.adamw_update));
  EXPECT_FALSE(mt::backend::op_from_name("layernorm").has_value());
  mt::backend::Ops empty{};
  EXPECT_EQ(mt::backend::op_entry(empty, OpId::allocate), nullptr);
  EXPECT_FALSE(mt::harness::runs_case(empty, mt::harness::op_cases().front()));
}

// --- the CPU table's wiring -------------------------------------------------------------------------

// The kernels/cpu table of one fixed level, as backend entries (the stream dropped).
CpuIsa pinned_level = CpuIsa::x86_64_v2;
template <auto Entry, typename Signature>
struct Pinned;
template <auto Entry, typename Result, typename... Args>
struct Pinned<Entry, Result (*)(Args...)> {
  static Result run(Args... args, mt::backend::Stream) {
    return (mt::kernels::cpu::cpu_ops(pinned_level).*Entry)(args...);
  }
};

using mt::kernels::cpu::CpuOps;
static_assert(sizeof(CpuOps) == 35 * sizeof(void (*)()), "a new kernels/cpu entry needs its line in pinned_table");
#define MT_PIN(entry) table.entry = &Pinned<&CpuOps::entry, decltype(CpuOps::entry)>::run

// The reductions add the kernel's result into device memory (backend/ops.h), as the CPU table does.
void pinned_xent_loss_sums(const float* row_max, const float* row_sumexp, const float* target_logit,
                           const float* loss_mask, int64_t rows, double* loss_sum, double* mask_sum,
                           mt::backend::Stream) {
  double loss = 0, mask = 0;
  mt::kernels::cpu::cpu_ops(pinned_level).xent_loss_sums(row_max, row_sumexp, target_logit, loss_mask, rows, &loss, &mask);
  *loss_sum += loss;
  *mask_sum += mask;
}
void pinned_sum_squares(const float* x, int64_t n, double* sum, mt::backend::Stream) {
  *sum += mt::kernels::cpu::cpu_ops(pinned_level).sum_squares(x, n);
}
void pinned_all_finite(const float* x, int64_t n, int32_t* finite, mt::backend::Stream) {
  if (!mt::kernels::cpu::cpu_ops(pinned_level).all_finite(x, n)) *finite = 0;
}

// The fused GEMM entries: the table's gemm, then the level's kernels (as the CPU table composes them).
void pinned_gemm_bias(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                      const void* b, int64_t ldb, const float* bias, float* c, DType operand_type,
                      mt::backend::Stream stream) {
  mt::backend::cpu_ops().gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n, operand_type, stream);
  mt::kernels::cpu::cpu_ops(pinned_level).bias_add(c, bias, m, static_cast<int>(n));
}
void pinned_gemm_bias_gelu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                           const void* b, int64_t ldb, const float* bias, float* pre, float* y, DType operand_type,
                           mt::backend::Stream stream) {
  mt::backend::cpu_ops().gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, pre, n, operand_type, stream);
  if (bias) mt::kernels::cpu::cpu_ops(pinned_level).bias_add(pre, bias, m, static_cast<int>(n));
  mt::kernels::cpu::cpu_ops(pinned_level).gelu_forward(pre, y, m * n);
}

// backend::cpu_ops() with every fused entry calling the kernels of `isa` directly.
mt::backend::Ops pinned_table(CpuIsa isa) {
  pinned_level = isa;
  mt::backend::Ops table = mt::backend::cpu_ops();
  table.gemm_bias = pinned_gemm_bias;
  table.gemm_bias_gelu = pinned_gemm_bias_gelu;
  MT_PIN(layernorm_forward);
  MT_PIN(layernorm_backward);
  MT_PIN(rmsnorm_forward);
  MT_PIN(rmsnorm_backward);
  MT_PIN(gelu_forward);
  MT_PIN(gelu_backward);
  MT_PIN(gelu_erf_forward);
  MT_PIN(gelu_erf_backward);
  MT_PIN(tanh_forward);
  MT_PIN(tanh_backward);
  MT_PIN(swiglu_forward);
  MT_PIN(swiglu_backward);
  MT_PIN(rope_forward);
  MT_PIN(rope_backward);
  MT_PIN(rope_yarn_forward);
  MT_PIN(rope_yarn_backward);
  MT_PIN(attention_forward);
  MT_PIN(attention_backward);
  MT_PIN(attention_merge);
  MT_PIN(embedding_forward);
  MT_PIN(embedding_backward);
  MT_PIN(xent_row_max);
  MT_PIN(xent_row_sumexp);
  MT_PIN(xent_target_logit);
  MT_PIN(xent_backward);
  table.xent_loss_sums = pinned_xent_loss_sums;
  MT_PIN(add_inplace);
  MT_PIN(scale_inplace);
  MT_PIN(bias_add);
  MT_PIN(bias_backward);
  table.sum_squares = pinned_sum_squares;
  table.all_finite = pinned_all_finite;
  MT_PIN(dropout_forward);
  MT_PIN(dropout_backward);
  MT_PIN(adamw_update);
  return table;
}

// At each level, the first case of every fused entry gives the same bits on backend::cpu_ops()
// as on that level's kernels called directly: no entry is wired to another kernel or level.
TEST(CpuBackend, FusedEntriesRunTheKernelsOfTheActiveLevel) {
  for (CpuIsa isa : cpu_levels()) {
    SCOPED_TRACE(mt::kernels::isa_name(isa));
    mt::kernels::set_active_isa(isa);
    const mt::backend::Ops pinned = pinned_table(isa);
    std::set<OpId> done;
    for (const OpCase& op_case : mt::harness::op_cases()) {
      if (op_case.measures_host_memory || done.count(op_case.op) ||
          mt::backend::op_entry(pinned, op_case.op) == mt::backend::op_entry(mt::backend::cpu_ops(), op_case.op)) {
        continue;
      }
      done.insert(op_case.op);
      SCOPED_TRACE(describe(op_case));
      const CaseOutcome table = mt::harness::run_case(mt::backend::cpu_ops(), op_case, {.keep_results = true});
      const CaseOutcome kernels = mt::harness::run_case(pinned, op_case, {.keep_results = true});
      EXPECT_EQ(table.status, CaseStatus::passed) << "the case fails on the CPU table";
      for (const std::string& difference : mt::harness::compare_results(table, kernels)) ADD_FAILURE() << difference;
    }
    EXPECT_EQ(done.size(), 37u);
  }
  mt::kernels::set_active_isa(cpu_levels().back());
}

// The fused GEMM entries give the bits of gemm, bias_add and gelu_forward called one after
// another, as the layers called them before the entries existed: CPU training numbers do not move.
TEST(CpuBackend, FusedGemmEntriesAreTheUnfusedEntriesBitForBit) {
  const mt::backend::Ops& ops = mt::backend::cpu_ops();
  const mt::backend::Stream stream = ops.default_stream();
  const int64_t m = 37, n = 29, k = 45;  // x (m, k) . W^T, W (n, k): the linears' NT form
  std::vector<float> x(m * k), w(n * k), bias(n);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i)) * 1.5f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.53f * float(i)) * 0.4f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.1f * float(i) - 1.2f;
  for (DType type : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(mt::dtype_name(type));
    std::vector<uint16_t> x_bits(x.size()), w_bits(w.size());
    const void* a = x.data();
    const void* b = w.data();
    if (type == DType::bf16) {
      ops.convert(x.data(), DType::f32, x_bits.data(), DType::bf16, m * k, stream);
      ops.convert(w.data(), DType::f32, w_bits.data(), DType::bf16, n * k, stream);
      a = x_bits.data();
      b = w_bits.data();
    }
    std::vector<float> unfused(m * n), unfused_y(m * n), fused(m * n), fused_y(m * n);
    for (const bool with_bias : {true, false}) {
      ops.gemm(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, unfused.data(), n, type, stream);
      if (with_bias) ops.bias_add(unfused.data(), bias.data(), m, static_cast<int>(n), stream);
      ops.gelu_forward(unfused.data(), unfused_y.data(), m * n, stream);
      ops.gemm_bias_gelu(false, true, m, n, k, a, k, b, k, with_bias ? bias.data() : nullptr, fused.data(),
                         fused_y.data(), type, stream);
      EXPECT_EQ(std::memcmp(fused.data(), unfused.data(), fused.size() * sizeof(float)), 0) << "pre, bias " << with_bias;
      EXPECT_EQ(std::memcmp(fused_y.data(), unfused_y.data(), fused_y.size() * sizeof(float)), 0)
          << "gelu, bias " << with_bias;
    }
    ops.gemm(false, true, m, n, k, 1.0f, a, k, b, k, 0.0f, unfused.data(), n, type, stream);
    ops.bias_add(unfused.data(), bias.data(), m, static_cast<int>(n), stream);
    ops.gemm_bias(false, true, m, n, k, a, k, b, k, bias.data(), fused.data(), type, stream);
    EXPECT_EQ(std::memcmp(fused.data(), unfused.data(), fused.size() * sizeof(float)), 0) << "gemm_bias";
  }
}

// bf16 operands go to the GEMM as bf16 bits only at the AVX512-BF16 level and where oneDNN builds
// bf16 matmuls (not under ONEDNN_MAX_CPU_ISA=AVX2); fp32 and fp16 always run f32 GEMMs.
TEST(CpuBackend, Bf16GemmOperandsOnlyWhereOneDnnHasANativeMatmul) {
  const mt::backend::Ops& ops = mt::backend::cpu_ops();
  for (CpuIsa isa : cpu_levels()) {
    mt::kernels::set_active_isa(isa);
    const bool native = isa == CpuIsa::avx512_bf16 && mt::kernels::cpu::onednn_bf16_matmul();
    EXPECT_EQ(ops.gemm_operand_type(mt::Precision::bf16), native ? DType::bf16 : DType::f32)
        << mt::kernels::isa_name(isa);
    EXPECT_EQ(ops.gemm_operand_type(mt::Precision::fp16), DType::f32);
    EXPECT_EQ(ops.gemm_operand_type(mt::Precision::fp32), DType::f32);
  }
  mt::kernels::set_active_isa(cpu_levels().back());
}

// Every case at every level, with the coverage table of each level; exit status 1 on a failure.
int print_coverage() {
  int failed = 0;
  for (CpuIsa isa : cpu_levels()) {
    mt::kernels::set_active_isa(isa);
    const mt::harness::Coverage coverage =
        mt::harness::run_cases(mt::backend::cpu_ops(), mt::harness::op_cases(), std::cerr);
    coverage.print(std::cout, std::string("cpu table at ") + mt::kernels::isa_name(isa));
    failed += coverage.failed();
  }
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Freed blocks stay with the process: cases allocate and free the same large sizes again and
  // again, and returning them to the kernel each time doubled the suite's system time.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (argc == 2 && std::string(argv[1]) == "--coverage") return print_coverage();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
