// The parameter layout table (see layout.h).
#include "model/layout.h"

#include <algorithm>

#include "core/error.h"
#include "parallel/pipeline_layers.h"

namespace mt::model {
namespace {

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Collects the blocks' declarations of one chunk, computing each tensor's TP shard and copies.
class Collector : public ParamDeclarations {
 public:
  Collector(const parallel::ParallelConfig& parallel, const parallel::RankCoordinates& rank,
            std::vector<DeclaredParam>& declared)
      : parallel_(parallel), rank_(rank), declared_(declared) {}

  void set_chunk(int chunk) { chunk_ = chunk; }
  void begin_group() override { ++group_; }

  void add(const ParamDeclaration& declaration) override {
    const std::string& name = declaration.name;
    const std::vector<int64_t>& shape = declaration.shape;
    const TensorSplit split = declaration.split;
    if (declaration.init.kind == Init::Kind::unset) throw Error("parameter " + name, "declared without an init");
    const bool expert = declaration.expert >= 0;
    if (expert && !held_by_this_expert_rank(declaration)) return;
    // Expert tensors are split over expert-TP, the rest over TP.
    const int tp = expert ? parallel_.expert_tensor_parallel() : parallel_.tensor_model_parallel_size;
    const int tp_rank = expert ? rank_.expert_tp : rank_.tp;
    const char* tp_flag = expert ? "--expert-tensor-parallel-size " : "--tensor-model-parallel-size ";
    ParamEntry entry;
    entry.name = name;
    entry.global_shape = shape;
    entry.split = split;
    entry.layer = declaration.layer;
    entry.chunk = chunk_;
    entry.weight_decay = shape.size() >= 2;
    entry.init = declaration.init;
    entry.local_shape = shape;
    if (split != TensorSplit::replicated && tp > 1) {
      const int dim = split == TensorSplit::column_parallel ? 0 : 1;
      const int64_t unit = declaration.unit;
      if (static_cast<int>(shape.size()) <= dim || shape[dim] % (tp * unit) != 0) {
        const std::string what = declaration.unit_flag.empty() ? "dimension " + std::to_string(dim) + " of " + name
                                                               : declaration.unit_flag;
        throw UsageError(tp_flag + std::to_string(tp),
                         "does not divide " + what + (unit > 1 ? " (TP splits by whole heads)" : ""));
      }
      entry.shard_dim = dim;
      entry.shard_extent = shape[dim] / tp;
      entry.shard_offset = entry.shard_extent * tp_rank;
      entry.local_shape[dim] = entry.shard_extent;
    } else {
      entry.shard_extent = shape.empty() ? 1 : shape[0];
    }
    entry.numel = 1;
    for (int64_t extent : entry.local_shape) entry.numel *= extent;

    const bool replicated = split == TensorSplit::replicated;
    entry.replica = replicated ? rank_.tp : 0;
    entry.tied_copy = declaration.tied_copy;
    if (entry.tied_copy) entry.replica = 1;
    const bool sequence_parallel = parallel_.sequence_parallel && tp > 1;
    entry.reduce_over_tensor_parallel = sequence_parallel && replicated && !declaration.full_rows;
    entry.reduce_over_embedding_group = declaration.tied_embedding && parallel_.pipeline_model_parallel_size > 1;
    if (expert) entry.data_parallel_group = DataParallelGroup::expert;
    declared_.push_back(DeclaredParam{std::move(entry), group_});
  }

 private:
  bool held_by_this_expert_rank(const ParamDeclaration& declaration) const {
    const int ep = parallel_.expert_model_parallel_size;
    if (declaration.num_experts <= 0 || declaration.num_experts % ep != 0 || declaration.expert >= declaration.num_experts) {
      throw UsageError("--expert-model-parallel-size " + std::to_string(ep),
                       "does not divide --num-experts " + std::to_string(declaration.num_experts));
    }
    return declaration.expert / (declaration.num_experts / ep) == rank_.ep;
  }

