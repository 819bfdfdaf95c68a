// Device memory with accounting: DeviceBuffer<T> holds memory from a backend's allocate entry and
// reports its bytes, by category (weights, grads, optimizer, activations, comm buffers), to a
// MemoryLedger that keeps the live and peak bytes of each category and of their sum. Ledgers
// chain: a stage's ledger forwards to its rank's, so the step and memory records (DESIGN.md
// sec. 4) read measured bytes, per stage and per rank, never estimates. Allocation happens at
// set-up on one thread; ledgers are not thread-safe.
// A buffer made releasable (Residency::releasable, the CPU backend only: Megatron-FSDP's unit
// buffers, optim/fsdp_grads.h and optim/fsdp_params.h) is a virtual range whose pages come from a
// pool of physical pages it owns (a memfd), as Megatron-FSDP keeps persistent unit buffers rather
// than allocating per unit: it starts with no page in use (reading as zeros), its owner marks the
// byte ranges it is about to write in use (make_resident: pool pages mapped there in one
// prefaulted mmap per run and zeroed, unless the caller overwrites the range; the pool grows only
// when it has no page free) and hands whole pages of a range back when done (release: the pages
// back to the pool, the range mapped back to zeros; the range's bytes on pages it shares with the
// rest are zeroed instead). Pages are never returned to the OS while the buffer lives, so the
// pool grows to the most pages ever in use at once and stays there: the ledger counts the pool
// (what the process holds), so its peak is the most pages in use at once, as when released pages
// went back to the OS, but reusing a page costs no page fault (issue 25: refaulting them cost
// FSDP about a third of its step on 2 cores). The CUDA analogue would map and unmap pooled
// physical pages into one virtual range (cuMemMap / cuMemUnmap); it is not built: a releasable
// buffer on another backend is refused by name. Tested in tests/unit/backend/test_device_memory.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/ops.h"

namespace mt::backend {

class MemoryLedger {
 public:
  // Bytes added here are also added to `parent` (nullable), e.g. a stage's ledger to its rank's.
  explicit MemoryLedger(MemoryLedger* parent = nullptr) : parent_(parent) {}

  void add(MemoryCategory category, int64_t bytes);
  void remove(MemoryCategory category, int64_t bytes);
  // A held buffer's bytes grow or shrink (pages of a releasable buffer): the live count unchanged.
  void grow(MemoryCategory category, int64_t bytes);
  void shrink(MemoryCategory category, int64_t bytes);

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

// Page-granular memory whose pages return to a pool while it lives (see the header comment).
class ReleasableMemory {
 public:
  // `bytes` of zeros, no page in use; reports its pool's pages to `ledger` (nullable).
  ReleasableMemory(int64_t bytes, MemoryCategory category, MemoryLedger* ledger);
  ~ReleasableMemory();
  ReleasableMemory(const ReleasableMemory&) = delete;
  ReleasableMemory& operator=(const ReleasableMemory&) = delete;

  static int64_t page_bytes();
  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  // What make_resident leaves in [begin, end) on the pages it maps: zeros, or whatever the pool
  // page held (the caller overwrites every byte of the range: a parameter unit's gather). Bytes
  // outside the range on those pages are zeros either way.
  enum class Contents { zeros, overwritten };
  // The pages under bytes [begin, end) in use, from the pool; pages in use already are untouched.
  void make_resident(int64_t begin, int64_t end, Contents contents = Contents::zeros);
  // Bytes [begin, end) become zeros: the whole pages inside go back to the pool, the bytes on
  // pages partly outside the range are zeroed (those pages stay in use).
  void release(int64_t begin, int64_t end);
  int64_t resident_bytes() const { return resident_pages_ * page_bytes(); }  // in use
  int64_t pool_bytes() const { return pool_pages_ * page_bytes(); }           // held: in use and free

 private:
  void check_range(int64_t begin, int64_t end) const;
  // `count` pool pages for the range's pages (the pool grown by what it lacks), as runs.
  void take_pool_pages(int64_t count, std::vector<std::pair<int64_t, int64_t>>& runs);
  void map_run(int64_t page, int64_t pool_page, int64_t count);
  void give_back(int64_t first, int64_t count);  // pool pages free again

  void* data_ = nullptr;
  int64_t bytes_ = 0;
  int64_t mapped_bytes_ = 0;  // whole pages
  MemoryCategory category_;
  MemoryLedger* ledger_;
  int pool_fd_ = -1;
  int64_t pool_pages_ = 0;                  // the pool file's pages
  std::vector<int64_t> pool_page_;          // per page of the range: its pool page, -1 when not in use
  std::map<int64_t, int64_t> free_runs_;    // the pool's free pages: first -> count, coalesced
  int64_t resident_pages_ = 0;
};

// How a DeviceBuffer holds its memory: from the backend's allocator, or releasable page by page.
enum class Residency { whole, releasable };

// Refuses (mt::UsageError) a releasable buffer on a backend other than the CPU's.
void check_releasable_backend(const Ops& ops);

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
  // Residency::releasable: pages handed out and back through releasable() (the CPU backend only).
  DeviceBuffer(const Ops& ops, int64_t count, MemoryCategory category, MemoryLedger* ledger, Residency residency) {
    if (residency == Residency::whole) {
      *this = DeviceBuffer(ops, count, category, ledger);
      return;
    }
    if (count <= 0) return;
    check_releasable_backend(ops);
    pages_ = std::make_unique<ReleasableMemory>(buffer_bytes<T>(count), category, ledger);
    data_ = static_cast<T*>(pages_->data());
    bytes_ = pages_->bytes();
    count_ = count;
    category_ = category;
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
      pages_ = std::move(other.pages_);
    }
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return count_; }
  int64_t bytes() const { return bytes_; }
  bool empty() const { return count_ == 0; }
  // The pages of a releasable buffer; nullptr for a whole one.
  ReleasableMemory* releasable() const { return pages_.get(); }

 private:
  void release() {
    if (!data_) return;
    if (pages_) {
      pages_.reset();
      data_ = nullptr;
      count_ = 0;
      bytes_ = 0;
      return;
    }
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
  std::unique_ptr<ReleasableMemory> pages_;
};

}  // namespace mt::backend
