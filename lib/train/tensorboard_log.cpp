// Megatron's TensorBoard scalars (see tensorboard_log.h).
#include "train/tensorboard_log.h"

#include <algorithm>

#include "core/error.h"

namespace mt::train {

namespace {

bool is_samples_tag(const std::string& tag) {
  const std::string suffix = " vs samples";
  return tag.size() >= suffix.size() && tag.compare(tag.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What TensorBoard's reader keeps of earlier event files, in file order: scalars, less those a
// SessionLog START purges (every tag's steps from the START's step on).
std::vector<io::Event> visible_scalars(const std::vector<std::string>& files) {
  std::vector<io::Event> kept;
  for (const std::string& file : files) {
    for (io::Event& event : io::read_event_file(file)) {
      if (event.kind == io::Event::Kind::session_start) {
        const int64_t from = event.step;
        kept.erase(std::remove_if(kept.begin(), kept.end(), [from](const io::Event& e) { return e.step >= from; }),
                   kept.end());
      } else if (event.kind == io::Event::Kind::scalar) {
        kept.push_back(std::move(event));
      }
    }
  }
  return kept;
}

}  // namespace

void validate(const TensorBoardOptions& o) {
  if (o.log_interval < 1) {
    throw UsageError("--tensorboard-log-interval", "must be at least 1, not " + std::to_string(o.log_interval));
  }
  if (o.queue_size < 1) {
    throw UsageError("--tensorboard-queue-size", "must be at least 1, not " + std::to_string(o.queue_size));
  }
  if (o.timers_interval < 1) throw UsageError("--log-interval", "must be at least 1, not " + std::to_string(o.timers_interval));
}

TensorBoardLog::TensorBoardLog(const TensorBoardOptions& options, std::function<AllocatorMemory()> memory)
    : options_(options), memory_(std::move(memory)) {
  validate(options_);
  if (options_.log_memory && !memory_) throw std::logic_error("TensorBoardLog: log_memory without a memory source");
  writer_ = std::make_unique<io::EventFileWriter>(options_.dir, options_.queue_size);
}

void TensorBoardLog::resume(int64_t iteration, int64_t consumed_samples) {
  std::vector<std::string> earlier = io::event_files(options_.dir);
  earlier.erase(std::remove(earlier.begin(), earlier.end(), writer_->path()), earlier.end());
  const std::vector<io::Event> visible = visible_scalars(earlier);
  const double now = io::wall_time_now();
  writer_->add_session_start(iteration + 1, now);
  for (const io::Event& event : visible) {
    if (is_samples_tag(event.tag) && event.step > iteration && event.step <= consumed_samples) writer_->add_event(event);
  }
  consumed_samples_ = consumed_samples;
  writer_->flush();
}

void TensorBoardLog::scalar(const std::string& tag, double value, int64_t step) {
  writer_->add_scalar(tag, value, step, io::wall_time_now());
}

void TensorBoardLog::scalar_and_samples(const std::string& tag, double value, const StepStats& s) {
  scalar(tag, value, s.iteration);
  scalar(tag + " vs samples", value, s.consumed_samples);
}

void TensorBoardLog::step(const StepStats& s) {
  consumed_samples_ = s.consumed_samples;
  if (s.iteration % options_.log_interval == 0) write_step_scalars(s);
  add_timing(s);
  if (s.iteration % options_.timers_interval == 0 || first_step_) {
    write_timing(s);
    writer_->flush();
  }
  first_step_ = false;
}

// training_log()'s scalars, in its order.
void TensorBoardLog::write_step_scalars(const StepStats& s) {
  scalar_and_samples("learning-rate", s.lr, s);
  scalar_and_samples("batch-size", s.global_batch_size, s);
  scalar_and_samples("lm loss", s.lm_loss, s);
  if (s.sop_loss) scalar_and_samples("sop loss", *s.sop_loss, s);  // BERT: pretrain_bert.py's second loss
  if (s.moe) write_moe_scalars(*s.moe, s.iteration);
  // track_mtp_metrics()'s scalars: "mtp_<k> loss" per depth.
  for (size_t k = 0; k < s.mtp_losses.size(); ++k) scalar("mtp_" + std::to_string(k + 1) + " loss", s.mtp_losses[k], s.iteration);
  if (options_.log_loss_scale) scalar_and_samples("loss-scale", s.loss_scale, s);
  if (!s.skipped) scalar_and_samples("grad-norm", s.grad_norm, s);  // Megatron's optimizer returns none then
  if (s.num_zeros) scalar_and_samples("num-zeros", static_cast<double>(*s.num_zeros), s);
  if (s.params_norm) scalar_and_samples("params-norm", *s.params_norm, s);
  if (options_.log_memory) {
    const AllocatorMemory m = memory_();
    scalar("mem-reserved-bytes", static_cast<double>(m.reserved_bytes), s.iteration);
    scalar("mem-allocated-bytes", static_cast<double>(m.allocated_bytes), s.iteration);
    scalar("mem-max-allocated-bytes", static_cast<double>(m.max_allocated_bytes), s.iteration);
    scalar("mem-allocated-count", static_cast<double>(m.allocated_count), s.iteration);
  }
}

// track_moe_metrics()'s scalars: each loss's mean over the MoE layers, and with
// --moe-per-layer-logging every MoE layer's as moe/<name>_layer_<i> (i: the decoder layer, from 0,
// as Megatron's tracker indexes it).
void TensorBoardLog::write_moe_scalars(const MoeStepStats& moe, int64_t iteration) {
  const auto write = [&](const std::string& name, double mean, double MoeLayerStats::*per_layer) {
    scalar(name, mean, iteration);
    if (!moe.per_layer_losses) return;
    for (const MoeLayerStats& layer : moe.layers) {
      scalar("moe/" + name + "_layer_" + std::to_string(layer.layer), layer.*per_layer, iteration);
    }
  };
  if (!moe.balancing_name.empty()) write(moe.balancing_name, moe.balancing_loss, &MoeLayerStats::load_balancing_loss);
  if (moe.z_loss) write("z_loss", *moe.z_loss, &MoeLayerStats::z_loss);
}

void TensorBoardLog::add_timing(const StepStats& s) {
  ++window_steps_;
  window_seconds_ += s.step_ms / 1e3;
  window_teraflops_ += s.tflops_per_device * s.step_ms / 1e3;
  for (const TimerReading& timer : s.timers) {
    if (!window_timer_rank_seconds_.count(timer.name)) timer_order_.push_back(timer.name);
    std::vector<double>& sums = window_timer_rank_seconds_[timer.name];
    if (sums.size() < timer.rank_ms.size()) sums.resize(timer.rank_ms.size(), 0.0);
    for (size_t rank = 0; rank < timer.rank_ms.size(); ++rank) sums[rank] += timer.rank_ms[rank] / 1e3;
  }
}

// The log block's scalars: iteration-time (not at the run's first iteration), throughput, timers.
// The window restarts after each write except the first iteration's, as Megatron's timers do.
void TensorBoardLog::write_timing(const StepStats& s) {
  if (options_.log_timers) {
    if (!first_step_) scalar("iteration-time", window_seconds_ / static_cast<double>(window_steps_), s.iteration);
    if (options_.log_throughput && window_seconds_ > 0) scalar("throughput", window_teraflops_ / window_seconds_, s.iteration);
    for (const std::string& name : timer_order_) {  // the max over ranks of each rank's sum
      const std::vector<double>& sums = window_timer_rank_seconds_[name];
      const double largest = sums.empty() ? 0.0 : *std::max_element(sums.begin(), sums.end());
      scalar(name + "-time", largest / options_.timers_interval, s.iteration);
    }
  }
  if (first_step_) return;
  window_steps_ = 0;
  window_seconds_ = window_teraflops_ = 0;
  window_timer_rank_seconds_.clear();
  timer_order_.clear();
}

void TensorBoardLog::eval(const EvalStats& e) {
  scalar("lm loss validation", e.lm_loss, e.iteration);
  scalar("lm loss validation vs samples", e.lm_loss, consumed_samples_);
  if (e.sop_loss) {
    scalar("sop loss validation", *e.sop_loss, e.iteration);
    scalar("sop loss validation vs samples", *e.sop_loss, consumed_samples_);
  }
  if (options_.log_validation_ppl) {
    scalar("lm loss validation ppl", e.ppl, e.iteration);
    scalar("lm loss validation ppl vs samples", e.ppl, consumed_samples_);
  }
}

}  // namespace mt::train
