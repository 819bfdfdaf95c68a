// stderr logging (see log.h).
#include "core/log.h"

#include <cstdio>

namespace mt::log {
namespace {
std::string g_prefix;
}

void set_rank_prefix(const std::string& prefix) { g_prefix = prefix; }
const std::string& rank_prefix() { return g_prefix; }

void info(const std::string& line) { std::fprintf(stderr, "%s%s\n", g_prefix.c_str(), line.c_str()); }
void warn(const std::string& line) { std::fprintf(stderr, "%swarning: %s\n", g_prefix.c_str(), line.c_str()); }

}  // namespace mt::log
