// Device memory with accounting (lib/backend/memory.h) on the CPU backend: DeviceBuffer's bytes
// (rounded to 64), moves that keep one account, and MemoryLedger's live and peak bytes per category
// and in total, forwarded from a stage's ledger to its rank's. What allocate itself gives (aligned,
// zero-filled memory) is an op harness case (tests/unit/backend/test_op_harness.cpp).
// Releasable buffers (FSDP's unit buffers): whole pages of a released range back to the buffer's
// pool (they read back as zeros, the range's bytes on shared pages zeroed and the rest left
// alone), the pool reused for another range without growing and without page faults, the ledger
// counting the pool.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstdint>
#include <string>
#include <utility>

#include "backend/memory.h"
#include "core/error.h"
#include "backend/ops.h"

using namespace mt;
using backend::MemoryCategory;

TEST(BackendMemory, BuffersAreAccountedPerCategoryAndForwardedToTheParentLedger) {
  const backend::Ops& ops = backend::cpu_ops();
  backend::MemoryLedger rank;
  backend::MemoryLedger stage(&rank);
  {
    backend::DeviceBuffer<float> weights(ops, 1000, MemoryCategory::weights, &rank);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(weights.data()) % 64, 0u);
    EXPECT_EQ(weights.size(), 1000);
    EXPECT_EQ(weights.bytes(), 4032);  // 4000 rounded up to 64
    backend::DeviceBuffer<float> first(ops, 10, MemoryCategory::activations, &stage);
    {
      backend::DeviceBuffer<uint16_t> second(ops, 100, MemoryCategory::activations, &stage);
      EXPECT_EQ(stage.live(MemoryCategory::activations), 64 + 256);
      backend::DeviceBuffer<uint16_t> moved = std::move(second);  // moving keeps one account
      EXPECT_EQ(stage.live(MemoryCategory::activations), 64 + 256);
      EXPECT_TRUE(second.empty());
    }
    EXPECT_EQ(stage.live(MemoryCategory::activations), 64);
    EXPECT_EQ(stage.peak(MemoryCategory::activations), 64 + 256);
    EXPECT_EQ(stage.live(MemoryCategory::weights), 0);
    // The stage's ledger forwards to the rank's.
    EXPECT_EQ(rank.live(MemoryCategory::activations), 64);
    EXPECT_EQ(rank.peak(MemoryCategory::activations), 320);
    EXPECT_EQ(rank.live(MemoryCategory::weights), 4032);
    EXPECT_EQ(rank.live_total(), 4032 + 64);
    EXPECT_EQ(rank.peak_total(), 4032 + 320);
  }
  EXPECT_EQ(rank.live_total(), 0);
  EXPECT_EQ(rank.peak_total(), 4032 + 320);
  EXPECT_EQ(rank.peak(MemoryCategory::grads), 0);
  EXPECT_STREQ(backend::memory_category_name(MemoryCategory::comm_buffers), "comm_buffers");
  backend::DeviceBuffer<float> empty(ops, 0, MemoryCategory::grads, &rank);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(rank.live(MemoryCategory::grads), 0);
}

namespace {

// The process's minor page faults so far.
int64_t minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

}  // namespace

