// Unit-by-unit grad reduce-scatter of Megatron-FSDP's grad-sharding strategies (see fsdp_grads.h).
#include "optim/fsdp_grads.h"

#include <algorithm>
#include <string>

#include "core/clock.h"
#include "core/error.h"

namespace mt::optim {
namespace {

constexpr int64_t kFloat = static_cast<int64_t>(sizeof(float));

using Clock = std::chrono::steady_clock;

bool in_root(int layer, int head_layer) { return layer == model::kEmbeddingLayer || layer >= head_layer; }

}  // namespace

std::vector<size_t> unit_buckets(const model::ParamLayout& layout, int layer, int head_layer) {
  std::vector<size_t> buckets;
  for (size_t b = 0; b < layout.buckets.size(); ++b) {
    const int first = layout.buckets[b].first_layer;
    if (first == layer || (in_root(layer, head_layer) && in_root(first, head_layer))) buckets.push_back(b);
  }
  return buckets;
}

UnitGradReducer::UnitGradReducer(const model::ParamLayout& layout, const ReductionGroups& groups,
                                 const backend::Ops& ops, float* grads, backend::ReleasableMemory* grad_pages,
                                 int head_layer, backend::MemoryLedger* ledger, bool overlap)
    : layout_(layout),
      groups_(groups),
      ops_(ops),
      grads_(grads),
      grad_pages_(grad_pages),
      head_layer_(head_layer),
      reductions_(layout.buckets.size(), 0),
      overlap_(overlap),
      requests_(layout.buckets.size()),
      started_(layout.buckets.size()) {
  if (!groups_.tensor_parallel) throw Error("FSDP grad sync", "no tensor-parallel communicator");
  const bool tensor_parallel = groups_.tensor_parallel->size() > 1;
  int64_t side = 0;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const model::GradBucket& bucket = layout_.buckets[b];
    if (bucket.first_layer != bucket.last_layer) {
      throw Error("FSDP grad bucket " + std::to_string(b),
                  "holds layers " + std::to_string(bucket.first_layer) + " to " + std::to_string(bucket.last_layer) +
                      " (FSDP units need one bucket per layer)");
    }
    const model::FlatRange range = owned_range(static_cast<int>(b));
    shard_elements_ += range.end - range.begin;
    if (grad_pages_) grad_pages_->make_resident(range.begin * kFloat, range.end * kFloat);
    if (!tensor_parallel) continue;
    for (const model::ParamEntry& entry : layout_.entries) {
      if (entry.bucket != static_cast<int>(b) || !entry.reduce_over_tensor_parallel) continue;
      const int64_t begin = std::max(range.begin, entry.offset);
      const int64_t end = std::min(range.end, entry.offset + entry.numel);
      if (begin >= end) continue;
      side_pieces_.push_back(SidePiece{b, begin, end - begin, side});
      side += end - begin;
    }
  }
  side_ = backend::DeviceBuffer<float>(ops_, side, backend::MemoryCategory::grads, ledger);
}

model::FlatRange UnitGradReducer::owned_range(int bucket) const {
  const comm::Communicator& group = groups_.of(layout_.buckets.at(static_cast<size_t>(bucket)).group);
  return layout_.bucket_shard(bucket, group.rank(), group.size());
}

void UnitGradReducer::begin_step() {
  const backend::Stream stream = ops_.default_stream();
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const model::FlatRange range = owned_range(static_cast<int>(b));
    if (range.end > range.begin) ops_.zero(grads_ + range.begin, (range.end - range.begin) * kFloat, stream);
  }
  if (!side_.empty()) ops_.zero(side_.data(), side_.bytes(), stream);
  std::fill(reductions_.begin(), reductions_.end(), 0);
  reductions_total_ = 0;
}

void UnitGradReducer::before_backward(int layer) {
  const std::vector<size_t> buckets = unit_buckets(layout_, layer, head_layer_);
  const auto is_in_flight = [&](size_t b) { return std::find(in_flight_.begin(), in_flight_.end(), b) != in_flight_.end(); };
  if (std::any_of(buckets.begin(), buckets.end(), is_in_flight)) complete_in_flight();
  if (!grad_pages_) return;
  for (size_t b : buckets) {
    const model::GradBucket& bucket = layout_.buckets[b];
    // The embedding's backward writes its own grads only (the head's were reduced already).
    if (layer == model::kEmbeddingLayer && bucket.first_layer != layer) continue;
    grad_pages_->make_resident(bucket.begin * kFloat, bucket.padded_end * kFloat);
  }
}

void UnitGradReducer::layer_ready(int layer) {
  complete_in_flight();
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    if (layout_.buckets[b].first_layer == layer) reduce_bucket(b);
  }
}

