// TensorBoard event files, written without TensorFlow or protobuf: each record in TFRecord framing
// (little-endian u64 length, masked CRC-32C of the length, the bytes, masked CRC-32C of the bytes)
// holding one `tensorflow.Event` protocol buffer encoded by hand with its field numbers (wall_time
// 1, step 2, file_version 3, summary 5, session_log 7; Summary.value 1; Value.tag 1,
// simple_value 2; SessionLog.status 1, START = 1). A dozen fields do not justify a protobuf
// dependency and generated code; the test reader (tests/tools/tensorboard_reader.py) decodes the
// files with the real protobuf library. The reader here reads back mt's own files (a resumed run
// copies what a restart would hide, train/tensorboard_log.h).
// Tested in tests/unit/io/test_tensorboard_events.cpp and tests/tools/tensorboard.bats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace mt::io {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) and TFRecord's mask of it: rotated right
// by 15 bits plus 0xa282ead8.
uint32_t crc32c(std::string_view bytes);
uint32_t masked_crc32c(std::string_view bytes);

// One record in TFRecord framing.
std::string tfrecord_frame(std::string_view payload);

// What an event holds, as far as mt writes and reads them.
struct Event {
  enum class Kind { file_version, scalar, session_start, other };
  Kind kind = Kind::other;
  double wall_time = 0;  // seconds since the epoch
  int64_t step = 0;
  std::string tag;        // scalar
  float value = 0;        // scalar: Summary.Value.simple_value
  std::string file_version;
};

// The Event protocol buffer of each kind.
std::string encode_file_version_event(double wall_time);
std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);
std::string encode_session_start_event(double wall_time, int64_t step);

// Decodes one Event protocol buffer (fields mt does not write are skipped; a malformed buffer is
// an mt::Error naming `where`).
Event decode_event(std::string_view payload, const std::string& where);

// The complete records of an event file in order: a truncated last record (a writer killed in the
// middle of it) ends the list; a record whose CRC does not match is an mt::Error naming the file
// and the record's offset.
std::vector<Event> read_event_file(const std::string& path);

// The event files of a directory in the order TensorBoard reads them (by name).
std::vector<std::string> event_files(const std::string& directory);

// Appends events to a new file `events.out.tfevents.<seconds>.<host>.<pid>.mt` in `directory`
// (created if missing). The name's seconds are made later than those of every event file already
// there, so readers, which take files by name, read this run's events after earlier runs'.
// Up to `queue_size` events wait in memory; the next one, flush() and the destructor append them
// with one write, so a kill leaves whole records plus at most one truncated last record.
class EventFileWriter {
 public:
  EventFileWriter(const std::string& directory, int queue_size);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void add_scalar(std::string_view tag, double value, int64_t step, double wall_time);
  void add_session_start(int64_t step, double wall_time);
  void add_event(const Event& event);  // a scalar or a session start, copied as it was
  void flush();
  const std::string& path() const { return path_; }

 private:
  void enqueue(const std::string& payload);

  std::string path_;
  std::FILE* file_ = nullptr;
  int queue_size_;
  int queued_ = 0;
  std::string queue_;  // framed records not yet written
};

// Seconds since the epoch, as the events' wall_time.
double wall_time_now();

}  // namespace mt::io
