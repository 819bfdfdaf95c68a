// Opening the files a user names as input (tokenizer files, JSONL and text inputs, token
// datasets, sample indices, --byte-data): one place that turns every way of naming the wrong thing
// into a one-line mt::Error "<what>: <why>", where <what> is the path (prefixed by the flag when
// the caller gives one, e.g. "--vocab-file x.json") and <why> is "no such file", "is a directory,
// expected a file", "permission denied", or the system's text for anything else. Pipes and
// character devices (`-`, /dev/stdin, <(...)) are accepted where the caller streams.
// Tested in tests/unit/core/test_input_file.cpp.
#pragma once

#include <cstdio>
#include <string>

namespace mt {

enum class PathKind { missing, file, directory, other };

// What `path` names, following symlinks (missing also for a dangling link or an unreadable
// parent directory).
PathKind path_kind(const std::string& path);

// Throws mt::Error unless `path` names something readable that is not a directory (checked
// without opening it, so a named pipe is left for its reader). `flag`, when given, leads the
// message ("--input data: is a directory, expected a file").
void check_input_file(const std::string& path, const std::string& flag = "");

// open(2) for reading (O_CLOEXEC) after the same checks; the caller closes the descriptor.
int open_input_fd(const std::string& path, const std::string& flag = "");

// fopen(path, "rb") after the same checks; the caller fcloses.
std::FILE* open_input_file(const std::string& path, const std::string& flag = "");

// The whole file, with the same errors (and "read failed: <reason>" for an I/O error).
std::string read_input_file(const std::string& path, const std::string& flag = "");

}  // namespace mt
