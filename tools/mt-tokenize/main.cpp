// mt-tokenize: Tokenize JSONL or text with exact byte-level BPE (GPT-2, tiktoken, Hugging Face) into HDF5 and Megatron .bin/.idx token datasets.
// Conventions tested by tests/tools/conventions.bats.
#include "common/tool_main.h"

int main(int argc, char** argv) {
  return mt::tools::tool_main(
      argc, argv, "mt-tokenize", "Tokenize JSONL or text with exact byte-level BPE (GPT-2, tiktoken, Hugging Face) into HDF5 and Megatron .bin/.idx token datasets.",
      [](mt::tools::ToolCli&) {},
      [](mt::tools::ToolCli&) -> int { mt::tools::job_not_built("tokenizing", 4); });
}
