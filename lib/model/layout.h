// The parameter layout table of one rank: for a (model config, parallel config, rank coordinates,
// model chunks) every parameter's global shape, the contiguous shard this rank holds (one range
// of one dimension: TP splits attention by whole heads / query groups), its offset in the rank's
// flat buffers, which ranks hold copies of it (and whether this rank's is the primary one), which
// group reduces its grads, whether weight decay applies, and the grad buckets of the flat buffer.
// Parameters, fp32 main grads, optimizer states, checkpoints and mt-memreport all read this one
// table.
//
// A rank holds one or more model chunks (virtual pipeline stages), each a global layer range
// with the embedding on the model's first chunk and the final norm + output layer on its last.
// The chunks share one flat buffer, one after the other; a chunk's range is a whole number of
// buckets (and the padding before a reduction group's first bucket). Tensors of a fused group
// (q/k/v, SwiGLU gate/up, their biases) are adjacent so one GEMM covers them; each group starts
// 64-byte aligned. What the chunks hold is the model spec (model/spec.h): the layout walks it, and
// each block declares its parameters in forward order with their init and the properties that
// decide their copies and grad reductions; the bucket pass (lay_out) then places them.
//
// Buckets (Megatron's param_and_grad_buffer, megatron-facts.md sec. 7) are per reduction group
// (DataParallelGroup: dense tensors over DP x CP, expert tensors over expert-DP): within each
// chunk, each group's tensors in turn (dense first), their fused groups taken in backward order
// (last layer first) until a bucket holds bucket_elements (0: the group's part of the chunk is
// one bucket); a tied word embedding split over pipeline stages gets a bucket of its own. A
// bucket never mixes groups. Each bucket's end is padded to its group's multiple, which the
// optimizer side chooses (optim::DistributedOptimizer::bucket_options: lcm(group size, 128) when
// every rank of the group owns an equal slice of every bucket, else the 16-element alignment);
// the layout does not know why.
// Tested in tests/unit/model/test_layout.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/init.h"
#include "model/spec.h"
#include "parallel/parallel_config.h"

namespace mt::model {

// How a tensor is split over tensor-parallel ranks.
enum class TensorSplit {
  replicated,      // every TP rank holds the whole tensor: norms, row-parallel biases, position table
  column_parallel, // dim 0 (output features): q/k/v, fc1, vocab rows of the embedding/output
  row_parallel,    // dim 1 (input features): linear_proj, linear_fc2
};

// The data-parallel group that sums a tensor's grads (its reduction group): dense tensors over
// DP x CP; MoE expert tensors (ParamDeclaration::expert) over the expert-DP group of the expert grid.
enum class DataParallelGroup { dense, expert };
inline constexpr int kDataParallelGroups = 2;

// Every fused group starts at a multiple of this many elements (64 bytes of fp32).
inline constexpr int64_t kParamAlignElements = 16;

// Layer ids (ParamEntry::layer) outside the decoder layers. Backward completes the grads of the
// head, then of layers L-1 .. 0, then of the embedding: the order Stage's grads-ready signals.
inline constexpr int kEmbeddingLayer = -1;
inline int head_layer(const ModelConfig& model) { return model.num_layers; }

struct ParamEntry {
  std::string name;                   // global name, global layer index inside
  std::vector<int64_t> global_shape;
  TensorSplit split = TensorSplit::replicated;
  int shard_dim = -1;                 // -1: the whole tensor
  int64_t shard_offset = 0;           // along shard_dim
  int64_t shard_extent = 0;           // along shard_dim
  std::vector<int64_t> local_shape;
  int64_t offset = 0;                 // elements into the flat buffers
  int64_t numel = 0;                  // local elements
  bool weight_decay = true;           // Megatron's default: no decay for biases and 1-D tensors
  Init init;                          // what initialize_parameters writes (declared by its block)
  int layer = kEmbeddingLayer;        // global decoder layer, kEmbeddingLayer or head_layer()
  int chunk = 0;                      // index into ParamLayout::chunks
  int bucket = 0;                     // index into ParamLayout::buckets

