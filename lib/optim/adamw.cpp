// AdamW, grad norm and clipping (see adamw.h).
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mt::optim {

AdamW::AdamW(const model::ParamLayout& layout, AdamWConfig config, const backend::Ops& ops,
             backend::MemoryLedger* ledger)
    : AdamW(layout, {model::FlatRange{0, layout.total_elements}}, config, ops, ledger) {}

AdamW::AdamW(const model::ParamLayout& layout, const std::vector<model::FlatRange>& ranges, AdamWConfig config,
             const backend::Ops& ops, backend::MemoryLedger* ledger, const CountedInNorm& counted)
    : ops_(ops), config_(config), ranges_(ranges) {
  int64_t state = 0, previous_end = 0;
  for (const model::FlatRange& range : ranges_) {
    if (range.begin < previous_end || range.end > layout.total_elements || range.begin > range.end) {
      throw Error("optimizer range [" + std::to_string(range.begin) + ", " + std::to_string(range.end) + ")",
                  "outside the flat buffer of " + std::to_string(layout.total_elements) +
                      " elements or not after the range before it");
    }
    for (const auto& entry : layout.entries) {
      const int64_t begin = std::max(range.begin, entry.offset);
      const int64_t end = std::min(range.end, entry.offset + entry.numel);
      if (begin < end) {
        const bool counts = counted ? counted(entry) : entry.primary();
        pieces_.push_back(Piece{begin, end, state + (begin - range.begin), entry.weight_decay, counts});
      }
    }
    state += range.end - range.begin;
    previous_end = range.end;
  }
  exp_avg_ = backend::DeviceBuffer<float>(ops, state, backend::MemoryCategory::optimizer, ledger);
  exp_avg_sq_ = backend::DeviceBuffer<float>(ops, state, backend::MemoryCategory::optimizer, ledger);
}

void AdamW::add_grad_sum_squares(const float* grads, double* sum) const {
  const backend::Stream stream = ops_.default_stream();
  for (const Piece& piece : pieces_) {
    if (piece.counted) ops_.sum_squares(grads + piece.begin, piece.end - piece.begin, sum, stream);
  }
}

double AdamW::grad_sum_squares(const float* grads) const {
  backend::DeviceBuffer<double> sum(ops_, 1, backend::MemoryCategory::optimizer);
  add_grad_sum_squares(grads, sum.data());
  double host = 0;
  ops_.copy(&host, sum.data(), sizeof(double), backend::CopyKind::device_to_host, ops_.default_stream());
  ops_.synchronize(ops_.default_stream());
  return host;
}

double AdamW::grad_norm(const float* grads, double grad_scale) const {
  return std::sqrt(grad_sum_squares(grads)) * grad_scale;
}

void AdamW::step(float* params, uint16_t* param_bf16, const float* grads, double lr, double grad_scale) {
  ++steps_;
  backend::AdamWParams p;
  p.lr = static_cast<float>(lr);
  p.beta1 = static_cast<float>(config_.beta1);
  p.beta2 = static_cast<float>(config_.beta2);
  p.eps = static_cast<float>(config_.eps);
  p.bias_correction1 = static_cast<float>(1.0 - std::pow(config_.beta1, static_cast<double>(steps_)));
  p.bias_correction2 = static_cast<float>(1.0 - std::pow(config_.beta2, static_cast<double>(steps_)));
  p.grad_scale = static_cast<float>(grad_scale);
  const backend::Stream stream = ops_.default_stream();
  for (const Piece& piece : pieces_) {
    p.weight_decay = piece.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    ops_.adamw_update(params + piece.begin, param_bf16 ? param_bf16 + piece.begin : nullptr, grads + piece.begin,
                      exp_avg_.data() + piece.state, exp_avg_sq_.data() + piece.state, piece.end - piece.begin, p,
                      stream);
  }
}

double clip_factor(double grad_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double factor = max_norm / (grad_norm + 1e-6);
  return factor < 1.0 ? factor : 1.0;
}

}  // namespace mt::optim
