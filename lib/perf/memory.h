// The memory one rank needs to train a configuration, by category, known before anything is
// allocated: weights (fp32 master copy plus the bf16/fp16 GEMM copy), fp32 grads, Adam's two
// moments, the activations of one micro-batch (the model's activation plan) and the rest (host
// tables of the layout and the plan per layer, the staged samples of a step).
//
// Two stages, so a configuration far too big is refused without building anything large and
// without integer overflow:
// 1. memory_floor: closed formulas in long double (parameter count, the activation buffers every
//    plan has) that never exceed what stage 2 finds, computed in microseconds for any counts;
// 2. planned_memory: exact bytes from the layout table and the activation planner, run only when
//    the floor is representable (stage 2 is then at most a small multiple of it, so its int64
//    arithmetic cannot overflow) and, in check_training_memory, only when the floor fits.
// Under a parallel layout the figures are one rank's, each category the largest over the
// pipeline stages (so an upper bound of any one rank's total): weights and grads of its stage's TP shard (the layout table of TP rank 0, with every model
// chunk of the stage), Adam's moments of its DP x CP shard with the distributed optimizer, and the
// activations its stage allocates (TP-local widths, the residual stream split over TP under SP,
// the sequence over CP, as many micro-batches as its pipeline schedule keeps in flight). The
// check compares them times the ranks sharing the node with the node's available memory.
// mt-train refuses a configuration through check_training_memory; mt-memreport reports the same
// figures (its optimizer shard through optimizer_state_elements). Tested in tests/unit/perf/test_memory.cpp and tests/tools/bad-input.bats (issue 11 case 2); check_report_floor in tests/tools/probe-cases.bats (issue 28 C2).
#pragma once

#include <cstdint>
#include <string>

#include "backend/ops.h"
#include "core/dtype.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/recompute.h"
#include "parallel/parallel_config.h"

namespace mt::perf {

// What decides the memory besides the model's shape.
struct MemoryOptions {
  Precision precision = Precision::fp32;
  model::RecomputeConfig recompute;
  int micro_batch_size = 1;
  int64_t staged_samples = 1;  // samples staged per step on one rank (the global batch / DP)
  parallel::ParallelConfig parallel;  // as parallel::validate left it (data_parallel_size set)
  int ranks_per_node = 1;             // ranks sharing the memory checked against
  // The table the run's GEMM weight copy is planned for (model::GemmWeights::bytes): the trainer
  // gives its own; the study's estimates and reports leave the CPU's.
  const backend::Ops* ops = &backend::cpu_ops();
};

// Bytes per category; saturated at INT64_MAX in a floor whose counts overflow.
struct TrainingMemory {
  int64_t weights = 0, grads = 0, optimizer = 0, activations = 0, other = 0;
  bool overflow = false;       // the floor is beyond what 64-bit plans can count (memory_floor only)
  long double exact_total = 0;  // the floor's total without saturation (memory_floor only)
  int64_t total() const;
};

// Host bytes per decoder layer outside the flat buffers (layout entries with their names and
// shapes, the plan's per-layer slots), a measured lower bound.
constexpr int64_t kHostBytesPerLayer = 2048;

// Stage 1: a lower bound of every category from closed formulas; never allocates.
TrainingMemory memory_floor(const model::ModelConfig& model, const MemoryOptions& options);
// Stage 2: the exact plan (layout table and activation planner). Throws mt::Error when the
// floor's counts overflow; builds tables of O(layers) entries, so call it after the floor fits.
TrainingMemory planned_memory(const model::ModelConfig& model, const MemoryOptions& options);

// The ranks the distributed optimizer splits Adam's moments over: the dense grads' reduction
// group, DP x CP (optim::DistributedOptimizer shards over it); 1 without the distributed optimizer.
int optimizer_shards(const parallel::ParallelConfig& parallel);
// Elements of `layout` whose Adam moments one rank keeps: the whole table, or with the distributed
// optimizer the first of optimizer_shards(parallel) ranks' slice of every bucket (the trainer's
// owned ranges). mt-memreport's prediction (study/memory_model.h) takes it from here too.
int64_t optimizer_state_elements(const model::ParamLayout& layout, const parallel::ParallelConfig& parallel);

// Elements one Megatron-FSDP rank (rank 0) holds of `layout`, a one-stage model dense or MoE
// (optim/fsdp_grads.h, optim/fsdp_params.h): the shard is the owned slices of the per-layer
// buckets (a dense bucket's slice over DP x CP, an expert bucket's over expert-DP), plus what the
// rank holds beyond it of the units in use (a MoE layer's dense and expert units are held
// together). Grads: the root's (embedding and head: the head's backward writes the tied
// embedding's) or the embedding's and one layer's (with --overlap-grad-reduce one more layer's,
// the unit whose reduce-scatter is in flight). Weights: under optim_grads_params the root's and two
// adjacent layers' beside the shard (the one computing and the one prefetched; one without
// `prefetch`), under optim_grads the whole table. Released pages stay in each buffer's page pool
// (backend/memory.h), so these peaks are also what the buffers hold from the first step on. Page
// rounding of the released regions (up to a 4 KiB page per bucket edge) is not counted. Used by
// planned_memory (mt-train's check) and mt-memreport's prediction (study/memory_model.h).
struct FsdpResidentElements {
  int64_t weights = 0;    // fp32 master weights
  int64_t grads = 0;      // fp32 grads
  int64_t optimizer = 0;  // the shard, whose Adam moments the rank keeps
};
FsdpResidentElements fsdp_resident_elements(const model::ParamLayout& layout, const parallel::ParallelConfig& parallel,
                                            bool prefetch);

// MemAvailable of /proc/meminfo in bytes, -1 when unknown.
int64_t available_memory_bytes();

// The check before allocating: the floor times options.ranks_per_node against `available_bytes`
// (-1: unknown, only overflow is refused), then the plan. Returns the plan; throws mt::Error("model <name>", "needs ... GiB
// (weights ..., grads ..., optimizer ..., activations ..., other ...) but only ... is available;
// ...") or, when the counts overflow, says so.
TrainingMemory check_training_memory(const model::ModelConfig& model, const MemoryOptions& options,
                                     int64_t available_bytes);

// The check of a memory report before it builds anything per layer (mt-memreport, --plan,
// --sweep; issue 28 C2): one rank's floor (memory_floor; with `ranks_sharing` > 1 the whole
// model's floor over that many ranks, a lower bound of any layout of them) refused as
// check_training_memory refuses it: a floor past 64-bit counts, or one larger than both
// `host_bytes` (this host's available memory, -1 unknown) and the largest memory of a device
// mt knows: no machine mt-train could run on holds that rank. Never allocates.
void check_report_floor(const model::ModelConfig& model, const MemoryOptions& options, int64_t host_bytes,
                        int ranks_sharing = 1);

// "12.34 GiB".
std::string gib(int64_t bytes);

}  // namespace mt::perf