  // Copies and grad reduction. Every rank of the tensor's reduction group holds a copy;
  // TP-replicated tensors are also held whole by every TP rank; the tied word embedding also by the
  // last pipeline stage. Among the TP and pipeline copies, replica 0 is the primary one: counted
  // once in grad norms, written to checkpoints. Among the reduction group's ranks the optimizer
  // decides (optim/distributed_optimizer.h: each rank its slice, or the group's rank 0).
  int replica = 0;                    // 0: the primary copy
  bool tied_copy = false;             // the last stage's copy of the word embedding (tied output or MTP)
  DataParallelGroup data_parallel_group = DataParallelGroup::dense;  // the group that sums its grads
  bool reduce_over_tensor_parallel = false;  // sequence parallel: norms and row-parallel biases see 1/TP of the tokens
  bool reduce_over_embedding_group = false;  // tied word embedding on first and last stage: summed between them

  bool primary() const { return replica == 0; }
};

// The model chunks of pipeline rank `pp_rank` (parallel/pipeline_layers.h): chunk c is virtual
// stage c p + pp_rank; the model's first virtual stage embeds, its last holds the head and loss.
std::vector<ChunkSpec> pipeline_chunks(const ModelConfig& model, const parallel::ParallelConfig& parallel, int pp_rank);

struct ModelChunk {
  ChunkBlocks spec;            // its range, ends and blocks (model/spec.h)
  int64_t begin = 0, end = 0;  // its range of the flat buffer (whole buckets)
};

struct GradBucket {
  int chunk = 0;
  DataParallelGroup group = DataParallelGroup::dense;  // the reduction group of all its tensors
  int64_t begin = 0;       // first element (a multiple of the group's padding)
  int64_t end = 0;         // one past the last parameter element
  int64_t padded_end = 0;  // end padded to the group's multiple (equal slices of the group's ranks)
  int first_layer = 0;     // layer ids it holds, in [first_layer, last_layer]: ready once
  int last_layer = 0;      // backward has signalled first_layer
};

// A range [begin, end) of a rank's flat buffers.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// The grad buffer's shape, as the optimizer side chooses it (optim::DistributedOptimizer::
// bucket_options from Megatron's --ddp-bucket-size, --overlap-grad-reduce and
// --use-distributed-optimizer): the bucket size, and per reduction group the multiple its bucket
// ends are padded to.
struct BucketOptions {
  int64_t bucket_elements = 0;  // 0: one bucket per chunk and group
  // Megatron-FSDP's units (issue 25): a bucket never holds two layer ids (each transformer layer,
  // the embedding and the head their own buckets), whatever bucket_elements says.
  bool bucket_per_layer = false;
  std::array<int64_t, kDataParallelGroups> pad_elements{kParamAlignElements, kParamAlignElements};

  int64_t& pad(DataParallelGroup group) { return pad_elements[static_cast<size_t>(group)]; }
  int64_t pad(DataParallelGroup group) const { return pad_elements[static_cast<size_t>(group)]; }
};

struct ParamLayout {
  std::vector<ParamEntry> entries;
  std::vector<ModelChunk> chunks;
  std::vector<GradBucket> buckets;
  int64_t total_elements = 0;  // flat buffer length incl. alignment and bucket padding
  // The union of the chunks: the layer span and whether the rank holds the model's ends.
  int first_layer = 0, last_layer = 0;
  bool has_embedding = true, has_output = true;

