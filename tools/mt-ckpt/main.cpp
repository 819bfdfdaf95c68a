// mt-ckpt: Inspect, verify, diff, reshard, export and import layout-independent HDF5 checkpoints.
// Conventions tested by tests/tools/conventions.bats.
#include "tools/common/tool_main.h"

int main(int argc, char** argv) {
  return mt::tools::tool_main(
      argc, argv, "mt-ckpt", "Inspect, verify, diff, reshard, export and import layout-independent HDF5 checkpoints.",
      [](mt::tools::ToolCli&) {},
      [](mt::tools::ToolCli&) -> int { mt::tools::job_not_built("checkpoint tools"); });
}
