// The tiny LLaMA-shaped model the trainer suites train (two layers, GQA, vocabulary 50 padded to
// 64, sequences of 16): small enough for many runs per test.
#pragma once

#include "model/config.h"

namespace mt::testing {

inline model::ModelConfig tiny_llama() {
  model::ModelConfig c = model::preset("tiny-llama");
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 48;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 16;
  c.seq_length = 16;
  c.max_position_embeddings = 16;
  return c;
}

}  // namespace mt::testing
