// mt's memory per rank and Megatron's theoretical estimate (see memory_model.h).
#include "study/memory_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/layout.h"
#include "optim/distributed_optimizer.h"
#include "parallel/pipeline_layers.h"
#include "parallel/pipeline_schedule.h"
#include "perf/memory.h"
#include "perf/parameters.h"
#include "study/rank_parameters.h"

namespace mt::study {

namespace {

using model::ModelConfig;

int64_t rounded_bytes(int64_t elements) { return (elements * 4 + 63) / 64 * 64; }

// Sums buffers (fp32, each rounded to 64 bytes) into a part of a LayerActivations.
struct BufferSum {
  int64_t elements = 0, bytes = 0;
  void add(int64_t count) {
    if (count <= 0) return;
    elements += count;
    bytes += rounded_bytes(count);
  }
};

struct Widths {
  int64_t rows = 0;      // N: tokens of a micro-batch on this rank
  int64_t residual = 0;  // R: rows of the residual stream (N / TP with SP)
  int64_t t = 1;
  int64_t h = 0;
  bool layernorm = true;
};

Widths widths(const ModelConfig& m, const TrainingShape& shape) {
  Widths w;
  w.t = shape.parallel.tensor_model_parallel_size;
  w.rows = static_cast<int64_t>(shape.micro_batch_size) * m.seq_length / shape.parallel.context_parallel_size;
  w.residual = shape.parallel.sequence_parallel && w.t > 1 ? w.rows / w.t : w.rows;
  w.h = m.hidden_size;
  w.layernorm = m.normalization == model::Normalization::layernorm;
  return w;
}

// The widths of a layer's per-rank tensors: qkv (or MLA's up-projected q and kv), core output,
// fc1 and activation.
struct LayerWidths {
  int64_t qkv = 0, core = 0, lse = 0, fc1 = 0, act = 0;
};

LayerWidths layer_widths(const ModelConfig& m, const TrainingShape& shape, bool moe) {
  const int64_t t = shape.parallel.tensor_model_parallel_size, n = m.num_attention_heads;
  LayerWidths lw;
  if (m.multi_latent_attention) {
    lw.qkv = n * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.qk_head_dim + m.v_head_dim) / t;
    lw.core = n * m.v_head_dim / t;
  } else {
    lw.qkv = (n + 2 * static_cast<int64_t>(m.query_groups())) * m.head_dim() / t;
    lw.core = n * m.head_dim() / t;
  }
  lw.lse = n / t;
  const int64_t up = m.swiglu ? 2 : 1;
  if (moe) {
    const int64_t k = m.moe_router_topk, etp = shape.parallel.expert_tensor_parallel();
    lw.fc1 = std::max(k * up * m.moe_ffn() / etp, up * static_cast<int64_t>(m.moe_shared_expert_intermediate_size) / t);
    lw.act = std::max(k * m.moe_ffn() / etp, static_cast<int64_t>(m.moe_shared_expert_intermediate_size) / t);
  } else {
    lw.fc1 = up * m.ffn_hidden_size / t;
    lw.act = m.ffn_hidden_size / t;
  }
  return lw;
}

// MLA's local heads and core head size (model/layers/mla_attention.h).
struct Mla {
  int64_t heads = 0, core_dim = 0;
};

Mla mla_widths(const ModelConfig& m, const TrainingShape& shape) {
  return Mla{m.num_attention_heads / shape.parallel.tensor_model_parallel_size,
             std::max<int64_t>(m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim)};
}

// MLA's workspace (model/layers/mla_attention.cpp lay_out_workspace, without the rebuilt core):
// the up projections' outputs and grads, k_pe's copies, the SP latent buffers, the core's grads.
int64_t mla_workspace_bytes(const ModelConfig& m, const TrainingShape& shape, int64_t N, int64_t R, int64_t h) {
  const Mla mla = mla_widths(m, shape);
  const int64_t hl = mla.heads, a = mla.core_dim, dr = m.qk_pos_emb_head_dim;
  const int64_t q_dim = m.qk_head_dim + dr, kv_dim = m.qk_head_dim + m.v_head_dim;
  const int64_t latent = std::max(m.q_lora_rank, m.kv_lora_rank);
  BufferSum work;
  for (int64_t count : {N * hl * q_dim, N * hl * kv_dim, R * (m.kv_lora_rank + dr), R * dr, N * dr, N * dr,
                        N * hl * dr, N * latent, N * latent, N * hl * m.v_head_dim, N * hl * a, N * hl * a,
                        N * hl * a, N * hl * a, N * hl * q_dim, N * hl * kv_dim, N * dr, N * dr, R * dr,
                        R * latent, R * latent, R * (m.kv_lora_rank + dr), R * h}) {
    work.add(count);
  }
  return work.bytes;
}

// The buffers a layer keeps, in the order activations.cpp's layer_set takes them.
struct LayerSet {
  BufferSum residual, norm_stats, attention, core, mlp;
  int64_t bytes() const { return residual.bytes + norm_stats.bytes + attention.bytes + core.bytes + mlp.bytes; }
};

LayerSet layer_set(const ModelConfig& m, const TrainingShape& shape, int layer, bool with_input, bool with_core) {
  const Widths w = widths(m, shape);
  const int64_t N = w.rows, R = w.residual, h = w.h, t = w.t;
  LayerSet set;
  if (with_input) set.residual.add(R * h);
  set.residual.add(R * h);  // norm1 output
  if (w.layernorm) set.norm_stats.add(R);
  set.norm_stats.add(R);
  if (m.multi_latent_attention) {
    // model/layers/mla_attention.h's saved set: the latents of the SP rows (normed copies and
    // their statistics with --qk-layernorm), the core's q, k and v of every row at its head size
    // A = max(d_n + d_r, d_v), and (kept core) its output, log-sum-exp and the output sliced to d_v.
    const Mla mla = mla_widths(m, shape);
    if (m.q_lora_rank > 0) {
      set.attention.add(R * m.q_lora_rank);
      if (m.qk_layernorm) {
        set.attention.add(R * m.q_lora_rank);
        set.norm_stats.add(R);
      }
    }
    set.attention.add(R * m.kv_lora_rank);
    if (m.qk_layernorm) {
      set.attention.add(R * m.kv_lora_rank);
      set.norm_stats.add(R);
    }
    for (int i = 0; i < 3; ++i) set.attention.add(N * mla.heads * mla.core_dim);
    if (with_core) {
      set.core.add(N * mla.heads * mla.core_dim);
      set.core.add(N * mla.heads);
      set.core.add(N * mla.heads * m.v_head_dim);
    }
  } else {
    set.attention.add(N * layer_widths(m, shape, false).qkv);
  }
  const bool moe = m.is_moe_layer(layer);
  const LayerWidths lw = layer_widths(m, shape, moe);
  if (with_core && !m.multi_latent_attention) {
    set.core.add(N * lw.core);
    set.core.add(N * lw.lse);
  }
  set.residual.add(R * h);  // residual after attention
  set.residual.add(R * h);  // norm2 output
  if (w.layernorm) set.norm_stats.add(R);
  set.norm_stats.add(R);
  if (moe) {
    // Router scores; each token's k copies routed to the experts (in balance N k per rank
    // whatever EP is), their fc1 and activation over expert-TP; a shared expert like an MLP.
    const int64_t k = m.moe_router_topk, etp = shape.parallel.expert_tensor_parallel(), up = m.swiglu ? 2 : 1;
    set.mlp.add(N * m.num_experts);
    set.mlp.add(N * k * h);
    set.mlp.add(N * k * up * m.moe_ffn() / etp);
    set.mlp.add(N * k * m.moe_ffn() / etp);
    if (m.moe_shared_expert_intermediate_size > 0) {
      set.mlp.add(N * up * m.moe_shared_expert_intermediate_size / t);
      set.mlp.add(N * m.moe_shared_expert_intermediate_size / t);
    }
  } else {
    set.mlp.add(N * lw.fc1);
    set.mlp.add(N * lw.act);
  }
  return set;
}

// Elements of one layer's parameters on this rank, for FSDP's gathered buffers.
int64_t largest_layer_parameters(const ModelConfig& m, const TrainingShape& shape) {
  const parallel::ParallelConfig& p = shape.parallel;
  std::vector<int64_t> per_layer(static_cast<size_t>(m.num_layers + m.mtp_num_layers), 0);
  for (const perf::ParamBlock& block : perf::parameter_blocks(m, m.padded_vocab_size())) {
    if (block.layer < 0) continue;
    const int64_t divisor = block.split == perf::ParamSplit::tensor_parallel ? p.tensor_model_parallel_size
                            : block.split == perf::ParamSplit::expert
                                ? static_cast<int64_t>(p.expert_model_parallel_size) * p.expert_tensor_parallel()
                                : 1;
    per_layer[static_cast<size_t>(block.layer)] += block.elements / divisor;
  }
  return per_layer.empty() ? 0 : *std::max_element(per_layer.begin(), per_layer.end());
}

// The layout table's element count (alignment gaps and bucket padding included) and the elements
// whose Adam moments the rank keeps (perf::optimizer_state_elements, mt-train's plan: DP x CP rank
// 0's shard with the distributed optimizer), when it can lay the stage out: a dense model
// mt-train runs, every model chunk of the stage, bucketed as mt-train buckets the DP grads.
bool layout_elements(const ModelConfig& m, const TrainingShape& shape, int stage, int64_t& elements,
                     int64_t& optimizer_elements) {
  if (m.num_experts > 0 || m.multi_latent_attention || m.mtp_num_layers > 0 || shape.fsdp) return false;
  const parallel::ParallelConfig& parallel = shape.parallel;
  parallel::RankCoordinates rank;
  rank.pp = stage;
  const model::ParamLayout layout = model::build_layout(m, parallel, rank, model::pipeline_chunks(m, parallel, stage),
                                                        optim::DistributedOptimizer::bucket_options(parallel));
  elements = layout.total_elements;
  optimizer_elements = perf::optimizer_state_elements(layout, parallel);
  return true;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// mt-train's Megatron-FSDP units on rank 0 of a one-stage model, dense or MoE, as
// perf::fsdp_resident_elements counts them (mt-train's own check counts the same).
bool fsdp_unit_memory(const ModelConfig& m, const TrainingShape& shape, RankMemory& r) {
  if (!shape.fsdp_units || m.multi_latent_attention || m.mtp_num_layers > 0) return false;
  const parallel::ParallelConfig& parallel = shape.parallel;
  const model::ParamLayout layout = model::build_layout(m, parallel, parallel::RankCoordinates{},
                                                        model::pipeline_chunks(m, parallel, 0),
                                                        optim::DistributedOptimizer::bucket_options(parallel));
  const perf::FsdpResidentElements held = perf::fsdp_resident_elements(layout, parallel, shape.fsdp_prefetch);
  r.parameters = layout.total_elements;
  r.parameter_source = "layout table";
  r.weights = 4 * held.weights;
  r.grads = 4 * held.grads;
  r.optimizer = 8 * held.optimizer;
  return true;
}

}  // namespace

void TrainingShape::validate(const ModelConfig& m) const {
  m.validate();
  if (parallel.data_parallel_size < 1) {
    throw UsageError("data-parallel size " + std::to_string(parallel.data_parallel_size),
                     "must be at least 1 (--world-size / (TP x CP x PP))");
  }
  parallel::ParallelConfig checked = parallel;
  const parallel::BatchDimensions batch{micro_batch_size, global_batch()};
  parallel::validate(checked, model::parallel_dimensions(m), batch, world_size());
}

int64_t LayerActivations::bytes() const { return residual + norm_stats + attention + core + mlp; }

LayerActivations layer_activations(const ModelConfig& m, const TrainingShape& shape, int layer) {
  const LayerSet set = layer_set(m, shape, layer, true, true);
  LayerActivations a;
  a.residual = set.residual.bytes;
  a.norm_stats = set.norm_stats.bytes;
  a.attention = set.attention.bytes;
  a.core = set.core.bytes;
  a.mlp = set.mlp.bytes;
  return a;
}

RankMemory predict_rank_memory(const ModelConfig& m, const TrainingShape& shape, int stage) {
  shape.validate(m);
  const int p = shape.parallel.pipeline_model_parallel_size;
  const bool last = stage == p - 1;
  const Widths w = widths(m, shape);
  const int64_t N = w.rows, R = w.residual, h = w.h, t = w.t;
  RankMemory r;
  r.stage = stage;

  // Parameters, grads, optimizer.
  int64_t optimizer_elements = 0;
  const bool from_layout = layout_elements(m, shape, stage, r.parameters, optimizer_elements);
  if (from_layout) {
    r.parameter_source = "layout table";
  } else {
    r.parameters = rank_parameter_count(m, m.padded_vocab_size(), shape.parallel, stage);
    r.parameter_source = "parameter count";
  }
  const int64_t copy_bytes = shape.precision == Precision::fp32                                ? 0
                             : shape.precision == Precision::bf16 && shape.native_bf16_gemm ? 2
                                                                                              : 4;
  if (fsdp_unit_memory(m, shape, r)) {
    r.gemm_weights = copy_bytes * r.parameters;  // mt-train's GEMM copy stays whole-size
  } else if (shape.fsdp) {
    // The shard of every class, plus two layers gathered at once (the one computing and the
    // one prefetched) and one layer's full grads before their reduce-scatter. Megatron-FSDP
    // shards over its dp_cp mesh and forces the distributed optimizer: the same DP x CP ranks.
    parallel::ParallelConfig sharded = shape.parallel;
    sharded.use_distributed_optimizer = true;
    const int64_t shard = ceil_div(r.parameters, perf::optimizer_shards(sharded) * 16) * 16;
    const int64_t gathered = 2 * largest_layer_parameters(m, shape);
    r.weights = 4 * (shard + gathered);
    r.gemm_weights = copy_bytes * (shard + gathered);
    r.grads = 4 * (shard + gathered / 2);
    r.optimizer = 8 * shard;
  } else {
    r.weights = 4 * r.parameters;
    r.gemm_weights = copy_bytes * r.parameters;
    r.grads = 4 * r.parameters;
    // Without a layout table, the distributed optimizer's equal 16-element-aligned slices over its
    // reduction group (perf::optimizer_shards: DP x CP).
    const int64_t optimizer_shards = perf::optimizer_shards(shape.parallel);
    r.optimizer = from_layout                                ? 8 * optimizer_elements
                  : shape.parallel.use_distributed_optimizer ? 8 * (ceil_div(r.parameters, optimizer_shards * 16) * 16)
                                                             : 8 * r.parameters;
  }

  // Activations, chunk by chunk: what each in-flight micro-batch keeps, by the recompute policy
  // (a slot of the chunk), then the chunk's recompute scratch and workspace. The slots are shared
  // by the stage's chunks as the schedule allows (parallel::pipeline_slot_pools: chunks of equal
  // slots share one pool of the rank's peak in flight; the head's larger slots keep their own).
  const std::vector<parallel::LayerRange> chunks =
      parallel::pipeline_layer_table(shape.parallel, m.num_layers)[static_cast<size_t>(stage)];
  const parallel::PipelineShape schedule = parallel::pipeline_shape(shape.parallel, m.num_layers, shape.microbatches());
  const std::vector<parallel::PipelineAction> actions = parallel::pipeline_actions(schedule, stage);
  int total_layers = 0;
  int ring_attentions = 0;  // one per chunk with layers under CP
  int64_t all_layer_bytes = 0;
  const model::RecomputeConfig& rc = shape.recompute;
  const bool selective = rc.granularity == model::RecomputeGranularity::selective;
  const bool full = rc.granularity == model::RecomputeGranularity::full;
  LayerWidths widest = layer_widths(m, shape, false);
  if (m.num_experts > 0) {
    const LayerWidths moe = layer_widths(m, shape, true);
    widest.fc1 = std::max(widest.fc1, moe.fc1);
    widest.act = std::max(widest.act, moe.act);
  }
  const int64_t vocab_local = m.padded_vocab_size() / t;
  std::vector<int64_t> slot_bytes;  // per chunk: one in-flight micro-batch's kept buffers
  for (size_t c = 0; c < chunks.size(); ++c) {
    const bool with_head = last && c + 1 == chunks.size();
    std::vector<int> layers;
    for (int layer = chunks[c].first; layer < chunks[c].end(); ++layer) layers.push_back(layer);
    if (with_head) {  // MTP layers ride with the last chunk
      for (int mtp = 0; mtp < m.mtp_num_layers; ++mtp) layers.push_back(m.num_layers + mtp);
    }
    const int count = static_cast<int>(layers.size());
    total_layers += count;
    int64_t kept = 0;
    const int k = std::max(1, rc.num_layers);
    for (int i = 0; i < count; ++i) {
      all_layer_bytes += layer_set(m, shape, layers[static_cast<size_t>(i)], true, true).bytes();
      const bool recomputed = full && (rc.method == model::RecomputeMethod::uniform || i < k);
      const bool chunk_start = rc.method == model::RecomputeMethod::block || i % k == 0;
      if (!recomputed) kept += layer_set(m, shape, layers[static_cast<size_t>(i)], true, !selective).bytes();
      else if (chunk_start) kept += rounded_bytes(R * h);
    }
    if (count == 0) kept += rounded_bytes(R * h);  // the embedding output
    if (!with_head) kept += rounded_bytes(R * h);  // the chunk's output, sent to the next stage
    slot_bytes.push_back(kept);
    if (full && count > 0) {
      // Scratch sets for the recomputed chunk (uniform: k layers, the first reading the kept
      // input in place; block: one layer).
      const int sets = rc.method == model::RecomputeMethod::uniform ? std::min(k, count) : 1;
      for (int i = 0; i < sets; ++i) {
        r.activations_recompute += layer_set(m, shape, layers[static_cast<size_t>(i)], i > 0, true).bytes();
      }
    }
    if (selective && m.multi_latent_attention) {
      const Mla mla = mla_widths(m, shape);  // the rebuilt core: output, log-sum-exp, sliced output
      r.activations_recompute += rounded_bytes(N * mla.heads * mla.core_dim) + rounded_bytes(N * mla.heads) +
                                 rounded_bytes(N * mla.heads * m.v_head_dim);
    } else if (selective) {
      r.activations_recompute += rounded_bytes(N * widest.core) + rounded_bytes(N * widest.lse);
    }

    // Workspace: outputs not kept and the grads of backward.
    BufferSum work;
    // 2 ping-pong outputs, the projection output, 2 stream grads, the grads after attention, into
    // a norm and of a norm's input.
    for (int i = 0; i < 8; ++i) work.add(R * h);
    if (shape.parallel.sequence_parallel && t > 1) {
      for (int i = 0; i < 3; ++i) work.add(N * h);  // SP's full rows: gathered, partial sums, input grads
    }
    if (m.multi_latent_attention) {
      work.bytes += mla_workspace_bytes(m, shape, N, R, h);
    } else {
      work.add(N * widest.core);
      work.add(N * widest.qkv);
    }
    work.add(N * widest.fc1);
    work.add(N * widest.act);
    if (shape.precision != Precision::fp32) {
      // MLA's widest GEMM operand: its latents, the up projections' outputs, linear_proj's input.
      const int64_t attention_operand =
          m.multi_latent_attention
              ? std::max({int64_t{m.q_lora_rank}, int64_t{m.kv_lora_rank} + m.qk_pos_emb_head_dim,
                          mla_widths(m, shape).heads *
                              std::max(m.qk_head_dim + m.qk_pos_emb_head_dim, m.qk_head_dim + m.v_head_dim)})
              : widest.qkv;
      const int64_t operand = N * std::max({h, attention_operand, widest.fc1, with_head ? vocab_local : int64_t{0}});
      work.add(operand);
      work.add(operand);
    }
    if (shape.parallel.context_parallel_size > 1 && count > 0) {
      // The chunk's ring attention: its partial output and one chunk's partial lse
      // (parallel/ring_attention.h); its travelling blocks are comm buffers, below.
      work.add(N * widest.core);
      work.add(static_cast<int64_t>(m.num_attention_heads) / t * (m.seq_length / shape.parallel.context_parallel_size / 2));
      ++ring_attentions;
    }
    r.workspace += work.bytes;
  }
  // The head's per-slot buffers (final norm input and output, its statistics, the logits, the
  // loss's row max, sum-exp and target logit) ride in the last chunk's slots; r.head counts one
  // slot's worth with the loss grad, so only further slots of the head's pool add to the kept bytes.
  int64_t head_slot = 0;
  if (last) {
    BufferSum slot;
    slot.add(R * h);
    slot.add(R * h);
    if (w.layernorm) slot.add(R);
    slot.add(R);
    slot.add(N * vocab_local);
    for (int i = 0; i < 3; ++i) slot.add(N);
    head_slot = slot.bytes;
    slot_bytes.back() += head_slot;
  }
  for (const parallel::ActivationSlotPool& pool : parallel::pipeline_slot_pools(actions, slot_bytes)) {
    r.activations_kept += pool.floats();  // here bytes: slots x the largest slot of its chunks
  }
  r.activations_kept -= head_slot;
  r.layers = total_layers;
  r.activation_per_layer = total_layers > 0 ? all_layer_bytes / total_layers : 0;
  r.in_flight = parallel::pipeline_activation_slots(actions);

  if (last) {
    BufferSum head;
    head.add(R * h);  // final norm input
    head.add(R * h);  // final norm output
    if (w.layernorm) head.add(R);
    head.add(R);
    head.add(N * vocab_local);  // logits, their grads in place
    for (int i = 0; i < 4; ++i) head.add(N);  // row max, sum-exp, target logit, loss grad
    r.head = head.bytes;
  }

  BufferSum comm;
  if (p > 1) {  // two grad receive buffers, two send buffers
    for (int i = 0; i < 4; ++i) comm.add(R * h);
  }
  for (int ring = 0; ring < ring_attentions; ++ring) {
    // A ring attention's two travelling blocks, each [K | V | dK | dV] of the rank's tokens.
    const int64_t kv = static_cast<int64_t>(m.query_groups()) * m.head_dim() / t;
    comm.add(4 * N * kv);
    comm.add(4 * N * kv);
  }
  if (shape.parallel.expert_model_parallel_size > 1) {
    comm.add(N * m.moe_router_topk * h);
    comm.add(N * m.moe_router_topk * h);
  }
  r.comm_buffers = comm.bytes;
  return r;
}

std::vector<RankMemory> predict_memory(const ModelConfig& m, const TrainingShape& shape) {
  std::vector<RankMemory> stages;
  for (int stage = 0; stage < shape.parallel.pipeline_model_parallel_size; ++stage) {
    stages.push_back(predict_rank_memory(m, shape, stage));
  }
  return stages;
}

MegatronMemory megatron_theoretical_memory(const ModelConfig& m, const TrainingShape& shape) {
  shape.validate(m);
  const parallel::ParallelConfig& parallel = shape.parallel;
  const double t = parallel.tensor_model_parallel_size, p = parallel.pipeline_model_parallel_size;
  const double ep = parallel.expert_model_parallel_size, etp = parallel.expert_tensor_parallel();
  const double dp = parallel.data_parallel_size, world = shape.world_size();
  const double h = m.hidden_size, s = m.seq_length, b = shape.micro_batch_size;
  const double V = static_cast<double>(megatron_padded_vocab(m, parallel.tensor_model_parallel_size));

  // Weights and optimizer: parameter classes from the blocks (Megatron's own per-layer formulas
  // give the same numbers without biases), placed as compute_weight_and_optimizer_memory does.
  double tp_sharded = 0, replicated = 0, expert = 0, tp_sharded_mtp = 0, replicated_mtp = 0, expert_mtp = 0;
  for (const perf::ParamBlock& block : perf::parameter_blocks(m, static_cast<int64_t>(V))) {
    if (block.layer < 0) continue;
    const bool mtp = block.layer >= m.num_layers;
    const double e = static_cast<double>(block.elements);
    switch (block.split) {
      case perf::ParamSplit::tensor_parallel: (mtp ? tp_sharded_mtp : tp_sharded) += e; break;
      case perf::ParamSplit::replicated: (mtp ? replicated_mtp : replicated) += e; break;
      case perf::ParamSplit::expert: (mtp ? expert_mtp : expert) += e; break;
    }
  }
  // Megatron counts every attention parameter as TP-sharded and the final norm as replicated.
  const double final_norm = m.normalization == model::Normalization::layernorm ? 2 * h : h;
  const double embedding = h * V;
  double tp_on_shard = (tp_sharded / p + tp_sharded_mtp + embedding) / t;
  const double replicated_on_shard = (replicated + final_norm) / p + replicated_mtp;
  const double expert_on_shard = (expert / p + expert_mtp) / (etp * ep);
  if (m.untie_embeddings_and_output_weights && p == 1) tp_on_shard += embedding / t;
  const double expert_dp = world / (etp * ep * p);
  auto bytes_per_parameter = [&](double data_parallel) {
    return parallel.use_distributed_optimizer ? 6 + 12 / data_parallel : 18.0;
  };
  MegatronMemory result;
  result.weights_and_optimizer =
      (tp_on_shard + replicated_on_shard) * bytes_per_parameter(dp) + expert_on_shard * bytes_per_parameter(expert_dp);

  // Activations.
  const int virtual_stages = parallel.virtual_pipeline_size(m.num_layers);
  const bool interleaved = virtual_stages > 1;
  const double v = virtual_stages, microbatches = shape.microbatches();
  const double L = m.num_layers;
  double activations = 0;
  const bool sp_selective =
      parallel.sequence_parallel && shape.recompute.granularity == model::RecomputeGranularity::selective;
  if (sp_selective) {
    activations = s * b * h * (18 + 4 * m.ffn_hidden_size / h) * L;
  } else {
    activations = s * b * h * (10 + 24 / t) * L;
  }
  activations += 8 * s * b * p + s * b * h * p;  // embedding input and dropout mask
  if (interleaved) activations *= 1 + (p - 1) / (p * v);
  if (!interleaved && p > 1) activations *= std::min(1.0, microbatches / p);
  if (sp_selective) {
    if (p == 1) activations += s * b * h * 4 * (1 + V / h);
    activations /= t;
  } else {
    if (p == 1) activations += (s * b * V / t + s * b * h) * 2;
    activations *= 1.05;
  }
  result.activations = activations;
  return result;
}

}  // namespace mt::study
