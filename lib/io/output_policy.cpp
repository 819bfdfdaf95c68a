// The output policy (see output_policy.h).
#include "io/output_policy.h"

#include <sys/stat.h>

#include <filesystem>

#include "core/error.h"

namespace mt::io {

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return std::filesystem::path(a).lexically_normal() == std::filesystem::path(b).lexically_normal();
}

void refuse_input_as_output(const std::string& what, const std::string& output, const std::vector<NamedInput>& inputs) {
  for (const NamedInput& input : inputs) {
    if (input.path.empty() || !same_file(output, input.path)) continue;
    throw UsageError(what + " " + output, "is this run's input (" + input.flag + " " + input.path +
                                              "); an input is never an output, not even with --force");
  }
}

void refuse_existing_output(const std::string& what, const std::string& output, bool own_earlier_output, bool force) {
  std::error_code error;
  if (force || own_earlier_output || !std::filesystem::exists(output, error)) return;
  throw UsageError(what + " " + output,
                   "exists and is not this run's output; give --force to overwrite it (or name another file)");
}

}  // namespace mt::io
