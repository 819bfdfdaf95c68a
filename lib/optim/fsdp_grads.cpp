// Unit-by-unit grad reduce-scatter of Megatron-FSDP's optim_grads (see fsdp_grads.h).
#include "optim/fsdp_grads.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace mt::optim {

UnitGradReducer::UnitGradReducer(const model::ParamLayout& layout, const ReductionGroups& groups,
                                 const backend::Ops& ops, float* grads, backend::MemoryLedger* ledger)
    : layout_(layout), groups_(groups), ops_(ops), grads_(grads), reductions_(layout.buckets.size(), 0) {
  if (!groups_.tensor_parallel) throw Error("FSDP grad sync", "no tensor-parallel communicator");
  int64_t elements = 0;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const model::GradBucket& bucket = layout_.buckets[b];
    if (bucket.first_layer != bucket.last_layer) {
      throw Error("FSDP grad bucket " + std::to_string(b),
                  "holds layers " + std::to_string(bucket.first_layer) + " to " + std::to_string(bucket.last_layer) +
                      " (FSDP units need one bucket per layer)");
    }
    const model::FlatRange range = owned_range(static_cast<int>(b));
    shard_offset_.push_back(elements);
    elements += range.end - range.begin;
  }
  shard_ = backend::DeviceBuffer<float>(ops_, elements, backend::MemoryCategory::grads, ledger);
}

model::FlatRange UnitGradReducer::owned_range(int bucket) const {
  const comm::Communicator& group = groups_.of(layout_.buckets.at(static_cast<size_t>(bucket)).group);
  return layout_.bucket_shard(bucket, group.rank(), group.size());
}

void UnitGradReducer::begin_step() {
  if (!shard_.empty()) ops_.zero(shard_.data(), shard_.bytes(), ops_.default_stream());
  std::fill(reductions_.begin(), reductions_.end(), 0);
  reductions_total_ = 0;
}

void UnitGradReducer::layer_ready(int layer) {
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
  }
  const model::FlatRange shard = owned_range(static_cast<int>(bucket));
  const int64_t n = shard.end - shard.begin;
  comm::Communicator& group = groups_.of(b.group);
  if (group.size() > 1) {
    group.reduce_scatter(grads_ + b.begin, grads_ + shard.begin, n, DType::f32, comm::ReduceOp::sum);
  }
  const backend::Stream stream = ops_.default_stream();
  if (n > 0) ops_.add_inplace(shard_.data() + shard_offset_[bucket], grads_ + shard.begin, n, stream);
  // The unit's full-size grads are spent: the next micro-batch's backward starts from zero.
  ops_.zero(grads_ + b.begin, (b.padded_end - b.begin) * static_cast<int64_t>(sizeof(float)), stream);
  ++reductions_[bucket];
  ++reductions_total_;
}

void UnitGradReducer::finish() {
  const auto [fewest, most] = std::minmax_element(reductions_.begin(), reductions_.end());
  if (!reductions_.empty() && *fewest != *most) {
    throw Error("FSDP grad sync", "units were reduced between " + std::to_string(*fewest) + " and " +
                                      std::to_string(*most) + " times in one step (each once per micro-batch)");
  }
  const backend::Stream stream = ops_.default_stream();
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const model::FlatRange shard = owned_range(static_cast<int>(b));
    const int64_t n = shard.end - shard.begin;
    if (n > 0) {
      ops_.copy(grads_ + shard.begin, shard_.data() + shard_offset_[b], n * static_cast<int64_t>(sizeof(float)),
                backend::CopyKind::device_to_device, stream);
    }
  }
}

}  // namespace mt::optim