  const parallel::ParallelConfig& parallel_;
  const parallel::RankCoordinates& rank_;
  std::vector<DeclaredParam>& declared_;
  int chunk_ = 0;
  int group_ = 0;
};

// A fused group of one chunk and reduction group: its tensors (indices into the declarations).
struct FusedGroup {
  std::vector<size_t> tensors;
  int64_t elements = 0;
  bool own_bucket = false;  // a tied word embedding shared between pipeline stages
  int layer = 0;            // the layer id of its tensors (one block's)
};

// The fused groups of chunk `chunk` in reduction group `group`, in forward order.
std::vector<FusedGroup> fused_groups(const std::vector<DeclaredParam>& declared, int chunk, DataParallelGroup group) {
  std::vector<FusedGroup> groups;
  const DeclaredParam* previous = nullptr;  // the chunk's tensor declared before, of any group
  for (size_t i = 0; i < declared.size(); ++i) {
    const ParamEntry& entry = declared[i].entry;
    if (entry.chunk != chunk) continue;
    const bool continues = previous && previous->fused_group == declared[i].fused_group;
    if (continues && previous->entry.data_parallel_group != entry.data_parallel_group) {
      throw Error("parameter " + entry.name, "fused with " + previous->entry.name + " of another reduction group");
    }
    previous = &declared[i];
    if (entry.data_parallel_group != group) continue;
    if (!continues) groups.push_back(FusedGroup{{}, 0, entry.reduce_over_embedding_group, entry.layer});
    groups.back().tensors.push_back(i);
    groups.back().elements += entry.numel;
  }
  return groups;
}

// Groups fused groups in buckets: walks them in backward order, closing a bucket once it holds
// `bucket_elements` (and, `per_layer`, where the layer id changes); a group marked own_bucket is a
// bucket of its own. Returns, per group, its
// bucket number counted from the end (0 = the first bucket backward completes).
std::vector<int> assign_buckets(const std::vector<FusedGroup>& groups, int64_t bucket_elements, bool per_layer) {
  std::vector<int> bucket_from_end(groups.size(), 0);
  int bucket = 0;
  int64_t filled = 0;
  for (size_t k = groups.size(); k-- > 0;) {
    const bool alone = groups[k].own_bucket;
    const bool new_layer = per_layer && k + 1 < groups.size() && groups[k].layer != groups[k + 1].layer;
    if ((alone || new_layer || (bucket_elements > 0 && filled >= bucket_elements)) && filled > 0) {
      ++bucket;
      filled = 0;
    }
    bucket_from_end[k] = bucket;
    filled += groups[k].elements;
    if (alone) {
      ++bucket;
      filled = 0;
    }
  }
  return bucket_from_end;
}

// Lays one reduction group's part of chunk `chunk` out from `offset` (a multiple of the group's
// padding): its buckets, each fused group aligned, each bucket's end padded. Returns the offset
// after the last bucket.
int64_t lay_out_group(const std::vector<DeclaredParam>& declared, const std::vector<FusedGroup>& groups, int chunk,
                      DataParallelGroup group, const BucketOptions& options, int64_t offset, ParamLayout& layout) {
  const int64_t pad = options.pad(group);
  const std::vector<int> from_end = assign_buckets(groups, options.bucket_elements, options.bucket_per_layer);
  const int group_buckets = from_end.empty() ? 0 : from_end.front() + 1;
  const int first_bucket = static_cast<int>(layout.buckets.size());
  for (int b = 0; b < group_buckets; ++b) layout.buckets.push_back(GradBucket{chunk, group});
  for (size_t g = 0; g < groups.size(); ++g) {
    const int bucket = first_bucket + (group_buckets - 1 - from_end[g]);
    GradBucket& current = layout.buckets[static_cast<size_t>(bucket)];
    const bool opens_bucket = g == 0 || from_end[g] != from_end[g - 1];
    if (opens_bucket) {
      if (g > 0) {
        GradBucket& previous = layout.buckets[static_cast<size_t>(bucket - 1)];
        offset = round_up(offset, pad);
        previous.padded_end = offset;
      }
      current.begin = offset;
    }
    offset = round_up(offset, kParamAlignElements);
    for (size_t i : groups[g].tensors) {
      ParamEntry entry = declared[i].entry;
      entry.offset = offset;
      entry.bucket = bucket;
      offset += entry.numel;
      current.end = offset;
      if (opens_bucket && i == groups[g].tensors.front()) current.first_layer = current.last_layer = entry.layer;
      current.first_layer = std::min(current.first_layer, entry.layer);
      current.last_layer = std::max(current.last_layer, entry.layer);
      layout.entries.push_back(std::move(entry));
    }
  }
  offset = round_up(offset, pad);
  if (group_buckets > 0) layout.buckets.back().padded_end = offset;
  return offset;
}

}  // namespace

std::string layer_prefix(int layer) { return "decoder.layers." + std::to_string(layer) + "."; }

const ParamEntry* ParamLayout::try_find(const std::string& name) const {
  for (const auto& entry : entries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

const ParamEntry& ParamLayout::find(const std::string& name) const {
  if (const ParamEntry* entry = try_find(name)) return *entry;
  throw Error("parameter " + name, "not in this rank's layout");
}

int64_t ParamLayout::parameter_elements() const {
  int64_t total = 0;
  for (const auto& entry : entries) total += entry.numel;
  return total;
}

FlatRange ParamLayout::bucket_shard(int bucket, int group_rank, int group_size) const {
  const GradBucket& b = buckets.at(static_cast<size_t>(bucket));
  const int64_t size = b.padded_end - b.begin;
  if (group_size <= 0 || size % group_size != 0) {
    throw Error("bucket " + std::to_string(bucket),
                "of " + std::to_string(size) + " elements does not split into " + std::to_string(group_size) +
                    " equal shards (build the layout for the distributed optimizer)");
  }
  const int64_t shard = size / group_size;
  return {b.begin + group_rank * shard, b.begin + (group_rank + 1) * shard};
}

std::vector<FlatRange> ParamLayout::data_parallel_shard(int group_rank, int group_size) const {
  std::vector<FlatRange> shard;
  for (size_t b = 0; b < buckets.size(); ++b) shard.push_back(bucket_shard(static_cast<int>(b), group_rank, group_size));
  return shard;
}

parallel::ModelDimensions parallel_dimensions(const ModelConfig& model) {
  parallel::ModelDimensions dimensions;
  dimensions.num_layers = model.num_layers;
  dimensions.num_attention_heads = model.num_attention_heads;
  dimensions.num_query_groups = model.query_groups();
  dimensions.ffn_hidden_size = model.ffn_hidden_size;
  dimensions.padded_vocab_size = model.padded_vocab_size();
  dimensions.seq_length = model.seq_length;
  dimensions.num_experts = model.num_experts;
  return dimensions;
}

void check_tensor_parallel_split(const ModelConfig& model, int tp) {
  parallel::check_tensor_parallel_split(tp, parallel_dimensions(model));
}

ParamLayout lay_out(const std::vector<DeclaredParam>& declared, const std::vector<ChunkBlocks>& chunks,
                    const BucketOptions& options) {
  if (chunks.empty()) throw Error("layout", "a rank holds at least one model chunk");
  ParamLayout layout;
  layout.first_layer = chunks.front().first_layer;
  layout.last_layer = chunks.back().last_layer;
  layout.has_embedding = layout.has_output = false;
  for (const ChunkSpec& chunk : chunks) {
    layout.has_embedding = layout.has_embedding || chunk.has_embedding;
    layout.has_output = layout.has_output || chunk.has_output;
  }
  // Chunk by chunk, each reduction group's buckets in turn, each group's first bucket starting
  // on its padding.
  int64_t offset = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    ModelChunk model_chunk{chunks[c], offset, offset};
    for (DataParallelGroup group : {DataParallelGroup::dense, DataParallelGroup::expert}) {
      const std::vector<FusedGroup> groups = fused_groups(declared, static_cast<int>(c), group);
      if (groups.empty()) continue;
      offset = lay_out_group(declared, groups, static_cast<int>(c), group, options, round_up(offset, options.pad(group)),
                             layout);
    }
    model_chunk.end = offset;
    layout.chunks.push_back(model_chunk);
  }
  if (layout.entries.size() != declared.size()) {
    throw Error("layout", "a declared tensor names a model chunk outside the " + std::to_string(chunks.size()) + " given");
  }
  layout.total_elements = round_up(offset, kParamAlignElements);
  return layout;
}

ParamLayout build_layout(const ModelConfig& model, const parallel::ParallelConfig& parallel,
                         const parallel::RankCoordinates& rank, const std::vector<ChunkSpec>& chunks,
                         const BucketOptions& options) {
  // A config mt-train cannot run is refused by flag before the spec meets a layer it has no
  // variant for.
  model.validate();
  model.check_trainable();
  return build_layout(model, parallel, rank, model_spec(model, chunks), options);
}

ParamLayout build_layout(const ModelConfig& model, const parallel::ParallelConfig& parallel,
                         const parallel::RankCoordinates& rank, const ModelSpec& spec,
                         const BucketOptions& options) {
  model.validate();
  model.check_trainable();
  check_tensor_parallel_split(model, parallel.tensor_model_parallel_size);
  const std::vector<ChunkBlocks>& chunks = spec.chunks;
  if (chunks.empty()) throw Error("layout", "a rank holds at least one model chunk");
  for (const ChunkSpec& chunk : chunks) {
    if (chunk.first_layer < 0 || chunk.last_layer > model.num_layers || chunk.first_layer > chunk.last_layer) {
      throw Error("layer range [" + std::to_string(chunk.first_layer) + ", " + std::to_string(chunk.last_layer) + ")",
                  "outside the model's " + std::to_string(model.num_layers) + " layers");
    }
  }
  check_spec(spec);

  // The chunks' blocks declare their tensors in forward order, chunk by chunk; the bucket pass
  // places them.
  std::vector<DeclaredParam> declared;
  Collector collector(parallel, rank, declared);
  for (size_t c = 0; c < chunks.size(); ++c) {
    collector.set_chunk(static_cast<int>(c));
    declare_parameters(make_chunk(chunks[c], model), collector);
  }
  return lay_out(declared, chunks, options);
}

ParamLayout build_layout(const ModelConfig& model, const parallel::ParallelConfig& parallel,
                         const parallel::RankCoordinates& rank, int first_layer, int last_layer) {
  const ChunkSpec chunk{first_layer, last_layer, rank.pp == 0, rank.pp == parallel.pipeline_model_parallel_size - 1};
  return build_layout(model, parallel, rank, std::vector<ChunkSpec>{chunk});
}

std::vector<ChunkSpec> pipeline_chunks(const ModelConfig& model, const parallel::ParallelConfig& parallel, int pp_rank) {
  const int stages = parallel.pipeline_model_parallel_size;
  const int chunks = parallel.virtual_pipeline_size(model.num_layers);
  std::vector<ChunkSpec> specs;
  for (int c = 0; c < chunks; ++c) {
    const parallel::LayerRange range = parallel::pipeline_layers(parallel, model.num_layers, pp_rank, c);
    specs.push_back(ChunkSpec{range.first, range.end(), pp_rank == 0 && c == 0, pp_rank == stages - 1 && c == chunks - 1});
  }
  return specs;
}

ParamLayout build_layout(const ModelConfig& model) {
  return build_layout(model, parallel::ParallelConfig{}, parallel::RankCoordinates{}, 0, model.num_layers);
}

}  // namespace mt::model
