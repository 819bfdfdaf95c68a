// Files written under a temporary name beside their final path and renamed into place when
// complete, so no reader ever sees a half-written file under the final name. The one helper of
// every writer in lib (token datasets, sample indices, checkpoints, BPE vocabularies):
// - the name is `<final>.tmp-<host>-<pid>-<random>`, so a temporary says who left it;
// - creating one first removes the temporaries of the same final path left by processes of this
//   host that are gone (a killed run), with a warning on stderr; those of live processes and of
//   other hosts (a shared file system) are left alone;
// - live temporaries are registered, so a tool's signal handler can remove them
//   (remove_live_temporaries is async-signal-safe) before the process dies.
// Tested in tests/unit/core/test_temporary_file.cpp and tests/tools/bad-input.bats (issue 11 case 4).
#pragma once

#include <string>
#include <vector>

namespace mt {

class TemporaryFile {
 public:
  // Picks the temporary name for `final_path` and registers it; the file itself is created by
  // the writer (any API: stdio, HDF5, ...). Removes stale temporaries of `final_path` first.
  explicit TemporaryFile(std::string final_path);
  // Removes the temporary unless it was committed.
  ~TemporaryFile();
  TemporaryFile(TemporaryFile&& other) noexcept;
  TemporaryFile& operator=(TemporaryFile&& other) noexcept;
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& final_path() const { return final_path_; }
  // Flushes the written temporary to disk, renames it onto the final path and syncs the
  // directory. Throws mt::Error naming the final path.
  void commit();
  // Removes the temporary now (nothing when it does not exist).
  void discard() noexcept;

 private:
  std::string final_path_;
  std::string path_;
  int slot_ = -1;  // in the registry of live temporaries; -1 when not registered
  bool done_ = false;
};

// Unlinks every live temporary of this process. Async-signal-safe: for signal handlers.
void remove_live_temporaries() noexcept;

// Removes the temporaries of `final_path` left by processes of this host that no longer run, each
// reported on stderr; returns their paths.
std::vector<std::string> remove_stale_temporaries(const std::string& final_path);

// Checks, before any work, that `final_path` can be written: creates and removes a temporary
// beside it. Throws mt::Error("<what> <final_path>", "cannot write ...: <reason>").
void check_writable(const std::string& what, const std::string& final_path);

}  // namespace mt
