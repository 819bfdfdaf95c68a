// Which ranks of a group share a node, found by the ranks themselves: an all-gather of their
// host names over the group (not a launcher's variables, which differ between mpirun, srun and
// others and are absent under some). MpiRuntime::init runs it over the world once MPI starts and
// hands the count of ranks on this node to core/threads.h (threads per rank = CPUs / that count).
// Tested in tests/mpi/test_communicator.cpp (against OMPI_COMM_WORLD_LOCAL_SIZE/_RANK, and with
// made-up host names) and tests/unit/comm/test_single_communicator.cpp (a group of one).
#pragma once

#include <string>

#include "comm/communicator.h"

namespace mt::comm {

struct NodeRanks {
  int local_rank = 0;   // this rank's index among the ranks on its node, in group order
  int local_count = 1;  // ranks of the group on this node
  int node = 0;         // this node's index, nodes numbered in the order of their lowest rank
  int nodes = 1;        // nodes the group spans
};

// This machine's host name (gethostname).
std::string host_name();

// Collective over `group` (a control communicator): ranks that pass the same `host` share a node.
// Throws when a host name is longer than 255 bytes.
NodeRanks exchange_node_ranks(Communicator& group, const std::string& host = host_name());

}  // namespace mt::comm
