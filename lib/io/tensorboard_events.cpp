// TensorBoard event files (see tensorboard_events.h).
#include "io/tensorboard_events.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace mt::io {

namespace {

constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = crc32c_table();

// Protocol buffer wire types.
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, int field, int wire_type) { put_varint(out, static_cast<uint64_t>(field) << 3 | wire_type); }

template <typename T>
void put_little_endian(std::string& out, T value) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // the hosts mt builds for are little-endian
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));
}

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event fields every event carries: wall_time (1, double) and step (2, int64).
std::string event_head(double wall_time, int64_t step) {
  std::string event;
  put_key(event, 1, kFixed64);
  put_little_endian(event, wall_time);
  put_key(event, 2, kVarint);
  put_varint(event, static_cast<uint64_t>(step));
  return event;
}

// A cursor over one protocol buffer message.
class WireReader {
 public:
  WireReader(std::string_view bytes, const std::string& where) : bytes_(bytes), where_(where) {}
  bool done() const { return pos_ == bytes_.size(); }
  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const auto byte = static_cast<unsigned char>(take(1)[0]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return value;
    }
    throw Error(where_, "malformed event: a varint longer than 10 bytes");
  }
  std::string_view take(size_t count) {
    if (count > bytes_.size() - pos_) throw Error(where_, "malformed event: a field runs past its message");
    const std::string_view part = bytes_.substr(pos_, count);
    pos_ += count;
    return part;
  }
  template <typename T>
  T little_endian() {
    T value;
    std::memcpy(&value, take(sizeof(T)).data(), sizeof(T));
    return value;
  }
  void skip(int wire_type) {
    switch (wire_type) {
      case kVarint: varint(); return;
      case kFixed64: take(8); return;
      case kLengthDelimited: take(varint()); return;
      case kFixed32: take(4); return;
      default: throw Error(where_, "malformed event: wire type " + std::to_string(wire_type));
    }
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
  const std::string& where_;
};

// Summary.Value: tag (1) and simple_value (2); the event is a scalar once it has a simple value.
void decode_summary_value(std::string_view bytes, Event& event, const std::string& where) {
  WireReader r(bytes, where);
  while (!r.done()) {
    const uint64_t key = r.varint();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1 && wire == kLengthDelimited) {
      event.tag = std::string(r.take(r.varint()));
    } else if (field == 2 && wire == kFixed32) {
      event.value = r.little_endian<float>();
      event.kind = Event::Kind::scalar;
    } else {
      r.skip(wire);
    }
  }
}

void decode_summary(std::string_view bytes, Event& event, const std::string& where) {
  WireReader r(bytes, where);
  while (!r.done()) {
    const uint64_t key = r.varint();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1 && wire == kLengthDelimited) {
      decode_summary_value(r.take(r.varint()), event, where);
    } else {
      r.skip(wire);
    }
  }
}

void decode_session_log(std::string_view bytes, Event& event, const std::string& where) {
  WireReader r(bytes, where);
  while (!r.done()) {
    const uint64_t key = r.varint();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1 && wire == kVarint) {
      if (r.varint() == 1) event.kind = Event::Kind::session_start;
    } else {
      r.skip(wire);
    }
  }
}

