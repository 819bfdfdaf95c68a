// Records waiting their turn, in memory then in an unlinked spool file (see record_queue.h).
// Tested in tests/unit/text/test_preprocess.cpp.
#include "text/record_queue.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/positional_io.h"

namespace mt::text {

RecordQueue::RecordQueue(std::string output_prefix, size_t& budget)
    : output_prefix_(std::move(output_prefix)), budget_(budget) {}

RecordQueue::~RecordQueue() {
  if (fd_ >= 0) ::close(fd_);
}

void RecordQueue::push(int64_t tag, std::string record) {
  if (in_file_.empty() && record.size() <= budget_) {
    budget_ -= record.size();
    memory_.emplace_back(tag, std::move(record));
    return;
  }
  if (fd_ < 0) open_file();
  if (const std::string why = pwrite_all(fd_, record.data(), record.size(), write_offset_); !why.empty()) {
    throw Error(path_, "spool file: write failed: " + why);
  }
  write_offset_ += static_cast<off_t>(record.size());
  in_file_.emplace_back(tag, record.size());
}

std::string RecordQueue::pop() {
  std::string record;
  if (!memory_.empty()) {
    record = std::move(memory_.front().second);
    budget_ += record.size();
    memory_.pop_front();
    return record;
  }
  record.resize(in_file_.front().second);
  if (const std::string why = pread_all(fd_, record.data(), record.size(), read_offset_); !why.empty()) {
    throw Error(path_, "spool file: read failed: " + why);
  }
  read_offset_ += static_cast<off_t>(record.size());
  in_file_.pop_front();
  if (in_file_.empty()) {  // give the disk back
    read_offset_ = write_offset_ = 0;
    if (::ftruncate(fd_, 0) != 0) throw Error(path_, std::string("spool file: truncate failed: ") + std::strerror(errno));
  }
  return record;
}

void RecordQueue::open_file() {
  path_ = output_prefix_ + ".spool-XXXXXX";
  fd_ = ::mkstemp(path_.data());
  if (fd_ < 0) {
    throw Error(path_, std::string("cannot create a spool file for partition tokens beside --output-prefix: ") +
                           std::strerror(errno));
  }
  ::unlink(path_.c_str());
}

}  // namespace mt::text
