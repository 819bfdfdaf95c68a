// Small helpers the case files share: special values, case names, refusals. Tested in
// tests/unit/backend/test_op_harness.cpp.
#pragma once

#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "op_harness.h"

namespace mt::harness {

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// "rows=7 cols=67": a case name's shape part from name/value pairs.
inline std::string shape_text(std::initializer_list<std::pair<const char*, long long>> values) {
  std::string text;
  for (const auto& [name, value] : values) {
    if (!text.empty()) text += ' ';
    text += name;
    text += '=';
    text += std::to_string(value);
  }
  return text;
}

// A value made on first use and shared by the runs of a case (a reference the case checks at
// several thread counts, or several cases check): the reference loops cost more than the entries.
template <typename T>
class Lazy {
 public:
  explicit Lazy(std::function<T()> make) : make_(std::move(make)) {}
  const T& get() {
    std::call_once(made_, [this] { value_ = make_(); });
    return value_;
  }

 private:
  std::function<T()> make_;
  std::once_flag made_;
  T value_{};
};

template <typename T>
std::shared_ptr<Lazy<T>> lazy(std::function<T()> make) {
  return std::make_shared<Lazy<T>>(std::move(make));
}

// `call` must throw std::invalid_argument whose message names `what` (the refused dtype).
inline void expect_refusal(CaseContext& c, const std::string& entry, const std::string& what,
                           const std::function<void()>& call) {
  try {
    call();
    c.fail(entry + " accepted " + what);
  } catch (const std::invalid_argument& e) {
    c.expect(std::string(e.what()).find(what) != std::string::npos,
             entry + "'s refusal does not name " + what + ": " + e.what());
  }
}

}  // namespace mt::harness
