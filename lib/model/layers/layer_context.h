// What every layer's forward and backward read: the backend op table and its stream, the
// parallel context, the precision GEMMs, the bound parameters and grads (LayerContext, fixed for
// a stage), and the micro-batch pass in progress (LayerPass). Under context parallelism the
// stage's ring attention (sized for its micro-batch) is in the LayerContext too. Layers hold only offsets into the
// flat buffers and their local (sharded) widths, read from the layout.
#pragma once

#include <cstdint>
#include <string>

#include "backend/ops.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/micro_batch.h"
#include "model/parallel_context.h"
#include "model/precision_gemm.h"
#include "parallel/ring_attention.h"

namespace mt::model {

struct LayerContext {
  const ModelConfig& config;
  const backend::Ops& ops;
  backend::Stream stream;
  const ParallelContext& parallel;
  const PrecisionGemm& gemm;
  const float* params = nullptr;
  float* grads = nullptr;
  uint64_t seed = 0;
  parallel::RingAttention* ring_attention = nullptr;  // CP > 1: the attention core runs over the CP group
};

struct LayerPass {
  const MicroBatch& batch;
  int64_t rows = 0;                     // tokens of the micro-batch (batch * seq)
  int64_t sequence_rows = 0;            // rows of the sequence-parallel region held here
  const int64_t* sequence_row_ids = nullptr;  // their global token ids (dropout keys)
  uint64_t iteration = 0;
  bool training = false;
  bool recompute = false;            // a forward rerun before backward (MoE: counts and logs nothing)
  float aux_loss_grad_factor = 0.0f;  // MoE: d(objective) / d(aux loss value) for this micro-batch's backward
  float sop_loss_grad_factor = 0.0f;  // BERT: d(objective) / d(this micro-batch's sop loss, a sample mean)
};

// Dropout streams: one per (site, global layer), independent of the parallel layout.
uint64_t dropout_stream(const char* site, int layer);

// Offset of a parameter in the flat buffers, or -1 when this model has none by that name.
int64_t param_offset(const ParamLayout& layout, const std::string& name);
int64_t optional_param_offset(const ParamLayout& layout, const std::string& name);

}  // namespace mt::model
