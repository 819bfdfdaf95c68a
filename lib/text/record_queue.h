// A first-in first-out queue of byte records, each tagged with a number (mt-tokenize
// --partitions: on rank 0, the batches of a segment made before its turn, whole or their index
// only). Records are kept in
// memory while a budget (shared by several queues) lasts, then appended to a spool file beside
// an output prefix, unlinked as soon as it is made (nothing is left behind, whatever stops the
// run) and emptied whenever the queue is; once a record is in the file, later ones follow it
// there until the queue is empty, so the order holds. Tested in tests/unit/text/test_preprocess.cpp.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

namespace mt::text {

class RecordQueue {
 public:
  // `budget`: bytes of memory left to the queues sharing it; records taken from memory give theirs back.
  RecordQueue(std::string output_prefix, size_t& budget);
  ~RecordQueue();
  RecordQueue(const RecordQueue&) = delete;
  RecordQueue& operator=(const RecordQueue&) = delete;

  bool empty() const { return memory_.empty() && in_file_.empty(); }
  // The tag of the first record (the queue is not empty).
  int64_t front_tag() const { return memory_.empty() ? in_file_.front().first : memory_.front().first; }
  // Records held in the spool file.
  size_t records_in_file() const { return in_file_.size(); }

  void push(int64_t tag, std::string record);
  // Takes the first record out (the queue is not empty).
  std::string pop();

 private:
  void open_file();

  std::string output_prefix_, path_;
  size_t& budget_;
  std::deque<std::pair<int64_t, std::string>> memory_;
  std::deque<std::pair<int64_t, size_t>> in_file_;  // tag and size of each record in the file
  int fd_ = -1;
  off_t read_offset_ = 0, write_offset_ = 0;
};

}  // namespace mt::text
