// mt-train: Pre-train a transformer language model (GPT, LLaMA, MoE) with Megatron-LM's flags; JSONL step records on stdout.
// Conventions tested by tests/tools/conventions.bats.
#include "common/tool_main.h"

int main(int argc, char** argv) {
  return mt::tools::tool_main(
      argc, argv, "mt-train", "Pre-train a transformer language model (GPT, LLaMA, MoE) with Megatron-LM's flags; JSONL step records on stdout.",
      [](mt::tools::ToolCli&) {},
      [](mt::tools::ToolCli&) -> int { mt::tools::job_not_built("training", 3); });
}
