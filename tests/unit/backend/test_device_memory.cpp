// Device memory with accounting (lib/backend/memory.h) on the CPU backend: DeviceBuffer's bytes
// (rounded to 64), moves that keep one account, and MemoryLedger's live and peak bytes per category
// and in total, forwarded from a stage's ledger to its rank's. What allocate itself gives (aligned,
// zero-filled memory) is an op harness case (tests/unit/backend/test_op_harness.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

#include "backend/memory.h"
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
