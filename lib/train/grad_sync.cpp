// Data-parallel grad reduction in buckets (see grad_sync.h).
#include "train/grad_sync.h"

#include "core/error.h"

namespace mt::train {

GradSync::GradSync(const model::ParamLayout& layout, comm::Communicator& data_parallel,
                   comm::Communicator& tensor_parallel, bool distributed_optimizer, bool overlap)
    : layout_(layout),
      data_parallel_(data_parallel),
      tensor_parallel_(tensor_parallel),
      distributed_optimizer_(distributed_optimizer),
      overlap_(overlap),
      armed_(layout.chunks.size(), false),
      started_(layout.buckets.size(), false) {
  if (distributed_optimizer_) layout_.data_parallel_shard(data_parallel_.rank(), data_parallel_.size());  // checks padding
}

std::vector<model::FlatRange> GradSync::owned_ranges() const {
  if (!distributed_optimizer_) return {model::FlatRange{0, layout_.total_elements}};
  return layout_.data_parallel_shard(data_parallel_.rank(), data_parallel_.size());
}

void GradSync::begin(float* grads) {
  if (!in_flight_.empty()) throw Error("grad sync", "a step began with reductions still in flight");
  grads_ = grads;
  armed_.assign(layout_.chunks.size(), false);
  started_.assign(layout_.buckets.size(), false);
}

void GradSync::arm(int chunk) {
  if (chunk < 0 || chunk >= static_cast<int>(armed_.size())) {
    throw Error("grad sync", "model chunk " + std::to_string(chunk) + " outside the layout");
  }
  armed_[static_cast<size_t>(chunk)] = overlap_;
}

void GradSync::layer_ready(int layer) {
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const model::GradBucket& bucket = layout_.buckets[b];
    if (!started_[b] && armed_[static_cast<size_t>(bucket.chunk)] && bucket.first_layer == layer) start_bucket(b);
  }
}

void GradSync::start_bucket(size_t bucket) {
  started_[bucket] = true;
  const model::GradBucket& b = layout_.buckets[bucket];
  if (tensor_parallel_.size() > 1) {
    for (const model::ParamEntry& entry : layout_.entries) {
      if (entry.bucket == static_cast<int>(bucket) && entry.reduce_over_tensor_parallel) {
        tensor_parallel_.all_reduce(grads_ + entry.offset, entry.numel, DType::f32, comm::ReduceOp::sum);
      }
    }
  }
  if (data_parallel_.size() == 1) return;
  if (distributed_optimizer_) {
    const model::FlatRange shard =
        layout_.bucket_shard(static_cast<int>(bucket), data_parallel_.rank(), data_parallel_.size());
    in_flight_.push_back(data_parallel_.reduce_scatter_async(grads_ + b.begin, grads_ + shard.begin,
                                                             shard.end - shard.begin, DType::f32, comm::ReduceOp::sum));
  } else {
    in_flight_.push_back(data_parallel_.all_reduce_async(grads_ + b.begin, b.end - b.begin, DType::f32,
                                                         comm::ReduceOp::sum));
  }
}

void GradSync::finish() {
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    if (!started_[b]) start_bucket(b);
  }
  for (auto& request : in_flight_) request->wait();
  in_flight_.clear();
  armed_.assign(layout_.chunks.size(), false);
}

void GradSync::gather_parameters(float* params) {
  if (!distributed_optimizer_ || data_parallel_.size() == 1) return;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const model::FlatRange shard =
        layout_.bucket_shard(static_cast<int>(b), data_parallel_.rank(), data_parallel_.size());
    data_parallel_.all_gather(params + shard.begin, params + layout_.buckets[b].begin, shard.end - shard.begin,
                              DType::f32);
  }
}

}  // namespace mt::train
