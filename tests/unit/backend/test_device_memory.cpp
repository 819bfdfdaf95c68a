// Device memory with accounting (lib/backend/memory.h) on the CPU backend: DeviceBuffer's bytes
// (rounded to 64), moves that keep one account, and MemoryLedger's live and peak bytes per category
// and in total, forwarded from a stage's ledger to its rank's. What allocate itself gives (aligned,
// zero-filled memory) is an op harness case (tests/unit/backend/test_op_harness.cpp).
// Releasable buffers (FSDP's unit buffers): pages counted when marked resident, whole pages of a
// released range back to the OS (the process's resident set shrinks, they read back as zeros),
// the range's bytes on shared pages zeroed and the rest left alone.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
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

// The process's resident set in bytes (Linux /proc/self/statm: pages).
int64_t resident_set_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * backend::ReleasableMemory::page_bytes();
}

}  // namespace

TEST(BackendMemory, ReleasableBuffersHandWholePagesBackAndCountWhatIsResident) {
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
  const int64_t before = resident_set_bytes();
  pages->make_resident(0, count * 4);
  for (int64_t i = 0; i < count; ++i) buffer.data()[i] = 1.0f;
  EXPECT_EQ(ledger.live(MemoryCategory::grads), 64 * page);
  EXPECT_GE(resident_set_bytes() - before, 60 * page);
  // Release from the middle of page 1 to the middle of page 40: pages 2..39 go back.
  const int64_t begin = floats_per_page + floats_per_page / 2, end = 40 * floats_per_page + 5;
  const int64_t touched = resident_set_bytes();
  pages->release(begin * 4, end * 4);
  EXPECT_EQ(ledger.live(MemoryCategory::grads), (64 - 38) * page);
  EXPECT_EQ(ledger.peak(MemoryCategory::grads), 64 * page);
  // 38 pages go back; the bound leaves 8 for what the process maps meanwhile (ASan's own
  // allocations made the drop 35 pages in the CI's sanitizer job). No madvise: no drop at all.
  EXPECT_LE(resident_set_bytes(), touched - 30 * page);
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(buffer.data()[i], i >= begin && i < end ? 0.0f : 1.0f) << "element " << i;
  }
  pages->make_resident(0, count * 4);
  EXPECT_EQ(ledger.live(MemoryCategory::grads), 64 * page);
  EXPECT_THROW(pages->release(0, count * 4 + 4), Error);
  buffer = backend::DeviceBuffer<float>();
  EXPECT_EQ(ledger.live(MemoryCategory::grads), 0);
  EXPECT_EQ(ledger.live_count(), 0);
}
