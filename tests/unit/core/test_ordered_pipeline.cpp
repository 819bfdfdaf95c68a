// core/ordered_pipeline.h: items reach the consumer in production order for every worker count
// even when processing finishes out of order, memory stays bounded, and an exception in any
// stage is rethrown on the caller with every thread joined.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/ordered_pipeline.h"

namespace {

struct Item {
  int index = -1;
  int value = 0;
};

std::vector<int> run(int workers, int count, std::atomic<int>* peak_alive = nullptr) {
  std::vector<int> consumed;
  int next = 0;
  std::atomic<int> alive{0};
  mt::run_ordered_pipeline<Item>(
      workers,
      [&](Item& item) {
        if (next == count) return false;
        item.index = next++;
        const int now = ++alive;
        if (peak_alive && now > *peak_alive) *peak_alive = now;
        return true;
      },
      [&](Item& item) {
        // Later items finish first now and then, so order must come from the pipeline.
        if (item.index % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        item.value = item.index * item.index;
      },
      [&](Item& item) {
        consumed.push_back(item.value);
        --alive;
      });
  return consumed;
}

TEST(OrderedPipeline, ConsumesInProductionOrderForEveryWorkerCount) {
  std::vector<int> expected;
  for (int i = 0; i < 200; ++i) expected.push_back(i * i);
  for (int workers : {1, 2, 3, 8}) EXPECT_EQ(run(workers, 200), expected) << workers << " workers";
}

TEST(OrderedPipeline, EmptyInput) { EXPECT_TRUE(run(4, 0).empty()); }

TEST(OrderedPipeline, KeepsAtMostTwoItemsPerWorkerAlive) {
  std::atomic<int> peak{0};
  run(3, 300, &peak);
  EXPECT_LE(peak.load(), 2 * 3 + 2);
  EXPECT_GE(peak.load(), 2);
}

TEST(OrderedPipeline, RethrowsFromEveryStage) {
  for (int workers : {1, 4}) {
    for (int stage = 0; stage < 3; ++stage) {
      int produced = 0;
      auto throw_at = [&](int which, int index) {
        if (which == stage && index == 17) throw std::runtime_error("stage " + std::to_string(stage));
      };
      EXPECT_THROW(mt::run_ordered_pipeline<Item>(
                       workers,
                       [&](Item& item) {
                         if (produced == 100) return false;
                         item.index = produced++;
                         throw_at(0, item.index);
                         return true;
                       },
                       [&](Item& item) { throw_at(1, item.index); }, [&](Item& item) { throw_at(2, item.index); }),
                   std::runtime_error)
          << "workers " << workers << " stage " << stage;
    }
  }
}

}  // namespace