void UnitGradReducer::reduce_bucket(size_t bucket) {
  const model::GradBucket& b = layout_.buckets[bucket];
  comm::Communicator& tensor_parallel = *groups_.tensor_parallel;
  if (tensor_parallel.size() > 1) {
    for (const model::ParamEntry& entry : layout_.entries) {
      if (entry.bucket == static_cast<int>(bucket) && entry.reduce_over_tensor_parallel) {
        tensor_parallel.all_reduce(grads_ + entry.offset, entry.numel, DType::f32, comm::ReduceOp::sum);
      }
    }
    restore_side(bucket);
  }
  const model::FlatRange shard = owned_range(static_cast<int>(bucket));
  comm::Communicator& group = groups_.of(b.group);
  ++reductions_[bucket];
  ++reductions_total_;
  in_flight_.push_back(bucket);
  if (group.size() > 1) {
    started_[bucket] = Clock::now();
    if (overlap_) {
      requests_[bucket] = group.reduce_scatter_async(grads_ + b.begin, grads_ + shard.begin, shard.end - shard.begin,
                                                     DType::f32, comm::ReduceOp::sum);
    } else {
      group.reduce_scatter(grads_ + b.begin, grads_ + shard.begin, shard.end - shard.begin, DType::f32,
                           comm::ReduceOp::sum);
    }
    const double call = seconds_since(started_[bucket]);  // the call blocks
    reduce_wait_seconds_ += call;
    if (!overlap_) reduce_seconds_ += call;  // a blocking reduction is all wait, as a blocking gather is
  }
  if (!overlap_) complete_in_flight();
}

void UnitGradReducer::complete_in_flight() {
  for (size_t bucket : in_flight_) complete_bucket(bucket);
  in_flight_.clear();
}

void UnitGradReducer::complete_bucket(size_t bucket) {
  if (requests_[bucket]) {
    const Clock::time_point waiting = Clock::now();
    requests_[bucket]->wait();
    requests_[bucket].reset();
    reduce_wait_seconds_ += seconds_since(waiting);
    reduce_seconds_ += seconds_since(started_[bucket]);
  }
  release_outside_shard(bucket);
  if (groups_.tensor_parallel->size() > 1) keep_aside(bucket);
}

// The unit's full-size grads outside the shard are spent: the next micro-batch's backward starts
// from zero there.
void UnitGradReducer::release_outside_shard(size_t bucket) {
  const model::GradBucket& b = layout_.buckets[bucket];
  const model::FlatRange shard = owned_range(static_cast<int>(bucket));
  const model::FlatRange outside[] = {{b.begin, shard.begin}, {shard.end, b.padded_end}};
  for (const model::FlatRange& range : outside) {
    if (range.end <= range.begin) continue;
    if (grad_pages_) {
      ops_.synchronize(ops_.default_stream());  // the reduction has read them
      grad_pages_->release(range.begin * kFloat, range.end * kFloat);
    } else {
      ops_.zero(grads_ + range.begin, (range.end - range.begin) * kFloat, ops_.default_stream());
    }
  }
}

// The shard of the bucket's TP-reduced tensors, accumulated so far, back in place (after the TP
// all-reduce of this micro-batch's partial grads, before the reduce-scatter).
void UnitGradReducer::restore_side(size_t bucket) {
  for (const SidePiece& piece : side_pieces_) {
    if (piece.bucket == bucket) ops_.add_inplace(grads_ + piece.flat, side_.data() + piece.side, piece.count, ops_.default_stream());
  }
}

// The same shard aside again, its place zeroed for the next micro-batch's partial grads.
void UnitGradReducer::keep_aside(size_t bucket) {
  const backend::Stream stream = ops_.default_stream();
  for (const SidePiece& piece : side_pieces_) {
    if (piece.bucket != bucket) continue;
    ops_.copy(side_.data() + piece.side, grads_ + piece.flat, piece.count * kFloat, backend::CopyKind::device_to_device,
              stream);
    ops_.zero(grads_ + piece.flat, piece.count * kFloat, stream);
  }
}

void UnitGradReducer::finish() {
  complete_in_flight();
  const auto [fewest, most] = std::minmax_element(reductions_.begin(), reductions_.end());
  if (!reductions_.empty() && *fewest != *most) {
    throw Error("FSDP grad sync", "units were reduced between " + std::to_string(*fewest) + " and " +
                                      std::to_string(*most) + " times in one step (each once per micro-batch)");
  }
  for (size_t b = 0; b < layout_.buckets.size(); ++b) restore_side(b);
  if (!side_.empty()) ops_.zero(side_.data(), side_.bytes(), ops_.default_stream());
}

}  // namespace mt::optim
