// Opening user-named input files with one-line errors (see input_file.h).
// Tested in tests/unit/core/test_input_file.cpp.
#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace mt {
namespace {

std::string what_of(const std::string& path, const std::string& flag) { return flag.empty() ? path : flag + " " + path; }

std::string reason(int error) {
  switch (error) {
    case ENOENT: return "no such file";
    case ENOTDIR: return "no such file (a part of the path is not a directory)";
    case EISDIR: return "is a directory, expected a file";
    case EACCES: return "permission denied";
    default: return std::strerror(error);
  }
}

[[noreturn]] void fail(const std::string& path, const std::string& flag, int error) {
  throw Error(what_of(path, flag), reason(error));
}

// The checks shared by every opener, on an open descriptor (so nothing changes in between).
void check_descriptor(int fd, const std::string& path, const std::string& flag) {
  struct stat status {};
  if (fstat(fd, &status) != 0) {
    const int error = errno;
    ::close(fd);
    fail(path, flag, error);
  }
  if (S_ISDIR(status.st_mode)) {
    ::close(fd);
    fail(path, flag, EISDIR);
  }
}

}  // namespace

PathKind path_kind(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return PathKind::missing;
  if (S_ISREG(status.st_mode)) return PathKind::file;
  if (S_ISDIR(status.st_mode)) return PathKind::directory;
  return PathKind::other;
}

// Without opening: opening a named pipe would wait for its writer, and closing it would end it.
void check_input_file(const std::string& path, const std::string& flag) {
  if (path.empty()) throw Error(flag.empty() ? "input" : flag, "an empty path names no file");
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) fail(path, flag, errno);
  if (S_ISDIR(status.st_mode)) fail(path, flag, EISDIR);
  if (::access(path.c_str(), R_OK) != 0) fail(path, flag, errno);
}

int open_input_fd(const std::string& path, const std::string& flag) {
  if (path.empty()) throw Error(flag.empty() ? "input" : flag, "an empty path names no file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, flag, errno);
  check_descriptor(fd, path, flag);
  return fd;
}

std::FILE* open_input_file(const std::string& path, const std::string& flag) {
  const int fd = open_input_fd(path, flag);
  std::FILE* file = ::fdopen(fd, "rb");
  if (file == nullptr) {
    const int error = errno;
    ::close(fd);
    fail(path, flag, error);
  }
  return file;
}

std::string read_input_file(const std::string& path, const std::string& flag) {
  const int fd = open_input_fd(path, flag);
  std::string bytes;
  struct stat status {};
  if (fstat(fd, &status) == 0 && S_ISREG(status.st_mode)) bytes.reserve(static_cast<size_t>(status.st_size));
  char buffer[1 << 16];
  while (true) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      ::close(fd);
      throw Error(what_of(path, flag), std::string("read failed: ") + std::strerror(error));
    }
    bytes.append(buffer, static_cast<size_t>(got));
  }
  ::close(fd);
  return bytes;
}

}  // namespace mt
