// The save directory (train/checkpointing.h, issue 28 L3): its lock names the run that holds it,
// refuses a second run while that run lives (or when it is on another host, or unreadable), is
// taken over when its process on this host is gone, and is removed by its holder only; a tracker
// never moves backwards.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "../error_text.h"
#include "../temp_dir.h"
#include "io/checkpoint.h"
#include "train/checkpointing.h"

using namespace mt;

namespace {

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string this_host() {
  char buffer[256] = {};
  gethostname(buffer, sizeof buffer - 1);
  return buffer;
}

// A pid that no process has any more: a child that exited and was reaped.
pid_t gone_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

}  // namespace

TEST(SaveDirectory, L3ALiveRunsLockRefusesASecondRunNamingIt) {
  mt::testing::TempDir dir("mt_test_save_lock");
  const std::string save = dir.file("ck");
  {
    const train::SaveDirectoryLock lock(save);
    const std::string held = text_of(train::save_lock_path(save));
    EXPECT_NE(held.find("host=" + this_host() + " pid=" + std::to_string(getpid()) + " process_start="), std::string::npos)
        << held;
    const std::string error = mt::testing::error_text([&] { train::SaveDirectoryLock second(save); });
    EXPECT_NE(error.find(save + ": is in use by another run (host " + this_host() + ", pid " + std::to_string(getpid())),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("lock " + train::save_lock_path(save)), std::string::npos) << error;
    EXPECT_EQ(text_of(train::save_lock_path(save)), held) << "the refused run must leave the holder's lock";
  }
  EXPECT_FALSE(std::filesystem::exists(train::save_lock_path(save))) << "the holder removes its lock";
}

TEST(SaveDirectory, L3AStaleLockOfThisHostIsTakenOverAndOthersAreRefused) {
  mt::testing::TempDir dir("mt_test_save_lock");
  const std::string save = dir.file("ck");
  std::filesystem::create_directories(save);
  const std::string lock_path = train::save_lock_path(save);
  std::ofstream(lock_path) << "host=" << this_host() << " pid=" << gone_pid() << " process_start=1 started=2026-01-01T00:00:00Z\n";
  {
    const train::SaveDirectoryLock lock(save);
    EXPECT_NE(text_of(lock_path).find("pid=" + std::to_string(getpid())), std::string::npos) << "taken over";
  }
  std::ofstream(lock_path) << "host=another-host pid=" << gone_pid() << " process_start=1 started=2026-01-01T00:00:00Z\n";
  EXPECT_NE(mt::testing::error_text([&] { train::SaveDirectoryLock lock(save); }).find("(host another-host, pid"),
            std::string::npos)
      << "another host's lock cannot be judged from here";
  std::ofstream(lock_path) << "garbage";
  EXPECT_NE(mt::testing::error_text([&] { train::SaveDirectoryLock lock(save); }).find("holds a lock file mt cannot read"),
            std::string::npos);
  EXPECT_EQ(text_of(lock_path), "garbage") << "a refused run removes no one's lock";
}

TEST(SaveDirectory, L3ATrackerNeverMovesBackwards) {
  mt::testing::TempDir dir("mt_test_save_lock");
  const std::string save = dir.path().string();
  EXPECT_EQ(mt::testing::error_text([&] { train::check_tracker_moves_forward(save, 0); }), "") << "no tracker yet";
  io::write_tracker(save, 20);
  const std::string error = mt::testing::error_text([&] { train::check_tracker_moves_forward(save, 10); });
  EXPECT_NE(error.find("its tracker names iteration 20, later than this save's 10; a tracker never moves backwards"),
            std::string::npos)
      << error;
  EXPECT_EQ(mt::testing::error_text([&] { train::check_tracker_moves_forward(save, 20); }), "");
  EXPECT_EQ(mt::testing::error_text([&] { train::check_tracker_moves_forward(save, 30); }), "");
}
