// A test fixture run once on the CPU table and once on the asynchronous CPU table
// (tests/backend/async_cpu_ops.h: device memory the host cannot touch, ops queued on a worker that
// starts each one `start_delay` late, so a value read without its stream's synchronize is stale
// every time, not by chance). Suites derive from OnEachTable, pass their delay, and instantiate
// with MT_INSTANTIATE_ON_EACH_TABLE. Used by tests/mpi/test_ring_attention.cpp and
// tests/mpi/test_token_dispatcher.cpp.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "backend/ops.h"
#include "tests/backend/async_cpu_ops.h"

namespace mt::mpi_test {

class OnEachTable : public ::testing::TestWithParam<bool> {
 protected:
  explicit OnEachTable(std::chrono::milliseconds start_delay) : start_delay_(start_delay) {}

  bool asynchronous() const { return GetParam(); }
  const backend::Ops& ops() const { return asynchronous() ? test_backend::async_cpu_ops() : backend::cpu_ops(); }
  void SetUp() override {
    if (asynchronous()) test_backend::set_async_start_delay(start_delay_);
  }
  void TearDown() override { test_backend::set_async_start_delay(std::chrono::microseconds(0)); }

 private:
  std::chrono::milliseconds start_delay_;
};

// Test names end in /Cpu and /AsyncCpu.
inline std::string table_name(const ::testing::TestParamInfo<bool>& info) { return info.param ? "AsyncCpu" : "Cpu"; }

}  // namespace mt::mpi_test

#define MT_INSTANTIATE_ON_EACH_TABLE(suite) \
  INSTANTIATE_TEST_SUITE_P(Tables, suite, ::testing::Values(false, true), ::mt::mpi_test::table_name)