TEST(BackendMemory, ReleasablePagesReturnToThePoolAndAreReusedWithoutFaults) {
  const int64_t page = backend::ReleasableMemory::page_bytes();
  const int64_t floats_per_page = page / 4;
  const int64_t count = 64 * floats_per_page;  // 64 pages
  backend::MemoryLedger ledger;
  backend::DeviceBuffer<float> buffer(backend::cpu_ops(), count, MemoryCategory::grads, &ledger,
                                      backend::Residency::releasable);
  backend::ReleasableMemory* pages = buffer.releasable();
  ASSERT_NE(pages, nullptr);
  EXPECT_EQ(ledger.live(MemoryCategory::grads), 0);
  EXPECT_EQ(ledger.live_count(), 1);
  pages->make_resident(0, count * 4);
  for (int64_t i = 0; i < count; ++i) buffer.data()[i] = 1.0f;
  EXPECT_EQ(ledger.live(MemoryCategory::grads), 64 * page);
  EXPECT_EQ(pages->resident_bytes(), 64 * page);
  // Release from the middle of page 1 to the middle of page 40: pages 2..39 go back to the pool,
  // which the process still holds (the ledger's count).
  const int64_t begin = floats_per_page + floats_per_page / 2, end = 40 * floats_per_page + 5;
  pages->release(begin * 4, end * 4);
  EXPECT_EQ(pages->resident_bytes(), (64 - 38) * page);
  EXPECT_EQ(pages->pool_bytes(), 64 * page);
  EXPECT_EQ(ledger.live(MemoryCategory::grads), 64 * page);
  EXPECT_EQ(ledger.peak(MemoryCategory::grads), 64 * page);
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(buffer.data()[i], i >= begin && i < end ? 0.0f : 1.0f) << "element " << i;
  }
  // In use again: from the pool (no growth), zeros, writable, mapped without a fault per page.
  const int64_t faults = minor_faults();
  pages->make_resident(begin * 4, end * 4);
  for (int64_t i = begin; i < end; ++i) buffer.data()[i] += 2.0f;
  // Fewer than one fault per two pages (a fault per page would be 38): ASan's shadow pages of the
  // range fault too (14 in its CI job).
  EXPECT_LE(minor_faults() - faults, 19) << "38 reused pages";
  EXPECT_EQ(ledger.live(MemoryCategory::grads), 64 * page);
  EXPECT_EQ(pages->resident_bytes(), 64 * page);
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(buffer.data()[i], i >= begin && i < end ? 2.0f : 1.0f) << i;
  EXPECT_THROW(pages->release(0, count * 4 + 4), Error);
}

// The pool holds the most pages in use at once: a unit's pages released and another's taken
// reuse them (the peak is what was in use together, as when released pages went to the OS).
TEST(BackendMemory, ReleasablePoolGrowsToTheMostPagesInUseAtOnce) {
  const int64_t page = backend::ReleasableMemory::page_bytes();
  const int64_t floats_per_page = page / 4;
  backend::MemoryLedger ledger;
  backend::DeviceBuffer<float> buffer(backend::cpu_ops(), 64 * floats_per_page, MemoryCategory::weights, &ledger,
                                      backend::Residency::releasable);
  backend::ReleasableMemory* pages = buffer.releasable();
  for (int unit = 0; unit < 4; ++unit) {  // units of 16 pages, one after another
    const int64_t first = unit * 16 * floats_per_page, last = (unit + 1) * 16 * floats_per_page;
    pages->make_resident(first * 4, last * 4);
    for (int64_t i = first; i < last; ++i) {
      ASSERT_EQ(buffer.data()[i], 0.0f) << "unit " << unit << " element " << i;
      buffer.data()[i] = static_cast<float>(unit + 1);
    }
    pages->release(first * 4, last * 4);
  }
  EXPECT_EQ(pages->pool_bytes(), 16 * page);
  EXPECT_EQ(ledger.peak(MemoryCategory::weights), 16 * page);
  // Two units at once: the pool grows by the second's pages only.
  pages->make_resident(0, 32 * page);
  EXPECT_EQ(ledger.live(MemoryCategory::weights), 32 * page);
  for (int64_t i = 0; i < 32 * floats_per_page; ++i) ASSERT_EQ(buffer.data()[i], 0.0f) << i;
  // Taken for a range its caller overwrites (a gather): pool pages unzeroed inside the range, but
  // the bytes outside it on the pages it shares (a released neighbour's) read as zeros.
  for (int64_t i = 0; i < 32 * floats_per_page; ++i) buffer.data()[i] = 7.0f;
  pages->release(0, 32 * page);
  const int64_t begin = 40 * floats_per_page + floats_per_page / 2, end = 42 * floats_per_page + 3;
  pages->make_resident(begin * 4, end * 4, backend::ReleasableMemory::Contents::overwritten);
  EXPECT_EQ(ledger.live(MemoryCategory::weights), 32 * page);
  for (int64_t i = 40 * floats_per_page; i < 43 * floats_per_page; ++i) {
    if (i < begin || i >= end) ASSERT_EQ(buffer.data()[i], 0.0f) << "element " << i;
  }
  buffer = backend::DeviceBuffer<float>();
  EXPECT_EQ(ledger.live(MemoryCategory::weights), 0);
  EXPECT_EQ(ledger.live_count(), 0);
}
