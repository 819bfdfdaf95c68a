// mt-shard: Split, blend and shuffle token datasets into Megatron-exact sample indices (HDF5).
// Conventions tested by tests/tools/conventions.bats.
#include "common/tool_main.h"

int main(int argc, char** argv) {
  return mt::tools::tool_main(
      argc, argv, "mt-shard", "Split, blend and shuffle token datasets into Megatron-exact sample indices (HDF5).",
      [](mt::tools::ToolCli&) {},
      [](mt::tools::ToolCli&) -> int { mt::tools::job_not_built("sharding", 5); });
}
