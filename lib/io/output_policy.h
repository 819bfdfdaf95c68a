// The one output policy of every mt tool (issue 28): an input is never an output, and an output
// that exists and is not this run's own earlier output is refused unless the user says --force.
// A tool names its inputs (flag and path) and says whether an existing output is its own earlier
// one (a requeued job writing the same file again); the policy gives the one-line refusal. A
// tracker that only moves forward and a save directory that holds one run are the checkpoint
// side of the same rule (train/checkpointing.h). Tested in tests/unit/io/test_output_policy.cpp
// and tests/tools/overwrite.bats.
#pragma once

#include <string>
#include <vector>

namespace mt::io {

struct NamedInput {
  std::string flag;  // "--byte-data", "--load", "INPUT"
  std::string path;
};

// True when `a` and `b` name the same existing file (device and inode: links and ./ spellings
// alike), or the same path when either does not exist.
bool same_file(const std::string& a, const std::string& b);

// Throws mt::UsageError("<what> <output>", ...) when `output` is one of `inputs`, always.
void refuse_input_as_output(const std::string& what, const std::string& output, const std::vector<NamedInput>& inputs);

// Throws mt::UsageError("<what> <output>", "exists and is not this run's output ...") when
// `output` exists, is not `own_earlier_output` and `force` is off.
void refuse_existing_output(const std::string& what, const std::string& output, bool own_earlier_output, bool force);

}  // namespace mt::io
