// Step-time prediction (see predict.h).
#include "study/predict.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "parallel/pipeline_layers.h"
#include "perf/flops.h"
#include "perf/parameters.h"
#include "perf/peak.h"
#include "study/rank_parameters.h"

namespace mt::study {

const std::vector<Cluster>& cluster_table() {
  // NVLink per GPU and direction (NVIDIA quotes both directions: 600 / 900 / 1800 GB/s); the
  // network is each GPU's NIC (DGX systems: one 200 or 400 Gb/s adapter per GPU). Latencies:
  // typical NCCL small-message figures. DGX systems switch NVLink (NVSwitch).
  static const std::vector<Cluster> table{
      {"dgx-a100", "a100", 8, 300, 25, 5, 10, true, "NVIDIA DGX A100 system architecture (2020): NVLink3, 8 x 200 Gb/s HDR"},
      {"dgx-h100", "h100", 8, 450, 50, 5, 10, true, "NVIDIA DGX H100 data sheet (2023): NVLink4, 8 x 400 Gb/s NDR"},
      {"dgx-h200", "h200", 8, 450, 50, 5, 10, true, "NVIDIA DGX H200 data sheet (2024): NVLink4, 8 x 400 Gb/s NDR"},
      {"dgx-b200", "b200", 8, 900, 50, 5, 10, true, "NVIDIA DGX B200 data sheet (2025): NVLink5, 8 x 400 Gb/s"},
      // The dense FSDP/TP study's 8 nodes x 4 H200 (data/perf/published_runs.csv): 4-GPU HGX H200
      // boards (no NVSwitch: each GPU's 18 NVLink4 links go 6 to each peer) with 4 ConnectX-7 NDR
      // 400 Gb/s NICs a node (the study's repository, scripts/slurm/multinode.sh). What the stack
      // reaches on them is not published, so both links are fitted (fit_predictor): NVLink on its
      // 13B TP4+FSDP4 run (below NVLink4's 450 GB/s: it absorbs that stack's TP overheads), the
      // network on its 13B FSDP=8 run (below NDR's 50 GB/s a GPU).
      {"h200-4gpu-nodes", "h200", 4, 187.4, 26.21, 5, 10, false,
       "8 nodes x 4 H200 (HGX 4-GPU, 4 x NDR 400 Gb/s) of the FSDP/TP study; links fitted on its 13B runs"},
  };
  return table;
}

const Cluster& find_cluster(const std::string& name) {
  std::string known;
  for (const Cluster& cluster : cluster_table()) {
    if (cluster.name == name) return cluster;
    known += (known.empty() ? "" : ", ") + cluster.name;
  }
  throw UsageError("cluster " + name, "unknown (" + known + ")");
}

PredictorConstants fitted_constants() {
  PredictorConstants c;
  c.gemm_efficiency = 0.810;  // fitted on fsdp-7b-1gpu (one H200, no communication)
  c.gemm_tile = 128;
  c.attention_efficiency = 0.50;  // flash attention 2 forward + backward on Hopper, not fitted
  c.memory_efficiency = 0.8;      // STREAM-like fraction of HBM bandwidth, not fitted
  c.link_efficiency = 0.80;       // nccl-tests bus bandwidth over link bandwidth, not fitted
  c.eager_elementwise = 3.2;      // bytes of Llama's element-wise ops run eagerly over fused, counted (not fitted)
  return c;
}

namespace {

using model::ModelConfig;

struct Gemm {
  double m, n, k, count;  // count: how many of this shape per layer (fwd)
};

// The rank's view of the hardware.
struct Machine {
  double peak = 0;         // FLOP/s, dense, at the run's precision
  double hbm = 0;          // bytes/s, achievable
  PredictorConstants k;
  const Cluster* cluster = nullptr;