  const ParamEntry& find(const std::string& name) const;  // throws mt::Error
  const ParamEntry* try_find(const std::string& name) const;
  int64_t parameter_elements() const;  // sum of numel (no gaps)
  // The slice of bucket `bucket` that rank `group_rank` of its reduction group of `group_size`
  // owns when the group shards it (equal slices of the padded bucket); throws when the padding
  // does not split into as many. data_parallel_shard: the slices of every bucket for a rank with
  // that place in every group (a dense-only layout's DP x CP rank).
  FlatRange bucket_shard(int bucket, int group_rank, int group_size) const;
  std::vector<FlatRange> data_parallel_shard(int group_rank, int group_size) const;
};

// One tensor as a block declares it.
struct ParamDeclaration {
  std::string name;                   // global name
  std::vector<int64_t> shape;         // global shape
  TensorSplit split = TensorSplit::replicated;
  int layer = kEmbeddingLayer;        // global decoder layer, kEmbeddingLayer or head_layer()
  Init init;                          // required
  // A split tensor's split dimension is cut into TP shards of whole `unit`s (a head's head_dim
  // rows for q/k/v); `unit_flag` names what the units count, for the error when TP does not
  // divide them (e.g. "--num-query-groups 2").
  int64_t unit = 1;
  std::string unit_flag{};
  bool tied_embedding = false;  // the word embedding the output layer or the MTP block shares (either stage's copy)
  bool tied_copy = false;       // the last stage's own copy of it (the embedding is on another stage)
  bool full_rows = false;       // read on every row of the micro-batch even under SP (the position
                                // table): TP ranks get the same grads, not 1/TP shares to sum
  // A MoE expert tensor of global expert `expert` of `num_experts` (-1: not one). Only the EP rank
  // holding the expert ([ep E/EP, (ep+1) E/EP)) gets it (the layout skips it elsewhere); its split
  // is over the expert-TP group (--expert-tensor-parallel-size, not TP) and its grads are reduced
  // over expert-DP (DataParallelGroup::expert).
  int expert = -1;
  int num_experts = 0;
};

// Receives the blocks' parameter declarations (model/spec.h declare_parameters), in forward order.
class ParamDeclarations {
 public:
  virtual ~ParamDeclarations() = default;
  // Starts a fused group: the next tensor begins aligned, the group's tensors follow back to back.
  virtual void begin_group() = 0;
  // A tensor of the current group.
  virtual void add(const ParamDeclaration& declaration) = 0;
  // A tensor on its own (its own aligned group).
  void add_single(const ParamDeclaration& declaration) {
    begin_group();
    add(declaration);
  }
};

// A declared tensor before the bucket pass: its entry (offset and bucket unset; chunk, layer and
// reduction group set) and its fused group (tensors of one fused group are declared one after the
// other, in one reduction group, and land adjacent in one bucket).
struct DeclaredParam {
  ParamEntry entry;
  int fused_group = 0;
};

// The bucket pass: lays `declared` (forward order, chunk by chunk) out over `chunks` in buckets
// per chunk and reduction group, padded as `options` says (see the header comment).
ParamLayout lay_out(const std::vector<DeclaredParam>& declared, const std::vector<ChunkBlocks>& chunks,
                    const BucketOptions& options);

// The layout of the chunks of `spec` (in order) on the rank at `rank`.
ParamLayout build_layout(const ModelConfig& model, const parallel::ParallelConfig& parallel,
                         const parallel::RankCoordinates& rank, const ModelSpec& spec,
                         const BucketOptions& buckets = {});
// The layout of `chunks` (in order) as model_spec(model, chunks) composes them.
ParamLayout build_layout(const ModelConfig& model, const parallel::ParallelConfig& parallel,
                         const parallel::RankCoordinates& rank, const std::vector<ChunkSpec>& chunks,
                         const BucketOptions& buckets = {});
// One chunk [first_layer, last_layer) with the ends of pipeline stage rank.pp.
ParamLayout build_layout(const ModelConfig& model, const parallel::ParallelConfig& parallel,
                         const parallel::RankCoordinates& rank, int first_layer, int last_layer);
// The single-rank layout of the whole model.
ParamLayout build_layout(const ModelConfig& model);

// The model's dimensions as parallel::validate and its tensor-parallel rule read them.
parallel::ModelDimensions parallel_dimensions(const ModelConfig& model);
// parallel::check_tensor_parallel_split for this model: mt::UsageError naming the flags when
// tensor parallelism of degree `tp` cannot split it by whole heads, query groups, ffn columns and
// padded vocabulary rows.
void check_tensor_parallel_split(const ModelConfig& model, int tp);

// Names used by the layout (also the HDF5 dataset names of checkpoints).
std::string layer_prefix(int layer);  // "decoder.layers.<i>."

}  // namespace mt::model
