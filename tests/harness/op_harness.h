// The op harness (after ggml's test-backend-ops): one list of op cases (op_cases.h) that
// any filled backend op table (backend/ops.h) runs. A case names the entry it checks and the
// element type, makes its inputs on the host (odd shapes on purpose), copies them into the
// backend's memory with the table's own allocate and copy (host_to_device), runs entries on the
// table's default stream, copies the results back (device_to_host), synchronises, and compares
// them with the double-precision reference loops of reference.h under the tolerances of its
// dtype. Backward entries are also checked against central differences of the reference forward
// (grad mode) and for accumulating into their parameter grads. Backend memory is never read from
// the host except through the table's copies (an asynchronous table may protect it between ops).
// The runners (the CPU table at every ISA level, an asynchronous test table, the CUDA
// self-test) link this library; a coverage table says which entries a backend fills, which
// dtypes it supports and how many cases ran and passed. Tested in
// tests/unit/backend/test_op_harness.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/op_list.h"
#include "backend/ops.h"

namespace mt::harness {

using backend::OpId;

// What a case checks: an entry's results against the reference (forward, or a backward entry
// against the analytic backward), a backward entry against central differences of the reference
// forward (grad), parameter grads accumulated by repeated calls (accumulate), a promise of the
// contract beyond one call (property: layouts, merges, statistics, memory), or an unsupported
// dtype refused by name (refusal: runs only on a table that says it does not support it).
enum class CaseMode { forward, backward, grad, accumulate, property, refusal };
inline constexpr int kCaseModes = 6;
const char* case_mode_name(CaseMode mode);

// Tolerances against the double-precision references, by the element type of a case. Relative:
// |actual - expected| <= tol (|expected| + rms(expected)) for the fused ops (max-norm relative
// for attention); GEMMs absolute, with inputs in [-1, 1) and at most a few hundred terms. The GEMM
// references multiply the operands' rounded values, so bf16 and f16 operands (exact products,
// fp32 accumulation) are held to fp32's bound.
struct Tolerances {
  double reference;          // an entry against its reference loop
  double finite_difference;  // a backward entry against central differences (O(h^2) error)
  double gemm;               // absolute, per element of C
};
Tolerances tolerances(DType dtype);

// A device array the case made; `data` is a device pointer, passed to entries, never read here.
template <typename T>
struct DeviceArray {
  T* data = nullptr;
  int64_t size = 0;
};

// One run of one case on one table: allocations, staging, the copies back, the checks' failures.
class CaseContext {
 public:
  explicit CaseContext(const backend::Ops& ops);
  ~CaseContext();
  CaseContext(const CaseContext&) = delete;
  CaseContext& operator=(const CaseContext&) = delete;

  const backend::Ops& ops() const { return ops_; }
  backend::Stream stream() const { return stream_; }

  // A device copy of `values` (allocate, then copy host_to_device on the stream; the host values
  // are kept until the stream has run the copy).
  template <typename T>
  DeviceArray<T> upload(std::vector<T> values) {
    auto staged = std::make_shared<const std::vector<T>>(std::move(values));
    DeviceArray<T> array{static_cast<T*>(allocate_bytes(byte_size<T>(staged->size()))),
                         static_cast<int64_t>(staged->size())};
    copy_to_device(array.data, staged->data(), byte_size<T>(staged->size()), staged);
    return array;
  }
  // `n` device elements as the table's allocate gives them (zero-filled by contract).
  template <typename T>
  DeviceArray<T> allocated(int64_t n) {
    return {static_cast<T*>(allocate_bytes(byte_size<T>(static_cast<size_t>(n)))), n};
  }
  // `n` device elements holding `value` (a sentinel the entry must overwrite, or must not touch).
  template <typename T>
  DeviceArray<T> filled(int64_t n, T value) {
    return upload(std::vector<T>(static_cast<size_t>(n), value));
  }
  // The array's values on the host (copy device_to_host, then synchronize); kept under `name`
  // when the run keeps its results, so that two runs of a case can be compared bit for bit.
  template <typename T>
  std::vector<T> download(const DeviceArray<T>& array, const std::string& name) {
    std::vector<T> values(static_cast<size_t>(array.size));
    copy_to_host(values.data(), array.data, byte_size<T>(values.size()));
    record(name, values.data(), byte_size<T>(values.size()));
    return values;
  }

  // --- checks (each failure is one line naming the quantity and the element) ----------------
  void expect(bool ok, const std::string& message);
  // Elementwise |actual - expected| <= tol (|expected| + scale), scale = rms(expected) unless
  // given (the size of the terms that cancel into `expected`); the first 5 misses reported.
  void expect_close(const std::string& what, const std::vector<float>& actual, const std::vector<double>& expected,
                    double tol, double scale_override = 0.0);
  // max |actual - expected| <= tol max(max |expected|, floor), every actual finite.
  void expect_max_close(const std::string& what, const std::vector<float>& actual, const std::vector<double>& expected,
                        double tol, double floor);
  void expect_bits_equal(const std::string& what, const std::vector<float>& actual, const std::vector<float>& expected);
  template <typename T>
  void expect_equal(const std::string& what, const std::vector<T>& actual, const std::vector<T>& expected) {
    if (actual.size() != expected.size())
      return fail(what + ": " + std::to_string(actual.size()) + " values, expected " + std::to_string(expected.size()));
    for (size_t i = 0; i < actual.size(); ++i) {
      if (!(actual[i] == expected[i])) {
        return fail(what + "[" + std::to_string(i) + "] = " + text(actual[i]) + ", expected " + text(expected[i]));
      }
    }
  }
  void fail(const std::string& message);

