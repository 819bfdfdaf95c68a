// mt-memreport: not built yet (issue 15 brings per-rank memory: weights, grads, optimizer and
// activations from config flags or mt-train's JSONL). Conventions tested by tests/tools/conventions.bats.
#include "tools/common/tool_main.h"

int main(int argc, char** argv) {
  return mt::tools::not_built_main(
      argc, argv, "mt-memreport", "memory reporting",
      "report per-rank memory (weights, grads, optimizer, activations) from config flags or mt-train's JSONL", 15);
}