uint64_t read_u64(const char* bytes) {
  uint64_t value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

uint32_t read_u32(const char* bytes) {
  uint32_t value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

// The seconds in an event file's name (events.out.tfevents.<seconds>.<...>), 0 if none.
int64_t name_seconds(const std::string& name) {
  const std::string prefix = "events.out.tfevents.";
  if (name.rfind(prefix, 0) != 0) return 0;
  const size_t end = name.find('.', prefix.size());
  const std::string digits = name.substr(prefix.size(), end - prefix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return 0;
  return std::stoll(digits);
}

std::string host_name() {
  char name[256] = "localhost";
  gethostname(name, sizeof name - 1);
  name[sizeof name - 1] = '\0';
  return name;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : bytes) crc = (crc >> 8) ^ kCrc32cTable[(crc ^ static_cast<unsigned char>(c)) & 0xFF];
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(std::string_view payload) {
  std::string length;
  put_little_endian(length, static_cast<uint64_t>(payload.size()));
  std::string record = length;
  put_little_endian(record, masked_crc32c(length));
  record.append(payload);
  put_little_endian(record, masked_crc32c(payload));
  return record;
}

std::string encode_file_version_event(double wall_time) {
  std::string event = event_head(wall_time, 0);
  put_bytes(event, 3, "brain.Event:2");
  return event;
}

std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_key(summary_value, 2, kFixed32);
  put_little_endian(summary_value, value);
  std::string summary;
  put_bytes(summary, 1, summary_value);
  std::string event = event_head(wall_time, step);
  put_bytes(event, 5, summary);
  return event;
}

std::string encode_session_start_event(double wall_time, int64_t step) {
  std::string session_log;
  put_key(session_log, 1, kVarint);
  put_varint(session_log, 1);  // SessionLog.START
  std::string event = event_head(wall_time, step);
  put_bytes(event, 7, session_log);
  return event;
}

Event decode_event(std::string_view payload, const std::string& where) {
  Event event;
  WireReader r(payload, where);
  while (!r.done()) {
    const uint64_t key = r.varint();
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (field == 1 && wire == kFixed64) {
      event.wall_time = r.little_endian<double>();
    } else if (field == 2 && wire == kVarint) {
      event.step = static_cast<int64_t>(r.varint());
    } else if (field == 3 && wire == kLengthDelimited) {
      event.file_version = std::string(r.take(r.varint()));
      event.kind = Event::Kind::file_version;
    } else if (field == 5 && wire == kLengthDelimited) {
      decode_summary(r.take(r.varint()), event, where);
    } else if (field == 7 && wire == kLengthDelimited) {
      decode_session_log(r.take(r.varint()), event, where);
    } else {
      r.skip(wire);
    }
  }
  return event;
}

std::vector<Event> read_event_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) throw Error(path, std::string("cannot open: ") + std::strerror(errno));
  std::string bytes;
  char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) bytes.append(buffer, n);
  std::fclose(file);
  std::vector<Event> events;
  size_t offset = 0;
  while (bytes.size() - offset >= 12) {
    const std::string_view head(bytes.data() + offset, 8);
    const uint64_t length = read_u64(head.data());
    const std::string where = path + " record at byte " + std::to_string(offset);
    if (read_u32(bytes.data() + offset + 8) != masked_crc32c(head)) throw Error(where, "length CRC mismatch");
    if (bytes.size() - offset - 12 < length + 4) break;  // truncated: the writer stopped inside it
    const std::string_view payload(bytes.data() + offset + 12, length);
    if (read_u32(bytes.data() + offset + 12 + length) != masked_crc32c(payload)) throw Error(where, "data CRC mismatch");
    events.push_back(decode_event(payload, where));
    offset += 12 + length + 4;
  }
  return events;
}

std::vector<std::string> event_files(const std::string& directory) {
  std::vector<std::string> files;
  if (!std::filesystem::is_directory(directory)) return files;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (entry.is_regular_file() && entry.path().filename().string().find("tfevents") != std::string::npos) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventFileWriter::EventFileWriter(const std::string& directory, int queue_size) : queue_size_(queue_size) {
  if (queue_size < 1) throw UsageError("--tensorboard-queue-size", "must be at least 1, not " + std::to_string(queue_size));
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) throw Error(directory, "cannot create the TensorBoard directory: " + error.message());
  const double now = wall_time_now();
  int64_t seconds = static_cast<int64_t>(now);
  for (const std::string& file : event_files(directory)) {
    seconds = std::max(seconds, name_seconds(std::filesystem::path(file).filename().string()) + 1);
  }
  char digits[32];
  std::snprintf(digits, sizeof digits, "%010lld", static_cast<long long>(seconds));
  path_ = (std::filesystem::path(directory) / ("events.out.tfevents." + std::string(digits) + "." + host_name() + "." +
                                                 std::to_string(getpid()) + ".mt"))
              .string();
  file_ = std::fopen(path_.c_str(), "wbx");
  if (!file_) throw Error(path_, std::string("cannot create the event file: ") + std::strerror(errno));
  enqueue(encode_file_version_event(now));
  flush();
}

EventFileWriter::~EventFileWriter() {
  try {
    flush();
  } catch (const Error&) {
    // a destructor must not throw; the last flush's failure was the disk's
  }
  std::fclose(file_);
}

void EventFileWriter::add_scalar(std::string_view tag, double value, int64_t step, double wall_time) {
  enqueue(encode_scalar_event(wall_time, step, tag, static_cast<float>(value)));
}

void EventFileWriter::add_session_start(int64_t step, double wall_time) {
  enqueue(encode_session_start_event(wall_time, step));
}

void EventFileWriter::add_event(const Event& event) {
  if (event.kind == Event::Kind::scalar) {
    enqueue(encode_scalar_event(event.wall_time, event.step, event.tag, event.value));
  } else if (event.kind == Event::Kind::session_start) {
    add_session_start(event.step, event.wall_time);
  }
}

void EventFileWriter::enqueue(const std::string& payload) {
  if (queued_ >= queue_size_) flush();
  queue_ += tfrecord_frame(payload);
  ++queued_;
}

void EventFileWriter::flush() {
  if (queue_.empty()) return;
  const bool written = std::fwrite(queue_.data(), 1, queue_.size(), file_) == queue_.size() && std::fflush(file_) == 0;
  queue_.clear();
  queued_ = 0;
  if (!written) throw Error(path_, std::string("cannot write the event file: ") + std::strerror(errno));
}

}  // namespace mt::io
