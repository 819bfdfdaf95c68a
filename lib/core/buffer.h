// Persistent, 64-byte aligned buffers. Big buffers are allocated once (at set-up) and reused
// every step; an optional byte counter records what a category (e.g. activations) holds, so
// memory reports are measured, not estimated. Tested through Tensor in tests/unit/core/test_tensor.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace mt {

// Bytes currently held by the buffers that report to it, and the high-water mark.
struct ByteCounter {
  int64_t current = 0;
  int64_t peak = 0;
  void add(int64_t bytes) {
    current += bytes;
    if (current > peak) peak = current;
  }
  void remove(int64_t bytes) { current -= bytes; }
};

template <typename T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(int64_t count, ByteCounter* counter = nullptr) { allocate(count, counter); }
  ~Buffer() { release(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
      counter_ = std::exchange(other.counter_, nullptr);
    }
    return *this;
  }

  // Zero-filled.
  void allocate(int64_t count, ByteCounter* counter = nullptr) {
    release();
    if (count <= 0) return;
    const size_t bytes = (static_cast<size_t>(count) * sizeof(T) + 63) / 64 * 64;
    data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!data_) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_), 0, bytes);
    count_ = count;
    counter_ = counter;
    if (counter_) counter_->add(static_cast<int64_t>(bytes));
  }
  void release() {
    if (!data_) return;
    if (counter_) counter_->remove(static_cast<int64_t>((static_cast<size_t>(count_) * sizeof(T) + 63) / 64 * 64));
    std::free(data_);
    data_ = nullptr;
    count_ = 0;
  }
  void zero() {
    if (data_) std::memset(static_cast<void*>(data_), 0, static_cast<size_t>(count_) * sizeof(T));
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  int64_t count_ = 0;
  ByteCounter* counter_ = nullptr;
};

}  // namespace mt
