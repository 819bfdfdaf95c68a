// Device memory with accounting: DeviceBuffer<T> holds memory from a backend's allocate entry and
// reports its bytes, by category (weights, grads, optimizer, activations, comm buffers), to a
// MemoryLedger that keeps the live and peak bytes of each category and of their sum. Ledgers
// chain: a stage's ledger forwards to its rank's, so the step and memory records (DESIGN.md
// sec. 4) read measured bytes, per stage and per rank, never estimates. Allocation happens at
// set-up on one thread; ledgers are not thread-safe. Tested in tests/unit/backend/test_device_memory.cpp.
#pragma once

#include <cstdint>
#include <utility>

#include "backend/ops.h"

namespace mt::backend {

class MemoryLedger {
 public:
  // Bytes added here are also added to `parent` (nullable), e.g. a stage's ledger to its rank's.
  explicit MemoryLedger(MemoryLedger* parent = nullptr) : parent_(parent) {}

  void add(MemoryCategory category, int64_t bytes);
  void remove(MemoryCategory category, int64_t bytes);

  int64_t live(MemoryCategory category) const { return live_[index(category)]; }
  int64_t peak(MemoryCategory category) const { return peak_[index(category)]; }
  int64_t live_total() const { return live_total_; }
  int64_t peak_total() const { return peak_total_; }  // high-water mark of the sum over categories
  int64_t live_count() const { return live_count_; }  // buffers held (one add each)

 private:
  static int index(MemoryCategory category) { return static_cast<int>(category); }

  MemoryLedger* parent_;
  int64_t live_[kMemoryCategories] = {};
  int64_t peak_[kMemoryCategories] = {};
  int64_t live_total_ = 0;
  int64_t peak_total_ = 0;
  int64_t live_count_ = 0;
};

// Bytes a buffer of `count` elements of `T` takes: rounded up to 64 (every buffer is aligned).
template <typename T>
constexpr int64_t buffer_bytes(int64_t count) {
  return (count * static_cast<int64_t>(sizeof(T)) + 63) / 64 * 64;
}

// `count` zero-filled elements of device memory; move-only.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const Ops& ops, int64_t count, MemoryCategory category, MemoryLedger* ledger = nullptr) {
    if (count <= 0) return;
    bytes_ = buffer_bytes<T>(count);
    data_ = static_cast<T*>(ops.allocate(bytes_, category));
    ops_ = &ops;
    count_ = count;
    category_ = category;
    ledger_ = ledger;
    if (ledger_) ledger_->add(category_, bytes_);
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      ops_ = std::exchange(other.ops_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
      bytes_ = std::exchange(other.bytes_, 0);
      category_ = other.category_;
      ledger_ = std::exchange(other.ledger_, nullptr);
    }
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return count_; }
  int64_t bytes() const { return bytes_; }
  bool empty() const { return count_ == 0; }

 private:
  void release() {
    if (!data_) return;
    if (ledger_) ledger_->remove(category_, bytes_);
    ops_->release(data_, bytes_, category_);
    data_ = nullptr;
    count_ = 0;
    bytes_ = 0;
  }

  const Ops* ops_ = nullptr;
  T* data_ = nullptr;
  int64_t count_ = 0;
  int64_t bytes_ = 0;
  MemoryCategory category_ = MemoryCategory::activations;
  MemoryLedger* ledger_ = nullptr;
};

}  // namespace mt::backend
