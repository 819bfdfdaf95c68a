// Unit-by-unit parameter gathers of Megatron-FSDP's optim_grads_params (see fsdp_params.h).
#include "optim/fsdp_params.h"

#include <algorithm>
#include <string>

#include "core/clock.h"
#include "core/error.h"
#include "optim/fsdp_grads.h"

namespace mt::optim {
namespace {

constexpr int64_t kFloat = static_cast<int64_t>(sizeof(float));
using Clock = std::chrono::steady_clock;

}  // namespace

UnitParamGatherer::UnitParamGatherer(const model::ParamLayout& layout, const ReductionGroups& groups,
                                     const backend::Ops& ops, float* params, backend::ReleasableMemory* param_pages,
                                     model::GemmWeights* gemm_weights, int head_layer, bool prefetch)
    : layout_(layout),
      groups_(groups),
      ops_(ops),
      params_(params),
      param_pages_(param_pages),
      gemm_weights_(gemm_weights),
      head_layer_(head_layer),
      prefetch_(prefetch),
      first_layer_(layout.first_layer),
      last_layer_(layout.last_layer),
      state_(layout.buckets.size(), State::gathered),
      requests_(layout.buckets.size()),
      started_(layout.buckets.size()),
      start_call_seconds_(layout.buckets.size()) {
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const model::GradBucket& bucket = layout_.buckets[b];
    if (bucket.first_layer != bucket.last_layer) {
      throw Error("FSDP parameter bucket " + std::to_string(b), "holds several layers (FSDP units need one bucket per layer)");
    }
    const comm::Communicator& group = groups_.of(bucket.group);
    const model::FlatRange shard = layout_.bucket_shard(static_cast<int>(b), group.rank(), group.size());
    if (param_pages_) param_pages_->make_resident(shard.begin * kFloat, shard.end * kFloat);
  }
  release_all();
}

UnitParamGatherer::~UnitParamGatherer() {
  for (auto& request : requests_) {
    if (request) request->wait();
  }
}

int UnitParamGatherer::resident_buckets() const {
  return static_cast<int>(std::count(state_.begin(), state_.end(), State::gathered));
}

int UnitParamGatherer::next_unit(int layer, int direction) const {
  const bool root = layer == model::kEmbeddingLayer || layer >= head_layer_;
  if (direction > 0) {
    if (layer == model::kEmbeddingLayer) return first_layer_ < last_layer_ ? first_layer_ : kNoUnit;
    if (root || layer + 1 >= last_layer_) return kNoUnit;  // the root stays gathered through the forward
    return layer + 1;
  }
  if (layer >= head_layer_) return last_layer_ > first_layer_ ? last_layer_ - 1 : kNoUnit;
  if (root || layer - 1 < first_layer_) return kNoUnit;
  return layer - 1;
}

void UnitParamGatherer::before_forward(int layer) {
  gather(layer, true);
  if (prefetch_) {
    const int next = next_unit(layer, +1);
    if (next != kNoUnit) gather(next, false);
  }
}

void UnitParamGatherer::before_backward(int layer) {
  gather(layer, true);
  if (prefetch_) {
    const int next = next_unit(layer, -1);
    if (next != kNoUnit) gather(next, false);
  }
}

void UnitParamGatherer::after_forward(int layer) {
  if (layer == model::kEmbeddingLayer || layer >= head_layer_) return;  // the root: until the embedding's backward
  for (size_t b : unit_buckets(layout_, layer, head_layer_)) release_bucket(b, false);
}

void UnitParamGatherer::after_backward(int layer) {
  if (layer >= head_layer_) return;  // the root: the embedding's backward comes last
  for (size_t b : unit_buckets(layout_, layer, head_layer_)) release_bucket(b, false);
}

void UnitParamGatherer::release_all() {
  // Released buckets too: whatever was written outside the shards since (a load) goes.
  for (size_t b = 0; b < layout_.buckets.size(); ++b) release_bucket(b, true);
}

void UnitParamGatherer::gather(int layer, bool wait) {
  for (size_t b : unit_buckets(layout_, layer, head_layer_)) {
    const bool starts = state_[b] == State::released;
    if (starts) {
      start_bucket(b);
      ++gathers_;
      if (!wait) ++prefetched_;
    }
    if (wait && state_[b] == State::in_flight) finish_bucket(b, /*blocked_throughout=*/starts);
  }
}

void UnitParamGatherer::start_bucket(size_t bucket) {
  const model::GradBucket& b = layout_.buckets[bucket];
  comm::Communicator& group = groups_.of(b.group);
  state_[bucket] = State::in_flight;
  if (group.size() == 1) return;  // the shard is the whole bucket
  // The gather writes every element of the bucket: its pages need not be zeroed first.
  if (param_pages_) {
    param_pages_->make_resident(b.begin * kFloat, b.padded_end * kFloat,
                                backend::ReleasableMemory::Contents::overwritten);
  }
  const model::FlatRange shard = layout_.bucket_shard(static_cast<int>(bucket), group.rank(), group.size());
  started_[bucket] = Clock::now();
  requests_[bucket] = group.all_gather_async(params_ + shard.begin, params_ + b.begin, shard.end - shard.begin, DType::f32);
  start_call_seconds_[bucket] = seconds_since(started_[bucket]);  // the call blocks
}

void UnitParamGatherer::finish_bucket(size_t bucket, bool blocked_throughout) {
  if (requests_[bucket]) {
    const Clock::time_point waiting = Clock::now();
    requests_[bucket]->wait();
    requests_[bucket].reset();
    const Clock::time_point done = Clock::now();
    const double gather = seconds_between(started_[bucket], done);
    gather_seconds_ += gather;
    // A gather waited for as soon as it started is all wait, the moments between the two calls
    // (in which a loaded machine may deschedule the rank) included.
    gather_wait_seconds_ += blocked_throughout ? gather : start_call_seconds_[bucket] + seconds_between(waiting, done);
  }
  state_[bucket] = State::gathered;
  const model::GradBucket& b = layout_.buckets[bucket];
  if (gemm_weights_) gemm_weights_->refresh(params_, b.begin, b.padded_end);
}

void UnitParamGatherer::release_bucket(size_t bucket, bool force) {
  if (state_[bucket] == State::released && !force) return;
  if (state_[bucket] == State::in_flight) finish_bucket(bucket, /*blocked_throughout=*/false);
  const model::GradBucket& b = layout_.buckets[bucket];
  const comm::Communicator& group = groups_.of(b.group);
  const model::FlatRange shard = layout_.bucket_shard(static_cast<int>(bucket), group.rank(), group.size());
  const model::FlatRange outside[] = {{b.begin, shard.begin}, {shard.end, b.padded_end}};
  ops_.synchronize(ops_.default_stream());  // the unit's compute has read them
  for (const model::FlatRange& range : outside) {
    if (range.end <= range.begin) continue;
    if (param_pages_) {
      param_pages_->release(range.begin * kFloat, range.end * kFloat);
    } else {
      ops_.zero(params_ + range.begin, (range.end - range.begin) * kFloat, ops_.default_stream());
    }
  }
  state_[bucket] = State::released;
}

}  // namespace mt::optim
