// Whole-buffer pread/pwrite (see positional_io.h).
#include "core/positional_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace mt {
namespace {

// Calls move(p, bytes, offset), pread or pwrite, until every byte has moved; `stalled` is the
// reason when a call moves none.
template <class Byte, class Move>
std::string move_all(Move move, Byte* p, size_t bytes, int64_t offset, const char* stalled) {
  while (bytes > 0) {
    const ssize_t moved = move(p, bytes, static_cast<off_t>(offset));
    if (moved < 0 && errno == EINTR) continue;
    if (moved < 0) return std::strerror(errno);
    if (moved == 0) return stalled;
    p += moved;
    offset += moved;
    bytes -= static_cast<size_t>(moved);
  }
  return "";
}

}  // namespace

std::string pwrite_all(int fd, const void* data, size_t bytes, int64_t offset) {
  return move_all([fd](const char* p, size_t n, off_t at) { return ::pwrite(fd, p, n, at); },
                  static_cast<const char*>(data), bytes, offset, "no byte written");
}

std::string pread_all(int fd, void* data, size_t bytes, int64_t offset) {
  return move_all([fd](char* p, size_t n, off_t at) { return ::pread(fd, p, n, at); }, static_cast<char*>(data),
                  bytes, offset, "end of file");
}

}  // namespace mt
