// Node placement by host-name exchange (see node_ranks.h).
#include "comm/node_ranks.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace mt::comm {
namespace {

constexpr size_t kNameBytes = 256;  // one fixed block per rank, NUL-padded

}  // namespace

std::string host_name() {
  char name[kNameBytes] = {};
  if (gethostname(name, sizeof name - 1) != 0) throw Error("gethostname", std::strerror(errno));
  return name;
}

NodeRanks exchange_node_ranks(Communicator& group, const std::string& host) {
  if (host.size() >= kNameBytes) {
    throw Error("host name " + host.substr(0, 32) + "...", "longer than " + std::to_string(kNameBytes - 1) + " bytes");
  }
  std::vector<char> mine(kNameBytes, '\0');
  std::memcpy(mine.data(), host.data(), host.size());
  const int size = group.size(), rank = group.rank();
  std::vector<char> all(kNameBytes * static_cast<size_t>(size));
  group.all_gather(mine.data(), all.data(), static_cast<int64_t>(kNameBytes), DType::u8);
  const auto name_of = [&](int r) { return std::string(all.data() + kNameBytes * static_cast<size_t>(r)); };

  NodeRanks placement;
  placement.local_count = 0;
  placement.nodes = 0;
  std::vector<std::string> seen;  // node names in the order of their lowest rank
  for (int r = 0; r < size; ++r) {
    const std::string name = name_of(r);
    const bool new_node = std::find(seen.begin(), seen.end(), name) == seen.end();
    if (new_node) seen.push_back(name);
    if (name != host) continue;
    if (r < rank) ++placement.local_rank;
    ++placement.local_count;
  }
  placement.nodes = static_cast<int>(seen.size());
  placement.node = static_cast<int>(std::find(seen.begin(), seen.end(), host) - seen.begin());
  return placement;
}

}  // namespace mt::comm
