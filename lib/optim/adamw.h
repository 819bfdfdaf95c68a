// AdamW over flat ranges of the buffers a layout lays out: the whole buffer on one rank, or the
// shard of a DP rank under the distributed optimizer (its slice of every bucket: ranges that may
// cut tensors, ParamLayout::data_parallel_shard). The ranges are split into pieces at tensor
// boundaries (weight decay per tensor, by the layout's no-decay set);
// each piece is one fused pass of the backend's adamw_update, which can also refresh the bf16
// GEMM copy of the weights. Moments are fp32, as long as the ranges together. Also the grad norm
// over the ranges (each replicated tensor counted once: by default only primary copies count;
// optim/distributed_optimizer.h narrows that to the copies a rank counts among its data-parallel
// group) and Megatron's clipping. Keeps what it needs of the layout (no reference to it).
// Tested in tests/unit/optim/test_optim.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/memory.h"
#include "backend/ops.h"
#include "model/layout.h"

namespace mt::optim {

struct AdamWConfig {
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

// Whether a tensor's pieces count in the grad norm of the ranks that hold it.
using CountedInNorm = std::function<bool(const model::ParamEntry&)>;

class AdamW {
 public:
  // Over the whole flat buffer of `layout`.
  AdamW(const model::ParamLayout& layout, AdamWConfig config, const backend::Ops& ops,
        backend::MemoryLedger* ledger = nullptr);
  // Over the flat ranges (disjoint, ascending); elements outside every tensor (alignment and
  // bucket padding) are left alone. `counted` (empty: ParamEntry::primary) chooses the tensors
  // whose pieces grad_sum_squares counts.
  AdamW(const model::ParamLayout& layout, const std::vector<model::FlatRange>& ranges, AdamWConfig config,
        const backend::Ops& ops, backend::MemoryLedger* ledger = nullptr, const CountedInNorm& counted = {});

  const std::vector<model::FlatRange>& ranges() const { return ranges_; }

  // Adds the sum of squared grads over the ranges' counted pieces (fp64, unscaled: the local
  // share of a grad norm that several ranks sum) to the device double *sum, piece after piece in
  // the ranges' order, on the table's stream: the host does not wait.
  void add_grad_sum_squares(const float* grads, double* sum) const;
  // The same share read on the host (from zero: one copy and one synchronize, for tests and
  // checks; the trainer reads its step's sums together).
  double grad_sum_squares(const float* grads) const;
  // L2 norm of the ranges' grads after multiplying by grad_scale (1/loss scale), read on the host
  // as grad_sum_squares. Non-finite when any grad is.
  double grad_norm(const float* grads, double grad_scale) const;
  // One step over the ranges of the flat buffers (params, grads and param_bf16 index the whole
  // flat buffer): grads are multiplied by grad_scale (unscaling and clipping folded in) and the
  // step counter advances. param_bf16 (nullable) receives the refreshed bf16 copy.
  void step(float* params, uint16_t* param_bf16, const float* grads, double lr, double grad_scale);

  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }
  // The moments of the ranges, one after the other.
  float* exp_avg() { return exp_avg_.data(); }
  float* exp_avg_sq() { return exp_avg_sq_.data(); }
  int64_t state_bytes() const { return exp_avg_.bytes() + exp_avg_sq_.bytes(); }

 private:
  // A run of one tensor inside a range.
  struct Piece {
    int64_t begin = 0, end = 0;  // in the flat buffers
    int64_t state = 0;           // where its moments start
    bool weight_decay = true;
    bool counted = true;         // in the grad norm
  };

  const backend::Ops& ops_;
  AdamWConfig config_;
  std::vector<model::FlatRange> ranges_;
  std::vector<Piece> pieces_;
  backend::DeviceBuffer<float> exp_avg_;
  backend::DeviceBuffer<float> exp_avg_sq_;
  int64_t steps_ = 0;
};

// Megatron's clip factor: min(1, max_norm / (norm + 1e-6)); 1 when clipping is off (max_norm 0).
double clip_factor(double grad_norm, double max_norm);

}  // namespace mt::optim
