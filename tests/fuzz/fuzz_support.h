// What the libFuzzer targets of tests/fuzz share: the entry point they define, a scratch file
// that readers taking a path are given the fuzz input through (one per process, in /dev/shm when
// it exists: the input is rewritten on every execution), and the rule that a reader's only
// allowed answer to bad input is an mt::Error (anything else - a crash, a sanitizer report, an
// uncaught exception of another type, a broken invariant checked with FUZZ_CHECK - is a finding).
// Tested by the fuzz smoke runs and the replay tests of tests/fuzz/CMakeLists.txt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace mt::fuzz {

// Aborts (a finding) with the condition's text when an invariant of a reader does not hold.
#define FUZZ_CHECK(condition)                                                            \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (false)

// A file of this process that holds the given bytes (written whole, truncating the last input).
// `suffix` ends the name (e.g. ".idx"), since some readers choose by it.
std::string write_scratch_file(std::string_view bytes, std::string_view suffix);

// The repository's root (MT_SOURCE_DIR, compiled in), for the files a target loads once.
std::string source_path(std::string_view relative);

// Runs `read`; an mt::Error is the reader's refusal and ends it quietly (printed when the
// environment sets MT_FUZZ_VERBOSE, to see what a seed reaches), any other exception is a finding
// (it would reach a tool as a message that names no file) and aborts with its text.
template <typename Read>
void refusals_only(Read&& read) {
  try {
    read();
  } catch (const mt::Error& e) {
    static const bool verbose = std::getenv("MT_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "an exception other than mt::Error escaped the reader: %s\n", e.what());
    std::abort();
  }
}

// The input as text.
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace mt::fuzz
