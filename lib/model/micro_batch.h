// One micro-batch as the model sees it, and the loss sums its forward adds up. The arrays are
// device memory of the backend the stages run on (the trainer stages them from the host with the
// table's copy), rows = batch * seq tokens, row-major by sample; the caller keeps them alive until
// the stage's backward of the slot they were given to.
// A micro-batch may be a context-parallel chunk of the samples: `seq` is the tokens per sample on
// this rank, `positions` and `row_ids` stay global.
#pragma once

#include <cstdint>

namespace mt::model {

struct MicroBatch {
  int batch = 0;
  int seq = 0;
  const int32_t* tokens = nullptr;
  const int32_t* labels = nullptr;
  const float* loss_mask = nullptr;    // 1 counts, 0 does not; nullable (every token counts)
  const int32_t* positions = nullptr;
  const int32_t* doc_start = nullptr;  // nullable: first position of each token's document
  const int64_t* row_ids = nullptr;    // global token ids (global sample * seq + position): dropout keys
  // Device doubles (loss, tokens) the last stage's forward adds the micro-batch's sums to, on the
  // stream (backend xent_loss_sums): a step's micro-batches accumulate without a host wait. Needed
  // on the last stage; ignored elsewhere.
  double* loss_sums = nullptr;
  // Multi-token prediction (--mtp-num-layers D, model/layers/mtp.h), last stage only: device
  // doubles (loss, tokens) per depth that a training forward adds the depth's sums to (its labels
  // and loss mask rolled as Megatron rolls them), and on the host, per depth, d(objective) /
  // d(the depth's loss sum) that backward starts from (the trainer's lambda / D over the depth's
  // tokens times the LM loss's scale; 0 gives the depth no grads).
  double* mtp_loss_sums = nullptr;
  const float* mtp_loss_grad_scales = nullptr;
  // BERT (ModelConfig::bert). key_lengths: (batch) valid (unpadded) tokens of each sample, padding
  // after them (Megatron's padding_mask; null: none padded). With the binary head: token_types
  // (rows) 0 / 1, sentence_order (batch) the sop target (is_random), and sop_sums two device
  // doubles the last stage adds (sop loss sum, samples) to.
  const int32_t* key_lengths = nullptr;
  const int32_t* token_types = nullptr;
  const int32_t* sentence_order = nullptr;
  double* sop_sums = nullptr;
};

// A pair of loss sums read back on the host.
struct LossSums {
  double loss = 0;    // sum over tokens of loss * mask
  double tokens = 0;  // sum of the mask
};

}  // namespace mt::model
