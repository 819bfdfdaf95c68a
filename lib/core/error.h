// mt::Error: the one exception lib/ throws. Tools turn it into `mt-x: error: <what>: <why>` on
// stderr and the exit code it carries (DESIGN.md section 5). Tested in tests/unit/core/test_error.cpp.
#pragma once

#include <stdexcept>
#include <string>

namespace mt {

enum class ExitCode : int {
  ok = 0,
  runtime_failure = 1,
  usage = 2,
  check_failed = 3,
  stopped_resumable = 75,
};

class Error : public std::runtime_error {
 public:
  // `what` names the thing (a flag, a file, a tensor); `why` says what is wrong with it.
  Error(const std::string& what, const std::string& why, ExitCode code = ExitCode::runtime_failure)
      : std::runtime_error(why.empty() ? what : what + ": " + why), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// A bad flag, value or combination of them: exit 2.
class UsageError : public Error {
 public:
  UsageError(const std::string& what, const std::string& why) : Error(what, why, ExitCode::usage) {}
};

// A check the user asked for failed (verify mismatch, threshold exceeded): exit 3.
class CheckFailed : public Error {
 public:
  CheckFailed(const std::string& what, const std::string& why) : Error(what, why, ExitCode::check_failed) {}
};

// Stopped on a signal after writing a resumable checkpoint: exit 75, so sbatch requeues.
class StoppedResumable : public Error {
 public:
  StoppedResumable(const std::string& what, const std::string& why)
      : Error(what, why, ExitCode::stopped_resumable) {}
};

}  // namespace mt
