// An ordered parallel pipeline: a producer fills work items one after another, `workers` threads
// process them in any order, and a consumer receives them in production order. Output built by
// the consumer is therefore identical for every worker count (mt-tokenize's --workers relies on
// it). With workers <= 1 everything runs inline on the calling thread, the honest single-thread
// baseline. At most 2 * workers + 2 items are alive at once, so memory stays bounded. An
// exception in any stage stops the pipeline and is rethrown on the calling thread.
// Tested in tests/unit/core/test_ordered_pipeline.cpp.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace mt {

// produce(Item&) returns false when there is nothing more (the item is then discarded);
// process(Item&) runs on a worker; consume(Item&) runs on the calling thread, in order.
template <class Item>
void run_ordered_pipeline(int workers, const std::function<bool(Item&)>& produce,
                          const std::function<void(Item&)>& process, const std::function<void(Item&)>& consume) {
  if (workers <= 1) {
    for (;;) {
      Item item;
      if (!produce(item)) return;
      process(item);
      consume(item);
    }
  }

  struct Shared {
    std::mutex mutex;
    std::condition_variable changed;
    std::deque<std::pair<int64_t, std::unique_ptr<Item>>> pending;  // produced, not yet processed
    std::map<int64_t, std::unique_ptr<Item>> done;                  // processed, not yet consumed
    int64_t alive = 0;                                              // produced and not consumed
    bool producing_finished = false;
    bool failed = false;
    std::exception_ptr error;
  } shared;
  const int64_t max_alive = 2 * static_cast<int64_t>(workers) + 2;

  auto fail = [&](std::exception_ptr error) {
    std::lock_guard lock(shared.mutex);
    if (!shared.failed) shared.error = error;
    shared.failed = true;
    shared.changed.notify_all();
  };

  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      for (;;) {
        std::pair<int64_t, std::unique_ptr<Item>> work;
        {
          std::unique_lock lock(shared.mutex);
          shared.changed.wait(lock, [&] { return shared.failed || !shared.pending.empty() || shared.producing_finished; });
          if (shared.failed || shared.pending.empty()) return;
          work = std::move(shared.pending.front());
          shared.pending.pop_front();
        }
        try {
          process(*work.second);
        } catch (...) {
          fail(std::current_exception());
          return;
        }
        std::lock_guard lock(shared.mutex);
        shared.done.emplace(work.first, std::move(work.second));
        shared.changed.notify_all();
      }
    });
  }

  // The calling thread produces while there is room and consumes whatever is next in order.
  int64_t next_produced = 0, next_consumed = 0;
  bool more = true;
  try {
    for (;;) {
      if (more) {
        bool room;
        {
          std::lock_guard lock(shared.mutex);
          if (shared.failed) break;
          room = shared.alive < max_alive;
        }
        if (room) {
          auto item = std::make_unique<Item>();
          more = produce(*item);
          std::lock_guard lock(shared.mutex);
          if (more) {
            shared.pending.emplace_back(next_produced++, std::move(item));
            ++shared.alive;
          } else {
            shared.producing_finished = true;
          }
          shared.changed.notify_all();
          continue;
        }
      }
      std::unique_ptr<Item> ready;
      {
        std::unique_lock lock(shared.mutex);
        if (!more && next_consumed == next_produced) break;
        shared.changed.wait(lock, [&] { return shared.failed || shared.done.count(next_consumed) > 0; });
        if (shared.failed) break;
        ready = std::move(shared.done.at(next_consumed));
        shared.done.erase(next_consumed);
      }
      consume(*ready);
      ++next_consumed;
      std::lock_guard lock(shared.mutex);
      --shared.alive;
    }
  } catch (...) {
    fail(std::current_exception());
  }
  {
    std::lock_guard lock(shared.mutex);
    shared.producing_finished = true;
    shared.changed.notify_all();
  }
  for (auto& thread : threads) thread.join();
  if (shared.error) std::rethrow_exception(shared.error);
}

}  // namespace mt
