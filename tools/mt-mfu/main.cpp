// mt-mfu: Model FLOPs per step, TFLOP/s per device and MFU, from config flags or mt-train's JSONL.
// Conventions tested by tests/tools/conventions.bats.
#include "tools/common/tool_main.h"

int main(int argc, char** argv) {
  return mt::tools::tool_main(
      argc, argv, "mt-mfu", "Model FLOPs per step, TFLOP/s per device and MFU, from config flags or mt-train's JSONL.",
      [](mt::tools::ToolCli&) {},
      [](mt::tools::ToolCli&) -> int { mt::tools::job_not_built("MFU reporting"); });
}
