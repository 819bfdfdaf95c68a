// Hugging Face checkpoints in and out of mt's (io/checkpoint.h): a directory with `config.json`
// and `model.safetensors` (io/safetensors.h) holding the names and shapes transformers expects.
//
// Two architectures, picked from the model config:
// - GPT2LMHeadModel (LayerNorm, learned positions, tanh-GELU MLP, biases): Conv1D weights stored
//   (in, out), the transpose of mt's (out, in); q, k and v fused into `attn.c_attn` as the
//   columns [q | k | v]; `lm_head.weight` only when the embeddings are untied.
// - LlamaForCausalLM (RMSNorm, RoPE, SwiGLU, no biases): q/k/v/o and gate/up/down (out, in) as
//   mt stores them. mt applies RoPE in the rotate-half layout (dimension i of a head pairs with
//   i + D/2), which is the layout of HF's LlamaForCausalLM (rotate_half); HF's convert script
//   permutes Meta's interleaved q/k rows into that layout, so from mt no permutation is needed.
// - MixtralForCausalLM (LLaMA's attention and norms, every MLP a mixture of SwiGLU experts):
//   `block_sparse_moe.gate` is mt's `mlp.router`, expert e's w1/w3/w2 its
//   linear_fc1_gate/linear_fc1_up/linear_fc2. Only a routing HF computes the same way exports:
//   mt's default softmax router (top-k of the logits, softmax over the k) equals HF's softmax,
//   top-k, renormalise; --moe-router-pre-softmax, sigmoid scores, expert bias, group-limited
//   top-k, a top-k scaling factor, capacity dropping, shared experts, dense layers between MoE
//   layers (--moe-layer-freq), multi-latent attention and multi-token prediction are refused by
//   flag name. Training-only router settings (load-balancing type, z-loss) are not carried:
//   config.json's router_aux_loss_coef is --moe-aux-loss-coeff, imported as aux_loss.
// - DeepseekV3ForCausalLM (multi-latent attention with the latent norms, dense SwiGLU layers then
//   MoE layers with shared experts and the sigmoid router with the expert bias): MLA's
//   linear_q_down_proj / q_layernorm / linear_q_up_proj (or linear_q_proj), linear_kv_down_proj /
//   kv_layernorm / linear_kv_up_proj and linear_proj are HF's q_a_proj / q_a_layernorm / q_b_proj
//   (q_proj), kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj and o_proj, row for row (both put
//   [nope | rope] per query head, [c_kv | k_pe] in the down projection and [k_nope | v] per head in
//   the up projection, and rotate the rope part with the same interleave: rope_interleave true);
//   the router is mlp.gate.weight and its expert bias (a checkpoint buffer, not a parameter)
//   mlp.gate.e_score_correction_bias; experts mlp.experts.<e>.{gate,up,down}_proj, shared experts
//   mlp.shared_experts.*. HF routes as Megatron's sigmoid router (bias for choosing, the unbiased
//   scores normalised when k > 1 and scaled) except that it masks the groups it drops with 0.0
//   where Megatron uses -inf: the same experts while the biased scores are positive. What HF's
//   router cannot express is refused by flag name: softmax scores, no expert bias, groups keeping
//   other than top-2 experts each (HF sums each group's best two), capacity dropping, no shared
//   experts, MoE layers not after all dense ones. YaRN exports as rope_scaling (HF derives the
//   factor from max_position_embeddings / original_max_position_embeddings, so they must agree).
//   Multi-token prediction depth k is model.layers.<num_layers + k>. as DeepSeek-V3's released
//   checkpoint names it: the layer's tensors, enorm, hnorm, eh_proj, shared_head.norm (mt's
//   final_layernorm), and copies of the word embedding (embed_tokens) and output layer
//   (shared_head.head); config.json's num_nextn_predict_layers is --mtp-num-layers
//   (transformers builds no MTP layer and ignores them). DeepSeek's own aux_loss_alpha and seq_aux
//   carry --moe-aux-loss-coeff and seq_aux_loss.
// Vocabulary rows: mt pads the embedding and output tables to a multiple of
// make_vocab_size_divisible_by (DESIGN.md section 3.4); export drops the pad rows, import adds
// them as zeros (they are outside the softmax and never looked up). An import is parameters only:
// iteration 0, no optimizer state, not resumable (mt-train --load DIR --finetune trains from it).
// Tested in tests/unit/io/test_hf_checkpoint.cpp, tests/tools/mt-ckpt.bats (the import of an export
// is bit-identical; tests/tools/safetensors_reader.py reads the export independently) and
// tests/unit/train/test_golden.cpp, tests/unit/train/test_hf_mixtral_logits.cpp and
// tests/unit/train/test_hf_deepseek_logits.cpp (mt's logits against transformers', tests/golden/hf).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "io/checkpoint.h"
#include "model/config.h"

namespace mt::io {

enum class HfArchitecture { gpt2, llama, mixtral, deepseek_v3 };

// The architecture an mt model maps to; throws mt::UsageError naming what no architecture has.
HfArchitecture hf_architecture(const model::ModelConfig& model);
// "GPT2LMHeadModel", "LlamaForCausalLM", "MixtralForCausalLM", "DeepseekV3ForCausalLM"
const char* hf_architecture_name(HfArchitecture architecture);

// One Hugging Face tensor: the mt tensors stacked along their first dimension (the vocabulary
// tables cut to the real vocabulary), transposed when HF stores the transpose (GPT-2's Conv1D).
struct HfTensor {
  std::string name;                   // HF's
  std::vector<std::string> mt_names;  // layout names (model/layout.h), without "model/"
  bool transposed = false;
  bool vocabulary = false;            // rows are the vocabulary: pad rows dropped/added
  // A copy HF's files hold of a tensor listed before (DeepSeek-V3's MTP layer's embed_tokens and
  // shared_head.head): exported, and on import required equal to it bit for bit, not written.
  bool copy = false;
};
std::vector<HfTensor> hf_tensors(const model::ModelConfig& model);

// config.json for `model`, its weights stored as `dtype`.
nlohmann::ordered_json hf_config(const model::ModelConfig& model, DType dtype);
// The mt model of a config.json (its path for errors); mt pads the vocabulary to a multiple of
// `make_vocab_size_divisible_by`. Throws mt::UsageError naming the field mt cannot represent, and
// mt::Error (a bad file, exit 1: issue 28 U16) naming the model_type when it is none mt imports.
model::ModelConfig model_config_from_hf(const nlohmann::json& config, const std::string& path,
                                        int make_vocab_size_divisible_by);

struct HfExportResult {
  HfArchitecture architecture = HfArchitecture::gpt2;
  int64_t tensors = 0;
  int64_t bytes = 0;  // model.safetensors
};
// Writes DIRECTORY/config.json and DIRECTORY/model.safetensors (each under a temporary name,
// fsynced, renamed; the directory is created) from the parameters of `checkpoint`.
HfExportResult export_hf(const CheckpointReader& checkpoint, const std::string& directory, DType dtype);

struct HfImportResult {
  model::ModelConfig model;
  int64_t tensors = 0;                // mt tensors written
  std::vector<std::string> ignored;   // tensors of the HF files no mt parameter comes from
  int64_t bytes = 0;                  // the checkpoint file
};
// Reads DIRECTORY/config.json and model.safetensors (or the shards model.safetensors.index.json
// names) and writes the mt checkpoint file `path` (temporary, fsync, rename).
HfImportResult import_hf(const std::string& directory, const std::string& path, int make_vocab_size_divisible_by);

}  // namespace mt::io
