// The op harness's machinery (see op_harness.h): staging through the table's copies, checks,
// running a case, comparing two runs, the coverage table.
#include "op_harness.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <exception>
#include <iomanip>

#include "reference.h"

namespace mt::harness {

const char* case_mode_name(CaseMode mode) {
  switch (mode) {
    case CaseMode::forward: return "forward";
    case CaseMode::backward: return "backward";
    case CaseMode::grad: return "grad";
    case CaseMode::accumulate: return "accumulate";
    case CaseMode::property: return "property";
    case CaseMode::refusal: return "refusal";
  }
  return "?";
}

Tolerances tolerances(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::bf16:
    case DType::f16: return {1e-5, 1e-4, 1e-4};
    default: return {0, 0, 0};  // no arithmetic on other types: exact
  }
}

// --- CaseContext ----------------------------------------------------------------------------------

CaseContext::CaseContext(const backend::Ops& ops) : ops_(ops), stream_(ops.default_stream()) {}

CaseContext::~CaseContext() {
  if (allocations_.empty()) return;
  try {
    finish();
  } catch (...) {  // finish records its failures; nothing may leave a destructor
  }
}

void* CaseContext::allocate_bytes(int64_t bytes) {
  if (bytes == 0) return nullptr;
  void* data = ops_.allocate(bytes, backend::MemoryCategory::activations);
  allocations_.emplace_back(data, bytes);
  return data;
}

void CaseContext::copy_to_device(void* device, const void* host, int64_t bytes,
                                 std::shared_ptr<const void> keep_alive) {
  if (bytes == 0) return;
  staging_.push_back(std::move(keep_alive));
  ops_.copy(device, host, bytes, backend::CopyKind::host_to_device, stream_);
}

void CaseContext::copy_to_host(void* host, const void* device, int64_t bytes) {
  if (bytes > 0) ops_.copy(host, device, bytes, backend::CopyKind::device_to_host, stream_);
  ops_.synchronize(stream_);
  staging_.clear();  // every copy issued before has completed
}

void CaseContext::record(const std::string& name, const void* bytes, size_t size) {
  if (!keep_results) return;
  const auto* first = static_cast<const unsigned char*>(bytes);
  records_.emplace_back(name, std::vector<unsigned char>(first, first + size));
}

void CaseContext::finish() {
  try {
    ops_.synchronize(stream_);
  } catch (const std::exception& e) {
    fail(std::string("synchronize threw: ") + e.what());
  }
  staging_.clear();
  for (auto& [data, bytes] : allocations_) {
    try {
      ops_.release(data, bytes, backend::MemoryCategory::activations);
    } catch (const std::exception& e) {
      fail(std::string("release threw: ") + e.what());
    }
  }
  allocations_.clear();
}

void CaseContext::fail(const std::string& message) { failures_.push_back(message); }

void CaseContext::expect(bool ok, const std::string& message) {
  if (!ok) fail(message);
}

void CaseContext::expect_close(const std::string& what, const std::vector<float>& actual,
                               const std::vector<double>& expected, double tol, double scale_override) {
  if (actual.size() != expected.size()) {
    return fail(what + ": " + std::to_string(actual.size()) + " values, expected " + std::to_string(expected.size()));
  }
  const double scale = (scale_override > 0 ? scale_override : rms(expected)) + 1e-30;
  int misses = 0;
  for (size_t i = 0; i < actual.size() && misses < 5; ++i) {
    const double bound = tol * (std::abs(expected[i]) + scale);
    if (!(std::abs(static_cast<double>(actual[i]) - expected[i]) <= bound)) {
      fail(what + "[" + std::to_string(i) + "] = " + text(actual[i]) + ", expected " + text(expected[i]) + " (bound " +
           text(bound) + ")");
      ++misses;
    }
  }
}

void CaseContext::expect_max_close(const std::string& what, const std::vector<float>& actual,
                                   const std::vector<double>& expected, double tol, double floor) {
  if (actual.size() != expected.size()) {
    return fail(what + ": " + std::to_string(actual.size()) + " values, expected " + std::to_string(expected.size()));
  }
  double max_error = 0, max_expected = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!std::isfinite(actual[i])) return fail(what + "[" + std::to_string(i) + "] is " + text(actual[i]));
    max_error = std::max(max_error, std::abs(double(actual[i]) - expected[i]));
    max_expected = std::max(max_expected, std::abs(expected[i]));
  }
  const double bound = tol * std::max(max_expected, floor);
  if (!(max_error <= bound)) {
    fail(what + ": max error " + text(max_error) + " above " + text(bound) + " (max |expected| " + text(max_expected) +
         ")");
  }
}

void CaseContext::expect_bits_equal(const std::string& what, const std::vector<float>& actual,
                                    const std::vector<float>& expected) {
  if (actual.size() != expected.size()) {
    return fail(what + ": " + std::to_string(actual.size()) + " values, expected " + std::to_string(expected.size()));
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::bit_cast<uint32_t>(actual[i]) != std::bit_cast<uint32_t>(expected[i])) {
      return fail(what + " differs at " + std::to_string(i) + ": " + text(actual[i]) + " vs " + text(expected[i]));
    }
  }
}

// --- running cases --------------------------------------------------------------------------------

namespace {

bool filled(const backend::Ops& ops, OpId op) { return backend::op_entry(ops, op) != nullptr; }

// The entries every case runs through: memory, the stream and the copies.
constexpr OpId kStagingOps[] = {OpId::allocate, OpId::release, OpId::default_stream, OpId::synchronize, OpId::copy};

}  // namespace

