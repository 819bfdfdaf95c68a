// Memory ledgers and releasable memory (see memory.h).
#include "backend/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
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
  pool_fd_ = memfd_create("mt-releasable", MFD_CLOEXEC);
  if (pool_fd_ < 0) {
    munmap(data_, static_cast<size_t>(mapped_bytes_));
    throw Error("releasable memory", "memfd_create failed");
  }
  pool_page_.assign(static_cast<size_t>(mapped_bytes_ / page), -1);
  if (ledger_) ledger_->add(category_, 0);  // one buffer held; its pool grows
}

ReleasableMemory::~ReleasableMemory() {
  if (ledger_) ledger_->remove(category_, pool_bytes());
  munmap(data_, static_cast<size_t>(mapped_bytes_));
  close(pool_fd_);
}

void ReleasableMemory::check_range(int64_t begin, int64_t end) const {
  if (begin < 0 || end > bytes_ || begin > end) {
    throw Error("releasable memory", "byte range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                         ") outside its " + std::to_string(bytes_) + " bytes");
  }
}

void ReleasableMemory::take_pool_pages(int64_t count, std::vector<std::pair<int64_t, int64_t>>& runs) {
  while (count > 0 && !free_runs_.empty()) {
    const auto [first, length] = *free_runs_.begin();
    const int64_t take = std::min(count, length);
    free_runs_.erase(free_runs_.begin());
    if (take < length) free_runs_.emplace(first + take, length - take);
    runs.emplace_back(first, take);
    count -= take;
  }
  if (count == 0) return;
  // The pool's new pages are the file's new zeros.
  if (ftruncate(pool_fd_, static_cast<off_t>((pool_pages_ + count) * page_bytes())) != 0) throw std::bad_alloc();
  runs.emplace_back(pool_pages_, count);
  pool_pages_ += count;
  if (ledger_) ledger_->grow(category_, count * page_bytes());
}

void ReleasableMemory::map_run(int64_t page, int64_t pool_page, int64_t count) {
  const int64_t size = page_bytes();
  void* at = static_cast<char*>(data_) + page * size;
  if (mmap(at, static_cast<size_t>(count * size), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
           pool_fd_, static_cast<off_t>(pool_page * size)) == MAP_FAILED) {
    throw Error("releasable memory", "mapping " + std::to_string(count) + " pool pages failed");
  }
  for (int64_t i = 0; i < count; ++i) pool_page_[static_cast<size_t>(page + i)] = pool_page + i;
}

void ReleasableMemory::make_resident(int64_t begin, int64_t end, Contents contents) {
  check_range(begin, end);
  if (begin == end) return;
  const int64_t page = page_bytes();
  std::vector<int64_t> pages;  // not in use yet, ascending
  for (int64_t p = begin / page; p <= (end - 1) / page; ++p) {
    if (pool_page_[static_cast<size_t>(p)] < 0) pages.push_back(p);
  }
  if (pages.empty()) return;
  std::vector<std::pair<int64_t, int64_t>> runs;  // pool pages: first, count
  take_pool_pages(static_cast<int64_t>(pages.size()), runs);
  char* bytes = static_cast<char*>(data_);
  size_t next = 0;
  for (const auto& [first, count] : runs) {
    // One mapping per stretch where both the range's pages and the pool's are consecutive.
    for (int64_t done = 0; done < count;) {
      int64_t n = 1;
      while (done + n < count && pages[next + static_cast<size_t>(n)] == pages[next] + n) ++n;
      map_run(pages[next], first + done, n);
      // A free pool page holds what its last user left: zeros where asked for, and always
      // outside [begin, end) (a released neighbour's bytes on a page the range shares).
      const int64_t from = pages[next] * page, to = (pages[next] + n) * page;
      if (contents == Contents::zeros) {
        std::memset(bytes + from, 0, static_cast<size_t>(to - from));
      } else {
        if (from < begin) std::memset(bytes + from, 0, static_cast<size_t>(begin - from));
        if (to > end) std::memset(bytes + end, 0, static_cast<size_t>(to - end));
      }
      next += static_cast<size_t>(n);
      done += n;
    }
  }
  resident_pages_ += static_cast<int64_t>(pages.size());
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
  // The whole pages in use back to the pool.
  int64_t released = 0;
  for (int64_t p = first_whole; p < end_whole;) {
    const int64_t pool_first = pool_page_[static_cast<size_t>(p)];
    if (pool_first < 0) {
      ++p;
      continue;
    }
    int64_t n = 1;
    while (p + n < end_whole && pool_page_[static_cast<size_t>(p + n)] == pool_first + n) ++n;
    give_back(pool_first, n);
    for (int64_t i = 0; i < n; ++i) pool_page_[static_cast<size_t>(p + i)] = -1;
    released += n;
    p += n;
  }
  // The range reads as zeros again (anything written there without make_resident goes too).
  if (mmap(bytes + first_whole * page, static_cast<size_t>((end_whole - first_whole) * page), PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
    throw Error("releasable memory", "remapping released pages failed");
  }
  resident_pages_ -= released;
}

void ReleasableMemory::give_back(int64_t first, int64_t count) {
  auto next = free_runs_.lower_bound(first);
  if (next != free_runs_.begin()) {
    const auto previous = std::prev(next);
    if (previous->first + previous->second == first) {
      first = previous->first;
      count += previous->second;
      free_runs_.erase(previous);
    }
  }
  if (next != free_runs_.end() && first + count == next->first) {
    count += next->second;
    free_runs_.erase(next);
  }
  free_runs_.emplace(first, count);
}

}  // namespace mt::backend
