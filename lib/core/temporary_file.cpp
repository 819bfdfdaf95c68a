// Temporary files renamed into place (see temporary_file.h).
#include "core/temporary_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/log.h"

namespace mt {
namespace {

// The registry of live temporaries: fixed slots a signal handler can walk without locks or
// allocation. A slot is free (0), being filled (1) or live (2). With every slot taken a
// temporary is simply not registered (its owner still removes it; only a signal would miss it).
constexpr int kSlots = 64;
constexpr size_t kPathBytes = 4096;
struct Slot {
  std::atomic<int> state{0};
  char path[kPathBytes];
};
Slot g_slots[kSlots];

int register_temporary(const std::string& path) {
  if (path.size() >= kPathBytes) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (g_slots[i].state.compare_exchange_strong(expected, 1)) {
      std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
      g_slots[i].state.store(2, std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void unregister_temporary(int slot) {
  if (slot >= 0) g_slots[slot].state.store(0, std::memory_order_release);
}

const std::string& host_name() {
  static const std::string name = [] {
    char buffer[256] = {};
    if (gethostname(buffer, sizeof buffer - 1) != 0 || buffer[0] == '\0') return std::string("localhost");
    std::string host(buffer);
    for (char& c : host) {
      if (c == '/') c = '_';
    }
    return host;
  }();
  return name;
}

std::string random_hex8() {
  static thread_local std::mt19937 generator(std::random_device{}());
  char text[9];
  std::snprintf(text, sizeof text, "%08x", static_cast<unsigned>(generator()));
  return text;
}

std::filesystem::path directory_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

// `name` is `<base>.tmp-<host>-<pid>-<8 hex>`: the pid when it is this host's, else -1.
long temporary_owner(const std::string& name, const std::string& base) {
  const std::string lead = base + ".tmp-";
  if (name.size() <= lead.size() || name.compare(0, lead.size(), lead) != 0) return -1;
  const std::string rest = name.substr(lead.size());
  const size_t random_dash = rest.rfind('-');
  if (random_dash == std::string::npos || rest.size() - random_dash - 1 != 8 ||
      rest.find_first_not_of("0123456789abcdef", random_dash + 1) != std::string::npos) {
    return -1;
  }
  const size_t pid_dash = rest.rfind('-', random_dash - 1);
  if (pid_dash == std::string::npos || pid_dash + 1 == random_dash) return -1;
  const std::string pid_text = rest.substr(pid_dash + 1, random_dash - pid_dash - 1);
  if (pid_text.size() > 9 || pid_text.find_first_not_of("0123456789") != std::string::npos) return -1;
  if (rest.substr(0, pid_dash) != host_name()) return -1;
  return std::stol(pid_text);
}

bool process_is_gone(long pid) { return pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

void fsync_path(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags);
  if (fd < 0) return;
  fsync(fd);
  close(fd);
}

}  // namespace

TemporaryFile::TemporaryFile(std::string final_path) : final_path_(std::move(final_path)) {
  remove_stale_temporaries(final_path_);
  path_ = final_path_ + ".tmp-" + host_name() + "-" + std::to_string(getpid()) + "-" + random_hex8();
  slot_ = register_temporary(path_);
}

TemporaryFile::~TemporaryFile() {
  if (!done_) discard();
}

TemporaryFile::TemporaryFile(TemporaryFile&& other) noexcept
    : final_path_(std::move(other.final_path_)), path_(std::move(other.path_)), slot_(other.slot_), done_(other.done_) {
  other.slot_ = -1;
  other.done_ = true;
}

TemporaryFile& TemporaryFile::operator=(TemporaryFile&& other) noexcept {
  if (this != &other) {
    if (!done_) discard();
    final_path_ = std::move(other.final_path_);
    path_ = std::move(other.path_);
    slot_ = other.slot_;
    done_ = other.done_;
    other.slot_ = -1;
    other.done_ = true;
  }
  return *this;
}

void TemporaryFile::commit() {
  if (done_) throw Error(final_path_, "temporary already committed or discarded");
  fsync_path(path_, O_RDONLY);
  if (std::rename(path_.c_str(), final_path_.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    discard();
    throw Error(final_path_, "cannot rename " + path_ + " into place: " + reason);
  }
  fsync_path(directory_of(final_path_).string(), O_RDONLY | O_DIRECTORY);
  unregister_temporary(slot_);
  slot_ = -1;
  done_ = true;
}

void TemporaryFile::discard() noexcept {
  if (!path_.empty()) unlink(path_.c_str());
  unregister_temporary(slot_);
  slot_ = -1;
  done_ = true;
}

void remove_live_temporaries() noexcept {
  for (Slot& slot : g_slots) {
    if (slot.state.load(std::memory_order_acquire) == 2) unlink(slot.path);
  }
}

std::vector<std::string> remove_stale_temporaries(const std::string& final_path) {
  std::vector<std::string> removed;
  const std::string base = std::filesystem::path(final_path).filename().string();
  std::error_code error;
  std::filesystem::directory_iterator entries(directory_of(final_path), error);
  if (error) return removed;
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    const long pid = temporary_owner(name, base);
    if (pid < 0 || pid == getpid() || !process_is_gone(pid)) continue;
    if (std::filesystem::remove(entry.path(), error) && !error) {
      // Named as the caller names the final path (no "./" for a bare file name).
      const std::string shown = (std::filesystem::path(final_path).parent_path() / name).string();
      removed.push_back(shown);
      log::warn("removed " + shown + ", a temporary left by process " + std::to_string(pid) +
                " of this host, which is gone");
    }
  }
  return removed;
}

namespace {

// Why `missing` could not be made (a caller may have tried to create it): its nearest existing
// ancestor is not a directory, or cannot be written (a read-only mount, permissions); "" when
// nothing stands in the way.
std::string why_directory_is_missing(const std::filesystem::path& missing) {
  std::error_code error;
  std::filesystem::path ancestor = missing.parent_path();
  while (!ancestor.empty() && !std::filesystem::exists(ancestor, error)) ancestor = ancestor.parent_path();
  if (ancestor.empty()) return "";
  if (!std::filesystem::is_directory(ancestor, error)) return " (" + ancestor.string() + " is not a directory)";
  if (access(ancestor.c_str(), W_OK | X_OK) != 0) {
    return " (cannot create it in " + ancestor.string() + ": " + std::strerror(errno) + ")";
  }
  return "";
}

}  // namespace

void check_writable(const std::string& what, const std::string& final_path) {
  const std::string where = what.empty() ? final_path : what + " " + final_path;
  std::error_code error;
  if (std::filesystem::is_directory(final_path, error)) throw Error(where, "is a directory");
  const std::filesystem::path directory = directory_of(final_path);
  if (!std::filesystem::exists(directory, error)) {
    throw Error(where, "cannot write: directory " + directory.string() + " does not exist" +
                           why_directory_is_missing(directory));
  }
  if (!std::filesystem::is_directory(directory, error)) {
    throw Error(where, "cannot write: " + directory.string() + " is not a directory");
  }
  TemporaryFile probe(final_path);
  const int fd = open(probe.path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(where, "cannot write in " + directory.string() + ": " + std::strerror(errno));
  close(fd);
}

}  // namespace mt
