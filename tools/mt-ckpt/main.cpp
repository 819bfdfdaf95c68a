// mt-ckpt: not built yet (issue 14 brings inspect, verify, diff, reshard, export and import of
// layout-independent HDF5 checkpoints). Conventions tested by tests/tools/conventions.bats.
#include "tools/common/tool_main.h"

int main(int argc, char** argv) {
  return mt::tools::not_built_main(
      argc, argv, "mt-ckpt", "checkpoint tools",
      "inspect, verify, diff, reshard, export and import layout-independent HDF5 checkpoints", 14);
}
