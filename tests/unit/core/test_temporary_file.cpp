// Temporary files (core/temporary_file.h): the name says host, pid and a random part; commit
// renames into place and discard (or destruction) removes; a signal handler's sweep removes live
// ones; stale ones of dead processes of this host are removed, those of live processes and other
// hosts kept (issue 11 case 4); check_writable refuses what cannot be written (case 1).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <string>
#include <sys/wait.h>

#include "../temp_dir.h"
#include "core/error.h"
#include "core/temporary_file.h"

using namespace mt;

namespace {

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string host() {
  char buffer[256] = {};
  gethostname(buffer, sizeof buffer - 1);
  return buffer;
}

// The pid of a child that has exited (and been reaped): a process that is gone.
pid_t dead_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

}  // namespace

TEST(TemporaryFile, Issue11Case4NameSaysHostPidAndRandom) {
  mt::testing::TempDir dir;
  TemporaryFile a(dir.file("out.h5")), b(dir.file("out.h5"));
  const std::regex pattern(".*/out\\.h5\\.tmp-" + host() + "-" + std::to_string(getpid()) + "-[0-9a-f]{8}");
  EXPECT_TRUE(std::regex_match(a.path(), pattern)) << a.path();
  EXPECT_NE(a.path(), b.path());
  EXPECT_EQ(a.final_path(), dir.file("out.h5"));
}

TEST(TemporaryFile, CommitRenamesIntoPlaceAndDestructionRemoves) {
  mt::testing::TempDir dir;
  {
    TemporaryFile kept(dir.file("kept"));
    write_text(kept.path(), "done");
    kept.commit();
    EXPECT_THROW(kept.commit(), Error);
  }
  EXPECT_EQ(read_text(dir.file("kept")), "done");
  {
    TemporaryFile dropped(dir.file("dropped"));
    write_text(dropped.path(), "half");
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"kept"});
}

TEST(TemporaryFile, Issue11Case4TheSignalSweepRemovesLiveTemporaries) {
  mt::testing::TempDir dir;
  TemporaryFile live(dir.file("live.bin"));
  write_text(live.path(), "partial");
  TemporaryFile committed(dir.file("done.bin"));
  write_text(committed.path(), "whole");
  committed.commit();
  remove_live_temporaries();
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"done.bin"});
}

TEST(TemporaryFile, Issue11Case4StaleTemporariesOfDeadProcessesOfThisHostAreRemoved) {
  mt::testing::TempDir dir;
  const std::string final_path = dir.file("corpus.bin");
  const std::string dead = final_path + ".tmp-" + host() + "-" + std::to_string(dead_pid()) + "-0123abcd";
  const std::string alive = final_path + ".tmp-" + host() + "-" + std::to_string(getppid()) + "-0123abcd";
  const std::string other_host = final_path + ".tmp-elsewhere-" + std::to_string(dead_pid()) + "-0123abcd";
  const std::string other_file = dir.file("other.bin.tmp-" + host() + "-" + std::to_string(dead_pid()) + "-0123abcd");
  const std::string old_style = final_path + ".tmp-" + std::to_string(dead_pid());
  for (const auto& path : {dead, alive, other_host, other_file, old_style}) write_text(path, "x");
  EXPECT_EQ(remove_stale_temporaries(final_path), std::vector<std::string>{dead});
  EXPECT_FALSE(std::filesystem::exists(dead));
  for (const auto& path : {alive, other_host, other_file, old_style}) {
    EXPECT_TRUE(std::filesystem::exists(path)) << path;
  }
  // A new temporary for the same final path sweeps the same way.
  write_text(dead, "x");
  TemporaryFile next(final_path);
  EXPECT_FALSE(std::filesystem::exists(dead));
}

TEST(TemporaryFile, Issue11Case1CheckWritableNamesWhatCannotBeWritten) {
  mt::testing::TempDir dir;
  EXPECT_NO_THROW(check_writable("--save-final", dir.file("final.h5")));
  EXPECT_TRUE(dir.entries().empty());  // the probe leaves nothing behind
  try {
    check_writable("--save-final", dir.file("missing/final.h5"));
    FAIL() << "a missing directory was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--save-final " + dir.file("missing/final.h5") + ": cannot write: directory " +
                                         dir.file("missing") + " does not exist");
  }
  write_text(dir.file("plain"), "x");
  EXPECT_THROW(check_writable("--save-final", dir.file("plain/final.h5")), Error);
  std::filesystem::create_directory(dir.file("taken"));
  EXPECT_THROW(check_writable("--save-final", dir.file("taken")), Error);
}
