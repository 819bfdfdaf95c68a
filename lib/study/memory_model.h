// Memory per rank by category, predicted from the configs without allocating anything:
// weights, GEMM weight copy, grads and optimizer states (from the layout table mt-train
// allocates from where it can lay the model out, else from perf/parameters.h's counts), and
// activations from a formula derived from what lib/model/activations.cpp keeps for backward
// under each recompute mode (written out below and in docs/accounting.md), deliberately not
// by calling its workspace planner, so comparing the two with mt-train's measured high-water
// marks tests both. Megatron's own estimate (megatron/training/theoretical_memory_usage.py)
// is computed beside it. Tested in tests/unit/study/test_memory_model.cpp.
//
// mt's activations (fp32 storage at every precision; every buffer rounded up to 64 bytes).
// Notation: b micro-batch, s sequence, c = CP, t = TP, N = b s / c rows on a rank, R = N / t
// rows of the residual stream with sequence parallelism (else R = N), h hidden, q = heads x
// head dim, k = query groups x head dim, n heads, F ffn, U = 2F with SwiGLU (else F), V the
// padded vocabulary, LN = 2 with LayerNorm (mean and rstd), 1 with RMSNorm (rstd).
//   A layer keeps, for backward (elements):
//     residual stream  4 R h            input, norm1 out, residual after attention, norm2 out
//     norm statistics  2 LN R
//     attention        N (q + 2k)/t     qkv after RoPE
//                      N q/t + N n/t    core-attention output and its log-sum-exp (flash-style:
//                                       no s x s scores), dropped under selective recompute
//     MLP              N U/t + N F/t    fc1 before and after the activation
//   MoE layers keep N E router scores and, per routed token copy (N k tokens over the EP ranks
//   in balance), its input h and the expert's U/ETP + F/ETP; shared experts like an MLP. MLA
//   keeps its down-projection outputs and norms, the up-projected q, k, v and the output.
//   Selective recompute: one shared core-attention output + log-sum-exp for the stage.
//   Full recompute, uniform, n layers a chunk: R h per chunk (its input) + n scratch sets of a
//   whole layer (the first without its input). Block, n layers: those n keep R h each, the rest
//   everything; one scratch set.
//   Pipeline: each micro-batch in flight keeps its own sets, and a chunk that is not the model's
//   last its output R h. The stage's chunks share slots as mt-train allocates them
//   (parallel::pipeline_slot_pools: chunks of equal slots one pool of the rank's peak in flight,
//   1F1B min(p - r, m) on stage r; the head's larger slots their own pool when sharing costs);
//   every chunk has its own scratch, selective and workspace buffers.
//   Chunk workspace (not kept): 8 R h (2 ping-pong outputs, the projection output, 2 stream
//   grads, the grads after attention, into a norm, of a norm's input), with SP 3 N h full rows
//   (gathered input or grad, partial sums and input grads before their reduce-scatter), N q/t,
//   N (q+2k)/t, N U/t, N F/t for the grads of attn, qkv, fc1, act; with bf16/fp16 two GEMM
//   operand buffers of N x max(h, (q+2k)/t, U/t, and V/t on the chunk with the head).
//   Last stage: final norm input and output R h each, its statistics LN R, logits N V/t (their
//   grads in place) and 4 N (row max, sum-exp, target logit, loss grad).
//   Communication buffers: PP's two grad receive and two send buffers R h (the send pool grows
//   while sends are in flight), CP's double-buffered ring of received K and V 2 x 2 N k/t, EP
//   all-to-all send/receive 2 N k h (router top-k); DP reduces the flat grad buffer in place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "model/recompute.h"
#include "parallel/parallel_config.h"