  double gemm_seconds(const Gemm& g) const {
    const double efficiency = k.gemm_efficiency / (1 + k.gemm_tile / g.m + k.gemm_tile / g.n + k.gemm_tile / g.k);
    return g.count * 2 * g.m * g.n * g.k / (peak * efficiency);
  }
};

// Alpha-beta time of a collective moving `bytes` per rank over a group of `ranks` ranks whose
// members are `stride` ranks apart in the world (TP fastest): inside a node when the group's
// span fits, else on the network. Without NVSwitch a group inside a node rides only the direct
// links to its other members: (ranks-1)/(G-1) of the GPU's links in a node of G.
struct Link {
  double bandwidth = 0, latency = 0;
};
Link group_link(const Machine& machine, int ranks, int stride) {
  const Cluster& c = *machine.cluster;
  const bool intra = static_cast<int64_t>(ranks) * stride <= c.gpus_per_node;
  if (!intra) return Link{c.network_gbps * 1e9 * machine.k.link_efficiency, c.network_latency_us * 1e-6};
  const double links_used = c.nvswitch || c.gpus_per_node <= 1 ? 1.0 : (ranks - 1.0) / (c.gpus_per_node - 1.0);
  return Link{c.nvlink_gbps * 1e9 * machine.k.link_efficiency * links_used, c.nvlink_latency_us * 1e-6};
}
double all_reduce(const Link& link, int n, double bytes) {
  return n <= 1 ? 0 : 2.0 * (n - 1) * link.latency + 2.0 * (n - 1) / n * bytes / link.bandwidth;
}
double all_gather(const Link& link, int n, double bytes) {  // also reduce-scatter; bytes: the full tensor
  return n <= 1 ? 0 : (n - 1) * link.latency + static_cast<double>(n - 1) / n * bytes / link.bandwidth;
}
double all_to_all(const Link& link, int n, double bytes) {
  return n <= 1 ? 0 : (n - 1) * link.latency + static_cast<double>(n - 1) / n * bytes / link.bandwidth;
}
double p2p(const Link& link, double bytes) { return link.latency + bytes / link.bandwidth; }

// One layer's work on one rank for one micro-batch, forward only (seconds), by kind.
struct LayerTime {
  double gemm = 0, attention = 0, elementwise = 0, tp = 0, cp = 0, ep = 0;
  double forward() const { return gemm + attention + elementwise + tp + cp + ep; }
};

LayerTime layer_forward(const ModelConfig& m, const TrainingShape& shape, const Machine& machine, const RunOptions& options,
                        int layer) {
  const parallel::ParallelConfig& parallel = shape.parallel;
  const double t = parallel.tensor_model_parallel_size, c = parallel.context_parallel_size;
  const double N = static_cast<double>(shape.micro_batch_size) * m.seq_length / c;  // tokens on the rank
  const double h = m.hidden_size, n = m.num_attention_heads;
  const double bytes = 2;  // bf16/fp16 activations on accelerators
  LayerTime lt;
  std::vector<Gemm> gemms;
  double q_width = 0, kv_width = 0, core_flops = 0;
  if (m.multi_latent_attention) {
    const double qk = m.qk_head_dim + m.qk_pos_emb_head_dim;
    if (m.q_lora_rank > 0) {
      gemms.push_back({N, static_cast<double>(m.q_lora_rank), h, 1});
      gemms.push_back({N, n * qk / t, static_cast<double>(m.q_lora_rank), 1});
    } else {
      gemms.push_back({N, n * qk / t, h, 1});
    }
    gemms.push_back({N, static_cast<double>(m.kv_lora_rank + m.qk_pos_emb_head_dim), h, 1});
    gemms.push_back({N, n * (m.qk_head_dim + m.v_head_dim) / t, static_cast<double>(m.kv_lora_rank), 1});
    gemms.push_back({N, h, n * m.v_head_dim / t, 1});
    q_width = n * qk / t;
    kv_width = n * (qk + m.v_head_dim) / t;
    // QK^T over qk width and PV over v width, causal half, for the whole sequence's keys.
    core_flops = 2 * N * m.seq_length * (n * qk + n * m.v_head_dim) / t / 2;
  } else {
    const double d = m.head_dim(), g = m.query_groups();
    q_width = n * d / t;
    kv_width = 2 * g * d / t;
    gemms.push_back({N, q_width + kv_width, h, 1});
    gemms.push_back({N, h, q_width, 1});
    core_flops = 4 * N * m.seq_length * q_width / 2;
  }
  const double up = m.swiglu ? 2 : 1;
  double act_width = 0;
  if (m.is_moe_layer(layer)) {
    // Routed tokens N k spread over the rank's E/EP experts (balanced), each GEMM per expert;
    // the router; a shared expert like a dense MLP.
    const double k = m.moe_router_topk;
    const double experts_local = static_cast<double>(m.num_experts) / parallel.expert_model_parallel_size;
    const double etp = parallel.expert_tensor_parallel(), f = m.moe_ffn();
    const double tokens_per_expert = N * k / experts_local;
    gemms.push_back({N, static_cast<double>(m.num_experts), h, 1});
    gemms.push_back({tokens_per_expert, up * f / etp, h, experts_local});
    gemms.push_back({tokens_per_expert, h, f / etp, experts_local});
    act_width = k * f / etp;
    if (m.moe_shared_expert_intermediate_size > 0) {
      const double fs = m.moe_shared_expert_intermediate_size;
      gemms.push_back({N, up * fs / t, h, 1});
      gemms.push_back({N, h, fs / t, 1});
      act_width += fs / t;
    }
    // Dispatch and combine: all-to-all of the routed copies over EP.
    const int ep = parallel.expert_model_parallel_size;
    const Link link = group_link(machine, ep, parallel.tensor_model_parallel_size * parallel.context_parallel_size);
    lt.ep = 2 * all_to_all(link, ep, N * k * h * bytes);
  } else {
    const double f = m.ffn_hidden_size;
    gemms.push_back({N, up * f / t, h, 1});
    gemms.push_back({N, h, f / t, 1});
    act_width = f / t;
  }
  if (layer >= m.num_layers) gemms.push_back({N, h, 2 * h / t, 1});  // MTP's eh projection
  for (const Gemm& g : gemms) lt.gemm += machine.gemm_seconds(g);
  lt.attention = core_flops / (machine.peak * machine.k.attention_efficiency);
  // Element-wise traffic per token: two norms and two residual adds on the residual stream (1/t
  // of it with SP), RoPE over q and k, the activation function; each op reading and writing HBM
  // on its own (eager) multiplies it.
  const double residual = parallel.sequence_parallel ? h / t : h;
  const double per_token = bytes * (2 * 2 * residual + 2 * 3 * residual + 2 * (q_width + kv_width) + (up + 1) * act_width);
  lt.elementwise = N * per_token / machine.hbm * (options.fused_elementwise ? 1.0 : machine.k.eager_elementwise);
  if (t > 1) {
    // Two TP collectives a layer (all-reduce, or all-gather + reduce-scatter with SP: the same
    // bytes on the wire).
    const int tp = parallel.tensor_model_parallel_size;
    const Link link = group_link(machine, tp, 1);
    const double activation_bytes = N * h * bytes;
    lt.tp = 2 * (parallel.sequence_parallel ? 2 * all_gather(link, tp, activation_bytes)
                                            : all_reduce(link, tp, activation_bytes));
  }
  if (c > 1) {
    // Ring over CP: c-1 steps, each passing this rank's K and V block on, overlapped with the
    // attention blocks; what exceeds the attention time is exposed.
    const Link link = group_link(machine, parallel.context_parallel_size, parallel.tensor_model_parallel_size);
    const double block = N * kv_width * bytes;
    lt.cp = std::max(0.0, (c - 1) * p2p(link, block) - lt.attention);
  }
  return lt;
}

// FSDP's units with nothing to overlap with on a rank of a one-stage model: the root (the
// blocks outside the layers: embeddings, final norm, output layer) and the first layer.
int64_t fsdp_exposed_parameters(const ModelConfig& m, const parallel::ParallelConfig& parallel, int first_layer) {
  int64_t elements = 0;
  for (const perf::ParamBlock& block : perf::parameter_blocks(m, m.padded_vocab_size())) {
    if (block.layer != -1 && block.layer != first_layer) continue;
    if (block.split == perf::ParamSplit::tensor_parallel) {
      elements += block.elements / parallel.tensor_model_parallel_size;
    } else if (block.split == perf::ParamSplit::expert) {
      elements += block.elements / (parallel.expert_model_parallel_size * parallel.expert_tensor_parallel());
    } else {
      elements += block.elements;
    }
  }
  return elements;
}

// The input embedding's elements a first-stage rank holds beyond its vocabulary-parallel share
// when TP leaves the embedding whole on every rank.
int64_t replicated_embedding_elements(const ModelConfig& m, const parallel::ParallelConfig& parallel, int stage,
                                      const RunOptions& options) {
  const int tp = parallel.tensor_model_parallel_size;
  if (options.tp_sharded_embedding || tp == 1 || stage != 0) return 0;
  const int64_t rows = m.padded_vocab_size() * m.hidden_size;
  return rows - rows / tp;
}

}  // namespace

StepPrediction predict_step(const ModelConfig& m, const TrainingShape& shape, const Cluster& cluster,
                            const PredictorConstants& constants, const RunOptions& options) {
  shape.validate(m);
  const perf::Device& device = perf::find_device(cluster.device);
  Machine machine;
  machine.k = constants;
  machine.cluster = &cluster;
  machine.peak = perf::device_peak_flops(device, shape.precision == Precision::fp32 ? "fp32" : "bf16");
  machine.hbm = device.hbm_tbps * 1e12 * constants.memory_efficiency;
  const parallel::ParallelConfig& parallel = shape.parallel;
  const int p = parallel.pipeline_model_parallel_size, v = parallel.virtual_pipeline_size(m.num_layers);
  const int t = parallel.tensor_model_parallel_size, cp = parallel.context_parallel_size;
  const int dp = parallel.data_parallel_size;
  const double microbatches = shape.microbatches();
  const double N = static_cast<double>(shape.micro_batch_size) * m.seq_length / cp;
  const double h = m.hidden_size;
  const model::RecomputeConfig& rc = shape.recompute;

  StepPrediction best;
  best.world_size = shape.world_size();
  double slowest = -1;
  const std::vector<std::vector<parallel::LayerRange>> placement = parallel::pipeline_layer_table(parallel, m.num_layers);
  for (int stage = 0; stage < p; ++stage) {
    StepPrediction s;
    s.world_size = best.world_size;
    // One micro-batch through the stage: forward, backward (twice the forward's GEMMs,
    // attention and element-wise work, the same collectives), recompute.
    std::vector<int> layers;
    for (const parallel::LayerRange& range : placement[static_cast<size_t>(stage)]) {
      for (int layer = range.first; layer < range.end(); ++layer) layers.push_back(layer);
    }
    if (stage == p - 1) {
      for (int mtp = 0; mtp < m.mtp_num_layers; ++mtp) layers.push_back(m.num_layers + mtp);
    }
    const int k = std::max(1, rc.num_layers);
    for (size_t i = 0; i < layers.size(); ++i) {
      const LayerTime lt = layer_forward(m, shape, machine, options, layers[i]);
      double passes = 3;  // forward + backward (two GEMMs per forward GEMM)
      const bool recomputed = rc.granularity == model::RecomputeGranularity::full &&
                              (rc.method == model::RecomputeMethod::uniform ||
                               static_cast<int>(i % (layers.size() / v)) < k);
      if (recomputed) passes = 4;
      s.gemm += passes * lt.gemm;
      s.attention += (passes + (rc.granularity == model::RecomputeGranularity::selective ? 1 : 0)) * lt.attention;
      s.elementwise += passes * lt.elementwise;
      const double collective_passes = recomputed ? 3 : 2;  // forward, backward (+ recomputed forward)
      if (!options.tp_comm_overlap) s.tp_comm += collective_passes * lt.tp;
      s.cp_comm += 3 * lt.cp;
      s.ep_comm += collective_passes * lt.ep;
    }
    if (stage == p - 1) {
      // Output layer and cross-entropy (fp32 logits read and written a few times).
      const double vocab = static_cast<double>(m.padded_vocab_size()) / t;
      s.gemm += 3 * (m.mtp_num_layers + 1) * machine.gemm_seconds({N, vocab, h, 1});
      s.elementwise += (m.mtp_num_layers + 1) * 4 * N * vocab * 4 / machine.hbm;
    }
    if (p > 1) {
      // Activations to the next stage and grads back, on the network when stages sit on
      // different nodes (PP is the outermost dimension).
      const Link link = group_link(machine, 2, t * cp * dp);
      const double bytes = (parallel.sequence_parallel ? N / t : N) * h * 2;
      s.pp_comm = 2 * p2p(link, bytes) * v;
    }
    // Per step: micro-batches, each pass through the stage; the bubble.
    const double per_microbatch = s.gemm + s.attention + s.elementwise + s.tp_comm + s.cp_comm + s.ep_comm + s.pp_comm;
    for (double* part : {&s.gemm, &s.attention, &s.elementwise, &s.tp_comm, &s.cp_comm, &s.ep_comm, &s.pp_comm}) {
      *part *= microbatches;
    }
    s.bubble = (p - 1.0) / v * per_microbatch;

    // Data parallelism over the stage's parameters (dense over DP x CP, experts over expert-DP).
    const int64_t replicated_embedding = replicated_embedding_elements(m, parallel, stage, options);
    const int64_t params = rank_parameter_count(m, m.padded_vocab_size(), parallel, stage) + replicated_embedding;
    const double dp_group = static_cast<double>(dp) * cp;
    const Link dp_link = group_link(machine, dp * cp, t);
    const double backward_last = per_microbatch * 2.0 / 3.0, forward_first = per_microbatch / 3.0;
    if (shape.fsdp) {
      // Per micro-batch: gather the params (bf16) for forward and again for backward, reduce-
      // scatter the grads (fp32; every micro-batch, or the step's last one only), unit by unit
      // behind the units' compute. Two units have no compute to hide behind: the root
      // (embedding, final norm, output layer), gathered before the first layer's forward and
      // reduce-scattered after the last backward, and the first layer, gathered right after the
      // root and reduce-scattered last. The rest overlaps.
      const int64_t exposed_params =
          fsdp_exposed_parameters(m, parallel, layers.empty() ? 0 : layers.front()) + replicated_embedding;
      const auto gather = [&](double elements) { return all_gather(dp_link, static_cast<int>(dp_group), elements * 2.0); };
      const auto scatter = [&](double elements) { return all_gather(dp_link, static_cast<int>(dp_group), elements * 4.0); };
      const auto exposed_comm = [&](bool reduce) {
        const double exposed = gather(exposed_params) + (reduce ? scatter(exposed_params) : 0.0);
        const double hidden = 2 * gather(params) + (reduce ? scatter(params) : 0.0) - exposed;
        return std::max(0.0, hidden - per_microbatch) + exposed;
      };
      s.dp_comm = options.fsdp_reduce_every_microbatch
                      ? microbatches * exposed_comm(true)
                      : (microbatches - 1) * exposed_comm(false) + exposed_comm(true);
    } else {
      const double grad_bytes = params * 4.0;  // fp32 main grads
      const bool distributed_optimizer = parallel.use_distributed_optimizer;
      double reduce = distributed_optimizer ? all_gather(dp_link, static_cast<int>(dp_group), grad_bytes)
                                            : all_reduce(dp_link, static_cast<int>(dp_group), grad_bytes);
      double gather = distributed_optimizer ? all_gather(dp_link, static_cast<int>(dp_group), params * 2.0) : 0;
      const double last_bucket = std::min(1.0, static_cast<double>(options.bucket_elements) / std::max<int64_t>(1, params));
      if (options.overlap_grad_reduce) reduce = std::max(reduce * last_bucket, reduce - backward_last);
      if (options.overlap_param_gather && distributed_optimizer) {
        gather = std::max(gather * last_bucket, gather - forward_first);
      }
      s.dp_comm = reduce + gather;
    }
    // AdamW over the local shard: fp32 param, grad, m, v read, param, m, v written, the bf16
    // copy written (30 bytes), and every local grad zeroed (4).
    const double shard = shape.fsdp || parallel.use_distributed_optimizer ? params / dp_group : params;
    s.optimizer = (30 * shard + 4.0 * params) / machine.hbm;
    s.step_seconds = s.gemm + s.attention + s.elementwise + s.tp_comm + s.cp_comm + s.ep_comm + s.pp_comm + s.bubble +
                     s.dp_comm + s.optimizer;
    s.slowest_stage = stage;
    if (s.step_seconds > slowest) {
      slowest = s.step_seconds;
      best = s;
    }
  }
  best.tokens_per_second = shape.global_batch() * static_cast<double>(m.seq_length) / best.step_seconds;
  return best;
}

}  // namespace mt::study
