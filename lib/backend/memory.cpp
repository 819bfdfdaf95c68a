// Memory ledgers (see memory.h).
#include "backend/memory.h"

#include <algorithm>

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

}  // namespace mt::backend
