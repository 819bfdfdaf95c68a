// A fresh directory per test under the system's temporary directory, removed with everything in
// it when the test ends. Shared by the unit suites that write files.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

namespace mt::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "mt_test") {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Names directly inside the directory.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) names.push_back(entry.path().filename().string());
    return names;
  }
  // Files and directories at any depth.
  size_t entry_count() const {
    return static_cast<size_t>(std::distance(std::filesystem::recursive_directory_iterator(path_),
                                             std::filesystem::recursive_directory_iterator()));
  }

 private:
  std::filesystem::path path_;
};

}  // namespace mt::testing