namespace mt::study {

// A run as the accounting sees it: mt-train's parallel layout (one parallel::ParallelConfig, the
// fields mt-train validates: TP, PP with its virtual and uneven stages, CP, DP, EP, expert-TP, SP,
// the distributed optimizer and its grad buckets), its batch, recompute and precision, and what
// only the study models.
struct TrainingShape {
  parallel::ParallelConfig parallel;  // data_parallel_size is the DP degree: world = TP x CP x DP x PP
  int micro_batch_size = 1;
  int global_batch_size = 0;          // 0: micro-batch x DP (one micro-batch per step)
  model::RecomputeConfig recompute;
  Precision precision = Precision::fp32;
  // Only the study: FSDP (Megatron-FSDP's optim_grads_params as the published rows run it: two
  // layers gathered, the root not counted; mt-train's own units also hold its root gathered,
  // optim/fsdp_params.h; mt-memreport and mt-mfu set it from --use-megatron-fsdp,
  // tools/common/run_report.cpp) and the form of the GEMM weight copy.
  bool fsdp = false;              // weights, grads and optimizer states sharded over DP x CP
  // mt-train's Megatron-FSDP units (optim_grads: grads; optim_grads_params: grads and weights;
  // optim/fsdp_grads.h, optim/fsdp_params.h), set by mt-memreport and mt-mfu from
  // --use-megatron-fsdp: the weights, grads and optimizer lines come from mt-train's layout (the
  // shard, plus the units a rank holds whole at once), not from the study's formula.
  bool fsdp_units = false;
  bool fsdp_prefetch = true;      // optim_grads_params: two layer units gathered at once, else one
  bool native_bf16_gemm = true;   // bf16 GEMM weights as bf16 bits (else bf16-rounded fp32)

  int world_size() const { return parallel.world_size(); }
  int global_batch() const {
    return global_batch_size > 0 ? global_batch_size : micro_batch_size * parallel.data_parallel_size;
  }
  int microbatches() const { return global_batch() / (micro_batch_size * parallel.data_parallel_size); }
  // parallel::validate's rules (the ones mt-train checks) for this layout on world_size() ranks:
  // throws mt::UsageError naming the flags of the first rule broken.
  void validate(const model::ModelConfig& model) const;
};

// Bytes a layer keeps for backward without recompute, by part (one micro-batch, one rank; fp32,
// each buffer rounded up to 64 bytes).
struct LayerActivations {
  int64_t residual = 0;   // the residual stream and norm outputs
  int64_t norm_stats = 0;
  int64_t attention = 0;  // qkv (or MLA's projections)
  int64_t core = 0;       // core-attention output and log-sum-exp
  int64_t mlp = 0;        // fc1 and activation (MoE: router scores, routed tokens, experts)
  int64_t bytes() const;
};

// One rank's predicted memory, bytes.
struct RankMemory {
  int stage = 0;
  std::string parameter_source;  // "layout table" or "parameter count"
  int64_t parameters = 0;        // elements this rank holds (before DP/FSDP sharding)
  int64_t weights = 0;           // fp32 master weights (FSDP: the shard + gathered layers)
  int64_t gemm_weights = 0;      // the bf16/fp16 GEMM copy (mt-train counts it under weights)
  int64_t grads = 0;
  int64_t optimizer = 0;
  int in_flight = 0;             // micro-batches (virtual ones when interleaved) kept at once (the schedule's peak)
  int layers = 0;                // decoder (and MTP) layers on the stage
  int64_t activation_per_layer = 0;  // bytes, an average layer of the stage, one micro-batch
  int64_t activations_kept = 0;      // every in-flight micro-batch's kept sets
  int64_t activations_recompute = 0; // scratch sets and the shared selective buffer
  int64_t workspace = 0;
  int64_t head = 0;                  // final norm, logits and loss buffers (last stage)
  int64_t comm_buffers = 0;
  int64_t activations() const { return activations_kept + activations_recompute + workspace + head; }
  int64_t total() const { return weights + gemm_weights + grads + optimizer + activations() + comm_buffers; }
};

// What decoder layer `layer` keeps under the shape, recompute aside.
LayerActivations layer_activations(const model::ModelConfig& model, const TrainingShape& shape, int layer);

// mt's memory on one rank of pipeline stage `stage`.
RankMemory predict_rank_memory(const model::ModelConfig& model, const TrainingShape& shape, int stage);
// Every stage's (its first rank; every rank of a stage holds the same amounts).
std::vector<RankMemory> predict_memory(const model::ModelConfig& model, const TrainingShape& shape);

// Megatron's theoretical_memory_usage.py for the most loaded rank (the first stage), bytes:
// weights + grads + optimizer at 18 bytes a parameter (6 + 12/DP with the distributed
// optimizer, expert parameters over the expert-DP size), and its activation estimate (the
// Korthikanti et al. formula with SP + selective recompute, otherwise the "without SP" one with
// its 5% margin); it assumes bf16 training and does not model full recompute.
struct MegatronMemory {
  double weights_and_optimizer = 0;
  double activations = 0;
  double total() const { return weights_and_optimizer + activations; }
};
MegatronMemory megatron_theoretical_memory(const model::ModelConfig& model, const TrainingShape& shape);

}  // namespace mt::study
