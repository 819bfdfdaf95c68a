// The scratch files and source paths of tests/fuzz/fuzz_support.h.
// Tested by the fuzz smoke runs and the replay tests of tests/fuzz/CMakeLists.txt.
#include "fuzz_support.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>

namespace mt::fuzz {

namespace {

std::string scratch_directory() {
  const std::filesystem::path shm = "/dev/shm";
  std::error_code error;
  return std::filesystem::is_directory(shm, error) ? shm.string() : std::filesystem::temp_directory_path().string();
}

}  // namespace

std::string write_scratch_file(std::string_view bytes, std::string_view suffix) {
  const std::string path =
      scratch_directory() + "/mt-fuzz-" + std::to_string(::getpid()) + "-input" + std::string(suffix);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) throw std::runtime_error("cannot write the scratch file " + path);
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error("cannot write the scratch file " + path);
    }
    written += static_cast<size_t>(n);
  }
  ::close(fd);
  return path;
}

std::string source_path(std::string_view relative) { return std::string(MT_SOURCE_DIR) + "/" + std::string(relative); }

}  // namespace mt::fuzz
