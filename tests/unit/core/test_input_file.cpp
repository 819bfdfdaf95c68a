// Issue 11 case 17: the one helper that opens user-named input files gives one-line errors that
// say what is wrong ("is a directory", "no such file", "permission denied"), led by the flag when
// the caller names one; pipes are accepted where a caller streams.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "../temp_dir.h"
#include "core/error.h"
#include "core/input_file.h"

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const mt::Error& e) {
    EXPECT_EQ(e.code(), mt::ExitCode::runtime_failure) << e.what();
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(Issue11Case17, InputFileErrorsSayWhatIsWrong) {
  mt::testing::TempDir dir("mt_input_file");
  const std::string folder = dir.file("folder"), missing = dir.file("missing.json"), file = dir.file("data.txt");
  std::filesystem::create_directories(folder);
  std::ofstream(file) << "hello";

  EXPECT_EQ(error_of([&] { mt::read_input_file(folder, "--vocab-file"); }),
            "--vocab-file " + folder + ": is a directory, expected a file");
  EXPECT_EQ(error_of([&] { mt::open_input_file(folder); }), folder + ": is a directory, expected a file");
  EXPECT_EQ(error_of([&] { mt::check_input_file(folder, "--input"); }),
            "--input " + folder + ": is a directory, expected a file");
  EXPECT_EQ(error_of([&] { ::close(mt::open_input_fd(folder)); }), folder + ": is a directory, expected a file");
  EXPECT_EQ(error_of([&] { mt::read_input_file(missing, "--merge-file"); }), "--merge-file " + missing + ": no such file");
  EXPECT_EQ(error_of([&] { mt::read_input_file(file + "/below"); }),
            file + "/below: no such file (a part of the path is not a directory)");
  EXPECT_EQ(error_of([&] { mt::read_input_file("", "--input"); }), "--input: an empty path names no file");
  if (geteuid() != 0) {  // root reads everything
    const std::string locked = dir.file("locked.txt");
    std::ofstream(locked) << "x";
    ::chmod(locked.c_str(), 0);
    EXPECT_EQ(error_of([&] { mt::read_input_file(locked); }), locked + ": permission denied");
  }

  EXPECT_EQ(mt::read_input_file(file), "hello");
  std::FILE* stream = mt::open_input_file(file);
  char buffer[8] = {};
  EXPECT_EQ(std::fread(buffer, 1, sizeof buffer, stream), 5u);
  std::fclose(stream);

  EXPECT_EQ(mt::path_kind(folder), mt::PathKind::directory);
  EXPECT_EQ(mt::path_kind(file), mt::PathKind::file);
  EXPECT_EQ(mt::path_kind(missing), mt::PathKind::missing);
  EXPECT_EQ(mt::path_kind("/dev/null"), mt::PathKind::other);

  // A pipe (as `<(...)` or /dev/stdin gives) is read like a file.
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_EQ(::write(fds[1], "piped", 5), 5);
  ::close(fds[1]);
  EXPECT_EQ(mt::read_input_file("/proc/self/fd/" + std::to_string(fds[0])), "piped");
  ::close(fds[0]);
}
