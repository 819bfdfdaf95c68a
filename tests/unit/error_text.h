// The message of the mt::Error an action throws, "" when it throws none: for unit tests that check
// what an error says. Shared by the unit suites.
#pragma once

#include <functional>
#include <string>

#include "core/error.h"

namespace mt::testing {

inline std::string error_text(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace mt::testing
