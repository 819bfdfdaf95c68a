// TensorBoard event files (io/tensorboard_events.h): CRC-32C against its published check value,
// TFRecord framing and the Event protocol buffer byte for byte, the write queue (nothing on disk
// until it is full or flushed), a truncated last record skipped and a damaged one refused, and
// file names that sort in run order. The independent reader is tests/tools/tensorboard_reader.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../temp_dir.h"
#include "core/error.h"
#include "io/tensorboard_events.h"

using namespace mt;

namespace {

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

std::string only_event_file(const std::string& directory) {
  const std::vector<std::string> files = io::event_files(directory);
  EXPECT_EQ(files.size(), 1u);
  return files.empty() ? "" : files[0];
}

}  // namespace

TEST(TensorBoardEvents, Crc32cMatchesTheCheckValueAndTheMask) {
  EXPECT_EQ(io::crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value (RFC 3720 B.4 family)
  EXPECT_EQ(io::crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  const uint32_t crc = io::crc32c("abc");
  EXPECT_EQ(io::masked_crc32c("abc"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(TensorBoardEvents, ScalarEventIsTheProtocolBufferByteForByte) {
  // Event{wall_time: 0 (1, fixed64), step: 3 (2, varint), summary (5): Summary{value (1):
  // Value{tag: "a" (1), simple_value: 1.0f (2, fixed32)}}}.
  const std::string expected = bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0x03, 0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01,
                                      'a', 0x15, 0x00, 0x00, 0x80, 0x3f});
  EXPECT_EQ(io::encode_scalar_event(0.0, 3, "a", 1.0f), expected);
  // session_log (7): SessionLog{status: START} at step 300 (varint 0xac 0x02).
  EXPECT_EQ(io::encode_session_start_event(0.0, 300),
            bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0xac, 0x02, 0x3a, 0x02, 0x08, 0x01}));
  const io::Event version = io::decode_event(io::encode_file_version_event(1.5), "test");
  EXPECT_EQ(version.kind, io::Event::Kind::file_version);
  EXPECT_EQ(version.file_version, "brain.Event:2");
  EXPECT_EQ(version.wall_time, 1.5);
}

TEST(TensorBoardEvents, FrameIsLengthCrcPayloadCrc) {
  const std::string frame = io::tfrecord_frame("xyz");
  ASSERT_EQ(frame.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(frame.substr(0, 8), bytes({3, 0, 0, 0, 0, 0, 0, 0}));
  const uint32_t length_crc = io::masked_crc32c(frame.substr(0, 8));
  EXPECT_EQ(frame.substr(8, 4), std::string(reinterpret_cast<const char*>(&length_crc), 4));
  EXPECT_EQ(frame.substr(12, 3), "xyz");
  const uint32_t data_crc = io::masked_crc32c("xyz");
  EXPECT_EQ(frame.substr(15, 4), std::string(reinterpret_cast<const char*>(&data_crc), 4));
}

TEST(TensorBoardEvents, QueuedEventsReachTheFileWhenTheQueueIsFullOrFlushed) {
  mt::testing::TempDir dir;
  io::EventFileWriter writer(dir.file("tb"), 3);
  const std::string path = only_event_file(dir.file("tb"));
  EXPECT_EQ(io::read_event_file(path).size(), 1u);  // the file version, written at once
  for (int step = 1; step <= 3; ++step) writer.add_scalar("lm loss", step * 0.5, step, 10.0 + step);
  EXPECT_EQ(io::read_event_file(path).size(), 1u);
  writer.add_scalar("lm loss", 2.0, 4, 14.0);  // the queue was full: the first three are written
  EXPECT_EQ(io::read_event_file(path).size(), 4u);
  writer.add_session_start(5, 15.0);
  writer.flush();
  const std::vector<io::Event> events = io::read_event_file(path);
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[1].kind, io::Event::Kind::scalar);
  EXPECT_EQ(events[1].tag, "lm loss");
  EXPECT_EQ(events[1].step, 1);
  EXPECT_EQ(events[1].value, 0.5f);
  EXPECT_EQ(events[1].wall_time, 11.0);
  EXPECT_EQ(events[5].kind, io::Event::Kind::session_start);
  EXPECT_EQ(events[5].step, 5);
}

TEST(TensorBoardEvents, ATruncatedLastRecordIsSkippedAndADamagedOneRefused) {
  mt::testing::TempDir dir;
  std::string path;
  {
    io::EventFileWriter writer(dir.file("tb"), 10);
    writer.add_scalar("grad-norm", 1.25, 1, 1.0);
    writer.add_scalar("grad-norm", 2.5, 2, 2.0);
    path = writer.path();
  }
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 3);  // killed inside the last record's write
  const std::vector<io::Event> events = io::read_event_file(path);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].value, 1.25f);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(size - 40));
    file.put('\x7f');
  }
  EXPECT_THROW(io::read_event_file(path), Error);
}

TEST(TensorBoardEvents, ALaterWriterInTheDirectorySortsAfterTheEarlierOnes) {
  mt::testing::TempDir dir;
  std::string first, second;
  {
    io::EventFileWriter a(dir.file("tb"), 1);
    first = a.path();
  }
  {
    io::EventFileWriter b(dir.file("tb"), 1);  // within the same second: the name's seconds are bumped
    second = b.path();
  }
  const std::vector<std::string> files = io::event_files(dir.file("tb"));
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], first);
  EXPECT_EQ(files[1], second);
  EXPECT_NE(std::filesystem::path(first).filename().string().find("events.out.tfevents."), std::string::npos);
}

TEST(TensorBoardEvents, AQueueSizeBelowOneIsRefusedByFlag) {
  mt::testing::TempDir dir;
  try {
    io::EventFileWriter writer(dir.file("tb"), 0);
    FAIL() << "accepted a queue of 0";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--tensorboard-queue-size"), std::string::npos) << e.what();
  }
}