bool runs_case(const backend::Ops& ops, const OpCase& op_case) {
  if (!ops.supports) return false;
  for (OpId op : kStagingOps) {
    if (!filled(ops, op)) return false;
  }
  if (!filled(ops, op_case.op)) return false;
  if (op_case.mode == CaseMode::refusal) return !ops.supports(op_case.op, op_case.dtype);
  if (!ops.supports(op_case.op, op_case.dtype)) return false;
  for (OpId op : op_case.also_uses) {
    if (!filled(ops, op) || !ops.supports(op, op_case.dtype)) return false;
  }
  return true;
}

CaseOutcome run_case(const backend::Ops& ops, const OpCase& op_case, const RunOptions& options) {
  CaseOutcome outcome;
  if (!runs_case(ops, op_case)) return outcome;
  CaseContext context(ops);
  context.keep_results = options.keep_results;
  context.peak_rss_kib = options.peak_rss_kib;
  try {
    op_case.body(context);
  } catch (const std::exception& e) {
    context.fail(std::string("threw: ") + e.what());
  } catch (...) {
    context.fail("threw something that is not a std::exception");
  }
  context.finish();
  outcome.failures = context.failures();
  outcome.results = context.take_records();
  outcome.status = outcome.failures.empty() ? CaseStatus::passed : CaseStatus::failed;
  return outcome;
}

std::vector<std::string> compare_results(const CaseOutcome& first, const CaseOutcome& second) {
  std::vector<std::string> differences;
  if (first.results.size() != second.results.size()) {
    differences.push_back(std::to_string(first.results.size()) + " results against " +
                          std::to_string(second.results.size()));
    return differences;
  }
  for (size_t i = 0; i < first.results.size(); ++i) {
    const auto& [name, bytes] = first.results[i];
    const auto& other = second.results[i].second;
    if (name != second.results[i].first || bytes.size() != other.size()) {
      differences.push_back("result " + std::to_string(i) + " (" + name + ") has another name or size");
    } else if (bytes != other) {
      const auto at = std::mismatch(bytes.begin(), bytes.end(), other.begin()).first - bytes.begin();
      differences.push_back(name + " differs from byte " + std::to_string(at));
    }
  }
  return differences;
}

// --- coverage -------------------------------------------------------------------------------------

Coverage::Coverage(const backend::Ops& ops, const std::vector<OpCase>& cases) {
  constexpr DType kShown[] = {DType::f32, DType::bf16, DType::f16};
  for (int i = 0; i < backend::kOpCount; ++i) {
    CoverageRow row;
    row.op = static_cast<OpId>(i);
    row.filled = filled(ops, row.op);
    for (int d = 0; d < 3; ++d) row.dtype_supported[d] = row.filled && ops.supports && ops.supports(row.op, kShown[d]);
    rows_.push_back(row);
  }
  for (const OpCase& op_case : cases) {
    CoverageRow& row = rows_[static_cast<size_t>(op_case.op)];
    ++row.cases;
    ++row.cases_by_mode[static_cast<int>(op_case.mode)];
  }
}

void Coverage::add(const OpCase& op_case, const CaseOutcome& outcome) {
  runs_added_ = true;
  CoverageRow& row = rows_[static_cast<size_t>(op_case.op)];
  if (outcome.status == CaseStatus::unsupported) {
    ++row.unsupported;
    return;
  }
  ++row.ran;
  if (outcome.status == CaseStatus::passed) ++row.passed;
  if (outcome.status == CaseStatus::failed) ++failed_;
}

void Coverage::print(std::ostream& out, const std::string& title) const {
  out << title << "\n";
  out << std::left << std::setw(31) << "op" << std::setw(7) << "filled" << std::setw(5) << "f32" << std::setw(5)
      << "bf16" << std::setw(5) << "f16" << std::setw(6) << "waits" << std::setw(7) << "cases" << std::setw(26) << "fwd/bwd/grad/acc/prop/ref";
  if (runs_added_)
    out << std::setw(6) << "ran" << std::setw(8) << "passed"
        << "unsupported";
  out << "\n";
  int cases = 0, ran = 0, passed = 0, unsupported = 0;
  for (const CoverageRow& row : rows_) {
    std::string modes;
    for (int m = 0; m < kCaseModes; ++m) {
      if (m) modes += '/';
      modes += std::to_string(row.cases_by_mode[m]);
    }
    out << std::setw(31) << backend::op_name(row.op) << std::setw(7) << (row.filled ? "yes" : "no");
    for (bool supported : row.dtype_supported) out << std::setw(5) << (supported ? "yes" : "-");
    out << std::setw(6) << (backend::op_waits_for_stream(row.op) ? "yes" : "-");
    out << std::setw(7) << row.cases << std::setw(26) << modes;
    if (runs_added_) out << std::setw(6) << row.ran << std::setw(8) << row.passed << row.unsupported;
    out << "\n";
    cases += row.cases;
    ran += row.ran;
    passed += row.passed;
    unsupported += row.unsupported;
  }
  out << "total: " << cases << " cases";
  if (runs_added_) out << ", " << ran << " ran, " << passed << " passed, " << unsupported << " unsupported";
  out << "\n";
}

std::string describe(const OpCase& op_case) {
  return std::string(backend::op_name(op_case.op)) + " " + case_mode_name(op_case.mode) + " " +
         dtype_name(op_case.dtype) + ": " + op_case.name;
}

Coverage run_cases(const backend::Ops& ops, const std::vector<OpCase>& cases, std::ostream& failures) {
  Coverage coverage(ops, cases);
  for (const OpCase& op_case : cases) {
    const CaseOutcome outcome = run_case(ops, op_case);
    coverage.add(op_case, outcome);
    for (const std::string& failure : outcome.failures) failures << describe(op_case) << ": " << failure << "\n";
  }
  return coverage;
}

}  // namespace mt::harness
