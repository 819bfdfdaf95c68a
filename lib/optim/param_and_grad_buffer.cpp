// Bucketed grad reduction and parameter gather (see param_and_grad_buffer.h).
#include "optim/param_and_grad_buffer.h"

#include <algorithm>

#include "core/error.h"

namespace mt::optim {

comm::Communicator& ReductionGroups::of(model::DataParallelGroup group) const {
  comm::Communicator* communicator = group == model::DataParallelGroup::expert ? expert : dense;
  if (!communicator) {
    throw Error(group == model::DataParallelGroup::expert ? "expert-DP group" : "DP x CP group",
                "no communicator for this reduction group");
  }
  return *communicator;
}

ReductionGroups ReductionGroups::of(const parallel::ProcessGroups& groups) {
  return ReductionGroups{&groups.data(parallel::GroupKind::dp_cp), &groups.data(parallel::GroupKind::expert_dp),
                         &groups.data(parallel::GroupKind::tp)};
}

ReductionGroups ReductionGroups::single(comm::Communicator& only) { return ReductionGroups{&only, &only, &only}; }

ParamAndGradBuffer::ParamAndGradBuffer(const model::ParamLayout& layout, const ReductionGroups& groups, bool shard,
                                       bool overlap_grad_reduce)
    : layout_(layout),
      groups_(groups),
      shard_(shard),
      overlap_(overlap_grad_reduce),
      armed_(layout.chunks.size(), false),
      started_(layout.buckets.size(), false),
      gathers_(layout.buckets.size()) {
  if (!groups_.tensor_parallel) throw Error("grad sync", "no tensor-parallel communicator");
  for (size_t b = 0; b < layout_.buckets.size(); ++b) owned_range(static_cast<int>(b));  // checks the padding
}

ParamAndGradBuffer::~ParamAndGradBuffer() {
  // Requests wait when destroyed; the buffers they write must still be alive, so wait here, first.
  for (auto& gather : gathers_) gather.reset();
  reductions_.clear();
}

comm::Communicator& ParamAndGradBuffer::group(int bucket) const {
  return groups_.of(layout_.buckets.at(static_cast<size_t>(bucket)).group);
}

model::FlatRange ParamAndGradBuffer::owned_range(int bucket) const {
  const model::GradBucket& b = layout_.buckets.at(static_cast<size_t>(bucket));
  if (!shard_) return {b.begin, b.padded_end};
  const comm::Communicator& communicator = group(bucket);
  return layout_.bucket_shard(bucket, communicator.rank(), communicator.size());
}

bool ParamAndGradBuffer::gathers(int bucket) const { return shard_ && group(bucket).size() > 1; }

bool ParamAndGradBuffer::gathers_any() const {
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    if (gathers(static_cast<int>(b))) return true;
  }
  return false;
}

void ParamAndGradBuffer::begin_grad_sync(float* grads) {
  if (!reductions_.empty()) throw Error("grad sync", "a step began with reductions still in flight");
  grads_ = grads;
  armed_.assign(layout_.chunks.size(), false);
  started_.assign(layout_.buckets.size(), false);
}

void ParamAndGradBuffer::arm(int chunk) {
  if (chunk < 0 || chunk >= static_cast<int>(armed_.size())) {
    throw Error("grad sync", "model chunk " + std::to_string(chunk) + " outside the layout");
  }
  armed_[static_cast<size_t>(chunk)] = overlap_;
}

void ParamAndGradBuffer::layer_ready(int layer) {
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const model::GradBucket& bucket = layout_.buckets[b];
    if (!started_[b] && armed_[static_cast<size_t>(bucket.chunk)] && bucket.first_layer == layer) start_bucket(b);
  }
}

int ParamAndGradBuffer::started_buckets() const {
  return static_cast<int>(std::count(started_.begin(), started_.end(), true));
}

void ParamAndGradBuffer::start_bucket(size_t bucket) {
  started_[bucket] = true;
  const model::GradBucket& b = layout_.buckets[bucket];
  comm::Communicator& tensor_parallel = *groups_.tensor_parallel;
  if (tensor_parallel.size() > 1) {
    for (const model::ParamEntry& entry : layout_.entries) {
      if (entry.bucket == static_cast<int>(bucket) && entry.reduce_over_tensor_parallel) {
        tensor_parallel.all_reduce(grads_ + entry.offset, entry.numel, DType::f32, comm::ReduceOp::sum);
      }
    }
  }
  comm::Communicator& communicator = group(static_cast<int>(bucket));
  if (communicator.size() == 1) return;
  if (shard_) {
    const model::FlatRange shard = owned_range(static_cast<int>(bucket));
    reductions_.push_back(communicator.reduce_scatter_async(grads_ + b.begin, grads_ + shard.begin,
                                                            shard.end - shard.begin, DType::f32, comm::ReduceOp::sum));
  } else {
    reductions_.push_back(
        communicator.all_reduce_async(grads_ + b.begin, b.end - b.begin, DType::f32, comm::ReduceOp::sum));
  }
}

void ParamAndGradBuffer::finish_grad_sync() {
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    if (!started_[b]) start_bucket(b);
  }
  for (auto& request : reductions_) request->wait();
  reductions_.clear();
  armed_.assign(layout_.chunks.size(), false);
}

void ParamAndGradBuffer::gather_parameters(float* params) {
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    if (!gathers(static_cast<int>(b))) continue;
    const model::FlatRange shard = owned_range(static_cast<int>(b));
    group(static_cast<int>(b)).all_gather(params + shard.begin, params + layout_.buckets[b].begin,
                                          shard.end - shard.begin, DType::f32);
  }
}

void ParamAndGradBuffer::start_parameter_gather(float* params) {
  if (gathers_in_flight_ > 0) throw Error("parameter gather", "started with gathers of the last step still in flight");
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    if (!gathers(static_cast<int>(b))) continue;
    const model::FlatRange shard = owned_range(static_cast<int>(b));
    gathers_[b] = group(static_cast<int>(b)).all_gather_async(params + shard.begin, params + layout_.buckets[b].begin,
                                                              shard.end - shard.begin, DType::f32);
    ++gathers_in_flight_;
  }
}

bool ParamAndGradBuffer::finish_parameter_gather(int bucket) {
  std::unique_ptr<comm::Request>& gather = gathers_.at(static_cast<size_t>(bucket));
  if (!gather) return false;
  gather->wait();
  gather.reset();
  --gathers_in_flight_;
  return true;
}

}  // namespace mt::optim
