// Memory ledgers and releasable memory (see memory.h).
#include "backend/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "core/error.h"

namespace mt::backend {

void MemoryLedger::add(MemoryCategory category, int64_t bytes) {
  const int i = index(category);
  live_[i] += bytes;
  peak_[i] = std::max(peak_[i], live_[i]);
  live_total_ += bytes;
  peak_total_ = std::max(peak_total_, live_total_);
  ++live_count_;
  if (parent_) parent_->add(category, bytes);
}

void MemoryLedger::remove(MemoryCategory category, int64_t bytes) {
  live_[index(category)] -= bytes;
  live_total_ -= bytes;
  --live_count_;
  if (parent_) parent_->remove(category, bytes);
}

void MemoryLedger::grow(MemoryCategory category, int64_t bytes) {
  const int i = index(category);
  live_[i] += bytes;
  peak_[i] = std::max(peak_[i], live_[i]);
  live_total_ += bytes;
  peak_total_ = std::max(peak_total_, live_total_);
  if (parent_) parent_->grow(category, bytes);
}

void MemoryLedger::shrink(MemoryCategory category, int64_t bytes) {
  live_[index(category)] -= bytes;
  live_total_ -= bytes;
  if (parent_) parent_->shrink(category, bytes);
}

void check_releasable_backend(const Ops& ops) {
  if (ops.device != Device::cpu) {
    throw UsageError(std::string("releasable memory on the ") + ops.name + " backend",
                     "not supported (pages go back to the OS on the CPU backend only; CUDA would need "
                     "cuMemMap/cuMemUnmap)");
  }
}

int64_t ReleasableMemory::page_bytes() {
  static const int64_t page = static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

ReleasableMemory::ReleasableMemory(int64_t bytes, MemoryCategory category, MemoryLedger* ledger)
    : bytes_(bytes), category_(category), ledger_(ledger) {
  if (bytes <= 0) throw Error("releasable memory", "needs a positive size, got " + std::to_string(bytes));
  const int64_t page = page_bytes();
  mapped_bytes_ = (bytes + page - 1) / page * page;
  void* mapped = mmap(nullptr, static_cast<size_t>(mapped_bytes_), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) throw std::bad_alloc();
  data_ = mapped;
  resident_.assign(static_cast<size_t>(mapped_bytes_ / page), false);
  if (ledger_) ledger_->add(category_, 0);  // one buffer held; its pages come and go
}

ReleasableMemory::~ReleasableMemory() {
  if (ledger_) ledger_->remove(category_, resident_bytes());
  munmap(data_, static_cast<size_t>(mapped_bytes_));
}

void ReleasableMemory::check_range(int64_t begin, int64_t end) const {
  if (begin < 0 || end > bytes_ || begin > end) {
    throw Error("releasable memory", "byte range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                         ") outside its " + std::to_string(bytes_) + " bytes");
  }
}

void ReleasableMemory::make_resident(int64_t begin, int64_t end) {
  check_range(begin, end);
  if (begin == end) return;
  const int64_t page = page_bytes();
  int64_t added = 0;
  for (int64_t p = begin / page; p <= (end - 1) / page; ++p) {
    if (resident_[static_cast<size_t>(p)]) continue;
    resident_[static_cast<size_t>(p)] = true;
    ++added;
  }
  resident_pages_ += added;
  if (ledger_ && added > 0) ledger_->grow(category_, added * page);
}

void ReleasableMemory::release(int64_t begin, int64_t end) {
  check_range(begin, end);
  if (begin == end) return;
  const int64_t page = page_bytes();
  char* bytes = static_cast<char*>(data_);
  const int64_t first_whole = (begin + page - 1) / page;  // pages wholly inside [begin, end)
  const int64_t end_whole = end == bytes_ ? mapped_bytes_ / page : end / page;
  if (first_whole >= end_whole) {
    std::memset(bytes + begin, 0, static_cast<size_t>(end - begin));
    return;
  }
  std::memset(bytes + begin, 0, static_cast<size_t>(first_whole * page - begin));
  const int64_t tail = end_whole * page;  // the range's bytes on a last page it shares
  if (tail < end) std::memset(bytes + tail, 0, static_cast<size_t>(end - tail));
  if (madvise(bytes + first_whole * page, static_cast<size_t>((end_whole - first_whole) * page), MADV_DONTNEED) != 0) {
    throw Error("releasable memory", "madvise(MADV_DONTNEED) failed");
  }
  int64_t released = 0;
  for (int64_t p = first_whole; p < end_whole; ++p) {
    if (!resident_[static_cast<size_t>(p)]) continue;
    resident_[static_cast<size_t>(p)] = false;
    ++released;
  }
  resident_pages_ -= released;
  if (ledger_ && released > 0) ledger_->shrink(category_, released * page);
}

}  // namespace mt::backend
