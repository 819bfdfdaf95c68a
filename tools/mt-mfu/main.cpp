// mt-mfu: not built yet (issue 15 brings model FLOPs per step, TFLOP/s per device and MFU from
// config flags or mt-train's JSONL). Conventions tested by tests/tools/conventions.bats.
#include "tools/common/tool_main.h"

int main(int argc, char** argv) {
  return mt::tools::not_built_main(
      argc, argv, "mt-mfu", "MFU reporting",
      "report model FLOPs per step, TFLOP/s per device and MFU from config flags or mt-train's JSONL", 15);
}
