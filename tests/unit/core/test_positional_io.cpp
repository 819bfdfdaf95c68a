// core/positional_io.h: whole buffers written and read back at offsets (a hole before them reads
// as zeros), a read past the end of the file, and the system's reasons for a bad descriptor and
// a descriptor without offsets (a pipe).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "../temp_dir.h"
#include "core/positional_io.h"

namespace {

TEST(PositionalIo, WritesAndReadsWholeBuffersAtOffsets) {
  mt::testing::TempDir dir;
  const int fd = ::open(dir.file("f").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  std::vector<char> big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + 1);
  EXPECT_EQ(mt::pwrite_all(fd, big.data(), big.size(), 100), "");
  EXPECT_EQ(mt::pwrite_all(fd, "head", 4, 0), "");
  std::vector<char> back(big.size());
  EXPECT_EQ(mt::pread_all(fd, back.data(), back.size(), 100), "");
  EXPECT_EQ(back, big);
  char start[8] = {};
  EXPECT_EQ(mt::pread_all(fd, start, sizeof(start), 0), "");
  EXPECT_EQ(std::string(start, 8), std::string("head\0\0\0\0", 8));  // the hole reads as zeros
  ::close(fd);
}

TEST(PositionalIo, ReadingPastTheEndSaysSo) {
  mt::testing::TempDir dir;
  const int fd = ::open(dir.file("f").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(mt::pwrite_all(fd, "0123456789", 10, 0), "");
  char buffer[8];
  EXPECT_EQ(mt::pread_all(fd, buffer, 8, 4), "end of file");  // 6 bytes were there
  EXPECT_EQ(mt::pread_all(fd, buffer, 6, 4), "");
  EXPECT_EQ(std::string(buffer, 6), "456789");
  EXPECT_EQ(mt::pread_all(fd, buffer, 0, 50), "");  // nothing to read is no error
  ::close(fd);
}

TEST(PositionalIo, FailuresGiveTheSystemsReason) {
  char buffer[4] = {};
  EXPECT_EQ(mt::pwrite_all(-1, buffer, 4, 0), "Bad file descriptor");
  EXPECT_EQ(mt::pread_all(-1, buffer, 4, 0), "Bad file descriptor");
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  EXPECT_EQ(mt::pwrite_all(pipe_fds[1], buffer, 4, 0), "Illegal seek");
  EXPECT_EQ(mt::pread_all(pipe_fds[0], buffer, 4, 0), "Illegal seek");
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

}  // namespace
