// The tiny models the model, trainer and MPI suites run, defined once: GPT-2-shaped (tied
// embeddings, LayerNorm, learned positions) or LLaMA-shaped (untied, RMSNorm, RoPE, GQA with 2
// query groups). Used by tests/unit/model, tests/unit/train and tests/mpi.
#pragma once

#include "model/config.h"

namespace mt::testing {

// Two layers, hidden 32, vocabulary 50 padded to 64, sequences of 16: small enough for many
// training runs per test.
inline model::ModelConfig trainer_model(bool llama, float hidden_dropout = 0.0f) {
  model::ModelConfig c = model::preset(llama ? "tiny-llama" : "tiny-gpt");
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = llama ? 2 : 4;
  c.ffn_hidden_size = 48;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 16;
  c.seq_length = 16;
  c.max_position_embeddings = 16;
  c.hidden_dropout = hidden_dropout;
  return c;
}

inline model::ModelConfig tiny_llama() { return trainer_model(true); }

// Hidden 16, vocabulary 37 padded to 40, sequences of 9, for gradient and layout checks; the
// initialisation is wide enough that every path carries gradient.
inline model::ModelConfig gradient_model(bool llama, int layers, float hidden_dropout) {
  model::ModelConfig c = model::preset(llama ? "tiny-llama" : "tiny-gpt");
  c.num_layers = layers;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = llama ? 2 : 4;
  c.ffn_hidden_size = 24;
  c.vocab_size = 37;
  c.make_vocab_size_divisible_by = 8;
  c.seq_length = 9;
  c.max_position_embeddings = 9;
  c.init_method_std = 0.2f;
  c.hidden_dropout = hidden_dropout;
  return c;
}

}  // namespace mt::testing
