// Whole-buffer positional reads and writes: pread(2) and pwrite(2) repeated after a short count or
// an interrupted call until every byte has moved, as the token spool writer and the partition
// record queue need. Each returns "" on success, else why it failed (the system's text, or "end
// of file" for a read that ran out of file first), for the caller's one-line mt::Error.
// Tested in tests/unit/core/test_positional_io.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mt {

// Writes `bytes` bytes of `data` to `fd` at file offset `offset`.
std::string pwrite_all(int fd, const void* data, size_t bytes, int64_t offset);

// Reads `bytes` bytes of `fd` at file offset `offset` into `data`.
std::string pread_all(int fd, void* data, size_t bytes, int64_t offset);

}  // namespace mt