  // Whether downloads are kept for compare_results (a copy of every result; off by default).
  bool keep_results = false;
  // Peak resident set of the process in KiB, where the runner can measure it (the CPU); null
  // elsewhere, and cases then skip their host-memory checks.
  std::function<long()> peak_rss_kib;

  // Synchronises the stream and releases every allocation; failures of either are recorded.
  void finish();

  const std::vector<std::string>& failures() const { return failures_; }
  std::vector<std::pair<std::string, std::vector<unsigned char>>> take_records() { return std::move(records_); }

 private:
  template <typename T>
  static int64_t byte_size(size_t count) {
    return static_cast<int64_t>(count * sizeof(T));
  }
  template <typename T>
  static std::string text(const T& value) {
    std::ostringstream out;
    out.precision(9);
    out << +value;
    return out.str();
  }
  void* allocate_bytes(int64_t bytes);
  void copy_to_device(void* device, const void* host, int64_t bytes, std::shared_ptr<const void> keep_alive);
  void copy_to_host(void* host, const void* device, int64_t bytes);
  void record(const std::string& name, const void* bytes, size_t size);

  const backend::Ops& ops_;
  backend::Stream stream_;
  std::vector<std::pair<void*, int64_t>> allocations_;
  std::vector<std::shared_ptr<const void>> staging_;  // host sources of copies still in flight
  std::vector<std::pair<std::string, std::vector<unsigned char>>> records_;
  std::vector<std::string> failures_;
};

// One case of the list.
struct OpCase {
  OpId op;                   // the entry it checks (coverage, filters)
  DType dtype = DType::f32;  // the element type it runs the entry on
  CaseMode mode = CaseMode::forward;
  std::string name;                  // what it checks and on which shape
  std::vector<OpId> also_uses = {};  // other entries it runs (a backward case's forward), on the same dtype
  // Results must not change with the number of threads a backend runs the entry on: the CPU
  // runner reruns the case at another OpenMP team size and compares every result bit for bit.
  bool thread_count_independent = false;
  // Measures the process's peak memory (runners run it first in a fresh process).
  bool measures_host_memory = false;
  std::function<void(CaseContext&)> body = {};
};

enum class CaseStatus { passed, failed, unsupported };

struct CaseOutcome {
  CaseStatus status = CaseStatus::unsupported;
  std::vector<std::string> failures;
  std::vector<std::pair<std::string, std::vector<unsigned char>>> results;  // kept downloads, in order
};

struct RunOptions {
  bool keep_results = false;                // keep every download (for compare_results)
  std::function<long()> peak_rss_kib = {};  // see CaseContext::peak_rss_kib
};

// Whether `ops` runs the case: every entry it uses filled, and supported on its dtype (for a
// refusal case: the entry filled and the dtype not supported).
bool runs_case(const backend::Ops& ops, const OpCase& op_case);
// Runs the case on `ops` (unsupported: not run). An exception out of the case is a failure.
CaseOutcome run_case(const backend::Ops& ops, const OpCase& op_case, const RunOptions& options = {});
// The differences between two runs' results (empty when every download has the same bits).
std::vector<std::string> compare_results(const CaseOutcome& first, const CaseOutcome& second);

// --- coverage ---------------------------------------------------------------------------------
// Per entry: filled or not, the dtypes supported among f32, bf16 and f16, the cases the list has
// (by mode), and, once runs are added, how many ran, passed and were unsupported.
struct CoverageRow {
  OpId op;
  bool filled = false;
  bool dtype_supported[3] = {};  // f32, bf16, f16
  int cases_by_mode[kCaseModes] = {};
  int cases = 0, ran = 0, passed = 0, unsupported = 0;
};

class Coverage {
 public:
  Coverage(const backend::Ops& ops, const std::vector<OpCase>& cases);
  void add(const OpCase& op_case, const CaseOutcome& outcome);
  const std::vector<CoverageRow>& rows() const { return rows_; }
  // One line per entry: op, filled, f32/bf16/f16, whether it makes the host wait for the stream
  // (backend::op_waits_for_stream), cases (forward/backward/grad/accumulate/
  // property/refusal), and ran / passed / unsupported when runs were added.
  void print(std::ostream& out, const std::string& title) const;
  // Cases that ran and failed.
  int failed() const { return failed_; }

 private:
  std::vector<CoverageRow> rows_;
  bool runs_added_ = false;
  int failed_ = 0;
};

// "layernorm_backward grad float32: rows=3 cols=5 ...": a case as failures and listings name it.
std::string describe(const OpCase& op_case);

// Every case of `cases` on `ops`, once each: the coverage with the runs added; each failure is
// written to `failures` as one line naming its case.
Coverage run_cases(const backend::Ops& ops, const std::vector<OpCase>& cases, std::ostream& failures);

}  // namespace mt::harness
