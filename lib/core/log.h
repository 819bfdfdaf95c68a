// Human log lines on stderr (never stdout), prefixed with the rank under MPI.
#pragma once

#include <string>

namespace mt::log {

// Sets the prefix used under MPI ("[rank 3] "); empty for a single process.
void set_rank_prefix(const std::string& prefix);
const std::string& rank_prefix();
void info(const std::string& line);
void warn(const std::string& line);

}  // namespace mt::log
